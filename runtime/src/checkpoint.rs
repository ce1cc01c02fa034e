//! Checkpoints of a run, so that a restarted job loses at most `--checkpoint-every` steps: after
//! every N steps (the pipeline drained: every reduction and optimizer step of those steps done)
//! each rank writes the state it keeps from step to step — each unit's parameters and Adam
//! moments, as its layout holds them (a shard, or the whole unit when replicated) — with the
//! step count, into `DIR/step-<S>/rank-<r>`; rank 0 then marks the checkpoint complete
//! (`DIR/step-<S>/complete`) once every rank has written, and keeps the last two. Every file is
//! written to a temporary name and renamed, so a crash mid-write never leaves a torn one under
//! a final name.
//!
//! `--resume DIR` loads the newest complete checkpoint every rank can read: a torn or foreign
//! file (truncated, another plan, another rank count) is refused with its reason, and the one
//! before is used. The data a step trains on is a function of the step's index, so a resumed
//! run computes the steps the uninterrupted one would, bit for bit on the CPU.

use crate::backend::{Backend, Region};
use crate::layout::Layout;
use crate::{Error, Result};
use sha2::{Digest, Sha256};
use shardplan_scheduler::io::write_atomic;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

/// The first line of every rank file.
const MAGIC: &str = "shardplan-checkpoint 1";
/// Complete checkpoints kept.
const KEPT: usize = 2;

/// `--checkpoint-every N --checkpoint-dir DIR`.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    pub every: NonZeroUsize,
    pub dir: PathBuf,
}

/// Whose state a checkpoint holds: a resumed run must be the same plan on as many ranks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    /// [`plan_digest`] of the plan.
    pub plan: String,
    pub world_size: usize,
    pub rank: usize,
}

impl std::fmt::Display for Identity {
    /// "rank R of N running plan sha256:…", as a checkpoint's refusal names its writer.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} of {} running plan {}",
            self.rank, self.world_size, self.plan
        )
    }
}

/// sha256 of the plan as its file writes it (levels, recompute, launches, prediction): another
/// plan lays its state out otherwise.
pub fn plan_digest(plan: &shardplan_scheduler::plan::Plan) -> String {
    format!("sha256:{}", hex(&Sha256::digest(plan.to_toml().as_bytes())))
}

/// A rank file's header (a JSON line after [`MAGIC`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Header {
    identity: Identity,
    /// Steps done.
    step: usize,
    /// Elements of each region, in [`kept_regions`] order.
    lengths: Vec<usize>,
    /// sha256 of the data, hex.
    sha256: String,
}

impl Header {
    /// The header of a rank file whose first two lines are `magic` and `json` (without their
    /// newlines), or why they are not one (`at` names the file).
    fn parse(
        magic: &[u8],
        json: Option<&[u8]>,
        at: &impl std::fmt::Display,
    ) -> Result<Header, String> {
        if magic != MAGIC.as_bytes() {
            return Err(format!(
                "{at}: not a shardplan checkpoint (no `{MAGIC}` line)"
            ));
        }
        json.and_then(|line| serde_json::from_slice(line).ok())
            .ok_or_else(|| format!("{at}: its header is torn or not JSON"))
    }

    /// Whether `data` bytes are the data the header describes, or why not.
    fn check_length(&self, data: usize, at: &impl std::fmt::Display) -> Result<(), String> {
        let expected = 4 * self.lengths.iter().sum::<usize>();
        if data == expected {
            Ok(())
        } else {
            Err(format!(
                "{at}: truncated or torn: {data} bytes of data, {expected} expected"
            ))
        }
    }
}

/// What a run resumed from, and the newer checkpoints it could not use (with why).
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    pub step: usize,
    pub from: Option<PathBuf>,
    pub refused: Vec<String>,
}

/// The regions each unit keeps from step to step: parameters, the fp32 master where there is
/// one, Adam's m and v.
fn kept_regions(layout: &Layout) -> Vec<Region> {
    layout
        .units
        .iter()
        .flat_map(|u| [Some(u.params), u.master, Some(u.adam_m), Some(u.adam_v)])
        .flatten()
        .collect()
}

