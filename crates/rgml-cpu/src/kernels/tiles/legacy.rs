//! Register-tiled quantized matrix products for prompt processing: a tile of `RM` weight rows
//! by `RN` activation rows computed together, so each weight block is unpacked once for `RN`
//! columns and each activation block loaded once for `RM` rows.
//!
//! Every output element goes through exactly the operations of its per-pair dot
//! ([`super::dot`]'s AVX2 `q4_0·q8_0`, `q4_1·q8_1`, `q5_0·q8_0`, `q5_1·q8_1`, `q8_0·q8_0`,
//! themselves ggml's; for IQ4_NL llamafile's `tinyBLAS_Q0_AVX<block_iq4_nl>`, which ggml runs
//! from 2 activation rows and whose single accumulator differs from
//! `ggml_vec_dot_iq4_nl_q8_0`'s two): per block 8 lanes of exact integer sums of 4 products,
//! converted to f32 and folded into the pair's own 8-lane accumulator with one FMA by
//! `d_x * d_y`; the q4_1/q5_1 min terms summed in order in f32 (each `m_x * s_y` is exact, so
//! vec_dot's scalar FMA and a multiply-add agree); one `hsum` at the end. ggml runs
//! `tinyBLAS_Q0_AVX<block_q5_0>` from 2 rows, which is `vec_dot`'s arithmetic, and `vec_dot`
//! for Q5_1 at every row count: both are these tiles' outputs. Tiling only interleaves independent pairs, so the results are the
//! per-pair dots' bit for bit (tested below on random data).
//!
//! Builds: one body for AVX2 (16 vector registers: 2×4 tiles) and AVX-512VL (32 registers:
//! 4×4 tiles); with AVX-512 VNNI, 512-bit kernels whose integer sums come from `vpdpbusd`
//! (the same sums): two columns per register for prompts, two rows per register for
//! matrix-vector products (generation; about twice the per-pair dot's speed on cached
//! weights, measured with `cargo bench -p rgml-cpu`).

use crate::kernels::dots::run::{MatvecKernel, RowRun};
use crate::kernels::fp16;
#[cfg(target_arch = "x86_64")]
use crate::kernels::fp16::h2f;
use crate::kernels::isa::CpuFeatures;
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::x86::{bits_to_bytes, halves, hsum8, nibbles};
use crate::kernels::simd::StreamPrefetch;
#[cfg(target_arch = "x86_64")]
use rgml::quant::KVALUES_IQ4NL;
use rgml::DType;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Weight types with a tiled kernel.
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q8_0: u8 = 2;
const IQ4_NL: u8 = 3;
const Q5_0: u8 = 4;
const Q5_1: u8 = 5;

/// Whether weights of kind `k` carry a min (`m_x * s_y` terms) and unsigned quants.
const fn has_min(k: u8) -> bool {
    k == Q4_1 || k == Q5_1
}

/// Which tiled build this CPU runs, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TiledIsa {
    Avx2,
    Avx512,
    Avx512Vnni,
}

/// The tiled build for the CPU `f` describes (`None`: no AVX2/FMA/F16C).
pub(crate) fn build(f: CpuFeatures) -> Option<TiledIsa> {
    if f.has_avx512_vnni() {
        Some(TiledIsa::Avx512Vnni)
    } else if f.has_avx512() {
        Some(TiledIsa::Avx512)
    } else if f.has_avx2() {
        Some(TiledIsa::Avx2)
    } else {
        None
    }
}

fn kind(dtype: DType) -> Option<u8> {
    match dtype {
        DType::Q4_0 => Some(Q4_0),
        DType::Q4_1 => Some(Q4_1),
        DType::Q8_0 => Some(Q8_0),
        DType::IQ4_NL => Some(IQ4_NL),
        DType::Q5_0 => Some(Q5_0),
        DType::Q5_1 => Some(Q5_1),
        _ => None,
    }
}

/// Whether weights of `dtype` have a tiled kernel on this CPU.
pub(crate) fn supported(f: CpuFeatures, dtype: DType) -> bool {
    kind(dtype).is_some() && build(f).is_some()
}

/// Whether MUL_MAT takes the tiled kernel for weights of `dtype` and `rows` activation rows
/// per batch: the types whose tiles equal `vec_dot` always, IQ4_NL where ggml takes tinyBLAS
/// (from 2 rows; one row runs `vec_dot`, whose arithmetic differs).
pub(crate) fn takes(f: CpuFeatures, dtype: DType, rows: usize) -> bool {
    supported(f, dtype) && (dtype != DType::IQ4_NL || rows >= 2)
}

/// Rows of a tile for this CPU's build: 4 on the AVX-512 builds, 2 on AVX2 (whose
/// matrix-vector products run [`matvec_kernel`]'s kernels instead).
pub(crate) fn tile_rows(f: CpuFeatures) -> usize {
    match build(f) {
        Some(TiledIsa::Avx512 | TiledIsa::Avx512Vnni) => 4,
        _ => 2,
    }
}

/// The most columns of a tile on any build.
pub(crate) const TILE_COLS: usize = 8;

/// Columns of a tile for this CPU's build.
pub(crate) fn tile_cols(f: CpuFeatures) -> usize {
    match build(f) {
        Some(TiledIsa::Avx512Vnni) => 8,
        _ => 4,
    }
}

