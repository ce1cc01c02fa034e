//! The CUDA backend's host arena (DESIGN §6.12): an offloading plan's host state in one
//! page-locked allocation, addressed after the device arena's words as on the CPU backend
//! ([`host_part`]), lent to the host's kernels through a [`HostArena`] (the same per-range borrow
//! checks), and the asynchronous copies between it and the device arena.

use super::driver_error;
use super::storage::pack_bf16;
use crate::backend::{FloatFormat, HostArena, HostMemory, Read, Region, Words, Write, host_part};
use crate::lock::recover;
use crate::{Error, Result};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, PinnedHostSlice};
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Page-locked words, zeroed.
struct PinnedWords {
    /// Owns the allocation (`cuMemFreeHost` when dropped).
    _memory: PinnedHostSlice<f32>,
    first: *const UnsafeCell<f32>,
    len: usize,
}

// SAFETY: `first` points into `_memory`, which owns the allocation and frees it only when this
// is dropped; page-locked host memory may be used from any thread.
unsafe impl Send for PinnedWords {}

impl Words for PinnedWords {
    fn cells(&self) -> &[UnsafeCell<f32>] {
        // SAFETY: `first` is the start of `len` f32 words of `_memory`, zeroed in
        // `PinnedArena::zeroed` before this was made and alive as long as `self`;
        // `UnsafeCell<f32>` has f32's layout.
        unsafe { std::slice::from_raw_parts(self.first, self.len) }
    }
}

/// A copy between the arenas: which way it goes, its device region (in the device arena's
/// words) and its host region (in the host arena's own words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Across {
    ToHost { device: Region, host: Region },
    ToDevice { host: Region, device: Region },
}

impl Across {
    /// The copy of `from` into `to` with the host arena from word `device_words` on: one region
    /// in each arena, of one format and length; anything else is refused, naming why.
    fn of(from: Region, to: Region, device_words: usize) -> Result<Across> {
        if from.len != to.len || from.format != to.format {
            return Err(Error::Backend(format!(
                "a copy between the device and the host arena of {} {} elements into {} {}: a \
                 copy across the arenas keeps the format and length, but for an fp32 host master \
                 rounded into bf16 device parameters of its length (DESIGN §6.12)",
                from.len,
                from.format.name(),
                to.len,
                to.format.name()
            )));
        }
        match (host_part(from, device_words), host_part(to, device_words)) {
            (None, Some(host)) => Ok(Across::ToHost { device: from, host }),
            (Some(host), None) => Ok(Across::ToDevice { host, device: to }),
            _ => Err(Error::Backend(format!(
                "a copy across the arenas from word {} to word {} does not go between the \
                 device arena (words below {device_words}) and the host arena",
                from.offset, to.offset
            ))),
        }
    }
}

/// A page-locked buffer an fp32 master is rounded into on its way to bf16 device parameters,
/// and the event after its last copy (the buffer is rewritten only once that copy is done).
struct RoundedShard {
    words: PinnedHostSlice<f32>,
    copied: Option<CudaEvent>,
}

/// The host arena in page-locked memory, after `device_words` of device arena.
pub(crate) struct PinnedArena {
    ctx: Arc<CudaContext>,
    arena: HostArena,
    device_words: usize,
    /// Per fp32 master copied into bf16 device parameters (by the master's word offset): the host
    /// staging shard of DESIGN §6.12, the p bytes §3.13 charges the host for the cast.
    rounded: Mutex<HashMap<usize, RoundedShard>>,
}

impl PinnedArena {
    /// `host_words` of zeros in page-locked memory (cached, not write-combined: the host's
    /// optimizer step reads it), addressed from word `device_words` on.
    pub(super) fn zeroed(
        ctx: &Arc<CudaContext>,
        device_words: usize,
        host_words: usize,
    ) -> Result<PinnedArena> {
        let mb = (host_words * 4) >> 20;
        let what = format!("allocating the {mb} MiB host arena in page-locked memory");
        // SAFETY: the words are zeroed below, before anything reads them.
        let mut memory = unsafe { ctx.alloc_pinned_with_flags::<f32>(host_words.max(1), 0) }
            .map_err(driver_error(&what))?;
        let first = memory.as_mut_ptr().map_err(driver_error(&what))?;
        // SAFETY: `first` is the start of the `host_words.max(1)` f32 the allocation just made
        // holds; nothing else refers to them yet.
        unsafe { std::ptr::write_bytes(first, 0, host_words.max(1)) };
        let words = PinnedWords {
            _memory: memory,
            first: first.cast(),
            len: host_words,
        };
        Ok(PinnedArena {
            ctx: ctx.clone(),
            arena: HostArena::over(Box::new(words)),
            device_words,
            rounded: Mutex::default(),
        })
    }

