//! The meta device and its backend: several devices acting as one, each tensor split, mirrored
//! or partial across them (tensor parallelism).
//!
//! [`MetaBackend::graph_compute_async`] propagates split states through the graph
//! ([`super::propagate_graph`]; weights' states come from the meta buffer, which took them from
//! the [`SplitSource`]), records computed tensors' states in their meta buffers (so reading an
//! output gathers it), and builds one local graph per device: every tensor with its local
//! shape, stored in that device's child buffer at the tensor's own offset, views re-strided
//! through their root's local layout. The local graphs run piece by piece on the children's
//! backends, with an [`AllReduce`] wherever a partial sum must become whole, and an all-gather
//! wherever a split computed tensor must (the gathered tensor is written whole over its slices,
//! in place: each child holds the whole size at the tensor's offset; later readers get local
//! copies in the whole layout).

use super::allreduce::AllReduce;
use super::buffer::{MetaBuffer, MetaBufferType, SplitSource};
use super::propagate::{propagate_graph, GraphSplit};
use super::split::SplitState;
use crate::backend::{
    same_instance, Backend, BackendParams, BufferTypeRef, DeviceCaps, DeviceMemory, DeviceRef,
    DeviceType,
};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{contiguous_strides, Tensor, TensorData, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

/// Several devices as one (`Meta(CPU0,CPU1)`).
pub struct MetaDevice {
    name: String,
    children: Vec<DeviceRef>,
    buffer_type: BufferTypeRef,
    me: Weak<MetaDevice>,
}

impl MetaDevice {
    /// A meta device over `children` (in order; each tensor's slices follow it), with the
    /// weights' split states from `source`.
    pub fn new(children: Vec<DeviceRef>, source: Arc<dyn SplitSource>) -> Result<Arc<MetaDevice>> {
        if children.is_empty() {
            return Err(Error::InvalidSplit("a meta device needs devices".into()));
        }
        let types: Vec<BufferTypeRef> = children.iter().map(|d| d.buffer_type()).collect();
        let name = format!(
            "Meta({})",
            children
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(",")
        );
        Ok(Arc::new_cyclic(|me: &Weak<MetaDevice>| {
            let weak: Weak<dyn crate::backend::Device> = me.clone();
            MetaDevice {
                name,
                children,
                buffer_type: Arc::new(MetaBufferType::build(types, source, Some(weak))),
                me: me.clone(),
            }
        }))
    }

    /// The devices, in order.
    pub fn children(&self) -> &[DeviceRef] {
        &self.children
    }
}

impl crate::backend::Device for MetaDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        "tensor parallelism over several devices"
    }

    /// The children's memory added up.
    fn memory(&self) -> DeviceMemory {
        self.children
            .iter()
            .map(|d| d.memory())
            .fold(DeviceMemory::default(), |a, m| DeviceMemory {
                free: a.free.saturating_add(m.free),
                total: a.total.saturating_add(m.total),
            })
    }

    fn device_type(&self) -> DeviceType {
        self.children[0].device_type()
    }

    /// What every child offers; the meta backend itself runs synchronously and has no events.
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_io: false,
            host_buffer: false,
            buffer_from_host_ptr: false,
            events: false,
        }
    }

    /// One backend per child, each given `params`.
    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>> {
        let children = self
            .children
            .iter()
            .map(|d| d.init_backend(params))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(MetaBackend {
            name: self.name.clone(),
            device: self.me()?,
            children,
            reduces: HashMap::new(),
        }))
    }

    fn buffer_type(&self) -> BufferTypeRef {
        self.buffer_type.clone()
    }

    /// Whether every child supports the op at full size (whether its split states allow it
    /// locally is only known with the graph: an unsupported split is an error at compute).
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.children.iter().all(|d| d.supports_op(ctx, id))
    }

    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        same_instance(buffer_type, &self.buffer_type)
    }
}