/// `out[r * out_stride + c] = dot(x[r], y[c])` for the `x.len()` weight rows (at most 4, best
/// [`tile_rows`]) and any number of activation rows (best [`tile_cols`]) of `nb` blocks each.
///
/// # Safety
/// [`supported`]`(f, dtype)` holds; every `x[r]` points at `nb` readable blocks of `dtype`,
/// every `y[c]` at `nb` blocks of its vec-dot type; `out` has room for every `(r, c)`.
pub(crate) unsafe fn tile(
    f: CpuFeatures,
    dtype: DType,
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    if let Some(isa) = build(f) {
        // SAFETY: as promised by the caller; `isa` is this CPU's (`f` never claims a feature
        // the CPU lacks).
        unsafe { tile_on(isa, dtype, nb, x, y, out, out_stride) }
    }
}

/// [`tile`] with the build `isa`, which this CPU must support (the tests run every build).
///
/// # Safety
/// As [`tile`], and the CPU supports `isa`.
unsafe fn tile_on(
    isa: TiledIsa,
    dtype: DType,
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    // Q5_0/Q5_1 products of one column run the 256-bit body on every build (VNNI sums where
    // the CPU has them, as tinyBLAS's AVX-512 VNNI build does; the float operations are the
    // AVX2 dot's either way); column pairs take the 512-bit kernel as the other types do.
    let q5 = matches!(dtype, DType::Q5_0 | DType::Q5_1);
    // Column counts a build does not take in one call are split (the 512-bit kernels take
    // column pairs).
    let max = if isa == TiledIsa::Avx512Vnni && x.len() == 4 {
        8
    } else {
        4
    };
    if y.len() > max || (y.len() > 4 && y.len() % 2 == 1) {
        let split = if y.len() > max { max } else { y.len() - 1 };
        // SAFETY: the same rows, a partition of the columns, the matching part of `out`.
        unsafe {
            tile_on(isa, dtype, nb, x, &y[..split], out, out_stride);
            tile_on(
                isa,
                dtype,
                nb,
                x,
                &y[split..],
                &mut out[split..],
                out_stride,
            );
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let Some(k) = kind(dtype) else {
            return;
        };
        // `$f` for the kinds listed (the matrix-vector 512-bit kernel is not instantiated for
        // Q5).
        macro_rules! call {
            ($f:ident, $rm:literal, $rn:literal, $x:expr, $out:expr, [$($kk:ident),*]) => {
                // SAFETY: the features `$f` needs were detected (`build`); pointers as promised
                // by the caller.
                unsafe {
                    match k {
                        $($kk => $f::<$kk, $rm, $rn>(nb, $x, y, $out, out_stride),)*
                        _ => unreachable!("tiled kind {k} routed to {}", stringify!($f)),
                    }
                }
            };
        }
        macro_rules! go {
            ($f:ident, $rm:literal, $rn:literal, $x:expr, $out:expr) => {
                call!(
                    $f,
                    $rm,
                    $rn,
                    $x,
                    $out,
                    [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL]
                )
            };
        }
        macro_rules! go512 {
            ($f:ident, $rm:literal, $rn:literal, $x:expr, $out:expr) => {
                call!($f, $rm, $rn, $x, $out, [Q4_0, Q4_1, Q8_0, IQ4_NL])
            };
        }
        macro_rules! cols {
            ($f:ident, $rm:literal, $x:expr, $out:expr) => {
                match y.len() {
                    4 => go!($f, $rm, 4, $x, $out),
                    3 => go!($f, $rm, 3, $x, $out),
                    2 => go!($f, $rm, 2, $x, $out),
                    _ => go!($f, $rm, 1, $x, $out),
                }
            };
        }
        macro_rules! shapes {
            ($f:ident, $rm:literal) => {
                if x.len() == $rm {
                    cols!($f, $rm, x, out)
                } else {
                    for (r, xr) in x.iter().enumerate() {
                        cols!($f, 1, std::slice::from_ref(xr), &mut out[r * out_stride..])
                    }
                }
            };
        }
        match isa {
            // 4-row tiles (packed groups unpacked) as two 2-row ones.
            TiledIsa::Avx2 if x.len() == 4 => {
                for h in 0..2 {
                    cols!(
                        tile_avx2,
                        2,
                        &x[2 * h..2 * h + 2],
                        &mut out[2 * h * out_stride..]
                    )
                }
            }
            TiledIsa::Avx2 => shapes!(tile_avx2, 2),
            TiledIsa::Avx512 => shapes!(tile_avx512, 4),
            TiledIsa::Avx512Vnni => match (x.len(), y.len()) {
                // Two columns per 512-bit register.
                (4, 8) => go!(tile_vnni512, 4, 4, x, out),
                (4, 6) => go!(tile_vnni512, 4, 3, x, out),
                (4, 4) => go!(tile_vnni512, 4, 2, x, out),
                (4, 2) => go!(tile_vnni512, 4, 1, x, out),
                _ if q5 => shapes!(tile_vnni, 4),
                // Matrix-vector: two rows per 512-bit register.
                (4, 1) => go512!(rows_vnni512, 2, 1, x, out),
                (2, 1) => go512!(rows_vnni512, 1, 1, x, out),
                _ => shapes!(tile_vnni, 4),
            },
        }
    }
}

/// `$f::<K>` as a `$t` for the kind `K` of `$dtype` among the kinds listed (`None` for the
/// others, and off x86-64).
macro_rules! avx2_kernel {
    ($dtype:expr, $f:ident, $t:ty, [$($k:ident),*]) => {{
        #[cfg(target_arch = "x86_64")]
        let kernel: Option<$t> = match kind($dtype) {
            $(Some($k) => Some($f::<$k>),)*
            _ => None,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let kernel: Option<$t> = { let _ = $dtype; None };
        kernel
    }};
}

/// Most activation columns of a [`ColsKernel`] call.
pub(crate) const COLS: usize = 8;

/// A product of one weight row by up to [`COLS`] activation columns on the AVX2 build:
/// `out[c] = dot(x, y[c])` for the `y.len()` columns, each bit for bit its pair's dot (as
/// [`tile`]). `scales` holds the columns' block scales widened to f32 by [`widen_scales`].
///
/// Why not [`tile`]'s 2 x 4 tiles: with 16 vector registers, 8 accumulators, 4 activation
/// blocks and the per-pair scalars (scale products, q4_1 min sums) do not fit, and the spills
/// cost a third of the time (Zen 1). Here each pair keeps only its accumulator in a register:
/// activation quants are memory operands, the 8 scale products of a block are one vector
/// multiply by the pre-widened column scales, and the min sums of 8 columns are one vector.
///
/// # Safety
/// `x` describes `nb` readable blocks of the kernel's type, each `y[c]` `nb` activation
/// blocks; `scales` was filled by [`widen_scales`] for these columns and `nb` blocks; `out`
/// has room for `y.len()` values; `y.len() <= COLS`.
pub(crate) type ColsKernel = unsafe fn(usize, WeightRow, &[*const u8], &[f32], &mut [f32]);

/// Where a [`ColsKernel`] finds a weight row's blocks: block `i`'s `d` (f16) at `d + i *
/// stride`, its `m` (f16, Q4_1 and Q5_1) `m_off` bytes after that `d`, its quants `q_off`
/// bytes after it. A dense row has its blocks one after the other; a row of a repacked group
/// ([`super::repack`]) has its fields and quants spread across the group's packed blocks.
#[derive(Clone, Copy)]
pub(crate) struct WeightRow {
    pub d: *const u8,
    pub stride: usize,
    pub m_off: usize,
    pub q_off: usize,
}

impl WeightRow {
    /// A dense row of `dtype` (a type of [`tile`]) at `x`.
    pub(crate) fn dense(dtype: DType, x: *const u8) -> WeightRow {
        let (block, _, q_off, _) = kind(dtype).map_or((0, 0, 0, 0), layout);
        WeightRow {
            d: x,
            stride: block,
            m_off: 2,
            q_off,
        }
    }
}

/// The [`ColsKernel`] for `dtype` on this CPU's build: the AVX2 build only, the types of
/// [`tile`].
pub(crate) fn cols_kernel(f: CpuFeatures, dtype: DType) -> Option<ColsKernel> {
    // Each kernel's features (AVX2, FMA, F16C) are the AVX2 build's.
    (build(f) == Some(TiledIsa::Avx2))
        .then(|| avx2_cols(dtype))
        .flatten()
}

/// The AVX2 column kernel of `dtype`, whatever build the CPU runs.
fn avx2_cols(dtype: DType) -> Option<ColsKernel> {
    avx2_kernel!(
        dtype,
        cols_avx2,
        ColsKernel,
        [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL]
    )
}

/// f32 values of [`widen_scales`] for `nb` blocks: scales, then mins.
pub(crate) fn scales_len(nb: usize) -> usize {
    2 * nb * COLS
}

/// Widen the block scales of the activation columns `y` (blocks of `dtype`'s vec-dot type) to
/// f32, block by block: `scales[i * COLS + c]` is column c's `d` of block `i`, and from
/// `nb * COLS` on its `s` (q8_1's `d * sum(q)`; unused for q8_0). Missing columns get 0.
///
/// # Safety
/// Each `y[c]` holds `nb` readable activation blocks of `dtype`'s vec-dot type;
/// `scales.len() >= scales_len(nb)`.
pub(crate) unsafe fn widen_scales(dtype: DType, nb: usize, y: &[*const u8], scales: &mut [f32]) {
    let Some(k) = kind(dtype) else {
        return;
    };
    let yb = layout(k).1;
    let (d, s) = scales[..scales_len(nb)].split_at_mut(nb * COLS);
    for i in 0..nb {
        for c in 0..COLS {
            let (dc, sc) = match y.get(c) {
                // SAFETY: block i of column c is readable (caller); q8_1 has `s` after `d`.
                Some(&p) => unsafe {
                    let p = p.add(i * yb);
                    let bits = |at: usize| p.add(at).cast::<u16>().read_unaligned();
                    let s = if has_min(k) { bits(2) } else { 0 };
                    (bits(0), s)
                },
                None => (0, 0),
            };
            d[i * COLS + c] = fp16::f16_bits_to_f32(dc);
            s[i * COLS + c] = fp16::f16_bits_to_f32(sc);
        }
    }
}

/// # Safety
/// As [`ColsKernel`], on a CPU with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols_avx2<const K: u8>(
    nb: usize,
    x: WeightRow,
    y: &[*const u8],
    scales: &[f32],
    out: &mut [f32],
) {
    macro_rules! go {
        ($($n:literal)*) => {
            match y.len() {
                // SAFETY: as the caller promises, with exactly `$n` columns.
                $($n => unsafe { cols_body::<K, $n>(nb, x, y, scales, out) },)*
                _ => {}
            }
        };
    }
    go!(1 2 3 4 5 6 7 8)
}

/// The body of [`cols_avx2`] for `RN` columns.
///
/// # Safety
/// As [`ColsKernel`] with `y.len() == RN`, on a CPU with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn cols_body<const K: u8, const RN: usize>(
    nb: usize,
    x: WeightRow,
    y: &[*const u8],
    scales: &[f32],
    out: &mut [f32],
) {
    let (_, yb, _, yq) = layout(K);
    if y.len() != RN || out.len() < RN || scales.len() < scales_len(nb) {
        return;
    }
    let (d_y, s_y) = scales.split_at(nb * COLS);
    // SAFETY: reads within the blocks the caller promised (scales checked above), under AVX2,
    // FMA and F16C.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); RN];
        let mut summs = _mm256_setzero_ps();
        for i in 0..nb {
            let p = x.d.add(i * x.stride);
            // The scale products of the block, `d_x * d_y` per column, one IEEE product each:
            // all 8 columns in one multiply. (LLVM keeps them in a register and shuffles each
            // out: 6-8% faster prompts than a multiply per column, AVX2 Q4_0/Q8_0; products
            // computed ahead for a run of blocks and broadcast from memory were 4-10% slower.)
            let mut d = [0f32; COLS];
            let dx = _mm256_set1_ps(h2f(p));
            let dyc = d_y.as_ptr().add(i * COLS);
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(dx, _mm256_loadu_ps(dyc)));
            if has_min(K) {
                // `m_x * s_y` is exact (two f16), so the FMA adds what the scalar form adds.
                let mx = _mm256_set1_ps(h2f(p.add(x.m_off)));
                summs = _mm256_fmadd_ps(mx, _mm256_loadu_ps(s_y.as_ptr().add(i * COLS)), summs);
            }
            let qx = weight_quants::<K>(p.add(x.q_off));
            let ax = _mm256_sign_epi8(qx, qx);
            for c in 0..RN {
                let qy = _mm256_loadu_si256(y[c].add(i * yb + yq).cast());
                let sums = if has_min(K) {
                    _mm256_maddubs_epi16(qx, qy)
                } else {
                    // Signed x signed through the sign of x (quants are never -128).
                    _mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy, qx))
                };
                // No saturation: |15 * 128 * 2| and |127 * 127 * 2| fit in i16.
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, _mm256_set1_epi16(1)));
                acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[c]), p, acc[c]);
            }
        }
        let mut mins = [0f32; COLS];
        _mm256_storeu_ps(mins.as_mut_ptr(), summs);
        for c in 0..RN {
            let h = hsum8(acc[c]);
            out[c] = if has_min(K) { h + mins[c] } else { h };
        }
    }
}

