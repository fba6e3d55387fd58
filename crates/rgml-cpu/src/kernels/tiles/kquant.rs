//! Batched K-quant products (Q2_K…Q6_K and IQ4_XS weights by 8 or more activation rows) with the
//! arithmetic of ggml's tiled kernel (`ggml-cpu/tiled/`), which a native x86 ggml-cpu runs for
//! these types whenever src1 has at least 8 rows, instead of `vec_dot`.
//!
//! Per output and per 256-element super-block ggml computes two exact integers, `s1 = sum_j
//! scale_j * sum(q * y)` over the sub-blocks (Q6_K's quants taken as `q - 32`, Q3_K's as `q - 4`,
//! Q3_K's and IQ4_XS's scales as `scale - 32`, IQ4_XS's quants as their codebook values) and,
//! for the types with mins (Q2_K, Q4_K, Q5_K), `s2 = sum_j min_j * bsum_j`; then, in f32, `res = d0 * s1`, `res =
//! fnmadd(dmin0, s2, res)` and `acc = fma(res, d1, acc)`, with `d0`/`dmin0` the weight block's
//! f16 scales and `d1` the Q8_K block's f32 scale; `acc` starts at 0 and goes through the
//! blocks in order. The AVX2 microkernel and the AVX-512 VNNI one (whose `acc + res * d1`
//! GCC contracts into the same FMA; checked on its disassembly) give the same numbers, so one
//! form serves both [`crate::Isa`] choices.
//!
//! Here each weight super-block is decoded once (quants in element order, per-16 scales, the
//! weights of the bsum correction) and multiplied by a run of activation columns; the integer
//! sums use `maddubs`/`madd` on AVX2 and plain integer code otherwise, which are exact either
//! way (IQ4_XS's signed values go through `|q|` and `y * sign(q)`, as in ggml, since `q + 128`
//! would overflow `maddubs`), and the float steps are the same on both.

use crate::kernels::blocks::kquant::{q4k_quants, q5k_quants, q6k_quants, scales_mins};
use crate::kernels::blocks::lowbit::{
    iq4xs_scales, iq4xs_values, q2k_quants, q3k_codes, q3k_scales,
};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::x86;
use rgml::quant::{BlockIQ4_XS, BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, QK_K};
use rgml::DType;

/// ggml takes the tiled path from this many src1 rows (`ggml_tiled_min_batch`).
pub(crate) const MIN_ROWS: usize = 8;

/// Activation columns per call of [`row`] (a weight row's blocks are decoded once per call).
pub(crate) const COLS: usize = 64;

/// Bytes of a Q8_K block: `d` (f32), `qs` (256 i8), `bsums` (16 i16).
pub(super) const Q8K_BYTES: usize = 292;

/// The weight types, as the kernels' `K` parameter.
pub(super) const Q4K: u8 = 0;
pub(super) const Q5K: u8 = 1;
pub(super) const Q6K: u8 = 2;
pub(super) const Q2K: u8 = 3;
pub(super) const Q3K: u8 = 4;
pub(super) const IQ4XS: u8 = 5;

/// `$go!(K)` with the kind constant of weight type `$dtype` (nothing for other types): the one
/// place that maps types onto the kernels' `K` parameter.
macro_rules! by_kind {
    ($dtype:expr, $go:ident) => {
        match $dtype {
            DType::Q4_K => $go!(Q4K),
            DType::Q5_K => $go!(Q5K),
            DType::Q6_K => $go!(Q6K),
            DType::Q2_K => $go!(Q2K),
            DType::Q3_K => $go!(Q3K),
            DType::IQ4_XS => $go!(IQ4XS),
            _ => {}
        }
    };
}
pub(super) use by_kind;

/// Whether weights of `dtype` take the tiled path with `rows` src1 rows.
pub(crate) fn takes(dtype: DType, rows: usize) -> bool {
    use DType::*;
    matches!(dtype, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS) && rows >= MIN_ROWS
}

/// Whether weights of kind `K` have mins (`s2` and its `fnmadd`).
pub(super) const fn has_min(k: u8) -> bool {
    matches!(k, Q4K | Q5K | Q2K)
}

