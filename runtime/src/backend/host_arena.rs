//! The CPU backend's arena: host memory that the compute and the communication thread use at
//! once, each through regions it borrows. Like `RefCell`, but per range and across threads:
//! every borrow is recorded while it lives, and a borrow that would overlap a live one — unless
//! both only read — is refused with an error. So the arena hands out `&mut` slices only where no
//! other reference to those words exists, whatever the executor's schedule does; a schedule
//! that lets two operations touch the same elements at once becomes an error, not a data race.
//!
//! A region's elements are lent as stored ([`HostArena::lend`], fp32 or bf16 bit patterns: what
//! the collectives move) or as f32 ([`HostArena::read`], [`HostArena::write`]: what the kernels
//! compute with). A bf16 region read as f32 is widened into a copy; written as f32, its copy is
//! rounded back to bf16 (to nearest, ties to even) when the borrow ends (DESIGN §6.9).

use super::{FloatFormat, Region, words};
use crate::lock::recover;
use crate::{Error, Result};
use half::bf16;
use half::slice::HalfFloatSliceExt;
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Mutex;

/// 4-byte words, borrowed by region.
pub(crate) struct HostArena {
    /// `UnsafeCell` per word: a shared reference to the cells permits writing through them,
    /// which [`HostArena::lend_mut`] does only inside a range it has leased exclusively.
    cells: Box<dyn Words>,
    leases: Mutex<Leases>,
}

/// The memory an arena's words live in: an allocation of its own ([`HostArena::zeroed`]) or one
/// a backend made (the CUDA backend's page-locked host arena, `cuda::pinned`).
pub(crate) trait Words: Send {
    /// The words, each an `UnsafeCell`: written only through the arena's exclusive leases (and,
    /// for memory a device copies to or from, by copies the backend's marks order against them).
    fn cells(&self) -> &[UnsafeCell<f32>];
}

impl Words for Box<[UnsafeCell<f32>]> {
    fn cells(&self) -> &[UnsafeCell<f32>] {
        self
    }
}

impl Default for HostArena {
    fn default() -> HostArena {
        HostArena::over(Box::new(Box::<[UnsafeCell<f32>]>::default()))
    }
}

// SAFETY: the words are reached only through `Lent` and `LentMut`, whose ranges are checked
// against every live lease under the `leases` lock: a `LentMut` is never alive beside another
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
    access: Access,
}

/// How a lease borrows its words: `Shared` to read (the former `exclusive: bool`'s `false`),
/// `Exclusive` to write (`true`), which no other lease of an overlapping word may coexist with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Shared,
    Exclusive,
}

impl Access {
    /// What the borrow is for, as the clash error says it.
    fn purpose(self) -> &'static str {
        match self {
            Access::Shared => "read",
            Access::Exclusive => "write",
        }
    }
}

/// A format elements are stored in.
///
/// # Safety
/// `Self` is 4 or 2 bytes of plain data, valid for every bit pattern, aligned to at most 4, and
/// `FORMAT` is the format whose elements it is.
pub(crate) unsafe trait Stored: Copy + 'static {
    const FORMAT: FloatFormat;
}

// SAFETY: f32 is 4 bytes, every bit pattern valid.
unsafe impl Stored for f32 {
    const FORMAT: FloatFormat = FloatFormat::Fp32;
}

// SAFETY: bf16 is a transparent u16.
unsafe impl Stored for bf16 {
    const FORMAT: FloatFormat = FloatFormat::Bf16;
}

impl HostArena {
    /// An arena of `words` zeros; fails (never aborts) when the host has not that much memory.
    pub(crate) fn zeroed(words: usize) -> Result<HostArena> {
        let mut cells = Vec::new();
        cells.try_reserve_exact(words).map_err(|e| {
            Error::Backend(format!(
                "cannot allocate the {} MiB arena: {e}",
                (words * 4) >> 20
            ))
        })?;
        cells.resize_with(words, || UnsafeCell::new(0.0));
        Ok(HostArena::over(Box::new(cells.into_boxed_slice())))
    }

