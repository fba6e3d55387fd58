//! The scheduler (ggml's `ggml_backend_sched`): runs one graph over several backends, copying
//! tensors between them, with optional pipeline parallelism.
//!
//! This module owns backend assignment (in the private `assign` submodule), splitting a graph
//! where the backend changes and the copies of split inputs (in the private `split`
//! submodule), the compute buffers (one [`GraphAllocator`] buffer type per backend), the
//! events between splits and the copy statistics. It never moves tensors that already have
//! storage (weights, KV caches) and never changes the caller's graph. Imports go one way:
//! `mod` (the [`Scheduler`] and running splits) → `split` → `assign`.
//!
//! # How a graph runs
//! 1. **Assignment** (ggml's passes): tensors already in a buffer go to the highest-priority
//!    backend that can use that memory and run their op; graph inputs go to the CPU (last)
//!    backend; ops reading weights go where the weights are, unless a higher-priority backend's
//!    `offload_op` claims them (`op_offload`); assignments expand down then up to neighbouring
//!    nodes (non-CPU backends first); nodes move up to a higher-priority backend with the same
//!    buffer type when it supports them; what is left goes to the backend that can read most of
//!    its inputs; views follow their view sources. [`Scheduler::set_tensor_backend`] overrides
//!    win over every pass.
//! 2. **Splits**: consecutive nodes on one backend form a split. Every source a split's backend
//!    cannot read where it lives gets a copy tensor in that backend's buffer type, one per
//!    (tensor, backend, copy index), shared by later splits on the same backend. There is no
//!    limit on the number of inputs of a split.
//! 3. **Allocation**: the scheduler builds its own *augmented copy* of the graph in a private
//!    [`Context`] (the caller's tensors, plus the copy tensors, with node sources rewritten to the
//!    copies) and allocates it with one buffer type per backend. The storage of every tensor of
//!    the caller's graph is then written back into the caller's context, so the caller sets
//!    inputs and reads outputs through its own ids, as with a single backend. Building a copy
//!    (rather than adding tensors to the caller's context) keeps the caller's graph and context
//!    unchanged, so a graph can be scheduled again; the cost is one metadata copy per
//!    [`Scheduler::alloc_graph`].
//! 4. **Compute**: for each split, its inputs are copied (`cpy_tensor_async` on the destination
//!    backend when it can, else synchronize and a blocking copy through host memory; inputs the
//!    caller set are always read at once, before the caller can overwrite them, and written with
//!    the destination's `set_tensor_async`), then the
//!    split's nodes are queued with `graph_compute_async` on its backend (asynchronous backends
//!    return at once, so splits on different devices overlap). A split that reads a node of
//!    another backend in place (no copy, because its backend can use that memory) first
//!    synchronizes that backend.
//!
//! # Pipeline parallelism
//! With `n_copies > 1` every split input has `n_copies` copy tensors and every graph input
//! `n_copies` places; each [`Scheduler::alloc_graph`] uses the next copy, so the caller can fill
//! the next micro-batch while earlier ones are still in flight. Before a split overwrites its
//! copy it waits for the event recorded after that split's last use of the copy (one event per
//! (backend, copy)); backends without events are synchronized instead, which is always correct.
//!
//! # Deviations from ggml, and why
//! - The scheduler works on its own copy of the graph (see above) instead of rewriting the
//!   caller's node sources.
//! - A user override is never moved by the upgrade pass (ggml may upgrade it).
//! - Calling [`Scheduler::graph_compute`] with a graph other than the allocated one, or after
//!   the caller's tensors changed (the context's epoch advanced), allocates it (ggml computes
//!   the allocated splits whatever graph is passed).
//! - An eval callback returning `false` stops the whole computation with [`Error::Aborted`]
//!   (ggml only leaves the current split).
//!
//! # Traces
//! With [`Scheduler::set_trace`], every split is recorded as a `"split"` span on its backend's
//! track (with its node and input counts) and every input copy as a `"copy"` span on the
//! destination backend's track (with the bytes copied and the source backend). Spans time the
//! calls as the scheduler makes them: on backends whose compute is asynchronous they show
//! when work was queued.
//!
//! [`Scheduler::set_trace`] also hands the recorder to every backend
//! ([`Backend::set_trace`]) with its track, so backends can add their own spans (a GPU
//! backend's command buffers).
//!
//! # Concurrency
//! Backends that run several nodes at once report which ([`Backend::graph_concurrency`]); the
//! scheduler combines their plans for its splits into one plan for the augmented graph and hands
//! it to the [`GraphAllocator`], so nodes that may overlap never share memory.
//!
//! Buffer types with a maximum size get multi-buffers from the [`GraphAllocator`] (one part
//! per chunk); the scheduler treats every part as its own compute memory.

