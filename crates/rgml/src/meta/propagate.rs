//! Split-state propagation: the per-op rules that give a computed tensor's [`SplitState`] from
//! its sources' states, and the walk that applies them to a whole graph.
//!
//! This module owns the decision of *where* each node's data lives on a meta device and *where*
//! partial sums must be joined; it moves no data. The compute layer reads its answer: every
//! device runs the node on its local slices, and before each [`Reduce`] point the graph is cut
//! and an all-reduce turns the partial tensor into a mirrored one (in place).
//!
//! # Rules
//!
//! A rule either gives the result's state or asks for some PARTIAL sources to be all-reduced
//! first ([`Propagation::reduce`]). Only ops that are linear in a partial source keep it partial
//! (the sum over devices commutes with them): ADD/SUB of two partials; MUL by, or DIV of a
//! partial by, a mirrored tensor; SCALE without bias; MUL_MAT, GET_ROWS (table side) and ROPE
//! with the other operands mirrored; CONCAT of two partials; DUP/CONT/CPY, REPEAT and the view
//! ops. Every other use of a partial source reduces it (ADD of a partial and a mirrored tensor
//! would add the mirrored term once per device).
//!
//! Split sources must combine *locally*: each device computes its slice from its own slices
//! with the ordinary kernel, without offsets into another tensor. The op set is closed, so
//! every op has a rule; ops whose result depends on global indices (rows for norms and
//! softmax, columns for the causal mask, rotation pairs for ROPE, the head index for ALiBi)
//! refuse a split of that axis.
//!
//! # Gathers: running an op mirrored
//!
//! Where a rule refuses a combination (e.g. a split tensor plus a full-size mirrored one, a row
//! norm of rows split across devices, a matrix product whose weight is split by output rows
//! and whose input is split), the split *computed* sources are all-gathered
//! ([`Propagation::gather`]): their root becomes whole and MIRRORED on every device, in place,
//! before the op, and the rule is asked again. This is how a model gets bit-exact tensor
//! parallelism (weights split by output rows only, every dot product whole on one device), and
//! it is the fallback for any op without a local rule. Leaves (weights, caches) are never
//! gathered: they persist between graphs in their split layout, so a leaf the rule refuses is
//! an error ([`Error::UnsupportedSplit`] naming the op and the states).
//!
//! View ops remap the split axis through memory: the split axis of the (contiguous) source is
//! followed through the view's strides; the view must keep the axis whole, and may subdivide
//! it (576 rows as 9 heads of 64: the split moves to the head axis, sizes divided by 64) or
//! merge it with the dims inside it (heads of 64 back into 576 rows), as long as every
//! device's share stays whole.

use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::{Op, OpKind};
use crate::tensor::{Tensor, TensorFlags, TensorId, MAX_DIMS};
use std::collections::HashMap;

use super::split::{Segment, SplitState};

/// The outcome of one op's rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Propagation {
    /// The result's state, assuming the sources in `reduce` were all-reduced first.
    pub state: SplitState,
    /// Positions (in the node's `src`) of PARTIAL sources that must be all-reduced (turned
    /// MIRRORED) before the op runs; ascending, empty when none.
    pub reduce: Vec<usize>,
    /// Positions of split sources whose root (a computed tensor) must be all-gathered (made
    /// whole and MIRRORED on every device) before the op runs; ascending, empty when none.
    pub gather: Vec<usize>,
}

/// A point where the graph is cut: `tensor` holds partial sums and is all-reduced in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduce {
    /// The partial tensor.
    pub tensor: TensorId,
    /// The first node that needs it reduced; `None` for a graph output reduced at the end.
    pub before: Option<TensorId>,
}

/// A point where the graph is cut: `tensor` (a computed, non-view tensor split along an axis)
/// is all-gathered in place, so that it and its views are whole and MIRRORED from then on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather {
    /// The split tensor (a view root).
    pub tensor: TensorId,
    /// The first node that needs it whole.
    pub before: TensorId,
}

/// Split states of a whole graph.
#[derive(Clone, Debug, Default)]
pub struct GraphSplit {
    /// The state of every leaf and node as it is computed (a tensor reduced later is listed
    /// here as PARTIAL, one gathered later as split; after its [`Reduce`] or [`Gather`] point
    /// it is MIRRORED).
    pub states: HashMap<TensorId, SplitState>,
    /// The all-reduces, in graph order of the node that first needs each.
    pub reduces: Vec<Reduce>,
    /// The all-gathers, in graph order of the node that first needs each.
    pub gathers: Vec<Gather>,
}

impl GraphSplit {
    /// The state of `id` as computed.
    pub fn state(&self, id: TensorId) -> Option<&SplitState> {
        self.states.get(&id)
    }

    /// Whether `id` is all-reduced somewhere in the graph.
    pub fn is_reduced(&self, id: TensorId) -> bool {
        self.reduces.iter().any(|r| r.tensor == id)
    }

    /// Whether `id` (a view root) is all-gathered somewhere in the graph.
    pub fn is_gathered(&self, id: TensorId) -> bool {
        self.gathers.iter().any(|g| g.tensor == id)
    }
}

/// What a rule says before reductions are applied.
enum Rule {
    State(SplitState),
    /// Reduce these (partial) sources, then ask again.
    Reduce(Vec<usize>),
}

fn unsupported<T>(op: OpKind, why: impl Into<String>) -> Result<T> {
    Err(Error::UnsupportedSplit {
        op,
        why: why.into(),
    })
}