    /// `region` in the host arena's words, where it lies there.
    pub(crate) fn host_part(&self, region: Region) -> Option<Region> {
        host_part(region, self.device_words)
    }

    /// `region` in the host arena's words; an error where it is the device arena's.
    fn on_host(&self, region: Region) -> Result<Region> {
        self.host_part(region).ok_or_else(|| {
            Error::Backend(format!(
                "words {}..{} are the device arena's, where the host arena's were asked for \
                 (DESIGN §6.12: the host's step reads only the host arena)",
                region.offset,
                region.offset + region.words()
            ))
        })
    }

    /// Stores `values` in a host region (rounded where it is bf16).
    pub(super) fn store(&self, region: Region, values: &[f32]) -> Result<()> {
        self.arena.store(self.on_host(region)?, values)
    }

    /// Copies `from` into `to`, both host regions, converting between formats.
    pub(super) fn copy(&self, from: Region, to: Region) -> Result<()> {
        let values = self.read(from)?;
        self.store(to, &values)
    }

    /// Enqueues on `stream` the copy of `from` into `to` (one a host region, the other device
    /// memory at the address `device_address` gives for it, checked against the device arena),
    /// regions of one format and length. The host words are neither read nor written by the host until
    /// the caller's marks say the copy is done (DESIGN §6.12 lists which).
    pub(super) fn enqueue_copy(
        &self,
        from: Region,
        to: Region,
        device_address: impl Fn(Region) -> Result<CUdeviceptr>,
        stream: &CudaStream,
    ) -> Result<()> {
        if rounds_to_device(from, to, self.device_words) {
            return self.enqueue_rounded(from, device_address(to)?, stream);
        }
        let across = Across::of(from, to, self.device_words)?;
        let bytes = 4 * from.words();
        let cu_stream = stream.cu_stream();
        stream
            .context()
            .bind_to_thread()
            .map_err(driver_error("binding the context"))?;
        match across {
            Across::ToHost { device, host } => {
                let (from, to) = (device_address(device)?, self.arena.address(host)?);
                // SAFETY: `to` is the start of `host`'s words, checked against the host arena;
                // `from` spans as many bytes of the device arena (checked by `device_address`);
                // the executor's marks keep the host from the words until the copy is done.
                unsafe { sys::cuMemcpyDtoHAsync_v2(to.cast(), from, bytes, cu_stream) }
                    .result()
                    .map_err(driver_error("copying to the host arena"))
            }
            Across::ToDevice { host, device } => {
                let (from, to) = (self.arena.address(host)?, device_address(device)?);
                // SAFETY: as above, the other way.
                unsafe { sys::cuMemcpyHtoDAsync_v2(to, from.cast(), bytes, cu_stream) }
                    .result()
                    .map_err(driver_error("copying from the host arena"))
            }
        }
    }
}

impl PinnedArena {
    /// Enqueues on `stream` the copy of the fp32 host region `from` rounded to bf16 (to nearest,
    /// ties to even, as the CPU backend's copy rounds) into the device memory at `to`, through
    /// the page-locked shard kept for that destination.
    fn enqueue_rounded(&self, from: Region, to: CUdeviceptr, stream: &CudaStream) -> Result<()> {
        let packed = pack_bf16(&self.read(from)?);
        let mut rounded = recover(self.rounded.lock());
        let shard = match rounded.entry(from.offset) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let what = "allocating a page-locked shard to round parameters in";
                // SAFETY: the words are written in full below before the copy reads them.
                let words = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(packed.len(), 0) }
                    .map_err(driver_error(what))?;
                entry.insert(RoundedShard {
                    words,
                    copied: None,
                })
            }
        };
        if let Some(copied) = shard.copied.take() {
            (copied.synchronize()).map_err(driver_error("waiting for a parameter copy"))?;
        }
        let host = (shard.words.as_mut_slice()).map_err(driver_error("page-locked memory"))?;
        let room = host.len();
        let host = host.get_mut(..packed.len()).ok_or_else(|| {
            Error::Backend(format!(
                "{} rounded parameters for a shard of {room} words",
                packed.len()
            ))
        })?;
        host.copy_from_slice(&packed);
        // SAFETY: `host` holds the `packed.len()` words copied; `to` spans as many words of the
        // device arena (checked by the caller); the shard is not written again before the event
        // recorded after the copy has completed.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(to, host.as_ptr().cast(), 4 * host.len(), stream.cu_stream())
        }
        .result()
        .map_err(driver_error("copying rounded parameters to the GPU"))?;
        shard.copied =
            Some((stream.record_event(None)).map_err(driver_error("recording an event"))?);
        Ok(())
    }
}