mod assign;
mod split;

use crate::alloc::{Concurrency, GraphAllocator};
use crate::backend::{Backend, BufferTypeRef, DeviceType, Event};
use crate::context::Context;
use crate::error::{Error, Result, SchedError};
use crate::graph::Graph;
use crate::tensor::{TensorFlags, TensorId};
use crate::trace::{Trace, TraceArg};
use split::{internal, Plan, Split, Splitter};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// The most backends one scheduler takes (ggml's `GGML_SCHED_MAX_BACKENDS`).
pub const MAX_BACKENDS: usize = 16;

/// The eval callback: called with the caller's context and a node of the caller's graph.
/// With `ask == true` it answers whether the caller wants to observe that node; the scheduler
/// then computes up to the node and calls it again with `ask == false`, when the node's data can
/// be read; returning `false` then stops the computation.
pub type EvalCallback = Box<dyn FnMut(&Context, TensorId, bool) -> bool + Send>;

/// Bytes and number of tensor copies between backends, indexed `[src backend][dst backend]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Bytes copied from backend `i` to backend `j`.
    pub bytes: Vec<Vec<u64>>,
    /// Tensor copies from backend `i` to backend `j`.
    pub count: Vec<Vec<u64>>,
}

impl CopyStats {
    fn new(n: usize) -> Self {
        CopyStats {
            bytes: vec![vec![0; n]; n],
            count: vec![vec![0; n]; n],
        }
    }

    /// Bytes copied over every pair.
    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().flatten().sum()
    }

    /// Copies over every pair.
    pub fn total_count(&self) -> u64 {
        self.count.iter().flatten().sum()
    }
}

/// One split as the caller sees it: a backend, the caller's nodes it runs, the caller's
/// tensors it copies in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitInfo {
    /// Index of the backend that runs the split.
    pub backend: usize,
    /// The nodes of the caller's graph it computes, in order.
    pub nodes: Vec<TensorId>,
    /// Tensors of the caller's graph copied into the split's backend before it runs.
    pub inputs: Vec<TensorId>,
}

/// How a [`Scheduler`] is set up; `SchedulerOptions::default()` is llama.cpp's usual setup
/// for one pass at a time.
#[derive(Clone)]
pub struct SchedulerOptions {
    /// Compute memory per backend, one per backend (default: each backend's default buffer
    /// type).
    pub buffer_types: Option<Vec<BufferTypeRef>>,
    /// The largest graph accepted, in tensors (ggml's `graph_size`); default: no limit.
    pub max_graph_size: Option<usize>,
    /// Copies of each split input for pipeline parallelism (at least 1; default 1).
    pub n_copies: usize,
    /// Let higher-priority backends claim ops whose weights are in host memory (ggml's
    /// `op_offload`; default on, as in llama.cpp).
    pub op_offload: bool,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            buffer_types: None,
            max_graph_size: None,
            n_copies: 1,
            op_offload: true,
        }
    }
}

impl std::fmt::Debug for SchedulerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerOptions")
            .field(
                "buffer_types",
                &self
                    .buffer_types
                    .as_ref()
                    .map(|b| b.iter().map(|t| t.name().to_string()).collect::<Vec<_>>()),
            )
            .field("max_graph_size", &self.max_graph_size)
            .field("n_copies", &self.n_copies)
            .field("op_offload", &self.op_offload)
            .finish()
    }
}