/// One decoded weight super-block.
#[repr(C, align(32))]
pub(super) struct Decoded {
    /// Quants in element order, unsigned (Q6_K: `q + 32`, Q3_K: `q + 4`), except IQ4_XS's
    /// signed codebook values (as their bytes).
    pub(super) q: [u8; QK_K],
    /// The scale of each 16 quants, as `_mm256_madd_epi16` operands: chunk c's 16 lanes are
    /// `scale(2c)` x 8 then `scale(2c + 1)` x 8.
    pub(super) scales: [[i16; 16]; 8],
    /// The scale of each 16 quants, once each.
    pub(super) sub16: [i16; 16],
    /// Weights of the activation's per-16 sums: Q4_K/Q5_K the mins (each twice), Q2_K the
    /// mins, Q6_K/Q3_K the scales (for the `- 32` / `- 4` of their quants); IQ4_XS none.
    pub(super) bsum_weights: [i16; 16],
    pub(super) d0: f32,
    pub(super) dmin0: f32,
}

impl Decoded {
    pub(super) fn new() -> Decoded {
        Decoded {
            q: [0; QK_K],
            scales: [[0; 16]; 8],
            sub16: [0; 16],
            bsum_weights: [0; 16],
            d0: 0.0,
            dmin0: 0.0,
        }
    }

    /// Block `b` of a weight row of kind `K` at `x`.
    ///
    /// # Safety
    /// Block `b` of the row is readable at `x`.
    #[inline(always)]
    pub(super) unsafe fn load<const K: u8>(&mut self, x: *const u8, b: usize) {
        // SAFETY: as the caller promises; the reads are unaligned copies of one block.
        unsafe {
            match K {
                Q4K => {
                    let blk = x.cast::<BlockQ4_K>().add(b).read_unaligned();
                    q4k_quants(&blk, &mut self.q);
                    self.set_k4(blk.d, blk.dmin, &blk.scales);
                }
                Q5K => {
                    let blk = x.cast::<BlockQ5_K>().add(b).read_unaligned();
                    q5k_quants(&blk, &mut self.q);
                    self.set_k4(blk.d, blk.dmin, &blk.scales);
                }
                Q2K => self.set_q2k(&x.cast::<BlockQ2_K>().add(b).read_unaligned()),
                Q3K => self.set_q3k(&x.cast::<BlockQ3_K>().add(b).read_unaligned()),
                IQ4XS => self.set_iq4xs(&x.cast::<BlockIQ4_XS>().add(b).read_unaligned()),
                _ => {
                    let blk = x.cast::<BlockQ6_K>().add(b).read_unaligned();
                    q6k_quants(&blk, &mut self.q);
                    self.set_scales16(&blk.scales.map(i16::from));
                    self.bsum_weights = blk.scales.map(i16::from);
                    self.d0 = blk.d.to_f32_const();
                }
            }
        }
    }

    /// One scale per 16 quants.
    #[inline(always)]
    fn set_scales16(&mut self, sc: &[i16; 16]) {
        self.sub16 = *sc;
        for (c, lanes) in self.scales.iter_mut().enumerate() {
            lanes[..8].fill(sc[2 * c]);
            lanes[8..].fill(sc[2 * c + 1]);
        }
    }

    #[inline(always)]
    fn set_q2k(&mut self, blk: &BlockQ2_K) {
        q2k_quants(blk, &mut self.q);
        self.set_scales16(&blk.scales.map(|s| i16::from(s & 0x0F)));
        self.bsum_weights = blk.scales.map(|s| i16::from(s >> 4));
        self.d0 = blk.d.to_f32_const();
        self.dmin0 = blk.dmin.to_f32_const();
    }

    #[inline(always)]
    fn set_q3k(&mut self, blk: &BlockQ3_K) {
        q3k_codes(blk, &mut self.q);
        let sc = q3k_scales(blk).map(i16::from);
        self.set_scales16(&sc);
        self.bsum_weights = sc;
        self.d0 = blk.d.to_f32_const();
    }

    #[inline(always)]
    fn set_iq4xs(&mut self, blk: &BlockIQ4_XS) {
        let mut v = [0i8; QK_K];
        iq4xs_values(blk, &mut v);
        self.q = v.map(|b| b as u8);
        for (c, (lanes, s)) in self.scales.iter_mut().zip(iq4xs_scales(blk)).enumerate() {
            *lanes = [i16::from(s); 16];
            self.sub16[2 * c..2 * c + 2].fill(i16::from(s));
        }
        self.d0 = blk.d.to_f32_const();
    }

