//! The CPU backend's two arenas (DESIGN §6.12): the device arena, and after its words the host
//! arena that an offloading plan's host state lives in. A region's word offset says which: below
//! the device arena's size the device's, from it on the host's (shifted to the host arena's own
//! words). Each arena lends its own regions ([`HostArena`]); a region across the boundary is
//! refused, as one past either arena's end is.

use super::Region;
use super::host_arena::{HostArena, Lent, LentMut, Read, Stored, Write};
use crate::Result;

/// `region` in the host arena's own words, where it starts there (at or past `device_words`, the
/// device arena's size); none where it starts in the device arena (whose bounds check refuses
/// one that runs across the boundary). Both backends that offload address the arenas so.
pub(crate) fn host_part(region: Region, device_words: usize) -> Option<Region> {
    let offset = region.offset.checked_sub(device_words)?;
    Some(Region { offset, ..region })
}

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
        match host_part(region, self.device_words) {
            Some(region) => (&self.host, region),
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

impl super::host_arena::HostMemory for Arenas {
    fn read(&self, region: Region) -> Result<Read<'_>> {
        Arenas::read(self, region)
    }
    fn write(&self, region: Region) -> Result<Write<'_>> {
        Arenas::write(self, region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FloatFormat;

    #[test]
    fn a_region_is_the_hosts_from_the_device_arenas_last_word_on() {
        assert_eq!(host_part(Region::f32(99, 1), 100), None);
        assert_eq!(host_part(Region::f32(100, 3), 100), Some(Region::f32(0, 3)));
        let bf16 = Region {
            offset: 130,
            len: 5,
            format: FloatFormat::Bf16,
        };
        let shifted = host_part(bf16, 100).unwrap();
        assert_eq!(
            (shifted.offset, shifted.len, shifted.format),
            (30, 5, FloatFormat::Bf16)
        );
    }

    #[test]
    fn a_region_across_the_boundary_is_refused_by_the_device_arena() {
        let arenas = Arenas::zeroed(4, 4).unwrap();
        assert!(
            arenas.read(Region::f32(2, 4)).is_err(),
            "words 2..6 span both"
        );
        arenas.store(Region::f32(5, 2), &[1.0, 2.0]).unwrap();
        assert_eq!(
            &*arenas.read(Region::f32(4, 4)).unwrap(),
            &[0.0, 1.0, 2.0, 0.0]
        );
        assert_eq!(&*arenas.read(Region::f32(0, 4)).unwrap(), &[0.0; 4]);
    }
}