/// Runs graphs over several backends (ggml's `ggml_backend_sched`). See the module docs.
pub struct Scheduler {
    backends: Vec<Box<dyn Backend>>,
    bufts: Vec<BufferTypeRef>,
    max_graph_size: Option<usize>,
    n_copies: usize,
    op_offload: bool,
    galloc: GraphAllocator,
    /// `[backend][copy]`; `None` where the device has no events.
    events: Vec<Vec<Option<Event>>>,
    overrides: HashMap<TensorId, usize>,
    plan: Option<Plan>,
    is_alloc: bool,
    cur_copy: usize,
    next_copy: usize,
    /// Ids of every compute buffer the allocator handed out: caller tensors stored there were
    /// placed by the scheduler and may be placed again.
    own_buffers: HashSet<u64>,
    stats: CopyStats,
    eval_callback: Option<EvalCallback>,
    /// The recorder and the track of each backend.
    trace: Option<(Arc<Trace>, Vec<usize>)>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field(
                "backends",
                &self.backends.iter().map(|b| b.name()).collect::<Vec<_>>(),
            )
            .field("n_copies", &self.n_copies)
            .field("n_splits", &self.n_splits())
            .finish()
    }
}

impl Scheduler {
    /// A scheduler over `backends` in priority order (with several, the last must be a CPU
    /// backend: it takes what no other can), set up by `options` (see [`SchedulerOptions`]).
    pub fn new(backends: Vec<Box<dyn Backend>>, options: SchedulerOptions) -> Result<Scheduler> {
        let SchedulerOptions {
            buffer_types,
            max_graph_size,
            n_copies,
            op_offload,
        } = options;
        let n = backends.len();
        if n == 0 {
            return Err(SchedError::NoBackends.into());
        }
        if n > MAX_BACKENDS {
            return Err(SchedError::TooManyBackends {
                n,
                max: MAX_BACKENDS,
            }
            .into());
        }
        if n_copies == 0 {
            return Err(SchedError::NoCopies.into());
        }
        // The last backend takes what no other can (inputs, ops no device supports), which the
        // CPU can; a lone backend takes everything, whatever it is.
        if let Some(last) = backends.last().filter(|_| n > 1) {
            if last.device().device_type() != DeviceType::Cpu {
                return Err(SchedError::LastBackendNotCpu(last.name().to_string()).into());
            }
        }
        let bufts = match buffer_types {
            Some(b) if b.len() != n => {
                return Err(SchedError::BufferTypeCount {
                    n_buffer_types: b.len(),
                    n_backends: n,
                }
                .into())
            }
            Some(b) => b,
            None => backends.iter().map(|b| b.default_buffer_type()).collect(),
        };
        for (b, buft) in backends.iter().zip(&bufts) {
            if !b.supports_buffer_type(buft) {
                return Err(SchedError::BufferTypeUnusable {
                    backend: b.name().to_string(),
                    buffer_type: buft.name().to_string(),
                }
                .into());
            }
        }
        let events = backends
            .iter()
            .map(|b| {
                let dev = b.device();
                (0..n_copies)
                    .map(|_| crate::backend::event_if_supported(dev.as_ref()))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Scheduler {
            galloc: GraphAllocator::new(bufts.clone()),
            backends,
            bufts,
            max_graph_size,
            n_copies,
            op_offload,
            events,
            overrides: HashMap::new(),
            plan: None,
            is_alloc: false,
            cur_copy: 0,
            next_copy: 0,
            own_buffers: HashSet::new(),
            stats: CopyStats::new(n),
            eval_callback: None,
            trace: None,
        })
    }

    /// Number of backends.
    pub fn n_backends(&self) -> usize {
        self.backends.len()
    }

    /// Backend `i` (priority order).
    pub fn backend(&self, i: usize) -> Option<&dyn Backend> {
        self.backends.get(i).map(|b| b.as_ref())
    }

    /// Backend `i`, mutably (e.g. to set a thread count).
    pub fn backend_mut(&mut self, i: usize) -> Option<&mut (dyn Backend + 'static)> {
        self.backends.get_mut(i).map(|b| b.as_mut())
    }

    /// The compute buffer type of backend `i`.
    pub fn buffer_type(&self, i: usize) -> Option<&BufferTypeRef> {
        self.bufts.get(i)
    }

    /// Copies of each split input (pipeline depth).
    pub fn n_copies(&self) -> usize {
        self.n_copies
    }

    /// The copy index the last allocated graph uses.
    pub fn cur_copy(&self) -> usize {
        self.cur_copy
    }

    /// Splits of the last split graph (0 before any).
    pub fn n_splits(&self) -> usize {
        self.plan.as_ref().map_or(0, |p| p.splits.len())
    }

    /// The splits of the last split graph, in the caller's ids.
    pub fn splits(&self) -> Vec<SplitInfo> {
        let Some(plan) = &self.plan else {
            return Vec::new();
        };
        let user = |ids: &mut dyn Iterator<Item = &TensorId>| -> Vec<TensorId> {
            ids.filter_map(|s| plan.to_user.get(s).copied()).collect()
        };
        plan.splits
            .iter()
            .map(|s| SplitInfo {
                backend: s.backend,
                nodes: user(&mut s.graph.nodes().iter()),
                inputs: user(&mut s.inputs.iter()),
            })
            .collect()
    }

    /// Bytes and copies moved between backends since creation or [`reset_stats`](Self::reset_stats).
    pub fn copy_stats(&self) -> &CopyStats {
        &self.stats
    }

    /// Zero the copy statistics.
    pub fn reset_stats(&mut self) {
        self.stats = CopyStats::new(self.backends.len());
    }

    /// Bytes of the compute buffer of backend `i` (0 before any allocation; a buffer type
    /// shared by several backends is counted at its first backend).
    pub fn buffer_size(&self, i: usize) -> usize {
        self.galloc.buffer_size(i)
    }

    /// Run tensor `id` of the caller's context on the backend of `device` (the first backend
    /// on it, in priority order), whatever the passes would decide. Holds until
    /// [`reset`](Self::reset).
    pub fn set_tensor_device(&mut self, id: TensorId, device: &dyn crate::Device) -> Result<()> {
        let index = self
            .backends
            .iter()
            .position(|b| b.device().name() == device.name())
            .ok_or_else(|| SchedError::NoBackendOnDevice(device.name().to_string()))?;
        self.set_tensor_backend(id, index)
    }

    /// Run tensor `id` of the caller's context on backend `backend` (an index into the
    /// scheduler's backends), whatever the passes would decide. Holds until
    /// [`reset`](Self::reset).
    pub fn set_tensor_backend(&mut self, id: TensorId, backend: usize) -> Result<()> {
        if backend >= self.backends.len() {
            return Err(SchedError::UnknownBackend {
                index: backend,
                n_backends: self.backends.len(),
            }
            .into());
        }
        self.overrides.insert(id, backend);
        Ok(())
    }

    /// The backend of tensor `id` of the caller's context: its assignment in the last split
    /// graph, else its override.
    pub fn tensor_backend(&self, id: TensorId) -> Option<usize> {
        self.plan
            .as_ref()
            .and_then(|p| {
                let s = p.to_sched.get(&id)?;
                p.backend_ids.get(s.index()).copied().flatten()
            })
            .or_else(|| self.overrides.get(&id).copied())
    }

    /// Observe nodes while computing (see [`EvalCallback`]); replaces any earlier callback.
    pub fn set_eval_callback(&mut self, callback: EvalCallback) {
        self.eval_callback = Some(callback);
    }

    /// Stop calling an eval callback.
    pub fn clear_eval_callback(&mut self) {
        self.eval_callback = None;
    }

    /// Record splits and copies into `trace`, one track per backend (named after it); see
    /// the module docs. Replaces any earlier recorder.
    pub fn set_trace(&mut self, trace: Arc<Trace>) {
        let tracks = self
            .backends
            .iter()
            .map(|b| trace.track(b.name()))
            .collect::<Vec<_>>();
        for (b, &track) in self.backends.iter_mut().zip(&tracks) {
            b.set_trace(Some((trace.clone(), track)));
        }
        self.trace = Some((trace, tracks));
    }

    /// Stop recording.
    pub fn clear_trace(&mut self) {
        for b in &mut self.backends {
            b.set_trace(None);
        }
        self.trace = None;
    }

    /// Wait for all work on every backend. Without an allocated graph the next allocation uses
    /// copy 0 again (so a sequence of single graphs always uses the same memory).
    pub fn synchronize(&mut self) -> Result<()> {
        for b in &mut self.backends {
            b.synchronize()?;
        }
        if !self.is_alloc {
            self.next_copy = 0;
        }
        Ok(())
    }

    /// Forget assignments, overrides and the allocated graph (buffers are kept for the next
    /// graph).
    pub fn reset(&mut self) {
        self.overrides.clear();
        self.plan = None;
        self.is_alloc = false;
    }

    /// Size the compute buffers for `graph` (typically the largest graph to come) without
    /// allocating its tensors; assignments and overrides are then forgotten.
    pub fn reserve(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        let plan = self.split_graph(ctx, graph, self.next_copy)?;
        let conc = self.concurrency(&plan)?;
        self.galloc.reserve_with_concurrency(
            &plan.ctx,
            &plan.graph,
            &plan.node_ids,
            &plan.leaf_ids,
            conc.as_ref(),
        )?;
        self.note_buffers();
        self.reset();
        Ok(())
    }

    /// Assign backends, split `graph` and give every tensor of it storage (written into
    /// `ctx`). Uses the next copy of the split inputs.
    pub fn alloc_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        self.is_alloc = false;
        self.cur_copy = self.next_copy;
        self.next_copy = (self.next_copy + 1) % self.n_copies;
        let mut plan = self.split_graph(ctx, graph, self.cur_copy)?;
        let conc = self.concurrency(&plan)?;
        if self.galloc.needs_realloc(&plan.ctx, &plan.graph)
            || self.galloc.concurrency() != conc.as_ref()
        {
            self.galloc.reserve_with_concurrency(
                &plan.ctx,
                &plan.graph,
                &plan.node_ids,
                &plan.leaf_ids,
                conc.as_ref(),
            )?;
        }
        self.galloc.alloc_graph(&mut plan.ctx, &plan.graph)?;
        self.note_buffers();
        for (&u, &s) in &plan.to_sched {
            if let Some(data) = &plan.ctx[s].data {
                ctx.get_mut(u)?.data = Some(data.clone());
            }
        }
        plan.user_ctx = (ctx.uid(), ctx.epoch());
        self.plan = Some(plan);
        self.is_alloc = true;
        Ok(())
    }