    #[inline(always)]
    fn set_k4(&mut self, d: half::f16, dmin: half::f16, packed: &[u8; 12]) {
        let (sc, m) = scales_mins(packed);
        for (c, (lanes, &s)) in self.scales.iter_mut().zip(&sc).enumerate() {
            *lanes = [i16::from(s); 16];
            self.sub16[2 * c..2 * c + 2].fill(i16::from(s));
        }
        for (j, &v) in m.iter().enumerate() {
            self.bsum_weights[2 * j] = i16::from(v);
            self.bsum_weights[2 * j + 1] = i16::from(v);
        }
        self.d0 = d.to_f32_const();
        self.dmin0 = dmin.to_f32_const();
    }
}

/// The Q8_K block at `p`: its scale, quants and per-16 sums.
///
/// # Safety
/// 292 readable bytes at `p`.
#[inline(always)]
unsafe fn q8k_parts(p: *const u8) -> (f32, *const i8, [i16; 16]) {
    // SAFETY: as the caller promises (d at 0, qs at 4, bsums at 260).
    unsafe {
        let d = p.cast::<f32>().read_unaligned();
        let bsums = p.add(4 + QK_K).cast::<[i16; 16]>().read_unaligned();
        (d, p.add(4).cast(), bsums)
    }
}

/// `(s1, s2)` of a decoded block and an activation block, portable form.
///
/// # Safety
/// 256 readable quants at `y`.
#[inline(always)]
unsafe fn sums_portable<const K: u8>(w: &Decoded, y: *const i8, bsums: &[i16; 16]) -> (i32, i32) {
    // SAFETY: as the caller promises.
    let y = unsafe { &*y.cast::<[i8; QK_K]>() };
    let mut dot = 0i32;
    for (j, (q, yv)) in w.q.chunks_exact(16).zip(y.chunks_exact(16)).enumerate() {
        let s: i32 = q
            .iter()
            .zip(yv)
            .map(|(&a, &b)| quant::<K>(a) * i32::from(b))
            .sum();
        dot += i32::from(w.scales[j / 2][8 * (j % 2)]) * s;
    }
    let corr: i32 = w
        .bsum_weights
        .iter()
        .zip(bsums)
        .map(|(&a, &b)| i32::from(a) * i32::from(b))
        .sum();
    finish::<K>(dot, corr)
}

/// A decoded quant's value as stored (IQ4_XS's bytes are signed).
#[inline(always)]
pub(super) fn quant<const K: u8>(q: u8) -> i32 {
    if K == IQ4XS {
        i32::from(q as i8)
    } else {
        i32::from(q)
    }
}

/// `(s1, s2)` from the scaled quant products and the weighted bsums.
#[inline(always)]
pub(super) fn finish<const K: u8>(dot: i32, corr: i32) -> (i32, i32) {
    match K {
        Q6K => (dot - 32 * corr, 0),
        Q3K => (dot - 4 * corr, 0),
        IQ4XS => (dot, 0),
        _ => (dot, corr),
    }
}

/// The per-output float steps of one block (see the module docs).
#[inline(always)]
fn accumulate<const K: u8>(w: &Decoded, (s1, s2): (i32, i32), d1: f32, acc: &mut f32) {
    let mut res = w.d0 * s1 as f32;
    if has_min(K) {
        res = (-w.dmin0).mul_add(s2 as f32, res);
    }
    *acc = res.mul_add(d1, *acc);
}

/// `acc[c]` = the tiled product of the weight row at `x` (`nb` blocks of `dtype`) and the
/// Q8_K activation row `y[c]`, for the first `y.len()` entries of `acc`.
///
/// # Safety
/// [`takes`] accepts `dtype`; `x` points at `nb` readable blocks of it, every `y[c]` at
/// `nb` readable Q8_K blocks.
pub(crate) unsafe fn row(
    f: CpuFeatures,
    dtype: DType,
    nb: usize,
    x: *const u8,
    y: &[*const u8],
    acc: &mut [f32],
) {
    macro_rules! go {
        ($k:ident) => {{
            #[cfg(target_arch = "x86_64")]
            if f.has_avx2() {
                // SAFETY: `f` says the CPU has AVX2, FMA and F16C; pointers as promised.
                unsafe { row_avx2::<$k>(nb, x, y, acc) };
                return;
            }
            // SAFETY: as promised by the caller.
            unsafe { row_body::<$k, false>(nb, x, y, acc) }
        }};
    }
    by_kind!(dtype, go);
}

