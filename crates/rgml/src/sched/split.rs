//! Splitting one graph (ggml's `ggml_backend_sched_split_graph`): the scheduler's private copy
//! of the caller's graph, backend assignment (through [`super::assign`]), the splits, the
//! copies of the inputs a split's backend cannot read, and the augmented graph the allocator
//! places. See the parent module's "How a graph runs", steps 1 to 3.
//!
//! This module only builds a [`Plan`]; it allocates nothing and never touches the caller's
//! context or graph. It knows the scheduler only through [`Splitter`], the parts of it a split
//! reads.

use super::assign::{buffer_supported, is_view_op, root_data, Assigner};
use crate::backend::{Backend, BufferTypeRef, BufferUsage};
use crate::context::Context;
use crate::error::{Error, Result, SchedError};
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::{Tensor, TensorFlags, TensorId};
use std::collections::{HashMap, HashSet};

/// A split in the scheduler's context.
pub(super) struct Split {
    pub backend: usize,
    /// The split's nodes (scheduler ids), with sources rewritten to the copies.
    pub graph: Graph,
    /// Tensors (scheduler ids) copied in before the split runs.
    pub inputs: Vec<TensorId>,
    /// Index of the split's first node in the augmented graph.
    pub aug_start: usize,
}

/// The scheduler's augmented copy of one graph.
pub(super) struct Plan {
    pub ctx: Context,
    /// Caller id → scheduler id.
    pub to_sched: HashMap<TensorId, TensorId>,
    /// Scheduler id → caller id (only the caller's tensors).
    pub to_user: HashMap<TensorId, TensorId>,
    pub graph: Graph,
    pub node_ids: Vec<usize>,
    pub leaf_ids: Vec<usize>,
    pub splits: Vec<Split>,
    /// Backend of each scheduler tensor.
    pub backend_ids: Vec<Option<usize>>,
    /// Copies per (scheduler tensor, backend), one per copy index.
    pub copies: HashMap<(TensorId, usize), Vec<TensorId>>,
    /// The copy index the graph was built with.
    pub cur_copy: usize,
    /// The caller graph's uid.
    pub uid: u64,
    /// The caller context's uid and epoch once the plan's storage was written into it: the
    /// plan is reused only while they are unchanged (see [`Context::epoch`]).
    pub user_ctx: (u64, u64),
}

/// A broken invariant of the scheduler's own plan, as an error instead of a panic.
pub(super) fn internal(msg: impl Into<String>) -> Error {
    SchedError::Internal(msg.into()).into()
}

/// The backend assigned to `id`.
fn backend_of(ctx: &Context, ids: &[Option<usize>], id: TensorId) -> Result<usize> {
    ids.get(id.index()).copied().flatten().ok_or_else(|| {
        internal(format!(
            "tensor '{}' has no backend",
            ctx[id].display_name()
        ))
    })
}

/// What splitting reads of the scheduler.
pub(super) struct Splitter<'a> {
    pub backends: &'a [Box<dyn Backend>],
    pub bufts: &'a [BufferTypeRef],
    pub max_graph_size: Option<usize>,
    pub n_copies: usize,
    pub op_offload: bool,
    /// User overrides: caller tensor → backend.
    pub overrides: &'a HashMap<TensorId, usize>,
    /// Ids of the scheduler's compute buffers (storage there may be placed again).
    pub own_buffers: &'a HashSet<u64>,
}

/// The caller's graph copied into the scheduler's context (step 1).
struct Copied {
    ctx: Context,
    to_sched: HashMap<TensorId, TensorId>,
    to_user: HashMap<TensorId, TensorId>,
    /// The graph's nodes and leafs, in scheduler ids.
    nodes: Vec<TensorId>,
    leafs: Vec<TensorId>,
}

