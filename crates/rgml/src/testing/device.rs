//! The test device and its backend: a synchronous host stream that computes a handful of f32
//! ops with the reference arithmetic of [`super::kernels`], in memory of its own
//! ([`VecBufferType`]), so the core can test its scheduler and meta device without a real
//! backend.
//!
//! This module owns what a test device claims (its type, ops, memory it reads, events) and the
//! checks its backend makes before computing: every node is one the device supports, and every
//! tensor a node reads or writes lives in memory the device can use. Those checks turn a
//! scheduler that hands a device the wrong node or the wrong memory into an error instead of
//! a silently right answer (any test buffer is readable through `Buffer::get`).
//!
//! Its memory has no base pointer, so it never counts as host-addressable
//! (`Buffer::is_host`): the scheduler's `op_offload` (which moves ops off weights in
//! addressable host memory) never applies to it.

use super::buffer::VecBufferType;
use super::kernels::{self, KERNELS};
use crate::backend::{
    same_instance, Backend, BackendParams, BufferTypeRef, Device, DeviceCaps, DeviceMemory,
    DeviceRef, DeviceType, Event, EventImpl,
};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::OpKind;
use crate::tensor::TensorId;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// How a [`TestDevice`] is set up (see [`TestDevice::builder`]).
#[derive(Clone, Debug)]
pub struct TestDeviceBuilder {
    name: String,
    cpu: bool,
    ops: Vec<OpKind>,
    events: bool,
    queued_copies: bool,
    memory: DeviceMemory,
    any_dtype: bool,
}

impl TestDeviceBuilder {
    /// A CPU device: its memory is host memory, and it reads any host memory (as ggml's CPU
    /// backend does); a scheduler takes one as its last backend.
    pub fn cpu(mut self) -> Self {
        self.cpu = true;
        self
    }

    /// Support only these of the kernels' ops ([`TestDevice::KERNELS`]; others are ignored),
    /// so a scheduler must send the rest elsewhere.
    pub fn ops(mut self, ops: &[OpKind]) -> Self {
        self.ops = KERNELS.into_iter().filter(|k| ops.contains(k)).collect();
        self
    }

    /// Support every kernel but `op`.
    pub fn without(mut self, op: OpKind) -> Self {
        self.ops.retain(|&k| k != op);
        self
    }

    /// Have events (a synchronous stream reaches each one as it is recorded).
    pub fn events(mut self) -> Self {
        self.events = true;
        self
    }

    /// Take copies from other test backends on its own stream (`cpy_tensor_async` returns
    /// true, the copy done at once: both streams are synchronous, so the source is complete);
    /// without this, callers fall back to synchronizing and a blocking copy.
    pub fn queued_copies(mut self) -> Self {
        self.queued_copies = true;
        self
    }

    /// Report `memory` as the device's (default: zeros, "unknown"), so allocations beyond
    /// its free bytes are refused.
    pub fn memory(mut self, memory: DeviceMemory) -> Self {
        self.memory = memory;
        self
    }

    /// Claim its ops on every dtype, not only the f32 its kernels compute: for tests of where
    /// weights go (a loader keeps a weight off a device that cannot compute what reads it)
    /// that never run such a graph here.
    pub fn any_dtype(mut self) -> Self {
        self.any_dtype = true;
        self
    }

    /// The device.
    pub fn build(self) -> Arc<TestDevice> {
        Arc::new_cyclic(|me: &Weak<TestDevice>| {
            let device: Weak<dyn Device> = me.clone();
            let mut buffer_type = VecBufferType::new(self.name.clone()).with_device(device);
            if !self.cpu {
                buffer_type = buffer_type.device_only();
            }
            TestDevice {
                buffer_type: buffer_type.shared(),
                config: self,
                computed: Mutex::new(Vec::new()),
                events_recorded: AtomicUsize::new(0),
                me: me.clone(),
            }
        })
    }
}

/// A device of the test backend (see the module docs). Each instance has memory of its own;
/// give instances different names, as the scheduler finds devices by name.
pub struct TestDevice {
    config: TestDeviceBuilder,
    buffer_type: BufferTypeRef,
    /// Names of the nodes its backends computed, in order.
    computed: Mutex<Vec<String>>,
    events_recorded: AtomicUsize,
    me: Weak<TestDevice>,
}