    /// Compute `graph`, allocating it first unless it is the graph last allocated. Waits for
    /// the result (ggml's `graph_compute`).
    pub fn graph_compute(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        self.graph_compute_async(ctx, graph)?;
        self.synchronize()
    }

    /// As [`graph_compute`](Self::graph_compute), but returns once the work is queued; call
    /// [`synchronize`](Self::synchronize) before reading results.
    pub fn graph_compute_async(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        // The allocated plan, while the graph and the caller's tensors are unchanged (O(1)).
        let allocated = self.is_alloc
            && self
                .plan
                .as_ref()
                .is_some_and(|p| p.uid == graph.uid() && p.user_ctx == (ctx.uid(), ctx.epoch()));
        if !allocated {
            self.alloc_graph(ctx, graph)?;
        }
        self.compute_splits(ctx)
    }

    /// The augmented graph's concurrency plan: each split's nodes grouped as its backend
    /// reports ([`Backend::graph_concurrency`]), every other node (input copies and their
    /// keep-alive nodes) alone. `None` when no backend reports a plan, so the allocator plans
    /// exactly as without concurrency.
    fn concurrency(&self, plan: &Plan) -> Result<Option<Concurrency>> {
        let mut starts = Vec::new();
        let mut any = false;
        let mut next = 0;
        for split in &plan.splits {
            starts.extend(next..split.aug_start);
            let n = split.graph.n_nodes();
            match self.backends[split.backend].graph_concurrency(&plan.ctx, &split.graph)? {
                Some(c) if c.n_nodes() == n => {
                    any = true;
                    c.append_starts(split.aug_start, &mut starts);
                }
                Some(_) => {
                    return Err(SchedError::BadConcurrencyPlan(
                        self.backends[split.backend].name().to_string(),
                    )
                    .into())
                }
                None => starts.extend(split.aug_start..split.aug_start + n),
            }
            next = split.aug_start + n;
        }
        starts.extend(next..plan.graph.n_nodes());
        if !any {
            return Ok(None);
        }
        Concurrency::from_starts(starts, plan.graph.n_nodes()).map(Some)
    }

