//! The CPU backend's two arenas (DESIGN §6.12): the device arena, and after its words the host
//! arena that an offloading plan's host state lives in. A region's word offset says which: below
//! the device arena's size the device's, from it on the host's (shifted to the host arena's own
//! words). Each arena lends its own regions ([`HostArena`]); a region across the boundary is
//! refused, as one past either arena's end is.

use super::Region;
use super::host_arena::{HostArena, Lent, LentMut, Read, Stored, Write};
use crate::Result;

/// The device and the host arena, addressed as one range of words.
#[derive(Default)]
pub(crate) struct Arenas {
    device: HostArena,
    /// The device arena's words: where the host arena's begin.
    device_words: usize,
    host: HostArena,
}

impl Arenas {
    /// `device_words` and `host_words` of zeros.
    pub(crate) fn zeroed(device_words: usize, host_words: usize) -> Result<Arenas> {
        Ok(Arenas {
            device: HostArena::zeroed(device_words)?,
            device_words,
            host: HostArena::zeroed(host_words)?,
        })
    }

    /// The arena `region` lies in, and the region in that arena's words.
    fn of(&self, region: Region) -> (&HostArena, Region) {
        match region.offset.checked_sub(self.device_words) {
            Some(offset) => (&self.host, Region { offset, ..region }),
            None => (&self.device, region),
        }
    }

    pub(crate) fn lend<T: Stored>(&self, region: Region) -> Result<Lent<'_, T>> {
        let (arena, region) = self.of(region);
        arena.lend(region)
    }

    pub(crate) fn lend_mut<T: Stored>(&self, region: Region) -> Result<LentMut<'_, T>> {
        let (arena, region) = self.of(region);
        arena.lend_mut(region)
    }

    pub(crate) fn read(&self, region: Region) -> Result<Read<'_>> {
        let (arena, region) = self.of(region);
        arena.read(region)
    }

    pub(crate) fn write(&self, region: Region) -> Result<Write<'_>> {
        let (arena, region) = self.of(region);
        arena.write(region)
    }

    pub(crate) fn store(&self, region: Region, values: &[f32]) -> Result<()> {
        let (arena, region) = self.of(region);
        arena.store(region, values)
    }
}
