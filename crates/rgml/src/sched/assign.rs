//! Backend assignment: which backend computes each tensor of a graph (ggml's passes 1–4 of
//! `ggml_backend_sched_split_graph`).
//!
//! This module only decides; it never creates tensors or touches storage. It works on the
//! scheduler's own copy of the graph (see the parent module), indexed by that context's ids.

use crate::backend::{Backend, BufferTypeRef};
use crate::context::Context;
use crate::error::{Result, SchedError};
use crate::op::Op;
use crate::tensor::TensorData;
use crate::tensor::{TensorFlags, TensorId};

/// Whether a node only describes memory (no kernel runs for it): ggml's `ggml_is_view_op`
/// (plus nodes without an op, such as parameters).
pub(crate) fn is_view_op(op: &Op) -> bool {
    op.kind().is_view()
}

/// The storage that decides where a tensor lives: its view source's, else its own.
pub(crate) fn root_data(ctx: &Context, id: TensorId) -> Option<&TensorData> {
    let t = &ctx[id];
    t.view_src
        .and_then(|root| ctx[root].data.as_ref())
        .or(t.data.as_ref())
}

/// Per-tensor backend ids over one context, and the passes that fill them.
pub(crate) struct Assigner<'a> {
    pub backends: &'a [Box<dyn Backend>],
    pub bufts: &'a [BufferTypeRef],
    pub ctx: &'a Context,
    pub op_offload: bool,
    /// Backend of each tensor, by index in `ctx`.
    pub ids: Vec<Option<usize>>,
    /// Tensors the user placed: no pass moves them.
    pub pinned: Vec<bool>,
}

impl<'a> Assigner<'a> {
    fn last(&self) -> usize {
        self.backends.len() - 1
    }

    fn get(&self, id: TensorId) -> Option<usize> {
        self.ids.get(id.index()).copied().flatten()
    }

    fn set(&mut self, id: TensorId, b: usize) {
        if let Some(slot) = self.ids.get_mut(id.index()) {
            *slot = Some(b);
        }
    }

    fn supports_op(&self, b: usize, id: TensorId) -> bool {
        self.backends[b].supports_op(self.ctx, id)
    }

    /// The highest-priority backend that can use the memory `t` lives in and can run `op`
    /// (ggml's `ggml_backend_sched_backend_from_buffer`).
    fn backend_from_buffer(&self, t: TensorId, op: TensorId) -> Option<usize> {
        let data = root_data(self.ctx, t)?;
        let buft = data.buffer.buffer_type();
        (0..self.backends.len())
            .find(|&b| self.backends[b].supports_buffer_type(buft) && self.supports_op(b, op))
    }

    /// Whether backend `b` can read `t` where it is, or where its assigned backend will put it
    /// (ggml's `ggml_backend_sched_buffer_supported`).
    pub fn buffer_supported(&self, t: TensorId, b: usize) -> bool {
        buffer_supported(self.ctx, &self.ids, self.backends, self.bufts, t, b)
    }

    /// Pass 1 for one tensor (ggml's `ggml_backend_sched_backend_id_from_cur`).
    fn backend_from_cur(&self, id: TensorId) -> Result<Option<usize>> {
        let t = &self.ctx[id];
        if let Some(b) = self.backend_from_buffer(id, id) {
            return Ok(Some(b));
        }
        if let Some(data) = root_data(self.ctx, id) {
            // Pre-allocated memory cannot move, and no backend that can use it runs this op.
            return Err(SchedError::MemoryUnusable {
                tensor: t.display_name().to_string(),
                op: t.op.kind(),
                buffer_type: data.buffer.buffer_type().name().to_string(),
            }
            .into());
        }
        if t.flags.contains(TensorFlags::INPUT) {
            return Ok(Some(self.last()));
        }
        // Ops reading weights run where the weights are (rope's frequency factors are too small
        // to decide on).
        if matches!(t.op, Op::Rope(_)) {
            return Ok(None);
        }
        for &src in &t.src {
            let Some(data) = root_data(self.ctx, src) else {
                continue;
            };
            if data.buffer.usage() != crate::backend::BufferUsage::Weights {
                continue;
            }
            let sb = self.backend_from_buffer(src, id);
            if self.op_offload && sb == Some(self.last()) && data.buffer.is_host() {
                if let Some(b) = (0..self.last())
                    .find(|&b| self.supports_op(b, id) && self.backends[b].offload_op(self.ctx, id))
                {
                    return Ok(Some(b));
                }
            }
            return Ok(sb);
        }
        Ok(None)
    }

    fn assign_from_cur(&mut self, id: TensorId) -> Result<()> {
        if self.get(id).is_none() {
            if let Some(b) = self.backend_from_cur(id)? {
                self.set(id, b);
            }
        }
        Ok(())
    }

    fn set_if_supported(&mut self, id: TensorId, b: usize) {
        if self.supports_op(b, id) {
            self.set(id, b);
        }
    }

    /// Run passes 1–4 over `nodes` and `leafs` (ids of `ctx`).
    pub fn run(&mut self, nodes: &[TensorId], leafs: &[TensorId]) -> Result<()> {
        let ctx = self.ctx;
        self.pass_from_cur(nodes, leafs)?;
        // Passes 2 and 3 skip view ops (no kernel runs for them).
        let order_down: Vec<TensorId> = nodes
            .iter()
            .copied()
            .filter(|&n| !is_view_op(&ctx[n].op))
            .collect();
        self.pass_expand(&order_down);
        self.pass_upgrade(&order_down);
        self.pass_views_and_sources(nodes)?;
        // Leafs no node reads (nothing decided them): the CPU backend.
        for &leaf in leafs {
            if self.get(leaf).is_none() {
                let b = ctx[leaf]
                    .view_src
                    .and_then(|v| self.get(v))
                    .unwrap_or(self.last());
                self.set(leaf, b);
            }
        }
        Ok(())
    }