impl Splitter<'_> {
    /// Copy the caller's graph into a private context, assign backends, split, and add the
    /// input copies (ggml's `ggml_backend_sched_split_graph`).
    pub fn split_graph(&self, user: &Context, graph: &Graph, cur_copy: usize) -> Result<Plan> {
        let n_user = graph.n_nodes() + graph.leafs().len();
        if let Some(graph_size) = self.max_graph_size.filter(|&max| n_user > max) {
            return Err(SchedError::GraphTooLarge {
                n_tensors: n_user,
                graph_size,
            }
            .into());
        }
        // 1. The caller's tensors; 2. assignment; 3. splits and the copies they need.
        let copied = self.copy_user_graph(user, graph)?;
        let ids = self.assign(&copied)?;
        let cuts = Cuts::new(self, &copied.ctx, &ids, cur_copy).run(&copied.nodes)?;
        let Copied {
            mut ctx,
            to_sched,
            to_user,
            nodes,
            leafs,
        } = copied;
        let mut ids = ids;
        // 4. Materialise the copies and rewrite the sources; 5. the augmented graph.
        let copies = self.add_copies(&mut ctx, &mut ids, cuts)?;
        let aug = self.augment(&mut ctx, &mut ids, &copies, &nodes, &leafs, cur_copy)?;
        Ok(Plan {
            ctx,
            to_sched,
            to_user,
            graph: aug.graph,
            node_ids: aug.node_ids,
            leaf_ids: aug.leaf_ids,
            splits: aug.splits,
            backend_ids: ids,
            copies: copies.copies,
            cur_copy,
            uid: graph.uid(),
            user_ctx: (user.uid(), user.epoch()),
        })
    }

    /// Step 1: the caller's tensors, sources and view sources first; storage the scheduler gave
    /// earlier is dropped so it can be placed again.
    fn copy_user_graph(&self, user: &Context, graph: &Graph) -> Result<Copied> {
        let mut ctx = Context::new();
        let mut to_sched: HashMap<TensorId, TensorId> = HashMap::new();
        let mut to_user: HashMap<TensorId, TensorId> = HashMap::new();
        let mut stack: Vec<(TensorId, bool)> = Vec::new();
        for &id in graph.leafs().iter().chain(graph.nodes()) {
            user.get(id)?;
            stack.push((id, false));
            while let Some((t, done)) = stack.pop() {
                if done {
                    if to_sched.contains_key(&t) {
                        continue;
                    }
                    let mut copy = user[t].clone();
                    let own = copy
                        .data
                        .as_ref()
                        .is_some_and(|d| self.own_buffers.contains(&d.buffer.id()));
                    if own {
                        copy.data = None;
                    }
                    copy.src = copy.src.iter().map(|s| to_sched[s]).collect();
                    copy.view_src = copy.view_src.map(|s| to_sched[&s]);
                    let s = ctx.push(copy)?;
                    to_sched.insert(t, s);
                    to_user.insert(s, t);
                    continue;
                }
                if to_sched.contains_key(&t) {
                    continue;
                }
                stack.push((t, true));
                let tensor = user.get(t)?;
                for &s in tensor.src.iter().chain(tensor.view_src.iter()) {
                    user.get(s)?;
                    if !to_sched.contains_key(&s) {
                        stack.push((s, false));
                    }
                }
            }
        }
        let nodes: Vec<TensorId> = graph.nodes().iter().map(|n| to_sched[n]).collect();
        let leafs: Vec<TensorId> = graph.leafs().iter().map(|n| to_sched[n]).collect();
        Ok(Copied {
            ctx,
            to_sched,
            to_user,
            nodes,
            leafs,
        })
    }

    /// Step 2: the backend of every tensor (overrides pinned first, then the passes).
    fn assign(&self, copied: &Copied) -> Result<Vec<Option<usize>>> {
        let n = copied.ctx.len();
        let mut ids = vec![None; n];
        let mut pinned = vec![false; n];
        for (u, &b) in self.overrides {
            if let Some(s) = copied.to_sched.get(u) {
                ids[s.index()] = Some(b);
                pinned[s.index()] = true;
            }
        }
        let mut assigner = Assigner {
            backends: self.backends,
            bufts: self.bufts,
            ctx: &copied.ctx,
            op_offload: self.op_offload,
            ids,
            pinned,
        };
        assigner.run(&copied.nodes, &copied.leafs)?;
        Ok(assigner.ids)
    }

    /// Step 4: push the copy tensors into `ctx` (pipelined ones, and graph inputs with
    /// several places, are never reused by other tensors), rewrite the sources that read a
    /// copy, and give every copy its backend.
    fn add_copies(
        &self,
        ctx: &mut Context,
        ids: &mut Vec<Option<usize>>,
        cuts: CutList,
    ) -> Result<Copies> {
        for (id, mut t) in cuts.extra {
            if self.n_copies > 1 {
                // Pipelined copies must never be reused by other tensors.
                t.flags.insert(TensorFlags::OUTPUT);
            }
            ctx.push_reserved(id, t)?;
        }
        for &(src, _) in &cuts.graph_inputs {
            let t = ctx.get_mut(src)?;
            t.flags.insert(TensorFlags::OUTPUT);
        }
        for (node, j, copy) in cuts.rewrites {
            ctx.get_mut(node)?.src[j] = copy;
        }
        ids.resize(ctx.len(), None);
        for (&(_, b), v) in &cuts.copies {
            for &c in v {
                ids[c.index()] = Some(b);
            }
        }
        Ok(Copies {
            splits: cuts.splits,
            copies: cuts.copies,
            graph_inputs: cuts.graph_inputs,
        })
    }

    /// Step 5: the augmented graph: before each split's nodes, a keep-alive node for each
    /// input and its copy (placed at the split's start); then the leafs (with `n_copies > 1`
    /// every place of every pipelined tensor first).
    fn augment(
        &self,
        ctx: &mut Context,
        ids: &mut Vec<Option<usize>>,
        copies: &Copies,
        nodes: &[TensorId],
        leafs: &[TensorId],
        cur_copy: usize,
    ) -> Result<Augmented> {
        let mut g_nodes: Vec<TensorId> = Vec::new();
        let mut node_ids: Vec<usize> = Vec::new();
        let mut out_splits: Vec<Split> = Vec::with_capacity(copies.splits.len());
        for s in &copies.splits {
            for &input in &s.inputs {
                // A zero-size node reading the input: it keeps the input alive up to here
                // without taking memory (ggml uses a view, which would pin the input forever).
                let it = &ctx[input];
                let mut dep = Tensor::new(it.dtype, [0, 1, 1, 1])?;
                dep.op = Op::Dup;
                dep.src = vec![input];
                dep.name = format!("{} (dep)", it.name);
                let ib = backend_of(ctx, ids, input)?;
                let dep = ctx.push(dep)?;
                ids.push(Some(ib));
                g_nodes.push(dep);
                node_ids.push(ib);
                g_nodes.push(copies.copies[&(input, s.backend)][cur_copy]);
                node_ids.push(s.backend);
            }
            let aug_start = g_nodes.len();
            for &n in &nodes[s.start..s.end] {
                g_nodes.push(n);
                node_ids.push(backend_of(ctx, ids, n)?);
            }
            out_splits.push(Split {
                backend: s.backend,
                graph: Graph::from_nodes(nodes[s.start..s.end].to_vec()),
                inputs: s.inputs.clone(),
                aug_start,
            });
        }
        let (g_leafs, leaf_ids) = self.augmented_leafs(ctx, ids, copies, leafs)?;
        Ok(Augmented {
            graph: Graph::from_parts(g_nodes, g_leafs),
            node_ids,
            leaf_ids,
            splits: out_splits,
        })
    }

    /// The augmented graph's leafs and their backends: with `n_copies > 1` every place of
    /// every graph input and split input copy, then the caller's leafs.
    fn augmented_leafs(
        &self,
        ctx: &Context,
        ids: &[Option<usize>],
        copies: &Copies,
        leafs: &[TensorId],
    ) -> Result<(Vec<TensorId>, Vec<usize>)> {
        let mut g_leafs: Vec<TensorId> = Vec::new();
        let mut leaf_ids: Vec<usize> = Vec::new();
        if self.n_copies > 1 {
            for &(input, b) in &copies.graph_inputs {
                for &c in &copies.copies[&(input, b)] {
                    g_leafs.push(c);
                    leaf_ids.push(b);
                }
            }
            for s in &copies.splits {
                for &input in &s.inputs {
                    for &c in &copies.copies[&(input, s.backend)] {
                        g_leafs.push(c);
                        leaf_ids.push(s.backend);
                    }
                }
            }
        }
        for &l in leafs {
            g_leafs.push(l);
            leaf_ids.push(backend_of(ctx, ids, l)?);
        }
        Ok((g_leafs, leaf_ids))
    }
}