/// [`row_body`] compiled for AVX2, FMA and F16C.
///
/// # Safety
/// As [`row`], on a CPU with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2<const K: u8>(nb: usize, x: *const u8, y: &[*const u8], acc: &mut [f32]) {
    // SAFETY: as promised by the caller.
    unsafe { row_body::<K, true>(nb, x, y, acc) }
}

/// The row loop: each block decoded once, then every column's sums and float steps.
///
/// # Safety
/// As [`row`]; with `AVX2`, the CPU has AVX2 and the caller is compiled with it.
#[inline(always)]
unsafe fn row_body<const K: u8, const AVX2: bool>(
    nb: usize,
    x: *const u8,
    y: &[*const u8],
    acc: &mut [f32],
) {
    let mut w = Decoded::new();
    acc.fill(0.0);
    for b in 0..nb {
        // SAFETY: block `b < nb` of the row.
        unsafe { w.load::<K>(x, b) };
        for (a, &yc) in acc.iter_mut().zip(y) {
            // SAFETY: block `b < nb` of an activation row.
            let (d1, qs, bsums) = unsafe { q8k_parts(yc.add(b * Q8K_BYTES)) };
            #[cfg(target_arch = "x86_64")]
            let sums = if AVX2 {
                // SAFETY: AVX2 (the caller's promise); 256 quants at `qs`.
                unsafe { sums_avx2::<K>(&w, qs, &bsums) }
            } else {
                // SAFETY: 256 quants at `qs`.
                unsafe { sums_portable::<K>(&w, qs, &bsums) }
            };
            #[cfg(not(target_arch = "x86_64"))]
            // SAFETY: 256 quants at `qs`.
            let sums = unsafe { sums_portable::<K>(&w, qs, &bsums) };
            accumulate::<K>(&w, sums, d1, a);
        }
    }
}

/// [`sums_portable`] with AVX2: `maddubs` of the unsigned quants and the activations (pairs
/// stay below 2 * 63 * 127; IQ4_XS's signed values as `|q|` and `y * sign(q)`, below
/// 2 * 127 * 127), `madd` by the scales, an exact i32 reduction.
///
/// # Safety
/// AVX2; 256 readable quants at `y`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sums_avx2<const K: u8>(w: &Decoded, y: *const i8, bsums: &[i16; 16]) -> (i32, i32) {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 as promised; loads inside `w` and the 256 quants at `y`.
    unsafe {
        let mut dot = _mm256_setzero_si256();
        for c in 0..8 {
            let q = _mm256_load_si256(w.q.as_ptr().add(32 * c).cast());
            let yv = _mm256_loadu_si256(y.add(32 * c).cast());
            let s = _mm256_loadu_si256(w.scales[c].as_ptr().cast());
            let p = if K == IQ4XS {
                x86::mul_add_i8(q, yv)
            } else {
                _mm256_maddubs_epi16(q, yv)
            };
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p, s));
        }
        let bw = _mm256_loadu_si256(w.bsum_weights.as_ptr().cast());
        let corr = _mm256_madd_epi16(_mm256_loadu_si256(bsums.as_ptr().cast()), bw);
        // Both reductions at once: dot in the low 128 bits, corr in the high.
        let lo = _mm256_permute2x128_si256::<0x20>(dot, corr);
        let hi = _mm256_permute2x128_si256::<0x31>(dot, corr);
        let t = _mm256_add_epi32(lo, hi);
        let t = _mm256_add_epi32(t, _mm256_shuffle_epi32::<0b01_00_11_10>(t));
        let t = _mm256_add_epi32(t, _mm256_shuffle_epi32::<0b10_11_00_01>(t));
        let dot = _mm256_cvtsi256_si32(t);
        let corr = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(t));
        finish::<K>(dot, corr)
    }
}

/// Activation rows per call of the register-tiled kernels (`kquant_avx512`, `kquant_avx2`): a
/// call decodes each weight block once for all of them (128 rather than 64: 15% faster,
/// measured with `cargo bench -p rgml-cpu`).
pub(crate) const TILE_RUN: usize = 128;

