//! The CPU backend (stream): plans a graph (buffers, layouts, work area), then runs its nodes in
//! order on a persistent thread pool, ggml-style: every thread visits every node, computes its
//! share, and meets the others at a barrier before the next node.
//!
//! This module owns the threading, the work area and the safety checks that make the kernels'
//! raw pointers sound (exclusive host guards, in-bounds extents, no writes to read-only memory,
//! sources overlapping a destination only as exact in-place aliases).

use crate::barrier::SpinBarrier;
use crate::buffer::{AlignedMem, CPU_ALIGNMENT};
use crate::kernels::{self, NodeTask, SharedWork, TensorView, ThreadCtx};
use rgml::backend::HostAccess;
use rgml::{Backend, Buffer, Context, DeviceRef, Error, Graph, Result, Tensor, TensorId};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A callback polled between nodes; returning `true` stops the computation with
/// [`Error::Aborted`].
pub type AbortCallback = Box<dyn Fn() -> bool + Send>;

/// A CPU compute stream.
pub struct CpuBackend {
    device: DeviceRef,
    n_threads: usize,
    pool: Option<rayon::ThreadPool>,
    abort: Option<Mutex<AbortCallback>>,
    work: AlignedMem,
    tasks: Vec<NodeTask>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("device", &self.device.name())
            .field("n_threads", &self.n_threads)
            .field("work_bytes", &self.work.len())
            .finish()
    }
}

fn align64(n: usize) -> Result<usize> {
    n.checked_next_multiple_of(CPU_ALIGNMENT)
        .ok_or(Error::SizeOverflow)
}

/// Bytes from element 0 to one past the last element, with overflow checks.
fn span(t: &Tensor) -> Result<usize> {
    if t.ne.contains(&0) {
        return Ok(0);
    }
    let bs = t.dtype.block_size();
    let mut bytes = (t.ne[0] / bs)
        .checked_mul(t.nb[0])
        .ok_or(Error::SizeOverflow)?;
    if bs == 1 {
        bytes = (t.ne[0] - 1)
            .checked_mul(t.nb[0])
            .and_then(|b| b.checked_add(t.dtype.block_bytes()))
            .ok_or(Error::SizeOverflow)?;
    }
    for i in 1..4 {
        bytes = (t.ne[i] - 1)
            .checked_mul(t.nb[i])
            .and_then(|b| b.checked_add(bytes))
            .ok_or(Error::SizeOverflow)?;
    }
    Ok(bytes)
}

impl CpuBackend {
    /// A backend on the registered "CPU" device (or a private one when none is registered)
    /// with `n_threads` threads (0 means 1).
    pub fn new(n_threads: usize) -> Result<CpuBackend> {
        let device = rgml::registry::device("CPU")
            .ok()
            .filter(|d| d.as_any().is::<crate::CpuDevice>())
            .unwrap_or_else(|| crate::CpuDevice::new("CPU") as DeviceRef);
        Self::with_device(device, n_threads)
    }

    /// A backend on `device` with `n_threads` threads (0 means 1).
    pub fn with_device(device: DeviceRef, n_threads: usize) -> Result<CpuBackend> {
        Ok(CpuBackend {
            device,
            n_threads: n_threads.max(1),
            pool: None,
            abort: None,
            work: AlignedMem::new(0)?,
            tasks: Vec::new(),
        })
    }

    /// Number of compute threads.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Use `n` compute threads from the next graph on (0 means 1).
    pub fn set_n_threads(&mut self, n: usize) {
        let n = n.max(1);
        if n != self.n_threads {
            self.n_threads = n;
            self.pool = None;
        }
    }

    /// Poll `callback` between nodes; when it returns `true` compute stops with
    /// [`Error::Aborted`].
    pub fn set_abort_callback(&mut self, callback: AbortCallback) {
        self.abort = Some(Mutex::new(callback));
    }

    /// Stop polling an abort callback.
    pub fn clear_abort_callback(&mut self) {
        self.abort = None;
    }

    /// Bytes of the work area kept between graphs.
    pub fn work_size(&self) -> usize {
        self.work.len()
    }

