//! The columns of a model in creation order, each with its index (good_lp keeps the index
//! private; HiGHS needs it for the warm start and to read values back).

use good_lp::{ProblemVariables, Variable, variable};

/// A variable and its column index (good_lp keeps the index private; HiGHS needs it for the
/// warm start and to read values back).
#[derive(Debug, Clone, Copy)]
pub(in crate::ilp) struct Col {
    pub var: Variable,
    pub index: usize,
}

/// The problem's variables in creation order.
pub(in crate::ilp) struct Columns {
    pub problem: ProblemVariables,
    pub count: usize,
    pub integer: usize,
    /// The LP relaxation: binary and integer columns keep their bounds but not their integrality.
    pub relaxed: bool,
}

/// Whether a column counts among the integer ones (binary and integer columns; the former
/// `integer: bool`'s `true`) or is continuous (`false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Integrality {
    Integer,
    Continuous,
}

impl Columns {
    fn add(&mut self, def: good_lp::VariableDefinition, integrality: Integrality) -> Col {
        let var = self.problem.add(def);
        let col = Col {
            var,
            index: self.count,
        };
        self.count += 1;
        self.integer += usize::from(integrality == Integrality::Integer);
        col
    }

    pub fn binary(&mut self) -> Col {
        let def = if self.relaxed {
            variable().min(0).max(1)
        } else {
            variable().binary()
        };
        self.add(def, Integrality::Integer)
    }

    pub fn integer(&mut self, max: u32) -> Col {
        let def = variable().min(0).max(max);
        self.add(
            if self.relaxed { def } else { def.integer() },
            Integrality::Integer,
        )
    }

    /// A launch column fixed at 0: a position a restricted LP leaves out, whose reduced cost
    /// HiGHS reports beside the others (`super::micro`'s pricing).
    pub fn left_out(&mut self) -> Col {
        self.add(variable().min(0).max(0), Integrality::Integer)
    }

    pub fn continuous(&mut self) -> Col {
        self.add(variable().min(0), Integrality::Continuous)
    }

    /// A continuous column in [0, 1].
    pub fn fraction(&mut self) -> Col {
        self.add(variable().min(0).max(1), Integrality::Continuous)
    }
}