/// Writes the first `n` (at most `R`) outputs of a column of a register-tiled kernel's result
/// to `dst`: one store for a whole column (a `memcpy` call of a variable length cost 5% of a
/// prompt).
///
/// # Safety
/// `n` floats are writable at `dst`.
#[inline(always)]
pub(crate) unsafe fn store_column<const R: usize>(col: &[f32; R], dst: *mut f32, n: usize) {
    // SAFETY: as the caller promises.
    unsafe {
        if n == R {
            dst.cast::<[f32; R]>().write_unaligned(*col);
        } else {
            for (r, &v) in col.iter().enumerate().take(n) {
                dst.add(r).write_unaligned(v);
            }
        }
    }
}

/// 256 quants in element order to the piece order of the register-tiled kernels: piece p (64
/// bytes) holds, for each sub-block j of 16, its elements `4p..4p + 4` (a transpose of 4-byte
/// groups), so that a sub-block's products land in the same lanes of every piece (see
/// `kquant_avx512`, `kquant_avx2`).
#[inline(always)]
pub(crate) fn to_pieces(src: &[u8; QK_K], dst: &mut [u8; QK_K]) {
    for p in 0..4 {
        for j in 0..16 {
            let to = 64 * p + 4 * j;
            let from = 16 * j + 4 * p;
            dst[to..to + 4].copy_from_slice(&src[from..from + 4]);
        }
    }
}

/// A converted activation row of Q8_K blocks with each block's quants put in piece order
/// ([`to_pieces`]) in place (MUL_MAT's phase 1, for the register-tiled kernels).
pub(crate) fn to_piece_order(row: &mut [u8]) -> rgml::Result<()> {
    let (blocks, rest) = row.as_chunks_mut::<Q8K_BYTES>();
    if !rest.is_empty() {
        return Err(rgml::Error::Backend {
            backend: "CPU".into(),
            message: format!("K-quant tiles: {} bytes are not Q8_K blocks", row.len()),
        });
    }
    blocks.iter_mut().for_each(block_to_pieces);
    Ok(())
}

/// A Q8_K block's quants (bytes 4..260) put in piece order in place.
fn block_to_pieces(block: &mut [u8; Q8K_BYTES]) {
    let mut natural = [0u8; QK_K];
    natural.copy_from_slice(&block[4..4 + QK_K]);
    let mut pieces = [0u8; QK_K];
    to_pieces(&natural, &mut pieces);
    block[4..4 + QK_K].copy_from_slice(&pieces);
}

/// Scratch bytes [`gather_pieces`] needs for rows of `nb` blocks.
pub(crate) fn run_scratch_bytes(nb: usize) -> usize {
    TILE_RUN * nb * Q8K_BYTES
}

/// Copies of the Q8_K activation rows `y` (at most [`TILE_RUN`], `nb` blocks each) with their
/// quants in piece order, in `scratch`, each block copied by `reorder(src, dst)` (a
/// register-tiled kernel's own, or [`reorder_block`]): what MUL_MAT_ID's routed rows give the
/// register-tiled kernels. The run is padded with its last row. `None` when `scratch` is
/// smaller than [`run_scratch_bytes`]`(nb)` or `y` is empty or too long.
///
/// # Safety
/// Every `y[c]` points at `nb` readable Q8_K blocks; `reorder` may be called on such a block
/// and a block of scratch.
pub(crate) unsafe fn gather_pieces(
    nb: usize,
    y: &[*const u8],
    scratch: &mut [u8],
    reorder: impl Fn(*const u8, *mut u8),
) -> Option<[*const u8; TILE_RUN]> {
    let last = y.len().checked_sub(1).filter(|&l| l < TILE_RUN)?;
    let scratch = scratch.get_mut(..run_scratch_bytes(nb))?;
    let mut out = [std::ptr::null(); TILE_RUN];
    for (c, &src) in y.iter().enumerate() {
        let row = &mut scratch[c * nb * Q8K_BYTES..(c + 1) * nb * Q8K_BYTES];
        for (b, dst) in row.chunks_exact_mut(Q8K_BYTES).enumerate() {
            reorder(src.wrapping_add(b * Q8K_BYTES), dst.as_mut_ptr());
        }
        out[c] = row.as_ptr();
    }
    let last = out[last];
    for slot in &mut out[y.len()..] {
        *slot = last;
    }
    Some(out)
}