/// The matrix-vector kernel for `dtype` on this CPU's build: the AVX2 build only (the AVX-512
/// builds take 4-row tiles through [`tile`]), not IQ4_NL (whose one-row products take
/// `vec_dot`'s arithmetic, not the tiles' (see [`takes`]): its kernel is
/// [`crate::kernels::dots::lowbit::nibble_matvec`]'s).
///
/// A run of rows is read as [`MATVEC_STREAMS`] streams: the run cut into that many stretches of
/// consecutive rows, one row of each stretch per [`body`] pass (the activation block is loaded
/// once per pass, each row keeps its own accumulator), each stretch prefetched by a
/// [`StreamPrefetch`]. Why not adjacent rows in a tile: reads that jump back and forth between
/// neighbouring rows defeat the hardware prefetcher, and a row's span prefetched at once
/// bursts; on a Zen 3 (one thread, 256 MiB of rows of 2048 from DRAM) 2-row tiles of adjacent
/// rows stream Q4_0 at 3.5-5 GB/s and Q8_0 at 6.5, the streams at 10.5 and 13-15 (the thread's
/// DRAM read figure: 10-12 GB/s).
pub(crate) fn matvec_kernel(f: CpuFeatures, dtype: DType) -> Option<MatvecKernel> {
    // Each kernel's features (AVX2, FMA, F16C) are the AVX2 build's.
    (build(f) == Some(TiledIsa::Avx2))
        .then(|| {
            avx2_kernel!(
                dtype,
                matvec_avx2,
                MatvecKernel,
                [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0]
            )
        })
        .flatten()
}

