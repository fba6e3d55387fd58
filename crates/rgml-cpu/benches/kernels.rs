//! `cargo bench -p rgml-cpu`: CPU kernel micro-benchmarks against this machine's ceilings
//! (issue 7). A plain harness (no criterion): warm-up runs, then the median of timed runs.
//!
//! Printed:
//! - measured ceilings: memory read bandwidth (a sum over 256 MiB, 1 and N threads), copy
//!   bandwidth (a 128 MiB memcpy, bytes read + written) and AVX-512 FMA throughput (independent
//!   `vfmadd` chains on N threads), beside the nominal figures below;
//! - MUL_MAT per weight dtype through the public API (a `Context`/`Graph` on [`CpuBackend`]):
//!   mat-vec (one activation column: a decode step) in GB/s of weight bytes streamed, on the
//!   demo model's FFN shapes (576 -> 1536 and 1536 -> 576) and on 4096 x 4096 (64 MiB as F32,
//!   out of L2 and, for the wider types, of L3); mat-mat with 256 columns (prompt processing)
//!   in GFLOP/s (2·K·N·256 flops);
//! - the threadpool: one round of the compute threads' barrier, and the per-node overhead of a
//!   graph of tiny ADD nodes.
//!
//! Nominal ceilings (the figures for the 2-core VM):
//! - DRAM bandwidth ~25 GB/s: what one socket's share of DDR gives a 2-vCPU guest, as measured
//!   by stream-like read loops; the measured figure printed next to it is the one to trust.
//! - ~280 GFLOP/s f32: 2 cores x 32 f32 FMA lanes per cycle (two 256-bit FMA pipes) x 2 flops
//!   x ~4.4 GHz boost, the figure. This VM's EPYC measures ~450 GFLOP/s with 512-bit
//!   FMAs (full-width 512-bit pipes), so mat-mat percentages are against the measured figure.
//!
//! - repacked (4-row interleaved) Q4_0/Q4_1/Q8_0 weights against the plain tiled kernels, one
//!   thread, kernel only, mat-vec and 8-column tiles.
//!
//! Knobs: `RGML_BENCH_THREADS` (default 2), `RGML_BENCH_QUICK=1` (fewer runs),
//! `RGML_BENCH_ONLY=repack` (only the repacked-weights table), `RGML_BENCH_ONLY=flash_attn`
//! (only one decode step's attention over an f16 cache), `RGML_BENCH_ONLY=amx` (only the AMX
//! K-quant kernel's rows), `RGML_BENCH_ONLY=kquant` (the K-quant kernels' rows), `RGML_BENCH_ONLY=q4_prompt` (the
//! repacked Q4_0 prompt kernel's rows), `RGML_BENCH_ONLY=matvec` (the one-row kernels of a
//! decode step, one thread, from cache and from DRAM), `RGML_BENCH_ONLY=mul_mat` (the
//! ceilings and the MUL_MAT table only), `RGML_BENCH_ONLY=threadpool` (only the barrier and
//! graph-overhead table), `RGML_BENCH_DTYPES=bf16,f16` (only those rows of the MUL_MAT and matvec tables, by
//! dtype name).

use rgml::alloc::alloc_ctx_tensors;
use rgml::quant::quantize_row;
use rgml::{Backend, Context, DType, Device, Graph, TensorId};
use rgml_cpu::bench_support::Barrier;
use rgml_cpu::{CpuBackend, CpuDevice};
use std::hint::black_box;
use std::time::{Duration, Instant};

const NOMINAL_GBS: f64 = 25.0;
const NOMINAL_GFLOPS: f64 = 280.0;

const DTYPES: [DType; 16] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::IQ4_NL,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::IQ4_XS,
    DType::MXFP4,
];

struct Cfg {
    threads: usize,
    warmup: usize,
    min_runs: usize,
    min_time: Duration,
}