/// One Q8_K block copied from `src` to `dst` with its quants in piece order (portable).
///
/// # Safety
/// A readable Q8_K block at `src`, a writable one at `dst`, apart.
pub(crate) unsafe fn reorder_block(src: *const u8, dst: *mut u8) {
    // SAFETY: as the caller promises.
    let (src, dst) = unsafe {
        (
            &*src.cast::<[u8; Q8K_BYTES]>(),
            &mut *dst.cast::<[u8; Q8K_BYTES]>(),
        )
    };
    *dst = *src;
    block_to_pieces(dst);
}

/// Operands of the kernel benchmarks: `nrows` weight rows of `dtype` and `ntok` Q8_K
/// activation rows of K = 2048 (patterned, not random: the speed does not depend on the
/// values), as (weights, activations, weight row bytes, activation row bytes).
pub(crate) fn bench_operands(
    dtype: DType,
    nrows: usize,
    ntok: usize,
) -> Option<(Vec<u8>, Vec<u8>, usize, usize)> {
    const K: usize = 2048;
    let rows = |n: usize, t: DType, v: fn(usize) -> f32| -> Option<(Vec<u8>, usize)> {
        let v: Vec<f32> = (0..K).map(v).collect();
        let bytes = t.row_bytes(K).ok()?;
        let mut out = vec![0u8; bytes * n];
        for r in out.chunks_exact_mut(bytes) {
            rgml::quant::quantize_row(t, &v, r).ok()?;
        }
        Some((out, bytes))
    };
    let (x, xrow) = rows(nrows, dtype, |i| ((i * 7 % 13) as f32 - 6.0) / 7.0)?;
    let (y, yrow) = rows(ntok, DType::Q8_K, |i| ((i * 5 % 11) as f32 - 5.0) / 5.0)?;
    Some((x, y, xrow, yrow))
}

/// Multiply-adds per second of [`row`] alone, 1 thread: K 2048 by 256 weight rows by `ntok`
/// activation rows, in runs of [`COLS`] as MUL_MAT calls it (`None`: not a K-quant type).
pub(crate) fn bench_macs(dtype: DType, ntok: usize) -> Option<f64> {
    if !takes(dtype, MIN_ROWS) {
        return None;
    }
    let f = CpuFeatures::detect();
    let nrows = 256;
    let (x, y, xrow, yrow) = bench_operands(dtype, nrows, ntok)?;
    let mut acc = [0f32; COLS];
    let best = best_of_7(|| {
        for c0 in (0..ntok).step_by(COLS) {
            let cols: Vec<*const u8> = (c0..(c0 + COLS).min(ntok))
                .map(|c| y[c * yrow..].as_ptr())
                .collect();
            for r in 0..nrows {
                // SAFETY: a K-quant type; a weight row and Q8_K rows of 2048 / QK_K blocks.
                unsafe {
                    row(
                        f,
                        dtype,
                        2048 / QK_K,
                        x[r * xrow..].as_ptr(),
                        &cols,
                        &mut acc,
                    )
                };
                std::hint::black_box(&acc);
            }
        }
    });
    Some((2048 * ntok * nrows) as f64 / best)
}