impl MetaDevice {
    fn me(&self) -> Result<DeviceRef> {
        let me: Arc<MetaDevice> = self
            .me
            .upgrade()
            .ok_or_else(|| Error::InvalidSplit("the meta device was dropped".into()))?;
        Ok(me)
    }
}

/// The stream of a meta device: one stream per child.
pub struct MetaBackend {
    name: String,
    device: DeviceRef,
    children: Vec<Box<dyn Backend>>,
    /// All-reduce plans by shape.
    reduces: HashMap<Vec<usize>, AllReduce>,
}

/// The meta buffer holding `t` (its root's), and the root's offset there.
fn meta_storage<'a>(ctx: &'a Context, t: &'a Tensor) -> Option<(&'a MetaBuffer, &'a TensorData)> {
    let root = match t.view_src {
        Some(r) => ctx.get(r).ok()?,
        None => t,
    };
    let data = root.data.as_ref()?;
    let meta = data.buffer.imp().downcast_ref::<MetaBuffer>()?;
    Some((meta, data))
}

/// Device `d`'s local copies of a graph's tensors, all in one context (so one all-reduce can
/// name every device's copy).
struct Local {
    ctx: Context,
    /// Per device: meta tensor id -> local tensor id.
    maps: Vec<HashMap<TensorId, TensorId>>,
}

impl MetaBackend {
    fn n(&self) -> usize {
        self.children.len()
    }

    /// The local copy of `id` on device `d` as computed (its sources already copied).
    fn localize(
        &self,
        ctx: &Context,
        split: &GraphSplit,
        local: &mut Local,
        id: TensorId,
        d: usize,
    ) -> Result<()> {
        if local.maps[d].contains_key(&id) {
            return Ok(());
        }
        let t = ctx.get(id)?;
        let state = split.state(id).cloned().unwrap_or(SplitState::Mirrored);
        let root_state = match t.view_src {
            Some(root) => split.state(root).cloned().unwrap_or(SplitState::Mirrored),
            None => state.clone(),
        };
        let lid = self.local_copy(
            ctx,
            &mut local.ctx,
            &local.maps[d],
            id,
            d,
            &state,
            &root_state,
        )?;
        local.maps[d].insert(id, lid);
        Ok(())
    }

    /// Push device `d`'s copy of meta tensor `id` into `local_ctx`: shape from `state`, stored
    /// in child `d` at the tensor's own offset, a view re-strided through its root's local
    /// layout (`root_state`), sources and view root taken from `map`.
    #[allow(clippy::too_many_arguments)]
    fn local_copy(
        &self,
        ctx: &Context,
        local_ctx: &mut Context,
        map: &HashMap<TensorId, TensorId>,
        id: TensorId,
        d: usize,
        state: &SplitState,
        root_state: &SplitState,
    ) -> Result<TensorId> {
        let t = ctx.get(id)?;
        let (meta, data) = meta_storage(ctx, t).ok_or_else(|| {
            Error::InvalidSplit(format!(
                "tensor '{}' is not in a meta buffer of {}",
                t.display_name(),
                self.name
            ))
        })?;
        let child = meta
            .children()
            .get(d)
            .ok_or_else(|| Error::InvalidSplit("a meta buffer with too few children".into()))?
            .clone();
        let mut lt = t.clone();
        lt.ne = state.local_shape(t.ne, d);
        lt.src = t
            .src
            .iter()
            .map(|s| {
                map.get(s)
                    .copied()
                    .ok_or_else(|| Error::InvalidSplit("a source was not localized first".into()))
            })
            .collect::<Result<_>>()?;
        match t.view_src {
            None => {
                lt.nb = contiguous_strides(t.dtype, lt.ne)?;
                lt.data = Some(TensorData {
                    buffer: child,
                    offset: data.offset,
                });
            }
            Some(root) => {
                let r = ctx.get(root)?;
                let (nb, offset) = local_view(t, r, root_state, d)?;
                lt.nb = nb;
                lt.view_offset = offset;
                lt.view_src = Some(map.get(&root).copied().ok_or_else(|| {
                    Error::InvalidSplit("a view root was not localized first".into())
                })?);
                lt.data = Some(TensorData {
                    buffer: child,
                    offset: data.offset + offset,
                });
            }
        }
        local_ctx.push(lt)
    }