/// Row streams of [`matvec_kernel`]'s kernels (4 against 2: +5-15% on a Zen 3, from cache and
/// from DRAM).
const MATVEC_STREAMS: usize = 4;

/// # Safety
/// As [`MatvecKernel`], on a CPU with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matvec_avx2<const K: u8>(rows: RowRun, out: &mut [f32]) {
    let RowRun {
        nb,
        x0,
        row_stride,
        y,
    } = rows;
    let ys = [y];
    let n = out.len();
    let stretch = n / MATVEC_STREAMS;
    let row = |r: usize| x0.wrapping_add(r * row_stride);
    for r in 0..stretch {
        let x: [*const u8; MATVEC_STREAMS] = std::array::from_fn(|s| row(r + s * stretch));
        // SAFETY: rows r + s * stretch (< n) of `nb` blocks and `y`, as the caller promised;
        // `out[r..]` holds index s * stretch for every s < MATVEC_STREAMS.
        unsafe { body::<K, MATVEC_STREAMS, 1, false, true>(nb, &x, &ys, &mut out[r..], stretch) };
    }
    for r in MATVEC_STREAMS * stretch..n {
        // SAFETY: row r < n, as above.
        unsafe { body::<K, 1, 1, false, true>(nb, &[row(r)], &ys, &mut out[r..=r], 1) };
    }
}