    /// An arena over `words` (as they are: zero them first where zeros are wanted).
    pub(crate) fn over(words: Box<dyn Words>) -> HostArena {
        HostArena {
            cells: words,
            leases: Mutex::default(),
        }
    }

    /// The address of `region`'s first word, checked against the arena: for a device's copy to
    /// or from these words, which the caller orders against the arena's borrows.
    pub(crate) fn address(&self, region: Region) -> Result<*mut f32> {
        let cells = self.cells(region)?;
        Ok(UnsafeCell::raw_get(cells.as_ptr()))
    }

    /// `region`'s words, or an error naming it where it lies outside the arena.
    fn cells(&self, region: Region) -> Result<&[UnsafeCell<f32>]> {
        let end = region
            .offset
            .saturating_add(words(region.format, region.len));
        let range = region.offset..end;
        let cells = self.cells.cells();
        cells.get(range.clone()).ok_or_else(|| {
            Error::Backend(format!(
                "region {range:?} lies outside the {}-word arena",
                cells.len()
            ))
        })
    }

    /// The elements of `region` as stored, to read; fails while any part of them is borrowed to
    /// write, or when the region holds another format than `T`.
    pub(crate) fn lend<T: Stored>(&self, region: Region) -> Result<Lent<'_, T>> {
        let (lease, cells) = self.lease::<T>(region, Access::Shared)?;
        // SAFETY: no `LentMut` overlapping these cells is alive (checked by `lease`) and none can
        // be created until this lease is returned on drop; the words hold `region.len` elements
        // of `T` (`Stored`), whose alignment the words' meets.
        let slice = unsafe { std::slice::from_raw_parts(cells.as_ptr().cast::<T>(), region.len) };
        Ok(Lent {
            _lease: lease,
            slice,
        })
    }

    /// The elements of `region` as stored, to write; fails while any part of them is borrowed
    /// at all, or when the region holds another format than `T`.
    pub(crate) fn lend_mut<T: Stored>(&self, region: Region) -> Result<LentMut<'_, T>> {
        let (lease, cells) = self.lease::<T>(region, Access::Exclusive)?;
        // SAFETY: this lease is the only live borrow of these cells (checked by `lease`) until it
        // is returned on drop; writing through a shared `UnsafeCell` is allowed; the layout is
        // as in `lend`.
        let slice = unsafe {
            std::slice::from_raw_parts_mut(
                UnsafeCell::raw_get(cells.as_ptr()).cast::<T>(),
                region.len,
            )
        };
        Ok(LentMut {
            _lease: lease,
            slice,
        })
    }

    /// The elements of `region` as f32, to read (a widened copy of bf16 ones).
    pub(crate) fn read(&self, region: Region) -> Result<Read<'_>> {
        Ok(match region.format {
            FloatFormat::Fp32 => Read::Stored(self.lend(region)?),
            FloatFormat::Bf16 => {
                let lent = self.lend::<bf16>(region)?;
                let values = widened(&lent);
                Read::Widened {
                    _lent: lent,
                    values,
                }
            }
        })
    }

    /// The elements of `region` as f32, to write (bf16 ones widened, and rounded back when the
    /// borrow ends).
    pub(crate) fn write(&self, region: Region) -> Result<Write<'_>> {
        Ok(Write(match region.format {
            FloatFormat::Fp32 => Target::Stored(self.lend_mut(region)?),
            FloatFormat::Bf16 => {
                let lent = self.lend_mut::<bf16>(region)?;
                let values = widened(&lent);
                Target::Rounded(lent, values)
            }
        }))
    }

    /// Stores `values` in `region`'s elements (rounded to nearest-even where they are bf16).
    pub(crate) fn store(&self, region: Region, values: &[f32]) -> Result<()> {
        match region.format {
            FloatFormat::Fp32 => self.lend_mut::<f32>(region)?.copy_from_slice(values),
            FloatFormat::Bf16 => self
                .lend_mut::<bf16>(region)?
                .convert_from_f32_slice(values),
        }
        Ok(())
    }

    /// Records a borrow of `region`'s words after checking them against the live ones.
    fn lease<T: Stored>(
        &self,
        region: Region,
        access: Access,
    ) -> Result<(LeaseGuard<'_>, &[UnsafeCell<f32>])> {
        if region.format != T::FORMAT {
            return Err(Error::Backend(format!(
                "a region of {} elements lent as {}",
                region.format.name(),
                T::FORMAT.name()
            )));
        }
        let cells = self.cells(region)?;
        let range = region.offset..region.offset + cells.len();
        let mut leases = recover(self.leases.lock());
        let clash = leases.live.iter().find(|lease| {
            (access == Access::Exclusive || lease.access == Access::Exclusive)
                && !range.is_empty()
                && lease.range.start < range.end
                && range.start < lease.range.end
        });
        if let Some(clash) = clash {
            return Err(Error::Backend(format!(
                "arena words {range:?} borrowed to {} while {:?} are borrowed to {}: the \
                 schedule let two operations use the same memory at once",
                access.purpose(),
                clash.range,
                clash.access.purpose()
            )));
        }
        let id = leases.next_id;
        leases.next_id += 1;
        leases.live.push(Lease { id, range, access });
        Ok((LeaseGuard { arena: self, id }, cells))
    }

    fn release(&self, id: u64) {
        recover(self.leases.lock())
            .live
            .retain(|lease| lease.id != id);
    }
}