    fn note_buffers(&mut self) {
        for i in 0..self.galloc.n_buffer_types() {
            if let Some(b) = self.galloc.buffer(i) {
                // Tensors of a multi-buffer point at its parts.
                self.own_buffers.insert(b.id());
                self.own_buffers.extend(b.parts().iter().map(|p| p.id()));
            }
        }
    }

    /// Split `graph` of `user` (see [`split`]) with this scheduler's backends and settings.
    fn split_graph(&self, user: &Context, graph: &Graph, cur_copy: usize) -> Result<Plan> {
        Splitter {
            backends: &self.backends,
            bufts: &self.bufts,
            max_graph_size: self.max_graph_size,
            n_copies: self.n_copies,
            op_offload: self.op_offload,
            overrides: &self.overrides,
            own_buffers: &self.own_buffers,
        }
        .split_graph(user, graph, cur_copy)
    }

    /// Run the splits of the allocated graph (ggml's `ggml_backend_sched_compute_splits`).
    fn compute_splits(&mut self, user: &Context) -> Result<()> {
        // Out of `self` while it runs, so the steps below can borrow the backends mutably;
        // put back whatever happens.
        let plan = self.plan.take().ok_or(SchedError::NotAllocated)?;
        let result = self.run_splits(&plan, user);
        self.plan = Some(plan);
        result
    }

