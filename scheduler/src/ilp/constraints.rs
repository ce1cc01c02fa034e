//! The constraint families of DESIGN §4, one function each, in the design's notation.
//! Units i, slots s, window positions k; nb_i blocks per op; κ_c, κ_q the interference (compute
//! slowed by communication, communication slowed by compute).

use super::variables::{Choice, Col, GroupVars, OpVars, UnitLevel, UnitVars};
use crate::cost::{Interference, compute_us, most_compute_us};
use crate::profile::{Link, Profile};
use crate::timeline::{Level, Timeline};
use good_lp::{Constraint, Expression, constraint};

/// One level per unit: Σ_ℓ y_{i,ℓ} = 1.
pub(super) fn one_level_per_unit(units: &[UnitVars]) -> Vec<Constraint> {
    units
        .iter()
        .map(|u| {
            constraint!(u.level(Level::None) + u.level(Level::Sdp) + u.level(Level::Fsdp) == 1)
        })
        .collect()
}

/// Running sums: C_{i,op,k} = C_{i,op,k⁻} + x_{i,op,k}, k⁻ the previous allowed position
/// (C = x at the first).
pub(super) fn cumulative_counts(units: &[UnitVars]) -> Vec<Constraint> {
    let mut rows = Vec::new();
    for op in units.iter().flat_map(UnitVars::ops) {
        for (k, (c, x)) in op.cumulative.iter().zip(&op.launches).enumerate() {
            let previous: Expression = if k == 0 {
                Expression::default()
            } else {
                op.cumulative[k - 1].var.into()
            };
            rows.push(constraint!(c.var == previous + x.var));
        }
    }
    rows
}

/// Coverage: Σ_k x_{i,op,k} = nb_i · y_{i,level(op)}, i.e. C_{i,op,last} = nb_i·y. RS and FG
/// run at every sharded choice (y_sdp + y_fsdp + y_hpz), AR only at none, BG only at fsdp, BGH
/// only at hpz. One row per op, in the order of `units.iter().flat_map(UnitVars::ops)`.
pub(super) fn coverage(units: &[UnitVars]) -> Vec<Constraint> {
    units
        .iter()
        .flat_map(|u| {
            let nb = f64::from(u.blocks);
            u.ops()
                .map(move |op| constraint!(op.total().var == nb * u.covered_level(op)))
        })
        .collect()
}

/// The RS→AG order as a boundary per unit and group, Z_{i,k} = [boundary ≤ k], monotone in k,
/// with gap γ = 0 over the world and γ = 2 over a shard group (RS, RA a slot later, the gather a
/// slot after that; DESIGN §3.11):
///   Z_{i,k} ≥ Z_{i,k−1};
///   x_{i,RS,k} ≤ nb_i·(1 − Z_{i,k+γ−1})   (a reduction at k needs boundary ≥ k + γ);
///   x_{i,FG,k} ≤ nb_i·Z_{i,k}             (a forward gather at k needs boundary ≤ k).
/// Positions outside the range where the two ops' allowed positions can conflict need no row.
/// Each row comes with the launch column it bounds (None for the monotone rows): a launch is in
/// one such row at most.
pub(super) fn reductions_before_gathers(units: &[UnitVars]) -> Vec<(Constraint, Option<Col>)> {
    let mut rows = Vec::new();
    for u in units {
        let nb = f64::from(u.blocks);
        for g in &u.groups {
            let z = |k: usize| g.boundary.iter().find(|(p, _)| *p == k).map(|(_, c)| c.var);
            for pair in g.boundary.windows(2) {
                rows.push((constraint!(pair[1].1.var >= pair[0].1.var), None));
            }
            for (&k, x) in g.rs.positions.iter().zip(&g.rs.launches) {
                if let Some(previous) = (k + g.gap).checked_sub(1).and_then(z) {
                    rows.push((constraint!(x.var <= nb - nb * previous), Some(*x)));
                }
            }
            for (&k, x) in g.fg.positions.iter().zip(&g.fg.launches) {
                if let Some(zk) = z(k) {
                    rows.push((constraint!(x.var <= nb * zk), Some(*x)));
                }
            }
        }
    }
    rows
}

