//! The full-window LP's levels made whole (DESIGN §4.5, "placing the LP's levels"): systematic
//! rounding over the units in order, which keeps the LP's proportions of each level spread evenly
//! over the repeated blocks, for the placement at fixed levels to launch.

use super::variables::{Choice, Col, UnitLevel};

/// A value counts as nonzero above this.
const NONZERO: f64 = 1e-6;

/// Systematic rounding of a fractional solution's levels and recompute, unit by unit in order:
/// unit i takes the level whose running sum Σ_{j ≤ i} y_{j,ℓ} most exceeds the units given it so
/// far (about Σ_i y_{i,ℓ} units at level ℓ, spread evenly), and recomputes wherever r_i > 0
/// (recompute only trades time for memory, so rounding it up keeps what fits).
#[derive(Default)]
pub(super) struct Spread {
    /// Per choice, Σ_{j ≤ i} y_{j,choice} minus the units given it so far.
    owed: Vec<(Choice, f64)>,
    levels: Vec<UnitLevel>,
}

impl Spread {
    /// Rounds the next unit, of level columns `choices` and recompute column `recompute`, at the
    /// solution `values`.
    pub fn take(
        &mut self,
        choices: Vec<(Choice, Option<Col>)>,
        recompute: Option<Col>,
        values: &[f64],
    ) {
        let mut best: Option<(Choice, f64)> = None;
        for (choice, column) in choices {
            let Some(column) = column else { continue };
            let index = match self.owed.iter().position(|(c, _)| *c == choice) {
                Some(index) => index,
                None => {
                    self.owed.push((choice, 0.0));
                    self.owed.len() - 1
                }
            };
            self.owed[index].1 += values[column.index];
            let owed = self.owed[index].1;
            if best.is_none_or(|(_, b)| owed > b) {
                best = Some((choice, owed));
            }
        }
        let choice = best.map_or(Choice::Sdp(0), |(c, _)| c);
        if let Some((_, owed)) = self.owed.iter_mut().find(|(c, _)| *c == choice) {
            *owed -= 1.0;
        }
        self.levels.push(UnitLevel {
            choice,
            recompute: recompute.is_some_and(|r| values[r.index] > NONZERO),
        });
    }

    /// The units' levels taken so far.
    pub fn levels(self) -> Vec<UnitLevel> {
        self.levels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use good_lp::{ProblemVariables, variable};

    /// Five units of y = 0.2 on one level and 0.8 on another round to one unit at the first,
    /// third in line (its running sum 0.6 first exceeds the other's), and four at the second; r
    /// rounds up wherever it is above zero, and a unit without a recompute column never recomputes.
    #[test]
    fn proportions_spread_evenly_and_recompute_rounds_up() {
        let mut problem = ProblemVariables::new();
        let mut col = |index| Col {
            var: problem.add(variable()),
            index,
        };
        let (a, b, r) = (col(0), col(1), col(2));
        let recompute = [0.0, 0.3, 1.0, 1e-9, 0.5];
        let mut spread = Spread::default();
        for (unit, &rv) in recompute.iter().enumerate() {
            let values = [0.2, 0.8, rv];
            let r = (unit != 4).then_some(r);
            spread.take(
                vec![
                    (Choice::None, None),
                    (Choice::Sdp(0), Some(a)),
                    (Choice::Fsdp(0), Some(b)),
                ],
                r,
                &values,
            );
        }
        let levels = spread.levels();
        let choices: Vec<Choice> = levels.iter().map(|l| l.choice).collect();
        assert_eq!(
            choices,
            [
                Choice::Fsdp(0),
                Choice::Fsdp(0),
                Choice::Sdp(0),
                Choice::Fsdp(0),
                Choice::Fsdp(0)
            ]
        );
        let recomputes: Vec<bool> = levels.iter().map(|l| l.recompute).collect();
        assert_eq!(recomputes, [false, true, true, false, false]);
    }
}