impl std::fmt::Debug for TestDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDevice")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl TestDevice {
    /// The ops the kernels compute (view ops are always supported besides).
    pub const KERNELS: [OpKind; 13] = KERNELS;

    /// A device called `name`: an accelerator with memory of its own (not host memory), every
    /// kernel, no events, blocking copies; change any of that before [`build`](TestDeviceBuilder::build).
    pub fn builder(name: impl Into<String>) -> TestDeviceBuilder {
        TestDeviceBuilder {
            name: name.into(),
            cpu: false,
            ops: KERNELS.to_vec(),
            events: false,
            queued_copies: false,
            memory: DeviceMemory::default(),
            any_dtype: false,
        }
    }

    /// An accelerator with every kernel (`builder(name).build()`).
    pub fn accel(name: impl Into<String>) -> Arc<TestDevice> {
        Self::builder(name).build()
    }

    /// A CPU device with every kernel (`builder(name).cpu().build()`).
    pub fn cpu(name: impl Into<String>) -> Arc<TestDevice> {
        Self::builder(name).cpu().build()
    }

    /// The names of the nodes its backends computed since the last call, in order.
    pub fn take_computed(&self) -> Vec<String> {
        std::mem::take(&mut *self.log())
    }

    /// Events recorded on its backends so far.
    pub fn events_recorded(&self) -> usize {
        self.events_recorded.load(Ordering::Relaxed)
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.computed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn shared(&self) -> Result<Arc<TestDevice>> {
        self.me.upgrade().ok_or_else(|| Error::Backend {
            backend: self.config.name.clone(),
            message: "the device was dropped".into(),
        })
    }

    /// Whether node `id`'s storage, and its sources', lie in memory this device can use.
    fn check_memory(&self, ctx: &Context, id: TensorId) -> Result<()> {
        let t = ctx.get(id)?;
        for &x in std::iter::once(&id).chain(&t.src) {
            let xt = ctx.get(x)?;
            let root = match xt.view_src {
                Some(r) => ctx.get(r)?,
                None => xt,
            };
            let data = root
                .data
                .as_ref()
                .or(xt.data.as_ref())
                .ok_or_else(|| Error::NoStorage(xt.display_name().to_string()))?;
            if !self.supports_buffer_type(data.buffer.buffer_type()) {
                return Err(Error::Backend {
                    backend: self.config.name.clone(),
                    message: format!(
                        "node '{}' uses '{}' in memory '{}' the device cannot use",
                        t.display_name(),
                        xt.display_name(),
                        data.buffer.name()
                    ),
                });
            }
        }
        Ok(())
    }
}

impl Device for TestDevice {
    fn name(&self) -> &str {
        &self.config.name
    }
    fn description(&self) -> &str {
        "rgml::testing reference device"
    }
    fn memory(&self) -> DeviceMemory {
        self.config.memory
    }
    fn device_type(&self) -> DeviceType {
        if self.config.cpu {
            DeviceType::Cpu
        } else {
            DeviceType::Accel
        }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            events: self.config.events,
            ..DeviceCaps::default()
        }
    }
    /// A backend; it takes no parameters.
    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>> {
        params.check_known(&[])?;
        Ok(Box::new(TestBackend {
            device: self.shared()?,
        }))
    }
    fn buffer_type(&self) -> BufferTypeRef {
        self.buffer_type.clone()
    }
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        let Ok(t) = ctx.get(id) else {
            return false;
        };
        let kind = t.op.kind();
        let dtypes_ok = self.config.any_dtype || kernels::dtypes_ok(ctx, t);
        kind.is_view() || (self.config.ops.contains(&kind) && dtypes_ok)
    }
    /// Its own memory; a CPU device also any host memory.
    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        same_instance(buffer_type, &self.buffer_type) || (self.config.cpu && buffer_type.is_host())
    }
    fn event_new(&self) -> Result<Event> {
        if !self.config.events {
            return Err(Error::Unsupported {
                backend: self.config.name.clone(),
                what: "events".into(),
            });
        }
        Ok(Event::new(self.shared()?, Box::new(TestEvent)))
    }
}

/// An event of a synchronous stream: reached once recorded, since the work before it is done.
struct TestEvent;

impl EventImpl for TestEvent {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// The stream of a [`TestDevice`]: computes each node when it is queued.
pub struct TestBackend {
    device: Arc<TestDevice>,
}

impl std::fmt::Debug for TestBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestBackend")
            .field("device", &self.device.config.name)
            .finish()
    }
}

impl Backend for TestBackend {
    fn name(&self) -> &str {
        &self.device.config.name
    }
    fn device(&self) -> DeviceRef {
        self.device.clone()
    }
    /// Checks every node (supported, memory usable) before computing any, then computes them
    /// in order.
    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        let mut nodes = Vec::with_capacity(graph.n_nodes());
        for &id in graph.nodes() {
            let t = ctx.get(id)?;
            if t.op.kind().is_view() {
                continue;
            }
            if !self.device.supports_op(ctx, id) {
                return Err(Error::Unsupported {
                    backend: self.name().to_string(),
                    what: format!("{} node '{}'", t.op.kind(), t.display_name()),
                });
            }
            self.device.check_memory(ctx, id)?;
            nodes.push(id);
        }
        for id in nodes {
            kernels::compute(ctx, id)?;
            let name = ctx.get(id)?.display_name().to_string();
            self.device.log().push(name);
        }
        Ok(())
    }
    fn cpy_tensor_async(
        &mut self,
        src_backend: &mut dyn Backend,
        ctx: &Context,
        src: TensorId,
        dst: TensorId,
    ) -> Result<bool> {
        if !self.device.config.queued_copies || !src_backend.is::<TestBackend>() {
            return Ok(false);
        }
        ctx.tensor_copy(src, dst)?;
        Ok(true)
    }
    fn event_record(&mut self, event: &Event) -> Result<()> {
        if event.device().name() != self.name() || !event.imp().is::<TestEvent>() {
            return Err(Error::Backend {
                backend: self.name().to_string(),
                message: format!("an event of device '{}'", event.device().name()),
            });
        }
        self.device.events_recorded.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
