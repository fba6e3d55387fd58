//! A reusable barrier for the compute threads: spins briefly (nodes are short, a futex wake
//! costs more than most kernels), then yields so oversubscribed machines still make progress.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A sense-counting barrier for a fixed number of threads.
pub(crate) struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    /// A barrier for `n` threads (`n == 0` behaves as 1).
    pub(crate) fn new(n: usize) -> Self {
        SpinBarrier {
            n: n.max(1),
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
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
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == gen {
            if spins < 128 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn barrier_orders_phases() {
        let n = 4;
        let b = Arc::new(SpinBarrier::new(n));
        let counter = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (b, c) = (b.clone(), counter.clone());
                std::thread::spawn(move || {
                    for round in 0..50 {
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
}
