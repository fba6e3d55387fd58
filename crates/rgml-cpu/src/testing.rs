//! Testing aids only (cargo feature `testing`, which only tests enable): a deliberately
//! *wrong* CPU backend, to check that graph comparison
//! ([`rgml::compare::compare_graph_backend`], `rgml compare`) finds a bad kernel at the right
//! node.
//!
//! [`PerturbBackend`] computes like [`CpuBackend`], but after every node whose op is the chosen
//! one it multiplies that node's output by [`PERTURB_FACTOR`]. [`PerturbDevice`] (named
//! `PerturbCPU`) hands out such backends, and [`PerturbRegistry`] exposes it for tests that go
//! through [`rgml::registry`]. The `rgml` binary never registers them. Never use these for real
//! work.

use crate::backend::CpuBackend;
use crate::device::CpuDevice;
use rgml::backend::{Backend, BackendParams, BufferTypeRef, DeviceCaps, DeviceMemory, DeviceType};
use rgml::registry::Registry;
use rgml::{Context, DType, DeviceRef, Graph, OpKind, Result, TensorId};
use std::sync::{Arc, Weak};

/// What a perturbed node's output is multiplied by.
pub const PERTURB_FACTOR: f32 = 1.01;

/// The name of the device [`PerturbDevice`] provides.
pub const PERTURB_DEVICE_NAME: &str = "PerturbCPU";

/// A CPU backend that scales the output of every node of op `op` by [`PERTURB_FACTOR`]
/// (contiguous F32 outputs; other outputs are left alone). Testing aid only.
pub struct PerturbBackend {
    inner: CpuBackend,
    op: OpKind,
    device: Option<DeviceRef>,
}

impl PerturbBackend {
    /// Wrap `inner`; nodes of `op` get perturbed outputs.
    pub fn new(inner: CpuBackend, op: OpKind) -> Self {
        PerturbBackend {
            inner,
            op,
            device: None,
        }
    }

    /// The op whose outputs are perturbed.
    pub fn op(&self) -> OpKind {
        self.op
    }
}

impl Backend for PerturbBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn device(&self) -> DeviceRef {
        self.device.clone().unwrap_or_else(|| self.inner.device())
    }

    fn default_buffer_type(&self) -> BufferTypeRef {
        self.inner.default_buffer_type()
    }

    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        // One node at a time, so nodes after a perturbed one see the perturbed value.
        for i in 0..graph.n_nodes() {
            let id = graph.nodes()[i];
            self.inner.graph_compute(ctx, &graph.view(i..i + 1))?;
            let t = ctx.get(id)?;
            if t.op.kind() == self.op && t.dtype == DType::F32 && t.is_contiguous() {
                let mut v = ctx.tensor_get_f32(id)?;
                v.iter_mut().for_each(|x| *x *= PERTURB_FACTOR);
                ctx.tensor_set_f32(id, &v)?;
            }
        }
        Ok(())
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.inner.supports_op(ctx, id)
    }

    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        self.inner.supports_buffer_type(buffer_type)
    }
}

/// The `PerturbCPU` device: host memory of its own buffer type, backends that are
/// [`PerturbBackend`]s. Testing aid only.
pub struct PerturbDevice {
    inner: Arc<CpuDevice>,
    op: OpKind,
    me: Weak<PerturbDevice>,
}

impl PerturbDevice {
    /// A `PerturbCPU` device perturbing `op`.
    pub fn new(op: OpKind) -> Arc<PerturbDevice> {
        Arc::new_cyclic(|me| PerturbDevice {
            inner: CpuDevice::new(PERTURB_DEVICE_NAME),
            op,
            me: me.clone(),
        })
    }
}

impl rgml::Device for PerturbDevice {
    fn name(&self) -> &str {
        PERTURB_DEVICE_NAME
    }

    fn description(&self) -> &str {
        "CPU with a deliberately perturbed op (testing aid)"
    }

    fn memory(&self) -> DeviceMemory {
        self.inner.memory()
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }

    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>> {
        params.check_known(&["n_threads"])?;
        let n_threads = params
            .get_parsed::<usize>("n_threads")?
            .unwrap_or_else(crate::default_n_threads);
        let inner = CpuBackend::with_device(self.inner.clone() as DeviceRef, n_threads)?;
        let mut backend = PerturbBackend::new(inner, self.op);
        backend.device = self.me.upgrade().map(|d| d as DeviceRef);
        Ok(Box::new(backend))
    }

    fn buffer_type(&self) -> BufferTypeRef {
        self.inner.buffer_type()
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.inner.supports_op(ctx, id)
    }

    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        self.inner.supports_buffer_type(buffer_type)
    }
}

/// A registry (named `PerturbCPU`) with the one [`PerturbDevice`]. Testing aid only.
pub struct PerturbRegistry {
    device: DeviceRef,
}

impl PerturbRegistry {
    /// A registry whose device perturbs `op`.
    pub fn new(op: OpKind) -> Self {
        PerturbRegistry {
            device: PerturbDevice::new(op),
        }
    }
}

impl Registry for PerturbRegistry {
    fn name(&self) -> &str {
        PERTURB_DEVICE_NAME
    }

    fn devices(&self) -> Vec<DeviceRef> {
        vec![self.device.clone()]
    }
}