/// Bytes of a weight block, of an activation block, and the offsets of their quants (for q5,
/// of `qh`, which `qs` follows): q4_0 and iq4_nl {d, qs[16]}, q4_1 {d, m, qs[16]}, q5_0
/// {d, qh[4], qs[16]}, q5_1 {d, m, qh[4], qs[16]}, q8_0 {d, qs[32]}; activations q8_0
/// {d, qs[32]}, q8_1 {d, s, qs[32]}.
pub(super) const fn layout(k: u8) -> (usize, usize, usize, usize) {
    match k {
        Q4_0 | IQ4_NL => (18, 34, 2, 2),
        Q4_1 => (20, 36, 4, 4),
        Q5_0 => (22, 34, 2, 2),
        Q5_1 => (24, 36, 4, 4),
        _ => (34, 34, 2, 2),
    }
}

/// A weight block's 32 quants in element order: q4_1 nibbles (unsigned), q4_0 nibbles - 8,
/// q5_1 5-bit values (unsigned), q5_0 5-bit values - 16, q8_0 bytes, iq4_nl codebook values
/// (`layout`'s quant offset: for q5, `qh` then `qs`).
///
/// # Safety
/// The block's quants are readable at `q`; the CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weight_quants<const K: u8>(q: *const u8) -> __m256i {
    // SAFETY: as the caller promises.
    unsafe {
        if K == Q8_0 {
            return _mm256_loadu_si256(q.cast());
        }
        if K == IQ4_NL {
            return crate::kernels::blocks::lowbit::nibble_values_avx2(&KVALUES_IQ4NL, q);
        }
        let (qh, q) = if K == Q5_0 || K == Q5_1 {
            (q.cast::<i32>().read_unaligned(), q.add(4))
        } else {
            (0, q)
        };
        let n = nibbles(q);
        match K {
            Q4_0 => _mm256_sub_epi8(n, _mm256_set1_epi8(8)),
            // ggml's forms: 0xF0 where the fifth bit is clear (the value minus 16 as a
            // signed byte), 0x10 where it is set.
            Q5_0 => _mm256_or_si256(
                n,
                _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(-16)),
            ),
            Q5_1 => _mm256_or_si256(
                n,
                _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)),
            ),
            _ => n,
        }
    }
}

/// The unsigned and signed operands of `vpdpbusd` for quants `qx` (weights) and `qy`: as they
/// are for q4_1 and q5_1 (unsigned codes), else `|x|` and `y * sign(x)` (quants are never
/// -128).
///
/// # Safety
/// The CPU supports AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dot_operands<const K: u8>(qx: __m512i, qy: __m512i) -> (__m512i, __m512i) {
    if has_min(K) {
        return (qx, qy);
    }
    // SAFETY: as the caller promises.
    unsafe {
        let neg = _mm512_movepi8_mask(qx);
        let zero = _mm512_cmpeq_epi8_mask(qx, _mm512_setzero_si512());
        let flipped = _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy);
        (_mm512_abs_epi8(qx), _mm512_maskz_mov_epi8(!zero, flipped))
    }
}

/// The tile body, compiled into each build below (`#[inline(always)]` so that the intrinsics
/// inline under the build's features). With `STREAM`, each weight row is a stream prefetched
/// ahead of the reads (matrix-vector products, whose rows come from DRAM).
///
/// # Safety
/// As [`tile`], with exactly `RM` rows and `RN` columns, on a CPU with AVX2, FMA and F16C (and
/// AVX-512 VNNI with VL when `VNNI`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn body<
    const K: u8,
    const RM: usize,
    const RN: usize,
    const VNNI: bool,
    const STREAM: bool,
>(
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    let (xb, yb, xq, yq) = layout(K);
    // SAFETY: reads within the blocks the caller promised, under the CPU features of the
    // calling build.
    unsafe {
        // 8 lanes, each the exact sum of 4 unsigned x signed byte products, as f32.
        let us8 = |ux: __m256i, sy: __m256i| -> __m256 {
            let dot32 = if VNNI {
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), ux, sy)
            } else {
                // No saturation: |15 * 128 * 2| and |127 * 127 * 2| fit in i16.
                _mm256_madd_epi16(_mm256_maddubs_epi16(ux, sy), _mm256_set1_epi16(1))
            };
            _mm256_cvtepi32_ps(dot32)
        };
        // Q4_0 and Q5_0 matrix-vector without VNNI: unsigned codes u = q + off times y, less
        // off * y in the i16 pair sums (no saturation: 2 * 31 * 127 + 2 * 16 * 127 < 2^15),
        // which gives the sign-transfer form's exact i32 lanes with one operation less per
        // pair; `yoff[c]`, the pair sums of off * y, is computed once per activation block for
        // all rows. Not for several columns: a 2 x 4 tile has no 4 registers to spare for them.
        let offset_form = !VNNI && RN == 1 && (K == Q4_0 || K == Q5_0);
        let off = _mm256_set1_epi8(if K == Q4_0 { 8 } else { 16 });
        let mut acc = [[_mm256_setzero_ps(); RN]; RM];
        let mut summs = [[0f32; RN]; RM];
        let mut qy = [_mm256_setzero_si256(); RN];
        let mut yoff = [_mm256_setzero_si256(); RN];
        let mut dy = [0f32; RN];
        let mut sy = [0f32; RN];
        let mut streams: [StreamPrefetch; RM] = std::array::from_fn(|r| StreamPrefetch::new(x[r]));
        for i in 0..nb {
            for c in 0..RN {
                let p = y[c].add(i * yb);
                dy[c] = h2f(p);
                if has_min(K) {
                    sy[c] = h2f(p.add(2));
                }
                qy[c] = _mm256_loadu_si256(p.add(yq).cast());
                if offset_form {
                    yoff[c] = _mm256_maddubs_epi16(off, qy[c]);
                }
            }
            for r in 0..RM {
                let p = x[r].add(i * xb);
                if STREAM {
                    streams[r].step(p);
                }
                let dx = h2f(p);
                match K {
                    Q4_1 | Q5_1 => {
                        let mx = h2f(p.add(2));
                        let qx = weight_quants::<K>(p.add(xq));
                        for c in 0..RN {
                            summs[r][c] += mx * sy[c];
                            let d = _mm256_set1_ps(dx * dy[c]);
                            acc[r][c] = _mm256_fmadd_ps(d, us8(qx, qy[c]), acc[r][c]);
                        }
                    }
                    Q4_0 | Q5_0 if offset_form => {
                        let u = if K == Q4_0 {
                            weight_quants::<Q4_1>(p.add(xq))
                        } else {
                            weight_quants::<Q5_1>(p.add(xq))
                        };
                        for c in 0..RN {
                            let d = _mm256_set1_ps(dx * dy[c]);
                            let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(u, qy[c]), yoff[c]);
                            let p =
                                _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
                            acc[r][c] = _mm256_fmadd_ps(d, p, acc[r][c]);
                        }
                    }
                    _ => {
                        let qx = weight_quants::<K>(p.add(xq));
                        // Signed x signed through the sign of x (quants are never -128).
                        let ax = _mm256_sign_epi8(qx, qx);
                        for c in 0..RN {
                            let d = _mm256_set1_ps(dx * dy[c]);
                            let p = us8(ax, _mm256_sign_epi8(qy[c], qx));
                            acc[r][c] = _mm256_fmadd_ps(d, p, acc[r][c]);
                        }
                    }
                }
            }
        }
        for r in 0..RM {
            for c in 0..RN {
                let h = hsum8(acc[r][c]);
                out[r * out_stride + c] = if has_min(K) { h + summs[r][c] } else { h };
            }
        }
    }
}

