//! Floor 0 of the kernels: SIMD primitives that every floor above shares (see
//! `docs/ARCHITECTURE.md`, "The CPU kernels in floors"). This module owns the portable lane-order
//! sums (what a vector horizontal add computes, spelled over arrays) and the cache prefetch
//! hints; [`x86`] owns the x86-64 register primitives and [`amx`] the AMX tile instructions and [`fp16`] AVX512-FP16's half-precision
//! arithmetic. A NEON path would sit beside `x86` as
//! `arm.rs`, and nothing above would change but the dispatch of its callers.
//!
//! Each horizontal sum mirrors one reduction order of ggml's code (the sums of its `hsum`,
//! `_mm512_reduce_add_ps` and the packed reduction of tile kernels); they differ in rounding, so
//! they are separate functions, each named for its order, and there is one of each.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod fp16;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// Sum of 8 lanes in the order of ggml's / tinyBLAS's AVX `hsum`: high half + low half, then
/// `movehl` pairs, then the last two.
#[inline(always)]
pub(crate) fn hsum8(v: &[f32; 8]) -> f32 {
    let t = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// Sum of 16 lanes in the order of `_mm512_reduce_add_ps` (GCC and clang): high 8 + low 8, then
/// as [`hsum8`].
#[inline(always)]
pub(crate) fn hsum16(v: &[f32; 16]) -> f32 {
    let mut t = [0f32; 8];
    for (k, t) in t.iter_mut().enumerate() {
        *t = v[k] + v[k + 8];
    }
    hsum8(&t)
}

/// How far ahead of the rows being multiplied a matrix-vector product prefetches weights (tuned
/// on the demo model's generation: 2 KiB gives +35%, 4 KiB +50%, 8 KiB +45%, 16 KiB +30%; on a
/// Zen 1 AVX2 CPU, as Q8_0, 4 KiB is best too: 65 tokens/s against 56-58 for 1, 2 and 8 KiB).
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// How far ahead of its reads a matrix-vector kernel's [`StreamPrefetch`] runs in each of its
/// row streams. Measured on a Zen 3 (`RGML_BENCH_ONLY=matvec cargo bench -p rgml-cpu`, one
/// thread, 256 MiB of Q4_0 / Q8_0 rows of 2048 and 8192): with 4 streams, 2 KiB streams at the
/// thread's DRAM read figure (10-15 GB/s); 1 KiB and 4 KiB are within noise of it.
pub(crate) const STREAM_AHEAD: usize = 2048;

/// Software prefetch for one stream of weights read front to back in steps shorter than a
/// cache line or a few: each [`Self::step`] to a read address asks for the lines not yet asked
/// for that lie within [`STREAM_AHEAD`] of the read. One line per 64 bytes of
/// progress keeps a steady number of loads in flight, where a whole row's span at once
/// ([`prefetch_span`]) bursts beyond the miss buffers and then leaves DRAM idle.
pub(crate) struct StreamPrefetch {
    next: *const u8,
}

impl StreamPrefetch {
    /// A stream whose reads start at `start` (the first [`STREAM_AHEAD`] bytes are left to the
    /// stream's previous row, or to the hardware prefetcher).
    #[inline(always)]
    pub(crate) fn new(start: *const u8) -> Self {
        StreamPrefetch {
            next: start.wrapping_add(STREAM_AHEAD),
        }
    }

    /// The stream reads at `p` next.
    #[inline(always)]
    pub(crate) fn step(&mut self, p: *const u8) {
        while p.wrapping_add(STREAM_AHEAD) >= self.next {
            prefetch(self.next);
            self.next = self.next.wrapping_add(64);
        }
    }
}

/// A hint to load the cache line at `p`; never faults, whatever the address.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it does not fault on any address and changes no state
    // visible to the program; SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Prefetch the cache lines of `len` bytes from `p` (hints: any address is fine).
#[inline(always)]
pub(crate) fn prefetch_span(p: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        prefetch(p.wrapping_add(off));
    }
}

/// `y[i] = fma(x[i], a, y[i])` (one rounding per element, as ggml's `ggml_vec_mad_f32` and
/// its FMA-contracted leftovers): with AVX2 and FMA where `fma` says the CPU has them, else a
/// scalar `mul_add` per element (the same values).
pub(crate) fn fma_axpy(y: &mut [f32], x: &[f32], a: f32, fma: bool) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: the caller's `fma` comes from the detected features: AVX2 and FMA.
        return unsafe { x86::fma_axpy_avx2(y, x, a) };
    }
    let _ = fma;
    for (yy, &xx) in y.iter_mut().zip(x) {
        *yy = xx.mul_add(a, *yy);
    }
}