    /// For each split: copy its inputs in, wait for sources read in place, compute it, and
    /// record its event (after which its input copies may be overwritten).
    fn run_splits(&mut self, plan: &Plan, user: &Context) -> Result<()> {
        let c = plan.cur_copy;
        for (split_index, split) in plan.splits.iter().enumerate() {
            let b = split.backend;
            for &input in &split.inputs {
                self.copy_input(plan, b, input)?;
            }
            self.wait_for_sources(plan, split)?;
            let t_split = Instant::now();
            self.compute_split(plan, split, user)?;
            if let Some((trace, tracks)) = &self.trace {
                trace.span(
                    tracks[b],
                    format!("split {split_index}"),
                    "split",
                    t_split,
                    Instant::now(),
                    vec![
                        ("nodes".into(), TraceArg::Int(split.graph.n_nodes() as u64)),
                        ("inputs".into(), TraceArg::Int(split.inputs.len() as u64)),
                    ],
                );
            }
            if !split.inputs.is_empty() {
                if let Some(e) = self.events[b][c].as_ref() {
                    self.backends[b].event_record(e)?;
                }
            }
        }
        Ok(())
    }

    /// Copy split input `input` into its copy on backend `b`, counted in the statistics and
    /// traced.
    fn copy_input(&mut self, plan: &Plan, b: usize, input: TensorId) -> Result<()> {
        let c = plan.cur_copy;
        let t_copy = Instant::now();
        let ib = plan.backend_ids[input.index()]
            .ok_or_else(|| internal("a split input has no backend"))?;
        let cpy = plan
            .copies
            .get(&(input, b))
            .and_then(|v| v.get(c))
            .copied()
            .ok_or_else(|| internal("a split input has no copy"))?;
        let event = self.events[b][c].as_ref();
        if plan.ctx[input].flags.contains(TensorFlags::INPUT) {
            // The caller may overwrite its input as soon as we return: copy it now.
            match event {
                Some(e) => e.synchronize()?,
                None => self.backends[b].synchronize()?,
            }
            // Read now; the write goes through the split backend's stream, after the
            // work it has queued (which may still use that memory).
            let bytes = plan.ctx.tensor_bytes(input)?;
            if plan.ctx[cpy].nbytes() != bytes.len() {
                return Err(internal("a split input and its copy differ in size"));
            }
            self.backends[b].set_tensor_async(&plan.ctx, cpy, 0, &bytes)?;
        } else {
            // Wait until the split backend is done with this copy before overwriting it.
            match event {
                Some(e) => self.backends[b].event_wait(e)?,
                None => self.backends[b].synchronize()?,
            }
            let (dst, src) = crate::backend::two_mut(&mut self.backends, b, ib)
                .ok_or_else(|| internal(format!("cannot borrow backends {b} and {ib} together")))?;
            crate::backend::tensor_copy_async(dst.as_mut(), src.as_mut(), &plan.ctx, input, cpy)?;
        }
        let bytes = plan.ctx[input].nbytes() as u64;
        self.stats.bytes[ib][b] += bytes;
        self.stats.count[ib][b] += 1;
        if let Some((trace, tracks)) = &self.trace {
            trace.span(
                tracks[b],
                format!("copy {}", plan.ctx[input].display_name()),
                "copy",
                t_copy,
                Instant::now(),
                vec![
                    ("bytes".into(), TraceArg::Int(bytes)),
                    (
                        "from".into(),
                        TraceArg::Text(self.backends[ib].name().to_string()),
                    ),
                ],
            );
        }
        Ok(())
    }

