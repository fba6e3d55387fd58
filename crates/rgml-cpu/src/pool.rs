//! The compute threads: `n - 1` persistent workers plus the calling thread as thread 0, as
//! ggml's threadpool. [`Pool::run`] hands every thread the same job and returns once all have
//! finished it, without allocating: the job is published by bumping a generation counter.
//!
//! Waiting is active for a bounded time (spinning, then yielding so that threads sharing a core
//! still make progress), then parking: a graph launch right after the previous one (a decode
//! loop) finds the workers still waiting actively and starts them in well under a microsecond,
//! while idle workers sleep on a condition variable instead of burning a core (tests run in
//! parallel on small machines, so nothing here spins without bound).

use rgml::{Error, Result};
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a thread waits actively for the next job (workers) or for the workers to finish
/// (caller) before parking.
const SPIN: Duration = Duration::from_micros(50);

/// Busy-wait rounds before an active wait starts yielding: a thread waiting for another that
/// shares its core must give the core up, or both lose the whole active wait.
const PURE_SPINS: u32 = 128;

/// The active part of a wait (here and at [`crate::barrier::SpinBarrier`]): spin a number of
/// rounds, then yield, until a time has passed.
pub(crate) struct Spin {
    pure_spins: u32,
    active: Duration,
    rounds: u32,
    start: Option<Instant>,
}

impl Spin {
    /// `pure_spins` busy-wait rounds, then yielding until `active` has passed.
    pub(crate) fn new(pure_spins: u32, active: Duration) -> Spin {
        Spin {
            pure_spins,
            active,
            rounds: 0,
            start: None,
        }
    }

