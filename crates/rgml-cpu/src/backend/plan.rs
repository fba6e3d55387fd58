//! Plans: checking a graph once and building the job that runs it (views with their bounds
//! and alignment checked, the work area sized, the barriers between nodes planned).
//!
//! This module owns what makes a job sound to run later: every view inside its buffer, no
//! writes into read-only memory, sources overlapping a destination only as exact in-place
//! aliases, and the list of buffers (written or only read) whose guards the engine takes.
//! It runs nothing.

use crate::kernels::task::MAX_NODE_SRC;
use crate::kernels::{self, CpuFeatures, NodeTask, TensorView};
use rgml::{Buffer, Context, Error, Graph, Result, Tensor, TensorId};
use std::sync::Arc;

/// A checked graph, ready to run: owns everything it needs, borrows nothing.
pub(super) struct Job {
    /// Buffers the tasks point into, sorted by id, with the base address and size the views
    /// were computed from, and whether a task writes into it (exclusive guard) or only reads
    /// it (shared guard: weights other computations may read at the same time).
    pub(super) buffers: Vec<(Arc<Buffer>, usize, usize, bool)>,
    pub(super) tasks: Vec<NodeTask>,
    pub(super) shared: usize,
    pub(super) per_thread: usize,
}

/// Bytes from element 0 to one past the last element, with overflow checks.
pub(super) fn span(t: &Tensor) -> Result<usize> {
    if t.ne.contains(&0) {
        return Ok(0);
    }
    let bs = t.dtype.block_size();
    let mut bytes = (t.ne[0] / bs)
        .checked_mul(t.nb[0])
        .ok_or(Error::SizeOverflow)?;
    if bs == 1 {
        bytes = (t.ne[0] - 1)
            .checked_mul(t.nb[0])
            .and_then(|b| b.checked_add(t.dtype.block_bytes()))
            .ok_or(Error::SizeOverflow)?;
    }
    for i in 1..4 {
        bytes = (t.ne[i] - 1)
            .checked_mul(t.nb[i])
            .and_then(|b| b.checked_add(bytes))
            .ok_or(Error::SizeOverflow)?;
    }
    Ok(bytes)
}

/// Check every node and build the node tasks: a job that owns everything it needs (`None`
/// when there is nothing to run). Nothing is read or written here; the views' addresses are
/// computed from the buffers' base addresses, which [`Engine::execute`] checks again under
/// the buffers' guards before any access.
///
/// [`Engine::execute`]: super::engine::Engine::execute
pub(super) fn prepare(
    device: &str,
    features: CpuFeatures,
    threads: usize,
    ctx: &Context,
    graph: &Graph,
) -> Result<Option<Job>> {
    let (run, buffers) = nodes_to_run(ctx, graph)?;
    if run.is_empty() {
        return Ok(None);
    }
    let views = Views {
        device,
        ctx,
        bases: host_bases(device, buffers)?,
    };
    let mut tasks = Vec::with_capacity(run.len());
    let mut extents = Vec::with_capacity(run.len());
    let (mut shared, mut per_thread) = (0usize, 0usize);
    for &id in &run {
        let (task, (reads, write)) = node_task(&views, id, features, threads)?;
        let (sh, pt) = kernels::work_size(ctx, &ctx[id], features, threads)?;
        shared = shared.max(sh);
        per_thread = per_thread.max(pt);
        extents.push((reads, [write, Extent::NONE]));
        tasks.push(task);
    }
    fuse_state_updates(ctx, graph, &run, &mut tasks, &mut extents);
    plan_syncs(&mut tasks, &extents);
    Ok(Some(Job {
        buffers: views
            .bases
            .into_iter()
            .map(|(b, base, size, writes)| (b, base.as_ptr() as usize, size, writes))
            .collect(),
        tasks,
        shared,
        per_thread,
    }))
}

/// A tensor's storage: the tensor, its buffer and its offset there.
fn storage(ctx: &Context, id: TensorId) -> Result<(&Tensor, &Arc<Buffer>, usize)> {
    let t = ctx.get(id)?;
    let d = t
        .data
        .as_ref()
        .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
    Ok((t, &d.buffer, d.offset))
}