/// Median seconds of `f` over at least `min_runs` runs and `min_time`, after warm-up runs.
fn median_secs(cfg: &Cfg, mut f: impl FnMut()) -> f64 {
    for _ in 0..cfg.warmup {
        f();
    }
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < cfg.min_runs || (start.elapsed() < cfg.min_time && times.len() < 1000) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Deterministic non-zero values in [-1, 1].
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if v.abs() < 0.01 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

fn set_random(ctx: &Context, id: TensorId, seed: u64) {
    let t = &ctx[id];
    let (k, rows) = (t.ne[0], t.nelements() / t.ne[0]);
    let dtype = t.dtype;
    let v = values(k * rows, seed);
    let row_bytes = dtype.row_bytes(k).expect("row bytes");
    let mut bytes = vec![0u8; row_bytes * rows];
    for (src, dst) in v.chunks_exact(k).zip(bytes.chunks_exact_mut(row_bytes)) {
        quantize_row(dtype, src, dst).expect("quantize");
    }
    ctx.tensor_set(id, 0, &bytes).expect("set weights");
}

/// Seconds per MUL_MAT of a `dtype` weight [k, n] by F32 activations [k, cols]; the weight in
/// `weight_memory` (e.g. the repacking buffer type) or with the activations in plain memory.
fn mul_mat_secs(
    cfg: &Cfg,
    be: &mut CpuBackend,
    dtype: DType,
    k: usize,
    n: usize,
    cols: usize,
    weight_memory: Option<&rgml::BufferTypeRef>,
) -> f64 {
    let mut ctx = Context::new();
    let w = ctx.new_tensor(dtype, &[k, n]).expect("weight");
    let x = ctx.new_tensor(DType::F32, &[k, cols]).expect("activations");
    let y = ctx.mul_mat(w, x).expect("mul_mat");
    if let Some(buft) = weight_memory {
        let buffer = rgml::Buffer::alloc(buft, ctx[w].nbytes()).expect("weight buffer");
        rgml::alloc::TensorAllocator::new(buffer)
            .alloc(&mut ctx, w)
            .expect("place weight");
    }
    alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).expect("alloc");
    set_random(&ctx, w, 1);
    set_random(&ctx, x, 2);
    let graph = Graph::build(&mut ctx, &[y]).expect("graph");
    median_secs(cfg, || be.graph_compute(&ctx, &graph).expect("compute"))
}

/// K of a shape as the dtype allows: k-quants need multiples of 256 (576 -> 768).
fn fit_k(dtype: DType, k: usize) -> usize {
    k.div_ceil(dtype.block_size()) * dtype.block_size()
}

/// Read bandwidth in GB/s: `threads` threads sum disjoint parts of `data`.
fn read_gbs(cfg: &Cfg, data: &[u64], threads: usize) -> f64 {
    let part = data.len().div_ceil(threads);
    let secs = median_secs(cfg, || {
        std::thread::scope(|s| {
            for chunk in data.chunks(part) {
                s.spawn(move || {
                    // Eight independent lanes so the loop is not one long add chain.
                    let mut acc = [0u64; 8];
                    for c in chunk.chunks_exact(8) {
                        for (a, v) in acc.iter_mut().zip(c) {
                            *a = a.wrapping_add(*v);
                        }
                    }
                    black_box(acc);
                });
            }
        })
    });
    std::mem::size_of_val(data) as f64 / secs / 1e9
}

/// Copy bandwidth in GB/s (bytes read + written), `threads` threads on disjoint parts.
fn copy_gbs(cfg: &Cfg, src: &[u64], dst: &mut [u64], threads: usize) -> f64 {
    let part = src.len().div_ceil(threads);
    let secs = median_secs(cfg, || {
        std::thread::scope(|s| {
            for (a, b) in src.chunks(part).zip(dst.chunks_mut(part)) {
                s.spawn(move || b.copy_from_slice(a));
            }
        });
        black_box(&mut *dst);
    });
    2.0 * std::mem::size_of_val(src) as f64 / secs / 1e9
}

