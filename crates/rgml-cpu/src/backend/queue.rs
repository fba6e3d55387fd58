//! Asynchronous mode's in-order queue and its worker thread, and the CPU's events (markers
//! in that queue).
//!
//! This module owns the queue's state (items pending, the first error, shutdown) and the
//! events' generations; what an item does is the engine's or the buffer's business.

use super::engine::Engine;
use super::plan::Job;
use rgml::backend::{Event, EventImpl};
use rgml::{Buffer, Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Work queued for the worker.
pub(super) enum Item {
    Compute(Arc<Job>),
    /// Signal the event's generation when reached.
    Signal(Arc<EventState>, u64),
    /// Block until the event reaches the generation.
    Wait(Arc<EventState>, u64),
    /// Write the bytes into the buffer at the offset (checked when queued).
    Write(Arc<Buffer>, usize, Vec<u8>),
}

#[derive(Default)]
pub(super) struct QueueState {
    pub(super) items: VecDeque<Item>,
    /// Items queued or running.
    pub(super) pending: usize,
    pub(super) error: Option<Error>,
    pub(super) shutdown: bool,
}

#[derive(Default)]
pub(super) struct Queue {
    pub(super) state: Mutex<QueueState>,
    /// Signaled when an item is queued or on shutdown.
    pub(super) more: Condvar,
    /// Signaled when an item completes.
    pub(super) done: Condvar,
}

impl Queue {
    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn push(&self, item: Item) {
        let mut s = self.lock();
        s.items.push_back(item);
        s.pending += 1;
        self.more.notify_one();
    }

    /// Wait until nothing is queued or running; the first error stays for `synchronize`.
    pub(super) fn drain(&self) -> MutexGuard<'_, QueueState> {
        let mut s = self.lock();
        while s.pending > 0 {
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s
    }
}

pub(super) struct Worker {
    pub(super) queue: Arc<Queue>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

pub(super) fn worker_main(queue: Arc<Queue>, engine: Arc<Mutex<Engine>>) {
    loop {
        let (item, skip) = {
            let mut s = queue.lock();
            loop {
                if let Some(item) = s.items.pop_front() {
                    break (item, s.error.is_some());
                }
                if s.shutdown {
                    return;
                }
                s = queue.more.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match item {
            Item::Compute(_) if skip => Ok(()),
            Item::Compute(job) => {
                let mut engine = engine.lock().unwrap_or_else(|p| p.into_inner());
                engine.execute(&job)
            }
            Item::Write(_, _, _) if skip => Ok(()),
            Item::Write(buffer, offset, data) => buffer.set(offset, &data),
            Item::Signal(event, generation) => {
                event.signal(generation);
                Ok(())
            }
            Item::Wait(event, generation) => {
                event.wait_for(generation);
                Ok(())
            }
        }))
        .unwrap_or_else(|_| {
            let engine = engine.lock().unwrap_or_else(|p| p.into_inner());
            Err(Error::Backend {
                backend: engine.name.to_string(),
                message: "the worker panicked".into(),
            })
        });
        let mut s = queue.lock();
        s.pending -= 1;
        if let Err(e) = res {
            s.error.get_or_insert(e);
        }
        queue.done.notify_all();
    }
}

/// The shared state of a [`CpuEvent`]: how many times it was recorded and which recording was
/// last reached.
#[derive(Default)]
pub(super) struct EventState {
    /// (generation of the last record, generation last reached).
    pub(super) gens: Mutex<(u64, u64)>,
    pub(super) reached: Condvar,
}

impl EventState {
    pub(super) fn lock(&self) -> MutexGuard<'_, (u64, u64)> {
        self.gens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new recording; returns its generation.
    pub(super) fn record(&self) -> u64 {
        let mut g = self.lock();
        g.0 += 1;
        g.0
    }

    /// The generation of the last recording.
    pub(super) fn recorded(&self) -> u64 {
        self.lock().0
    }

    pub(super) fn signal(&self, generation: u64) {
        let mut g = self.lock();
        g.1 = g.1.max(generation);
        self.reached.notify_all();
    }

    pub(super) fn wait_for(&self, generation: u64) {
        let mut g = self.lock();
        while g.1 < generation {
            g = self.reached.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// An event of a CPU device: a point in a CPU stream's queue. A never-recorded event counts as
/// reached; waiting for an event waits for its last recording before the wait.
#[derive(Default)]
pub struct CpuEvent {
    state: Arc<EventState>,
}

impl CpuEvent {
    /// A new event, not recorded yet.
    pub fn new() -> CpuEvent {
        CpuEvent::default()
    }
}

impl EventImpl for CpuEvent {
    fn synchronize(&self) -> Result<()> {
        self.state.wait_for(self.state.recorded());
        Ok(())
    }
}

pub(super) fn cpu_event(event: &Event) -> Option<Arc<EventState>> {
    event
        .imp()
        .downcast_ref::<CpuEvent>()
        .map(|e| e.state.clone())
}