    /// Pass 1: tensors in a buffer, graph inputs, ops reading weights.
    fn pass_from_cur(&mut self, nodes: &[TensorId], leafs: &[TensorId]) -> Result<()> {
        let ctx = self.ctx;
        for &leaf in leafs {
            self.assign_from_cur(leaf)?;
        }
        for &node in nodes {
            self.assign_from_cur(node)?;
            for &src in &ctx[node].src {
                self.assign_from_cur(src)?;
            }
        }
        Ok(())
    }

    /// Pass 2: expand assignments to neighbouring nodes (down, then up); non-CPU backends
    /// first so they get as much of the graph as they support, then the rest.
    fn pass_expand(&mut self, order_down: &[TensorId]) {
        let order_up: Vec<TensorId> = order_down.iter().rev().copied().collect();
        for skip_last in [true, false] {
            for order in [order_down, &order_up] {
                let mut cur: Option<usize> = None;
                for &node in order {
                    match self.get(node) {
                        Some(b) => {
                            cur = if skip_last && b == self.last() {
                                None
                            } else {
                                Some(b)
                            }
                        }
                        None => {
                            if let Some(b) = cur {
                                self.set_if_supported(node, b);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Pass 3: upgrade nodes to a higher-priority backend with the same buffer type; give
    /// unassigned ones to the backend that can read most of their inputs.
    fn pass_upgrade(&mut self, order_down: &[TensorId]) {
        let ctx = self.ctx;
        for &node in order_down {
            match self.get(node) {
                None => {
                    if let Some(b) = self.best_reader(node) {
                        self.set(node, b);
                    }
                }
                Some(cur) if !self.pinned[node.index()] => {
                    let upgrade = (0..cur).find(|&b| {
                        crate::backend::same_instance(&self.bufts[b], &self.bufts[cur])
                            && self.supports_op(b, node)
                            && ctx[node].src.iter().all(|&s| self.buffer_supported(s, b))
                    });
                    if let Some(b) = upgrade {
                        self.set(node, b);
                    }
                }
                Some(_) => {}
            }
        }
    }

    /// The backend supporting `node` that can read most of its assigned inputs (the first
    /// of those in priority order on a tie).
    fn best_reader(&self, node: TensorId) -> Option<usize> {
        let ctx = self.ctx;
        let mut best: Option<(usize, usize)> = None;
        for b in 0..self.backends.len() {
            if !self.supports_op(b, node) {
                continue;
            }
            let n = ctx[node]
                .src
                .iter()
                .filter(|&&s| {
                    let assigned = self.get(s).is_some()
                        || ctx[s].view_src.and_then(|v| self.get(v)).is_some();
                    assigned && self.buffer_supported(s, b)
                })
                .count();
            if best.is_none_or(|(_, m)| n > m) {
                best = Some((b, n));
            }
        }
        best.map(|(b, _)| b)
    }

    /// Pass 4: views follow their sources; unassigned sources follow their node; a node still
    /// unassigned goes to the first backend that supports it. A node nobody can run, or one
    /// assigned to a backend that cannot, is an error.
    fn pass_views_and_sources(&mut self, nodes: &[TensorId]) -> Result<()> {
        let ctx = self.ctx;
        for &node in nodes {
            let mut cur = self.get(node);
            if cur.is_none() {
                if let Some(v) = ctx[node].view_src {
                    cur = self.get(v);
                    if let Some(b) = cur {
                        self.set(node, b);
                    }
                }
            }
            for &src in &ctx[node].src {
                if self.get(src).is_none() {
                    let b = match ctx[src].view_src {
                        Some(v) => self.get(v),
                        None => cur,
                    };
                    if let Some(b) = b {
                        self.set(src, b);
                    }
                }
            }
            if cur.is_none() {
                if let Some(b) = (0..self.backends.len()).find(|&b| self.supports_op(b, node)) {
                    self.set(node, b);
                    cur = Some(b);
                }
            }
            self.check_assigned(node, cur)?;
        }
        Ok(())
    }

    /// The end of pass 4 for `node`, assigned to `cur`.
    fn check_assigned(&self, node: TensorId, cur: Option<usize>) -> Result<()> {
        let t = &self.ctx[node];
        match cur {
            None => Err(SchedError::NoBackendSupports {
                node: t.display_name().to_string(),
                op: t.op.kind(),
            }
            .into()),
            Some(b) if !is_view_op(&t.op) && !self.supports_op(b, node) => {
                Err(SchedError::AssignedBackendUnsupported {
                    node: t.display_name().to_string(),
                    op: t.op.kind(),
                    backend: self.backends[b].name().to_string(),
                }
                .into())
            }
            Some(_) => Ok(()),
        }
    }
}

/// Whether backend `b` can read `t`: through the buffer `t` (or its view source) lives in, or
/// else through the buffer type of the backend `t` is assigned to.
pub(crate) fn buffer_supported(
    ctx: &Context,
    ids: &[Option<usize>],
    backends: &[Box<dyn Backend>],
    bufts: &[BufferTypeRef],
    t: TensorId,
    b: usize,
) -> bool {
    let get = |id: TensorId| ids.get(id.index()).copied().flatten();
    let buft = match root_data(ctx, t) {
        Some(data) => Some(data.buffer.buffer_type().clone()),
        None => get(t)
            .or_else(|| ctx[t].view_src.and_then(get))
            .map(|a| bufts[a].clone()),
    };
    buft.is_some_and(|buft| backends[b].supports_buffer_type(&buft))
}
