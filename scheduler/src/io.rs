//! File helpers: read with the path in the error, TOML parsing with a one-line located message,
//! and atomic writes (temp file in the same directory, then rename) so no reader ever sees a
//! half-written output.

use crate::{Error, Result};
use serde::de::DeserializeOwned;
use std::io::Write;
use std::path::Path;

/// Reads a whole UTF-8 file.
pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses TOML text into `T`; `origin` names the input in errors (a path, or `<bundled x>`).
/// The message is one line: `origin:LINE:COL: what is wrong`.
pub fn parse_toml<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| {
        let location = e
            .span()
            .map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(":{line}:{col}")
            })
            .unwrap_or_default();
        Error::Parse {
            origin: format!("{origin}{location}"),
            message: e.message().trim().replace('\n', " "),
        }
    })
}

/// Reads and parses a TOML file.
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T> {
    parse_toml(&read_text(path)?, &path.display().to_string())
}

/// Writes `bytes` to `path` atomically: a temporary sibling file is written, flushed and renamed
/// over `path`. On failure the temporary file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let err = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| err(std::io::Error::other("not a file path")))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_errors_carry_line_and_column() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            a: u32,
        }
        let err = parse_toml::<T>("\na = \"x\"\n", "f.toml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("f.toml:2:5:"), "{msg}");
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn atomic_write_into_missing_dir_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope/out.txt");
        let msg = write_atomic(&path, b"x").unwrap_err().to_string();
        assert!(msg.contains("nope/out.txt: cannot write"), "{msg}");
    }
}
