//! The training precision policy (DESIGN §6.9), as FSDP2's `MixedPrecisionPolicy(param_dtype,
//! reduce_dtype)`: the dtype parameters are gathered and computed in, and the dtype gradients are
//! reduced in. It fixes the bytes per parameter a profile counts, so a profile's
//! [`BytesPerParam`] is the policy its run trains under:
//!
//! | precision | reduce | p | g | o (master + Adam m, v) |
//! |---|---|---|---|---|
//! | fp32 | fp32 | 4 | 4 | 8 (the fp32 parameters are the master) |
//! | bf16 | fp32 | 2 | 4 | 12 |
//! | bf16 | bf16 | 2 | 2 | 12 |

use crate::profile::BytesPerParam;
use serde::{Deserialize, Serialize};

/// A floating-point format of parameters or gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FloatFormat {
    #[default]
    Fp32,
    Bf16,
}

impl FloatFormat {
    pub fn bytes(self) -> u64 {
        match self {
            FloatFormat::Fp32 => 4,
            FloatFormat::Bf16 => 2,
        }
    }

    /// Whether it is the default (fp32), which files leave out.
    pub fn is_fp32(&self) -> bool {
        *self == FloatFormat::Fp32
    }

    pub fn name(self) -> &'static str {
        match self {
            FloatFormat::Fp32 => "fp32",
            FloatFormat::Bf16 => "bf16",
        }
    }

    fn of_bytes(bytes: u64) -> Option<FloatFormat> {
        match bytes {
            4 => Some(FloatFormat::Fp32),
            2 => Some(FloatFormat::Bf16),
            _ => None,
        }
    }
}

/// A run's precision policy; the only value with reductions in bf16 has bf16 parameters too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Precision {
    param: FloatFormat,
    reduce: FloatFormat,
}

impl Precision {
    pub const FP32: Precision = Precision {
        param: FloatFormat::Fp32,
        reduce: FloatFormat::Fp32,
    };

    /// Every policy: fp32; bf16 with fp32 reductions; bf16.
    pub const ALL: [Precision; 3] = [
        Precision::FP32,
        Precision {
            param: FloatFormat::Bf16,
            reduce: FloatFormat::Fp32,
        },
        Precision {
            param: FloatFormat::Bf16,
            reduce: FloatFormat::Bf16,
        },
    ];

    /// The policy of `[training] precision` and `reduce`; an error (the expected values) for bf16
    /// reductions of fp32 parameters, which no master copy would need and none of ours runs.
    pub fn new(param: FloatFormat, reduce: FloatFormat) -> Result<Precision, String> {
        if param == FloatFormat::Fp32 && reduce == FloatFormat::Bf16 {
            return Err(
                "reduce = \"fp32\" with precision = \"fp32\" (bf16 reductions need \
                        precision = \"bf16\"), got reduce = \"bf16\""
                    .into(),
            );
        }
        Ok(Precision { param, reduce })
    }

    /// The policy a profile's bytes per parameter describe; an error saying what was expected
    /// for any other (an analytic profile of another optimizer, say).
    pub fn of_bytes(bytes: BytesPerParam) -> Result<Precision, String> {
        let found = FloatFormat::of_bytes(bytes.param)
            .zip(FloatFormat::of_bytes(bytes.grad))
            .and_then(|(param, reduce)| Precision::new(param, reduce).ok())
            .filter(|p| p.bytes_per_param() == bytes);
        found.ok_or_else(|| {
            format!(
                "(param, grad, optimizer) bytes of a policy the runtime trains: (4, 4, 8) fp32, \
                 (2, 4, 12) bf16 with fp32 reductions or (2, 2, 12) bf16; got ({}, {}, {})",
                bytes.param, bytes.grad, bytes.optimizer
            )
        })
    }

    pub fn param(self) -> FloatFormat {
        self.param
    }

    pub fn reduce(self) -> FloatFormat {
        self.reduce
    }

    /// Whether the optimizer updates an fp32 master copy of the parameters (bf16 parameters).
    pub fn has_master(self) -> bool {
        self.param != FloatFormat::Fp32
    }

    /// p, g and o of the table above.
    pub fn bytes_per_param(self) -> BytesPerParam {
        let master = if self.has_master() { 4 } else { 0 };
        BytesPerParam {
            param: self.param.bytes(),
            grad: self.reduce.bytes(),
            optimizer: 8 + master,
        }
    }

    /// `precision = "bf16", reduce = "fp32"`, as written in a model file.
    pub fn describe(self) -> String {
        format!(
            "precision = \"{}\", reduce = \"{}\"",
            self.param.name(),
            self.reduce.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_round_trips_through_its_bytes() {
        use FloatFormat::*;
        for (param, reduce) in [(Fp32, Fp32), (Bf16, Fp32), (Bf16, Bf16)] {
            let p = Precision::new(param, reduce).unwrap();
            assert_eq!(Precision::of_bytes(p.bytes_per_param()), Ok(p));
        }
        let mixed = Precision::new(Bf16, Fp32).unwrap().bytes_per_param();
        assert_eq!((mixed.param, mixed.grad, mixed.optimizer), (2, 4, 12));
    }

    #[test]
    fn other_bytes_and_bf16_reductions_of_fp32_are_refused() {
        let why = Precision::new(FloatFormat::Fp32, FloatFormat::Bf16).unwrap_err();
        assert!(why.contains("precision = \"bf16\""), "{why}");
        let adam8 = BytesPerParam {
            param: 2,
            grad: 2,
            optimizer: 8,
        };
        let why = Precision::of_bytes(adam8).unwrap_err();
        assert!(why.contains("got (2, 2, 8)"), "{why}");
    }
}