/// Measured f32 FMA GFLOP/s on `threads` threads (None without AVX2 + FMA), with the widest
/// FMA the CPU has: 512-bit where AVX-512F exists (on cores with full-width 512-bit FMA pipes,
/// e.g. Zen 5, that is twice the 256-bit rate; on Zen 4 the same), else 256-bit.
#[cfg(target_arch = "x86_64")]
fn fma_gflops(cfg: &Cfg, threads: usize) -> Option<f64> {
    use std::arch::x86_64::*;
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return None;
    }
    let wide = is_x86_feature_detected!("avx512f");
    const ITERS: usize = 2_000_000;
    // Independent chains: more than FMA latency x FMA pipes (4 x 2) to keep both pipes full.
    const CHAINS: usize = 12;
    #[target_feature(enable = "avx2,fma")]
    fn chains256() -> f32 {
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        let a = _mm256_set1_ps(0.999_999);
        let b = _mm256_set1_ps(1e-7);
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm256_fmadd_ps(*r, a, b);
            }
        }
        let mut s = acc[0];
        for r in &acc[1..] {
            s = _mm256_add_ps(s, *r);
        }
        let mut out = [0f32; 8];
        // SAFETY: `out` has room for the 8 lanes; storeu takes any alignment.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }
    #[target_feature(enable = "avx512f")]
    fn chains512() -> f32 {
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        let a = _mm512_set1_ps(0.999_999);
        let b = _mm512_set1_ps(1e-7);
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm512_fmadd_ps(*r, a, b);
            }
        }
        let mut s = acc[0];
        for r in &acc[1..] {
            s = _mm512_add_ps(s, *r);
        }
        _mm512_reduce_add_ps(s)
    }
    let secs = median_secs(cfg, || {
        std::thread::scope(|s| {
            for _ in 0..threads {
                if wide {
                    // SAFETY: avx512f was detected at run time above.
                    s.spawn(|| black_box(unsafe { chains512() }));
                } else {
                    // SAFETY: avx2 and fma were detected at run time above.
                    s.spawn(|| black_box(unsafe { chains256() }));
                }
            }
        })
    });
    let lanes = if wide { 16 } else { 8 };
    Some((threads * ITERS * CHAINS * lanes * 2) as f64 / secs / 1e9)
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_gflops(_cfg: &Cfg, _threads: usize) -> Option<f64> {
    None
}

/// Microseconds per barrier round with `threads` threads.
fn barrier_us(threads: usize) -> f64 {
    const ROUNDS: usize = 200_000;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let b = Barrier::new(threads);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..ROUNDS {
                        b.wait();
                    }
                });
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    best / ROUNDS as f64 * 1e6
}

/// Microseconds per node of a chain of `n` ADDs on 16-element tensors, and per 1-node graph.
fn graph_overhead_us(cfg: &Cfg, threads: usize, n: usize) -> (f64, f64) {
    let mut be = CpuBackend::new(threads).expect("backend");
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[16]).expect("a");
    let b = ctx.new_tensor(DType::F32, &[16]).expect("b");
    let mut cur = a;
    let mut first = None;
    for _ in 0..n {
        cur = ctx.add(cur, b).expect("add");
        first.get_or_insert(cur);
    }
    alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).expect("alloc");
    set_random(&ctx, a, 3);
    set_random(&ctx, b, 4);
    let chain = Graph::build(&mut ctx, &[cur]).expect("graph");
    let one = Graph::build(&mut ctx, &[first.expect("n > 0")]).expect("graph");
    let t_chain = median_secs(cfg, || be.graph_compute(&ctx, &chain).expect("compute"));
    let t_one = median_secs(cfg, || be.graph_compute(&ctx, &one).expect("compute"));
    (t_chain / n as f64 * 1e6, t_one * 1e6)
}

/// The 1-minute load average: other work on the machine makes every figure here noisy.
fn load_note() -> String {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("load average (1 min) at start: {load} on {cpus} CPUs (other work skews the figures)")
}

/// Repacked (4-row interleaved) weights against the plain tiled kernels, one thread, kernel
/// only: mat-vec (1 column) and 8-column tiles on the demo model's FFN shapes. Plain and
/// repacked runs alternate `ROUNDS` times (the machine is shared); the median round is shown.
/// Whether `RGML_BENCH_DTYPES` (dtype names, comma-separated; unset: all) names `d`.
fn dtype_wanted(d: DType) -> bool {
    std::env::var("RGML_BENCH_DTYPES").map_or(true, |w| {
        w.split(',')
            .any(|n| n.trim().eq_ignore_ascii_case(d.name()))
    })
}

