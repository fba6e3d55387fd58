//! The engine: runs a job's node tasks on the thread pool, every thread visiting every node
//! and meeting the others at the barriers the plan asked for, while holding the guards of the
//! job's buffers.
//!
//! This module owns the threads, the work area and the abort callback; it trusts the job's
//! views (checked by [`super::plan`]) once it has checked, under the guards, that every buffer
//! is still where the views point.

use super::governor::Governor;
use super::plan::Job;
use crate::barrier::SpinBarrier;
use crate::buffer::CPU_ALIGNMENT;
use crate::kernels::{self, NodeTask, SharedWork, ThreadCtx};
use crate::pool::Pool;
use rgml::backend::{AlignedMem, HostAccess};
use rgml::{Buffer, Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A callback polled between nodes; returning `true` stops the computation with
/// [`Error::Aborted`].
pub type AbortCallback = Box<dyn Fn() -> bool + Send>;

/// What running a job needs besides the job itself.
pub(super) struct Engine {
    /// The device's name, for errors.
    pub(super) name: Arc<str>,
    pub(super) n_threads: usize,
    /// The compute threads, started by the first graph that needs more than one.
    pub(super) pool: Option<Pool>,
    pub(super) abort: Option<Mutex<AbortCallback>>,
    pub(super) work: AlignedMem,
    /// One work counter per node of the running job ([`ThreadCtx::claim`]), reset before each
    /// run; kept between runs so a run does not allocate.
    pub(super) claims: Vec<AtomicUsize>,
    /// How many of the `n_threads` each run uses.
    pub(super) governor: Governor,
}

pub(super) fn align64(n: usize) -> Result<usize> {
    n.checked_next_multiple_of(CPU_ALIGNMENT)
        .ok_or(Error::SizeOverflow)
}

impl Engine {
    /// Check the job's buffers, size the work area and run the tasks while holding the
    /// buffers' guards (exclusive for those written, shared for those only read).
    pub(super) fn execute(&mut self, job: &Job) -> Result<()> {
        let nth = self.n_threads;
        let shared_bytes = align64(job.shared)?;
        let pt_bytes = align64(job.per_thread.checked_mul(4).ok_or(Error::SizeOverflow)?)?;
        let total = pt_bytes
            .checked_mul(nth)
            .and_then(|b| b.checked_add(shared_bytes))
            .ok_or(Error::SizeOverflow)?;
        if self.work.len() < total {
            // Grow with headroom so a slowly growing context does not reallocate every token.
            self.work = AlignedMem::new(
                total.saturating_add(total / 4),
                CPU_ALIGNMENT,
                "CPU work area",
            )?;
        }
        // SAFETY (of the kernels' accesses in `run_tasks`): every view points inside one of
        // `job.buffers` (bounds checked in `prepare` against the size checked again by
        // `with_guards`); the memory stays allocated because the job holds an `Arc` of each
        // buffer; and `with_guards` holds each buffer's guard, whose base is the one the views
        // were computed from, until the run ends: exclusive for every buffer holding a node's
        // destination (the only memory kernels write), so no other safe code reads or writes
        // those bytes meanwhile, and shared for the buffers only read, so nothing writes them.
        with_guards(&self.name.clone(), &job.buffers, &mut || {
            self.run_tasks(&job.tasks, shared_bytes, pt_bytes)
        })
    }

    /// Run the tasks on the threads the governor gives this run: every thread runs every node
    /// in order (taking its share), with a barrier only before the nodes that `plan_syncs`
    /// marks; then tell the governor how long the threads waited at the barriers.
    pub(super) fn run_tasks(
        &mut self,
        tasks: &[NodeTask],
        shared_bytes: usize,
        pt_bytes: usize,
    ) -> Result<()> {
        let nth = self.n_threads;
        if nth > 1 && self.pool.as_ref().is_none_or(|p| p.n_threads() != nth) {
            self.pool = None;
            self.pool = Some(Pool::new(nth)?);
        }
        let base = SharedWork {
            ptr: self.work.ptr().as_ptr(),
            len: self.work.len(),
        };
        // The threads that work on this run (see `governor`): the pool's others return at once.
        let nth = self.governor.threads().min(nth);
        let barrier = SpinBarrier::new(nth);
        let started = Instant::now();
        if self.claims.len() < tasks.len() {
            self.claims.resize_with(tasks.len(), || AtomicUsize::new(0));
        }
        for c in &mut self.claims[..tasks.len()] {
            *c.get_mut() = 0;
        }
        let claims = &self.claims[..tasks.len()];
        let stop_at = AtomicUsize::new(usize::MAX);
        let error: Mutex<Option<(usize, Error)>> = Mutex::new(None);
        let abort = self.abort.as_ref();
        let name: &str = &self.name;
        let record = |j: usize, e: Error| {
            let mut slot = error.lock().unwrap_or_else(|p| p.into_inner());
            if slot.as_ref().is_none_or(|(k, _)| j < *k) {
                *slot = Some((j, e));
            }
            stop_at.fetch_min(j + 1, Ordering::AcqRel);
        };
        let body = |ith: usize| {
            if ith >= nth {
                return;
            }
            let pt_len = pt_bytes / 4;
            // SAFETY: the work area is `shared_bytes + nth * pt_bytes` bytes or more (sized in
            // `execute`), 64-byte aligned, and borrowed by this call for the whole run; thread
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
                if task.sync_before {
                    if j > 0 {
                        barrier.wait();
                    }
                    // Checked only just after a barrier, where every thread sees the same
                    // errors, so all threads stop at the same node.
                    if stop_at.load(Ordering::Acquire) <= j {
                        break;
                    }
                }
                let mut tc = ThreadCtx {
                    ith,
                    nth,
                    scratch: &mut *scratch,
                    shared,
                    barrier: &barrier,
                    claim: &claims[j],
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
                            backend: name.to_string(),
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
            }
        };
        match &mut self.pool {
            Some(pool) if nth > 1 => pool.run(&body)?,
            _ => body(0),
        }
        self.governor
            .record(nth, barrier.waited(), started.elapsed());
        match error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Take the guards of `buffers` (exclusive where the job writes, shared where it only reads; in
/// their order: id order, the order every compute path uses, so no deadlock), check each buffer
/// is where the job's views point, and run `f` while holding them all. Holds up to 8 guards per
/// call level instead of collecting them, so no allocation.
pub(super) fn with_guards(
    name: &str,
    buffers: &[(Arc<Buffer>, usize, usize, bool)],
    f: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    const AT_ONCE: usize = 8;
    let (now, rest) = buffers.split_at(buffers.len().min(AT_ONCE));
    let mut held: [Option<HostAccess<'_>>; AT_ONCE] = Default::default();
    for (slot, (b, base, size, writes)) in held.iter_mut().zip(now) {
        let g = if *writes {
            b.host_write()
        } else {
            b.host_read()
        };
        let g = g.ok_or_else(|| Error::Unsupported {
            backend: name.to_string(),
            what: format!("buffer '{}' is not host memory", b.name()),
        })?;
        if g.base().as_ptr() as usize != *base || g.size() != *size {
            return Err(Error::Backend {
                backend: name.to_string(),
                message: format!("buffer '{}' moved after the graph was prepared", b.name()),
            });
        }
        *slot = Some(g);
    }
    if rest.is_empty() {
        f()
    } else {
        with_guards(name, rest, f)
    }
}