fn step_dir(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("step-{step:010}"))
}

fn rank_file(dir: &Path, step: usize, rank: usize) -> PathBuf {
    step_dir(dir, step).join(format!("rank-{rank}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes this rank's kept state after `step` steps; rank 0 marks the checkpoint complete once
/// every rank has written (a collective: every rank calls it) and removes all but the last
/// [`KEPT`] complete ones.
pub fn save<B: Backend>(
    backend: &B,
    layout: &Layout,
    dir: &Path,
    step: usize,
    identity: &Identity,
) -> Result<()> {
    let regions = kept_regions(layout);
    let mut data = Vec::new();
    for r in &regions {
        let mut values = vec![0.0f32; r.len];
        backend.download(*r, &mut values)?;
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    let header = Header {
        identity: identity.clone(),
        step,
        lengths: regions.iter().map(|r| r.len).collect(),
        sha256: hex(&Sha256::digest(&data)),
    };
    let mut bytes = format!(
        "{MAGIC}\n{}\n",
        serde_json::to_string(&header).expect("a header serialises")
    )
    .into_bytes();
    bytes.extend(data);
    let at = step_dir(dir, step);
    std::fs::create_dir_all(&at).map_err(|e| {
        Error::Mismatch(format!(
            "{}: cannot create the checkpoint: {e}",
            at.display()
        ))
    })?;
    write_atomic(&rank_file(dir, step, identity.rank), &bytes)?;
    let mut written = [1.0f32];
    backend.all_reduce_host(&mut written)?;
    if identity.rank == 0 {
        if written[0] as usize != identity.world_size {
            return Err(Error::Backend(format!(
                "{}: {} of {} ranks wrote their checkpoint",
                at.display(),
                written[0],
                identity.world_size
            )));
        }
        write_atomic(&at.join("complete"), format!("{step}\n").as_bytes())?;
        for old in complete_steps(dir).into_iter().skip(KEPT) {
            let _ = std::fs::remove_dir_all(step_dir(dir, old));
        }
    }
    Ok(())
}

/// The complete checkpoints under `dir`, newest first.
fn complete_steps(dir: &Path) -> Vec<usize> {
    let mut steps: Vec<usize> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("step-")?.parse().ok()?;
            e.path().join("complete").is_file().then_some(step)
        })
        .collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    steps
}

/// This rank's file of checkpoint `step`, checked whole against `identity` and `layout`: its
/// regions' values, or why it cannot be used.
fn read_rank_file(
    dir: &Path,
    step: usize,
    identity: &Identity,
    layout: &Layout,
) -> std::result::Result<Vec<f32>, String> {
    let path = rank_file(dir, step, identity.rank);
    let at = path.display();
    let bytes = std::fs::read(&path).map_err(|e| format!("{at}: cannot read: {e}"))?;
    let mut lines = bytes.splitn(3, |&b| b == b'\n');
    let header = Header::parse(lines.next().unwrap_or_default(), lines.next(), &at)?;
    let data = lines.next().unwrap_or_default();
    if header.identity != *identity {
        return Err(format!(
            "{at}: written by {}, not {identity}",
            header.identity
        ));
    }
    let lengths: Vec<usize> = kept_regions(layout).iter().map(|r| r.len).collect();
    if header.lengths != lengths || header.step != step {
        return Err(format!(
            "{at}: holds other regions than this layout's (or another step)"
        ));
    }
    header.check_length(data.len(), &at)?;
    if hex(&Sha256::digest(data)) != header.sha256 {
        return Err(format!("{at}: its data does not match its checksum"));
    }
    Ok(data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// What is wrong with another rank's file of checkpoint `step`: its header, its length or its
/// checksum (read in passing, not held: this runs only once a checkpoint was found unusable).
fn others_problem(dir: &Path, step: usize, identity: &Identity) -> Option<String> {
    (0..identity.world_size)
        .filter(|&r| r != identity.rank)
        .find_map(|rank| {
            let peer = Identity {
                rank,
                ..identity.clone()
            };
            peer_file_problem(&rank_file(dir, step, rank), step, &peer)
        })
}

/// Why the rank file at `path` is not `identity`'s file of checkpoint `step` that verifies (its
/// magic, header, length and checksum), if it is not.
fn peer_file_problem(path: &Path, step: usize, identity: &Identity) -> Option<String> {
    use std::io::BufRead;
    let at = path.display();
    let Ok(file) = std::fs::File::open(path) else {
        return Some(format!("{at}: missing"));
    };
    let mut reader = std::io::BufReader::new(file);
    let (mut magic, mut json) = (Vec::new(), Vec::new());
    let unreadable = |e: std::io::Error| Some(format!("{at}: cannot read: {e}"));
    if let Err(e) = reader
        .read_until(b'\n', &mut magic)
        .and_then(|_| reader.read_until(b'\n', &mut json))
    {
        return unreadable(e);
    }
    let line = |l: &[u8]| l.strip_suffix(b"\n").unwrap_or(l).to_vec();
    let header = match Header::parse(&line(&magic), Some(&line(&json)), &at) {
        Ok(header) => header,
        Err(why) => return Some(why),
    };
    if header.identity != *identity || header.step != step {
        return Some(format!(
            "{at}: written after step {} by {}, not after step {step} by {identity}",
            header.step, header.identity
        ));
    }
    let mut digest = Sha256::new();
    let mut data = 0;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) => return unreadable(e),
        };
        if chunk.is_empty() {
            break;
        }
        digest.update(chunk);
        let read = chunk.len();
        data += read;
        reader.consume(read);
    }
    if let Err(why) = header.check_length(data, &at) {
        return Some(why);
    }
    (hex(&digest.finalize()) != header.sha256)
        .then(|| format!("{at}: its data does not match its checksum"))
}

/// Loads the newest checkpoint under `dir` that every rank can read into the kept regions of
/// `layout` (a collective: every rank calls it) and returns the step it was taken after. A
/// directory without a usable checkpoint is refused, naming why each was refused.
pub fn resume<B: Backend>(
    backend: &B,
    layout: &Layout,
    dir: &Path,
    identity: &Identity,
) -> Result<Resumed> {
    if let Err(e) = std::fs::read_dir(dir) {
        let source = if e.kind() == std::io::ErrorKind::NotFound {
            std::io::Error::new(e.kind(), "the --resume folder is missing")
        } else {
            e
        };
        return Err(shardplan_scheduler::Error::Read {
            path: dir.to_path_buf(),
            source,
        }
        .into());
    }
    let mut refused = Vec::new();
    for step in complete_steps(dir) {
        let values = read_rank_file(dir, step, identity, layout);
        let mut usable = [if values.is_ok() { 1.0f32 } else { 0.0 }];
        backend.all_reduce_host(&mut usable)?;
        match values {
            Ok(values) if usable[0] as usize == identity.world_size => {
                let mut rest = values.as_slice();
                for r in kept_regions(layout) {
                    let (these, more) = rest.split_at(r.len);
                    backend.upload(r, these)?;
                    rest = more;
                }
                return Ok(Resumed {
                    step,
                    from: Some(step_dir(dir, step)),
                    refused,
                });
            }
            Ok(_) => refused.push(others_problem(dir, step, identity).unwrap_or_else(|| {
                format!(
                    "{}: another rank could not use its file (each verifies here)",
                    step_dir(dir, step).display()
                )
            })),
            Err(why) => refused.push(why),
        }
    }
    Err(Error::Mismatch(format!(
        "{}: no complete checkpoint to resume from{}",
        dir.display(),
        if refused.is_empty() {
            String::new()
        } else {
            format!(" ({})", refused.join("; "))
        }
    )))
}
