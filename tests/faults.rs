//! Faults end runs cleanly and lose nothing (DESIGN §6.8), on the CPU at N = 2 under mpirun: a
//! failed job's JSON is one document; a killed rank, or a stopped one (the watchdog; also at N = 4
//! under a hierarchical plan), ends the job with its cause named and no process left; a killed run resumes from its checkpoint bit for
//! bit, past a torn one; memory the host lacks is refused before anything is allocated.

mod common;

use common::{MlpJob, four_ranks_on_two_nodes, run_plan, two_ranks};
use shardplan_runtime::backend::{COMMUNICATION_THREAD, COMPUTE_THREAD};
use shardplan_scheduler::baselines::BaselineKind;
use std::process::Command;
use std::time::{Duration, Instant};

/// Under mpirun, `--json`'s failure is one JSON document on stdout (rank 0's), however many
/// ranks fail: here all three, refused for a plan of two.
#[test]
fn a_failed_jobs_json_is_one_document_from_rank_0() {
    let dir = tempfile::tempdir().unwrap();
    let MlpJob {
        model,
        profile_path,
        plan,
        ..
    } = two_ranks(dir.path(), BaselineKind::Zero2);
    let out = run_plan(3, &profile_path, &plan, &model, 2, &["--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let error: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}"));
    assert_eq!(error["kind"], "mismatch", "{error}");
    let message = error["error"].as_str().unwrap();
    assert!(
        message.contains("the plan is for 2 ranks, this run has 3"),
        "{message}"
    );
}

#[test]
fn a_killed_rank_ends_every_rank_with_an_error_within_30_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Fsdp1);
    let mut child = endless_run(&setup, "10");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let ranks = rank_processes(child.id());
    let victim = &ranks.first().expect("mpirun has rank processes").1;
    let killed_at = std::time::Instant::now();
    assert!(send(victim, libc::SIGKILL));
    let (status, stderr) = ended_within(&mut child, killed_at, 30, None, "a rank killed");
    assert!(!status.success(), "the job must fail when a rank dies");
    assert!(!stderr.trim().is_empty(), "a message says what happened");
}

/// A run whose buffers exceed this rank's share of the host's available memory (given by
/// `SHARDPLAN_HOST_MEMORY_AVAILABLE`) is refused before it allocates or runs a step, with both
/// figures named; with the memory there it runs.
#[test]
fn memory_the_host_lacks_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Zero3);
    let run = |available: &str| {
        setup
            .mpirun(
                &["-x", "SHARDPLAN_HOST_MEMORY_AVAILABLE"],
                &["--steps", "2", "--json"],
            )
            .env("SHARDPLAN_HOST_MEMORY_AVAILABLE", available)
            .output()
            .unwrap()
    };
    let refused = run("4000");
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    let error: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(error["kind"], "memory", "{error}");
    let message = error["error"].as_str().unwrap();
    for part in [
        "needs",
        "on each rank",
        "3.91 KiB available (SHARDPLAN_HOST_MEMORY_AVAILABLE) for its 2 ranks: 1.95 KiB each",
        "make the batch smaller",
    ] {
        assert!(message.contains(part), "`{part}` missing: {message}");
    }
    let ran = run("1000000000000");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

/// A two-rank run checkpointing every 20 steps is killed (SIGKILL of a rank) between two
/// checkpoints; resumed to 15 steps past its newest one, it ends with the losses (of the steps
/// it ran) and the weights of an uninterrupted run to that step, bit for bit. With that newest
/// checkpoint torn (a rank file truncated), the resume refuses it, saying why, and continues from
/// the one before, again bit for bit.
#[test]
fn a_killed_run_resumes_from_its_checkpoint_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Zero3);
    let checkpoints = dir.path().join("checkpoints");
    let run = |extra: &[&str]| {
        let out = setup
            .mpirun(&[], &[&["--json"], extra].concat())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let every = [
        "--steps",
        "1000000",
        "--checkpoint-every",
        "20",
        "--checkpoint-dir",
    ];
    let mut child = setup
        .mpirun(
            &[],
            &[&every[..], &[checkpoints.to_str().unwrap()]].concat(),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let complete = |step: usize| checkpoints.join(format!("step-{step:010}/complete"));
    let started = std::time::Instant::now();
    while !complete(40).exists() {
        assert!(
            started.elapsed().as_secs() < 60,
            "no second checkpoint in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ranks = rank_processes(child.id());
    send(&rank_of(&ranks, 1), libc::SIGKILL);
    assert!(!child.wait().unwrap().success());
    let mut kept: Vec<usize> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix("step-")?.parse().ok()
        })
        .filter(|&step| complete(step).exists())
        .collect();
    kept.sort();
    let newest = *kept.last().unwrap();
    assert!(
        kept.len() == 2 && newest >= 40,
        "the last two are kept: {kept:?}"
    );
    let total = newest + 15;
    let steps = total.to_string();
    let params = |name: &str| dir.path().join(name);
    let whole = run(&[
        "--steps",
        &steps,
        "--dump-params",
        params("whole.json").to_str().unwrap(),
    ]);
    let check = |resumed: &serde_json::Value, from: usize, dumped: &str| {
        assert_eq!(resumed["first_step"], from, "{resumed}");
        assert_eq!(
            resumed["losses"].as_array().unwrap()[..],
            whole["losses"].as_array().unwrap()[from..],
            "the resumed steps' losses"
        );
        assert_eq!(
            std::fs::read(params(dumped)).unwrap(),
            std::fs::read(params("whole.json")).unwrap(),
            "the trained weights"
        );
    };
    let resume = |dumped: &str| {
        run(&[
            "--steps",
            &steps,
            "--resume",
            checkpoints.to_str().unwrap(),
            "--dump-params",
            params(dumped).to_str().unwrap(),
        ])
    };
    check(&resume("resumed.json"), newest, "resumed.json");
    let torn = checkpoints.join(format!("step-{newest:010}/rank-1"));
    let bytes = std::fs::read(&torn).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() - 100]).unwrap();
    let resumed = resume("resumed-earlier.json");
    let refused = resumed["refused_checkpoints"].to_string();
    assert!(refused.contains("truncated or torn"), "{refused}");
    check(&resumed, kept[0], "resumed-earlier.json");
}