/// Whether the copy of `from` into `to` is an fp32 host region rounded into a bf16 device
/// region of the same length (`optimizer`'s master into bf16 parameters, DESIGN §6.12).
fn rounds_to_device(from: Region, to: Region, device_words: usize) -> bool {
    from.format == FloatFormat::Fp32
        && to.format == FloatFormat::Bf16
        && from.len == to.len
        && host_part(from, device_words).is_some()
        && host_part(to, device_words).is_none()
}

impl HostMemory for PinnedArena {
    fn read(&self, region: Region) -> Result<Read<'_>> {
        self.arena.read(self.on_host(region)?)
    }
    fn write(&self, region: Region) -> Result<Write<'_>> {
        self.arena.write(self.on_host(region)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FloatFormat;

    const DEVICE: usize = 1000;

    fn bf16(offset: usize, len: usize) -> Region {
        Region {
            offset,
            len,
            format: FloatFormat::Bf16,
        }
    }

    #[test]
    fn a_gradient_goes_to_the_host_and_parameters_to_the_device() {
        let (device, host) = (Region::f32(64, 16), Region::f32(DEVICE + 32, 16));
        assert_eq!(
            Across::of(device, host, DEVICE).unwrap(),
            Across::ToHost {
                device,
                host: Region::f32(32, 16)
            }
        );
        assert_eq!(
            Across::of(host, device, DEVICE).unwrap(),
            Across::ToDevice {
                host: Region::f32(32, 16),
                device
            }
        );
        // bf16 both sides (a `full` unit's staging copy under bf16): the host words shifted.
        assert_eq!(
            Across::of(bf16(DEVICE, 6), bf16(10, 6), DEVICE).unwrap(),
            Across::ToDevice {
                host: bf16(0, 6),
                device: bf16(10, 6)
            }
        );
    }

    #[test]
    fn a_copy_within_one_arena_or_between_formats_is_refused() {
        let within = |from, to| Across::of(from, to, DEVICE).unwrap_err().to_string();
        let device = within(Region::f32(0, 8), Region::f32(8, 8));
        assert!(device.contains("does not go between"), "{device}");
        let host = within(Region::f32(DEVICE, 8), Region::f32(DEVICE + 8, 8));
        assert!(host.contains("does not go between"), "{host}");
        let widened = within(bf16(DEVICE, 8), Region::f32(0, 8));
        assert!(
            widened.contains("bf16") && widened.contains("fp32"),
            "{widened}"
        );
        let shorter = within(Region::f32(DEVICE, 8), Region::f32(0, 4));
        assert!(shorter.contains("8") && shorter.contains("4"), "{shorter}");
    }

    #[test]
    fn only_an_fp32_host_master_into_bf16_device_parameters_is_rounded_on_the_way() {
        let master = Region::f32(DEVICE + 64, 32);
        assert!(rounds_to_device(master, bf16(128, 32), DEVICE));
        assert!(
            !rounds_to_device(master, bf16(128, 30), DEVICE),
            "another length"
        );
        assert!(
            !rounds_to_device(master, Region::f32(128, 32), DEVICE),
            "fp32 both"
        );
        assert!(
            !rounds_to_device(Region::f32(64, 32), bf16(DEVICE, 32), DEVICE),
            "to the host"
        );
        assert!(
            !rounds_to_device(master, bf16(DEVICE, 32), DEVICE),
            "host to host"
        );
    }
}