/// bf16 elements as f32, each written once (no zero-filled buffer first: a widened copy is made at
/// every read of a bf16 region, several per kernel call).
fn widened(elements: &[bf16]) -> Vec<f32> {
    elements.iter().map(|e| e.to_f32()).collect()
}

/// A live lease; returned on drop.
struct LeaseGuard<'a> {
    arena: &'a HostArena,
    id: u64,
}

impl Drop for LeaseGuard<'_> {
    fn drop(&mut self) {
        self.arena.release(self.id);
    }
}

/// Region elements as stored, borrowed to read.
pub(crate) struct Lent<'a, T> {
    _lease: LeaseGuard<'a>,
    slice: &'a [T],
}

impl<T> Deref for Lent<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

/// Region elements as stored, borrowed to write.
pub(crate) struct LentMut<'a, T> {
    _lease: LeaseGuard<'a>,
    slice: &'a mut [T],
}

impl<T> Deref for LentMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T> DerefMut for LentMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.slice
    }
}

/// Region elements as f32, borrowed to read.
pub(crate) enum Read<'a> {
    Stored(Lent<'a, f32>),
    /// bf16 elements (borrowed while the copy is read) and their widened copy.
    Widened {
        _lent: Lent<'a, bf16>,
        values: Vec<f32>,
    },
}

impl Deref for Read<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Read::Stored(lent) => lent,
            Read::Widened { values, .. } => values,
        }
    }
}

/// Region elements as f32, borrowed to write.
pub(crate) struct Write<'a>(Target<'a>);

enum Target<'a> {
    Stored(LentMut<'a, f32>),
    /// bf16 elements and the f32 values rounded into them on drop.
    Rounded(LentMut<'a, bf16>, Vec<f32>),
}

impl Deref for Write<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.0 {
            Target::Stored(lent) => lent,
            Target::Rounded(_, values) => values,
        }
    }
}

impl DerefMut for Write<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.0 {
            Target::Stored(lent) => lent,
            Target::Rounded(_, values) => values,
        }
    }
}

impl Drop for Write<'_> {
    fn drop(&mut self) {
        if let Target::Rounded(lent, values) = &mut self.0 {
            lent.convert_from_f32_slice(values);
        }
    }
}

/// Memory a host kernel borrows its regions from as f32: the CPU backend's arenas, the CUDA
/// backend's page-locked host arena (the host's optimizer step, DESIGN §6.12).
pub(crate) trait HostMemory {
    fn read(&self, region: Region) -> Result<Read<'_>>;
    fn write(&self, region: Region) -> Result<Write<'_>>;
}

