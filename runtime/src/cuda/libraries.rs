//! Finding the CUDA libraries before any CUDA call.
//!
//! cudarc loads each library on its first use by `dlopen` of bare names (`libnccl.so`,
//! `libnccl.so.13`, …) and panics when none loads. This module checks all four first, says which
//! is missing and where it looked, and handles libraries that exist under a name cudarc does not
//! try — above all `libnccl.so.2`, the only name the `nvidia-nccl` wheels ship — or in a folder
//! the loader does not search (the wheels' `site-packages/nvidia/*/lib`). Such a library gets a
//! symbolic link under the name cudarc tries, in a private folder; since the loader reads
//! `LD_LIBRARY_PATH` only when a process starts, the process then re-executes itself once with
//! that folder in front of `LD_LIBRARY_PATH`.
//!
//! Order per library: an explicit path (`SHARDPLAN_NCCL_LIB` for NCCL), the loader's own search
//! under cudarc's names, then the folders of [`SearchPaths`] for any file `lib<name>.so*`.

use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// The environment variable naming the NCCL library file.
pub const NCCL_LIB_VAR: &str = "SHARDPLAN_NCCL_LIB";
/// Set in the re-executed process: the folder of links it was given.
const ALIASES_VAR: &str = "SHARDPLAN_CUDA_LIB_ALIASES";

/// One library the CUDA backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed {
    Driver,
    Cublas,
    Nvrtc,
    Nccl,
}

impl Needed {
    pub const ALL: [Needed; 4] = [Needed::Driver, Needed::Cublas, Needed::Nvrtc, Needed::Nccl];

    /// cudarc's name for it (`lib<stem>.so…`).
    fn stem(self) -> &'static str {
        match self {
            Needed::Driver => "cuda",
            Needed::Cublas => "cublas",
            Needed::Nvrtc => "nvrtc",
            Needed::Nccl => "nccl",
        }
    }

    /// The library's name for a person (`libcuda`, …).
    pub fn library(self) -> String {
        format!("lib{}", self.stem())
    }

    pub fn describe(self) -> &'static str {
        match self {
            Needed::Driver => "the CUDA driver (libcuda; install the NVIDIA driver)",
            Needed::Cublas => "cuBLAS (libcublas; the CUDA toolkit or the nvidia-cublas wheel)",
            Needed::Nvrtc => "NVRTC (libnvrtc; the CUDA toolkit or the nvidia-cuda-nvrtc wheel)",
            Needed::Nccl => "NCCL (libnccl; the nvidia-nccl wheel or a system package)",
        }
    }

    /// The bare names cudarc tries, in its order (without repeats).
    pub fn names(self) -> Vec<String> {
        let mut names = cudarc::get_lib_name_candidates(self.stem());
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        names
    }
}

/// Where a library was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The loader finds it under one of cudarc's names.
    Loadable(String),
    /// Found as a file: cudarc needs a link under `alias` pointing to it.
    File { path: PathBuf, alias: String },
}

impl Found {
    /// Where the library is, for a person: its file, or the name the loader resolves (in a
    /// re-executed process, through the link folder, whose link target is then shown).
    pub fn location(&self) -> String {
        match self {
            Found::File { path, .. } => path.display().to_string(),
            Found::Loadable(name) => std::env::var_os(ALIASES_VAR)
                .and_then(|folder| std::fs::read_link(Path::new(&folder).join(name)).ok())
                .map(|target| target.display().to_string())
                .unwrap_or_else(|| format!("{name} (through the loader's search path)")),
        }
    }
}

/// The folders searched for library files, in order.
#[derive(Debug, Clone, Default)]
pub struct SearchPaths {
    pub folders: Vec<PathBuf>,
    /// `SHARDPLAN_NCCL_LIB`, if set.
    pub nccl_override: Option<PathBuf>,
}