/// The links the model's ops (and their followers) use, in [`Link::ALL`] order: the world's
/// alone, and the other link beside it where hierarchical levels are offered (DESIGN §3.11).
pub(super) fn links_in_use(units: &[UnitVars]) -> Vec<Link> {
    Link::ALL
        .into_iter()
        .filter(|&link| {
            units
                .iter()
                .flat_map(UnitVars::ops)
                .any(|op| op.parts().any(|(_, l, _, _)| l == link))
        })
        .collect()
}

/// Q^ℓ_s = Σ_{i,op,k: slot(k) = s, link(op) = ℓ} t_{i,op} · x_{i,op,k}: communication launched at
/// each slot on each link of `links` (one entry per link, in its order; a shard group's RS block
/// puts its replica AllReduce on slot(k + 1), DESIGN §3.11), and
/// L_s = Σ_{i,op,k: slot(k) = s} ℓ_{i,op} · x_{i,op,k} with ℓ = κ_c·t_op + κ_u·upd_op: the
/// compute it costs the slot, over both links. Band columns (`super::far`) have no slot of their
/// own.
pub(super) fn communication_per_slot(
    units: &[UnitVars],
    slots: usize,
    links: &[Link],
) -> (Vec<Vec<Expression>>, Vec<Expression>) {
    let mut q = vec![vec![Expression::default(); slots]; links.len()];
    let mut load = vec![Expression::default(); slots];
    for op in units.iter().flat_map(UnitVars::ops) {
        for (offset, link, time, compute) in op.parts() {
            let link = link_position(links, link);
            for (s, x) in op.launches_at_slots() {
                let s = (s + offset) % slots;
                q[link][s].add_mul(time, x.var);
                load[s].add_mul(compute, x.var);
            }
        }
    }
    (q, load)
}

/// The position of `link` in `links` (every op's link is in use).
pub(super) fn link_position(links: &[Link], link: Link) -> usize {
    links
        .iter()
        .position(|&l| l == link)
        .expect("every op's link is in use")
}

/// c_s: f_i + (f^c_i − f_i)·r_i at F_i, b_i + f'_i·r_i at B_i, the extra time at E.
pub(super) fn compute_per_slot(
    profile: &Profile,
    units: &[UnitVars],
    timeline: Timeline,
) -> Vec<Expression> {
    (0..timeline.slot_count())
        .map(|s| match timeline.compute_unit(s) {
            None => Expression::from(profile.iteration_extra_us),
            Some(i) => {
                let p = &profile.units[i];
                let (base, with_recompute) = if s == timeline.forward(i) {
                    (
                        p.forward_us,
                        p.checkpointed_forward_time_us() - p.forward_us,
                    )
                } else {
                    (p.backward_us, p.recompute_time_us())
                };
                let mut c = Expression::from(base);
                if let Some(r) = units[i].recompute {
                    c.add_mul(with_recompute, r.var);
                }
                c
            }
        })
        .collect()
}

/// Slot durations: d_s ≥ c_s + L_s and, per link ℓ in use, d_s ≥ Q^ℓ_s + κ_q·c_s (DESIGN
/// §3.11): 1 + |links| rows per slot, in that order.
pub(super) fn slot_durations(
    durations: &[Col],
    compute: &[Expression],
    (comm, load): (&[Vec<Expression>], &[Expression]),
    interference: Interference,
) -> Vec<Constraint> {
    let kq = interference.comm;
    let mut rows = Vec::new();
    for (s, ((d, c), l)) in durations.iter().zip(compute).zip(load).enumerate() {
        rows.push(constraint!(d.var >= c.clone() + l.clone()));
        for q in comm {
            rows.push(constraint!(d.var >= q[s].clone() + kq * c.clone()));
        }
    }
    rows
}