    /// All-reduce the partial sums held in `tensors` (one local tensor per device, shape
    /// `dims`).
    fn reduce(&mut self, local: &Context, dims: &[usize], tensors: &[TensorId]) -> Result<()> {
        let dims = dims.to_vec();
        if !self.reduces.contains_key(&dims) {
            let plan = AllReduce::new(&mut self.children, &dims)?;
            self.reduces.insert(dims.clone(), plan);
        }
        let plan = self
            .reduces
            .get_mut(&dims)
            .ok_or_else(|| Error::InvalidSplit("all-reduce plan missing".into()))?;
        plan.run(&mut self.children, local, tensors)?;
        for c in &mut self.children {
            c.synchronize()?;
        }
        Ok(())
    }
}

/// Strides and offset of view `t` of root `r` in `r`'s local layout on device `d`. The root is
/// dense; a split of its axis `a` keeps the bytes below the axis (`inner`), shortens the axis
/// and so shrinks the stride of everything above it (`outer`). A view's stride inside the
/// inner block or along the axis stays; an outer stride scales with the axis. The view must
/// start at the axis's beginning (propagation only lets views keep the split axis whole).
fn local_view(
    t: &Tensor,
    r: &Tensor,
    r_state: &SplitState,
    d: usize,
) -> Result<([usize; 4], usize)> {
    let SplitState::Axis { axis, .. } = r_state else {
        return Ok((t.nb, t.view_offset));
    };
    let a = *axis;
    let inner = r.nb[a];
    let outer = inner * r.ne[a];
    let local_len = r_state.local_shape(r.ne, d)[a];
    let local_outer = inner * local_len;
    let remap = |bytes: usize| -> Result<usize> {
        if bytes < outer || outer == 0 {
            return Ok(bytes);
        }
        if !bytes.is_multiple_of(outer) {
            return Err(Error::InvalidSplit(format!(
                "view '{}' strides across the split axis of '{}'",
                t.display_name(),
                r.display_name()
            )));
        }
        Ok(bytes / outer * local_outer)
    };
    let nb = [
        remap(t.nb[0])?,
        remap(t.nb[1])?,
        remap(t.nb[2])?,
        remap(t.nb[3])?,
    ];
    let within = t.view_offset % outer.max(1);
    // A view may start at a run of the split (a fused projection's K or V rows): locally, at
    // this device's share of the runs before it.
    let (first, rest) = (within / inner.max(1), within % inner.max(1));
    let local_first = local_run_start(r_state, first, d).ok_or_else(|| {
        Error::InvalidSplit(format!(
            "view '{}' starts inside the split axis of '{}'",
            t.display_name(),
            r.display_name()
        ))
    })?;
    let offset = remap(t.view_offset - within)? + local_first * inner + rest;
    Ok((nb, offset))
}

/// Where axis index `first` of a split, the start of one of its runs, is on device `d`: the
/// device's share of the runs before it (`None` if `first` is inside a run).
fn local_run_start(state: &SplitState, first: usize, d: usize) -> Option<usize> {
    let SplitState::Axis { segments, .. } = state else {
        return (first == 0).then_some(0);
    };
    let (mut at, mut local) = (0usize, 0usize);
    for s in segments {
        if at == first {
            return Some(local);
        }
        let run: usize = s.sizes.iter().sum();
        let mine = s.sizes.get(d).copied().unwrap_or(0);
        if run == 0 {
            continue;
        }
        // Whole runs of this segment before `first`.
        let n = ((first - at) / run).min(s.repeat);
        at += n * run;
        local += n * mine;
        if at == first {
            return Some(local);
        }
        if n < s.repeat {
            return None;
        }
    }
    (at == first).then_some(local)
}

