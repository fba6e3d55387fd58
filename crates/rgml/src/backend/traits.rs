//! The vocabulary of the backend API: the traits a backend implements ([`BufferType`],
//! [`BufferImpl`], [`HostMemory`], [`Device`], [`Backend`], [`EventImpl`]) and the handles they
//! pass each other ([`Buffer`], [`Event`], [`BufferTypeRef`], [`DeviceRef`]).
//!
//! These types name each other (a buffer type knows its device, a device hands out buffer
//! types, buffers and events, an event knows its device), so they are declared together here,
//! and this module imports nothing else of `backend` but the plain values of `props`, the
//! plan of `plan` and the concurrency plan of `concurrency`. What the handles do lives in their own modules: [`Buffer`]'s methods,
//! multi-buffers and tensor byte access in `buffer`. This module owns the traits' contracts
//! and their default methods (ggml's fallbacks), not any implementation.

use super::concurrency::Concurrency;
use super::plan::GraphPlan;
use super::props::{BackendParams, DeviceCaps, DeviceMemory, DeviceType};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{Tensor, TensorId};
use crate::trace::Trace;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, RwLock};

/// A shared buffer type.
pub type BufferTypeRef = Arc<dyn BufferType>;

/// A shared device.
pub type DeviceRef = Arc<dyn Device>;