/// The communicators in use (DESIGN §3.11): u_S ≥ Σ y_{i,·,S} for each unit and shard group S
/// (its shard and replica groups), u_H ≥ Σ_g y_{i,hpz,g} for each unit with hpz.
pub(super) fn communicator_in_use(units: &[UnitVars]) -> Vec<Constraint> {
    let mut rows = Vec::new();
    for u in units {
        for g in &u.groups {
            if let Some(c) = g.communicator {
                rows.push(constraint!(c.var >= g.sharded()));
            }
        }
        if let Some(c) = u.secondary_communicator {
            let hpz: Expression = u.groups.iter().filter_map(|g| g.hpz).map(|h| h.var).sum();
            rows.push(constraint!(c.var >= hpz));
        }
    }
    rows
}

/// Each communicator column once, with the number of communicators it stands for: a shard
/// group's 2 (shard and replica), the secondary group's 1.
fn communicator_columns(units: &[UnitVars]) -> Vec<(Col, f64)> {
    let mut columns: Vec<(Col, f64)> = Vec::new();
    for u in units {
        let shards = u
            .groups
            .iter()
            .filter_map(|g| g.communicator)
            .map(|c| (c, 2.0));
        for (c, count) in shards.chain(u.secondary_communicator.map(|c| (c, 1.0))) {
            if !columns.iter().any(|(known, _)| known.index == c.index) {
                columns.push((c, count));
            }
        }
    }
    columns
}

/// Adds blk·C_{op}(pos) to `m` (the blocks of `op` launched at positions ≤ pos).
fn add_launched_up_to(m: &mut Expression, op: &OpVars, pos: usize, scale: f64) {
    if let Some(c) = op.cumulative_at(pos) {
        m.add_mul(scale * op.block_bytes, c.var);
    }
}

