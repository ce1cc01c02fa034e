//! A collective's time-vs-bytes curve as a table of measured or modelled points, and the block
//! size it implies.

use serde::{Deserialize, Serialize};

/// Longest time of one field or curve point, µs (about 32 years): sums over every unit, slot and
/// block stay finite.
pub const MAX_TIME_US: f64 = 1e15;

/// Largest message a curve may list (1 EiB).
pub const MAX_MESSAGE_BYTES: u64 = 1 << 60;

/// Points `(bytes, µs)`, bytes = the full (unsharded) message as in nccl-tests' `size` column.
/// Fraction of the peak bus bandwidth that defines the block size (DESIGN §7).
pub const BLOCK_BANDWIDTH_FRACTION: f64 = 0.9;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommCurve {
    /// `[message_bytes, time_us]` pairs, strictly increasing in bytes.
    pub points: Vec<(u64, f64)>,
}

impl CommCurve {
    /// Checks the table: at least two points, bytes strictly increasing, times positive and
    /// finite. Returns what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.points.len() < 2 {
            return Err(format!(
                "at least 2 [bytes, us] points, got {}",
                self.points.len()
            ));
        }
        for (k, &(bytes, us)) in self.points.iter().enumerate() {
            if bytes == 0 || bytes > MAX_MESSAGE_BYTES || !(us > 0.0 && us <= MAX_TIME_US) {
                return Err(format!(
                    "point {k}: positive bytes up to 2^60 and a positive time up to {MAX_TIME_US:e} µs, got [{bytes}, {us}]"
                ));
            }
            if k > 0 && bytes <= self.points[k - 1].0 {
                return Err(format!(
                    "point {k}: bytes strictly increasing, got {bytes} after {}",
                    self.points[k - 1].0
                ));
            }
        }
        Ok(())
    }

    /// Time of one collective on a message of `bytes`: linear interpolation between points; below
    /// the first point its time (latency floor); above the last, the last segment extended.
    pub fn time_us(&self, bytes: f64) -> f64 {
        let p = &self.points;
        let (b0, t0) = (p[0].0 as f64, p[0].1);
        if bytes <= b0 {
            return t0;
        }
        let k = p
            .partition_point(|&(b, _)| (b as f64) < bytes)
            .clamp(1, p.len() - 1);
        let (xa, ya) = (p[k - 1].0 as f64, p[k - 1].1);
        let (xb, yb) = (p[k].0 as f64, p[k].1);
        ya + (yb - ya) * (bytes - xa) / (xb - xa)
    }

    /// The smallest power-of-two message (within the table's range) whose algorithmic bandwidth
    /// reaches `fraction` of the table's best. Bus bandwidth is algorithmic bandwidth times a
    /// factor fixed by the op and n, so the ratio is the same for both.
    pub fn block_size(&self, fraction: f64) -> u64 {
        let peak = self
            .points
            .iter()
            .map(|&(b, t)| b as f64 / t)
            .fold(0.0, f64::max);
        let first = self.points[0].0.next_power_of_two();
        let last = self.points[self.points.len() - 1].0;
        let mut size = first;
        while size < last {
            if size as f64 / self.time_us(size as f64) >= fraction * peak {
                return size;
            }
            size *= 2;
        }
        last.next_power_of_two()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alpha_beta(latency: f64, bytes_per_us: f64) -> CommCurve {
        CommCurve {
            points: (10..=32)
                .map(|e| (1u64 << e, latency + (1u64 << e) as f64 / bytes_per_us))
                .collect(),
        }
    }

    #[test]
    fn interpolates_clamps_and_extrapolates() {
        let c = CommCurve {
            points: vec![(100, 10.0), (200, 20.0), (400, 30.0)],
        };
        assert_eq!(c.time_us(50.0), 10.0);
        assert_eq!(c.time_us(150.0), 15.0);
        assert_eq!(c.time_us(300.0), 25.0);
        assert_eq!(c.time_us(800.0), 50.0);
    }

    #[test]
    fn block_size_is_where_bandwidth_reaches_ninety_percent() {
        // t = 100 µs + S / (1e5 B/µs); the best point (4 GiB) runs at 1e5/(1 + 1e7/2^32) B/µs.
        // 90% of it needs 100 / (S/1e5) <= ~0.1077 => S >= 9.28e7 B => 2^27 = 134217728.
        let c = alpha_beta(100.0, 1e5);
        assert_eq!(c.block_size(0.9), 1 << 27);
        // A smaller latency reaches the same bandwidth with smaller messages.
        assert!(alpha_beta(10.0, 1e5).block_size(0.9) < 1 << 27);
    }

    #[test]
    fn check_rejects_bad_tables() {
        assert!(
            CommCurve {
                points: vec![(1, 1.0)]
            }
            .check()
            .is_err()
        );
        assert!(
            CommCurve {
                points: vec![(2, 1.0), (1, 2.0)]
            }
            .check()
            .unwrap_err()
            .contains("increasing")
        );
        assert!(
            CommCurve {
                points: vec![(1, 1.0), (2, -2.0)]
            }
            .check()
            .unwrap_err()
            .contains("positive")
        );
    }
}
