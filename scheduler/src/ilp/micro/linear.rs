//! A linear form over the MIP's columns that can be read back at a solution, which good_lp's
//! expressions cannot (their variables do not give their column index).

use crate::ilp::variables::Col;
use good_lp::Expression;

/// Σ coefficient·column + constant.
#[derive(Debug, Clone, Default)]
pub(super) struct Linear {
    pub terms: Vec<(Col, f64)>,
    pub constant: f64,
}

impl Linear {
    pub fn add(&mut self, col: Col, coefficient: f64) {
        self.terms.push((col, coefficient));
    }

    /// Adds `factor` times `other`.
    pub fn add_scaled(&mut self, other: &Linear, factor: f64) {
        self.terms
            .extend(other.terms.iter().map(|&(col, c)| (col, c * factor)));
        self.constant += other.constant * factor;
    }

    pub fn expression(&self) -> Expression {
        let mut e = Expression::from(self.constant);
        for &(col, c) in &self.terms {
            e += c * col.var;
        }
        e
    }

    /// Its value where column k holds `values[k]`.
    pub fn eval(&self, values: &[f64]) -> f64 {
        self.constant
            + self
                .terms
                .iter()
                .map(|&(col, c)| c * values[col.index])
                .sum::<f64>()
    }
}
