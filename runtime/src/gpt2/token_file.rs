//! Pre-tokenized training data as nanoGPT and llm.c write it, memory-mapped (a file of billions
//! of tokens is paged in as read, never held whole):
//!
//! - **llm.c**: a header of 256 little-endian int32 — `[0]` = 20240520 (the magic), `[1]` = the
//!   version (1: uint16 tokens, GPT-2; 2: uint32 tokens, Llama 3), `[2]` = the token count — then
//!   the tokens, little-endian;
//! - **raw uint16** (nanoGPT's `train.bin`, numpy's `tofile`): the tokens alone, little-endian.
//!
//! A file is llm.c's when its header holds the magic, a known version and a count that matches
//! its length; otherwise a `.bin` file is raw uint16. A file whose header has llm.c's shape (a
//! version of 1 or 2 and a count that matches its length) but not its magic is refused as an
//! llm.c file whose header does not verify, not read as raw uint16. Every token is checked
//! against the model's vocabulary once, when the file is opened.

use crate::{Error, Result};
use std::path::Path;

/// llm.c's header: 256 int32, the first its magic.
const LLMC_HEADER_BYTES: usize = 256 * 4;
const LLMC_MAGIC: i32 = 20_240_520;

/// How wide a token is in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    U16,
    U32,
}

impl Width {
    fn bytes(self) -> usize {
        match self {
            Width::U16 => 2,
            Width::U32 => 4,
        }
    }
}

/// Which writer's layout a token file has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// llm.c's header, then tokens of `width`.
    Llmc { width: Width },
    /// uint16 tokens alone (nanoGPT).
    RawU16,
}

/// A memory-mapped file of token ids, each below the model's vocabulary.
#[derive(Debug)]
pub struct TokenFile {
    map: memmap2::Mmap,
    /// Bytes before the first token.
    offset: usize,
    width: Width,
    count: usize,
    layout: Layout,
}

impl TokenFile {
    /// Whether `path` is read as tokens (llm.c's magic, or a `.bin` name) rather than text.
    pub fn is_token_file(path: &Path, first_bytes: &[u8]) -> bool {
        first_bytes.get(..4).map(i32_at) == Some(LLMC_MAGIC)
            || path.extension().is_some_and(|e| e == "bin")
    }

    /// Maps `path`; its layout is llm.c's when the header says so, raw uint16 otherwise. Fails,
    /// naming the file, on a torn or odd-sized file, on fewer than `seq + 1` tokens, and on the
    /// first token at or above `vocab` (with its position).
    pub fn open(path: &Path, seq: usize, vocab: usize) -> Result<TokenFile> {
        let origin = path.display();
        let failed = |what: String| Error::Mismatch(format!("{origin}: {what}"));
        let file = std::fs::File::open(path)
            .map_err(|e| failed(format!("cannot read the token file: {e}")))?;
        // SAFETY: the map is read-only and private to this process; the file is training data
        // that nothing writes while a run reads it (a file truncated under a run would fault,
        // as it would for any reader of a mapped file).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| failed(format!("cannot map the token file: {e}")))?;
        let (layout, offset, count) = layout_of(&map).map_err(|refusal| match refusal {
            Refusal::Header { field, expected } => Error::from(
                shardplan_scheduler::Error::invalid(origin.to_string(), field, expected),
            ),
            Refusal::Other(what) => failed(what),
        })?;
        let width = match layout {
            Layout::Llmc { width } => width,
            Layout::RawU16 => Width::U16,
        };
        if count < seq + 1 {
            return Err(failed(format!(
                "{count} tokens, but one sequence of {seq} tokens and its targets need {}",
                seq + 1
            )));
        }
        let tokens = TokenFile {
            map,
            offset,
            width,
            count,
            layout,
        };
        if let Some((position, token)) = tokens.first_outside(vocab) {
            return Err(failed(format!(
                "token {token} at position {position} (byte {}) is not below the model's vocab {vocab}",
                offset + position * width.bytes()
            )));
        }
        Ok(tokens)
    }

