//! HiGHS' MIP callbacks for a run that shares its progress with another search ([`Shared`]):
//! the interrupt callback stops the run once the pair proves the target, and the user-solution
//! callback hands a MIP of plans the other search's better plan. The one unsafe part of the
//! crate: [`solve_watched`] registers a callback whose data lives exactly as long as the solve.

use super::race::Shared;
use crate::schedule::Schedule;
use highs_sys::{
    Highs_setCallback, Highs_setCallbackSolution, Highs_startCallback, Highs_stopCallback,
    HighsCallbackDataIn, HighsCallbackDataOut, HighsInt,
    kHighsCallbackCallbackMipUserSolution as MIP_USER_SOLUTION,
    kHighsCallbackMipInterrupt as MIP_INTERRUPT,
};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};

/// A plan's column values in one model (None: the model cannot represent it).
pub(super) type PlanValues<'a> = dyn Fn(&Schedule) -> Option<Vec<f64>> + Sync + 'a;

/// How one HiGHS run takes part in the shared search.
pub(super) struct Watch<'a> {
    pub shared: &'a Shared,
    /// Whether the run's dual bound holds over every plan (full windows, or a relaxation of them).
    pub bounds_every_plan: bool,
    /// For a MIP of plans: a plan's column values in this model (None: it cannot represent it).
    pub values_of: Option<&'a PlanValues<'a>>,
}

/// A watch and the generation of the shared plan it last handed to HiGHS.
struct Registered<'a> {
    watch: &'a Watch<'a>,
    handed: AtomicU64,
}

/// Solves `model` with `watch`'s callbacks (none when `watch` is None).
pub(super) fn solve_watched(
    mut model: highs::Model,
    watch: Option<&Watch>,
) -> Result<highs::SolvedModel, highs::HighsStatus> {
    let Some(watch) = watch else {
        return model.try_solve();
    };
    let registered = Registered {
        watch,
        handed: AtomicU64::new(0),
    };
    let data = &registered as *const Registered as *mut c_void;
    // SAFETY: `model` owns a live HiGHS instance; `data` points to `registered`, which outlives
    // the solve below, and the callback is removed before `registered` is dropped.
    unsafe {
        Highs_setCallback(model.as_mut_ptr(), Some(on_callback), data);
        Highs_startCallback(model.as_mut_ptr(), MIP_INTERRUPT);
        if watch.values_of.is_some() {
            Highs_startCallback(model.as_mut_ptr(), MIP_USER_SOLUTION);
        }
    }
    let solved = model.try_solve();
    if let Ok(solved) = &solved {
        let highs = solved.as_ptr() as *mut c_void;
        // SAFETY: the solved model owns the same live instance; no solve runs on it any more.
        unsafe {
            Highs_stopCallback(highs, MIP_INTERRUPT);
            Highs_stopCallback(highs, MIP_USER_SOLUTION);
            Highs_setCallback(highs, None, std::ptr::null_mut());
        }
    }
    solved
}

/// HiGHS' C callback: `user_data` is the `Registered` of [`solve_watched`].
unsafe extern "C" fn on_callback(
    callback_type: c_int,
    _message: *const c_char,
    data_out: *const HighsCallbackDataOut,
    data_in: *mut HighsCallbackDataIn,
    user_data: *mut c_void,
) {
    if data_out.is_null() || data_in.is_null() || user_data.is_null() {
        return;
    }
    // SAFETY: HiGHS passes valid pointers for the duration of the call; `user_data` is the
    // `Registered` that `solve_watched` keeps alive while the callback is set.
    let (out, input, registered) = unsafe {
        (
            &*data_out,
            &mut *data_in,
            &*(user_data as *const Registered),
        )
    };
    // A panic must not unwind into HiGHS; a failed callback just lets the run go on.
    let _ = catch_unwind(AssertUnwindSafe(|| match callback_type as HighsInt {
        MIP_INTERRUPT => {
            let watch = registered.watch;
            let own_bound = if watch.bounds_every_plan {
                watch.shared.offer_bound(out.mip_dual_bound);
                out.mip_dual_bound
            } else {
                f64::NEG_INFINITY
            };
            // A relaxation's incumbent is not a plan; a MIP of plans' is one at its objective.
            let incumbent = if watch.values_of.is_some() {
                out.mip_primal_bound
            } else {
                f64::INFINITY
            };
            if watch.shared.proves(incumbent, own_bound) {
                input.user_interrupt = 1;
            }
        }
        MIP_USER_SOLUTION => hand_plan(registered, out, input),
        _ => {}
    }));
}

/// Gives HiGHS the shared best plan when it is new to this run and better than its incumbent.
fn hand_plan(registered: &Registered, out: &HighsCallbackDataOut, input: &mut HighsCallbackDataIn) {
    let Some(values_of) = registered.watch.values_of else {
        return;
    };
    let handed = registered.handed.load(Ordering::Relaxed);
    let Some((schedule, value, generation)) = registered.watch.shared.best_since(handed) else {
        return;
    };
    registered.handed.store(generation, Ordering::Relaxed);
    if value >= out.mip_primal_bound {
        return;
    }
    if let Some(values) = values_of(&schedule)
        && let Ok(len) = HighsInt::try_from(values.len())
    {
        // SAFETY: `input` is HiGHS' live callback input; `values` has `len` entries, at most the
        // model's columns (HiGHS checks and copies them).
        unsafe {
            Highs_setCallbackSolution(input, len, values.as_ptr());
        }
    }
}