impl Backend for MetaBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn device(&self) -> DeviceRef {
        self.device.clone()
    }

    fn synchronize(&mut self) -> Result<()> {
        for c in &mut self.children {
            c.synchronize()?;
        }
        Ok(())
    }

    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        let n = self.n();
        // Leaves (weights, inputs, caches) have the states their meta buffers recorded.
        let leaf_state = |id: TensorId| -> Option<SplitState> {
            let t = ctx.get(id).ok()?;
            if t.view_src.is_some() {
                return None;
            }
            let (meta, data) = meta_storage(ctx, t)?;
            meta.split_state(data.offset)
        };
        let split = propagate_graph(ctx, graph, leaf_state, n)?;
        // Computed tensors' states, so that reading one gathers its slices.
        for &id in graph.nodes() {
            let t = ctx.get(id)?;
            if t.view_src.is_some() {
                continue;
            }
            if let (Some((meta, data)), Some(state)) = (meta_storage(ctx, t), split.state(id)) {
                let state = if split.is_reduced(id) || split.is_gathered(id) {
                    SplitState::Mirrored
                } else {
                    state.clone()
                };
                meta.record(data.offset, t, state)?;
            }
        }
        let mut local = Local {
            ctx: Context::new(),
            maps: vec![HashMap::new(); n],
        };
        // Every tensor the graph touches, as computed; sources and view roots first.
        let order = graph.all_tensors(ctx)?;
        for &id in &order {
            for d in 0..n {
                self.localize(ctx, &split, &mut local, id, d)?;
            }
        }
        let steps = self.plan(ctx, graph, &split, &order, &mut local)?;
        for step in &steps {
            match step {
                Step::Run(per_device) => self.run_piece(&local.ctx, per_device)?,
                Step::Reduce { dims, tensors } => self.reduce(&local.ctx, dims, tensors)?,
                Step::Gather { parts, whole } => {
                    gather_in_place(ctx, &local.ctx, &split, parts, whole)?
                }
            }
        }
        Ok(())
    }
}

impl MetaBackend {
    /// Order the work of a graph: runs of nodes (per device, the local copies), cut by the
    /// all-reduces and all-gathers. After a gather the gathered tensor, its views, and every
    /// node reading them get new local copies in the whole (mirrored) layout.
    fn plan(
        &self,
        ctx: &Context,
        graph: &Graph,
        split: &GraphSplit,
        order: &[TensorId],
        local: &mut Local,
    ) -> Result<Vec<Step>> {
        let mut reduces_before: HashMap<TensorId, Vec<TensorId>> = HashMap::new();
        let mut reduces_at_end = Vec::new();
        for r in &split.reduces {
            match r.before {
                Some(node) => reduces_before.entry(node).or_default().push(r.tensor),
                None => reduces_at_end.push(r.tensor),
            }
        }
        let mut gathers_before: HashMap<TensorId, Vec<TensorId>> = HashMap::new();
        for g in &split.gathers {
            gathers_before.entry(g.before).or_default().push(g.tensor);
        }
        let mut views_of: HashMap<TensorId, Vec<TensorId>> = HashMap::new();
        for &x in order {
            if let Some(r) = ctx[x].view_src {
                views_of.entry(r).or_default().push(x);
            }
        }
        let mut walk = Walk::new(local.maps.clone());
        for &id in graph.nodes() {
            if let Some(tensors) = reduces_before.get(&id) {
                walk.flush();
                for &t in tensors {
                    walk.reduce(ctx, t)?;
                }
            }
            if let Some(roots) = gathers_before.get(&id) {
                walk.flush();
                for &r in roots {
                    let views = views_of.get(&r).map(Vec::as_slice).unwrap_or_default();
                    self.gather_step(ctx, local, &mut walk, r, views)?;
                }
            }
            self.refresh_if_stale(ctx, split, local, &mut walk, id)?;
            for (d, map) in walk.cur.iter().enumerate() {
                let lid = map
                    .get(&id)
                    .copied()
                    .ok_or_else(|| Error::InvalidSplit("a node has no local copy".into()))?;
                walk.run[d].push(lid);
            }
        }
        walk.flush();
        for t in reduces_at_end {
            walk.reduce(ctx, t)?;
        }
        Ok(walk.steps)
    }

