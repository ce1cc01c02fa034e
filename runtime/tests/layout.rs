//! The test MLP's layouts against the simulator: every baseline's buffers peak at the predicted
//! peak, and buffers alive together never share an element, for random plans at N = 1, 2, 4.

mod common;

use common::{Rng, profile, random_schedule, spec};
use shardplan_runtime::layout::place;
use shardplan_runtime::mlp::Mlp;
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::schedule::Recompute;

/// The buffers the runtime lays out for whole-op launches (every baseline, with and without
/// checkpointing) peak at exactly the simulator's peak, which counts the same buffers: the blocks'
/// padding ([`Profile::laid_out_params`]) included, and no alignment left over. Units of 1–2 k
/// parameters in 2–4 blocks of 1 KiB, none a multiple of the shard quantum. The packed arena
/// comes within 2% of it (28 of the 30 are exact; N = 1 fsdp1 packs 128 bytes above, N = 4
/// fsdp1+ckpt 512, 1.06%: placing buffers by lifetime is not always perfect, DESIGN §6.5).
#[test]
fn laid_out_buffers_peak_at_the_predicted_peak_for_baselines() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, _) = spec(dir.path());
    for world in [1usize, 2, 4] {
        let profile = profile(&spec, world as u32);
        for kind in BaselineKind::ALL {
            for checkpoint in [Recompute::Off, Recompute::On] {
                let b = baseline(&profile, kind, checkpoint, None).unwrap();
                let l = place(&Mlp::new(spec.clone(), 0, world), &profile, &b.schedule).unwrap();
                let (label, predicted) = (kind.label(checkpoint), b.simulation.peak_memory_bytes);
                assert_eq!(
                    l.arena.live_peak_bytes as f64, predicted,
                    "N={world} {label}"
                );
                let ratio = l.arena.size_bytes as f64 / predicted;
                assert!((1.0..1.02).contains(&ratio), "N={world} {label}: {ratio}");
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Buffers alive in a common slot never share an element (what the CPU arena also checks per
    /// borrow at run time), part by part, for random valid plans at N = 1, 2, 4; and the arena is never
    /// below the live peak of its own buffers.
    #[test]
    fn buffers_alive_together_never_overlap(seed in proptest::prelude::any::<u64>(), world in proptest::sample::select(vec![1usize, 2, 4])) {
        let dir = tempfile::tempdir().unwrap();
        let (spec, _) = spec(dir.path());
        let profile = profile(&spec, world as u32);
        let schedule = random_schedule(&mut Rng(seed), &profile);
        let l = place(&Mlp::new(spec.clone(), 0, world), &profile, &schedule).unwrap();
        for i in 0..l.regions.len() {
            for j in 0..i {
                for (a, alive_a) in l.parts(i) {
                    for (b, alive_b) in l.parts(j) {
                        let together = alive_a.iter().zip(alive_b).any(|(x, y)| *x && *y);
                        proptest::prop_assert!(!(together && a.overlaps(b)), "{} and {} overlap while alive together", l.regions[i].1.name, l.regions[j].1.name);
                    }
                }
            }
        }
        proptest::prop_assert!(l.arena.size_bytes >= l.arena.live_peak_bytes);
    }
}
