//! Devices and backends (streams).

use super::buffer::{Buffer, BufferTypeRef, HostMemory};
use super::event::Event;
use super::plan::GraphPlan;
use crate::alloc::Concurrency;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::TensorId;
use crate::trace::Trace;
use std::any::Any;
use std::sync::Arc;

/// A shared device.
pub type DeviceRef = Arc<dyn Device>;

/// What kind of processor a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// The host CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// A GPU sharing host memory.
    IntegratedGpu,
    /// An accelerator used alongside the CPU (e.g. a BLAS library).
    Accel,
}

impl DeviceType {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Gpu => "gpu",
            DeviceType::IntegratedGpu => "igpu",
            DeviceType::Accel => "accel",
        }
    }
}

/// Memory figures in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes free now.
    pub free: usize,
    /// Bytes in total.
    pub total: usize,
}

/// Optional capabilities of a device (ggml's `ggml_backend_dev_caps`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Set/get/copy can run asynchronously on its backends.
    pub async_io: bool,
    /// It offers a pinned host buffer type for staging.
    pub host_buffer: bool,
    /// It can wrap host memory as a buffer without copying.
    pub buffer_from_host_ptr: bool,
    /// It supports events.
    pub events: bool,
}

/// `key=value` parameters for a backend, parsed from `"NAME:key=value,key=value"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendParams {
    pairs: Vec<(String, String)>,
}

