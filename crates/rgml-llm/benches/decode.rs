//! `cargo bench -p rgml-llm`: one decode step of the demo model (or of `RGML_BENCH_MODEL`) (a single-token forward with
//! the last logits), on the CPU backend with `RGML_BENCH_THREADS` threads (default 2), as a
//! token of `rgml bench`'s tg test sees it: positions 16..80 of a context that a 16-token prompt
//! filled. Prints the median and mean step time, tokens/s, and the weight bytes streamed per
//! second. Skips, with a message, when the demo model is absent (scripts/fetch-model.sh).
//!
//! Then a batched step (`Session::decode_batch`): N = 1, 4, 8, 16 sequences of one session,
//! one token each, as `rgml serve` decodes N streams (steps at positions 16..80).
//!
//! Then the scheduler's own cost per step, which every session pays (one execution path): the
//! same one-token graph computed through a `Scheduler` over a backend that does no work, as a
//! share of the decode step.

use rgml::{Backend, Context, DeviceRef, Graph, Scheduler, SchedulerOptions};
use rgml_llm::session::BatchToken;
use rgml_llm::{Logits, Model, Session, SessionOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let path = match std::env::var_os("RGML_BENCH_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    if !path.exists() {
        println!(
            "decode bench skipped: demo model not found at {} (run scripts/fetch-model.sh)",
            path.display()
        );
        return;
    }
    let threads: usize = std::env::var("RGML_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    rgml_cpu::register();
    let model = Arc::new(Model::load(&path, Default::default()).expect("load the demo model"));
    let options = SessionOptions {
        n_ctx: 128,
        n_ubatch: 512,
        n_threads: Some(threads),
        device_params: Vec::new(),
        ..Default::default()
    };
    let mut session = Session::new(model.clone(), &options).expect("session");
    let n_vocab = model.config.n_vocab as u32;
    let prompt: Vec<u32> = (0..16u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
    let (n_steps, rounds) = (64usize, 5usize);
    let mut times = Vec::new();
    for round in 0..=rounds {
        session.reset();
        session.decode(&prompt, Logits::Last).expect("prompt");
        for i in 0..n_steps {
            let token = ((round * n_steps + i) as u32 * 104_729 + 7) % n_vocab;
            let t = Instant::now();
            let logits = session.decode(&[token], Logits::Last).expect("decode step");
            let dt = t.elapsed().as_secs_f64();
            std::hint::black_box(logits);
            // Round 0 is the warm-up.
            if round > 0 {
                times.push(dt);
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let bytes = model.size_bytes() as f64;
    println!(
        "decode step, demo model ({:.1} MB of weights), {threads} threads, {} steps:",
        bytes / 1e6,
        times.len()
    );
    println!("| decode step | median | mean | tok/s (median) | weight GB/s |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| {} | {:.3} ms | {:.3} ms | {:.1} | {:.1} |",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("model"),
        median * 1e3,
        mean * 1e3,
        1.0 / median,
        bytes / median / 1e9
    );
    batched_steps(&model, threads);
    scheduler_overhead(&mut session, median);
    two_sessions(&model);
}

/// Median time of a step of `n` sequences (one token each) for n = 1, 4, 8, 16.
fn batched_steps(model: &Arc<Model>, threads: usize) {
    let n_vocab = model.config.n_vocab as u32;
    println!();
    println!("| batched step, {threads} threads | median | tok/s |");
    println!("| --- | ---: | ---: |");
    for n in [1usize, 4, 8, 16] {
        let options = SessionOptions {
            n_ctx: 128,
            n_ubatch: 512,
            n_threads: Some(threads),
            n_seq: n,
            ..Default::default()
        };
        let mut session = Session::new(model.clone(), &options).expect("session");
        let mut times = Vec::new();
        for round in 0..3u32 {
            for seq in 0..n {
                session.seq_rm(seq, 0..usize::MAX).expect("clear");
            }
            let prompt: Vec<BatchToken> = (0..n)
                .flat_map(|seq| {
                    (0..16u32).map(move |i| BatchToken {
                        token: (i * 7919 + seq as u32 * 31 + 13) % n_vocab,
                        seq,
                        logits: i == 15,
                    })
                })
                .collect();
            session.decode_batch(&prompt).expect("prompts");
            for i in 0..64u32 {
                let step: Vec<BatchToken> = (0..n)
                    .map(|seq| BatchToken {
                        token: ((i + round * 64) * 104_729 + seq as u32 * 17 + 7) % n_vocab,
                        seq,
                        logits: true,
                    })
                    .collect();
                let t = Instant::now();
                std::hint::black_box(session.decode_batch(&step).expect("step"));
                if round > 0 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "| {n} sequences | {:.2} ms | {:.1} |",
            median * 1e3,
            n as f64 / median
        );
    }
}

/// 32 decode steps after a 16-token prompt on a new one-thread session of `model`.
fn decode_run(model: &Arc<Model>) -> f64 {
    let options = SessionOptions {
        n_ctx: 64,
        n_ubatch: 512,
        n_threads: Some(1),
        device_params: Vec::new(),
        ..Default::default()
    };
    let mut session = Session::new(model.clone(), &options).expect("session");
    let n_vocab = model.config.n_vocab as u32;
    let prompt: Vec<u32> = (0..16u32).map(|i| (i * 7919 + 13) % n_vocab).collect();
    let t = Instant::now();
    session.decode(&prompt, Logits::Last).expect("prompt");
    for i in 0..32u32 {
        let token = (i * 104_729 + 7) % n_vocab;
        std::hint::black_box(session.decode(&[token], Logits::Last).expect("step"));
    }
    t.elapsed().as_secs_f64()
}

/// Two one-thread sessions on one model: one after the other, then at the same time on two
/// threads (their computations hold the weights shared, so they overlap).
fn two_sessions(model: &Arc<Model>) {
    decode_run(model);
    let (mut apart, mut together) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        apart.push(decode_run(model) + decode_run(model));
        let t = Instant::now();
        std::thread::scope(|s| {
            let a = s.spawn(|| decode_run(model));
            let b = s.spawn(|| decode_run(model));
            let _ = (a.join(), b.join());
        });
        together.push(t.elapsed().as_secs_f64());
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (apart, together) = (best(&apart), best(&together));
    println!();
    println!(
        "| two sessions on one model, 1 thread each | one after the other | at once | ratio |"
    );
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| 16-token prompt + 32 steps each (best of 3) | {:.1} ms | {:.1} ms | {:.2} |",
        apart * 1e3,
        together * 1e3,
        together / apart
    );
}

/// A backend that computes nothing: what remains of a scheduled step is the scheduler's work.
struct Idle(DeviceRef);

impl Backend for Idle {
    fn name(&self) -> &str {
        "Idle"
    }
    fn device(&self) -> DeviceRef {
        self.0.clone()
    }
    fn graph_compute_async(&mut self, _ctx: &Context, _graph: &Graph) -> rgml::Result<()> {
        Ok(())
    }
}

/// Print the scheduler's time per decode step (the session's one-token graph, computed again
/// as a decode step computes it) beside the step's median time.
fn scheduler_overhead(session: &mut Session, step: f64) {
    session.reset();
    let (ctx, graph) = session.prompt_graph(&[1]).expect("a one-token graph");
    let mut ctx = ctx.clone();
    let device = rgml::registry::device("CPU").expect("the CPU device");
    let mut sched = Scheduler::new(
        vec![Box::new(Idle(device))],
        SchedulerOptions {
            op_offload: true,
            ..Default::default()
        },
    )
    .expect("scheduler");
    sched.alloc_graph(&mut ctx, &graph).expect("allocate");
    let n = 2000;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        sched.graph_compute(&mut ctx, &graph).expect("compute");
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[n / 2];
    println!();
    println!(
        "| scheduler per step ({} nodes, one backend) | median | share of a decode step |",
        graph.n_nodes()
    );
    println!("| --- | ---: | ---: |");
    println!(
        "| one split, no copies | {:.2} µs | {:.2}% |",
        median * 1e6,
        100.0 * median / step
    );
}