/// The state of tensor `id` (a node of `ctx`) from its sources' states `src_states` (one per
/// `src`, in order) on a meta device of `n_devices` devices.
///
/// Errors: a wrong number of states, a source state that does not fit its tensor, or a
/// combination no rule can compute locally ([`Error::UnsupportedSplit`]).
pub fn propagate(
    ctx: &Context,
    id: TensorId,
    src_states: &[SplitState],
    n_devices: usize,
) -> Result<Propagation> {
    let t = ctx.get(id)?;
    if src_states.len() != t.src.len() {
        return Err(Error::InvalidSplit(format!(
            "{}: {} source states for {} sources",
            t.op.kind(),
            src_states.len(),
            t.src.len()
        )));
    }
    for (&s, state) in t.src.iter().zip(src_states) {
        state.validate(ctx.get(s)?.ne, n_devices)?;
    }
    let mut states = src_states.to_vec();
    let mut reduce = Vec::new();
    let mut gather = Vec::new();
    // Each round turns at least one partial or split source mirrored, so this ends within
    // `src.len() + 1` rounds; the bound guards against a rule that asks for a non-partial one.
    for _ in 0..=states.len() {
        let answer = match rule(ctx, t, &states) {
            Err(e @ Error::UnsupportedSplit { .. }) => {
                // Run the op on whole (gathered) computed sources instead, if that helps.
                let mut gathered = false;
                for (i, &s) in t.src.iter().enumerate() {
                    if matches!(states[i], SplitState::Axis { .. }) && gatherable(ctx, s) {
                        states[i] = SplitState::Mirrored;
                        gather.push(i);
                        gathered = true;
                    }
                }
                if !gathered {
                    return Err(e);
                }
                match rule(ctx, t, &states) {
                    Err(Error::UnsupportedSplit { .. }) => return Err(e),
                    other => other?,
                }
            }
            other => other?,
        };
        match answer {
            Rule::State(state) => {
                state.validate(t.ne, n_devices)?;
                reduce.sort_unstable();
                gather.sort_unstable();
                return Ok(Propagation {
                    state,
                    reduce,
                    gather,
                });
            }
            Rule::Reduce(idx) => {
                let mut progressed = false;
                for i in idx {
                    if states.get(i) == Some(&SplitState::Partial) {
                        states[i] = SplitState::Mirrored;
                        reduce.push(i);
                        progressed = true;
                    }
                }
                if !progressed {
                    break;
                }
            }
        }
    }
    Err(Error::InvalidSplit(format!(
        "{}: propagation asked to reduce a source that holds no partial sums",
        t.op.kind()
    )))
}

/// Propagate split states through `graph`: leafs (and PARAM nodes without an op) take
/// `leaf_state` (MIRRORED when it gives none), every node its rule's state, in graph order.
///
/// A partial tensor that a node needs reduced is reduced once, in place, before the first such
/// node; later readers (and views of the same memory) see it MIRRORED. Graph outputs (flag
/// OUTPUT) still partial at the end are reduced last (`before: None`).
pub fn propagate_graph(
    ctx: &Context,
    graph: &Graph,
    leaf_state: impl Fn(TensorId) -> Option<SplitState>,
    n_devices: usize,
) -> Result<GraphSplit> {
    let mut out = GraphSplit::default();
    // The state readers see now: differs from `out.states` after an in-place reduce.
    let mut current: HashMap<TensorId, SplitState> = HashMap::new();
    let leaf = |id: TensorId| -> Result<SplitState> {
        let state = leaf_state(id).unwrap_or(SplitState::Mirrored);
        state.validate(ctx.get(id)?.ne, n_devices)?;
        Ok(state)
    };
    for &id in graph.leafs() {
        let state = leaf(id)?;
        current.insert(id, state.clone());
        out.states.insert(id, state);
    }
    for &id in graph.nodes() {
        let t = ctx.get(id)?;
        if t.op == Op::None {
            let state = leaf(id)?;
            current.insert(id, state.clone());
            out.states.insert(id, state);
            continue;
        }
        let mut src_states = Vec::with_capacity(t.src.len());
        for &s in &t.src {
            let state = match current.get(&s) {
                Some(state) => state.clone(),
                // A leaf outside the graph's lists (e.g. the scheduler's split graphs list
                // only nodes): ask the loader, and remember the answer.
                None if ctx.get(s)?.op == Op::None => {
                    let state = leaf(s)?;
                    current.insert(s, state.clone());
                    out.states.insert(s, state.clone());
                    state
                }
                None => {
                    return Err(Error::InvalidSplit(format!(
                        "{}: source '{}' is computed outside the graph",
                        t.op.kind(),
                        ctx[s].display_name()
                    )))
                }
            };
            src_states.push(state);
        }
        let p = propagate(ctx, id, &src_states, n_devices)?;
        for &i in &p.reduce {
            let s = t.src[i];
            out.reduces.push(Reduce {
                tensor: s,
                before: Some(id),
            });
            mark_reduced(ctx, &mut current, s);
        }
        for &i in &p.gather {
            let root = ctx[t.src[i]].view_src.unwrap_or(t.src[i]);
            if current.get(&root) == Some(&SplitState::Mirrored) {
                continue;
            }
            out.gathers.push(Gather {
                tensor: root,
                before: id,
            });
            let is_root = |x: TensorId| ctx[x].view_src.unwrap_or(x) == root;
            for (&x, state) in current.iter_mut() {
                if is_root(x) {
                    *state = SplitState::Mirrored;
                }
            }
        }
        current.insert(id, p.state.clone());
        out.states.insert(id, p.state);
    }
    for &id in graph.nodes() {
        if ctx[id].flags.contains(TensorFlags::OUTPUT)
            && current.get(&id) == Some(&SplitState::Partial)
        {
            out.reduces.push(Reduce {
                tensor: id,
                before: None,
            });
            mark_reduced(ctx, &mut current, id);
        }
    }
    Ok(out)
}

/// After an in-place all-reduce of `id`, it and every partial tensor sharing its memory (views
/// of the same root) hold the full sums.
fn mark_reduced(ctx: &Context, current: &mut HashMap<TensorId, SplitState>, id: TensorId) {
    let root = |t: TensorId| ctx[t].view_src.unwrap_or(t);
    let r = root(id);
    for (&t, state) in current.iter_mut() {
        if *state == SplitState::Partial && root(t) == r {
            *state = SplitState::Mirrored;
        }
    }
    current.insert(id, SplitState::Mirrored);
}

/// Whether `id`'s memory may be all-gathered in place: its root is computed by a node (a leaf
/// keeps its split layout between graphs) and holds plain (non-quantized) data.
fn gatherable(ctx: &Context, id: TensorId) -> bool {
    let root = ctx[id].view_src.unwrap_or(id);
    ctx.get(root)
        .is_ok_and(|r| r.op != Op::None && !r.dtype.is_quantized())
}

