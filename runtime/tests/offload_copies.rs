//! The copies and host steps an offloading plan asks of a backend (DESIGN §6.12), recorded on the
//! CPU backend: what the CUDA backend turns into its copy stream's work and the host thread's
//! event synchronisation. The walk is one for both backends, so this is the CUDA backend's
//! schedule for the same plan: every gradient copy to the host and every staging copy waits for a
//! communication-stream mark taken when it was issued; every host step first waits on the host
//! for the mark of the copy that brought its gradient; every parameter copy of an `optimizer`
//! unit follows its host step and waits for no stream (the copy stream's order and the host
//! thread order it).

mod common;

use common::{gpt2_tiny, gpt2_tiny_profile, run_options, uncapped_plan};
use shardplan_runtime::Result;
use shardplan_runtime::backend::{
    Allocation, Backend, CpuBackend, DeviceMemory, Group, Loopback, Region, Stream,
};
use shardplan_runtime::gpt2::kernels::AdamW;
use shardplan_runtime::gpt2::{AdamRegions, BlockBackward, Gpt2Kernels, Head, HeadGrads, Shape};
use shardplan_scheduler::baselines::{BaselineKind, baseline};
use shardplan_scheduler::offload::{HostStep, Offload};
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::schedule::Recompute;
use shardplan_scheduler::sim::Semantics;
use shardplan_scheduler::timeline::Level;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const STEPS: usize = 3;

/// What the executor asked of the backend, with the host thread that asked.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    /// A mark taken on a stream: its id.
    Mark(Stream, u64),
    /// A copy between the arenas: after which mark, and the mark it returned.
    Across {
        from: Region,
        to: Region,
        after: Option<u64>,
        done: u64,
    },
    /// The host thread waited for this mark.
    WaitOnHost(u64),
    /// An AdamW step on these parameters and gradients.
    Adamw { params: Region, grads: Region },
}

/// The calls, each with the name of the thread that made it.
type Calls = Arc<Mutex<Vec<(String, Call)>>>;

/// The CPU backend, every mark numbered and every call above recorded.
struct Recording {
    inner: CpuBackend<Loopback>,
    next_mark: AtomicU64,
    calls: Calls,
}

impl Recording {
    fn new(calls: Calls) -> Recording {
        Recording {
            inner: CpuBackend::new(Loopback),
            next_mark: AtomicU64::new(0),
            calls,
        }
    }

    fn record(&self, call: Call) {
        let thread = std::thread::current().name().unwrap_or("main").to_string();
        self.calls.lock().unwrap().push((thread, call));
    }

    fn numbered(&self, mark: Instant) -> (u64, Instant) {
        (self.next_mark.fetch_add(1, Ordering::Relaxed), mark)
    }
}

impl Backend for Recording {
    type Mark = (u64, Instant);