/// The nodes that compute something (each checked as supported, its destination writable),
/// and every buffer they touch with whether a node writes into it.
#[allow(clippy::type_complexity)]
fn nodes_to_run(ctx: &Context, graph: &Graph) -> Result<(Vec<TensorId>, Vec<(Arc<Buffer>, bool)>)> {
    let mut run: Vec<TensorId> = Vec::with_capacity(graph.n_nodes());
    let mut buffers: Vec<(Arc<Buffer>, bool)> = Vec::new();
    for &id in graph.nodes() {
        let t = ctx.get(id)?;
        // Empty nodes compute nothing (ggml skips them too; llama.cpp's recurrent graphs copy
        // zero state rows when every sequence is in the batch).
        if t.op.kind().is_view() || t.nelements() == 0 {
            continue;
        }
        kernels::check_supported(ctx, id)?;
        let (_, buf, _) = storage(ctx, id)?;
        if buf.is_read_only() {
            return Err(Error::ReadOnlyBuffer(format!(
                "{} (destination of node '{}')",
                buf.name(),
                t.display_name()
            )));
        }
        buffers.push((buf.clone(), true));
        for &s in &t.src {
            buffers.push((storage(ctx, s)?.1.clone(), false));
        }
        run.push(id);
    }
    Ok((run, buffers))
}

/// A buffer of a job: the buffer, its base address and size, and whether the job writes it.
type BufferBase = (Arc<Buffer>, std::ptr::NonNull<u8>, usize, bool);

/// Each buffer once, in id order (writers first among equal ids, so the entry kept says
/// whether any node writes), with its base address; an error for memory the kernels cannot
/// address.
fn host_bases(device: &str, mut buffers: Vec<(Arc<Buffer>, bool)>) -> Result<Vec<BufferBase>> {
    buffers.sort_by_key(|(b, writes)| (b.id(), !writes));
    buffers.dedup_by_key(|(b, _)| b.id());
    let not_host = |b: &Buffer| Error::Unsupported {
        backend: device.to_string(),
        what: format!("buffer '{}' is not host memory", b.name()),
    };
    let mut bases = Vec::with_capacity(buffers.len());
    for (b, writes) in buffers {
        // Repacked weights are host memory to these kernels alone (see `check_supported`).
        if !b.is_host() && !crate::CpuRepackBufferType::is_repack(b.buffer_type()) {
            return Err(not_host(&b));
        }
        let base = b.imp().base().ok_or_else(|| not_host(&b))?;
        let size = b.size();
        bases.push((b, base, size, writes));
    }
    Ok(bases)
}

/// Views of a graph's tensors in the job's buffers.
struct Views<'a> {
    device: &'a str,
    ctx: &'a Context,
    bases: Vec<BufferBase>,
}

impl Views<'_> {
    /// Tensor `id`'s view (bounds and alignment checked), its buffer's id and its byte span.
    fn view(&self, id: TensorId) -> Result<(TensorView, u64, usize)> {
        let (t, buf, offset) = storage(self.ctx, id)?;
        let &(_, base, size, _) = self
            .bases
            .binary_search_by_key(&buf.id(), |(b, _, _, _)| b.id())
            .map(|i| &self.bases[i])
            .map_err(|_| Error::NoStorage(t.display_name().to_string()))?;
        let len = span(t)?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::OutOfBounds {
                what: format!("tensor '{}' in buffer '{}'", t.display_name(), buf.name()),
                offset,
                size: len,
                limit: size,
            });
        }
        // Only an address here: it is dereferenced by the kernels once the worker holds the
        // buffer's guard and has checked that the base is unchanged.
        let ptr = base.as_ptr().wrapping_add(offset);
        if len > 0 && !(ptr as usize).is_multiple_of(t.dtype_align()) {
            return Err(self.unsupported(format!(
                "tensor '{}' is misaligned for {}",
                t.display_name(),
                t.dtype
            )));
        }
        let mut v = TensorView::new(t, ptr);
        v.packed = crate::CpuRepackBufferType::is_repack(buf.buffer_type());
        Ok((v, buf.id(), len))
    }

    fn unsupported(&self, what: String) -> Error {
        Error::Unsupported {
            backend: self.device.to_string(),
            what,
        }
    }
}