/// Which of `idx` hold partial sums.
fn partials(s: &[SplitState], idx: &[usize]) -> Vec<usize> {
    idx.iter()
        .copied()
        .filter(|&i| s.get(i) == Some(&SplitState::Partial))
        .collect()
}

/// The per-device runs of a split axis, in order, adjacent runs of one device merged and empty
/// runs dropped: two segment lists put the same indices on the same devices iff their runs
/// are equal.
fn runs(segments: &[Segment]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for seg in segments {
        for _ in 0..seg.repeat {
            for (d, &len) in seg.sizes.iter().enumerate() {
                if len == 0 {
                    continue;
                }
                match out.last_mut() {
                    Some((last, n)) if *last == d => *n += len,
                    _ => out.push((d, len)),
                }
            }
        }
    }
    out
}

/// Whether two states place the same indices of the same axis on the same devices.
fn same_placement(a: &SplitState, b: &SplitState) -> bool {
    match (a, b) {
        (
            SplitState::Axis {
                axis: x,
                segments: sa,
            },
            SplitState::Axis {
                axis: y,
                segments: sb,
            },
        ) => x == y && runs(sa) == runs(sb),
        _ => a == b,
    }
}

/// `segments` with every size multiplied by `num / den`, or `None` if a size is not whole.
fn scale_segments(segments: &[Segment], num: usize, den: usize) -> Option<Vec<Segment>> {
    if den == 0 {
        return None;
    }
    segments
        .iter()
        .map(|s| {
            let sizes = s
                .sizes
                .iter()
                .map(|&x| {
                    let y = x.checked_mul(num)?;
                    y.is_multiple_of(den).then_some(y / den)
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Segment {
                sizes,
                repeat: s.repeat,
            })
        })
        .collect()
}

fn fmt_state(s: &SplitState) -> String {
    match s {
        SplitState::Mirrored => "MIRRORED".into(),
        SplitState::Partial => "PARTIAL".into(),
        SplitState::Axis { axis, segments } => {
            let segs: Vec<String> = segments
                .iter()
                .map(|s| {
                    if s.repeat == 1 {
                        format!("{:?}", s.sizes)
                    } else {
                        format!("{:?}x{}", s.sizes, s.repeat)
                    }
                })
                .collect();
            format!("SPLIT(axis {axis}: {})", segs.join(" "))
        }
    }
}

fn fmt_states(s: &[SplitState]) -> String {
    s.iter().map(fmt_state).collect::<Vec<_>>().join(", ")
}

/// Element strides (instead of byte strides) of a layout; `None` when dim 0 of a quantized
/// tensor is not dense or a stride is not a whole number of blocks.
fn elem_strides(dtype: DType, nb: [usize; MAX_DIMS]) -> Option<[usize; MAX_DIMS]> {
    let (bs, bb) = (dtype.block_size(), dtype.block_bytes());
    if bb == 0 || (bs > 1 && nb[0] != bb) {
        return None;
    }
    let mut out = [0; MAX_DIMS];
    for (o, &b) in out.iter_mut().zip(&nb) {
        if !b.is_multiple_of(bb) {
            return None;
        }
        *o = b / bb * bs;
    }
    if bs > 1 {
        out[0] = 1;
    }
    Some(out)
}

/// Dense row-major element strides of shape `ne`.
fn dense_strides(ne: [usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
    [1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]]
}

/// Follow split `axis` of a dense source of shape `src_ne` into a layout `dst_ne`/`dst_st`
/// (element strides into the source's memory, starting `offset` elements in).
///
/// The dst dims that overlap the axis's range of strides must tile it densely and exactly; the
/// outermost of them carries the split, each device's share scaled by the ratio of its stride
/// to the axis's (shares must stay whole). Dims inside one axis index and dims outside the
/// axis's span are free; the offset may not move along the axis.
fn remap_axis(
    op: OpKind,
    axis: usize,
    segments: &[Segment],
    src_ne: [usize; MAX_DIMS],
    dst_ne: [usize; MAX_DIMS],
    dst_st: [usize; MAX_DIMS],
    offset: usize,
) -> Result<SplitState> {
    if src_ne[axis] == 1 && axis > 0 && src_ne[axis - 1] > 1 {
        // A split of a size-1 dim (see `lift_whole_split`) is one device holding all of the
        // dim below it: map that instead, which a result without the size-1 dim still has.
        if let Some(lowered) = scale_segments(segments, src_ne[axis - 1], 1) {
            return remap_axis(op, axis - 1, &lowered, src_ne, dst_ne, dst_st, offset);
        }
    }
    let unit = dense_strides(src_ne)[axis];
    let span = unit * src_ne[axis];
    let why = |what: &str| {
        unsupported(
            op,
            format!(
                "split axis {axis} of {src_ne:?} does not map onto {dst_ne:?} (strides {dst_st:?}, offset {offset}): {what}"
            ),
        )
    };
    if span == 0 {
        return why("the axis is empty");
    }
    let mut inner_reach = 0usize;
    let mut overlap: Vec<usize> = Vec::new();
    for k in 0..MAX_DIMS {
        let (n, t) = (dst_ne[k], dst_st[k]);
        if n <= 1 {
            continue;
        }
        if t.saturating_mul(n) <= unit {
            inner_reach += t * (n - 1);
        } else if t >= span {
            if !t.is_multiple_of(span) {
                return why("a dim outside the axis is not a whole number of its spans");
            }
        } else {
            overlap.push(k);
        }
    }
    overlap.sort_by_key(|&k| dst_st[k]);
    let (Some(&first), Some(&top)) = (overlap.first(), overlap.last()) else {
        return why("no dim of the result covers the axis (the view keeps one index of it)");
    };
    let t_first = dst_st[first];
    if t_first > unit || !unit.is_multiple_of(t_first) {
        return why("the result picks strided indices of the axis");
    }
    for w in overlap.windows(2) {
        if dst_st[w[1]] != dst_st[w[0]] * dst_ne[w[0]] {
            return why("the dims covering the axis are not dense");
        }
    }
    let covered = dst_st[top] * dst_ne[top];
    let (picked, start) = if covered == span {
        (segments.to_vec(), offset % span)
    } else {
        // Some of the axis's indices: whole runs of the split only (the Q, K or V rows of a
        // fused projection, split as one run each).
        let first = (offset % span) / unit;
        match covered
            .is_multiple_of(unit)
            .then(|| pick_runs(segments, first, covered / unit))
        {
            Some(Some(picked)) => (picked, offset % span - first * unit),
            _ => return why("the result cuts across the split"),
        }
    };
    if start + inner_reach >= t_first.min(unit) {
        return why("the offset moves along the split axis");
    }
    let t_top = dst_st[top];
    let scaled = if t_top >= unit {
        if !t_top.is_multiple_of(unit) {
            return why("the carrying dim's stride is not whole axis indices");
        }
        scale_segments(&picked, 1, t_top / unit)
    } else {
        scale_segments(&picked, unit / t_top, 1)
    };
    match scaled {
        Some(segments) => Ok(lift_whole_split(top, segments, dst_ne, dst_st)),
        None => why("a device's share is not a whole number of the result's indices"),
    }
}

/// The runs of `segments` (one per repeat) covering axis indices `first..first + len`, if
/// that range starts and ends on run boundaries.
fn pick_runs(segments: &[Segment], first: usize, len: usize) -> Option<Vec<Segment>> {
    let mut picked: Vec<Segment> = Vec::new();
    let (mut at, end) = (0usize, first.checked_add(len)?);
    for s in segments {
        let run: usize = s.sizes.iter().sum();
        if run == 0 {
            continue;
        }
        // Whole repeats before the range are skipped at once (a split may repeat per head).
        let skip = (first.saturating_sub(at) / run).min(s.repeat);
        at += skip * run;
        for _ in skip..s.repeat {
            if at >= end {
                break;
            }
            if at < first || at + run > end {
                return None;
            }
            match picked.last_mut() {
                Some(last) if last.sizes == s.sizes => last.repeat += 1,
                _ => picked.push(Segment {
                    sizes: s.sizes.clone(),
                    repeat: 1,
                }),
            }
            at += run;
        }
    }
    let total: usize = picked.iter().map(Segment::len).sum();
    (total == len).then_some(picked)
}

/// A split of `axis` that gives one device all of it, followed by a dim of size 1 (a K of one
/// head seen as `[head_dim, 1 head, n]`), is stated as a split of that dim: the same placement,
/// but one that rules working on whole rows of `axis` (norms over a head, RoPE) accept.
fn lift_whole_split(
    axis: usize,
    segments: Vec<Segment>,
    ne: [usize; MAX_DIMS],
    st: [usize; MAX_DIMS],
) -> SplitState {
    // Only a row's first axis (a head's width) is lifted: higher axes are where rules expect
    // splits to stay (a split giving one device everything is valid there as it is).
    if axis != 0 {
        return SplitState::Axis { axis, segments };
    }
    let next = axis + 1;
    let whole = |segments: &[Segment]| {
        segments
            .iter()
            .all(|s| s.sizes.iter().all(|&x| x == 0 || x == ne[axis]) && s.repeat == 1)
    };
    if next < MAX_DIMS && ne[next] == 1 && st[next] == st[axis] * ne[axis] && whole(&segments) {
        if let Some(lifted) = scale_segments(&segments, 1, ne[axis]) {
            return SplitState::Axis {
                axis: next,
                segments: lifted,
            };
        }
    }
    SplitState::Axis { axis, segments }
}

/// `state` of a tensor of shape `src_ne` seen as shape `dst_ne` in the same element order
/// (RESHAPE, CONT with a shape, CPY between shapes).
fn remap_order(
    op: OpKind,
    state: &SplitState,
    src_ne: [usize; MAX_DIMS],
    dst_ne: [usize; MAX_DIMS],
) -> Result<SplitState> {
    match state {
        SplitState::Axis { axis, segments } => {
            if src_ne == dst_ne {
                return Ok(state.clone());
            }
            remap_axis(
                op,
                *axis,
                segments,
                src_ne,
                dst_ne,
                dense_strides(dst_ne),
                0,
            )
        }
        other => Ok(other.clone()),
    }
}

/// VIEW of source `a` (whose state is `state`) giving tensor `t` at `offset` bytes into `a`.
fn remap_view(
    op: OpKind,
    state: &SplitState,
    a: &Tensor,
    t: &Tensor,
    offset: usize,
) -> Result<SplitState> {
    let SplitState::Axis { axis, segments } = state else {
        return Ok(state.clone());
    };
    let src_st = elem_strides(a.dtype, a.nb);
    if src_st != Some(dense_strides(a.ne)) {
        return unsupported(
            op,
            format!(
                "a view of a non-contiguous tensor split as {}",
                fmt_state(state)
            ),
        );
    }
    let (bs, bb) = (t.dtype.block_size(), t.dtype.block_bytes());
    let (Some(dst_st), true) = (
        elem_strides(t.dtype, t.nb),
        bb > 0 && offset.is_multiple_of(bb),
    ) else {
        return unsupported(
            op,
            "the view's strides or offset are not whole blocks".to_string(),
        );
    };
    remap_axis(op, *axis, segments, a.ne, t.ne, dst_st, offset / bb * bs)
}

/// One node as its rule sees it: the tensor, its sources' states, and what every rule asks of
/// them.
struct Node<'a> {
    ctx: &'a Context,
    t: &'a Tensor,
    s: &'a [SplitState],
    kind: OpKind,
}

