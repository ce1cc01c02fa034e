//! How far mlp-small's training moves when its start moves by one unit in the last place: the
//! single-process CPU reference from its initial weights against the same with every 7th weight
//! of unit 2 scaled by 1 + 2⁻²³. The yardstick for the GPU's difference from the CPU
//! (docs/gpu-results.md): rounding alone gives these numbers.
//!
//!     cargo run --release -p shardplan-runtime --example ulp_sensitivity

use shardplan_runtime::mlp::{
    MlpSpec, max_relative_error, reference_training_from, update_relative_error,
};
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = MlpSpec::load(Path::new("models/mlp-small.toml"))?;
    let initial: Vec<Vec<f32>> = (0..spec.units())
        .map(|u| spec.initial_params(u, spec.params(u)))
        .collect();
    let mut nudged = initial.clone();
    for w in nudged[2].iter_mut().step_by(7) {
        *w *= 1.0 + f32::EPSILON;
    }
    println!("steps  largest difference / largest weight  ‖ΔW‖ / ‖W − W0‖");
    for steps in [1, 2, 4, 8, 16] {
        let (a, _) = reference_training_from(&spec, 1, steps, initial.clone());
        let (b, _) = reference_training_from(&spec, 1, steps, nudged.clone());
        println!(
            "{steps:5}  {:35.2e}  {:15.2e}",
            max_relative_error(&b, &a)?,
            update_relative_error(&b, &a, &initial)?
        );
    }
    Ok(())
}
