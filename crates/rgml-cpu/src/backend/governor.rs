//! How many of the backend's threads a graph run uses: all of them while they keep pace, fewer
//! while the machine is shared with other busy processes.
//!
//! Why: the threads meet at a barrier after most nodes. When another process takes a core, a
//! compute thread is descheduled for a scheduler slice (milliseconds) at a time, usually in the
//! middle of its share of a node, and every other thread waits for it at the next barrier: work
//! claimed on demand cannot help, since the late thread holds its unit until it runs again.
//! Measured on 2 cores with one CPU-bound process beside it, two threads generated 62 tokens/s
//! and one thread 176 (the demo model; 235 with two threads on a quiet machine).
//!
//! So each run reports how long its threads waited at barriers, summed over them
//! ([`crate::barrier::SpinBarrier::waited`]). On a quiet machine that is 3–17% of a waiting
//! thread's time in generation, about 3% in prompts; with a busy process sharing the cores it
//! exceeds 100% (both threads spin and park by turns). A run that waited more than
//! [`STALLED_SHARE`] is a stalled run, and the next runs use one thread fewer. While below the
//! full count, a run now and then tries one thread more and keeps it if that run did not stall:
//! once both [`PROBE_AFTER`] and [`PROBE_RUNS`] runs have passed (so long runs, such as
//! prompts, do not try every other time), and after each failed try twice as long (at most
//! [`MAX_BACKOFF`] doublings). The count of running threads never changes results: every
//! kernel computes each output with the same operations however many threads share it (where
//! ggml's rounding depends on its thread count, the kernel splits the work by the backend's
//! configured count, `NodeTask::threads`, whatever the governor runs).

use std::time::{Duration, Instant};

/// The share of a run's waiting threads' wall time spent at barriers above which the run counts
/// as stalled by a descheduled thread.
const STALLED_SHARE: f64 = 0.5;

/// How long a reduced thread count stays before a run first tries one thread more.
const PROBE_AFTER: Duration = Duration::from_millis(200);

/// How many runs a reduced thread count makes before a run first tries one thread more.
const PROBE_RUNS: u32 = 8;

/// How many times a failed try doubles the wait for the next (up to 3.2 s and 128 runs).
const MAX_BACKOFF: u32 = 4;

/// The thread count of the next runs (see the module docs).
#[derive(Debug)]
pub(super) struct Governor {
    /// The backend's threads.
    max: usize,
    /// Threads the runs use now.
    active: usize,
    /// When `active` last changed or a try failed, and the runs since.
    since: Instant,
    runs: u32,
    /// Failed tries in a row (up to [`MAX_BACKOFF`]): the next try waits [`PROBE_AFTER`] and
    /// [`PROBE_RUNS`] times 2 to this power.
    backoff: u32,
    /// Adapting at all (otherwise every run uses `max`).
    enabled: bool,
}

impl Governor {
    pub(super) fn new(max: usize, enabled: bool) -> Governor {
        Governor {
            max: max.max(1),
            active: max.max(1),
            since: Instant::now(),
            runs: 0,
            backoff: 0,
            enabled,
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Threads for the next run: the current count, or one more when it is time to probe.
    pub(super) fn threads(&self) -> usize {
        if !self.enabled {
            return self.max;
        }
        let due = self.runs >= self.runs_needed() && self.since.elapsed() >= self.interval();
        if self.active < self.max && due {
            return self.active + 1;
        }
        self.active
    }

    /// What a run on `used` threads measured: `waited`, the time its threads spent at
    /// barriers (summed over them), and its wall time.
    pub(super) fn record(&mut self, used: usize, waited: Duration, wall: Duration) {
        if !self.enabled {
            return;
        }
        self.runs = self.runs.saturating_add(1);
        if used <= 1 {
            return;
        }
        // Up to `used - 1` threads wait at a time.
        let waiting = wall.as_secs_f64() * (used - 1) as f64;
        let stalled = waited.as_secs_f64() > STALLED_SHARE * waiting;
        let tried = used > self.active;
        if stalled {
            self.backoff = if tried {
                (self.backoff + 1).min(MAX_BACKOFF)
            } else {
                0
            };
            self.restart(used - 1);
        } else if tried {
            // A try that kept pace: the machine has the cores again.
            self.backoff = 0;
            self.restart(used);
        }
    }

    /// How long after `since` the next try comes.
    fn interval(&self) -> Duration {
        PROBE_AFTER * (1 << self.backoff)
    }

    /// How many runs after `since` the next try comes.
    fn runs_needed(&self) -> u32 {
        PROBE_RUNS << self.backoff
    }

    fn restart(&mut self, active: usize) {
        self.active = active;
        self.since = Instant::now();
        self.runs = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Pretend `interval` and `runs` have passed since the last change.
    fn age(g: &mut Governor, interval: Duration, runs: u32) {
        g.since = Instant::now() - interval;
        g.runs = runs;
    }

    #[test]
    fn stalled_runs_shed_threads_and_probes_win_them_back() {
        let mut g = Governor::new(3, true);
        assert_eq!(g.threads(), 3);
        // A quiet run keeps every thread.
        g.record(3, MS / 100, 5 * MS);
        assert_eq!(g.threads(), 3);
        // Waiting for most of the run: one thread fewer, then one more.
        g.record(3, 9 * MS, 5 * MS);
        assert_eq!(g.threads(), 2);
        g.record(2, 3 * MS, 5 * MS);
        assert_eq!(g.threads(), 1);
        assert_eq!(g.interval(), PROBE_AFTER);
        // One thread measures nothing.
        g.record(1, Duration::ZERO, 5 * MS);
        assert_eq!(g.threads(), 1);
        // Once the interval and the runs have passed, a run tries one more; a stalled try goes
        // back and doubles both.
        age(&mut g, PROBE_AFTER, PROBE_RUNS - 1);
        assert_eq!(g.threads(), 1, "not enough runs yet");
        age(&mut g, PROBE_AFTER, PROBE_RUNS);
        assert_eq!(g.threads(), 2);
        g.record(2, 4 * MS, 5 * MS);
        assert_eq!(g.threads(), 1);
        assert_eq!(
            (g.interval(), g.runs_needed()),
            (2 * PROBE_AFTER, 2 * PROBE_RUNS)
        );
        age(&mut g, PROBE_AFTER, 2 * PROBE_RUNS);
        assert_eq!(g.threads(), 1, "not long enough yet");
        // A try that keeps pace is kept, and the next try can climb further.
        age(&mut g, 2 * PROBE_AFTER, 2 * PROBE_RUNS);
        assert_eq!(g.threads(), 2);
        g.record(2, Duration::ZERO, 5 * MS);
        assert_eq!(g.threads(), 2);
        assert_eq!((g.interval(), g.runs_needed()), (PROBE_AFTER, PROBE_RUNS));
        age(&mut g, PROBE_AFTER, PROBE_RUNS);
        assert_eq!(g.threads(), 3);
        g.record(3, Duration::ZERO, 5 * MS);
        assert_eq!(g.threads(), 3);
    }

    #[test]
    fn disabled_always_uses_every_thread() {
        let mut g = Governor::new(2, false);
        g.record(2, 9 * MS, 5 * MS);
        assert_eq!(g.threads(), 2);
    }
}
