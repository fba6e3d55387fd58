//! The graph allocator (ggml's `ggml_gallocr`): places every intermediate tensor of a compute
//! graph in one buffer (or multi-buffer) per buffer type, reusing memory whose tensors are no longer needed.
//!
//! This module owns the liveness analysis (consumer and view counts per tensor), the in-place
//! decisions, the simulated best-fit allocator that measures the peak size per buffer type, and
//! the compute buffers it sizes. It never touches tensors that already have storage (weights,
//! KV caches, anything the caller placed): those are read, never moved or freed.
//!
//! How a graph is planned (as ggml does it):
//! 1. leafs get memory first, then graph inputs ([`TensorFlags::INPUT`]), so no node computed
//!    before an input's last consumer can overwrite what the caller wrote into it;
//! 2. nodes are walked in order; each node's sources get memory if they have none, then the node
//!    itself — in the memory of its `src0` when the op may run in place (see
//!    [`op_can_inplace`]) and nothing else needs `src0` afterwards;
//! 3. after a node, every source whose last consumer (and last view) it was is freed; a view
//!    keeps its source alive until the view's own consumers are done. Graph outputs
//!    ([`TensorFlags::OUTPUT`]) are never freed, nor the source of a view that is one.
//!
//! Buffer types with a maximum buffer size ([`BufferType::max_size`]): the simulated allocator
//! splits each buffer type's space into chunks of at most `max_size` bytes (ggml's approach); a
//! tensor never straddles two chunks, a request takes the best-fitting hole of any chunk, else
//! the tail of a chunk it still fits in, else a new chunk. A buffer type whose plan needs one
//! chunk gets one plain buffer; one that needs several gets a multi-buffer ([`Buffer::multi`])
//! with one part per chunk, and its tensors point at their part. Without a maximum size there
//! is only chunk 0 and the plan is exactly the unchunked one.
//!
//! [`BufferType::max_size`]: crate::backend::BufferType::max_size
//!
//! [`GraphAllocator::reserve`] runs that plan to measure the peak per buffer type and grows the
//! buffers if needed; [`GraphAllocator::alloc_graph`] applies the recorded plan, re-planning first
//! when the graph changed or no longer fits (ggml's `needs_realloc`).
//!
//! Deviations from ggml, and why:
//! - Only `src0` may be taken over in place (ggml tries every source): kernels then only need to
//!   tolerate `dst` aliasing `src0`, a smaller contract for backend authors.
//! - Inputs are never taken over in place, and in-place reuse never crosses buffer types: a
//!   tensor always lands in the buffer its buffer id names.
//! - A plan is reused only for the same graph structure (same node, leaf and source ids, flags,
//!   view sources, and unchanged in-place layouts); ggml only compares counts and sizes.
//! - A source that is a view the graph does not list (a graph made of a node range) keeps the
//!   view's source alive until it is read; ggml does not count such views.
//! - A tensor larger than its buffer type's `max_size` is an allocation error
//!   ([`Error::OutOfMemory`]); ggml gives it an oversized chunk of its own.
//!
//! Concurrency: a backend that runs several nodes at once must not see one node's output
//! placed in memory another concurrently running node still reads or writes. Given a
//! [`Concurrency`] plan ([`GraphAllocator::reserve_with_concurrency`]), frees collected per node
//! ([`Planner::release_sources`]) are applied by [`Planner::flush_frees`] only at the end of
//! each group, in-place reuse of a source that another node of the group reads is refused, and
//! the unused tail of an in-place parent is not returned early. Without a plan every node is its
//! own group and the plan is exactly the sequential one.

use crate::backend::Concurrency;
use crate::backend::{same_instance, Buffer, BufferTypeRef, BufferUsage};
use crate::context::Context;
use crate::error::{Error, GraphAllocError, Result};
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::{Tensor, TensorFlags, TensorId};
use std::collections::HashMap;
use std::sync::Arc;

/// Whether `op`'s kernels may write their result over `src0` when both have the same layout
/// (ggml's `ggml_op_can_inplace`, restricted to the ops rgml has). Backends must implement these
/// ops so that `dst` aliasing `src0` gives the right result.
pub fn op_can_inplace(op: &Op) -> bool {
    matches!(
        op,
        Op::Scale { .. }
            | Op::Clamp { .. }
            | Op::DiagMaskInf { .. }
            | Op::Add
            | Op::Sub
            | Op::Mul
            | Op::Div
            | Op::Unary(_)
            | Op::Swiglu
            | Op::Geglu
            | Op::SwigluOai { .. }
            | Op::Rope(_)
            | Op::RmsNorm { .. }
            | Op::Norm { .. }
            | Op::SoftMax { .. }
    )
}

/// A broken invariant of the allocator's own bookkeeping, as an error instead of a panic.
fn internal(msg: impl Into<String>) -> Error {
    GraphAllocError::Internal(msg.into()).into()
}

// ---------------------------------------------------------------------------------------------
// Simulated allocator.

/// A free byte range `[offset, offset + size)` in one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FreeBlock {
    offset: usize,
    size: usize,
}

/// One chunk of a [`DynAllocator`]: a range of at most the allocator's `max_chunk` bytes that
/// becomes one buffer (one part of a multi-buffer when there are several).
///
/// Everything at or above `top` is free; `free` holds the free holes below it, sorted by offset
/// and never adjacent to each other or to `top` (adjacent ranges are merged on free).
#[derive(Clone, Debug, Default)]
struct Chunk {
    free: Vec<FreeBlock>,
    top: usize,
    peak: usize,
}

