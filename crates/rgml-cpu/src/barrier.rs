//! The barrier the compute threads meet at between nodes.
//!
//! Waiting is active for a short, bounded time, then parked. Active: nodes are short and a
//! futex wake costs more than most kernels, so threads that arrive within microseconds of each
//! other never sleep. Parked: on a busy machine the thread being waited for may have been
//! descheduled for a whole scheduler tick (milliseconds) while another process runs on its
//! core; a waiter that kept spinning or yielding would hold its own core and keep it from the
//! late thread. A parked waiter frees its core, so the scheduler can run the late thread there
//! at once, and the last thread to arrive wakes the sleepers.

use crate::pool::Spin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Busy-wait rounds before an active wait starts yielding.
const PURE_SPINS: u32 = 256;

/// How long a waiter stays active before it parks: longer than the imbalance between threads
/// on a quiet machine (a few microseconds per node), far shorter than a scheduler tick.
const ACTIVE: Duration = Duration::from_micros(30);

/// A sense-counting barrier for a fixed number of threads.
pub(crate) struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
    /// Waiters parked on `wake`; the last arrival takes `lock` and notifies only when non-zero.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// Nanoseconds the threads spent waiting here (actively or parked), summed over them.
    waited_ns: AtomicU64,
}

impl SpinBarrier {
    /// A barrier for `n` threads (`n == 0` behaves as 1).
    pub(crate) fn new(n: usize) -> Self {
        SpinBarrier {
            n: n.max(1),
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            waited_ns: AtomicU64::new(0),
        }
    }

    /// Block until all `n` threads have called `wait` for this generation. Everything a thread
    /// wrote before `wait` is visible to every thread after it returns.
    pub(crate) fn wait(&self) {
        if self.n == 1 {
            return;
        }
        let gen = self.generation.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::SeqCst);
            if self.sleepers.load(Ordering::SeqCst) != 0 {
                // Taking the lock orders this notification after any sleeper's check of the
                // generation, so none misses it.
                let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
                self.wake.notify_all();
            }
            return;
        }
        let start = Instant::now();
        if !self.wait_actively(gen) {
            self.park(gen);
        }
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waited_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The time threads have spent waiting here so far, summed over them (the last arrival
    /// of each generation does not wait).
    pub(crate) fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_ns.load(Ordering::Relaxed))
    }

    /// Spin, then yield, until the generation moves on (`true`) or [`ACTIVE`] has passed.
    fn wait_actively(&self, gen: usize) -> bool {
        let mut spin = Spin::new(PURE_SPINS, ACTIVE);
        while self.generation.load(Ordering::Acquire) == gen {
            if !spin.step() {
                return false;
            }
        }
        true
    }

    /// Sleep until the generation moves on.
    fn park(&self, gen: usize) {
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.generation.load(Ordering::SeqCst) == gen {
            g = self.wake.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn run_rounds(
        n: usize,
        rounds: usize,
        late: impl Fn(usize, usize) -> bool + Send + Sync + 'static,
    ) {
        let b = Arc::new(SpinBarrier::new(n));
        let counter = Arc::new(AtomicUsize::new(0));
        let late = Arc::new(late);
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (b, c, late) = (b.clone(), counter.clone(), late.clone());
                std::thread::spawn(move || {
                    for round in 0..rounds {
                        if late(t, round) {
                            // Long enough that the others park.
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        c.fetch_add(1, Ordering::SeqCst);
                        b.wait();
                        assert_eq!(c.load(Ordering::SeqCst), n * (round + 1));
                        b.wait();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn barrier_orders_phases() {
        run_rounds(4, 50, |_, _| false);
    }

    #[test]
    fn waiting_for_a_late_thread_is_counted() {
        let b = Arc::new(SpinBarrier::new(2));
        let late = {
            let b = b.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                b.wait();
            })
        };
        b.wait();
        late.join().unwrap();
        // The early thread waited about 5 ms; the late one did not wait.
        assert!(b.waited() >= Duration::from_millis(4), "{:?}", b.waited());
        assert!(b.waited() < Duration::from_secs(5));
    }

    #[test]
    fn parked_waiters_are_woken_by_a_late_thread() {
        // Every few rounds a different thread is late: the others wait actively, park, and must
        // all be woken by its arrival (a lost wake-up would hang this test).
        run_rounds(3, 30, |t, round| round % 3 == t);
    }
}
