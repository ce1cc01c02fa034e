//! HiGHS' MIP interrupt callback as a work meter (DESIGN §4.6): it stops a MIP once its LPs have
//! spent the run's share of the effort. HiGHS calls it at fixed points of its search (each limit
//! check) with the total of the MIP's LP iterations so far, which is the same on any machine and
//! under any load, so the run stops at the same point wherever it runs. The one unsafe part of
//! the crate: [`solve_metered`] registers a callback whose data lives exactly as long as the
//! solve.

use highs_sys::{
    Highs_setCallback, Highs_startCallback, Highs_stopCallback, HighsCallbackDataIn,
    HighsCallbackDataOut, HighsInt, kHighsCallbackMipInterrupt as MIP_INTERRUPT,
};
use std::ffi::{c_char, c_int, c_void};

/// Solves `model`, a MIP, stopping it once its LP iterations reach `iterations` (HiGHS' status
/// is then `ReachedInterrupt`).
pub(super) fn solve_metered(
    mut model: highs::Model,
    iterations: u64,
) -> Result<highs::SolvedModel, highs::HighsStatus> {
    let limit = i64::try_from(iterations).unwrap_or(i64::MAX);
    let data = &limit as *const i64 as *mut c_void;
    // SAFETY: `model` owns a live HiGHS instance; `data` points to `limit`, which outlives the
    // solve below, and the callback is removed before `limit` is dropped.
    unsafe {
        Highs_setCallback(model.as_mut_ptr(), Some(on_callback), data);
        Highs_startCallback(model.as_mut_ptr(), MIP_INTERRUPT);
    }
    let solved = model.try_solve();
    if let Ok(solved) = &solved {
        let highs = solved.as_ptr() as *mut c_void;
        // SAFETY: the solved model owns the same live instance; no solve runs on it any more.
        unsafe {
            Highs_stopCallback(highs, MIP_INTERRUPT);
            Highs_setCallback(highs, None, std::ptr::null_mut());
        }
    }
    solved
}

/// HiGHS' C callback: `user_data` is the iteration limit of [`solve_metered`].
unsafe extern "C" fn on_callback(
    callback_type: c_int,
    _message: *const c_char,
    data_out: *const HighsCallbackDataOut,
    data_in: *mut HighsCallbackDataIn,
    user_data: *mut c_void,
) {
    if callback_type as HighsInt != MIP_INTERRUPT
        || data_out.is_null()
        || data_in.is_null()
        || user_data.is_null()
    {
        return;
    }
    // SAFETY: HiGHS passes valid pointers for the duration of the call; `user_data` is the limit
    // that `solve_metered` keeps alive while the callback is set.
    let (out, input, limit) = unsafe { (&*data_out, &mut *data_in, *(user_data as *const i64)) };
    if out.mip_total_lp_iterations >= limit {
        input.user_interrupt = 1;
    }
}