    fn pool(&mut self) -> Result<&rayon::ThreadPool> {
        if self.pool.is_none() {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(self.n_threads)
                .thread_name(|i| format!("rgml-cpu-{i}"))
                .build()
                .map_err(|e| Error::Backend {
                    backend: "CPU".into(),
                    message: format!("cannot start {} threads: {e}", self.n_threads),
                })?;
            self.pool = Some(pool);
        }
        self.pool.as_ref().ok_or_else(|| Error::Backend {
            backend: "CPU".into(),
            message: "thread pool missing".into(),
        })
    }

    /// Check every node, lock the buffers, build the node tasks and size the work area; then run.
    fn compute(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        let mut run: Vec<TensorId> = Vec::with_capacity(graph.n_nodes());
        let mut buffers: Vec<Arc<Buffer>> = Vec::new();
        let storage = |id: TensorId| -> Result<(&Tensor, &Arc<Buffer>, usize)> {
            let t = ctx.get(id)?;
            let d = t
                .data
                .as_ref()
                .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
            Ok((t, &d.buffer, d.offset))
        };
        for &id in graph.nodes() {
            let t = ctx.get(id)?;
            if t.op.kind().is_view() {
                continue;
            }
            kernels::check_supported(ctx, id)?;
            let (_, buf, _) = storage(id)?;
            if buf.is_read_only() {
                return Err(Error::ReadOnlyBuffer(format!(
                    "{} (destination of node '{}')",
                    buf.name(),
                    t.display_name()
                )));
            }
            buffers.push(buf.clone());
            for &s in &t.src {
                buffers.push(storage(s)?.1.clone());
            }
            run.push(id);
        }
        if run.is_empty() {
            return Ok(());
        }
        buffers.sort_by_key(|b| b.id());
        buffers.dedup_by_key(|b| b.id());
        for b in &buffers {
            if !b.is_host() {
                return Err(Error::Unsupported {
                    backend: self.device.name().to_string(),
                    what: format!("buffer '{}' is not host memory", b.name()),
                });
            }
        }
        // Exclusive guards in id order (the order every compute path uses, so no deadlock).
        let mut guards: Vec<(u64, HostAccess<'_>)> = Vec::with_capacity(buffers.len());
        for b in &buffers {
            let g = b.host_access().ok_or_else(|| Error::Unsupported {
                backend: self.device.name().to_string(),
                what: format!("buffer '{}' is not host memory", b.name()),
            })?;
            guards.push((b.id(), g));
        }
        let view = |id: TensorId| -> Result<(TensorView, u64, usize)> {
            let (t, buf, offset) = storage(id)?;
            let guard = guards
                .binary_search_by_key(&buf.id(), |(i, _)| *i)
                .map(|i| &guards[i].1)
                .map_err(|_| Error::NoStorage(t.display_name().to_string()))?;
            let len = span(t)?;
            if offset.checked_add(len).is_none_or(|end| end > guard.size()) {
                return Err(Error::OutOfBounds {
                    what: format!("tensor '{}' in buffer '{}'", t.display_name(), buf.name()),
                    offset,
                    size: len,
                    limit: guard.size(),
                });
            }
            let ptr = guard.base().as_ptr().wrapping_add(offset);
            if len > 0 && !(ptr as usize).is_multiple_of(t.dtype_align()) {
                return Err(Error::Unsupported {
                    backend: "CPU".into(),
                    what: format!(
                        "tensor '{}' is misaligned for {}",
                        t.display_name(),
                        t.dtype
                    ),
                });
            }
            Ok((TensorView::new(t, ptr), buf.id(), len))
        };

        self.tasks.clear();
        let (mut shared, mut per_thread) = (0usize, 0usize);
        for &id in &run {
            let t = &ctx[id];
            let (dst, dbuf, dlen) = view(id)?;
            let mut src: [Option<TensorView>; 3] = [None; 3];
            for (i, &s) in t.src.iter().enumerate() {
                let (sv, sbuf, slen) = view(s)?;
                if i >= src.len() {
                    return Err(Error::Unsupported {
                        backend: "CPU".into(),
                        what: format!("{} with {} sources", t.op.kind(), t.src.len()),
                    });
                }
                let exact = sv.ptr == dst.ptr && sv.ne == dst.ne && sv.nb == dst.nb;
                if !kernels::is_target_src(&t.op, i)
                    && sbuf == dbuf
                    && kernels::overlaps(sv.ptr, slen, dst.ptr, dlen)
                    && !(exact && sv.dtype == dst.dtype && kernels::inplace_capable(t.op.kind()))
                {
                    return Err(Error::Unsupported {
                        backend: "CPU".into(),
                        what: format!(
                            "{}: source {i} overlaps destination '{}' (only exact in-place aliases are allowed)",
                            t.op.kind(),
                            t.display_name()
                        ),
                    });
                }
                src[i] = Some(sv);
            }
            let (sh, pt) = kernels::work_size(ctx, t)?;
            shared = shared.max(sh);
            per_thread = per_thread.max(pt);
            self.tasks.push(NodeTask { op: t.op, dst, src });
        }

        let nth = self.n_threads;
        let shared_bytes = align64(shared)?;
        let pt_bytes = align64(per_thread.checked_mul(4).ok_or(Error::SizeOverflow)?)?;
        let total = pt_bytes
            .checked_mul(nth)
            .and_then(|b| b.checked_add(shared_bytes))
            .ok_or(Error::SizeOverflow)?;
        if self.work.len() < total {
            // Grow with headroom so a slowly growing context does not reallocate every token.
            self.work = AlignedMem::new(total.saturating_add(total / 4))?;
        }
        let result = self.run_tasks(shared_bytes, pt_bytes);
        drop(guards);
        result
    }

    fn run_tasks(&mut self, shared_bytes: usize, pt_bytes: usize) -> Result<()> {
        let nth = self.n_threads;
        if nth > 1 {
            self.pool()?;
        }
        let base = SharedWork {
            ptr: self.work.ptr().as_ptr(),
            len: self.work.len(),
        };
        let barrier = SpinBarrier::new(nth);
        let stop_at = AtomicUsize::new(usize::MAX);
        let error: Mutex<Option<(usize, Error)>> = Mutex::new(None);
        let tasks = &self.tasks;
        let abort = self.abort.as_ref();
        let record = |j: usize, e: Error| {
            let mut slot = error.lock().unwrap_or_else(|p| p.into_inner());
            if slot.as_ref().is_none_or(|(k, _)| j < *k) {
                *slot = Some((j, e));
            }
            stop_at.fetch_min(j + 1, Ordering::AcqRel);
        };
        let body = |ith: usize| {
            let pt_len = pt_bytes / 4;
            // SAFETY: the work area is `shared_bytes + nth * pt_bytes` bytes or more (sized in
            // `compute`), 64-byte aligned, and borrowed by this call for the whole run; thread
            // `ith` alone uses the range `[shared + ith * pt, shared + (ith + 1) * pt)`.
            let scratch: &mut [f32] = unsafe {
                std::slice::from_raw_parts_mut(
                    base.at(shared_bytes + ith * pt_bytes).cast::<f32>(),
                    pt_len,
                )
            };
            let shared = SharedWork {
                ptr: base.at(0),
                len: shared_bytes,
            };
            for (j, task) in tasks.iter().enumerate() {
                if stop_at.load(Ordering::Acquire) <= j {
                    break;
                }
                let mut tc = ThreadCtx {
                    ith,
                    nth,
                    scratch: &mut *scratch,
                    shared,
                    barrier: &barrier,
                };
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    kernels::compute(task, &mut tc)
                }));
                match res {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => record(j, e),
                    Err(_) => record(
                        j,
                        Error::Backend {
                            backend: "CPU".into(),
                            message: format!("kernel for {} panicked", task.op.kind()),
                        },
                    ),
                }
                if ith == 0 {
                    if let Some(cb) = abort {
                        let cb = cb.lock().unwrap_or_else(|p| p.into_inner());
                        if cb() {
                            record(j, Error::Aborted);
                        }
                    }
                }
                barrier.wait();
            }
        };
        if nth == 1 {
            body(0);
        } else {
            if let Some(pool) = &self.pool {
                pool.broadcast(|c| body(c.index()));
            }
        }
        match error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Alignment a tensor's element 0 needs for the kernels' typed accesses.
trait DTypeAlign {
    fn dtype_align(&self) -> usize;
}

impl DTypeAlign for Tensor {
    fn dtype_align(&self) -> usize {
        match self.dtype {
            rgml::DType::F32 | rgml::DType::I32 => 4,
            _ => 2,
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        self.device.name()
    }

    fn device(&self) -> DeviceRef {
        self.device.clone()
    }

    fn graph_compute(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        self.compute(ctx, graph)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