/// Node `id`'s task and the byte ranges it reads and writes; an error for a source that
/// overlaps the destination other than as an exact in-place alias.
fn node_task(
    views: &Views<'_>,
    id: TensorId,
    features: CpuFeatures,
    threads: usize,
) -> Result<(NodeTask, ([Extent; MAX_NODE_SRC], Extent))> {
    let t = &views.ctx[id];
    let (dst, dbuf, dlen) = views.view(id)?;
    let mut src: [Option<TensorView>; MAX_NODE_SRC] = [None; MAX_NODE_SRC];
    let mut reads = [Extent::NONE; MAX_NODE_SRC];
    for (i, &s) in t.src.iter().enumerate() {
        let (sv, sbuf, slen) = views.view(s)?;
        if let Some(r) = reads.get_mut(i) {
            *r = Extent::new(sv.ptr, slen);
        }
        if i >= src.len() {
            return Err(views.unsupported(format!("{} with {} sources", t.op.kind(), t.src.len())));
        }
        let exact = sv.ptr == dst.ptr && sv.ne == dst.ne && sv.nb == dst.nb;
        if !kernels::is_target_src(&t.op, i)
            && sbuf == dbuf
            && kernels::task::overlaps(sv.ptr, slen, dst.ptr, dlen)
            && !(exact && sv.dtype == dst.dtype && kernels::inplace_capable(&t.op, i))
        {
            return Err(views.unsupported(format!(
                "{}: source {i} overlaps destination '{}' (only exact in-place aliases are allowed)",
                t.op.kind(),
                t.display_name()
            )));
        }
        src[i] = Some(sv);
    }
    let writes = Extent::new(dst.ptr, dlen);
    let task = NodeTask {
        op: t.op,
        dst,
        src,
        sync_before: true,
        reuse_src1: false,
        state_in_place: false,
        features,
        threads,
    };
    Ok((task, (reads, writes)))
}

/// What a task reads (one range per source) and writes (its destination, and the state a
/// fused recurrent update writes in place).
pub(super) type Extents = ([Extent; MAX_NODE_SRC], [Extent; 2]);

/// GATED_DELTA_NET followed by the CPY of its new state back into the state it read (the
/// recurrent update of the hybrid models' graphs, llama.cpp's too): the kernel updates that
/// state in place ([`NodeTask::state_in_place`]) and the copy is dropped. A decode step then
/// reads and writes each layer's state once instead of twice (a quarter of the memory traffic
/// of Qwen3.5's delta-net layers beside their weights). The result's state part is then never
/// written, so this holds only where nothing reads it but that copy: neither the node nor a
/// view of it is a graph output, no other node's source covers that part, and no task between
/// the two touches the state or that part. The state's new values are the copy's, bit for bit.
fn fuse_state_updates(
    ctx: &Context,
    graph: &Graph,
    run: &[TensorId],
    tasks: &mut Vec<NodeTask>,
    extents: &mut Vec<Extents>,
) {
    let mut ids = run.to_vec();
    let mut i = 0;
    while i < tasks.len() {
        if let Some((j, state)) = state_copy_of(ctx, graph, &ids, tasks, extents, i) {
            tasks[i].state_in_place = true;
            extents[i].1[1] = state;
            tasks.remove(j);
            extents.remove(j);
            ids.remove(j);
        }
        i += 1;
    }
}

/// The bytes of a GATED_DELTA_NET's (contiguous) state source `s`.
fn extent_of_state(s: &TensorView) -> Extent {
    let n: usize = s.ne.iter().product();
    Extent::new(s.ptr, n * 4)
}