impl HostMemory for HostArena {
    fn read(&self, region: Region) -> Result<Read<'_>> {
        HostArena::read(self, region)
    }
    fn write(&self, region: Region) -> Result<Write<'_>> {
        HostArena::write(self, region)
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
        Region::f32(offset, len)
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

    /// Words made elsewhere (as the CUDA backend's pinned ones are) lent as an arena's own.
    struct Borrowed(Box<[UnsafeCell<f32>]>);

    impl Words for Borrowed {
        fn cells(&self) -> &[UnsafeCell<f32>] {
            &self.0
        }
    }

    #[test]
    fn an_arena_over_words_made_elsewhere_lends_and_addresses_them() {
        let words: Vec<UnsafeCell<f32>> = (0..6).map(|k| UnsafeCell::new(k as f32)).collect();
        let arena = HostArena::over(Box::new(Borrowed(words.into_boxed_slice())));
        assert_eq!(&*arena.read(region(2, 3)).unwrap(), &[2., 3., 4.]);
        let w = arena.write(region(3, 2)).unwrap();
        assert!(arena.read(region(4, 1)).is_err());
        drop(w);
        let first = arena.address(region(0, 6)).unwrap();
        let third = arena.address(region(2, 1)).unwrap();
        assert_eq!(third as usize - first as usize, 8, "two words on");
        assert!(arena.address(region(5, 2)).is_err(), "past the end");
        assert!(arena.address(region(6, 0)).is_ok(), "empty, at the end");
    }

    #[test]
    fn a_region_past_the_end_is_an_error() {
        let arena = HostArena::zeroed(4).unwrap();
        assert!(arena.read(region(2, 3)).is_err());
        assert!(arena.write(region(5, 0)).is_err());
        assert!(arena.read(region(4, 0)).is_ok());
        assert!(arena.read(region(1, usize::MAX)).is_err());
    }

    fn bf16_region(offset: usize, len: usize) -> Region {
        Region {
            offset,
            len,
            format: FloatFormat::Bf16,
        }
    }

    /// bf16 keeps 8 significant bits: between 1 and 2 its neighbours are 2^-7 apart.
    #[test]
    fn a_bf16_region_written_as_f32_rounds_to_nearest_ties_to_even() {
        let arena = HostArena::zeroed(2).unwrap();
        let ulp = 2f32.powi(-7);
        let written = [
            1.0 + ulp / 2.0,                  // a tie: to 1 (even)
            1.0 + 1.5 * ulp,                  // a tie: to 1 + 2 ulp (even)
            1.0 + ulp / 2.0 + 2f32.powi(-20), // past the tie: up
            -3.0 - 2.0 * ulp,                 // exact: between 2 and 4, neighbours are 2 ulp apart
        ];
        arena
            .write(bf16_region(0, 4))
            .unwrap()
            .copy_from_slice(&written);
        let read = arena.read(bf16_region(0, 4)).unwrap();
        assert_eq!(&*read, &[1.0, 1.0 + 2.0 * ulp, 1.0 + ulp, -3.0 - 2.0 * ulp]);
        let bits = arena.lend::<bf16>(bf16_region(0, 4)).unwrap();
        assert_eq!(bits[0].to_bits(), 0x3f80, "1.0's upper half");
    }

    #[test]
    fn bf16_elements_share_words_and_keep_their_format() {
        let arena = HostArena::zeroed(4).unwrap();
        // Elements 0..3 take words 0 and 1; a region from word 1 overlaps the second.
        let w = arena.write(bf16_region(0, 3)).unwrap();
        assert!(arena.read(bf16_region(1, 2)).is_err());
        assert!(arena.read(region(1, 1)).is_err());
        arena.read(bf16_region(2, 4)).unwrap();
        drop(w);
        let err = arena
            .lend::<f32>(bf16_region(0, 2))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("bf16 elements lent as fp32"), "{err}");
        assert!(
            arena.read(bf16_region(2, 5)).is_err(),
            "5 bf16 elements need 3 words"
        );
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