impl<'a> Node<'a> {
    /// Source tensor `i`.
    fn src(&self, i: usize) -> Result<&'a Tensor> {
        match self.t.src.get(i) {
            Some(&id) => self.ctx.get(id),
            None => Err(Error::InvalidSplit(format!(
                "{}: missing source {i}",
                self.kind
            ))),
        }
    }

    /// The state of source `i`.
    fn st(&self, i: usize) -> Result<&'a SplitState> {
        self.s
            .get(i)
            .ok_or_else(|| Error::InvalidSplit(format!("{}: missing source state {i}", self.kind)))
    }

    /// The op refuses these states, because `why`.
    fn no(&self, why: &str) -> Result<Rule> {
        unsupported(
            self.kind,
            format!("{why} (sources: {})", fmt_states(self.s)),
        )
    }

    /// Reduce the partial ones among sources `idx`, if any.
    fn reduce_any(&self, idx: &[usize]) -> Option<Rule> {
        let p = partials(self.s, idx);
        (!p.is_empty()).then_some(Rule::Reduce(p))
    }

    /// Every source position.
    fn all(&self) -> Vec<usize> {
        (0..self.s.len()).collect()
    }
}

/// The rule of `t`'s op for source states `s` (see the module docs): one function per family
/// of ops, in the order of [`Op`].
fn rule(ctx: &Context, t: &Tensor, s: &[SplitState]) -> Result<Rule> {
    let n = Node {
        ctx,
        t,
        s,
        kind: t.op.kind(),
    };
    match t.op {
        Op::None => n.no("a leaf has no rule: its state comes from the loader"),
        Op::Dup
        | Op::Cont
        | Op::Reshape
        | Op::View { .. }
        | Op::Permute { .. }
        | Op::Transpose
        | Op::Cpy => copy_rule(&n),
        Op::GetRows => get_rows_rule(&n),
        Op::SetRows => set_rows_rule(&n),
        Op::Add | Op::Sub | Op::Mul | Op::Div => binary_rule(&n),
        Op::Scale { bias, .. } => match n.st(0)? {
            // a * s is linear; a * s + b adds b once per device.
            SplitState::Partial if bias != 0.0 => Ok(Rule::Reduce(vec![0])),
            other => Ok(Rule::State(other.clone())),
        },
        Op::MulMat { .. } => mul_mat(n.src(0)?, n.src(1)?, n.st(0)?, n.st(1)?, &|why| n.no(why)),
        Op::RmsNorm { .. } | Op::Norm { .. } => norm_rule(&n),
        Op::Rope(_) => rope_rule(&n),
        Op::SoftMax {
            max_bias, sinks, ..
        } => soft_max_rule(&n, max_bias, sinks),
        Op::DiagMaskInf { .. } => diag_mask_rule(&n),
        Op::Unary(_) => {
            if let Some(r) = n.reduce_any(&[0]) {
                return Ok(r);
            }
            Ok(Rule::State(n.st(0)?.clone()))
        }
        Op::Swiglu | Op::Geglu | Op::SwigluOai { .. } => glu_rule(&n),
        Op::Repeat => repeat_rule(&n),
        Op::Concat { dim } => concat_rule(&n, dim),
        Op::Argmax => argmax_rule(&n),
        Op::Argsort { .. } => argsort_rule(&n),
        Op::SumRows => sum_rows_rule(&n),
        Op::Clamp { .. } => {
            if let Some(r) = n.reduce_any(&[0]) {
                return Ok(r);
            }
            Ok(Rule::State(n.st(0)?.clone()))
        }
        Op::MulMatId { .. } => mul_mat_id_rule(&n),
        Op::AddId => add_id_rule(&n),
        // Not built by rgml's models; a split state over it is not worked out yet.
        Op::FlashAttnExt { .. } => n.no("FLASH_ATTN_EXT has no split rule"),
        Op::SsmConv => ssm_conv_rule(&n),
        Op::GatedDeltaNet { .. } => delta_net_rule(&n),
    }
}