impl Chunk {
    /// Take `size` bytes from hole `i`.
    fn take_hole(&mut self, i: usize, size: usize) -> usize {
        let block = &mut self.free[i];
        let offset = block.offset;
        block.offset += size;
        block.size -= size;
        if block.size == 0 {
            self.free.remove(i);
        }
        offset
    }

    /// Take `size` bytes from the free tail.
    fn take_top(&mut self, size: usize) -> usize {
        let offset = self.top;
        self.top += size;
        self.peak = self.peak.max(self.top);
        offset
    }

    /// Return `size` bytes at `offset`, merging with neighbouring free ranges.
    fn free(&mut self, offset: usize, size: usize, end: usize) {
        let pos = self.free.partition_point(|b| b.offset < offset);
        let merges_prev = pos > 0 && {
            let p = self.free[pos - 1];
            p.offset + p.size == offset
        };
        let merges_next = pos < self.free.len() && self.free[pos].offset == end;
        match (merges_prev, merges_next) {
            (true, true) => {
                let next = self.free.remove(pos);
                self.free[pos - 1].size += size + next.size;
            }
            (true, false) => self.free[pos - 1].size += size,
            (false, true) => {
                self.free[pos].offset = offset;
                self.free[pos].size += size;
            }
            (false, false) => self.free.insert(pos, FreeBlock { offset, size }),
        }
        // A hole that reaches the top is part of the free tail.
        if let Some(last) = self.free.last().copied() {
            if last.offset + last.size == self.top {
                self.top = last.offset;
                self.free.pop();
            }
        }
    }
}

/// Best-fit allocator over chunks of at most `max_chunk` bytes each (ggml's `ggml_dyn_tallocr`).
/// It hands out (chunk, offset) pairs only; each chunk's `peak` is the size of the buffer that
/// chunk needs. No allocation straddles two chunks.
///
/// With an unbounded `max_chunk` there is only ever chunk 0, and this is the plain best-fit
/// allocator: the smallest hole that fits, else the free tail. With a bound, a request goes to
/// (as ggml): the smallest hole that fits in any chunk (the lowest chunk on ties); else the tail
/// of a chunk it fits in below `max_chunk`, preferring one whose peak already covers it (the
/// least waste), then the one that grows least; else a new chunk.
#[derive(Clone, Debug)]
struct DynAllocator {
    alignment: usize,
    max_chunk: usize,
    chunks: Vec<Chunk>,
}

impl DynAllocator {
    fn new(alignment: usize, max_chunk: usize) -> Self {
        DynAllocator {
            alignment: alignment.max(1),
            max_chunk,
            chunks: vec![Chunk::default()],
        }
    }

    fn padded(&self, size: usize) -> Result<usize> {
        size.checked_next_multiple_of(self.alignment)
            .ok_or(Error::SizeOverflow)
    }

    /// Peak bytes of each chunk (at least one entry).
    fn peaks(&self) -> Vec<usize> {
        self.chunks.iter().map(|c| c.peak).collect()
    }

    /// `(chunk, offset)` of `size` fresh bytes, or `None` when the padded size exceeds the
    /// chunk limit. Offsets stay multiples of the alignment because every size is padded to it.
    fn alloc(&mut self, size: usize) -> Result<Option<(usize, usize)>> {
        let size = self.padded(size)?;
        if size == 0 {
            return Ok(Some((0, 0)));
        }
        if size > self.max_chunk {
            return Ok(None);
        }
        let best_hole = self
            .chunks
            .iter()
            .enumerate()
            .flat_map(|(c, ch)| ch.free.iter().enumerate().map(move |(i, b)| (c, i, b)))
            .filter(|(_, _, b)| b.size >= size)
            .min_by_key(|(_, _, b)| b.size)
            .map(|(c, i, _)| (c, i));
        if let Some((c, i)) = best_hole {
            return Ok(Some((c, self.chunks[c].take_hole(i, size))));
        }
        // The tail of a chunk: rank by (grows?, waste or growth), lowest chunk on ties.
        let best_tail = self
            .chunks
            .iter()
            .enumerate()
            .filter_map(|(c, ch)| {
                let end = ch.top.checked_add(size)?;
                (end <= self.max_chunk).then(|| {
                    if end <= ch.peak {
                        (c, (false, ch.peak - end))
                    } else {
                        (c, (true, end - ch.peak))
                    }
                })
            })
            .min_by_key(|&(_, rank)| rank)
            .map(|(c, _)| c);
        let c = match best_tail {
            Some(c) => c,
            None => {
                self.chunks.push(Chunk::default());
                self.chunks.len() - 1
            }
        };
        Ok(Some((c, self.chunks[c].take_top(size))))
    }