/// A rank stopped (SIGSTOP: a hung process, a stuck driver call, a paused node) mid-run with
/// `--timeout 5`: the other rank's watchdog finds its collective overdue, names the slot, the
/// collective and the peer it waits for, and ends the job (MPI_Abort) within the timeout + 10 s;
/// no process is left behind. Rank 1 is stopped inside compute, rank 0 inside a collective: where
/// the stopped rank's threads were is read from the kernel after the stop, and a stop that caught
/// them elsewhere is undone (SIGCONT) and tried again.
#[test]
fn a_stopped_rank_ends_the_job_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let setup = two_ranks(dir.path(), BaselineKind::Fsdp1);
    for (victim, inside) in [(1usize, Inside::Compute), (0, Inside::Collective)] {
        let mut child = endless_run(&setup, "5");
        std::thread::sleep(Duration::from_secs(1));
        let ranks = rank_processes(child.id());
        assert_eq!(ranks.len(), 2, "mpirun's ranks: {ranks:?}");
        let stopped = rank_of(&ranks, victim);
        let stopped_at = stop_inside(&stopped, inside);
        let case = format!("rank {victim} stopped inside {inside:?}");
        let (status, stderr) = ended_within(&mut child, stopped_at, 15, Some(&stopped), &case);
        let took = stopped_at.elapsed().as_secs_f64();
        assert!(!status.success(), "{case}: {stderr}");
        assert_names_the_stall(&case, &stderr);
        let peer = format!("rank {victim} (stopped");
        assert!(stderr.contains(&peer), "{case}: the peer named: {stderr}");
        assert!(took < 15.0, "{case}: {took} s");
        eprintln!("{case}: the job ended {took:.1} s after the stop");
        let left = ranks.iter().filter(|pid| alive(pid)).count();
        assert_eq!(left, 0, "{case}: processes left behind");
    }
}

/// A rank of a hierarchical plan stopped mid-run (hsdp on 4 ranks as 2 nodes of 2: shard and
/// replica communicators, a communication thread per link): a peer's watchdog ends the job within
/// the timeout + 10 s, naming the collective it waits in and the peers it waits for; no process is
/// left behind.
#[test]
fn a_stopped_rank_ends_a_hierarchical_job_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let job = four_ranks_on_two_nodes(dir.path(), BaselineKind::Hsdp);
    let mut child = endless_run(&job, "5");
    std::thread::sleep(Duration::from_secs(2));
    let ranks = rank_processes(child.id());
    assert_eq!(ranks.len(), 4, "mpirun's ranks: {ranks:?}");
    let stopped = rank_of(&ranks, 3);
    assert!(send(&stopped, libc::SIGSTOP), "rank 3 could not be stopped");
    let stopped_at = Instant::now();
    let case = "rank 3 of a hierarchical job stopped";
    let (status, stderr) = ended_within(&mut child, stopped_at, 15, Some(&stopped), case);
    assert!(!status.success(), "{stderr}");
    assert_names_the_stall(case, &stderr);
    let left = ranks.iter().filter(|pid| alive(pid)).count();
    assert_eq!(left, 0, "processes left behind");
}

/// The watchdog's report of a stall with the 5 s timeout: the global slot, the bound and the
/// peers it waits for.
fn assert_names_the_stall(case: &str, stderr: &str) {
    for part in [
        "global slot",
        "did not complete within 5.0 s",
        "waiting for its peers, rank",
    ] {
        assert!(stderr.contains(part), "{case}: `{part}` missing: {stderr}");
    }
}

