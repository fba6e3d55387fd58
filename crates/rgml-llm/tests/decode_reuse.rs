//! Generation reuses one graph: a decoding step whose graph matches the previous step's
//! allocates no memory at all (on any thread), and gives bit for bit the logits of a graph
//! built afresh for the step; for the demo model, and for Gemma 3 270M, whose local layers
//! place every token in their own cache.
//!
//! One test in this binary: the allocation counter is process-wide, so nothing else may run
//! beside it.

mod common;

use common::argmax;

use rgml_llm::{EncodeOptions, Logits, Session, SessionOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting allocations and reallocations.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; the counter has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decoding_reuses_the_graph_without_allocating() {
    check_decoding(common::demo_model());
    check_decoding(common::gemma_model());
}

fn check_decoding(model: std::sync::Arc<rgml_llm::Model>) {
    let options = SessionOptions {
        n_ctx: 128,
        n_ubatch: 512,
        n_threads: Some(2),
        device_params: Vec::new(),
        ..Default::default()
    };
    let prompt = model
        .tokenizer
        .encode("Rust is a language that", EncodeOptions::default());
    assert!(prompt.len() >= 3 && prompt.len() < 16);

    let mut reused = Session::new(model.clone(), &options).unwrap();
    // Capture keeps intermediates, which builds a new graph for every step: the reference.
    let mut rebuilt = Session::new(model.clone(), &options).unwrap();
    rebuilt.set_capture(true);

    let first = reused.decode(&prompt, Logits::Last).unwrap().to_vec();
    assert_eq!(rebuilt.eval(&prompt, Logits::Last).unwrap(), first);
    let mut next = argmax(&first);
    // Steps up to position 70 cross the 64-cell boundary of the attention span, where the graph
    // must be rebuilt; the steps between position 18 and 31 reuse it.
    let mut counted = 0;
    while reused.n_past() < 70 {
        let counting = (18..31).contains(&reused.n_past());
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        let logits = reused.decode(&[next], Logits::Last).unwrap();
        let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;
        if counting {
            assert_eq!(
                allocations,
                0,
                "decoding at position {} allocated",
                reused.n_past() - 1
            );
            counted += 1;
        }
        let step = argmax(logits);
        let logits = logits.to_vec();
        let expected = rebuilt.eval(&[next], Logits::Last).unwrap();
        let same = logits
            .iter()
            .zip(&expected)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "a reused graph changed the logits at position {}",
            rebuilt.n_past() - 1
        );
        next = step;
    }
    assert_eq!(counted, 13);
    assert_eq!(reused.n_past(), rebuilt.n_past());
}
