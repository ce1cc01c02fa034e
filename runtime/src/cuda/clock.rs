//! Per-launch timing (`profile measure --launch-times`, DESIGN §6.6): while the clock runs, every
//! kernel and product the backend enqueues ([`super::work`]) is bracketed by a pair of timing
//! events on its stream, so each launch's device time can be read once the stream has reached
//! them. Off (the default), a launch takes one lock and nothing else.

use super::driver_error;
use crate::Result;
use crate::backend::LaunchTime;
use crate::lock::recover;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use std::sync::Mutex;

/// The launches timed since the clock started, in enqueue order; `None` while it is stopped.
#[derive(Default)]
pub(super) struct LaunchClock(Mutex<Option<Vec<Pending>>>);

/// A launch whose events the device may not have reached yet.
struct Pending {
    name: String,
    flops: f64,
    start: CudaEvent,
    end: CudaEvent,
}

impl LaunchClock {
    pub(super) fn start(&self) {
        *self.lock() = Some(Vec::new());
    }

    /// Whether the clock runs (launches are being timed one by one).
    pub(super) fn running(&self) -> bool {
        self.lock().is_some()
    }

    /// Enqueues `launch` on `stream`, bracketed by timing events while the clock runs.
    pub(super) fn around(
        &self,
        stream: &CudaStream,
        name: impl FnOnce() -> String,
        flops: f64,
        launch: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut timed = self.lock();
        let Some(timed) = timed.as_mut() else {
            return launch();
        };
        let event = || {
            stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver_error("recording a launch's event"))
        };
        let start = event()?;
        launch()?;
        timed.push(Pending {
            name: name(),
            flops,
            start,
            end: event()?,
        });
        Ok(())
    }

    /// Stops the clock and returns each launch's time; the caller has synchronised the device.
    pub(super) fn stop(&self) -> Result<Vec<LaunchTime>> {
        let timed = self.lock().take().unwrap_or_default();
        timed
            .into_iter()
            .map(|p| {
                let ms = p
                    .start
                    .elapsed_ms(&p.end)
                    .map_err(driver_error("timing a launch"))?;
                Ok(LaunchTime {
                    name: p.name,
                    flops: p.flops,
                    us: f64::from(ms) * 1e3,
                })
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<Pending>>> {
        recover(self.0.lock())
    }
}
