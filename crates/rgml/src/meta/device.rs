//! The meta device and its backend: several devices acting as one, each tensor split, mirrored
//! or partial across them (tensor parallelism).
//!
//! [`MetaBackend::graph_compute`] propagates split states through the graph
//! ([`super::propagate_graph`]; weights' states come from the meta buffer, which took them from
//! the [`SplitSource`]), records computed tensors' states in their meta buffers (so reading an
//! output gathers it), and builds one local graph per device: every tensor with its local
//! shape, stored in that device's child buffer at the tensor's own offset, views re-strided
//! through their root's local layout. The local graphs run piece by piece on the children's
//! backends, with an [`AllReduce`] wherever a partial sum must become whole.

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
use std::any::Any;
use std::collections::HashMap;
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

    fn as_any(&self) -> &dyn Any {
        self
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
    let meta = data.buffer.imp().as_any().downcast_ref::<MetaBuffer>()?;
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

    /// The local copy of `id` on device `d` (its sources already copied).
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
        lt.src =
            t.src
                .iter()
                .map(|s| {
                    local.maps[d].get(s).copied().ok_or_else(|| {
                        Error::InvalidSplit("a source was not localized first".into())
                    })
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
                let r_state = split.state(root).cloned().unwrap_or(SplitState::Mirrored);
                let (nb, offset) = local_view(t, r, &r_state, d)?;
                lt.nb = nb;
                lt.view_offset = offset;
                lt.view_src = Some(local.maps[d].get(&root).copied().ok_or_else(|| {
                    Error::InvalidSplit("a view root was not localized first".into())
                })?);
                lt.data = Some(TensorData {
                    buffer: child,
                    offset: data.offset + offset,
                });
            }
        }
        let lid = local.ctx.push(lt)?;
        local.maps[d].insert(id, lid);
        Ok(())
    }

    fn reduce(&mut self, local: &Local, ctx: &Context, id: TensorId) -> Result<()> {
        let t = ctx.get(id)?;
        let dims = t.ne.to_vec();
        let tensors: Vec<TensorId> = local
            .maps
            .iter()
            .map(|m| m.get(&id).copied())
            .collect::<Option<_>>()
            .ok_or_else(|| Error::InvalidSplit("a reduced tensor has no local copy".into()))?;
        if !self.reduces.contains_key(&dims) {
            let plan = AllReduce::new(&mut self.children, &dims)?;
            self.reduces.insert(dims.clone(), plan);
        }
        let plan = self
            .reduces
            .get_mut(&dims)
            .ok_or_else(|| Error::InvalidSplit("all-reduce plan missing".into()))?;
        plan.run(&mut self.children, &local.ctx, &tensors)?;
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
    if within >= inner {
        return Err(Error::InvalidSplit(format!(
            "view '{}' starts inside the split axis of '{}'",
            t.display_name(),
            r.display_name()
        )));
    }
    let offset = remap(t.view_offset - within)? + within;
    Ok((nb, offset))
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

    fn graph_compute(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
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
                let state = if split.is_reduced(id) {
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
        // Every tensor the graph touches, sources and view roots first.
        let order = graph.all_tensors(ctx)?;
        for &id in &order {
            for d in 0..n {
                self.localize(ctx, &split, &mut local, id, d)?;
            }
        }
        // Run the nodes in pieces, reducing partial sums where a node needs them whole.
        let mut before: HashMap<TensorId, Vec<TensorId>> = HashMap::new();
        let mut at_end = Vec::new();
        for r in &split.reduces {
            match r.before {
                Some(node) => before.entry(node).or_default().push(r.tensor),
                None => at_end.push(r.tensor),
            }
        }
        let nodes = graph.nodes();
        let mut start = 0;
        for (i, &id) in nodes.iter().enumerate() {
            if let Some(tensors) = before.get(&id) {
                self.run_piece(&local, &nodes[start..i])?;
                start = i;
                for &t in tensors {
                    self.reduce(&local, ctx, t)?;
                }
            }
        }
        self.run_piece(&local, &nodes[start..])?;
        for t in at_end {
            self.reduce(&local, ctx, t)?;
        }
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl MetaBackend {
    /// Run meta nodes `piece` on every device. A device holding an empty slice skips nodes
    /// without elements, and a matrix product over its empty share of the contraction axis is
    /// a zero partial sum: its output is zero-filled, in order with the rest.
    fn run_piece(&mut self, local: &Local, piece: &[TensorId]) -> Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        for (d, child) in self.children.iter_mut().enumerate() {
            let mut run: Vec<TensorId> = Vec::new();
            for id in piece {
                let lid = local.maps[d]
                    .get(id)
                    .copied()
                    .ok_or_else(|| Error::InvalidSplit("a node has no local copy".into()))?;
                let t = &local.ctx[lid];
                if t.nelements() == 0 {
                    continue;
                }
                let empty_dot = t.op == crate::op::Op::MulMat
                    && t.src.first().is_some_and(|&a| local.ctx[a].ne[0] == 0);
                if empty_dot {
                    if !run.is_empty() {
                        child.graph_compute(
                            &local.ctx,
                            &Graph::from_nodes(std::mem::take(&mut run)),
                        )?;
                    }
                    child.synchronize()?;
                    local.ctx.tensor_memset(lid, 0, 0, t.nbytes())?;
                    continue;
                }
                run.push(lid);
            }
            if !run.is_empty() {
                child.graph_compute_async(&local.ctx, &Graph::from_nodes(run))?;
            }
        }
        for c in &mut self.children {
            c.synchronize()?;
        }
        Ok(())
    }
}