    /// Sources computed by another backend and read in place (by a backend that can use that
    /// memory, so no copy was made): that backend may still be running asynchronously, so wait
    /// for it first.
    fn wait_for_sources(&mut self, plan: &Plan, split: &Split) -> Result<()> {
        let mut waited: Vec<usize> = Vec::new();
        for &n in split.graph.nodes() {
            for &src in &plan.ctx[n].src {
                let computed = plan.ctx[src].op.kind() != crate::op::OpKind::None;
                if let Some(ob) = plan.backend_ids.get(src.index()).copied().flatten() {
                    if computed && ob != split.backend && !waited.contains(&ob) {
                        self.backends[ob].synchronize()?;
                        waited.push(ob);
                    }
                }
            }
        }
        Ok(())
    }

    /// Queue the split's nodes on its backend; with an eval callback, run them piece by piece
    /// up to each node the caller wants to see, and stop when it says so.
    fn compute_split(&mut self, plan: &Plan, split: &Split, user: &Context) -> Result<()> {
        let b = split.backend;
        let Some(cb) = self.eval_callback.as_mut() else {
            return self.backends[b].graph_compute_async(&plan.ctx, &split.graph);
        };
        let nodes = split.graph.nodes();
        let mut j0 = 0;
        while j0 < nodes.len() {
            // Run nodes up to (and including) the next one the caller wants to see.
            let mut j1 = j0;
            let mut need;
            loop {
                let u = plan
                    .to_user
                    .get(&nodes[j1])
                    .copied()
                    .ok_or_else(|| internal("a split node is not in the caller's graph"))?;
                need = cb(user, u, true);
                if need || j1 + 1 == nodes.len() {
                    break;
                }
                j1 += 1;
            }
            let view = Graph::from_nodes(nodes[j0..=j1].to_vec());
            self.backends[b].graph_compute(&plan.ctx, &view)?;
            self.backends[b].synchronize()?;
            if need {
                let u = plan.to_user[&nodes[j1]];
                if !cb(user, u, false) {
                    return Err(Error::Aborted);
                }
            }
            j0 = j1 + 1;
        }
        Ok(())
    }
}