/// A split before its graph is built: a backend and a range of the node list.
struct RawSplit {
    backend: usize,
    start: usize,
    end: usize,
    inputs: Vec<TensorId>,
}

/// Step 3 at work: where the node list is cut, and which copies the cuts need.
struct Cuts<'a> {
    sp: &'a Splitter<'a>,
    ctx: &'a Context,
    ids: &'a [Option<usize>],
    cur_copy: usize,
    out: CutList,
}

/// Step 3's decisions.
struct CutList {
    splits: Vec<RawSplit>,
    /// Copies per (scheduler tensor, backend), one per copy index (not in `ctx` yet).
    copies: HashMap<(TensorId, usize), Vec<TensorId>>,
    /// Graph inputs that get `n_copies` places, with their backend.
    graph_inputs: Vec<(TensorId, usize)>,
    /// (node, source position, copy): sources to rewrite to their copy.
    rewrites: Vec<(TensorId, usize, TensorId)>,
    /// The copy tensors with the ids reserved for them, in order after `ctx`'s tensors.
    extra: Vec<(TensorId, Tensor)>,
}

/// Step 3's result once the copies are in the context.
struct Copies {
    splits: Vec<RawSplit>,
    copies: HashMap<(TensorId, usize), Vec<TensorId>>,
    graph_inputs: Vec<(TensorId, usize)>,
}

