//! Finding the CUDA libraries: `SHARDPLAN_NCCL_LIB`, a `libnccl.so.2` found only as a file (as the
//! nvidia-nccl wheel ships it), the error that names what is missing and where it looked, and
//! the folder of links that makes such files loadable under cudarc's names.

use shardplan_runtime::cuda::libraries::{
    Found, NCCL_LIB_VAR, Needed, SearchPaths, find, link_folder, loader_path,
};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An empty shared library at `dir/name`.
fn fake_library(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = Command::new("c++")
        .args(["-shared", "-fPIC", "-x", "c++", "/dev/null", "-o"])
        .arg(&path)
        .output()
        .expect("a C++ compiler (c++) is installed: HiGHS needs one too");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// Whether this machine's loader already finds NCCL under cudarc's names (then a search is never
/// needed and the file-based cases cannot be exercised).
fn system_has_nccl() -> bool {
    matches!(
        find(Needed::Nccl, &SearchPaths::default()),
        Ok(Found::Loadable(_))
    )
}

/// Why a test that needs the loader not to find NCCL cannot run here.
const NCCL_FOUND_BY_THE_LOADER: &str = "this machine's loader finds NCCL itself, so a search is never needed: scripts/test skips this test here";

#[test]
fn the_override_variable_names_the_library_and_gets_a_link_under_cudarcs_name() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_library(dir.path(), "libnccl.so.2");
    let search = SearchPaths {
        folders: vec![],
        nccl_override: Some(lib.clone()),
    };
    assert_eq!(
        find(Needed::Nccl, &search).unwrap(),
        Found::File {
            path: lib,
            alias: "libnccl.so".into()
        }
    );
    let missing = dir.path().join("nope/libnccl.so.2");
    let search = SearchPaths {
        folders: vec![],
        nccl_override: Some(missing.clone()),
    };
    let err = find(Needed::Nccl, &search).unwrap_err().to_string();
    assert!(
        err.contains(NCCL_LIB_VAR) && err.contains(&missing.display().to_string()),
        "{err}"
    );
}

#[test]
#[ignore = "needs a machine whose loader does not find NCCL itself; scripts/test runs it where that holds"]
fn a_wheel_style_libnccl_so_2_in_a_searched_folder_is_found() {
    assert!(!system_has_nccl(), "{NCCL_FOUND_BY_THE_LOADER}");
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_library(dir.path(), "libnccl.so.2");
    let search = SearchPaths {
        folders: vec![dir.path().join("absent"), dir.path().to_path_buf()],
        nccl_override: None,
    };
    assert_eq!(
        find(Needed::Nccl, &search).unwrap(),
        Found::File {
            path: lib,
            alias: "libnccl.so".into()
        }
    );
}

#[test]
#[ignore = "needs a machine whose loader does not find NCCL itself; scripts/test runs it where that holds"]
fn a_missing_library_is_named_with_every_name_and_folder_tried() {
    assert!(!system_has_nccl(), "{NCCL_FOUND_BY_THE_LOADER}");
    let dir = tempfile::tempdir().unwrap();
    fake_library(dir.path(), "libcublas.so.13");
    let search = SearchPaths {
        folders: vec![dir.path().to_path_buf()],
        nccl_override: None,
    };
    let err = find(Needed::Nccl, &search).unwrap_err().to_string();
    for part in ["NCCL", "libnccl.so", "libnccl.so.1", NCCL_LIB_VAR] {
        assert!(err.contains(part), "`{part}` missing from: {err}");
    }
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn the_link_folder_makes_the_file_loadable_under_the_alias() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_library(dir.path(), "libnccl.so.2");
    let alias = "libnccl.so".to_string();
    let folder = link_folder(&[(&lib, &alias)]).unwrap();
    let link = folder.join(&alias);
    assert_eq!(std::fs::read_link(&link).unwrap(), lib);
    // SAFETY: an empty library built above.
    unsafe { libloading::Library::new(&link) }.unwrap();
    assert_eq!(
        link_folder(&[(&lib, &alias)]).unwrap(),
        folder,
        "the same links, the same folder"
    );
}

/// The re-executed process finds a linked library's companions (NVRTC opens
/// `libnvrtc-builtins.so.*` by bare name from the wheel's folder), and an empty
/// `LD_LIBRARY_PATH` entry, which the loader reads as the working directory, is dropped.
#[test]
fn the_loader_path_holds_the_links_then_each_library_folder_then_the_old_path() {
    let links = PathBuf::from("/tmp/links");
    let nvrtc = PathBuf::from("/venv/nvidia/cu13/lib/libnvrtc.so.13");
    let nccl = PathBuf::from("/venv/nvidia/nccl/lib/libnccl.so.2");
    let old = std::ffi::OsString::from("/opt/a::/venv/nvidia/cu13/lib");
    let path = loader_path(&links, &[&nvrtc, &nccl], Some(&old));
    assert_eq!(
        path,
        [
            "/tmp/links",
            "/venv/nvidia/cu13/lib",
            "/venv/nvidia/nccl/lib",
            "/opt/a"
        ]
        .map(PathBuf::from)
    );
}