impl SearchPaths {
    /// `LD_LIBRARY_PATH`, `CUDA_HOME`/`CUDA_PATH`, the usual driver and toolkit folders, and the
    /// `nvidia/*/lib` folders of Python environments (the active one, the system's, `/opt/*`).
    pub fn from_environment() -> Self {
        let mut folders: Vec<PathBuf> = Vec::new();
        if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
            folders.extend(std::env::split_paths(&paths));
        }
        for var in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(root) = std::env::var_os(var) {
                folders.push(Path::new(&root).join("lib64"));
                folders.push(Path::new(&root).join("lib"));
            }
        }
        folders.extend(
            [
                "/usr/local/nvidia/lib64",
                "/usr/local/nvidia/lib",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/local/cuda/lib64",
                "/usr/lib/wsl/lib",
            ]
            .map(PathBuf::from),
        );
        let mut environments: Vec<PathBuf> = Vec::new();
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
            environments.push(venv.into());
        }
        environments.extend(["/usr/local", "/usr"].map(PathBuf::from));
        environments.extend(subfolders(Path::new("/opt")).map(|d| d.join(".venv")));
        for env in environments {
            for lib in subfolders(&env.join("lib")).filter(|d| file_name_starts(d, "python3")) {
                for packages in ["site-packages", "dist-packages"] {
                    let nvidia = lib.join(packages).join("nvidia");
                    for package in subfolders(&nvidia) {
                        folders.push(package.join("lib"));
                    }
                }
            }
        }
        SearchPaths {
            folders,
            nccl_override: std::env::var_os(NCCL_LIB_VAR).map(PathBuf::from),
        }
    }
}

fn subfolders(dir: &Path) -> impl Iterator<Item = PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter()
}

fn file_name_starts(path: &Path, prefix: &str) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(prefix))
}