/// The index of the task that copies task `i`'s new state into the state it read, where
/// [`fuse_state_updates`] may fuse the two (`ids[k]` is task `k`'s node), with the state's
/// bytes.
fn state_copy_of(
    ctx: &Context,
    graph: &Graph,
    ids: &[TensorId],
    tasks: &[NodeTask],
    extents: &[Extents],
    i: usize,
) -> Option<(usize, Extent)> {
    let task = &tasks[i];
    let rgml::Op::GatedDeltaNet { snapshots: 1 } = task.op else {
        return None;
    };
    let (state, v) = (task.src[5]?, task.src[2]?);
    let state_ext = extent_of_state(&state);
    let outputs: usize = v.ne.iter().product();
    let part = Extent::new(task.dst.ptr.wrapping_add(outputs * 4), state_ext.len());
    let dense = |t: &TensorView| {
        t.dtype == rgml::DType::F32
            && (0..4).all(|d| t.nb[d] == 4 * t.ne[..d].iter().product::<usize>())
            && t.ne.iter().product::<usize>() * 4 == state_ext.len()
    };
    // The sources other than the state must not meet it (written in place now).
    if extents[i].0[..5].iter().any(|e| e.meets(state_ext)) {
        return None;
    }
    for j in i + 1..tasks.len() {
        let t = &tasks[j];
        let copies = t.op == rgml::Op::Cpy
            && t.src[0].is_some_and(|s| s.ptr as usize == part.start && dense(&s))
            && t.dst.ptr == state.ptr
            && dense(&t.dst);
        if copies {
            let part_bytes = outputs * 4..outputs * 4 + state_ext.len();
            return (!read_elsewhere(ctx, graph, ids[i], part_bytes, ids[j]))
                .then_some((j, state_ext));
        }
        let (reads, writes) = &extents[j];
        let touches = |e: Extent| reads.iter().chain(writes).any(|x| x.meets(e));
        if touches(state_ext) || touches(part) {
            return None;
        }
    }
    None
}

/// Whether bytes `part` of node `id`'s result may be read other than by node `except`: `id` or
/// a view of it is a graph output, or another node's source covers some of those bytes.
fn read_elsewhere(
    ctx: &Context,
    graph: &Graph,
    id: TensorId,
    part: std::ops::Range<usize>,
    except: TensorId,
) -> bool {
    let output = |t: &Tensor| t.flags.contains(rgml::TensorFlags::OUTPUT);
    let covers = |s: TensorId| {
        let t = &ctx[s];
        let at = match (s == id, t.view_src) {
            (true, _) => 0,
            (false, Some(root)) if root == id => t.view_offset,
            _ => return false,
        };
        span(t).map_or(true, |len| at < part.end && part.start < at + len)
    };
    output(&ctx[id])
        || graph.nodes().iter().any(|&n| {
            let t = &ctx[n];
            (t.view_src == Some(id) && output(t))
                || (n != except && !t.op.kind().is_view() && t.src.iter().any(|&s| covers(s)))
        })
}

/// A byte range of host memory a node reads or writes (addresses, so ranges of different
/// buffers never meet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Extent {
    start: usize,
    end: usize,
}

impl Extent {
    /// Nothing.
    const NONE: Extent = Extent { start: 0, end: 0 };
    /// The shared work area (MUL_MAT's converted src1): address 0 is never a tensor's, so
    /// this range meets no tensor.
    const WORK: Extent = Extent { start: 0, end: 1 };

    fn new(ptr: *const u8, len: usize) -> Extent {
        let start = ptr as usize;
        Extent {
            start,
            end: start.saturating_add(len),
        }
    }

    fn meets(self, other: Extent) -> bool {
        self.start < other.end && other.start < self.end
    }

    fn len(self) -> usize {
        self.end - self.start
    }
}