/// `job`'s run of a million steps with `--timeout <timeout>` seconds, its stderr piped.
fn endless_run(job: &MlpJob, timeout: &str) -> std::process::Child {
    job.mpirun(&[], &["--steps", "1000000", "--timeout", timeout])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// How the job `child` ended, and its stderr, within `limit` seconds of `since`; past the limit
/// the `stopped` rank (if any) and the job are killed and the test fails, naming `case`.
fn ended_within(
    child: &mut std::process::Child,
    since: Instant,
    limit: u64,
    stopped: Option<&str>,
    case: &str,
) -> (std::process::ExitStatus, String) {
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if since.elapsed().as_secs() >= limit {
            stopped.map(|pid| send(pid, libc::SIGKILL));
            let _ = child.kill();
            panic!("{case}: the job still runs {limit} s later");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

/// Where a rank is stopped.
#[derive(Debug, Clone, Copy)]
enum Inside {
    /// Its compute thread computing, its communication thread waiting for its next collective.
    Compute,
    /// Its communication thread inside a collective (in MPI, or pausing between its tests).
    Collective,
}

/// The x86-64 and aarch64 numbers of futex (a thread waiting for an event) and of nanosleep and
/// clock_nanosleep (a collective's wait pausing between tests).
const FUTEX: &[&str] = if cfg!(target_arch = "aarch64") {
    &["98"]
} else {
    &["202"]
};
const SLEEPS: &[&str] = if cfg!(target_arch = "aarch64") {
    &["101", "115"]
} else {
    &["35", "230"]
};

impl Inside {
    /// Whether the threads' first `/proc/<pid>/task/<tid>/syscall` words show this place: "running",
    /// "-1" (stopped outside any system call: in user code) or the system call's number.
    fn holds(self, compute: &str, communication: &str) -> bool {
        let waiting = FUTEX.contains(&communication);
        match self {
            Inside::Compute => ["running", "-1"].contains(&compute) && waiting,
            Inside::Collective => {
                ["running", "-1"].contains(&communication) || SLEEPS.contains(&communication)
            }
        }
    }
}

/// Stops process `pid` (SIGSTOP) where its threads are `inside`, read once it has stopped; a
/// stop elsewhere is undone (SIGCONT, well within the run's timeout) and tried again, for at most
/// 20 s. Returns when the stop that held happened.
fn stop_inside(pid: &str, inside: Inside) -> Instant {
    let began = Instant::now();
    let mut tries = 0;
    while began.elapsed() < Duration::from_secs(20) {
        let (compute, communication) = threads(pid);
        if !inside.holds(&compute, &communication) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        tries += 1;
        send(pid, libc::SIGSTOP);
        let stopped_at = Instant::now();
        while !is_stopped(pid) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (compute, communication) = threads(pid);
        if inside.holds(&compute, &communication) {
            return stopped_at;
        }
        send(pid, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("rank {pid} was not caught inside {inside:?} in 20 s ({tries} stops tried)");
}

/// Sends `signal` to `pid` at once (kill(2): no `kill` process started between reading where a
/// rank is and stopping it).
/// Whether the signal was sent.
fn send(pid: &str, signal: i32) -> bool {
    // SAFETY: kill has no memory preconditions; `pid` is one of the job's rank processes.
    unsafe { libc::kill(pid.parse().unwrap(), signal) == 0 }
}

/// The first word of `/proc/<pid>/task/<tid>/syscall` for the rank's compute and communication
/// threads (named by the runtime).
fn threads(pid: &str) -> (String, String) {
    let (mut compute, mut communication) = (String::new(), String::new());
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let syscall = std::fs::read_to_string(task.join("syscall")).unwrap_or_default();
        let first = syscall.split_whitespace().next().unwrap_or("").to_string();
        match name.trim() {
            COMPUTE_THREAD => compute = first,
            COMMUNICATION_THREAD => communication = first,
            _ => {}
        }
    }
    (compute, communication)
}

/// Whether every thread of `pid` has stopped (state T).
fn is_stopped(pid: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .all(|task| {
            let stat =
                std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap_or_default();
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
}

/// The rank processes mpirun `mpirun` started, in rank order (OMPI_COMM_WORLD_RANK).
fn rank_processes(mpirun: u32) -> Vec<(usize, String)> {
    let children = Command::new("pgrep")
        .args(["-P", &mpirun.to_string()])
        .output()
        .unwrap();
    let mut ranks: Vec<(usize, String)> = String::from_utf8(children.stdout)
        .unwrap()
        .split_whitespace()
        .filter_map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let rank = environ
                .split(|&b| b == 0)
                .find_map(|v| v.strip_prefix(b"OMPI_COMM_WORLD_RANK="))?;
            Some((
                std::str::from_utf8(rank).ok()?.parse().ok()?,
                pid.to_string(),
            ))
        })
        .collect();
    ranks.sort();
    ranks
}

fn rank_of(ranks: &[(usize, String)], rank: usize) -> String {
    ranks.iter().find(|(r, _)| *r == rank).unwrap().1.clone()
}

/// Whether process `pid` still runs (a zombie of mpirun's counts as gone).
fn alive(pid: &(usize, String)) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.1))
        .is_ok_and(|stat| !stat.contains(") Z "))
}