/// Copies and views are linear: partial and mirrored pass through; splits are remapped.
fn copy_rule(n: &Node) -> Result<Rule> {
    use SplitState::Partial;
    let (kind, t) = (n.kind, n.t);
    match t.op {
        Op::Dup => Ok(Rule::State(n.st(0)?.clone())),
        Op::Cont | Op::Reshape => Ok(Rule::State(remap_order(
            kind,
            n.st(0)?,
            n.src(0)?.ne,
            t.ne,
        )?)),
        Op::View { offset } => Ok(Rule::State(remap_view(
            kind,
            n.st(0)?,
            n.src(0)?,
            t,
            offset,
        )?)),
        Op::Permute { axes } => Ok(Rule::State(permute(n.st(0)?, axes))),
        Op::Transpose => Ok(Rule::State(permute(n.st(0)?, [1, 0, 2, 3]))),
        _ => {
            let (a, b) = (n.st(0)?, n.st(1)?);
            if *b == Partial {
                return n.no("CPY into a destination holding partial sums");
            }
            if *a == Partial {
                // The destination (a cache, an output) holds full values.
                return Ok(Rule::Reduce(vec![0]));
            }
            let mapped = remap_order(kind, a, n.src(0)?.ne, n.src(1)?.ne)?;
            if same_placement(&mapped, b) {
                Ok(Rule::State(b.clone()))
            } else {
                n.no(&format!(
                    "the source, seen in the destination's shape, is {} but the destination is {}",
                    fmt_state(&mapped),
                    fmt_state(b)
                ))
            }
        }
    }
}

fn get_rows_rule(n: &Node) -> Result<Rule> {
    use SplitState::{Axis, Mirrored, Partial};
    if let Some(r) = n.reduce_any(&[1]) {
        return Ok(r);
    }
    let (table, idx) = (n.st(0)?, n.st(1)?);
    if *table == Partial && *idx != Mirrored {
        return Ok(Rule::Reduce(vec![0]));
    }
    match (table, idx) {
        // Gathering rows is linear in the table.
        (Partial | Mirrored, Mirrored) => Ok(Rule::State(table.clone())),
        (Axis { axis: 0, .. }, Mirrored) => Ok(Rule::State(table.clone())),
        (Mirrored, Axis { axis: 0, segments }) => Ok(Rule::State(Axis {
            axis: 1,
            segments: segments.clone(),
        })),
        // Table dims 2, 3 match index dims 1, 2: each device gathers from its matrices.
        (Axis { axis: ta, segments }, Axis { axis: ia, .. })
            if *ta >= 2
                && *ia + 1 == *ta
                && same_placement(
                    &Axis {
                        axis: *ia,
                        segments: segments.clone(),
                    },
                    idx,
                ) =>
        {
            Ok(Rule::State(table.clone()))
        }
        _ => n.no("GET_ROWS needs the table split on axis 0 (or mirrored) with mirrored indices, or matching splits of the matrix axes"),
    }
}