/// M_s, the memory of slot s (DESIGN §3), with cumulative counts:
///
/// ```text
/// M_s = Σ_i Ψ_i(p+g+o)·(y_{i,none} + (y_{i,sdp} + y_{i,fsdp})/N)
///     + gathered: s ∈ (B_i, F_i) at k:  blk_p·C_{i,FG,k}
///                 s = F_i or s = B_i:   Ψ_i·p·(y_sdp + y_fsdp)
///                 s ∈ (F_i, B_i) at k:  Ψ_i·p·y_sdp + blk_p·C_{i,BG,k}
///     + gradient: s = B_i:              Ψ_i·g·(y_sdp + y_fsdp)
///                 s ∈ (B_i, F_i) at k:  Ψ_i·g·(y_sdp + y_fsdp) − blk_g·C_{i,RS,k−1}
///     + saved:    F_i ≤ s < B_i:        act_i − (act_i − ckpt_i)·r_i
///                 s = B_i:              act_i + ckpt_i·r_i
///     + ws(s)
///     + lent to unit j (B_j < B_i):  F_i < s ≤ B_j:  Ψ_i·p·y_fsdp
///                                    B_j ≤ s < B_i:  Ψ_i·g·(y_sdp + y_fsdp)
///     + hpz (DESIGN §3.11):  F_i ≤ s ≤ B_i:  Ψ_i·p/H·y_hpz;  s ∈ (F_i, B_i) at k: blk_p·C_{i,BGH,k}
///     + communicators:       comm·(1 + 2·Σ_S u_S + u_H)   (with a topology)
/// ```
///
/// The sharded terms are summed over the unit's groups of ranks, each with its own persistent
/// share Ψ_i(p+g+o)/S, columns and levels; y_fsdp stands for y_fsdp + y_hpz wherever hpz's memory
/// equals fsdp's.
///
/// Every term is divided by `scale` (the cap) to keep the row well conditioned.
pub(super) fn memory_per_slot(
    profile: &Profile,
    units: &[UnitVars],
    timeline: Timeline,
    scale: f64,
) -> Vec<Expression> {
    let b = profile.bytes_per_param;
    let borrower_backward: Vec<Option<usize>> = (0..units.len())
        .map(|i| profile.borrower(i).map(|j| timeline.backward(j)))
        .collect();
    let communicator = profile
        .topology
        .as_ref()
        .map_or(0.0, |t| t.communicator_bytes as f64 / scale);
    let mut rows = vec![Expression::from(communicator); timeline.slot_count()];
    for (c, count) in communicator_columns(units) {
        for m in &mut rows {
            m.add_mul(communicator * count, c.var);
        }
    }
    for (s, m) in rows.iter_mut().enumerate() {
        for (i, u) in units.iter().enumerate() {
            let p = &profile.units[i];
            let (forward, backward) = (timeline.forward(i), timeline.backward(i));
            let laid_out = profile.laid_out_params(i);
            let params_p = (laid_out * b.param) as f64 / scale;
            let params_g = (laid_out * b.grad) as f64 / scale;
            if let Some(lent_until) = borrower_backward[i] {
                if s > forward && s <= lent_until {
                    m.add_mul(params_p, u.level(Level::Fsdp));
                }
                if s >= lent_until && s < backward {
                    m.add_mul(params_g, u.sharded());
                }
            }
            m.add_mul(u.persistent_full / scale, u.level(Level::None));
            for g in &u.groups {
                group_memory(m, g, (s, forward, backward), (params_p, params_g), scale);
            }
            // hpz's gathered blocks between F_i and B_i, whichever group (BGH is shared).
            if let Some(bgh) = &u.bgh
                && let Some(k) = bgh.window.position(s)
            {
                add_launched_up_to(m, bgh, k, 1.0 / scale);
            }
            if (forward..=backward).contains(&s) {
                let (act, ckpt) = (
                    p.activation_bytes as f64 / scale,
                    p.checkpoint_activation_bytes as f64 / scale,
                );
                *m += act;
                if let Some(r) = u.recompute {
                    m.add_mul(if s == backward { ckpt } else { ckpt - act }, r.var);
                }
            }
            if s == forward {
                *m += p.forward_workspace_bytes as f64 / scale;
            }
            if s == backward {
                *m += p.backward_workspace_bytes as f64 / scale;
            }
        }
    }
    rows
}

/// The sharded terms of M_s for one group of ranks of a unit (see [`memory_per_slot`]), scaled;
/// `params` are Ψ_i·p and Ψ_i·g, scaled.
fn group_memory(
    m: &mut Expression,
    g: &GroupVars,
    (s, forward, backward): (usize, usize, usize),
    (params_p, params_g): (f64, f64),
    scale: f64,
) {
    let sdp: Expression = g.sdp.var.into();
    m.add_mul(g.persistent / scale, g.sharded());
    if let Some(k) = g.fg.window.position(s) {
        add_launched_up_to(m, &g.fg, k, 1.0 / scale);
        m.add_mul(params_g, g.sharded());
        if let Some(before) = k.checked_sub(1) {
            add_launched_up_to(m, &g.rs, before, -1.0 / scale);
        }
    } else if s == forward || s == backward {
        m.add_mul(params_p, g.sharded());
    } else if let Some(bg) = &g.bg {
        let k = bg
            .window
            .position(s)
            .expect("(F_i, B_i) covers the slots between them");
        m.add_mul(params_p, sdp);
        add_launched_up_to(m, bg, k, 1.0 / scale);
    } else {
        m.add_mul(params_p, sdp);
    }
    if s == backward {
        m.add_mul(params_g, g.sharded());
    }
    if let Some(hpz) = g.hpz.filter(|_| (forward..=backward).contains(&s)) {
        m.add_mul(g.secondary_bytes / scale, hpz.var);
    }
}