    /// Return `size` bytes at `offset` of `chunk`, merging with neighbouring free ranges.
    fn free(&mut self, chunk: usize, offset: usize, size: usize) -> Result<()> {
        let size = self.padded(size)?;
        if size == 0 {
            return Ok(());
        }
        let end = offset.checked_add(size).ok_or(Error::SizeOverflow)?;
        let ch = self
            .chunks
            .get_mut(chunk)
            .ok_or_else(|| internal(format!("free in chunk {chunk}, which does not exist")))?;
        ch.free(offset, size, end);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The plan.

/// Where the plan put a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Not placed by the allocator: a view (it takes its source's memory) or a tensor that had
    /// storage when the plan was made.
    NotOwned,
    /// `size` bytes at `offset` in chunk `chunk` of the buffer of `slot`.
    Own {
        slot: usize,
        chunk: usize,
        offset: usize,
        size: usize,
    },
}

/// What the plan knew about one tensor; a plan is reused only while these still hold.
///
/// A plan names tensors by their position in the context, not by their [`TensorId`]: a graph
/// rebuilt with the same structure (after a truncation, or in a fresh context) gets new ids at
/// the same positions and can reuse the plan.
#[derive(Clone, Debug)]
struct Record {
    flags: TensorFlags,
    view_src: Option<usize>,
    placement: Placement,
    /// The position of the `src0` whose memory this tensor took over in place.
    inplace_of: Option<usize>,
}

/// Tensor positions of `ids`.
fn positions(ids: &[TensorId]) -> Vec<usize> {
    ids.iter().map(|id| id.index()).collect()
}

/// The result of planning one graph (tensors named by position, see [`Record`]).
#[derive(Clone, Debug)]
struct Plan {
    nodes: Vec<usize>,
    node_srcs: Vec<Vec<usize>>,
    leafs: Vec<usize>,
    records: HashMap<usize, Record>,
    /// Peak bytes per chunk, per slot (at least one chunk each).
    peaks: Vec<Vec<usize>>,
    /// Whether any tensor is placed in each slot (zero-size tensors still need a buffer).
    used: Vec<bool>,
    node_buffer_ids: Vec<usize>,
    leaf_buffer_ids: Vec<usize>,
    /// The concurrency plan it was made with.
    concurrency: Option<Concurrency>,
}

impl Plan {
    /// Same node, leaf and source ids, flags and view sources as when the plan was made.
    fn same_structure(&self, ctx: &Context, graph: &Graph) -> bool {
        if self.nodes != positions(graph.nodes()) || self.leafs != positions(graph.leafs()) {
            return false;
        }
        for (&node, srcs) in graph.nodes().iter().zip(&self.node_srcs) {
            let Ok(t) = ctx.get(node) else { return false };
            if positions(&t.src) != *srcs {
                return false;
            }
        }
        graph_tensors(ctx, graph).all(|id| {
            let (Ok(t), Some(rec)) = (ctx.get(id), self.records.get(&id.index())) else {
                return false;
            };
            rec.flags == t.flags && rec.view_src == t.view_src.map(TensorId::index)
        })
    }
}

/// Every tensor a graph touches: leafs, nodes and node sources (with repeats).
fn graph_tensors<'a>(ctx: &'a Context, graph: &'a Graph) -> impl Iterator<Item = TensorId> + 'a {
    graph
        .leafs()
        .iter()
        .copied()
        .chain(graph.nodes().iter().flat_map(move |&n| {
            let srcs = ctx.get(n).map(|t| t.src.as_slice()).unwrap_or(&[]);
            srcs.iter().copied().chain(std::iter::once(n))
        }))
}

/// Liveness and placement of one tensor while planning.
#[derive(Clone, Debug, Default)]
struct TensorState {
    /// Nodes that read this tensor and have not run yet.
    n_children: usize,
    /// Graph views of this tensor whose consumers have not all run yet.
    n_views: usize,
    /// Whether this view is a graph node (and so counted in its source's `n_views`).
    listed_view: bool,
    /// Whether this view still holds its count in its source's `n_views`.
    counted_view: bool,
    /// Whether the tensor got its placement (own memory or taken over in place).
    planned: bool,
    /// A graph output, or the source of a view that is one: its bytes are never freed nor
    /// taken over in place.
    kept: bool,
    /// Whether the allocator currently holds memory for it (false once freed or handed over).
    owned: bool,
    slot: usize,
    chunk: usize,
    offset: usize,
    size: usize,
    inplace_of: Option<TensorId>,
}

/// One planning run over one graph.
struct Planner<'a> {
    ctx: &'a Context,
    slot_types: &'a [BufferTypeRef],
    slot_of: &'a [usize],
    allocs: Vec<DynAllocator>,
    used: Vec<bool>,
    state: Vec<TensorState>,
    pending_free: Vec<TensorId>,
    /// With a concurrency plan: tensors (and their view sources) read by the nodes of the
    /// current group planned so far, which no later node of the group may overwrite in place.
    group_reads: Option<std::collections::HashSet<TensorId>>,
}

impl<'a> Planner<'a> {
    fn new(ctx: &'a Context, slot_types: &'a [BufferTypeRef], slot_of: &'a [usize]) -> Self {
        Planner {
            ctx,
            slot_types,
            slot_of,
            allocs: slot_types
                .iter()
                .map(|bt| DynAllocator::new(bt.alignment(), bt.max_size()))
                .collect(),
            used: vec![false; slot_types.len()],
            state: vec![TensorState::default(); ctx.len()],
            pending_free: Vec::new(),
            group_reads: None,
        }
    }

    fn st(&mut self, id: TensorId) -> Result<&mut TensorState> {
        self.state
            .get_mut(id.index())
            .ok_or(Error::InvalidTensor(id.index()))
    }

    fn slot(&self, buffer_id: usize) -> Result<usize> {
        self.slot_of.get(buffer_id).copied().ok_or_else(|| {
            Error::from(GraphAllocError::BufferIdOutOfRange {
                what: "buffer",
                index: buffer_id,
                buffer_id,
                n_buffer_types: self.slot_of.len(),
            })
        })
    }

    fn alloc_size(&self, slot: usize, t: &Tensor) -> usize {
        self.slot_types[slot].alloc_size(t)
    }