/// The shortest of 7 timed runs of `run`, in seconds.
pub(crate) fn best_of_7(mut run: impl FnMut()) -> f64 {
    (0..7)
        .map(|_| {
            let start = std::time::Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// `count` rows of `n` random values (a few of them 9 times larger, so that scales differ)
/// quantized to `dtype`: the operands of the tile kernels' tests.
#[cfg(test)]
pub(super) fn random_rows(
    rng: &mut rand::rngs::StdRng,
    dtype: DType,
    n: usize,
    count: usize,
) -> Vec<Vec<u8>> {
    use rand::Rng;
    (0..count)
        .map(|_| {
            let v: Vec<f32> = (0..n)
                .map(|_| rng.gen_range(-1.0f32..1.0) * if rng.gen_bool(0.03) { 9.0 } else { 1.0 })
                .collect();
            let mut b = vec![0u8; dtype.row_bytes(n).unwrap()];
            rgml::quant::quantize_row(dtype, &v, &mut b).unwrap();
            b
        })
        .collect()
}

/// Asserts that a register-tiled kernel gives [`row`]'s outputs bit for bit, for every type the
/// tiles take, on random rows of 3 blocks, tiles of `(weight rows, activation rows)` from
/// `shapes` (full and short): `tiles(dtype, nb, x, y, out)` computes `out[c][r]` from weight
/// rows `x` and activation rows `y` in piece order. `what` names the kernel in failures.
#[cfg(test)]
pub(super) fn assert_tiles_equal_row<const R: usize>(
    what: &str,
    seed: u64,
    shapes: &[(usize, usize)],
    tiles: impl Fn(DType, usize, &[*const u8], &[*const u8], &mut [[f32; R]; TILE_RUN]),
) {
    use rand::SeedableRng;
    let f = CpuFeatures::detect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let nb = 3;
    let n = nb * QK_K;
    for dtype in [
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q2_K,
        DType::Q3_K,
    ] {
        let w = random_rows(&mut rng, dtype, n, R + 1);
        let a = random_rows(&mut rng, DType::Q8_K, n, 23);
        let mut pieces = a.clone();
        for row in &mut pieces {
            to_piece_order(row).unwrap();
        }
        let y: Vec<*const u8> = a.iter().map(|r| r.as_ptr()).collect();
        let yp: Vec<*const u8> = pieces.iter().map(|r| r.as_ptr()).collect();
        for &(nrows, ncols) in shapes {
            let x: Vec<*const u8> = w[..nrows].iter().map(|r| r.as_ptr()).collect();
            let mut out = [[f32::NAN; R]; TILE_RUN];
            tiles(dtype, nb, &x, &yp[..ncols], &mut out);
            for (r, wr) in w[..nrows].iter().enumerate() {
                let mut want = vec![f32::NAN; ncols];
                // SAFETY: rows of `nb` blocks of their types.
                unsafe { row(f, dtype, nb, wr.as_ptr(), &y[..ncols], &mut want) };
                for (c, &v) in want.iter().enumerate() {
                    assert_eq!(
                        out[c][r].to_bits(),
                        v.to_bits(),
                        "{what}, {dtype}, tile {nrows}x{ncols}: ({r}, {c}) {} vs {v}",
                        out[c][r]
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// The AVX2 and portable forms give the same bits, and both are within f32 rounding of the
    /// f64 product of the dequantized operands.
    #[test]
    fn simd_portable_and_f64_reference_agree() {
        let f = CpuFeatures::detect();
        let mut rng = StdRng::seed_from_u64(5);
        let n = 3 * QK_K;
        for dtype in [
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::Q2_K,
            DType::Q3_K,
            DType::IQ4_XS,
        ] {
            let w = random_rows(&mut rng, dtype, n, 3);
            let a = random_rows(&mut rng, DType::Q8_K, n, 11);
            let y: Vec<*const u8> = a.iter().map(|r| r.as_ptr()).collect();
            for wr in &w {
                let mut fast = vec![f32::NAN; y.len()];
                let mut slow = vec![f32::NAN; y.len()];
                // SAFETY: rows of `n / QK_K` blocks of their types.
                unsafe {
                    row(f, dtype, n / QK_K, wr.as_ptr(), &y, &mut fast);
                    row(
                        f.without_simd(),
                        dtype,
                        n / QK_K,
                        wr.as_ptr(),
                        &y,
                        &mut slow,
                    );
                }
                let mut wd = vec![0f32; n];
                rgml::quant::dequantize_row(dtype, wr, &mut wd).unwrap();
                for (c, ar) in a.iter().enumerate() {
                    assert_eq!(fast[c].to_bits(), slow[c].to_bits(), "{dtype} column {c}");
                    let mut ad = vec![0f32; n];
                    rgml::quant::dequantize_row(DType::Q8_K, ar, &mut ad).unwrap();
                    let exact: f64 = wd
                        .iter()
                        .zip(&ad)
                        .map(|(&p, &q)| f64::from(p) * f64::from(q))
                        .sum();
                    let mag: f64 = wd
                        .iter()
                        .zip(&ad)
                        .map(|(&p, &q)| (f64::from(p) * f64::from(q)).abs())
                        .sum();
                    let err = (f64::from(fast[c]) - exact).abs() / mag;
                    assert!(
                        err < 1e-5,
                        "{dtype} column {c}: {} vs {exact} ({err})",
                        fast[c]
                    );
                }
            }
        }
    }
}