/// Fixed levels (`super::placement`): each unit at its given level and recompute,
///
/// ```text
/// y_{i,ĉ_i} = 1,    r_i = r̂_i
/// ```
///
/// (one level per unit then sets every other y_i to 0). The levels are read from a model of the
/// same shape, so every fixed choice has its column.
pub(super) fn fixed_levels(units: &[UnitVars], levels: &[UnitLevel]) -> Vec<Constraint> {
    let mut rows = Vec::new();
    for (u, fixed) in units.iter().zip(levels) {
        rows.push(constraint!(u.choice(fixed.choice) == 1.0));
        if let Some(r) = u.recompute {
            rows.push(constraint!(r.var == f64::from(u8::from(fixed.recompute))));
        }
    }
    rows
}

/// Levels held among given choices, recompute free (`super::placement`'s recompute-free form):
/// each unit at one of its choices C_i (one choice: its level held), whether it recomputes left to
/// the MIP,
///
/// ```text
/// Σ_{c ∈ C_i} y_{i,c} = 1
/// ```
///
/// (one level per unit then sets every other y_i to 0).
pub(super) fn levels_among(units: &[UnitVars], among: &[Vec<Choice>]) -> Vec<Constraint> {
    units
        .iter()
        .zip(among)
        .map(|(u, choices)| {
            let held: Expression = choices.iter().map(|&c| u.choice(c)).sum();
            constraint!(held == 1.0)
        })
        .collect()
}

/// The memory cap, scaled and inclusive: M_s / M ≤ 1 for every slot s.
pub(super) fn memory_cap(memory: Vec<Expression>) -> Vec<Constraint> {
    memory.into_iter().map(|m| constraint!(m <= 1.0)).collect()
}

/// The peak of the memory objective: M_s ≤ P for every slot s.
pub(super) fn memory_peak(memory: Vec<Expression>, peak: Col) -> Vec<Constraint> {
    memory
        .into_iter()
        .map(|m| constraint!(m <= peak.var))
        .collect()
}

/// The time ceiling of the memory objective: Σ_s d_s ≤ T_max.
pub(super) fn time_ceiling(durations: &[Col], ceiling_us: f64) -> Constraint {
    constraint!(durations.iter().map(|d| d.var).sum::<Expression>() <= ceiling_us)
}

/// Whole blocks: a block is launched in one slot, whole, so a slot that launches a block longer
/// than the communication its compute can hide lasts at least that block. The LP relaxation meets
/// d_s ≥ max(c_s, Q_s) with a sliver of such a block instead (on GPT-2 XL, 8% of a 1.7 ms gather
/// fills a 0.14 ms forward slot, where a plan launches all of it). Per slot, with c̄_s its most
/// compute and h_s = (1 − κ_q)·c̄_s (valid for integer launches only):
///
/// ```text
/// d_s ≥ c_s + Σ_{i,op,k: slot(k) = s, t_{i,op} > h_s} (t_{i,op} − h_s)·x_{i,op,k}
/// ```
///
/// Without such a block the row is d_s ≥ c_s; with n ≥ 1 of them, of time Q' ≤ Q_s, its right
/// side is at most c_s + Q' − n·h_s ≤ Q_s + κ_q·c_s ≤ d_s. With two links (DESIGN §3.11) the sum
/// runs over one link's blocks (Q' ≤ Q^ℓ_s), one row per slot and link. Slots without such a
/// block get no row; band columns (`super::far`) have no slot and stay out.
pub(super) fn whole_blocks(
    longer: &[(usize, Vec<(f64, Col)>)],
    durations: &[Col],
    compute: &[Expression],
) -> Vec<Constraint> {
    longer
        .iter()
        .map(|(s, terms)| {
            let mut right = compute[*s].clone();
            for &(beyond, x) in terms {
                right.add_mul(beyond, x.var);
            }
            constraint!(durations[*s].var >= right)
        })
        .collect()
}