/// Step 5's result.
struct Augmented {
    graph: Graph,
    node_ids: Vec<usize>,
    leaf_ids: Vec<usize>,
    splits: Vec<Split>,
}

impl<'a> Cuts<'a> {
    fn new(
        sp: &'a Splitter<'a>,
        ctx: &'a Context,
        ids: &'a [Option<usize>],
        cur_copy: usize,
    ) -> Self {
        Cuts {
            sp,
            ctx,
            ids,
            cur_copy,
            out: CutList {
                splits: Vec::new(),
                copies: HashMap::new(),
                graph_inputs: Vec::new(),
                rewrites: Vec::new(),
                extra: Vec::new(),
            },
        }
    }

    /// Step 3: splits where the backend changes, and copies of the inputs a split's backend
    /// cannot read.
    fn run(mut self, nodes: &[TensorId]) -> Result<CutList> {
        let (ctx, ids) = (self.ctx, self.ids);
        let last = self.sp.backends.len() - 1;
        let first = nodes
            .iter()
            .find(|&&n| !is_view_op(&ctx[n].op))
            .map(|&n| backend_of(ctx, ids, n))
            .transpose()?
            .unwrap_or(last);
        self.out.splits.push(RawSplit {
            backend: first,
            start: 0,
            end: nodes.len(),
            inputs: Vec::new(),
        });
        for (i, &node) in nodes.iter().enumerate() {
            if is_view_op(&ctx[node].op) {
                continue;
            }
            let nb = backend_of(ctx, ids, node)?;
            let cur = self.out.splits.last().map_or(last, |s| s.backend);
            if nb != cur || self.weights_elsewhere(node, cur) {
                if let Some(s) = self.out.splits.last_mut() {
                    s.end = i;
                }
                self.out.splits.push(RawSplit {
                    backend: nb,
                    start: i,
                    end: nodes.len(),
                    inputs: Vec::new(),
                });
            }
            for (j, &src) in ctx[node].src.iter().enumerate() {
                let sb = backend_of(ctx, ids, src)?;
                self.pipeline_input(src, sb)?;
                if sb != nb && !buffer_supported(ctx, ids, self.sp.backends, self.sp.bufts, src, nb)
                {
                    let copy = self.copy_of(src, nb)?;
                    self.out.rewrites.push((node, j, copy));
                }
            }
        }
        Ok(self.out)
    }