fn set_rows_rule(n: &Node) -> Result<Rule> {
    use SplitState::{Axis, Mirrored, Partial};
    if *n.st(0)? == Partial {
        return n.no("SET_ROWS into a destination holding partial sums");
    }
    if let Some(r) = n.reduce_any(&[1, 2]) {
        return Ok(r);
    }
    let (dst, rows_src, rows) = (n.st(0)?, n.st(1)?, n.st(2)?);
    if *rows != Mirrored {
        return n.no("SET_ROWS needs mirrored row indices");
    }
    match dst {
        Mirrored if *rows_src == Mirrored => Ok(Rule::State(Mirrored)),
        Axis { axis, .. }
            if *axis != 1
                && same_placement(dst, rows_src)
                && (*axis == 0 || n.src(2)?.ne[*axis - 1] == 1) =>
        {
            Ok(Rule::State(dst.clone()))
        }
        _ => n.no("SET_ROWS needs destination and source split alike on axis 0, 2 or 3 (indices broadcast there), or both mirrored"),
    }
}

/// ADD, SUB, MUL, DIV.
fn binary_rule(n: &Node) -> Result<Rule> {
    use SplitState::{Axis, Mirrored, Partial};
    let (a, b) = (n.st(0)?, n.st(1)?);
    let linear = matches!(
        (n.kind, a, b),
        (OpKind::Add | OpKind::Sub, Partial, Partial)
            | (OpKind::Mul | OpKind::Div, Partial, Mirrored)
            | (OpKind::Mul, Mirrored, Partial)
    );
    if linear {
        return Ok(Rule::State(Partial));
    }
    if let Some(r) = n.reduce_any(&n.all()) {
        return Ok(r);
    }
    let (ta, tb) = (n.src(0)?, n.src(1)?);
    match (a, b) {
        _ if a == b || same_placement(a, b) => Ok(Rule::State(a.clone())),
        (Axis { axis, .. }, Mirrored) if tb.ne[*axis] == 1 => Ok(Rule::State(a.clone())),
        (Axis { axis, .. }, Mirrored) if tb.ne[*axis] == ta.ne[*axis] => {
            n.no("src1 is mirrored at full size along src0's split axis: split it like src0")
        }
        (Mirrored, Axis { .. }) => {
            n.no("src0 is mirrored but src1 is split: the result would need src1 gathered")
        }
        _ => n.no("the operands are split differently"),
    }
}

/// RMS_NORM, NORM.
fn norm_rule(n: &Node) -> Result<Rule> {
    if let Some(r) = n.reduce_any(&[0]) {
        return Ok(r);
    }
    match n.st(0)? {
        SplitState::Axis { axis: 0, .. } => {
            n.no("row normalization needs whole rows (axis 0 unsplit)")
        }
        other => Ok(Rule::State(other.clone())),
    }
}

/// ROPE: positions and the optional frequency factors (a small weight, indexed by the global
/// pair) are read whole on every device, so they must be mirrored.
fn rope_rule(n: &Node) -> Result<Rule> {
    use SplitState::{Axis, Mirrored};
    let tables: Vec<usize> = (1..n.s.len()).collect();
    if let Some(r) = n.reduce_any(&tables) {
        return Ok(r);
    }
    if *n.st(1)? != Mirrored {
        return n.no("ROPE needs mirrored positions");
    }
    if n.s.len() > 2 && *n.st(2)? != Mirrored {
        return n.no("ROPE needs mirrored frequency factors");
    }
    match n.st(0)? {
        Axis { axis: 0, .. } => n.no("ROPE rotates pairs within axis 0: it must be whole"),
        Axis { axis: 2, .. } => {
            n.no("ROPE takes one position per axis-2 index: it must not be split")
        }
        // Rotation is linear, so partial sums rotate as well.
        other => Ok(Rule::State(other.clone())),
    }
}

fn soft_max_rule(n: &Node, max_bias: f32, sinks: bool) -> Result<Rule> {
    use SplitState::{Axis, Mirrored};
    if let Some(r) = n.reduce_any(&n.all()) {
        return Ok(r);
    }
    let a = n.st(0)?;
    if sinks {
        // One sink per head: split as the heads are, or whole where they are.
        let sinks = n.st(n.t.src.len() - 1)?;
        let fits = match (a, sinks) {
            (
                Axis { axis: 2, segments },
                Axis {
                    axis: 0,
                    segments: s,
                },
            ) => runs(segments) == runs(s),
            (Axis { axis: 2, .. }, _) | (_, Axis { .. }) => false,
            _ => true,
        };
        if !fits {
            return n.no("the sinks must be split as the heads (axis 2) are, or both whole");
        }
    }
    let mask = if n.t.src.len() > 1 + usize::from(sinks) {
        Some((n.src(1)?, n.st(1)?))
    } else {
        None
    };
    match a {
        Axis { axis: 0, .. } => n.no("SOFT_MAX needs whole rows (axis 0 unsplit)"),
        Axis { axis: 2, .. } if max_bias > 0.0 => {
            n.no("ALiBi slopes depend on the global head index: axis 2 must be whole")
        }
        Axis { axis, .. } => match mask {
            None => Ok(Rule::State(a.clone())),
            Some((_, Mirrored)) if mask.is_some_and(|(m, _)| m.ne[*axis] == 1) => {
                Ok(Rule::State(a.clone()))
            }
            Some((m, ms)) if m.ne[*axis] == n.src(0)?.ne[*axis] && same_placement(a, ms) => {
                Ok(Rule::State(a.clone()))
            }
            Some(_) => n.no("the mask must broadcast along the split axis or be split like src0"),
        },
        _ => match mask {
            Some((_, Axis { .. })) => n.no("a mirrored src0 with a split mask"),
            _ => Ok(Rule::State(a.clone())),
        },
    }
}

fn diag_mask_rule(n: &Node) -> Result<Rule> {
    if let Some(r) = n.reduce_any(&[0]) {
        return Ok(r);
    }
    match n.st(0)? {
        SplitState::Axis { axis: 0 | 1, .. } => {
            n.no("the causal mask depends on global row and column: axes 0 and 1 must be whole")
        }
        other => Ok(Rule::State(other.clone())),
    }
}

fn glu_rule(n: &Node) -> Result<Rule> {
    if let Some(r) = n.reduce_any(&n.all()) {
        return Ok(r);
    }
    let (a, b) = (n.st(0)?, n.st(1)?);
    if same_placement(a, b) {
        Ok(Rule::State(a.clone()))
    } else {
        n.no("a gated unit needs both operands split alike")
    }
}