    /// An all-gather of split root `r` before the current node: every device gets a whole
    /// (mirrored) local copy of `r` and of its `views`, from then on.
    fn gather_step(
        &self,
        ctx: &Context,
        local: &mut Local,
        walk: &mut Walk,
        r: TensorId,
        views: &[TensorId],
    ) -> Result<()> {
        let mirrored = SplitState::Mirrored;
        let parts = walk.copies(r)?;
        let mut whole = Vec::with_capacity(self.n());
        for (d, map) in walk.cur.iter_mut().enumerate() {
            let lid = self.local_copy(ctx, &mut local.ctx, map, r, d, &mirrored, &mirrored)?;
            map.insert(r, lid);
            whole.push(lid);
        }
        walk.steps.push(Step::Gather {
            parts: (r, parts),
            whole,
        });
        walk.gathered.insert(r);
        walk.moved.insert(r);
        for &v in views {
            for (d, map) in walk.cur.iter_mut().enumerate() {
                let lid = self.local_copy(ctx, &mut local.ctx, map, v, d, &mirrored, &mirrored)?;
                map.insert(v, lid);
            }
            walk.moved.insert(v);
        }
        Ok(())
    }

    /// Node `id` gets new local copies when its memory was gathered (then whole, mirrored) or
    /// when a source or its view root has a new copy (then as computed, reading the new one).
    fn refresh_if_stale(
        &self,
        ctx: &Context,
        split: &GraphSplit,
        local: &mut Local,
        walk: &mut Walk,
        id: TensorId,
    ) -> Result<()> {
        let root = |x: TensorId| ctx[x].view_src.unwrap_or(x);
        let t = ctx.get(id)?;
        let in_gathered = walk.gathered.contains(&root(id));
        let stale = in_gathered
            || t.src.iter().any(|s| walk.moved.contains(s))
            || t.view_src.is_some_and(|r| walk.moved.contains(&r));
        if !stale {
            return Ok(());
        }
        let state_of = |x: TensorId| {
            if in_gathered {
                SplitState::Mirrored
            } else {
                split.state(x).cloned().unwrap_or(SplitState::Mirrored)
            }
        };
        let (state, root_state) = (state_of(id), state_of(root(id)));
        for (d, map) in walk.cur.iter_mut().enumerate() {
            let lid = self.local_copy(ctx, &mut local.ctx, map, id, d, &state, &root_state)?;
            map.insert(id, lid);
        }
        walk.moved.insert(id);
        Ok(())
    }

    /// Run one piece: device `d` computes its local nodes `per_device[d]`. A device holding
    /// an empty slice skips nodes without elements, and a matrix product over its empty share
    /// of the contraction axis is a zero partial sum: its output is zero-filled, in order with
    /// the rest.
    fn run_piece(&mut self, local: &Context, per_device: &[Vec<TensorId>]) -> Result<()> {
        for (child, piece) in self.children.iter_mut().zip(per_device) {
            let mut run: Vec<TensorId> = Vec::new();
            for &lid in piece {
                let t = &local[lid];
                if t.nelements() == 0 {
                    continue;
                }
                let empty_dot = matches!(t.op, crate::op::Op::MulMat { .. })
                    && t.src.first().is_some_and(|&a| local[a].ne[0] == 0);
                if empty_dot {
                    if !run.is_empty() {
                        child.graph_compute(local, &Graph::from_nodes(std::mem::take(&mut run)))?;
                    }
                    child.synchronize()?;
                    local.tensor_memset(lid, 0, 0, t.nbytes())?;
                    continue;
                }
                run.push(lid);
            }
            if !run.is_empty() {
                child.graph_compute_async(local, &Graph::from_nodes(run))?;
            }
        }
        for c in &mut self.children {
            c.synchronize()?;
        }
        Ok(())
    }
}