/// Whether the loader can open `name_or_path` (and its dependencies).
fn loads(name_or_path: &std::ffi::OsStr) -> std::result::Result<(), String> {
    // SAFETY: loading runs the library's initialisers; these are the vendor's CUDA libraries (or
    // what the user named as one), which cudarc would load anyway.
    unsafe { libloading::Library::new(name_or_path) }
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A library found as a file, by its absolute path (a link to a relative path would resolve from
/// the link folder, not from where it was found).
fn found_file(path: &Path, alias: String) -> Found {
    Found::File {
        path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        alias,
    }
}

/// Finds one library, or says where it looked.
pub fn find(needed: Needed, search: &SearchPaths) -> Result<Found> {
    let names = needed.names();
    let alias = names[0].clone();
    if needed == Needed::Nccl
        && let Some(path) = &search.nccl_override
    {
        return match loads(path.as_os_str()) {
            Ok(()) => Ok(found_file(path, alias)),
            Err(e) => Err(Error::Backend(format!(
                "{NCCL_LIB_VAR}={}: cannot load it as NCCL: {e}",
                path.display()
            ))),
        };
    }
    if let Some(name) = names.iter().find(|n| loads(n.as_ref()).is_ok()) {
        return Ok(Found::Loadable(name.clone()));
    }
    let prefix = format!("lib{}.so", needed.stem());
    for folder in &search.folders {
        if folder.components().any(|c| c.as_os_str() == "stubs") {
            continue;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| file_name_starts(p, &prefix))
            .collect();
        files.sort();
        if let Some(path) = files.into_iter().find(|p| loads(p.as_os_str()).is_ok()) {
            return Ok(found_file(&path, alias));
        }
    }
    let folders: Vec<String> = search
        .folders
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    let hint = if needed == Needed::Nccl {
        format!("; set {NCCL_LIB_VAR} to the library file (e.g. …/nvidia/nccl/lib/libnccl.so.2)")
    } else {
        String::new()
    };
    Err(Error::Backend(format!(
        "the CUDA backend needs {}: no library loads under the names [{}] and no {prefix}* is in [{}]{hint}",
        needed.describe(),
        names.join(", "),
        folders.join(", ")
    )))
}

/// Makes every library loadable by cudarc, or fails naming the first one missing
/// ([`prepare_for`] all four).
pub fn prepare() -> Result<()> {
    prepare_for(&Needed::ALL)
}

/// Makes the `needed` libraries loadable by cudarc, or fails naming the first one missing. When
/// some are only files, links them in a private folder and re-executes this process (once, with
/// the same arguments) with it in `LD_LIBRARY_PATH`; call before MPI or any thread starts.
pub fn prepare_for(needed: &[Needed]) -> Result<()> {
    let search = SearchPaths::from_environment();
    let found = needed
        .iter()
        .map(|&n| find(n, &search))
        .collect::<Result<Vec<Found>>>()?;
    let links: Vec<(&PathBuf, &String)> = found
        .iter()
        .filter_map(|f| match f {
            Found::File { path, alias } => Some((path, alias)),
            Found::Loadable(_) => None,
        })
        .collect();
    if links.is_empty() {
        return Ok(());
    }
    if let Some(folder) = std::env::var_os(ALIASES_VAR) {
        let named: Vec<String> = links
            .iter()
            .map(|(path, alias)| format!("{alias} → {}", path.display()))
            .collect();
        return Err(Error::Backend(format!(
            "these libraries, linked in {}, still do not load under cudarc's names: {}",
            Path::new(&folder).display(),
            named.join(", ")
        )));
    }
    let folder = link_folder(&links)?;
    let files: Vec<&PathBuf> = links.iter().map(|(path, _)| *path).collect();
    let paths = loader_path(
        &folder,
        &files,
        std::env::var_os("LD_LIBRARY_PATH").as_deref(),
    );
    let joined = std::env::join_paths(paths)
        .map_err(|e| Error::Backend(format!("cannot extend LD_LIBRARY_PATH: {e}")))?;
    let exe = std::env::current_exe()
        .map_err(|e| Error::Backend(format!("cannot find this program to re-execute it: {e}")))?;
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", joined)
        .env(ALIASES_VAR, &folder)
        .exec();
    Err(Error::Backend(format!(
        "cannot re-execute with the CUDA libraries in {}: {err}",
        folder.display()
    )))
}

/// The re-executed process's `LD_LIBRARY_PATH`: the link folder, then each linked file's own
/// folder (a library there opens its companions by bare name: NVRTC its `libnvrtc-builtins`,
/// cuBLAS its `libcublasLt`), then the old path. Empty entries are dropped: the loader would read
/// one as the working directory.
pub fn loader_path(
    link_folder: &Path,
    files: &[&PathBuf],
    old: Option<&std::ffi::OsStr>,
) -> Vec<PathBuf> {
    let mut paths = vec![link_folder.to_path_buf()];
    paths.extend(
        files
            .iter()
            .filter_map(|f| f.parent())
            .map(Path::to_path_buf),
    );
    paths.extend(old.into_iter().flat_map(std::env::split_paths));
    let mut seen = std::collections::HashSet::new();
    paths.retain(|p| !p.as_os_str().is_empty() && seen.insert(p.clone()));
    paths
}

/// A folder (named by what it links, so every rank and run shares it) of links `alias → path`.
/// Each link is made under a temporary name and renamed, so concurrent ranks never see a partial
/// one.
pub fn link_folder(links: &[(&PathBuf, &String)]) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    links.hash(&mut hasher);
    let folder = std::env::temp_dir().join(format!("shardplan-cuda-libs-{:016x}", hasher.finish()));
    let fail = |what: &str, e: std::io::Error| {
        Error::Backend(format!("cannot {what} in {}: {e}", folder.display()))
    };
    std::fs::create_dir_all(&folder).map_err(|e| fail("create the library folder", e))?;
    for (path, alias) in links {
        let target = folder.join(alias);
        let temporary = folder.join(format!(".{alias}.{}", std::process::id()));
        let _ = std::fs::remove_file(&temporary);
        std::os::unix::fs::symlink(path, &temporary).map_err(|e| fail("link a library", e))?;
        std::fs::rename(&temporary, &target).map_err(|e| fail("link a library", e))?;
    }
    Ok(folder)
}