/// REPEAT copies (linear: partial sums stay partial); a split axis that is not repeated stays
/// split alike (each device tiles its slice along the other axes), a repeated one is refused
/// (each device's tiles would interleave with the others').
fn repeat_rule(n: &Node) -> Result<Rule> {
    match n.st(0)? {
        SplitState::Axis { axis, .. } if n.src(0)?.ne.get(*axis) != n.t.ne.get(*axis) => {
            n.no("REPEAT cannot tile along its split axis")
        }
        other => Ok(Rule::State(other.clone())),
    }
}

fn concat_rule(n: &Node, dim: usize) -> Result<Rule> {
    use SplitState::{Axis, Mirrored, Partial};
    let (a, b) = (n.st(0)?, n.st(1)?);
    if *a == Partial && *b == Partial {
        return Ok(Rule::State(Partial));
    }
    if let Some(r) = n.reduce_any(&n.all()) {
        return Ok(r);
    }
    match (a, b) {
        (Mirrored, Mirrored) => Ok(Rule::State(Mirrored)),
        // Along the concatenated axis each device joins its two slices: the result's
        // segments are a's followed by b's.
        (
            Axis {
                axis: x,
                segments: sa,
            },
            Axis {
                axis: y,
                segments: sb,
            },
        ) if x == y && *x == dim => Ok(Rule::State(Axis {
            axis: dim,
            segments: sa.iter().chain(sb).cloned().collect(),
        })),
        (Axis { .. }, Axis { .. }) if same_placement(a, b) => Ok(Rule::State(a.clone())),
        _ => n.no("CONCAT needs both operands mirrored or split on the same axis"),
    }
}

fn argmax_rule(n: &Node) -> Result<Rule> {
    use SplitState::Axis;
    if let Some(r) = n.reduce_any(&[0]) {
        return Ok(r);
    }
    match n.st(0)? {
        Axis { axis: 0, .. } => n.no("ARGMAX needs whole rows (axis 0 unsplit)"),
        Axis { segments, .. } => Ok(Rule::State(Axis {
            axis: 0,
            segments: segments.clone(),
        })),
        other => Ok(Rule::State(other.clone())),
    }
}

/// SUM_ROWS is linear: partial sums stay partial, and rows split along axis 0 become partial
/// sums of their segments.
fn sum_rows_rule(n: &Node) -> Result<Rule> {
    match n.st(0)? {
        SplitState::Axis { axis: 0, .. } => Ok(Rule::State(SplitState::Partial)),
        other => Ok(Rule::State(other.clone())),
    }
}

/// ARGSORT sorts whole rows: rows split along another axis stay so.
fn argsort_rule(n: &Node) -> Result<Rule> {
    if let Some(r) = n.reduce_any(&[0]) {
        return Ok(r);
    }
    match n.st(0)? {
        SplitState::Axis { axis: 0, .. } => n.no("ARGSORT needs whole rows (axis 0 unsplit)"),
        other => Ok(Rule::State(other.clone())),
    }
}

/// MUL_MAT_ID `as` `[K, M, experts]` by `b` `[K, n_b, tokens]` routed by `ids` `[n_used,
/// tokens]`, giving `[M, n_used, tokens]`. The routing must be whole on every device; then,
/// as MUL_MAT: linear in `as` and in `b`, experts split by output rows give the result split
/// by rows, and a contraction split alike on both gives partial sums.
fn mul_mat_id_rule(n: &Node) -> Result<Rule> {
    use SplitState::{Axis, Mirrored, Partial};
    let (a, b, ids) = (n.st(0)?, n.st(1)?, n.st(2)?);
    if *ids != Mirrored {
        return n.no("MUL_MAT_ID needs the expert ids on every device");
    }
    match (a, b) {
        (Partial, Mirrored) | (Mirrored, Partial) => Ok(Rule::State(Partial)),
        (Partial, _) => Ok(Rule::Reduce(vec![0])),
        (_, Partial) => Ok(Rule::Reduce(vec![1])),
        (Mirrored, Mirrored) => Ok(Rule::State(Mirrored)),
        (Axis { axis: 1, segments }, Mirrored) => Ok(Rule::State(Axis {
            axis: 0,
            segments: segments.clone(),
        })),
        (Axis { axis: 0, .. }, Axis { axis: 0, .. }) if same_placement(a, b) => {
            Ok(Rule::State(Partial))
        }
        _ => n.no("no MUL_MAT_ID rule for these states"),
    }
}

/// ADD_ID: the ids whole on every device; then as ADD, rows split alike on axis 0 on both
/// sides (the bias rows split as the rows they are added to), or everything mirrored. A
/// partial source is reduced first (each device would add the other once).
fn add_id_rule(n: &Node) -> Result<Rule> {
    use SplitState::{Axis, Mirrored};
    if *n.st(2)? != Mirrored {
        return n.no("ADD_ID needs the row ids on every device");
    }
    if let Some(r) = n.reduce_any(&[0, 1]) {
        return Ok(r);
    }
    let (a, b) = (n.st(0)?, n.st(1)?);
    match (a, b) {
        (Mirrored, Mirrored) => Ok(Rule::State(Mirrored)),
        (Axis { axis: 0, .. }, Axis { axis: 0, .. }) if same_placement(a, b) => {
            Ok(Rule::State(a.clone()))
        }
        _ => n.no("no ADD_ID rule for these states"),
    }
}

/// SSM_CONV: each channel (axis 1 of the window and of the kernel, axis 0 of the result)
/// convolves alone, so channels split alike on both sides stay split; or everything mirrored.
/// A partial source is reduced first (the kernel's sum over taps is not linear in both).
fn ssm_conv_rule(n: &Node) -> Result<Rule> {
    use SplitState::{Axis, Mirrored};
    if let Some(r) = n.reduce_any(&n.all()) {
        return Ok(r);
    }
    let (x, c) = (n.st(0)?, n.st(1)?);
    match (x, c) {
        (Mirrored, Mirrored) => Ok(Rule::State(Mirrored)),
        (Axis { axis: 1, segments }, Axis { axis: 1, .. }) if same_placement(x, c) => {
            Ok(Rule::State(Axis {
                axis: 0,
                segments: segments.clone(),
            }))
        }
        _ => n.no("SSM_CONV needs its window and kernel mirrored or split alike by channel"),
    }
}