/// The decode step's matrix-vector kernels (MUL_MAT's choice for one activation row), one
/// thread, kernel only, GB/s of weight bytes: on 256 rows of 2048 (in L2: the kernel's own
/// speed) and on 256 MiB of rows of 2048 and of 8192 (streamed from DRAM), beside one
/// thread's DRAM read figure.
fn matvec_section(cfg: &Cfg) {
    use rgml_cpu::bench_support::{repack as rp, Matvec};
    let big: Vec<u64> = values(32 << 20, 5)
        .iter()
        .map(|v| v.to_bits() as u64)
        .collect();
    let read1 = read_gbs(cfg, &big, 1);
    drop(big);
    println!("Matrix-vector kernels, 1 thread, kernel only; DRAM read, 1 thread: {read1:.1} GB/s.");
    println!("| dtype | 256 x 2048 (cache) | 256 MiB, K 2048 | 256 MiB, K 8192 |");
    println!("| --- | ---: | ---: | ---: |");
    for dtype in DTYPES
        .into_iter()
        .filter(|&d| d.is_quantized() && dtype_wanted(d))
    {
        let Some(kernel) = Matvec::new(dtype) else {
            println!("| {} | (another path) | | |", dtype.name());
            continue;
        };
        let plain = matvec_cells(cfg, dtype, false, |k, w, y, out| {
            kernel.run(k, w, y, out).expect("matvec")
        });
        println!("| {} | {} |", dtype.name(), plain.join(" | "));
        if rp::plain_supported(dtype) && rp::packable(dtype) {
            let packed = matvec_cells(cfg, dtype, true, |k, w, y, out| {
                rp::repacked_groups(dtype, k, w, std::slice::from_ref(y), out, &mut [])
                    .expect("packed matvec")
            });
            println!("| {} repacked | {} |", dtype.name(), packed.join(" | "));
        }
    }
    println!();
}

/// [`matvec_section`]'s three figures for one kernel: `run(k, weights, activations, out)`
/// over the rows, dense or (`packed`) repacked.
fn matvec_cells(
    cfg: &Cfg,
    dtype: DType,
    packed: bool,
    run: impl Fn(usize, &[u8], &Vec<u8>, &mut [f32]),
) -> Vec<String> {
    use rgml_cpu::bench_support::repack::{self as rp, quantize_activations};
    let mut cells = Vec::new();
    for (k, bytes) in [(2048, 0), (2048, 256usize << 20), (8192, 256 << 20)] {
        let rb = dtype.row_bytes(k).expect("row bytes");
        let rows = if bytes == 0 { 256 } else { bytes / rb / 4 * 4 };
        // One random row, repeated: quantizing 256 MiB would take longer than the bench.
        let mut row = vec![0u8; rb];
        quantize_row(dtype, &values(k, 11), &mut row).expect("quantize");
        let mut w: Vec<u8> = row.iter().copied().cycle().take(rb * rows).collect();
        if packed {
            let mut p = vec![0u8; w.len()];
            rp::pack(dtype, k, &w, &mut p).expect("pack");
            w = p;
        }
        let y = quantize_activations(dtype, &values(k, 12)).expect("activations");
        let mut out = vec![0f32; rows];
        // Calls batched to at least ~1 ms: a call on cached weights takes microseconds.
        let batch = (1 << 20) / w.len() + 1;
        let t = median_secs(cfg, || {
            for _ in 0..batch {
                run(k, &w, &y, &mut out);
                black_box(&mut out);
            }
        }) / batch as f64;
        cells.push(format!("{:.1} GB/s", w.len() as f64 / t / 1e9));
    }
    cells
}