impl BackendParams {
    /// Parse `"k=v,k2=v2"` (empty string: no parameters).
    pub fn parse(text: &str) -> Result<BackendParams> {
        let mut pairs = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                return Err(Error::InvalidParams {
                    params: text.to_string(),
                    reason: format!("'{item}' is not key=value"),
                });
            };
            if k.trim().is_empty() {
                return Err(Error::InvalidParams {
                    params: text.to_string(),
                    reason: format!("'{item}' has an empty key"),
                });
            }
            pairs.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(BackendParams { pairs })
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key` parsed as `T`, if given.
    pub fn get_parsed<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| Error::InvalidParams {
                params: format!("{key}={v}"),
                reason: format!("cannot parse '{v}' for '{key}'"),
            }),
        }
    }

    /// An error if any key is not in `known`.
    pub fn check_known(&self, known: &[&str]) -> Result<()> {
        match self
            .pairs
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((k, _)) => Err(Error::InvalidParams {
                params: k.clone(),
                reason: format!("unknown key '{k}' (known: {})", known.join(", ")),
            }),
        }
    }

    /// Add or replace a parameter.
    pub fn set(&mut self, key: &str, value: impl ToString) {
        self.pairs.push((key.to_string(), value.to_string()));
    }
}

/// A physical or logical device (ggml's `ggml_backend_device`).
pub trait Device: Send + Sync + Any {
    /// Short unique name (`"CPU"`, `"Vulkan0"`).
    fn name(&self) -> &str;
    /// Human-readable description.
    fn description(&self) -> &str;
    /// Free and total memory.
    fn memory(&self) -> DeviceMemory;
    /// The kind of device.
    fn device_type(&self) -> DeviceType;
    /// Optional capabilities.
    fn caps(&self) -> DeviceCaps;
    /// A new stream on this device.
    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>>;
    /// The device's own memory.
    fn buffer_type(&self) -> BufferTypeRef;
    /// Memory for weights in layouts of the device's own that its kernels read faster (ggml's
    /// extra buffer types, e.g. CPU_REPACK), in order of preference (default: none). A loader
    /// offers each weight to these first ([`crate::backend::BufferType::accepts_weight`]) and puts the rest in
    /// [`Device::buffer_type`]. Tensors in them read and write through `Buffer::get` / `set` in
    /// the usual layout (the buffer converts), but are not plain host memory.
    fn extra_buffer_types(&self) -> Vec<BufferTypeRef> {
        Vec::new()
    }
    /// Pinned host memory for faster transfers (default: none).
    fn host_buffer_type(&self) -> Option<BufferTypeRef> {
        None
    }
    /// Wrap host memory as a buffer without copying (default: unsupported).
    fn buffer_from_host_memory(
        &self,
        _memory: Arc<dyn HostMemory>,
        _max_tensor_size: usize,
    ) -> Result<Arc<Buffer>> {
        Err(Error::Unsupported {
            backend: self.name().to_string(),
            what: "buffers from host memory".into(),
        })
    }
    /// Whether backends of this device can compute node `id`.
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool;
    /// Whether backends of this device can use memory of `buffer_type`.
    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool;
    /// Whether the device wants to run `id` even though its weights are elsewhere (default: no).
    fn offload_op(&self, _ctx: &Context, _id: TensorId) -> bool {
        false
    }
    /// A new event (default: unsupported; schedulers then synchronize instead).
    fn event_new(&self) -> Result<Event> {
        Err(Error::Unsupported {
            backend: self.name().to_string(),
            what: "events".into(),
        })
    }
}

/// A stream of work on one device (ggml's `ggml_backend`). Methods take `&mut self`: one
/// stream is used from one place at a time.
pub trait Backend: Send + Any {
    /// Name (usually the device's).
    fn name(&self) -> &str;
    /// The device this stream runs on.
    fn device(&self) -> DeviceRef;
    /// Memory this backend allocates by default (default: the device's buffer type).
    fn default_buffer_type(&self) -> BufferTypeRef {
        self.device().buffer_type()
    }
    /// Write tensor bytes, possibly asynchronously (default: synchronize, then a blocking write).
    fn set_tensor_async(
        &mut self,
        ctx: &Context,
        id: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        self.synchronize()?;
        ctx.tensor_set(id, offset, data)
    }
    /// Read tensor bytes; complete when this returns (default: synchronize, then a blocking read).
    fn get_tensor_async(
        &mut self,
        ctx: &Context,
        id: TensorId,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        self.synchronize()?;
        ctx.tensor_get(id, offset, out)
    }
    /// Copy `src` (computed by `src_backend`) into `dst` on this stream without blocking, if
    /// this backend can (default: `Ok(false)`: the caller synchronizes and copies through host).
    fn cpy_tensor_async(
        &mut self,
        _src_backend: &mut dyn Backend,
        _ctx: &Context,
        _src: TensorId,
        _dst: TensorId,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Wait for all queued work (default: nothing is queued).
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
    /// Queue the computation of every node of `graph` (whose tensors have storage this backend
    /// can use) and return, possibly before it completes (ggml's `graph_compute_async`, the
    /// required slot); errors of the queued work surface at
    /// [`synchronize`](Self::synchronize). The caller must not read or overwrite the graph's
    /// tensors before synchronizing (or waiting for an event recorded after it). A backend that
    /// computes synchronously implements this and keeps the default `synchronize`.
    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()>;
    /// Compute `graph`; the results are complete when this returns (ggml's
    /// `ggml_backend_graph_compute`: the async slot, then [`synchronize`](Self::synchronize)).
    fn graph_compute(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        self.graph_compute_async(ctx, graph)?;
        self.synchronize()
    }
    /// Prepare `graph` of `ctx` once for computing it many times (ggml's `graph_plan_create`).
    /// Default: unsupported (callers then use [`graph_compute_async`](Self::graph_compute_async),
    /// which backends with plans implement by finding or making one).
    fn graph_plan_create(&mut self, _ctx: &Context, _graph: &Graph) -> Result<GraphPlan> {
        Err(Error::Unsupported {
            backend: self.name().to_string(),
            what: "graph plans".into(),
        })
    }
    /// Queue the computation of a plan made by [`graph_plan_create`](Self::graph_plan_create)
    /// (ggml's `graph_plan_compute`), on `ctx`, which must be the context the plan was made
    /// from with unchanged metadata ([`GraphPlan::check_current`]). Default: unsupported.
    fn graph_plan_compute_async(&mut self, _ctx: &Context, _plan: &GraphPlan) -> Result<()> {
        Err(Error::Unsupported {
            backend: self.name().to_string(),
            what: "graph plans".into(),
        })
    }
    /// Whether this stream can compute node `id` (default: ask the device).
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.device().supports_op(ctx, id)
    }
    /// Whether this stream can use memory of `buffer_type` (default: ask the device).
    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        self.device().supports_buffer_type(buffer_type)
    }
    /// Whether this stream wants node `id` although its weights live elsewhere (default: ask the device).
    fn offload_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.device().offload_op(ctx, id)
    }
    /// Mark `event` as reached once the work queued so far completes (default: unsupported).
    fn event_record(&mut self, _event: &Event) -> Result<()> {
        Err(Error::Unsupported {
            backend: self.name().to_string(),
            what: "events".into(),
        })
    }
    /// Make later work on this stream wait for `event` (default: block until it is reached).
    fn event_wait(&mut self, event: &Event) -> Result<()> {
        event.synchronize()
    }
    /// Which nodes of `graph` this stream may run at the same time, for the graph allocator
    /// (see [`Concurrency`]); `None` (the default): it runs them one after another, so memory
    /// freed by one node may be reused by the next.
    fn graph_concurrency(&self, _ctx: &Context, _graph: &Graph) -> Result<Option<Concurrency>> {
        Ok(None)
    }
    /// Record this stream's own work (command buffers, copies) into `trace` on track `track`,
    /// or stop recording with `None` (default: the stream records nothing itself).
    fn set_trace(&mut self, _trace: Option<(Arc<Trace>, usize)>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse() {
        let p = BackendParams::parse("n_threads=4, foo = bar").unwrap();
        assert_eq!(p.get("foo"), Some("bar"));
        assert_eq!(p.get_parsed::<usize>("n_threads").unwrap(), Some(4));
        assert!(p.get_parsed::<usize>("foo").is_err());
        assert!(p.check_known(&["n_threads"]).is_err());
        assert!(BackendParams::parse("novalue").is_err());
        assert!(BackendParams::parse("=3").is_err());
        assert_eq!(BackendParams::parse("").unwrap(), BackendParams::default());
    }
}