    fn name(&self) -> &'static str {
        "recording cpu"
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn allocate(&mut self, sizes: Allocation) -> Result<()> {
        self.inner.allocate(sizes)
    }
    fn device_memory(&self) -> Result<Option<DeviceMemory>> {
        self.inner.device_memory()
    }
    fn upload(&self, region: Region, data: &[f32]) -> Result<()> {
        self.inner.upload(region, data)
    }
    fn download(&self, region: Region, out: &mut [f32]) -> Result<()> {
        self.inner.download(region, out)
    }
    fn losses(&self, steps: usize) -> Result<Vec<f32>> {
        self.inner.losses(steps)
    }
    fn zero(&self, region: Region) -> Result<()> {
        self.inner.zero(region)
    }
    fn copy(&self, from: Region, to: Region) -> Result<()> {
        self.inner.copy(from, to)
    }
    fn open_groups(&mut self, groups: &[Group]) -> Result<()> {
        self.inner.open_groups(groups)
    }
    fn all_gather(&self, group: Group, shard: Region, full: Region) -> Result<()> {
        self.inner.all_gather(group, shard, full)
    }
    fn reduce_scatter(&self, group: Group, full: Region, shard: Region) -> Result<()> {
        self.inner.reduce_scatter(group, full, shard)
    }
    fn all_reduce(&self, group: Group, data: Region) -> Result<()> {
        self.inner.all_reduce(group, data)
    }
    fn all_reduce_host(&self, data: &mut [f32]) -> Result<()> {
        self.inner.all_reduce_host(data)
    }
    fn mark(&self, stream: Stream) -> Result<Self::Mark> {
        let mark = self.numbered(self.inner.mark(stream)?);
        self.record(Call::Mark(stream, mark.0));
        Ok(mark)
    }
    fn wait_mark(&self, stream: Stream, mark: &Self::Mark) -> Result<()> {
        self.inner.wait_mark(stream, &mark.1)
    }
    fn elapsed_us(&self, from: &Self::Mark, to: &Self::Mark) -> Result<f64> {
        self.inner.elapsed_us(&from.1, &to.1)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn host_computes(&self) -> bool {
        self.inner.host_computes()
    }
    fn offloads(&self) -> bool {
        self.inner.offloads()
    }
    fn copy_across(
        &self,
        from: Region,
        to: Region,
        after: Option<&Self::Mark>,
    ) -> Result<Self::Mark> {
        let done = self.numbered(self.inner.copy_across(from, to, after.map(|m| &m.1))?);
        let after = after.map(|m| m.0);
        let done_id = done.0;
        self.record(Call::Across {
            from,
            to,
            after,
            done: done_id,
        });
        Ok(done)
    }
    fn wait_on_host(&self, mark: &Self::Mark) -> Result<()> {
        self.record(Call::WaitOnHost(mark.0));
        self.inner.wait_on_host(&mark.1)
    }
}

impl Gpt2Kernels for Recording {
    fn embedding_forward(
        &self,
        shape: &Shape,
        params: Region,
        tokens: Region,
        out: Region,
    ) -> Result<()> {
        self.inner.embedding_forward(shape, params, tokens, out)
    }
    fn embedding_backward(
        &self,
        shape: &Shape,
        tokens: Region,
        grad_out: Region,
        grads: Region,
    ) -> Result<()> {
        self.inner
            .embedding_backward(shape, tokens, grad_out, grads)
    }
    fn block_forward(
        &self,
        shape: &Shape,
        params: Region,
        x: Region,
        out: Region,
        internals: Region,
    ) -> Result<()> {
        self.inner.block_forward(shape, params, x, out, internals)
    }
    fn block_backward(&self, shape: &Shape, regions: &BlockBackward) -> Result<()> {
        self.inner.block_backward(shape, regions)
    }
    fn head_forward(&self, shape: &Shape, head: &Head, scale: f32, step: usize) -> Result<()> {
        self.inner.head_forward(shape, head, scale, step)
    }
    fn head_backward(&self, shape: &Shape, head: &Head, out: &HeadGrads, scale: f32) -> Result<()> {
        self.inner.head_backward(shape, head, out, scale)
    }
    fn adamw(
        &self,
        shape: &Shape,
        adam: &AdamRegions,
        step: u32,
        hp: &AdamW,
        decayed: &[Range<usize>],
    ) -> Result<()> {
        self.record(Call::Adamw {
            params: adam.params,
            grads: adam.grads,
        });
        self.inner.adamw(shape, adam, step, hp, decayed)
    }
}

fn with_host(mut profile: Profile) -> Profile {
    profile.host = Some(common::test_host(1, 1));
    profile
}

/// The calls of `STEPS` steps of fsdp2 with its sharded units offloading `full`, `optimizer`
/// and none in turn (`host_step`), and the number of units of each mode.
fn recorded(host_step: HostStep, semantics: Semantics) -> (Vec<(String, Call)>, [usize; 2]) {
    let (g, profile) = (gpt2_tiny(1), with_host(gpt2_tiny_profile(1)));
    let fsdp2 = baseline(&profile, BaselineKind::Fsdp2, Recompute::Off, None)
        .unwrap()
        .schedule;
    let cycle = [Offload::Full, Offload::Optimizer, Offload::None];
    let modes: Vec<Offload> = (fsdp2.units().iter().enumerate())
        .map(|(u, s)| match s.level {
            Level::None => Offload::None,
            _ => cycle[u % 3],
        })
        .collect();
    let counts =
        [Offload::Full, Offload::Optimizer].map(|m| modes.iter().filter(|&&x| x == m).count());
    assert!(
        counts.iter().all(|&n| n > 0),
        "both modes offloaded: {modes:?}"
    );
    let schedule = fsdp2
        .offloaded(&profile, modes, host_step, "test plan")
        .unwrap();
    let plan = uncapped_plan("fsdp2-mixed", &profile, &schedule);
    let calls = Calls::default();
    let prepared = shardplan_runtime::session::Prepared::new(
        Recording::new(calls.clone()),
        &g,
        &profile,
        &plan,
        "p.toml",
        STEPS,
    )
    .unwrap();
    prepared
        .execute(&g, &run_options(0, STEPS, semantics))
        .unwrap();
    drop(prepared);
    let calls = std::mem::take(&mut *calls.lock().unwrap());
    (calls, counts)
}

fn check(host_step: HostStep, semantics: Semantics) {
    let (calls, [full, optimizer]) = recorded(host_step, semantics);
    let comm_marks: Vec<u64> = (calls.iter())
        .filter_map(|(_, c)| match c {
            Call::Mark(Stream::Communication, id) => Some(*id),
            _ => None,
        })
        .collect();
    let across: Vec<(Region, Region, Option<u64>, u64)> = (calls.iter())
        .filter_map(|(_, c)| match c {
            Call::Across {
                from,
                to,
                after,
                done,
            } => Some((*from, *to, *after, *done)),
            _ => None,
        })
        .collect();
    // Host regions lie past every device region any copy names.
    let device_end = across
        .iter()
        .map(|a| a.0.offset.min(a.1.offset))
        .max()
        .unwrap();
    let to_host: Vec<_> = across.iter().filter(|a| a.1.offset > device_end).collect();
    let to_device: Vec<_> = across.iter().filter(|a| a.1.offset <= device_end).collect();
    // One gradient copy per offloaded unit and step, each after a communication-stream mark.
    assert_eq!(to_host.len(), STEPS * (full + optimizer), "{to_host:?}");
    for (_, _, after, _) in &to_host {
        let after = after.expect("a gradient copy waits for the communication stream");
        assert!(
            comm_marks.contains(&after),
            "mark {after} is the communication stream's"
        );
    }
    // Parameter copies (no mark to wait for): one per `optimizer` unit and step; staging copies
    // (after a communication-stream mark): one or more per `full` unit and step.
    let params: Vec<_> = to_device.iter().filter(|a| a.2.is_none()).collect();
    let staging: Vec<_> = to_device.iter().filter(|a| a.2.is_some()).collect();
    assert_eq!(params.len(), STEPS * optimizer);
    assert!(staging.len() >= STEPS * full, "{staging:?}");
    for (_, _, after, _) in &staging {
        assert!(comm_marks.contains(&after.unwrap()));
    }
    // The host thread: each step waits for its gradient copy's mark first; an `optimizer` unit's
    // parameter copy reads the parameters its step wrote.
    let host: Vec<&Call> = (calls.iter())
        .filter(|(thread, _)| thread == "host-step")
        .map(|(_, c)| c)
        .collect();
    let steps: Vec<usize> = (0..host.len())
        .filter(|&k| matches!(host[k], Call::Adamw { .. }))
        .collect();
    assert_eq!(steps.len(), STEPS * (full + optimizer));
    for &k in &steps {
        let Call::Adamw {
            params: stepped,
            grads,
        } = host[k]
        else {
            unreachable!()
        };
        let Some(Call::WaitOnHost(waited)) = host[..k]
            .iter()
            .rev()
            .find(|c| matches!(c, Call::WaitOnHost(_)))
        else {
            panic!("host step {k} waits for nothing")
        };
        let copy = to_host
            .iter()
            .find(|a| a.3 == *waited)
            .expect("a gradient copy's mark");
        assert_eq!(
            copy.1, *grads,
            "the step reads the gradient that copy brought"
        );
        assert!(
            stepped.offset > device_end,
            "the step runs on the host arena"
        );
    }
    for (from, _, _, done) in &params {
        let stepped_before = (calls.iter())
            .take_while(|(_, c)| !matches!(c, Call::Across { done: d, .. } if d == done))
            .any(|(_, c)| matches!(c, Call::Adamw { params, .. } if params == from));
        assert!(
            stepped_before,
            "a parameter copy from {from:?} follows its host step"
        );
    }
}

#[test]
fn copies_wait_for_the_issuing_stream_and_host_steps_for_their_gradient() {
    for host_step in [HostStep::Overlapped, HostStep::AfterBackward] {
        for semantics in [Semantics::Strict, Semantics::Relaxed] {
            check(host_step, semantics);
        }
    }
}