/// [`body`] with two columns per 512-bit register: lanes 0..8 hold column `2j`'s pair, lanes
/// 8..16 column `2j + 1`'s, each with exactly its own per-pair operations (the scale product
/// `d_x * d_y` is one IEEE multiply per lane, as in the scalar form). `RN2` column pairs.
///
/// # Safety
/// As [`tile`], with `RM` rows and `2 * RN2` columns, on a CPU with AVX-512 F, BW, DQ, VL
/// and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
unsafe fn tile_vnni512<const K: u8, const RM: usize, const RN2: usize>(
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    let (xb, yb, xq, yq) = layout(K);
    // SAFETY: reads within the blocks the caller promised, under the features of this
    // function.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); RN2]; RM];
        let mut summs = [[0f32; 8]; RM];
        let mut qy = [_mm512_setzero_si512(); RN2];
        let mut dy = [_mm512_setzero_ps(); RN2];
        let mut sy = [0f32; 8];
        for i in 0..nb {
            for j in 0..RN2 {
                let (p0, p1) = (y[2 * j].add(i * yb), y[2 * j + 1].add(i * yb));
                let lo = _mm256_loadu_si256(p0.add(yq).cast());
                let hi = _mm256_loadu_si256(p1.add(yq).cast());
                qy[j] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                dy[j] = _mm512_insertf32x8::<1>(_mm512_set1_ps(h2f(p0)), _mm256_set1_ps(h2f(p1)));
                if has_min(K) {
                    sy[2 * j] = h2f(p0.add(2));
                    sy[2 * j + 1] = h2f(p1.add(2));
                }
            }
            for r in 0..RM {
                let p = x[r].add(i * xb);
                let dx = _mm512_set1_ps(h2f(p));
                let qx = _mm512_broadcast_i64x4(weight_quants::<K>(p.add(xq)));
                if has_min(K) {
                    let mx = h2f(p.add(2));
                    for (c, s) in summs[r].iter_mut().enumerate().take(2 * RN2) {
                        *s += mx * sy[c];
                    }
                }
                for j in 0..RN2 {
                    let (ux, sy8) = dot_operands::<K>(qx, qy[j]);
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, sy8);
                    let d = _mm512_mul_ps(dx, dy[j]);
                    acc[r][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), acc[r][j]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (j, &pair) in row.iter().enumerate() {
                for (half, v) in halves(pair).into_iter().enumerate() {
                    let h = hsum8(v);
                    let c = 2 * j + half;
                    out[r * out_stride + c] = if has_min(K) { h + summs[r][c] } else { h };
                }
            }
        }
    }
}