    fn run(
        &mut self,
        graph: &Graph,
        node_ids: &[usize],
        leaf_ids: &[usize],
        concurrency: Option<&Concurrency>,
    ) -> Result<()> {
        let ctx = self.ctx;
        if concurrency.is_some() {
            self.group_reads = Some(Default::default());
        }
        let bid = |ids: &[usize], i: usize| ids.get(i).copied().unwrap_or(0);

        // Leafs first: the caller may fill them before compute, so no node may use their memory
        // until their last consumer has run.
        for (i, &leaf) in graph.leafs().iter().enumerate() {
            self.allocate(leaf, bid(leaf_ids, i))?;
        }

        // Count consumers and views; give inputs memory before any node for the same reason.
        for (i, &node) in graph.nodes().iter().enumerate() {
            let t = ctx.get(node)?;
            if t.flags.contains(TensorFlags::OUTPUT) {
                self.st(node)?.kept = true;
                if let Some(root) = t.view_src {
                    self.st(root)?.kept = true;
                }
            }
            if let (Some(root), false) = (t.view_src, t.op == Op::None) {
                self.st(root)?.n_views += 1;
                let st = self.st(node)?;
                st.listed_view = true;
                st.counted_view = true;
            }
            if t.flags.contains(TensorFlags::INPUT) {
                self.allocate(node, bid(node_ids, i))?;
            }
            for &src in &t.src {
                self.st(src)?.n_children += 1;
                // A source that is a view the graph does not list (e.g. a graph made of a node
                // range): ggml would never count it and could free its memory too early, so the
                // read counts against the view's source instead.
                if let Some(root) = ctx.get(src)?.view_src {
                    if !self.st(src)?.listed_view {
                        self.st(root)?.n_children += 1;
                    }
                }
                if ctx.get(src)?.flags.contains(TensorFlags::INPUT) {
                    self.allocate(src, bid(node_ids, i))?;
                }
            }
        }

        for (i, &node) in graph.nodes().iter().enumerate() {
            let b = bid(node_ids, i);
            for &src in &ctx.get(node)?.src {
                self.allocate(src, b)?;
            }
            self.allocate(node, b)?;
            self.release_sources(node)?;
            if let Some(reads) = self.group_reads.as_mut() {
                for &src in &ctx.get(node)?.src {
                    reads.insert(src);
                    if let Some(root) = ctx.get(src)?.view_src {
                        reads.insert(root);
                    }
                }
            }
            // Memory freed inside a group stays taken until the group ends, so no other node
            // of the group can be placed in it while the freeing node may still run.
            if concurrency.is_none_or(|c| c.is_group_end(i)) {
                self.flush_frees()?;
                if let Some(reads) = self.group_reads.as_mut() {
                    reads.clear();
                }
            }
        }
        Ok(())
    }

    /// Give `id` memory in buffer `buffer_id` unless it has storage or already has its place; a
    /// view gets none itself, its source is allocated instead (ggml's
    /// `ggml_gallocr_allocate_node`).
    fn allocate(&mut self, id: TensorId, buffer_id: usize) -> Result<()> {
        let t = self.ctx.get(id)?;
        if t.data.is_some() || self.st(id)?.planned {
            return Ok(());
        }
        if let Some(root) = t.view_src {
            // Views use their source's memory; make sure the source has some even when the graph
            // does not list it (ggml relies on it being a source of the view).
            return self.allocate(root, buffer_id);
        }
        let slot = self.slot(buffer_id)?;
        self.used[slot] = true;
        if let Some((parent, owner)) = self.inplace_parent(id, slot)? {
            let p = self.st(owner)?.clone();
            let size = self.alloc_size(slot, t);
            {
                let st = self.st(id)?;
                st.planned = true;
                st.owned = true;
                st.slot = p.slot;
                st.chunk = p.chunk;
                st.offset = p.offset;
                st.size = size;
                st.inplace_of = Some(parent);
            }
            // The node now owns the memory; the parent must not free it again.
            self.st(owner)?.owned = false;
            self.st(parent)?.owned = false;
            // Return the tail if the node needs less than the parent had (ggml's
            // `free_extra_space`), keeping the freed range aligned. Not with a concurrency
            // plan: the tail would be reusable at once, inside the group.
            let alloc = &mut self.allocs[p.slot];
            let (old, new) = (alloc.padded(p.size)?, alloc.padded(size)?);
            if old > new && self.group_reads.is_none() {
                alloc.free(p.chunk, p.offset + new, old - new)?;
            }
            return Ok(());
        }
        let size = self.alloc_size(slot, t);
        let Some((chunk, offset)) = self.allocs[slot].alloc(size)? else {
            return Err(Error::OutOfMemory {
                buffer_type: self.slot_types[slot].name().to_string(),
                size,
                reason: "a tensor is larger than the buffer type's maximum buffer size",
            });
        };
        let st = self.st(id)?;
        st.planned = true;
        st.owned = true;
        st.slot = slot;
        st.chunk = chunk;
        st.offset = offset;
        st.size = size;
        Ok(())
    }