/// Which nodes need the threads synchronized before them, and which matrix products can
/// reuse the previous one's converted src1 (see [`NodeTask`]).
///
/// Threads run the nodes in order; between two barriers they may be at different nodes. A
/// node needs a barrier before it when it reads what a node since the last barrier writes, or
/// writes what such a node reads or writes. A MUL_MAT that converts src1 synchronizes inside
/// (after phase 1), so only phase 1's accesses (src1 in, work area out) count before it, and
/// the nodes before it are all finished after it starts its phase 2.
pub(super) fn plan_syncs(tasks: &mut [NodeTask], extents: &[Extents]) {
    let mut reads: Vec<Extent> = Vec::new();
    let mut writes: Vec<Extent> = Vec::new();
    // The src1 the work area holds, and how it was converted.
    let mut held: Option<(TensorView, kernels::matmul::Src1, Extent)> = None;
    for (j, (task, &(srcs, node_writes))) in tasks.iter_mut().zip(extents).enumerate() {
        let [dst, in_place] = node_writes;
        let conversion = match (task.op, task.src[0], task.src[1]) {
            (
                rgml::Op::MulMat {
                    hadamard: false, ..
                },
                Some(a),
                Some(b),
            ) => {
                let path_rows = kernels::matmul::path_rows(&task.op, b.ne[1]);
                kernels::matmul::src1_conversion(
                    task.features,
                    a.dtype,
                    a.packed,
                    b.rows_contiguous(),
                    path_rows,
                )
                .map(|c| (b, c, srcs[1]))
            }
            _ => None,
        };
        // A node that writes the held src1 (or its converted copy) ends its reuse.
        if held.is_some_and(|(_, _, e)| {
            node_writes.iter().any(|w| w.meets(e)) || dst.meets(Extent::WORK)
        }) {
            held = None;
        }
        task.reuse_src1 = matches!((conversion, held), (Some((b, c, _)), Some((hb, hc, _)))
            if c == hc && b.ptr == hb.ptr && b.ne == hb.ne && b.nb == hb.nb && b.dtype == hb.dtype);
        let conflict = |r: &[Extent], w: &[Extent], node_reads: &[Extent], node_write: Extent| {
            w.iter()
                .any(|x| node_write.meets(*x) || node_reads.iter().any(|y| y.meets(*x)))
                || r.iter().any(|x| node_write.meets(*x))
        };
        let node_reads: Vec<Extent> = srcs
            .iter()
            .copied()
            .chain(conversion.map(|_| Extent::WORK))
            .filter(|e| e.start < e.end)
            .collect();
        match conversion {
            Some((b, c, b_extent)) if !task.reuse_src1 => {
                // Phase 1 reads src1 and writes the work area, then every thread waits.
                task.sync_before = j == 0 || conflict(&reads, &writes, &[b_extent], Extent::WORK);
                reads.clear();
                writes.clear();
                held = Some((b, c, b_extent));
            }
            _ => {
                task.sync_before = j == 0
                    || conflict(&reads, &writes, &node_reads, dst)
                    || conflict(&reads, &writes, &node_reads, in_place);
                if task.sync_before {
                    reads.clear();
                    writes.clear();
                }
            }
        }
        reads.extend(node_reads);
        writes.extend(node_writes.into_iter().filter(|e| e.start < e.end));
    }
}

/// Alignment a tensor's element 0 needs for the kernels' typed accesses.
pub(super) trait DTypeAlign {
    fn dtype_align(&self) -> usize;
}

impl DTypeAlign for Tensor {
    fn dtype_align(&self) -> usize {
        match self.dtype {
            rgml::DType::F32 | rgml::DType::I32 => 4,
            _ => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgml::alloc::alloc_ctx_tensors;
    use rgml::{Backend, DType, Device};

    /// Three products of one activation (q/k/v) share its quantized copy and run without
    /// barriers between them; nodes reading their results wait for them.
    #[test]
    fn products_of_one_activation_share_it_and_skip_barriers() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[64, 2]).unwrap();
        let n = ctx.rms_norm(x, 1e-5).unwrap();
        let w: Vec<TensorId> = (0..3)
            .map(|_| ctx.new_tensor(DType::Q8_0, &[64, 64]).unwrap())
            .collect();
        let p: Vec<TensorId> = w.iter().map(|&w| ctx.mul_mat(w, n).unwrap()).collect();
        let s = ctx.add(p[0], p[1]).unwrap();
        let s = ctx.add(s, p[2]).unwrap();
        alloc_ctx_tensors(&mut ctx, &crate::CpuDevice::new("CPU").buffer_type()).unwrap();
        let graph = Graph::build(&mut ctx, &[s]).unwrap();
        let job = prepare("CPU", CpuFeatures::detect(), 1, &ctx, &graph)
            .unwrap()
            .unwrap();
        let flags: Vec<(rgml::OpKind, bool, bool)> = job
            .tasks
            .iter()
            .map(|t| (t.op.kind(), t.sync_before, t.reuse_src1))
            .collect();
        use rgml::OpKind::*;
        assert_eq!(
            flags,
            [
                (RmsNorm, true, false),
                (MulMat, true, false),
                (MulMat, false, true),
                // Reads both products: waits for them.
                (Add, true, false),
                // Independent of that sum: no barrier, and still the same converted src1.
                (MulMat, false, true),
                (Add, true, false),
            ]
        );
    }