/// [`body`] for one column with two rows per 512-bit register: lanes 0..8 hold row `2p`'s
/// pair, lanes 8..16 row `2p + 1`'s, each with exactly its own per-pair operations. `RP` row
/// pairs; `_RN` must be 1.
///
/// # Safety
/// As [`tile`], with `2 * RP` rows and one column, on a CPU with AVX-512 F, BW, DQ, VL and
/// VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
unsafe fn rows_vnni512<const K: u8, const RP: usize, const _RN: usize>(
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    let (xb, yb, xq, yq) = layout(K);
    // SAFETY: reads within the blocks the caller promised, under the features of this
    // function.
    unsafe {
        // Pair p's lanes 0..8 take row 2p's scale, lanes 8..16 row 2p + 1's.
        let spread: [__m512i; 2] = [
            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
        ];
        let mut acc = [_mm512_setzero_ps(); RP];
        // Row r's min-term sum in lane r, each lane summed in block order as the pair dot does.
        let mut summs = _mm_setzero_ps();
        // The f16 at `off` in row r's block i (0 for rows past the tile, and for the mins of
        // types without them).
        let f16_at = |r: usize, off: usize, i: usize| -> i16 {
            if r < 2 * RP && (off == 0 || K == Q4_1) {
                x[r].add(i * xb + off).cast::<i16>().read_unaligned()
            } else {
                0
            }
        };
        let yrow = y[0];
        for i in 0..nb {
            let py = yrow.add(i * yb);
            let qy = _mm512_broadcast_i64x4(_mm256_loadu_si256(py.add(yq).cast()));
            let dy = _mm512_set1_ps(h2f(py));
            // The rows' scales (lanes 0..4) and mins (lanes 4..8), converted at once.
            let scales = _mm256_cvtph_ps(_mm_set_epi16(
                f16_at(3, 2, i),
                f16_at(2, 2, i),
                f16_at(1, 2, i),
                f16_at(0, 2, i),
                f16_at(3, 0, i),
                f16_at(2, 0, i),
                f16_at(1, 0, i),
                f16_at(0, 0, i),
            ));
            if K == Q4_1 {
                let sy = _mm_set1_ps(h2f(py.add(2)));
                let m = _mm256_extractf128_ps::<1>(scales);
                summs = _mm_add_ps(summs, _mm_mul_ps(m, sy));
            }
            let scales = _mm512_castps256_ps512(scales);
            for (pair, a) in acc.iter_mut().enumerate() {
                let (p0, p1) = (x[2 * pair].add(i * xb), x[2 * pair + 1].add(i * xb));
                let qx = match K {
                    Q8_0 => _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_loadu_si256(p0.add(xq).cast())),
                        _mm256_loadu_si256(p1.add(xq).cast()),
                    ),
                    _ => {
                        // [b0 | b0 >> 4 | b1 | b1 >> 4] in 128-bit lanes, low nibbles each.
                        let b = _mm256_set_m128i(
                            _mm_loadu_si128(p1.add(xq).cast()),
                            _mm_loadu_si128(p0.add(xq).cast()),
                        );
                        let both = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(b),
                            _mm256_srli_epi16::<4>(b),
                        );
                        // Lanes (b0, b1, b0>>4, b1>>4) -> (b0, b0>>4, b1, b1>>4).
                        let ordered = _mm512_shuffle_i64x2::<0b11_01_10_00>(both, both);
                        let n = _mm512_and_si512(ordered, _mm512_set1_epi8(0x0F));
                        match K {
                            Q4_0 => _mm512_sub_epi8(n, _mm512_set1_epi8(8)),
                            IQ4_NL => {
                                let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
                                _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), n)
                            }
                            _ => n,
                        }
                    }
                };
                let dx = _mm512_permutexvar_ps(spread[pair], scales);
                let (ux, sy8) = dot_operands::<K>(qx, qy);
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux, sy8);
                let d = _mm512_mul_ps(dx, dy);
                *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), *a);
            }
        }
        let mut mins = [0f32; 4];
        _mm_storeu_ps(mins.as_mut_ptr(), summs);
        for (pair, &a) in acc.iter().enumerate() {
            for (half, v) in halves(a).into_iter().enumerate() {
                let r = 2 * pair + half;
                let h = hsum8(v);
                out[r * out_stride] = if K == Q4_1 { h + mins[r] } else { h };
            }
        }
    }
}

/// # Safety
/// As [`body`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const K: u8, const RM: usize, const RN: usize>(
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: as promised by the caller.
    unsafe { body::<K, RM, RN, false, false>(nb, x, y, out, out_stride) }
}

/// # Safety
/// As [`body`], on a CPU with AVX-512F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn tile_avx512<const K: u8, const RM: usize, const RN: usize>(
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: as promised by the caller.
    unsafe { body::<K, RM, RN, false, false>(nb, x, y, out, out_stride) }
}