fn repack_section(cfg: &Cfg) {
    use rgml_cpu::bench_support::repack as rp;
    const ROUNDS: usize = 5;
    println!(
        "Repacked x4 weights vs plain tiled kernels, 1 thread, kernel only (direct kernels: {}).",
        rp::fast()
    );
    println!("GB/s of weight bytes per pass (8 columns: also GFLOP/s); median of {ROUNDS} alternating rounds.");
    println!("repacked: `tile` per group; groups: one `tile_groups` call (mat-vec: 4 groups per kernel call, else 2 groups x 4 columns).");
    println!(
        "| dtype | shape K x N | cols | plain | repacked | repacked groups | speed-up (best) |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
        if !rp::plain_supported(dtype) {
            continue;
        }
        for (k, n) in [(576, 1536), (1536, 576)] {
            let rb = dtype.row_bytes(k).expect("row bytes");
            let mut w = vec![0u8; rb * n];
            for (src, dst) in values(k * n, 11)
                .chunks_exact(k)
                .zip(w.chunks_exact_mut(rb))
            {
                quantize_row(dtype, src, dst).expect("quantize");
            }
            let mut packed = vec![0u8; w.len()];
            rp::pack(dtype, k, &w, &mut packed).expect("pack");
            let mut scratch = vec![0u8; 4 * rb];
            for ncols in [1, 8] {
                let cols: Vec<Vec<u8>> = (0..ncols)
                    .map(|c| {
                        rp::quantize_activations(dtype, &values(k, 20 + c as u64)).expect("act")
                    })
                    .collect();
                let mut out = vec![0f32; n * ncols];
                let mut plain = Vec::new();
                let mut repacked = Vec::new();
                let mut grouped = Vec::new();
                for _ in 0..ROUNDS {
                    plain.push(median_secs(cfg, || {
                        rp::plain(dtype, k, &w, &cols, &mut out).expect("plain");
                        black_box(&mut out);
                    }));
                    repacked.push(median_secs(cfg, || {
                        rp::repacked(dtype, k, &packed, &cols, &mut out, &mut scratch)
                            .expect("repacked");
                        black_box(&mut out);
                    }));
                    grouped.push(median_secs(cfg, || {
                        rp::repacked_groups(dtype, k, &packed, &cols, &mut out, &mut scratch)
                            .expect("repacked");
                        black_box(&mut out);
                    }));
                }
                let med = |v: &mut Vec<f64>| {
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                };
                let (tp, tr, tg) = (med(&mut plain), med(&mut repacked), med(&mut grouped));
                let gbs = |t: f64| w.len() as f64 / t / 1e9;
                let fmt = |t: f64| {
                    if ncols == 1 {
                        format!("{:.1} GB/s", gbs(t))
                    } else {
                        let gflops = 2.0 * (k * n * ncols) as f64 / t / 1e9;
                        format!("{:.1} GB/s, {gflops:.0} GFLOP/s", gbs(t))
                    }
                };
                println!(
                    "| {} | {k} x {n} | {ncols} | {} | {} | {} | {:.2}x |",
                    dtype.name(),
                    fmt(tp),
                    fmt(tr),
                    fmt(tg),
                    tp / tr.min(tg)
                );
            }
        }
    }
    println!();
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported, other flags ignored.
    let quick = std::env::var("RGML_BENCH_QUICK").is_ok_and(|v| v == "1");
    let threads: usize = std::env::var("RGML_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let cfg = Cfg {
        threads,
        warmup: 2,
        min_runs: if quick { 3 } else { 7 },
        min_time: Duration::from_millis(if quick { 50 } else { 250 }),
    };
    println!(
        "rgml-cpu kernel benchmarks, {} threads (median of >= {} runs)",
        cfg.threads, cfg.min_runs
    );
    println!("{}", load_note());
    println!();
    match std::env::var("RGML_BENCH_ONLY").as_deref() {
        Ok("repack") => {
            repack_section(&cfg);
            return;
        }
        Ok("threadpool") => {
            threadpool_section(&cfg, threads);
            return;
        }
        Ok("flash_attn") => {
            flash_attn_section(&cfg);
            return;
        }
        Ok("amx") => {
            amx_kquant_rows();
            return;
        }
        Ok("kquant") => {
            amx_kquant_rows();
            kquant_tile_rows();
            return;
        }
        Ok("q4_prompt") => {
            q4_prompt_rows();
            return;
        }
        Ok("matvec") => {
            matvec_section(&cfg);
            return;
        }
        _ => {}
    }

    // --- ceilings ---
    let big: Vec<u64> = values(32 << 20, 5)
        .iter()
        .map(|v| v.to_bits() as u64)
        .collect();
    let read1 = read_gbs(&cfg, &big, 1);
    let read_n = read_gbs(&cfg, &big, threads);
    let half = big.len() / 2;
    let mut dst = vec![0u64; half];
    let copy_n = copy_gbs(&cfg, &big[..half], &mut dst, threads);
    drop((big, dst));
    let fma = fma_gflops(&cfg, threads);
    println!("| ceiling | nominal | measured |");
    println!("| --- | ---: | ---: |");
    println!("| DRAM read, 1 thread (sum of 256 MiB) | | {read1:.1} GB/s |");
    println!("| DRAM read, {threads} threads | {NOMINAL_GBS:.0} GB/s | {read_n:.1} GB/s |");
    println!("| memcpy 128 MiB, {threads} threads (read + write) | | {copy_n:.1} GB/s |");
    match fma {
        Some(g) => println!("| f32 FMA (widest vectors), {threads} threads | {NOMINAL_GFLOPS:.0} GFLOP/s | {g:.1} GFLOP/s |"),
        None => println!("| f32 FMA, {threads} threads | {NOMINAL_GFLOPS:.0} GFLOP/s | (no AVX2/FMA) |"),
    }
    let (vnni, amx) = rgml_cpu::bench_support::int8_peak_macs(threads);
    for (name, peak) in [("AVX-512 VNNI", vnni), ("AMX", amx)] {
        match peak {
            Some(p) => println!(
                "| int8 multiply-adds, {name}, {threads} threads | | {:.0} GMAC/s |",
                p / 1e9
            ),
            None => {
                println!("| int8 multiply-adds, {name}, {threads} threads | | (not on this CPU) |")
            }
        }
    }
    amx_kquant_rows();
    kquant_tile_rows();
    q4_prompt_rows();
    println!();

    // --- MUL_MAT per dtype ---
    let mut be = CpuBackend::new(threads).expect("backend");
    let mv_shapes = [(576, 1536), (1536, 576), (4096, 4096)];
    let mm_shapes = [(576, 1536), (1536, 576)];
    println!("MUL_MAT, weight [K x N] (K = row length; 576 -> 768 for k-quants, which need K % 256 == 0).");
    println!("mat-vec: GB/s of weight bytes per token (% of the measured DRAM read figure: above 100% = served from cache).");
    let flops_ceiling = fma.unwrap_or(NOMINAL_GFLOPS);
    println!(
        "mat-mat: 256 activation columns, GFLOP/s (% of the measured f32 FMA figure, {flops_ceiling:.0} GFLOP/s; int8 dot products can exceed it)."
    );
    print!("| dtype |");
    for (k, n) in mv_shapes {
        print!(" mat-vec {k}x{n} |");
    }
    for (k, n) in mm_shapes {
        print!(" mat-mat {k}x{n}x256 |");
    }
    println!();
    print!("| --- |");
    for _ in 0..mv_shapes.len() + mm_shapes.len() {
        print!(" ---: |");
    }
    println!();
    // The plain rows, then the repacked ones where this CPU offers the repacking buffer type.
    let repack = CpuDevice::new("CPU")
        .extra_buffer_types()
        .into_iter()
        .next();
    let rows = DTYPES
        .iter()
        .map(|&d| (d, None))
        .chain(
            [DType::Q4_0, DType::Q4_1, DType::Q8_0]
                .into_iter()
                .filter_map(|d| repack.as_ref().map(|r| (d, Some(r)))),
        )
        .filter(|&(d, _)| dtype_wanted(d));
    for (dtype, memory) in rows {
        match memory {
            Some(m) => print!("| {} ({}) |", dtype.name(), m.name()),
            None => print!("| {} |", dtype.name()),
        }
        for (k, n) in mv_shapes {
            let k = fit_k(dtype, k);
            let bytes = dtype.row_bytes(k).expect("row bytes") * n;
            let secs = mul_mat_secs(&cfg, &mut be, dtype, k, n, 1, memory);
            let gbs = bytes as f64 / secs / 1e9;
            print!(" {gbs:.1} GB/s ({:.0}%) |", 100.0 * gbs / read_n);
        }
        for (k, n) in mm_shapes {
            let k = fit_k(dtype, k);
            let secs = mul_mat_secs(&cfg, &mut be, dtype, k, n, 256, memory);
            let gflops = 2.0 * (k * n * 256) as f64 / secs / 1e9;
            print!(
                " {gflops:.1} GFLOP/s ({:.0}%) |",
                100.0 * gflops / flops_ceiling
            );
        }
        println!();
        use std::io::Write;
        std::io::stdout().flush().expect("flush stdout");
    }
    println!();
    if std::env::var("RGML_BENCH_ONLY").is_ok_and(|v| v == "mul_mat") {
        return;
    }

    repack_section(&cfg);
    flash_attn_section(&cfg);
    threadpool_section(&cfg, threads);
}