    /// Whether `node`, on the backend `cur` of the current split (which already copies
    /// inputs), reads a weight on another backend that `cur` cannot read: it then starts a
    /// new split so the memory of earlier weight copies can be reused.
    fn weights_elsewhere(&self, node: TensorId, cur: usize) -> bool {
        let (ctx, ids) = (self.ctx, self.ids);
        if self.out.splits.last().is_some_and(|s| s.inputs.is_empty()) {
            return false;
        }
        ctx[node].src.iter().any(|&s| {
            root_data(ctx, s).is_some_and(|d| d.buffer.usage() == BufferUsage::Weights)
                && ids[s.index()] != Some(cur)
                && !buffer_supported(ctx, ids, self.sp.backends, self.sp.bufts, s, cur)
        })
    }

    /// The id the next copy tensor will have (reserved now: the walk borrows `ctx`, the
    /// copies are pushed after it).
    fn next_id(&self) -> Result<TensorId> {
        self.ctx.reserve_id(self.out.extra.len())
    }

    /// A new copy tensor of `src` on backend `b` for copy index `c`: same dtype, shape and
    /// strides.
    fn push_copy(
        &mut self,
        src: TensorId,
        b: usize,
        c: usize,
        flags: TensorFlags,
    ) -> Result<TensorId> {
        let id = self.next_id()?;
        let st = &self.ctx[src];
        let mut t = Tensor::new(st.dtype, st.ne)?;
        t.nb = st.nb;
        t.name = format!("{}#{}#{c}", self.sp.backends[b].name(), st.name);
        t.flags = flags;
        self.out.extra.push((id, t));
        Ok(id)
    }

    /// With `n_copies > 1`, a graph input `src` (on backend `sb`) gets `n_copies` places: its
    /// own for the current copy, new tensors for the others.
    fn pipeline_input(&mut self, src: TensorId, sb: usize) -> Result<()> {
        let n_copies = self.sp.n_copies;
        if !self.ctx[src].flags.contains(TensorFlags::INPUT)
            || n_copies <= 1
            || self.out.copies.contains_key(&(src, sb))
        {
            return Ok(());
        }
        let mut v = Vec::with_capacity(n_copies);
        for c in 0..n_copies {
            if c == self.cur_copy {
                v.push(src);
            } else {
                v.push(self.push_copy(src, sb, c, TensorFlags::INPUT)?);
            }
        }
        self.out.copies.insert((src, sb), v);
        self.out.graph_inputs.push((src, sb));
        Ok(())
    }

    /// The current copy of `src` on backend `nb`, made (`n_copies` of them, one per copy
    /// index) and listed as an input of the current split the first time.
    fn copy_of(&mut self, src: TensorId, nb: usize) -> Result<TensorId> {
        if let Some(v) = self.out.copies.get(&(src, nb)) {
            return Ok(v[self.cur_copy]);
        }
        let flags = if self.sp.n_copies > 1 {
            TensorFlags::INPUT
        } else {
            TensorFlags::empty()
        };
        let mut v = Vec::with_capacity(self.sp.n_copies);
        for c in 0..self.sp.n_copies {
            v.push(self.push_copy(src, nb, c, flags)?);
        }
        if let Some(s) = self.out.splits.last_mut() {
            s.inputs.push(src);
        }
        let copy = v[self.cur_copy];
        self.out.copies.insert((src, nb), v);
        Ok(copy)
    }
}