    /// The `src0` (and the tensor that owns its memory: itself, or its view source) whose memory
    /// node `id` may take over, following ggml's rules.
    fn inplace_parent(
        &mut self,
        id: TensorId,
        slot: usize,
    ) -> Result<Option<(TensorId, TensorId)>> {
        let ctx = self.ctx;
        let t = ctx.get(id)?;
        // An input's bytes come from the caller, never from a source.
        if !op_can_inplace(&t.op) || t.flags.contains(TensorFlags::INPUT) {
            return Ok(None);
        }
        let Some(&parent) = t.src.first() else {
            return Ok(None);
        };
        let p = ctx.get(parent)?;
        let pinned = |x: &Tensor, kept: bool| {
            kept || x.flags.contains(TensorFlags::OUTPUT) || x.flags.contains(TensorFlags::INPUT)
        };
        if pinned(p, self.st(parent)?.kept) || !t.same_layout(p) {
            return Ok(None);
        }
        // Another node of the current group reads the parent (or its view source): it may run
        // at the same time, so the parent's memory must stay as it is.
        if let Some(reads) = &self.group_reads {
            if reads.contains(&parent) || p.view_src.is_some_and(|r| reads.contains(&r)) {
                return Ok(None);
            }
        }
        let ps = self.st(parent)?.clone();
        // This node must be the parent's only reader, and nothing may view the parent.
        if ps.n_children != 1 || ps.n_views != 0 {
            return Ok(None);
        }
        let owner = match p.view_src {
            None => parent,
            Some(root) => {
                let r = ctx.get(root)?;
                let rs = self.st(root)?.clone();
                // The view must be the source's only view, start at its first byte, and the
                // source must have no readers of its own left.
                if pinned(r, rs.kept) || p.view_offset != 0 || rs.n_views != 1 || rs.n_children != 0
                {
                    return Ok(None);
                }
                root
            }
        };
        let os = self.st(owner)?.clone();
        // External memory (weights, caches) is never reused, nor memory of another buffer type.
        if !os.owned || os.slot != slot {
            return Ok(None);
        }
        if self.alloc_size(slot, t) > os.size {
            return Ok(None);
        }
        Ok(Some((parent, owner)))
    }

    /// Count `node` as done for each of its sources; queue those whose last reader it was.
    fn release_sources(&mut self, node: TensorId) -> Result<()> {
        let ctx = self.ctx;
        for &src in &ctx.get(node)?.src {
            let st = self.st(src)?;
            st.n_children = st.n_children.saturating_sub(1);
            let done = st.n_children == 0 && st.n_views == 0;
            let (owned, listed, counted) = (st.owned, st.listed_view, st.counted_view);
            match ctx.get(src)?.view_src {
                // A view the graph does not list: the read counted against its source directly.
                Some(root) if !listed => {
                    let rs = self.st(root)?;
                    rs.n_children = rs.n_children.saturating_sub(1);
                    if rs.n_children == 0 && rs.n_views == 0 && rs.owned {
                        self.pending_free.push(root);
                    }
                }
                // Free the view's source once its last view and last reader are done.
                Some(root) if done && counted => {
                    self.st(src)?.counted_view = false;
                    let rs = self.st(root)?;
                    rs.n_views = rs.n_views.saturating_sub(1);
                    if rs.n_views == 0 && rs.n_children == 0 && rs.owned {
                        self.pending_free.push(root);
                    }
                }
                None if done && owned => self.pending_free.push(src),
                _ => {}
            }
        }
        Ok(())
    }

    /// Return the memory of queued tensors (outputs and the sources of output views are kept).
    fn flush_frees(&mut self) -> Result<()> {
        let ctx = self.ctx;
        for id in std::mem::take(&mut self.pending_free) {
            let output = ctx.get(id)?.flags.contains(TensorFlags::OUTPUT);
            let st = self.st(id)?;
            if output || st.kept || !st.owned {
                continue;
            }
            st.owned = false;
            let (slot, chunk, offset, size) = (st.slot, st.chunk, st.offset, st.size);
            self.allocs[slot].free(chunk, offset, size)?;
        }
        Ok(())
    }