/// # Safety
/// As [`body`], on a CPU with AVX-512F, VL and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
unsafe fn tile_vnni<const K: u8, const RM: usize, const RN: usize>(
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: as promised by the caller.
    unsafe { body::<K, RM, RN, true, false>(nb, x, y, out, out_stride) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::blocks::activations::quantize_activations;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// What one output of a tile must equal: `vec_dot`, or for IQ4_NL the tinyBLAS form.
    fn pair_dot(f: CpuFeatures, dtype: DType, n: usize, x: &[u8], y: &[u8]) -> f32 {
        if dtype == DType::IQ4_NL {
            let xb = rgml::quant::cast_blocks(x).unwrap();
            let yb = rgml::quant::cast_blocks(y).unwrap();
            return crate::kernels::dots::lowbit::dot_iq4_nl_tinyblas(&xb, &yb);
        }
        crate::kernels::dots::vec_dot(f, dtype, n, x, y).unwrap()
    }

    /// The types with tiled kernels.
    const TYPES: [DType; 6] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::IQ4_NL,
        DType::Q5_0,
        DType::Q5_1,
    ];

    /// `count` random weight rows of `n` values quantized to `dtype`.
    fn weight_rows(rng: &mut StdRng, dtype: DType, n: usize, count: usize) -> Vec<Vec<u8>> {
        (0..count)
            .map(|_| {
                let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let mut b = vec![0u8; dtype.row_bytes(n).unwrap()];
                rgml::quant::quantize_row(dtype, &v, &mut b).unwrap();
                b
            })
            .collect()
    }

    /// `count` random activation rows of `n` values in `dtype`'s vec-dot type.
    fn activation_rows(
        f: CpuFeatures,
        rng: &mut StdRng,
        dtype: DType,
        n: usize,
        count: usize,
    ) -> Vec<Vec<u8>> {
        let vd = dtype.vec_dot_type();
        (0..count)
            .map(|_| {
                let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let mut b = vec![0u8; vd.row_bytes(n).unwrap()];
                quantize_activations(f, vd, &v, &mut b).unwrap();
                b
            })
            .collect()
    }

    /// Every tile shape gives each pair's dot (`vec_dot`, IQ4_NL's tinyBLAS form) bit for bit,
    /// for each type.
    #[test]
    fn tiles_equal_the_pairwise_dots() {
        let f = CpuFeatures::detect();
        if !supported(f, DType::Q4_1) {
            return;
        }
        let mut rng = StdRng::seed_from_u64(7);
        let n = 256;
        let nb = n / 32;
        for dtype in TYPES {
            let rows = weight_rows(&mut rng, dtype, n, 5);
            let cols = activation_rows(f, &mut rng, dtype, n, TILE_COLS + 1);
            let builds = [TiledIsa::Avx2, TiledIsa::Avx512, TiledIsa::Avx512Vnni];
            let best = builds
                .iter()
                .position(|&b| Some(b) == build(f))
                .unwrap_or(0);
            for (isa, rm) in builds[..=best]
                .iter()
                .zip([4, 4, 4])
                .flat_map(|(&b, m)| (1..=m).map(move |rm| (b, rm)))
            {
                for rn in 1..=TILE_COLS + 1 {
                    let x: Vec<*const u8> = rows[..rm].iter().map(|r| r.as_ptr()).collect();
                    let y: Vec<*const u8> = cols[..rn].iter().map(|c| c.as_ptr()).collect();
                    let mut out = vec![f32::NAN; rm * 11];
                    // SAFETY: supported, `isa` at most this CPU's best build; rows and
                    // columns hold `nb` blocks each.
                    unsafe { tile_on(isa, dtype, nb, &x, &y, &mut out, 11) };
                    for r in 0..rm {
                        for c in 0..rn {
                            let want = pair_dot(f, dtype, n, &rows[r], &cols[c]);
                            assert_eq!(
                                out[r * 11 + c].to_bits(),
                                want.to_bits(),
                                "{dtype} {isa:?} {rm}x{rn} ({r}, {c})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The AVX2 column kernel gives each pair's dot (as `tile`) bit for bit, for every column
    /// count and type, with rows of several blocks.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn cols_kernel_equals_the_pair_dots() {
        let f = CpuFeatures::detect();
        if !f.has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = StdRng::seed_from_u64(23);
        let n = 288;
        let nb = n / 32;
        for dtype in TYPES {
            let row = weight_rows(&mut rng, dtype, n, 1).remove(0);
            let cols = activation_rows(f, &mut rng, dtype, n, COLS);
            for rn in 1..=COLS {
                let y: Vec<*const u8> = cols[..rn].iter().map(|c| c.as_ptr()).collect();
                let mut scales = vec![f32::NAN; scales_len(nb)];
                let mut out = vec![f32::NAN; COLS];
                // SAFETY: AVX2 (checked); the row and columns hold `nb` blocks each; scales
                // and out sized as the kernel needs.
                unsafe {
                    widen_scales(dtype, nb, &y, &mut scales);
                    let kernel = avx2_cols(dtype).unwrap();
                    kernel(
                        nb,
                        WeightRow::dense(dtype, row.as_ptr()),
                        &y,
                        &scales,
                        &mut out,
                    );
                }
                for c in 0..rn {
                    let want = pair_dot(f, dtype, n, &row, &cols[c]);
                    assert_eq!(
                        out[c].to_bits(),
                        want.to_bits(),
                        "{dtype} {rn} columns ({c})"
                    );
                }
            }
        }
    }

    /// The AVX2 matrix-vector kernel gives each row's `vec_dot` bit for bit, for row counts
    /// that do and do not split evenly into its streams, and rows with gaps between them.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn matvec_equals_the_pair_dots() {
        let f = CpuFeatures::detect();
        if !f.has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = StdRng::seed_from_u64(11);
        let n = 320;
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
        ] {
            let rb = dtype.row_bytes(n).unwrap();
            let stride = rb + 6;
            let nrows = 14;
            let mut w = vec![0u8; nrows * stride];
            for r in 0..nrows {
                let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                rgml::quant::quantize_row(dtype, &v, &mut w[r * stride..r * stride + rb]).unwrap();
            }
            let vd = dtype.vec_dot_type();
            let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let mut y = vec![0u8; vd.row_bytes(n).unwrap()];
            quantize_activations(f, vd, &v, &mut y).unwrap();
            // The AVX2 build's kernel, also where the CPU has AVX-512.
            let kernel = matvec_kernel(f.avx2_only(), dtype).expect("a kernel");
            // Fewer rows than streams, one row per stream and a remainder, several per stream.
            for m in [1, 2, 5, 7, 9, 14] {
                let mut out = vec![f32::NAN; m];
                let rows = RowRun {
                    nb: n / 32,
                    x0: w.as_ptr(),
                    row_stride: stride,
                    y: y.as_ptr(),
                };
                // SAFETY: AVX2 checked; `m` rows of `nb` blocks `stride` apart, `y` `nb` blocks.
                unsafe { kernel(rows, &mut out) };
                for (r, got) in out.iter().enumerate() {
                    let want = crate::kernels::dots::vec_dot(
                        f,
                        dtype,
                        n,
                        &w[r * stride..r * stride + rb],
                        &y,
                    )
                    .unwrap();
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} {m} rows, row {r}");
                }
            }
        }
    }
}
