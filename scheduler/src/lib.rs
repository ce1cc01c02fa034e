//! shardplan's planning core: model specs and analytic profiles, the plan format, the reference
//! timeline simulator (DESIGN §3) and the baseline schedules (DESIGN §5).
//!
//! Everything here is pure computation over data files; nothing touches a device.

pub mod analytic;
pub mod baselines;
pub mod classes;
pub mod cost;
pub mod curve;
pub mod error;
pub mod export;
pub mod fsdp2;
pub mod groups;
pub mod hardware;
pub mod hf_config;
#[cfg(feature = "solver")]
pub mod ilp;
pub mod io;
pub mod model;
pub mod nccl_tests;
pub mod offload;
pub mod plan;
pub mod precision;
pub mod profile;
pub mod schedule;
pub mod sim;
pub mod size;
#[cfg(feature = "solver")]
pub mod sweep;
pub mod target;
pub mod timeline;
pub mod unrolled;

pub use error::{Error, Result};