    /// Wait a little; `false` once it is time to park instead.
    pub(crate) fn step(&mut self) -> bool {
        if self.rounds < self.pure_spins {
            self.rounds += 1;
            std::hint::spin_loop();
            return true;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        if start.elapsed() > self.active {
            return false;
        }
        std::thread::yield_now();
        true
    }
}

/// A job with its lifetime erased; only dereferenced between its publication and the
/// worker's completion count (see [`Pool::run`]).
type ErasedJob = *const (dyn Fn(usize) + Sync + 'static);

/// What the caller and the workers share.
struct Shared {
    /// Bumped (with `job` set) to publish a job.
    generation: AtomicUsize,
    /// The current job: written by the caller only while no worker runs a job (before the
    /// generation bump that publishes it); read by workers after they see that bump.
    job: UnsafeCell<Option<ErasedJob>>,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
    /// A worker's job panicked during the current run.
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Parked workers wait on `wake` under `lock`; `sleepers` counts them so a run only makes
    /// a wake-up call when someone sleeps.
    lock: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
    /// The caller parks on `done` (under `lock`) while the last workers finish.
    done: Condvar,
    caller_sleeps: AtomicBool,
}

// SAFETY: the only non-`Sync` field is `job`; its accesses are ordered by `generation`
// (Release on publish, Acquire in the workers) and `remaining` (Release when a worker is done,
// Acquire in the caller before the next write), so no write races a read (see `Pool::run`).
// The pointee is `Sync`, so calling it from several threads is sound.
unsafe impl Sync for Shared {}
// SAFETY: as above; the erased job pointer is only used while `Pool::run` keeps it alive.
unsafe impl Send for Shared {}

/// A pool of `n` compute threads: the caller and `n - 1` workers.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Start `n - 1` workers (`n == 0` behaves as 1).
    pub(crate) fn new(n: usize) -> Result<Pool> {
        let mut pool = Pool {
            shared: Arc::new(Shared {
                generation: AtomicUsize::new(0),
                job: UnsafeCell::new(None),
                remaining: AtomicUsize::new(0),
                panicked: AtomicBool::new(false),
                shutdown: AtomicBool::new(false),
                lock: Mutex::new(()),
                wake: Condvar::new(),
                sleepers: AtomicUsize::new(0),
                done: Condvar::new(),
                caller_sleeps: AtomicBool::new(false),
            }),
            workers: Vec::with_capacity(n.saturating_sub(1)),
        };
        for i in 1..n.max(1) {
            let shared = pool.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("rgml-cpu-{i}"))
                .spawn(move || worker_main(&shared, i))
                // On error, dropping `pool` stops and joins the workers started so far.
                .map_err(|e| Error::Backend {
                    backend: "CPU".into(),
                    message: format!("cannot start {n} threads: {e}"),
                })?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Number of threads, the caller included.
    pub(crate) fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `f(i)` once for every thread index `i` in `0..n_threads()`: `f(0)` on the calling
    /// thread, the others on the workers, concurrently. Returns once every call has returned.
    /// A panicking `f` is caught (the threads stay usable) and reported as an error.
    pub(crate) fn run(&mut self, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
        let s = &*self.shared;
        let workers = self.workers.len();
        if workers > 0 {
            let borrowed: *const (dyn Fn(usize) + Sync + '_) = f;
            // SAFETY: a lifetime erasure (same pointer, only the trait object's lifetime bound
            // changes). The workers dereference the pointer only between seeing the generation
            // bump below and decrementing `remaining`, and this function does not return (nor
            // unwind: `f(0)` runs under `catch_unwind`, and the waiting below cannot panic)
            // before `remaining` is 0, i.e. before every worker has finished with `f`. So `f`
            // outlives every use of the erased pointer.
            let erased: ErasedJob = unsafe { std::mem::transmute(borrowed) };
            s.panicked.store(false, Ordering::Relaxed);
            s.remaining.store(workers, Ordering::Relaxed);
            // SAFETY: no worker reads `job` now: each finished the previous job (this is
            // `&mut self`, and the previous `run` returned only once `remaining` was 0, read
            // with Acquire) and reads it again only after the generation bump below.
            unsafe { *s.job.get() = Some(erased) };
            s.generation.fetch_add(1, Ordering::SeqCst);
            // Pairs with the SeqCst increment of `sleepers` in `worker_main`: either the worker
            // sees the new generation before parking, or we see it asleep and wake it (taking
            // the lock, so the wake-up cannot fall between its check and its wait).
            if s.sleepers.load(Ordering::SeqCst) > 0 {
                let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
                s.wake.notify_all();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        if workers > 0 {
            wait_done(s);
            // SAFETY: every worker is done with the job (`remaining` is 0, read with Acquire),
            // and none reads `job` before the next publication.
            unsafe { *s.job.get() = None };
        }
        if mine.is_err() || s.panicked.load(Ordering::Acquire) {
            return Err(Error::Backend {
                backend: "CPU".into(),
                message: "a compute thread panicked".into(),
            });
        }
        Ok(())
    }
}

/// Wait (spin, then park) until every worker has finished the current job.
fn wait_done(s: &Shared) {
    let mut spin = Spin::new(PURE_SPINS, SPIN);
    while s.remaining.load(Ordering::Acquire) != 0 {
        if !spin.step() {
            let mut g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.caller_sleeps.store(true, Ordering::SeqCst);
            while s.remaining.load(Ordering::SeqCst) != 0 {
                g = s.done.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            s.caller_sleeps.store(false, Ordering::Relaxed);
            return;
        }
    }
}

fn worker_main(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a generation other than the one last run (spin, then park).
        let mut spin = Spin::new(PURE_SPINS, SPIN);
        let mut gen = s.generation.load(Ordering::Acquire);
        while gen == seen && !s.shutdown.load(Ordering::Acquire) {
            if !spin.step() {
                let mut g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen
                    && !s.shutdown.load(Ordering::SeqCst)
                {
                    g = s.wake.wait(g).unwrap_or_else(|p| p.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            gen = s.generation.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = gen;
        // SAFETY: the caller wrote `job` before the generation bump we just saw (Acquire) and
        // does not write it again before we decrement `remaining` below.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: `Pool::run` keeps the job alive until `remaining` reaches 0, which
            // happens only after this call returns or unwinds.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(index))).is_err() {
                s.panicked.store(true, Ordering::Release);
            }
        }
        // Always counted done, panic or not, so `run` never hangs.
        if s.remaining.fetch_sub(1, Ordering::SeqCst) == 1 && s.caller_sleeps.load(Ordering::SeqCst)
        {
            let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.done.notify_one();
        }
    }
}

impl Drop for Pool {
    /// Stop the workers and join them.
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_once_per_run() {
        for n in [1, 2, 3, 5] {
            let mut pool = Pool::new(n).unwrap();
            assert_eq!(pool.n_threads(), n);
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for round in 1..=200 {
                pool.run(&|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
                for c in &counts {
                    assert_eq!(c.load(Ordering::Relaxed), round);
                }
            }
        }
    }

    #[test]
    fn runs_after_the_workers_parked() {
        let mut pool = Pool::new(3).unwrap();
        let sum = AtomicU64::new(0);
        for round in 0..3u64 {
            // Long enough for every worker to stop spinning and park.
            std::thread::sleep(Duration::from_millis(5));
            pool.run(&|i| {
                sum.fetch_add(i as u64 + 1, Ordering::Relaxed);
            })
            .unwrap();
            assert_eq!(sum.load(Ordering::Relaxed), 6 * (round + 1));
        }
    }

    #[test]
    fn a_panicking_job_is_an_error_and_the_pool_keeps_working() {
        let mut pool = Pool::new(3).unwrap();
        for bad in [0, 2] {
            let err = pool.run(&|i| assert_ne!(i, bad, "job {i} panics on purpose"));
            assert!(matches!(err, Err(Error::Backend { .. })), "{err:?}");
            let ran = AtomicUsize::new(0);
            pool.run(&|_| {
                ran.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
            assert_eq!(ran.load(Ordering::Relaxed), 3);
        }
    }

    #[test]
    fn drop_joins_the_workers() {
        let mut pool = Pool::new(4).unwrap();
        pool.run(&|_| {}).unwrap();
        // Each worker owns a clone of the shared state until its thread function returns.
        let shared = pool.shared.clone();
        assert_eq!(Arc::strong_count(&shared), 5);
        drop(pool);
        assert_eq!(Arc::strong_count(&shared), 1);
    }
}