/// The K-quant kernels without AMX alone: the AVX-512 and AVX2 register tiles and the one-row
/// kernel, by 512 activation rows (a prompt) and by 16 and 64 (the rows an expert of a 64-expert
/// mixture gets from a 128- and a 512-token prompt, 8 experts a token).
fn kquant_tile_rows() {
    for (dtype, ntok) in [
        (rgml::DType::Q4_K, 512),
        (rgml::DType::Q6_K, 512),
        (rgml::DType::Q4_K, 16),
        (rgml::DType::Q4_K, 64),
    ] {
        let [wide, avx2, row] = rgml_cpu::bench_support::kquant_tile_macs(dtype, ntok);
        for (name, macs) in [
            ("AVX-512 tiles", wide),
            ("AVX2 tiles", avx2),
            ("one-row kernel", row),
        ] {
            if let Some(m) = macs {
                println!(
                    "| K-quant kernel, {name}, {dtype}, K 2048 by {ntok} rows, 1 thread | | {:.0} GMAC/s |",
                    m / 1e9
                );
            }
        }
    }
}

/// The repacked Q4_0 prompt kernel alone, on its prepared activations and on Q8_0 ones.
fn q4_prompt_rows() {
    if let Some([prepared, q8]) = rgml_cpu::bench_support::q4_prompt_macs(512) {
        for (name, macs) in [("prepared activations", prepared), ("Q8_0 activations", q8)] {
            println!(
                "| repacked Q4_0 prompt kernel, {name}, K 2048 by 512 rows, 1 thread | | {:.0} GMAC/s |",
                macs / 1e9
            );
        }
    }
}

