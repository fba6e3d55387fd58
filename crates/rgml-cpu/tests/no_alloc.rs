//! A graph computed again with nothing changed allocates nothing: not in the backend (the
//! prepared job is reused), not in the thread pool, not on the asynchronous worker. A counting
//! global allocator sees every thread; this binary has no test harness (`harness = false`), so
//! no other test allocates meanwhile.

mod common;

use common::Net;
use rgml::Backend;
use rgml_cpu::{CpuBackend, CpuDevice};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts allocations (and reallocations) of every thread.
struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const RUNS: usize = 50;

/// Compute `net` once (warm-up: threads, work area, job, queue), then `RUNS` more times;
/// returns the allocations of those runs.
fn allocs_of_repeated_runs(be: &mut CpuBackend, net: &Net) -> usize {
    be.graph_compute(&net.ctx, &net.graph).unwrap();
    let first = net.outputs();
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..RUNS {
        if be.graph_compute(&net.ctx, &net.graph).is_err() {
            panic!("compute failed");
        }
    }
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    assert_eq!(net.outputs(), first, "a cached run changed the results");
    allocs
}

fn main() {
    let net = Net::new(0);
    let mut failed = false;
    for asynchronous in [false, true] {
        for threads in [1, 2, 3] {
            let mut be =
                CpuBackend::with_mode(CpuDevice::new("CPU"), threads, asynchronous).unwrap();
            let allocs = allocs_of_repeated_runs(&mut be, &net);
            // Again after the workers had time to park.
            std::thread::sleep(std::time::Duration::from_millis(5));
            let parked = allocs_of_repeated_runs(&mut be, &net);
            let ok = allocs == 0 && parked == 0;
            failed |= !ok;
            println!(
                "{} {threads} thread(s), {RUNS} cached runs: {allocs} + {parked} allocations{}",
                if asynchronous { "async" } else { "sync" },
                if ok { "" } else { "  <-- FAILED" }
            );
        }
    }
    if failed {
        eprintln!("error: graph compute allocated on a cached graph");
        std::process::exit(1);
    }
    println!("no_alloc: ok");
}