    fn into_plan(
        mut self,
        graph: &Graph,
        node_buffer_ids: Vec<usize>,
        leaf_buffer_ids: Vec<usize>,
        concurrency: Option<Concurrency>,
    ) -> Result<Plan> {
        let ctx = self.ctx;
        let mut records = HashMap::new();
        let touched: Vec<TensorId> = graph_tensors(ctx, graph)
            .chain(
                ctx.ids()
                    .filter(|id| self.state.get(id.index()).is_some_and(|s| s.planned)),
            )
            .collect();
        for id in touched {
            let t = ctx.get(id)?;
            let st = self.st(id)?;
            let placement = if st.planned {
                Placement::Own {
                    slot: st.slot,
                    chunk: st.chunk,
                    offset: st.offset,
                    size: st.size,
                }
            } else {
                Placement::NotOwned
            };
            records.insert(
                id.index(),
                Record {
                    flags: t.flags,
                    view_src: t.view_src.map(TensorId::index),
                    placement,
                    inplace_of: st.inplace_of.map(TensorId::index),
                },
            );
        }
        let mut node_srcs = Vec::with_capacity(graph.n_nodes());
        for &n in graph.nodes() {
            node_srcs.push(positions(&ctx.get(n)?.src));
        }
        Ok(Plan {
            nodes: positions(graph.nodes()),
            node_srcs,
            leafs: positions(graph.leafs()),
            records,
            peaks: self.allocs.iter().map(|a| a.peaks()).collect(),
            used: self.used,
            node_buffer_ids,
            leaf_buffer_ids,
            concurrency,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The allocator.

/// Allocates compute graphs into one buffer per buffer type (a multi-buffer when the buffer
/// type's maximum size needs several chunks), reusing the memory of tensors that
/// are no longer needed (ggml's `ggml_gallocr`).
///
/// Typical use: [`reserve`](Self::reserve) once with the largest graph (e.g. a full batch) so the
/// buffers are sized up front, then [`alloc_graph`](Self::alloc_graph) for every graph to run.
pub struct GraphAllocator {
    buffer_types: Vec<BufferTypeRef>,
    /// Buffer type index → slot; a buffer type given twice shares one slot and one buffer.
    slot_of: Vec<usize>,
    slot_types: Vec<BufferTypeRef>,
    buffers: Vec<Option<Arc<Buffer>>>,
    plan: Option<Plan>,
}

impl std::fmt::Debug for GraphAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphAllocator")
            .field(
                "buffer_types",
                &self
                    .buffer_types
                    .iter()
                    .map(|b| b.name())
                    .collect::<Vec<_>>(),
            )
            .field("buffers", &self.buffers)
            .field("planned", &self.plan.is_some())
            .finish()
    }
}

impl GraphAllocator {
    /// An allocator for graphs whose tensors go to `buffer_types` (buffer id `i` is
    /// `buffer_types[i]`). No memory is allocated until a reserve or a graph allocation.
    pub fn new(buffer_types: Vec<BufferTypeRef>) -> Self {
        let mut slot_of = Vec::with_capacity(buffer_types.len());
        let mut slot_types: Vec<BufferTypeRef> = Vec::new();
        for bt in &buffer_types {
            match slot_types.iter().position(|s| same_instance(s, bt)) {
                Some(slot) => slot_of.push(slot),
                None => {
                    slot_of.push(slot_types.len());
                    slot_types.push(bt.clone());
                }
            }
        }
        let buffers = vec![None; slot_types.len()];
        GraphAllocator {
            buffer_types,
            slot_of,
            slot_types,
            buffers,
            plan: None,
        }
    }

    /// Number of buffer types (valid buffer ids are `0..n`).
    pub fn n_buffer_types(&self) -> usize {
        self.buffer_types.len()
    }

    /// Measure `graph` with every tensor in buffer type 0 and grow the buffer if it is too small.
    pub fn reserve(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        self.reserve_with(ctx, graph, &[], &[])
    }

    /// Measure `graph` with node `i` in buffer type `node_buffer_ids[i]` and leaf `i` in
    /// `leaf_buffer_ids[i]` (an empty slice means all 0), then grow every buffer that is smaller
    /// than its measured peak. Buffers never shrink. The plan is kept for
    /// [`alloc_graph`](Self::alloc_graph).
    pub fn reserve_with(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        node_buffer_ids: &[usize],
        leaf_buffer_ids: &[usize],
    ) -> Result<()> {
        self.reserve_with_concurrency(ctx, graph, node_buffer_ids, leaf_buffer_ids, None)
    }

    /// As [`reserve_with`](Self::reserve_with), honouring `concurrency` (see the module docs):
    /// nodes of one group never get each other's memory or memory another node of the group
    /// reads. The plan must cover exactly the graph's nodes. [`alloc_graph`](Self::alloc_graph)
    /// keeps using it when it re-plans the same graph structure.
    pub fn reserve_with_concurrency(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        node_buffer_ids: &[usize],
        leaf_buffer_ids: &[usize],
        concurrency: Option<&Concurrency>,
    ) -> Result<()> {
        self.plan = None;
        let plan = self.make_plan(ctx, graph, node_buffer_ids, leaf_buffer_ids, concurrency)?;
        for slot in 0..self.slot_types.len() {
            let current = self.buffers[slot].as_deref().map(chunk_sizes);
            let needed = &plan.peaks[slot];
            let grow = match &current {
                Some(sizes) => {
                    needed.len() > sizes.len() || needed.iter().zip(sizes).any(|(n, s)| n > s)
                }
                None => plan.used[slot],
            };
            if grow {
                // Drop the old buffer first so its memory can be reused (tensors placed in it by
                // an earlier graph keep it alive through their own references). Chunks never
                // shrink: each part is at least as large as before.
                self.buffers[slot] = None;
                let current = current.unwrap_or_default();
                let mut parts = Vec::with_capacity(needed.len().max(current.len()));
                for c in 0..needed.len().max(current.len()) {
                    let size = needed.get(c).copied().unwrap_or(0);
                    let size = size.max(current.get(c).copied().unwrap_or(0));
                    parts.push(Buffer::alloc(&self.slot_types[slot], size)?);
                }
                let buffer = match parts.len() {
                    1 => parts
                        .pop()
                        .ok_or_else(|| internal("no chunk to allocate"))?,
                    _ => Buffer::multi(parts)?,
                };
                buffer.set_usage(BufferUsage::Compute);
                self.buffers[slot] = Some(buffer);
            }
        }
        self.plan = Some(plan);
        Ok(())
    }

    /// The peak bytes per buffer type that `graph` needs, without allocating anything or
    /// changing the reserved plan (ggml's `reserve_n_size`). Duplicate buffer types report 0
    /// after their first occurrence.
    pub fn measure_with(
        &self,
        ctx: &Context,
        graph: &Graph,
        node_buffer_ids: &[usize],
        leaf_buffer_ids: &[usize],
    ) -> Result<Vec<usize>> {
        let plan = self.make_plan(ctx, graph, node_buffer_ids, leaf_buffer_ids, None)?;
        Ok((0..self.buffer_types.len())
            .map(|i| {
                self.first_of_slot(i)
                    .map_or(0, |s| plan.peaks[s].iter().sum())
            })
            .collect())
    }

    /// Give storage to every node and leaf of `graph` (and every node source) that has none:
    /// views are pointed at their source, other tensors at their planned place. Tensors that
    /// already have storage are left alone. Re-plans (and grows buffers) first when the graph
    /// differs from the reserved one or does not fit; with several buffer types that only works
    /// for the graph structure last reserved, otherwise call
    /// [`reserve_with`](Self::reserve_with) first.
    pub fn alloc_graph(&mut self, ctx: &mut Context, graph: &Graph) -> Result<()> {
        check_graph(ctx, graph)?;
        if self.needs_realloc(ctx, graph) {
            let ids = match &self.plan {
                Some(p) if p.same_structure(ctx, graph) => Some((
                    p.node_buffer_ids.clone(),
                    p.leaf_buffer_ids.clone(),
                    p.concurrency.clone(),
                )),
                _ if self.buffer_types.len() <= 1 => Some((Vec::new(), Vec::new(), None)),
                _ => None,
            };
            let Some((node_ids, leaf_ids, concurrency)) = ids else {
                return Err(GraphAllocError::NeedsBufferIds.into());
            };
            self.reserve_with_concurrency(ctx, graph, &node_ids, &leaf_ids, concurrency.as_ref())?;
        }
        let plan = self
            .plan
            .as_ref()
            .ok_or_else(|| internal("no plan after reserve"))?;
        for buffer in self.buffers.iter().flatten() {
            buffer.reset();
        }
        for &leaf in graph.leafs() {
            place(ctx, plan, &self.buffers, leaf)?;
        }
        for &node in graph.nodes() {
            let srcs = ctx.get(node)?.src.clone();
            for src in srcs {
                place(ctx, plan, &self.buffers, src)?;
            }
            place(ctx, plan, &self.buffers, node)?;
        }
        Ok(())
    }

    /// Whether [`alloc_graph`](Self::alloc_graph) would have to re-plan `graph`: no plan yet, a
    /// different structure, a tensor that now needs memory the plan did not give it, or a tensor
    /// larger than its planned room.
    pub fn needs_realloc(&self, ctx: &Context, graph: &Graph) -> bool {
        let Some(plan) = &self.plan else { return true };
        if !plan.same_structure(ctx, graph) {
            return true;
        }
        !graph_tensors(ctx, graph).all(|id| {
            let (Ok(t), Some(rec)) = (ctx.get(id), plan.records.get(&id.index())) else {
                return false;
            };
            if let Some(parent) = rec.inplace_of {
                // An in-place pair is only valid while the layouts still match.
                let parent = ctx.id_at(parent).and_then(|p| ctx.get(p).ok());
                if parent.is_none_or(|p| !t.same_layout(p)) {
                    return false;
                }
            }
            if t.data.is_some() || t.view_src.is_some() {
                return true;
            }
            match rec.placement {
                Placement::NotOwned => false,
                Placement::Own {
                    slot,
                    chunk,
                    offset,
                    size,
                } => self.buffers[slot]
                    .as_ref()
                    .and_then(|b| chunk_part(b, chunk))
                    .is_some_and(|part| {
                        let need = self.slot_types[slot].alloc_size(t);
                        need <= size && offset + need <= part.size()
                    }),
            }
        })
    }

    fn first_of_slot(&self, buffer_id: usize) -> Option<usize> {
        let slot = *self.slot_of.get(buffer_id)?;
        (self.slot_of.iter().position(|&s| s == slot) == Some(buffer_id)).then_some(slot)
    }

    /// Size of the buffer of buffer type `buffer_id`, the total over all parts of a multi-buffer
    /// (0 before any allocation, for an id out of
    /// range, and for a buffer type listed again after its first occurrence, which shares the
    /// first one's buffer — so summing over ids counts each buffer once).
    pub fn buffer_size(&self, buffer_id: usize) -> usize {
        self.first_of_slot(buffer_id)
            .and_then(|s| self.buffers[s].as_ref())
            .map_or(0, |b| b.size())
    }

    /// Peak bytes the last reserved plan measured for buffer type `buffer_id`, summed over its
    /// chunks (0 as for
    /// [`buffer_size`](Self::buffer_size)).
    pub fn peak_size(&self, buffer_id: usize) -> usize {
        match (&self.plan, self.first_of_slot(buffer_id)) {
            (Some(plan), Some(slot)) => plan.peaks[slot].iter().sum(),
            _ => 0,
        }
    }

    /// The buffer that holds tensors of buffer type `buffer_id`, once allocated: a multi-buffer
    /// when the plan needed several chunks (its tensors then point at its parts).
    pub fn buffer(&self, buffer_id: usize) -> Option<&Arc<Buffer>> {
        let slot = *self.slot_of.get(buffer_id)?;
        self.buffers[slot].as_ref()
    }

    /// The concurrency plan the current plan was made with, if any.
    pub fn concurrency(&self) -> Option<&Concurrency> {
        self.plan.as_ref().and_then(|p| p.concurrency.as_ref())
    }

    fn make_plan(
        &self,
        ctx: &Context,
        graph: &Graph,
        node_buffer_ids: &[usize],
        leaf_buffer_ids: &[usize],
        concurrency: Option<&Concurrency>,
    ) -> Result<Plan> {
        check_graph(ctx, graph)?;
        self.check_ids("node", node_buffer_ids, graph.n_nodes())?;
        self.check_ids("leaf", leaf_buffer_ids, graph.leafs().len())?;
        if let Some(c) = concurrency {
            if c.n_nodes() != graph.n_nodes() {
                return Err(GraphAllocError::BadConcurrencyPlan(format!(
                    "it covers {} nodes, the graph has {}",
                    c.n_nodes(),
                    graph.n_nodes()
                ))
                .into());
            }
        }
        let mut planner = Planner::new(ctx, &self.slot_types, &self.slot_of);
        planner.run(graph, node_buffer_ids, leaf_buffer_ids, concurrency)?;
        planner.into_plan(
            graph,
            node_buffer_ids.to_vec(),
            leaf_buffer_ids.to_vec(),
            concurrency.cloned(),
        )
    }

    fn check_ids(&self, what: &'static str, ids: &[usize], expected: usize) -> Result<()> {
        if !ids.is_empty() && ids.len() != expected {
            return Err(GraphAllocError::BufferIdCount {
                what,
                given: ids.len(),
                expected,
            }
            .into());
        }
        if let Some((i, &b)) = ids
            .iter()
            .enumerate()
            .find(|(_, &b)| b >= self.buffer_types.len())
        {
            return Err(GraphAllocError::BufferIdOutOfRange {
                what,
                index: i,
                buffer_id: b,
                n_buffer_types: self.buffer_types.len(),
            }
            .into());
        }
        Ok(())
    }
}

/// Every tensor the graph lists must be in `ctx`.
fn check_graph(ctx: &Context, graph: &Graph) -> Result<()> {
    for &id in graph.nodes().iter().chain(graph.leafs()) {
        ctx.get(id)?;
    }
    Ok(())
}

/// Sizes of the chunks a slot's buffer provides: its parts if it is a multi-buffer, else itself.
fn chunk_sizes(buffer: &Buffer) -> Vec<usize> {
    if buffer.is_multi() {
        buffer.parts().iter().map(|p| p.size()).collect()
    } else {
        vec![buffer.size()]
    }
}

/// The buffer that holds chunk `chunk` of a slot's buffer: a part of a multi-buffer, or the
/// buffer itself for chunk 0 of a plain one.
fn chunk_part(buffer: &Arc<Buffer>, chunk: usize) -> Option<Arc<Buffer>> {
    if buffer.is_multi() {
        buffer.parts().get(chunk).cloned()
    } else {
        (chunk == 0).then(|| buffer.clone())
    }
}

/// Apply the plan to tensor `id` if it has no storage yet.
fn place(
    ctx: &mut Context,
    plan: &Plan,
    buffers: &[Option<Arc<Buffer>>],
    id: TensorId,
) -> Result<()> {
    let t = ctx.get(id)?;
    if t.data.is_some() {
        return Ok(());
    }
    if let Some(root) = t.view_src {
        if ctx.get(root)?.data.is_none() {
            place(ctx, plan, buffers, root)?;
        }
        return ctx.init_view(id);
    }
    let name = t.display_name().to_string();
    match plan.records.get(&id.index()).map(|r| r.placement) {
        Some(Placement::Own {
            slot,
            chunk,
            offset,
            ..
        }) => {
            let buffer = buffers
                .get(slot)
                .and_then(|b| b.as_ref())
                .and_then(|b| chunk_part(b, chunk))
                .ok_or_else(|| internal(format!("no buffer for tensor '{name}'")))?;
            ctx.set_data(id, buffer, offset)
        }
        _ => Err(GraphAllocError::NoPlacement(name.to_string()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offset of an allocation that must land in chunk 0.
    fn alloc0(a: &mut DynAllocator, size: usize) -> usize {
        let (c, off) = a.alloc(size).unwrap().unwrap();
        assert_eq!(c, 0);
        off
    }

    #[test]
    fn best_fit_merges_and_tracks_peak() {
        let mut a = DynAllocator::new(32, usize::MAX);
        let x = alloc0(&mut a, 10); // 32 bytes
        let y = alloc0(&mut a, 100); // 128
        let z = alloc0(&mut a, 64); // 64
        assert_eq!((x, y, z), (0, 32, 160));
        assert_eq!(a.peaks(), vec![224]);
        a.free(0, x, 10).unwrap();
        // A 32-byte request takes the 32-byte hole, not the top.
        assert_eq!(alloc0(&mut a, 1), 0);
        a.free(0, 0, 32).unwrap();
        a.free(0, y, 100).unwrap();
        // The two holes merged into one of 160 bytes.
        assert_eq!(
            a.chunks[0].free,
            vec![FreeBlock {
                offset: 0,
                size: 160
            }]
        );
        // Freeing the top block merges everything into the free tail.
        a.free(0, z, 64).unwrap();
        assert!(a.chunks[0].free.is_empty());
        assert_eq!(a.chunks[0].top, 0);
        assert_eq!(a.peaks(), vec![224]);
        // Best fit: among holes of 64 and 32, a 20-byte request takes the 32 one.
        let p = alloc0(&mut a, 64);
        let q = alloc0(&mut a, 32);
        let r = alloc0(&mut a, 32);
        let s = alloc0(&mut a, 32);
        a.free(0, p, 64).unwrap();
        a.free(0, r, 32).unwrap();
        assert_eq!(alloc0(&mut a, 20), r);
        let _ = (q, s);
        assert_eq!(alloc0(&mut a, 0), 0);
        assert_eq!(a.chunks.len(), 1);
    }

    #[test]
    fn chunks_hold_at_most_max_chunk_and_reuse_holes_first() {
        let mut a = DynAllocator::new(32, 256);
        assert_eq!(a.alloc(200).unwrap(), Some((0, 0))); // 224 bytes
                                                         // 64 bytes do not fit in chunk 0's tail (224 + 64 > 256): a new chunk.
        assert_eq!(a.alloc(64).unwrap(), Some((1, 0)));
        // 32 bytes: both tails would grow by 32; the lowest chunk wins the tie.
        assert_eq!(a.alloc(32).unwrap(), Some((0, 224)));
        assert_eq!(a.peaks(), vec![256, 64]);
        // A hole anywhere beats a tail.
        a.free(0, 0, 200).unwrap();
        assert_eq!(a.alloc(100).unwrap(), Some((0, 0)));
        // Larger than a chunk: refused.
        assert_eq!(a.alloc(257).unwrap(), None);
        assert_eq!(a.alloc(256).unwrap(), Some((2, 0)));
        // A tail that fits under a chunk's peak is preferred to one that grows another chunk.
        assert_eq!(a.alloc(96).unwrap(), Some((0, 128))); // the 96-byte hole left in chunk 0
        a.free(2, 0, 256).unwrap();
        assert_eq!(a.alloc(64).unwrap(), Some((2, 0)));
        assert_eq!(a.peaks(), vec![256, 64, 256]);
        assert!(a.peaks().iter().all(|&p| p <= 256));
    }
}
