//! The CPU backend's arena: host memory that the compute and the communication thread use at
//! once, each through regions it borrows. Like `RefCell`, but per range and across threads:
//! every borrow is recorded while it lives, and a borrow that would overlap a live one — unless
//! both only read — is refused with an error. So the arena hands out `&mut [f32]` only where no
//! other reference to those elements exists, whatever the executor's schedule does; a schedule
//! that lets two operations touch the same elements at once becomes an error, not a data race.

use super::Region;
use crate::{Error, Result};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Mutex;

/// f32 elements, borrowed by region.
#[derive(Default)]
pub(crate) struct HostArena {
    /// `UnsafeCell` per element: a shared reference to the cells permits writing through them,
    /// which [`HostArena::write`] does only inside a range it has leased exclusively.
    cells: Box<[UnsafeCell<f32>]>,
    leases: Mutex<Leases>,
}

// SAFETY: the elements are reached only through `Read` and `Write`, whose ranges are checked
// against every live lease under the `leases` lock: a `Write` is never alive beside another
// borrow of an overlapping range.
unsafe impl Sync for HostArena {}

#[derive(Default)]
struct Leases {
    next_id: u64,
    live: Vec<Lease>,
}

struct Lease {
    id: u64,
    range: Range<usize>,
    exclusive: bool,
}

impl HostArena {
    /// An arena of `elements` zeros; fails (never aborts) when the host has not that much memory.
    pub(crate) fn zeroed(elements: usize) -> Result<HostArena> {
        let mut cells = Vec::new();
        cells.try_reserve_exact(elements).map_err(|e| {
            Error::Backend(format!(
                "cannot allocate the {} MiB arena: {e}",
                (elements * 4) >> 20
            ))
        })?;
        cells.resize_with(elements, || UnsafeCell::new(0.0));
        Ok(HostArena {
            cells: cells.into_boxed_slice(),
            leases: Mutex::default(),
        })
    }

    /// The elements of `region`, to read; fails while any part of them is borrowed to write.
    pub(crate) fn read(&self, region: Region) -> Result<Read<'_>> {
        let (id, cells) = self.lease(region, false)?;
        // SAFETY: no `Write` overlapping these cells is alive (checked by `lease`) and none can
        // be created until this lease is returned on drop; `UnsafeCell<f32>` has f32's layout.
        let slice =
            unsafe { std::slice::from_raw_parts(cells.as_ptr().cast::<f32>(), cells.len()) };
        Ok(Read {
            arena: self,
            id,
            slice,
        })
    }

    /// The elements of `region`, to write; fails while any part of them is borrowed at all.
    pub(crate) fn write(&self, region: Region) -> Result<Write<'_>> {
        let (id, cells) = self.lease(region, true)?;
        // SAFETY: this lease is the only live borrow of these cells (checked by `lease`) until it
        // is returned on drop; writing through a shared `UnsafeCell` is allowed.
        let slice = unsafe {
            std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), cells.len())
        };
        Ok(Write {
            arena: self,
            id,
            slice,
        })
    }

    /// Records a borrow of `region` after checking it against the live ones.
    fn lease(&self, region: Region, exclusive: bool) -> Result<(u64, &[UnsafeCell<f32>])> {
        let end = region.offset.saturating_add(region.len);
        let range = region.offset..end;
        let cells = self.cells.get(range.clone()).ok_or_else(|| {
            Error::Backend(format!(
                "region {range:?} lies outside the {}-element arena",
                self.cells.len()
            ))
        })?;
        let mut leases = self.leases.lock().map_err(|_| poisoned())?;
        let clash = leases.live.iter().find(|lease| {
            (exclusive || lease.exclusive)
                && !range.is_empty()
                && lease.range.start < range.end
                && range.start < lease.range.end
        });
        if let Some(clash) = clash {
            let access = |exclusive| if exclusive { "write" } else { "read" };
            return Err(Error::Backend(format!(
                "arena elements {range:?} borrowed to {} while {:?} are borrowed to {}: the \
                 schedule let two operations use the same memory at once",
                access(exclusive),
                clash.range,
                access(clash.exclusive)
            )));
        }
        let id = leases.next_id;
        leases.next_id += 1;
        leases.live.push(Lease {
            id,
            range,
            exclusive,
        });
        Ok((id, cells))
    }

    fn release(&self, id: u64) {
        // A poisoned lock means a thread panicked while holding it; the arena is being torn down.
        if let Ok(mut leases) = self.leases.lock() {
            leases.live.retain(|lease| lease.id != id);
        }
    }
}