/// Whether two shared objects (buffer types, devices) are the same instance.
pub fn same_instance<T: ?Sized>(a: &Arc<T>, b: &Arc<T>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// A kind of memory a device can allocate (ggml's `ggml_backend_buffer_type`).
pub trait BufferType: Send + Sync + Any {
    /// A name unique among buffer types (e.g. `"CPU"`).
    fn name(&self) -> &str;
    /// Allocate `size` bytes of this memory.
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>>;
    /// Alignment of tensor offsets inside a buffer.
    fn alignment(&self) -> usize;
    /// Largest single buffer (default: unbounded).
    fn max_size(&self) -> usize {
        usize::MAX
    }
    /// Bytes a tensor needs in this memory (default: `nbytes`; a device may pad).
    fn alloc_size(&self, tensor: &Tensor) -> usize {
        tensor.nbytes()
    }
    /// Whether buffers of this type are plain host memory readable by the CPU (default: no).
    fn is_host(&self) -> bool {
        false
    }
    /// The device that owns this memory, if any.
    fn device(&self) -> Option<DeviceRef> {
        None
    }
    /// Whether weight `tensor`, read only by ops of the kinds in `uses`, may be stored here
    /// (default: yes). Buffer types that keep weights in a layout of their own (ggml's "extra"
    /// buffer types such as CPU_REPACK, see [`crate::Device::extra_buffer_types`]) accept only
    /// the tensors and uses their device's kernels read in that layout.
    fn accepts_weight(&self, _tensor: &Tensor, _uses: &[crate::OpKind]) -> bool {
        true
    }
    /// Whether a new buffer's bytes are all zero (default: no, they may hold anything), so
    /// callers that need zeroed memory need not touch every page to clear it.
    fn alloc_is_zeroed(&self) -> bool {
        false
    }
}

/// The storage behind a [`Buffer`]: what a backend implements.
///
/// Every access to the bytes goes through [`Buffer`], which bounds-checks it and holds the
/// buffer's lock while it calls these methods: shared for [`get`](Self::get), exclusive for
/// the writes. The byte methods are therefore `unsafe` to call (only `Buffer` calls them, under
/// that lock), so an implementation may write through a shared reference (e.g. into an
/// [`AlignedMem`](super::AlignedMem)) without a lock of its own.
///
/// # Safety
/// The trait is `unsafe` to implement because compute kernels dereference [`base`](Self::base)
/// under the buffer's lock alone: when it returns `Some(ptr)`, `ptr` must be valid for reads
/// and writes of [`size`](Self::size) bytes, all initialised, for as long as the
/// implementation lives, and must be the same pointer on every call; and no method may touch
/// those bytes except while the caller holds the lock as documented on each method.
pub unsafe trait BufferImpl: Send + Sync + Any {
    /// Bytes of storage (at least the size the buffer was asked for).
    fn size(&self) -> usize;
    /// Start of the memory if it is host-addressable (ggml's `get_base`), else `None`.
    fn base(&self) -> Option<NonNull<u8>> {
        None
    }
    /// Whether the memory must not be written (e.g. a read-only file mapping).
    fn is_read_only(&self) -> bool {
        false
    }
    /// Prepare a tensor placed in this buffer (default: nothing to do).
    /// The tensor's storage (`data`) already points here. Must not touch the bytes.
    fn init_tensor(&self, _tensor: &Tensor) -> Result<()> {
        Ok(())
    }
    /// Write `data` at `offset`.
    ///
    /// # Safety
    /// The caller holds the owning buffer's exclusive lock.
    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Read `out.len()` bytes at `offset`.
    ///
    /// # Safety
    /// The caller holds the owning buffer's lock (shared or exclusive).
    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Fill `size` bytes at `offset` with `value`.
    ///
    /// # Safety
    /// The caller holds the owning buffer's exclusive lock.
    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()>;
    /// Copy `size` bytes from `src` (the storage of another buffer) at `src_offset` to
    /// `dst_offset` directly, if this buffer knows how (default: `Ok(false)`, the caller then
    /// copies through host memory).
    ///
    /// # Safety
    /// The caller holds this buffer's exclusive lock and `src`'s owning buffer's shared lock,
    /// and the two are different buffers.
    unsafe fn copy_from(
        &self,
        _dst_offset: usize,
        _src: &dyn BufferImpl,
        _src_offset: usize,
        _size: usize,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Fill the whole buffer with `value`.
    ///
    /// # Safety
    /// The caller holds the owning buffer's exclusive lock.
    unsafe fn clear(&self, value: u8) -> Result<()>;
    /// Forget per-tensor state (default: none). Must not touch the bytes.
    fn reset(&self) {}
}

/// Memory owned elsewhere that a buffer can wrap without copying (e.g. a file mapping).
pub trait HostMemory: Send + Sync {
    /// The bytes.
    fn bytes(&self) -> &[u8];
}

impl HostMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl HostMemory for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A block of memory of one buffer type (ggml's `ggml_backend_buffer`), shared by the tensors
/// placed in it.
///
/// Access is guarded: safe reads take a shared lock, safe writes an exclusive one, and graph
/// compute on host memory holds a guard for each buffer it touches
/// ([`Buffer::host_read`] for buffers it only reads, such as weights, so several computations
/// read them at once; [`Buffer::host_write`] for those it writes), so no two threads race on
/// the bytes. Its methods are in the `buffer` module.
pub struct Buffer {
    pub(super) imp: Box<dyn BufferImpl>,
    /// The parts of a multi-buffer (empty for a plain buffer).
    pub(super) parts: Vec<Arc<Buffer>>,
    pub(super) buffer_type: BufferTypeRef,
    pub(super) size: usize,
    pub(super) usage: AtomicU8,
    pub(super) id: u64,
    pub(super) lock: RwLock<()>,
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
    /// offers each weight to these first ([`BufferType::accepts_weight`]) and puts the rest in
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

/// What a device implements for events.
pub trait EventImpl: Send + Sync + Any {
    /// Block until the event is reached.
    fn synchronize(&self) -> Result<()>;
}

/// An event of one device (ggml's `ggml_backend_event`).
pub struct Event {
    device: DeviceRef,
    imp: Box<dyn EventImpl>,
}

impl Event {
    /// Wrap a device's event implementation.
    pub fn new(device: DeviceRef, imp: Box<dyn EventImpl>) -> Event {
        Event { device, imp }
    }
    /// The device the event belongs to.
    pub fn device(&self) -> &DeviceRef {
        &self.device
    }
    /// Block the host until the event is reached.
    pub fn synchronize(&self) -> Result<()> {
        self.imp.synchronize()
    }
    /// The implementation, for the owning backend.
    pub fn imp(&self) -> &dyn EventImpl {
        self.imp.as_ref()
    }
}
