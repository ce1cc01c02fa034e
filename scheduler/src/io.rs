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
/// The message is one line: `origin:LINE:COL: field `units[3].params`: what is wrong`; a missing
/// field is that field (`units[3].params`: missing), not the table that lacks it.
pub fn parse_toml<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T> {
    let error = |e: &toml::de::Error, field: Option<String>, message: String| Error::Parse {
        origin: origin.to_string(),
        location: e
            .span()
            .map(|span| line_col(text, span.start))
            .unwrap_or_default(),
        field,
        message,
    };
    let message = |e: &toml::de::Error| e.message().trim().replace('\n', " ");
    let deserializer = toml::Deserializer::parse(text).map_err(|e| error(&e, None, message(&e)))?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let table = Some(e.path().to_string()).filter(|path| path != ".");
        let text = message(e.inner());
        match missing_field(&text) {
            Some(name) => {
                let field = table.map_or_else(|| name.to_string(), |t| format!("{t}.{name}"));
                error(e.inner(), Some(field), "missing".into())
            }
            None => error(e.inner(), table, text),
        }
    })
}

/// The field serde's "missing field `name`" message names, if that is the message.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.strip_suffix('`')
}

/// `:LINE:COL` (1-based) of a byte offset in `text`.
fn line_col(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!(":{line}:{col}")
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

/// The file a path names once links and `..` are resolved; for a path that does not exist yet,
/// its resolved directory joined with its file name.
fn resolved(path: &Path) -> Option<std::path::PathBuf> {
    if let Ok(real) = path.canonicalize() {
        return Some(real);
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(dir.canonicalize().ok()?.join(path.file_name()?))
}

/// Refuses, before anything is read, an output that is (or resolves to) one of the inputs or
/// another output: `outputs` and `inputs` are `(flag, path)` pairs. Nothing is overwritten by
/// mistake.
pub fn check_outputs_distinct(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<()> {
    for (k, &(out_flag, out)) in outputs.iter().enumerate() {
        let Some(target) = resolved(out) else {
            continue;
        };
        let others = inputs
            .iter()
            .map(|&(flag, p)| (flag, p, "input"))
            .chain(outputs[..k].iter().map(|&(flag, p)| (flag, p, "output")));
        for (flag, path, role) in others {
            if resolved(path).as_ref() == Some(&target) {
                return Err(Error::invalid(
                    out.display().to_string(),
                    out_flag,
                    format!(
                        "a path other than the {role} {flag} `{}` (it would be overwritten), got the same file",
                        path.display()
                    ),
                ));
            }
        }
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
    fn a_missing_field_is_named_with_its_table() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Unit {
            name: String,
            params: u64,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            schema: u32,
            units: Vec<Unit>,
        }
        let field = |text: &str| {
            let err = parse_toml::<T>(text, "f.toml").unwrap_err();
            (err.field().map(str::to_string), err.to_string())
        };
        let (root, message) = field("");
        assert_eq!(root.as_deref(), Some("schema"), "{message}");
        assert!(message.ends_with("field `schema`: missing"), "{message}");
        let (nested, message) = field("schema = 1\n[[units]]\nname = \"a\"\n");
        assert_eq!(nested.as_deref(), Some("units[0].params"), "{message}");
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
    fn outputs_that_resolve_to_an_input_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("p.toml");
        std::fs::write(&input, "x").unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let same = sub.join("../p.toml");
        let msg = check_outputs_distinct(&[("--out", &same)], &[("--profile", &input)])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("field `--out`") && msg.contains("input --profile"),
            "{msg}"
        );
        #[cfg(unix)]
        {
            let link = dir.path().join("link.toml");
            std::os::unix::fs::symlink(&input, &link).unwrap();
            assert!(check_outputs_distinct(&[("--out", &link)], &[("--profile", &input)]).is_err());
        }
        let fresh = dir.path().join("new.toml");
        check_outputs_distinct(&[("--out", &fresh)], &[("--profile", &input)]).unwrap();
        let twice = check_outputs_distinct(&[("--trace", &fresh), ("--out", &fresh)], &[])
            .unwrap_err()
            .to_string();
        assert!(twice.contains("output --trace"), "{twice}");
    }

    #[test]
    fn atomic_write_into_missing_dir_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope/out.txt");
        let msg = write_atomic(&path, b"x").unwrap_err().to_string();
        assert!(msg.contains("nope/out.txt: cannot write"), "{msg}");
    }
}