    /// The first token at or above `vocab`, with its position. The file is scanned once in
    /// chunks, each chunk's pages given back after it (`MADV_DONTNEED`), so the check does not
    /// leave the file resident in this process.
    fn first_outside(&self, vocab: usize) -> Option<(usize, u32)> {
        const CHUNK_TOKENS: usize = 1 << 22;
        let _ = self.map.advise(memmap2::Advice::Sequential);
        (0..self.count).step_by(CHUNK_TOKENS).find_map(|start| {
            let end = (start + CHUNK_TOKENS).min(self.count);
            let found = (start..end)
                .map(|i| (i, self.token(i)))
                .find(|&(_, t)| t as usize >= vocab);
            let width = self.width.bytes();
            // SAFETY: the map is read-only and file-backed: pages dropped here are read again
            // from the file, unchanged, when next touched. The range lies inside the map.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.offset + start * width,
                    (end - start) * width,
                )
            };
            found
        })
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Token `i` (below [`Self::count`]).
    pub fn token(&self, i: usize) -> u32 {
        let at = self.offset + i * self.width.bytes();
        match self.width {
            Width::U16 => u32::from(u16::from_le_bytes([self.map[at], self.map[at + 1]])),
            Width::U32 => u32::from_le_bytes(self.map[at..at + 4].try_into().expect("4 bytes")),
        }
    }
}

fn i32_at(bytes: &[u8]) -> i32 {
    i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"))
}

/// Why a token file cannot be read.
#[derive(Debug)]
enum Refusal {
    /// A field of an llm.c header (`header.magic`, `header.version`) holds a value it cannot.
    Header {
        field: &'static str,
        expected: String,
    },
    /// Anything else (its length, a torn body).
    Other(String),
}

/// The token width of llm.c header version `version`, if it is one llm.c writes.
fn llmc_width(version: i32) -> Option<Width> {
    match version {
        1 => Some(Width::U16),
        2 => Some(Width::U32),
        _ => None,
    }
}