/// Where [`MetaBackend::plan`]'s walk over a graph's nodes stands.
struct Walk {
    /// The local copy each meta tensor has at this point of the walk, per device.
    cur: Vec<HashMap<TensorId, TensorId>>,
    /// Roots all-gathered so far.
    gathered: HashSet<TensorId>,
    /// Meta tensors whose current copy differs from the as-computed one.
    moved: HashSet<TensorId>,
    steps: Vec<Step>,
    /// The nodes of the run being gathered, per device.
    run: Vec<Vec<TensorId>>,
}

impl Walk {
    fn new(cur: Vec<HashMap<TensorId, TensorId>>) -> Walk {
        let n = cur.len();
        Walk {
            cur,
            gathered: HashSet::new(),
            moved: HashSet::new(),
            steps: Vec::new(),
            run: vec![Vec::new(); n],
        }
    }

    /// End the current run of nodes (if any) as a step.
    fn flush(&mut self) {
        if self.run.iter().any(|r| !r.is_empty()) {
            let n = self.run.len();
            self.steps.push(Step::Run(std::mem::replace(
                &mut self.run,
                vec![Vec::new(); n],
            )));
        }
    }

    /// The current local copies of meta tensor `id`, one per device.
    fn copies(&self, id: TensorId) -> Result<Vec<TensorId>> {
        self.cur
            .iter()
            .map(|m| m.get(&id).copied())
            .collect::<Option<_>>()
            .ok_or_else(|| Error::InvalidSplit("a tensor has no local copy".into()))
    }

    /// An all-reduce of meta tensor `t`'s current local copies.
    fn reduce(&mut self, ctx: &Context, t: TensorId) -> Result<()> {
        self.steps.push(Step::Reduce {
            dims: ctx.get(t)?.ne.to_vec(),
            tensors: self.copies(t)?,
        });
        Ok(())
    }
}

/// One step of a meta graph's work.
enum Step {
    /// Local nodes per device, run side by side.
    Run(Vec<Vec<TensorId>>),
    /// All-reduce these local tensors (one per device) of shape `dims`.
    Reduce {
        dims: Vec<usize>,
        tensors: Vec<TensorId>,
    },
    /// All-gather meta tensor `parts.0` from its split local copies `parts.1` into the whole
    /// local copies `whole` (same memory), one per device.
    Gather {
        parts: (TensorId, Vec<TensorId>),
        whole: Vec<TensorId>,
    },
}

/// Read every device's slice of split tensor `id`, join them on the host, and write the whole
/// tensor over each device's slice (the child holds the whole size at that offset).
fn gather_in_place(
    ctx: &Context,
    local: &Context,
    split: &GraphSplit,
    (id, parts): &(TensorId, Vec<TensorId>),
    whole: &[TensorId],
) -> Result<()> {
    let t = ctx.get(*id)?;
    let state = split
        .state(*id)
        .ok_or_else(|| Error::InvalidSplit("a gathered tensor has no state".into()))?;
    let slices = parts
        .iter()
        .map(|&lid| {
            let mut bytes = vec![0u8; local[lid].nbytes()];
            local.tensor_get(lid, 0, &mut bytes)?;
            Ok(bytes)
        })
        .collect::<Result<Vec<_>>>()?;
    let joined = super::scatter::gather(t.dtype, t.ne, state, &slices)?;
    for &lid in whole {
        local.tensor_set(lid, 0, &joined)?;
    }
    Ok(())
}