    /// How [`recurrent_update`] ends its graph.
    #[derive(Clone, Copy, PartialEq)]
    enum Ending {
        /// The CPY of the new state alone reads it.
        Plain,
        /// The delta net's result is a graph output.
        Output,
        /// Another node also reads the new state.
        Reread,
    }

    /// GATED_DELTA_NET of 3 tokens over 2 heads of 16, its output view, and the CPY of its new
    /// state over the state it read (as the hybrid models' graphs write it), ended as `ending`
    /// says; returns the context (inputs set), its graph, the state and the output view.
    fn recurrent_update(ending: Ending) -> (Context, Graph, TensorId, TensorId) {
        let (s_v, h, n) = (16, 2, 3);
        let mut ctx = Context::new();
        let mut input = |ne: &[usize]| ctx.new_tensor(DType::F32, ne).unwrap();
        let (q, k, v) = (
            input(&[s_v, h, n, 1]),
            input(&[s_v, h, n, 1]),
            input(&[s_v, h, n, 1]),
        );
        let (g, beta) = (input(&[1, h, n, 1]), input(&[1, h, n, 1]));
        let state = input(&[s_v, s_v, h, 1]);
        let r = ctx.gated_delta_net(q, k, v, g, beta, state, 1).unwrap();
        let (out_len, len) = (s_v * h * n, s_v * s_v * h);
        let out = ctx.view(r, &[out_len], &[], 0).unwrap();
        let new_state = ctx.view(r, &[len], &[], out_len * 4).unwrap();
        let state_flat = ctx.view(state, &[len], &[], 0).unwrap();
        let store = ctx.cpy(new_state, state_flat).unwrap();
        // The output read on (a graph root would be an output).
        let mut roots = vec![ctx.sum_rows(out).unwrap(), store];
        match ending {
            Ending::Plain => {}
            Ending::Output => ctx.set_output(r).unwrap(),
            Ending::Reread => roots.push(ctx.sum_rows(new_state).unwrap()),
        }
        alloc_ctx_tensors(&mut ctx, &crate::CpuDevice::new("CPU").buffer_type()).unwrap();
        let mut seed = 7u32;
        for id in [q, k, v, g, beta, state] {
            let values: Vec<f32> = (0..ctx[id].nelements())
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
                })
                .collect();
            ctx.tensor_set_f32(id, &values).unwrap();
        }
        let graph = Graph::build(&mut ctx, &roots).unwrap();
        (ctx, graph, state, out)
    }

    /// The recurrent update runs as one task that writes the state in place, with the bits of
    /// the delta net and the copy run apart; not where anything else may read the new state.
    #[test]
    fn recurrent_state_updates_run_in_place() {
        let mut results = Vec::new();
        for ending in [Ending::Plain, Ending::Output, Ending::Reread] {
            let (ctx, graph, state, out) = recurrent_update(ending);
            let job = prepare("CPU", CpuFeatures::detect(), 2, &ctx, &graph)
                .unwrap()
                .unwrap();
            let kinds: Vec<(rgml::OpKind, bool)> = job
                .tasks
                .iter()
                .map(|t| (t.op.kind(), t.state_in_place))
                .collect();
            use rgml::OpKind::*;
            let fused = ending == Ending::Plain;
            assert_eq!(kinds[0], (GatedDeltaNet, fused));
            assert_eq!(kinds.iter().any(|k| k.0 == Cpy), !fused);
            let mut be = crate::CpuBackend::new(2).unwrap();
            be.graph_compute(&ctx, &graph).unwrap();
            let bits = |id| -> Vec<u32> {
                ctx.tensor_get_f32(id)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            results.push((bits(state), bits(out)));
        }
        assert!(results.iter().all(|r| *r == results[0]));
    }
}