/// The layout of `bytes`, the offset of its first token and the token count; or what is wrong.
fn layout_of(bytes: &[u8]) -> std::result::Result<(Layout, usize, usize), Refusal> {
    let header = (bytes.len() >= LLMC_HEADER_BYTES).then(|| {
        let field = |k: usize| i32_at(&bytes[4 * k..]);
        (field(0), field(1), field(2))
    });
    let body = bytes.len().saturating_sub(LLMC_HEADER_BYTES);
    let counts_the_body =
        |count: i32, width: Width| count >= 0 && body == count as usize * width.bytes();
    if let Some((LLMC_MAGIC, version, count)) = header {
        let width = llmc_width(version).ok_or_else(|| Refusal::Header {
            field: "header.version",
            expected: format!(
                "1 (uint16 tokens) or 2 (uint32) in an llm.c header, got llm.c header version {version}"
            ),
        })?;
        if !counts_the_body(count, width) {
            return Err(Refusal::Other(format!(
                "llm.c header says {count} tokens of {} bytes, but {body} bytes follow it (a torn file?)",
                width.bytes()
            )));
        }
        return Ok((Layout::Llmc { width }, LLMC_HEADER_BYTES, count as usize));
    }
    if let Some((magic, version, count)) = header
        && llmc_width(version).is_some_and(|width| counts_the_body(count, width))
    {
        return Err(Refusal::Header {
            field: "header.magic",
            expected: format!(
                "llm.c's {LLMC_MAGIC}, got {magic}: the file starts with an llm.c header \
                 (version {version}, {count} tokens, as many as follow it) that does not verify"
            ),
        });
    }
    if !bytes.len().is_multiple_of(2) {
        return Err(Refusal::Other(format!(
            "{} bytes: a raw uint16 token file has an even length (or give llm.c's header)",
            bytes.len()
        )));
    }
    Ok((Layout::RawU16, 0, bytes.len() / 2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn llmc(version: i32, count: i32, tokens: &[u8]) -> Vec<u8> {
        let mut header = vec![0i32; 256];
        header[..3].copy_from_slice(&[LLMC_MAGIC, version, count]);
        let mut bytes: Vec<u8> = header.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.extend_from_slice(tokens);
        bytes
    }

    fn u16s(tokens: &[u16]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    fn write(name: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        (dir, path)
    }

    #[test]
    fn both_layouts_read_the_same_tokens() {
        let tokens = [50_256u16, 0, 1, 65_535, 7];
        let (_d1, raw) = write("train.bin", &u16s(&tokens));
        let (_d2, with_header) = write("train.bin", &llmc(1, 5, &u16s(&tokens)));
        for (path, layout) in [
            (raw, Layout::RawU16),
            (with_header, Layout::Llmc { width: Width::U16 }),
        ] {
            let file = TokenFile::open(&path, 2, 65_536).unwrap();
            assert_eq!(file.layout(), layout);
            let read: Vec<u32> = (0..file.count()).map(|i| file.token(i)).collect();
            assert_eq!(read, tokens.map(u32::from));
        }
    }

    #[test]
    fn llmc_version_2_holds_uint32_tokens() {
        let tokens: Vec<u8> = [128_000u32, 3]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        let (_d, path) = write("llama.bin", &llmc(2, 2, &tokens));
        let file = TokenFile::open(&path, 1, 128_256).unwrap();
        assert_eq!((file.token(0), file.token(1)), (128_000, 3));
    }

    #[test]
    fn a_token_past_the_vocab_is_named_with_its_position() {
        let (_d, path) = write("train.bin", &u16s(&[1, 2, 300, 4]));
        let e = TokenFile::open(&path, 1, 256).unwrap_err().to_string();
        assert!(
            e.contains("train.bin") && e.contains("token 300 at position 2 (byte 4)"),
            "{e}"
        );
        assert!(e.contains("vocab 256"), "{e}");
    }

    #[test]
    fn torn_odd_and_short_files_are_refused() {
        let (_d1, torn) = write("a.bin", &llmc(1, 10, &u16s(&[1, 2, 3])));
        let e = TokenFile::open(&torn, 1, 256).unwrap_err().to_string();
        assert!(
            e.contains("10 tokens of 2 bytes, but 6 bytes follow"),
            "{e}"
        );
        let (_d2, odd) = write("b.bin", &[1, 0, 2]);
        let e = TokenFile::open(&odd, 1, 256).unwrap_err().to_string();
        assert!(
            e.contains("3 bytes: a raw uint16 token file has an even length"),
            "{e}"
        );
        let (_d3, short) = write("c.bin", &u16s(&[1, 2]));
        let e = TokenFile::open(&short, 2, 256).unwrap_err().to_string();
        assert!(e.contains("2 tokens, but one sequence of 2 tokens"), "{e}");
        let (_d4, version) = write("d.bin", &llmc(3, 0, &[]));
        let e = TokenFile::open(&version, 1, 256).unwrap_err().to_string();
        assert!(e.contains("llm.c header version 3"), "{e}");
    }

    #[test]
    fn an_llmc_header_with_another_magic_is_refused_as_a_header_that_does_not_verify() {
        // Tokens of 55,433 read as raw uint16 would be past a vocab of 256: the header is named
        // instead, with the field, the magic found and the one expected.
        let mut bytes = llmc(1, 3, &u16s(&[55_433, 1, 2]));
        bytes[..4].copy_from_slice(&20_240_521i32.to_le_bytes());
        let (_d, path) = write("train.bin", &bytes);
        let e = TokenFile::open(&path, 1, 256).unwrap_err();
        match &e {
            Error::Scheduler(shardplan_scheduler::Error::Invalid { origin, field, .. }) => {
                assert_eq!(
                    (origin.as_str(), field.as_str()),
                    (path.to_str().unwrap(), "header.magic")
                );
            }
            other => panic!("not a field's error: {other:?}"),
        }
        let e = e.to_string();
        assert!(
            e.contains("expected llm.c's 20240520, got 20240521")
                && e.contains("version 1, 3 tokens"),
            "{e}"
        );
        assert!(!e.contains("vocab"), "{e}");
        // The same header over a body it does not count is no llm.c header: raw uint16.
        let mut raw = bytes.clone();
        raw.extend_from_slice(&u16s(&[7]));
        let (_d2, path) = write("raw.bin", &raw);
        assert_eq!(
            TokenFile::open(&path, 1, 1 << 30).unwrap().layout(),
            Layout::RawU16
        );
    }

    #[test]
    fn the_magic_or_a_bin_name_makes_a_token_file() {
        let magic = LLMC_MAGIC.to_le_bytes();
        assert!(TokenFile::is_token_file(Path::new("x.txt"), &magic));
        assert!(TokenFile::is_token_file(Path::new("train.bin"), b"hello"));
        assert!(!TokenFile::is_token_file(Path::new("data.txt"), b"hello"));
        assert!(!TokenFile::is_token_file(Path::new("data.txt"), b""));
    }
}