/// The AMX K-quant kernel alone, and the cost of each tile operation (rows of the ceilings
/// table; nothing without AMX).
fn amx_kquant_rows() {
    if let Some([load, product, store]) = rgml_cpu::bench_support::amx_op_nanos() {
        println!("| AMX tile ops, 1 thread: tileloadd 1 KiB (L1) / tdpbssd / tilestored 1 KiB | | {load:.1} / {product:.1} / {store:.1} ns |");
    }
    for dtype in [rgml::DType::Q4_K, rgml::DType::Q6_K] {
        if let Some(m) = rgml_cpu::bench_support::amx_kquant_macs(dtype, 512) {
            println!(
                "| AMX K-quant kernel, {dtype}, K 2048 by 512 rows, 1 thread | | {:.0} GMAC/s |",
                m / 1e9
            );
        }
    }
}

/// One decode step's attention (one query per head) over an f16 cache laid out as a model's,
/// the shapes of Llama 3.2 1B and 3B (head size 64 and 128, 8 KV heads, query heads in groups
/// of 4 and 3): GB/s of K and V bytes per step.
fn flash_attn_section(cfg: &Cfg) {
    println!("FLASH_ATTN_EXT, one query per head over an f16 cache ({} threads): GB/s of K+V bytes read.", cfg.threads);
    println!("| head size | heads / KV heads | cells | µs per step | GB/s |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    let mut be = CpuBackend::new(cfg.threads).expect("backend");
    for (d, heads) in [(64, 32), (128, 24)] {
        for cells in [4096, 16384] {
            let secs = flash_attn_secs(cfg, &mut be, d, heads, 8, 1, cells);
            let bytes = 2 * 2 * d * 8 * cells;
            println!(
                "| {d} | {heads} / 8 | {cells} | {:.0} | {:.1} |",
                secs * 1e6,
                bytes as f64 / secs / 1e9
            );
        }
    }
    println!();
    println!("FLASH_ATTN_EXT for a prompt: 512 queries per head over 512 f16 cells, a mask of zeros (every tile computed; {} threads).", cfg.threads);
    println!("| head size | heads / KV heads | ms | GFLOP/s (scores and values) |");
    println!("| ---: | --- | ---: | ---: |");
    for (d, heads) in [(64, 32), (128, 24)] {
        let secs = flash_attn_secs(cfg, &mut be, d, heads, 8, 512, 512);
        let flops = 2.0 * 2.0 * (d * heads * 512 * 512) as f64;
        println!(
            "| {d} | {heads} / 8 | {:.2} | {:.1} |",
            secs * 1e3,
            flops / secs / 1e9
        );
    }
    println!();
}

/// Seconds per FLASH_ATTN_EXT of `queries` queries per head over `cells` f16 cells, with a
/// mask.
fn flash_attn_secs(
    cfg: &Cfg,
    be: &mut CpuBackend,
    d: usize,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    cells: usize,
) -> f64 {
    let mut ctx = Context::new();
    let q = ctx.new_tensor(DType::F32, &[d, queries, heads]).expect("q");
    // Laid out as a model's cache: all heads of a cell, then the next cell (a head's rows a
    // cache row apart), seen through a permutation as [d, cells, heads].
    let k = ctx
        .new_tensor(DType::F16, &[d, kv_heads, cells])
        .expect("k");
    let v = ctx
        .new_tensor(DType::F16, &[d, kv_heads, cells])
        .expect("v");
    let k_view = ctx.permute(k, [0, 2, 1, 3]).expect("k view");
    let v_view = ctx.permute(v, [0, 2, 1, 3]).expect("v view");
    let mask = ctx.new_tensor(DType::F16, &[cells, queries]).expect("mask");
    let scale = 1.0 / (d as f32).sqrt();
    let out = ctx
        .flash_attn_ext(q, k_view, v_view, Some(mask), None, scale, 0.0, 0.0)
        .expect("flash_attn_ext");
    alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).expect("alloc");
    for (id, seed) in [(q, 3), (k, 4), (v, 5)] {
        set_random(&ctx, id, seed);
    }
    // A model's mask holds 0 for every cell a query sees (here all of them) and -inf past
    // them; random values would make each cell's f16 widening a cache miss in the table.
    ctx.tensor_set(mask, 0, &vec![0u8; 2 * cells * queries])
        .expect("mask");
    let graph = Graph::build(&mut ctx, &[out]).expect("graph");
    median_secs(cfg, || be.graph_compute(&ctx, &graph).expect("compute"))
}

/// The compute threads' barrier, and what a graph costs beyond its kernels: per node of a long
/// chain, and per launch of a one-node graph (the same graph computed again and again, as a
/// decode loop does).
fn threadpool_section(cfg: &Cfg, threads: usize) {
    let nodes = 1000;
    let (per_node, one_graph) = graph_overhead_us(cfg, threads, nodes);
    let (per_node_1, one_graph_1) = graph_overhead_us(cfg, 1, nodes);
    println!("| threadpool | {threads} threads | 1 thread |");
    println!("| --- | ---: | ---: |");
    println!(
        "| barrier round (SpinBarrier::wait) | {:.3} µs | |",
        barrier_us(threads)
    );
    println!("| per node, graph of {nodes} tiny ADDs | {per_node:.2} µs | {per_node_1:.2} µs |");
    println!("| one-node graph (launch + one node) | {one_graph:.2} µs | {one_graph_1:.2} µs |");
}