/// Per slot and link that can launch a block longer than the communication the slot can hide,
/// the terms of its whole-block row ([`whole_blocks`]): (t_{i,op} − h_s, x_{i,op,k}) for each such
/// launch column.
pub(super) fn longer_blocks(
    profile: &Profile,
    units: &[UnitVars],
    timeline: Timeline,
) -> Vec<(usize, Vec<(f64, Col)>)> {
    // c̄_s: the slot's most compute over the recompute choices the model allows.
    let most: Vec<f64> = (0..timeline.slot_count())
        .map(|s| match timeline.compute_unit(s) {
            Some(i) if units[i].recompute.is_none() => compute_us(profile, timeline, s, |_| false),
            _ => most_compute_us(profile, timeline, s),
        })
        .collect();
    let hidden = 1.0 - Interference::of(profile).comm;
    let slots = timeline.slot_count();
    let mut per_slot: Vec<Vec<(f64, Col)>> = vec![Vec::new(); slots * Link::ALL.len()];
    for op in units.iter().flat_map(UnitVars::ops) {
        for (offset, link, time, _) in op.parts() {
            for (s, x) in op.launches_at_slots() {
                let s = (s + offset) % slots;
                let beyond = time - hidden * most[s];
                if beyond > 0.0 {
                    per_slot[link.index() * slots + s].push((beyond, x));
                }
            }
        }
    }
    per_slot
        .into_iter()
        .enumerate()
        .filter(|(_, terms)| !terms.is_empty())
        .map(|(k, terms)| (k % slots, terms))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytic::zoo_profile;
    use crate::baselines::{BaselineKind, baseline};
    use crate::ilp::SolveOptions;
    use crate::ilp::mapping::{schedule_values, slot_terms};
    use crate::ilp::model::{Form, build};
    use crate::ilp::variables::ExtraPositions;
    use crate::schedule::{Recompute, Schedule};
    use crate::sim::{Semantics, simulate};

    /// GPT-2 XL on 64 H100s (analytic): 0.14 ms forwards beside 1.7 ms blocks. Every baseline,
    /// with and without checkpointing (recompute where the unit has it), meets every whole-block
    /// row at its own launches, compute and simulated slot durations (the rows cut off no plan),
    /// and some rows hold with equality (a slot of one block: they are as tight as a plan).
    #[test]
    fn whole_block_rows_hold_for_every_baseline_and_bind_where_a_slot_launches_one_block() {
        let profile = zoo_profile("gpt2-xl", 64);
        let options = SolveOptions {
            memory_cap_bytes: None,
            ..SolveOptions::default()
        };
        let built = build(&profile, &options, (Form::Mip, &ExtraPositions::new()));
        let timeline = Timeline::new(profile.unit_count());
        let longer = longer_blocks(&profile, &built.units, timeline);
        assert!(longer.len() > profile.unit_count(), "{} rows", longer.len());
        let mut tight = 0;
        for kind in BaselineKind::ALL {
            for checkpoint in [Recompute::Off, Recompute::On] {
                let plan = baseline(&profile, kind, checkpoint, None).unwrap();
                // The embedding and head save nothing by recompute and have no column for it.
                let units = plan.schedule.into_units().into_iter().zip(&built.units);
                let units = units
                    .map(|(mut u, vars)| {
                        u.recompute &= vars.recompute.is_some();
                        u
                    })
                    .collect();
                let schedule = Schedule::new(&profile, units).unwrap();
                let values = schedule_values(&built.units, &schedule, built.columns).unwrap();
                let compute = slot_terms(&profile, &built.units, &values);
                let simulated = simulate(&profile, &schedule, Semantics::Strict);
                for (s, terms) in &longer {
                    let right = compute[*s].0
                        + terms
                            .iter()
                            .map(|(beyond, x)| beyond * values[x.index])
                            .sum::<f64>();
                    let d = simulated.slots[*s].duration_us;
                    assert!(
                        right <= d * (1.0 + 1e-12),
                        "{kind:?} (checkpoint {checkpoint:?}) slot {s}: {right} > {d}"
                    );
                    tight += usize::from(right >= d * (1.0 - 1e-12));
                }
            }
        }
        assert!(tight > profile.unit_count(), "{tight} tight rows");
    }
}