/// GATED_DELTA_NET: mirrored only. Its result packs every head's outputs and states into
/// rows of `S_v·H` values, so a split by head is not a split of one of its axes.
fn delta_net_rule(n: &Node) -> Result<Rule> {
    if let Some(r) = n.reduce_any(&n.all()) {
        return Ok(r);
    }
    if n.s.iter().all(|s| *s == SplitState::Mirrored) {
        Ok(Rule::State(SplitState::Mirrored))
    } else {
        n.no("GATED_DELTA_NET has no split rule: its sources must be mirrored")
    }
}

/// Source dim `i` goes to result dim `axes[i]`.
fn permute(state: &SplitState, axes: [usize; 4]) -> SplitState {
    match state {
        SplitState::Axis { axis, segments } => SplitState::Axis {
            axis: axes.get(*axis).copied().unwrap_or(*axis),
            segments: segments.clone(),
        },
        other => other.clone(),
    }
}

/// MUL_MAT `a` `[K, M, A2, A3]` by `b` `[K, N, B2, B3]` giving `[M, N, B2, B3]`.
fn mul_mat(
    ta: &Tensor,
    tb: &Tensor,
    a: &SplitState,
    b: &SplitState,
    no: &dyn Fn(&str) -> Result<Rule>,
) -> Result<Rule> {
    use SplitState::{Axis, Mirrored, Partial};
    match (a, b) {
        // The product is linear in each operand separately.
        (Partial, Mirrored) | (Mirrored, Partial) => return Ok(Rule::State(Partial)),
        (Partial, Partial) => return Ok(Rule::Reduce(vec![0, 1])),
        (Partial, _) => return Ok(Rule::Reduce(vec![0])),
        (_, Partial) => return Ok(Rule::Reduce(vec![1])),
        _ => {}
    }
    match (a, b) {
        (Mirrored, Mirrored) => Ok(Rule::State(Mirrored)),
        // Weights split by output rows: each device computes its rows of the result.
        (Axis { axis: 1, segments }, Mirrored) => Ok(Rule::State(Axis {
            axis: 0,
            segments: segments.clone(),
        })),
        // Contraction split alike on both sides: each device holds a partial dot product.
        (Axis { axis: 0, .. }, Axis { axis: 0, .. }) if same_placement(a, b) => {
            Ok(Rule::State(Partial))
        }
        (Axis { axis: 0, .. }, Axis { axis: 0, .. }) => {
            no("the contraction axis is split differently on the two operands")
        }
        (Mirrored, Axis { axis: 1, .. }) => Ok(Rule::State(b.clone())),
        // Batch axes: a broadcasts along them, so a mirrored `a` must have extent 1 there.
        (Mirrored, Axis { axis, .. }) if *axis >= 2 && ta.ne[*axis] == 1 => {
            Ok(Rule::State(b.clone()))
        }
        // Attention: both split by heads; `a` may hold fewer heads (grouped-query), each
        // device's share of `b` must then be its share of `a` times the ratio.
        (
            Axis {
                axis: x,
                segments: sa,
            },
            Axis { axis: y, .. },
        ) if x == y && *x >= 2 => {
            let (na, nb) = (ta.ne[*x], tb.ne[*x]);
            if na == 0 || !nb.is_multiple_of(na) {
                return no("src0's batch extent does not divide src1's");
            }
            let ratio = nb / na;
            let fits = scale_segments(sa, ratio, 1)
                .is_some_and(|segments| same_placement(&Axis { axis: *x, segments }, b));
            if fits {
                Ok(Rule::State(b.clone()))
            } else {
                no(&format!(
                    "src1's share of axis {x} on each device must be src0's times {ratio} (broadcast)"
                ))
            }
        }
        _ => no("no MUL_MAT rule for these states"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_and_compare() {
        let a = vec![Segment {
            sizes: vec![2, 0, 2],
            repeat: 2,
        }];
        assert_eq!(runs(&a), vec![(0, 2), (2, 2), (0, 2), (2, 2)]);
        let b = vec![
            Segment {
                sizes: vec![2, 0, 2],
                repeat: 1,
            },
            Segment {
                sizes: vec![2, 0, 2],
                repeat: 1,
            },
        ];
        assert_eq!(runs(&a), runs(&b));
        // Adjacent runs of one device merge: [3 on d0] equals [1 on d0][2 on d0, 0 on d1].
        let c = vec![
            Segment {
                sizes: vec![1, 0],
                repeat: 1,
            },
            Segment {
                sizes: vec![2, 0],
                repeat: 1,
            },
        ];
        assert_eq!(runs(&c), vec![(0, 3)]);
        assert!(scale_segments(&a, 1, 4).is_none());
        assert_eq!(
            scale_segments(&a, 3, 2).map(|s| s[0].sizes.clone()),
            Some(vec![3, 0, 3])
        );
    }

    #[test]
    fn remap_through_reshape_and_merge() {
        let segs = vec![Segment {
            sizes: vec![320, 256],
            repeat: 1,
        }];
        // 576 rows as 9 heads of 64.
        let s = remap_axis(
            OpKind::Reshape,
            0,
            &segs,
            [576, 3, 1, 1],
            [64, 9, 3, 1],
            dense_strides([64, 9, 3, 1]),
            0,
        )
        .unwrap();
        assert_eq!(s, SplitState::axis(1, vec![5, 4]));
        // ... and back.
        let back = remap_axis(
            OpKind::Reshape,
            1,
            &[Segment {
                sizes: vec![5, 4],
                repeat: 1,
            }],
            [64, 9, 3, 1],
            [576, 3, 1, 1],
            dense_strides([576, 3, 1, 1]),
            0,
        )
        .unwrap();
        assert_eq!(back, SplitState::axis(0, vec![320, 256]));
        // Shares that are not whole heads.
        let bad = vec![Segment {
            sizes: vec![300, 276],
            repeat: 1,
        }];
        assert!(remap_axis(
            OpKind::Reshape,
            0,
            &bad,
            [576, 3, 1, 1],
            [64, 9, 3, 1],
            dense_strides([64, 9, 3, 1]),
            0
        )
        .is_err());
    }
}