fn poisoned() -> Error {
    Error::Backend("the arena's borrow record was poisoned by a panicking thread".into())
}

/// Region elements borrowed to read; returned on drop.
pub(crate) struct Read<'a> {
    arena: &'a HostArena,
    id: u64,
    slice: &'a [f32],
}

impl Deref for Read<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.slice
    }
}

impl Drop for Read<'_> {
    fn drop(&mut self) {
        self.arena.release(self.id);
    }
}

/// Region elements borrowed to write; returned on drop.
pub(crate) struct Write<'a> {
    arena: &'a HostArena,
    id: u64,
    slice: &'a mut [f32],
}

impl Deref for Write<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.slice
    }
}

impl DerefMut for Write<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.slice
    }
}

impl Drop for Write<'_> {
    fn drop(&mut self) {
        self.arena.release(self.id);
    }
}

/// Borrows each of `regions` with `borrow`, all or none.
pub(crate) fn each<T, const N: usize>(
    regions: [Region; N],
    borrow: impl FnMut(Region) -> Result<T>,
) -> Result<[T; N]> {
    let borrowed = regions
        .into_iter()
        .map(borrow)
        .collect::<Result<Vec<T>>>()?;
    Ok(borrowed
        .try_into()
        .unwrap_or_else(|_| unreachable!("N regions give N borrows")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(offset: usize, len: usize) -> Region {
        Region { offset, len }
    }

    #[test]
    fn overlapping_reads_are_allowed_and_a_write_beside_them_is_refused() {
        let arena = HostArena::zeroed(10).unwrap();
        let a = arena.read(region(0, 5)).unwrap();
        let b = arena.read(region(3, 5)).unwrap();
        let err = arena.write(region(4, 1)).err().unwrap().to_string();
        assert!(err.contains("4..5") && err.contains("0..5"), "{err}");
        drop((a, b));
        arena.write(region(4, 1)).unwrap();
    }

    #[test]
    fn a_write_excludes_every_overlapping_borrow_until_dropped() {
        let arena = HostArena::zeroed(10).unwrap();
        let mut w = arena.write(region(2, 4)).unwrap();
        w.fill(7.0);
        assert!(arena.read(region(5, 1)).is_err());
        assert!(arena.write(region(0, 3)).is_err());
        // Adjacent and empty ranges share no element.
        arena.write(region(6, 4)).unwrap();
        arena.write(region(0, 2)).unwrap();
        arena.write(region(3, 0)).unwrap();
        drop(w);
        assert_eq!(
            &*arena.read(region(1, 6)).unwrap(),
            &[0., 7., 7., 7., 7., 0.]
        );
    }

    #[test]
    fn a_region_past_the_end_is_an_error() {
        let arena = HostArena::zeroed(4).unwrap();
        assert!(arena.read(region(2, 3)).is_err());
        assert!(arena.write(region(5, 0)).is_err());
        assert!(arena.read(region(4, 0)).is_ok());
        assert!(arena.read(region(1, usize::MAX)).is_err());
    }

    #[test]
    fn two_threads_write_disjoint_halves_at_once() {
        let arena = HostArena::zeroed(1000).unwrap();
        std::thread::scope(|s| {
            for half in 0..2 {
                let arena = &arena;
                s.spawn(move || {
                    for _ in 0..100 {
                        arena
                            .write(region(half * 500, 500))
                            .unwrap()
                            .fill(half as f32);
                    }
                });
            }
        });
        let all = arena.read(region(0, 1000)).unwrap();
        assert!(all[..500].iter().all(|&x| x == 0.0) && all[500..].iter().all(|&x| x == 1.0));
    }
}
