//! The low-bit dot products `q2_K·q8_K`, `q3_K·q8_K`, `iq4_xs·q8_K`, `iq4_nl·q8_0` and
//! `mxfp4·q8_0` with the float arithmetic of ggml's x86 `ggml_vec_dot_*` (`arch/x86/quants.c`,
//! the `__AVX2__` branches, which AVX-512 builds run too: their helpers have no VNNI variant
//! that reaches a float), plus the super-block decoders the tiled batch kernel ([`super::ktiled`]) shares.
//!
//! Per super-block ggml keeps 8 lanes of exact i32 sums (lane `k` sums the products of bytes
//! `4k..4k + 4` of every 32-byte chunk, each scaled by its sub-block scale), converts them to
//! f32 and folds them into an 8-lane accumulator with one FMA by `d = y.d * x.d`; one
//! `hsum_float_8` at the end. Q2_K's mins enter the same accumulator first, with an FMA by
//! `dmin = -y.d * x.dmin` of the 8 lanes `_mm256_madd_epi16(mins, bsums)`. IQ4_NL and MXFP4
//! (32-value codebook blocks, [`NibbleBlock`]; one kernel for both, the block scale `y.d *
//! x.d` or `y.d * e8m0_half(x.e)`) alternate two accumulators between even and odd blocks, add
//! them before the horizontal sum, and handle an odd last block in scalar code as
//! `sumf + sumi * d`, contracted into one FMA ([`nibble_tail`]).
//!
//! The portable functions compute the same lanes with plain integer code and the same float
//! operations, so both forms give the same bits.

use crate::kernels::blocks::lowbit::{
    iq4xs_scales, iq4xs_values, nibble_values, q2k_quants, q3k_codes, q3k_scales, NibbleBlock,
};
use crate::kernels::dots::run;
use crate::kernels::fp16;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::hsum8;
use rgml::quant::{
    BlockIQ4_NL, BlockIQ4_XS, BlockMXFP4, BlockQ2_K, BlockQ3_K, BlockQ8_0, BlockQ8_K, QK_K,
};
#[cfg(target_arch = "x86_64")]
use rgml::DType;

/// ggml's 8 i32 lanes of a super-block of signed values `q`: lane `k` = `sum_chunk
/// scale(chunk, k) * sum_{b in 4k..4k+4} q[32 chunk + b] * y[32 chunk + b]`, with one scale per
/// `SUB` values (`SUB` = 16: `sc[2 chunk]` for lanes 0..4, `sc[2 chunk + 1]` for lanes 4..8).
#[inline(always)]
fn scaled_lanes<const SUB: usize>(q: &[i8; QK_K], y: &[i8; QK_K], sc: &[i8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (chunk, (qc, yc)) in q.chunks_exact(32).zip(y.chunks_exact(32)).enumerate() {
        for (k, lane) in lanes.iter_mut().enumerate() {
            let s = i32::from(sc[chunk * 32 / SUB + (4 * k) / SUB]);
            let p: i32 = (4 * k..4 * k + 4)
                .map(|b| i32::from(qc[b]) * i32::from(yc[b]))
                .sum();
            *lane += s * p;
        }
    }
    lanes
}

#[inline(always)]
fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: [i32; 8]) {
    for (a, l) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(l as f32, *a);
    }
}

/// Q2_K weights · Q8_K activations, over the common number of super-blocks.
pub fn dot_q2_k_q8_k(f: CpuFeatures, x: &[BlockQ2_K], y: &[BlockQ8_K]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q2_k::<false>(x, y) };
    }
    let _ = f;
    let mut acc = [0f32; 8];
    let mut q = [0u8; QK_K];
    for (bx, by) in x.iter().zip(y) {
        let d = by.d * bx.d.to_f32_const();
        let dmin = -by.d * bx.dmin.to_f32_const();
        let m = |j: usize| i32::from(bx.scales[j] >> 4) * i32::from(by.bsums[j]);
        fma_lanes(
            &mut acc,
            dmin,
            std::array::from_fn(|k| m(2 * k) + m(2 * k + 1)),
        );
        q2k_quants(bx, &mut q);
        let sc = bx.scales.map(|s| (s & 0x0F) as i8);
        let lanes = scaled_lanes::<16>(&q.map(|v| v as i8), &by.qs, &sc);
        fma_lanes(&mut acc, d, lanes);
    }
    hsum8(&acc)
}

/// Q3_K weights · Q8_K activations, over the common number of super-blocks.
pub fn dot_q3_k_q8_k(f: CpuFeatures, x: &[BlockQ3_K], y: &[BlockQ8_K]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q3_k::<false>(x, y) };
    }
    let _ = f;
    let mut acc = [0f32; 8];
    let mut q = [0u8; QK_K];
    for (bx, by) in x.iter().zip(y) {
        let d = by.d * bx.d.to_f32_const();
        q3k_codes(bx, &mut q);
        let lanes = scaled_lanes::<16>(&q.map(|v| v as i8 - 4), &by.qs, &q3k_scales(bx));
        fma_lanes(&mut acc, d, lanes);
    }
    hsum8(&acc)
}

/// IQ4_XS weights · Q8_K activations, over the common number of super-blocks.
pub fn dot_iq4_xs_q8_k(f: CpuFeatures, x: &[BlockIQ4_XS], y: &[BlockQ8_K]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_iq4_xs::<false>(x, y) };
    }
    let _ = f;
    let mut acc = [0f32; 8];
    let mut v = [0i8; QK_K];
    for (bx, by) in x.iter().zip(y) {
        let d = bx.d.to_f32_const() * by.d;
        iq4xs_values(bx, &mut v);
        fma_lanes(
            &mut acc,
            d,
            scaled_lanes::<32>(&v, &by.qs, &iq4xs_scales(bx)),
        );
    }
    hsum8(&acc)
}

/// The lanes of one codebook block (IQ4_NL, MXFP4): lane `k` = `sum_{b in 4k..4k+4} v[b] * y[b]`.
#[inline(always)]
fn nibble_lanes<B: NibbleBlock>(x: &B, y: &BlockQ8_0) -> [i32; 8] {
    let mut v = [0i8; 32];
    nibble_values(&B::CODEBOOK, x.qs(), &mut v);
    std::array::from_fn(|k| {
        (4 * k..4 * k + 4)
            .map(|b| i32::from(v[b]) * i32::from(y.qs[b]))
            .sum()
    })
}

/// IQ4_NL weights · Q8_0 activations, over the common number of blocks (`ggml_vec_dot`'s
/// arithmetic: one weight row by one activation row).
pub fn dot_iq4_nl_q8_0(f: CpuFeatures, x: &[BlockIQ4_NL], y: &[BlockQ8_0]) -> f32 {
    dot_nibble_q8_0(f, x, y)
}

/// MXFP4 weights · Q8_0 activations, over the common number of blocks (`ggml_vec_dot`'s
/// arithmetic, that of IQ4_NL with the block scale `fp16(y.d) * e8m0_half(x.e)`).
pub fn dot_mxfp4_q8_0(f: CpuFeatures, x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    dot_nibble_q8_0(f, x, y)
}

/// [`dot_iq4_nl_q8_0`] and [`dot_mxfp4_q8_0`]: the blocks by pairs, then an odd last block.
fn dot_nibble_q8_0<B: NibbleBlock>(f: CpuFeatures, x: &[B], y: &[BlockQ8_0]) -> f32 {
    let nb = x.len().min(y.len());
    let (x, y) = (&x[..nb], &y[..nb]);
    let pairs = nb / 2;
    #[cfg(target_arch = "x86_64")]
    let head = if f.has_avx512_vnni() {
        // SAFETY: `f` says the CPU has AVX-512 F/DQ/BW/VL and VNNI, AVX2, FMA and F16C.
        unsafe { avx512::dot_nibble_pairs(&x[..2 * pairs], &y[..2 * pairs]) }
    } else if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        unsafe { avx2::dot_nibble_pairs(&x[..2 * pairs], &y[..2 * pairs]) }
    } else {
        nibble_pairs(&x[..2 * pairs], &y[..2 * pairs])
    };
    #[cfg(not(target_arch = "x86_64"))]
    let head = {
        let _ = f;
        nibble_pairs(&x[..2 * pairs], &y[..2 * pairs])
    };
    match (x.last(), y.last()) {
        (Some(bx), Some(by)) if nb % 2 == 1 => nibble_tail(head, bx, by),
        _ => head,
    }
}

/// [`dot_nibble_q8_0`]'s last block of an odd count, added to the paired blocks' `head` as
/// ggml's scalar leftover loop adds it: `sumf += d * (sumi1 + sumi2)`, which GCC contracts
/// into one FMA (pinned by the `iq4_nl_k544` and `mxfp4_k544` fixtures of
/// `tests/ggml_matmul.rs`, 17 blocks).
fn nibble_tail<B: NibbleBlock>(head: f32, bx: &B, by: &BlockQ8_0) -> f32 {
    let d = fp16::f16_to_f32(by.d) * bx.scale();
    let sumi: i32 = nibble_lanes(bx, by).iter().sum();
    d.mul_add(sumi as f32, head)
}

/// The matrix-vector kernel of Q2_K, Q3_K or IQ4_XS weights (`None` for other types), where
/// the CPU has AVX2: each row's product is [`dot_q2_k_q8_k`]'s (etc.) bit for bit.
#[cfg(target_arch = "x86_64")]
pub(crate) fn kquant_matvec(f: CpuFeatures, dtype: DType) -> Option<run::MatvecKernel> {
    /// # Safety
    /// As [`run::MatvecKernel`], on a CPU with AVX2, FMA and F16C.
    unsafe fn q2_k(r: run::RowRun, out: &mut [f32]) {
        // SAFETY: forwarded; the CPU has what the dot needs.
        unsafe { run::each_row(r, out, |x, y| avx2::dot_q2_k::<true>(x, y)) }
    }
    /// # Safety
    /// As `q2_k`.
    unsafe fn q3_k(r: run::RowRun, out: &mut [f32]) {
        // SAFETY: forwarded; the CPU has what the dot needs.
        unsafe { run::each_row(r, out, |x, y| avx2::dot_q3_k::<true>(x, y)) }
    }
    /// # Safety
    /// As `q2_k`.
    unsafe fn iq4_xs(r: run::RowRun, out: &mut [f32]) {
        // SAFETY: forwarded; the CPU has what the dot needs.
        unsafe { run::each_row(r, out, |x, y| avx2::dot_iq4_xs::<true>(x, y)) }
    }
    match dtype {
        _ if !f.has_avx2() => None,
        DType::Q2_K => Some(q2_k),
        DType::Q3_K => Some(q3_k),
        DType::IQ4_XS => Some(iq4_xs),
        _ => None,
    }
}

/// The matrix-vector kernel of IQ4_NL or MXFP4 weights (`None` for other types), where the
/// CPU has AVX2 (under either build's arithmetic: ggml's AVX-512 build runs the AVX2
/// `vec_dot` for both, which AVX-512 VNNI computes two blocks at a time).
#[cfg(target_arch = "x86_64")]
pub(crate) fn nibble_matvec(f: CpuFeatures, dtype: DType) -> Option<run::MatvecKernel> {
    let vnni = f.has_avx512_vnni();
    match (dtype, vnni) {
        _ if !f.has_avx2() => None,
        (DType::IQ4_NL, false) => Some(matvec_nibble::<BlockIQ4_NL, false>),
        (DType::IQ4_NL, true) => Some(matvec_nibble::<BlockIQ4_NL, true>),
        (DType::MXFP4, false) => Some(matvec_nibble::<BlockMXFP4, false>),
        (DType::MXFP4, true) => Some(matvec_nibble::<BlockMXFP4, true>),
        _ => None,
    }
}

/// `out[r]` = [`dot_nibble_q8_0`] of weight row `r` of `run` and its activation row, bit for
/// bit, for every row of the run ([`crate::kernels::dots::run::MatvecKernel`]); `VNNI`: with
/// AVX-512 VNNI.
///
/// # Safety
/// As [`crate::kernels::dots::run::MatvecKernel`] for rows of `B` and Q8_0 activations, on a
/// CPU with AVX2, FMA and F16C (and AVX-512 F/DQ/BW/VL and VNNI where `VNNI`).
#[cfg(target_arch = "x86_64")]
unsafe fn matvec_nibble<B: NibbleBlock, const VNNI: bool>(run: run::RowRun, out: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match VNNI {
            true => avx512::matvec_nibble_pairs::<B>(run, out),
            false => avx2::matvec_nibble_pairs::<B>(run, out),
        }
    };
    if run.nb % 2 == 1 {
        let last = run.nb - 1;
        let block = std::mem::size_of::<B>();
        // SAFETY: block `last` of the activation row and of each weight row is readable (the
        // caller's promise); the blocks are plain bytes, read unaligned.
        let by = unsafe { run.y.cast::<BlockQ8_0>().add(last).read_unaligned() };
        for (r, o) in out.iter_mut().enumerate() {
            let at = run.x0.wrapping_add(r * run.row_stride + last * block);
            // SAFETY: as above.
            let bx = unsafe { at.cast::<B>().read_unaligned() };
            *o = nibble_tail(*o, &bx, &by);
        }
    }
}

/// Activation rows prepared once for many IQ4_NL or MXFP4 weight rows (an expert's rows
/// against the prompt rows routed to it): every product the bits of [`dot_nibble_q8_0`], each
/// weight block decoded once for all the rows (AVX-512 VNNI) or for four at a time (AVX2).
#[cfg(target_arch = "x86_64")]
pub(crate) struct NibbleTile {
    /// The activations interleaved for AVX-512 VNNI; `None`: AVX2 reads them where they are.
    cols: Option<avx512::NibbleCols>,
    dtype: DType,
    nb: usize,
    ys: Vec<*const u8>,
}

#[cfg(target_arch = "x86_64")]
impl NibbleTile {
    /// The Q8_0 rows at `ys` (`nb` blocks each) for weights of `dtype`; `None` where the CPU
    /// lacks AVX2 or `dtype` is neither IQ4_NL nor MXFP4.
    ///
    /// # Safety
    /// Each of `ys` holds `nb` Q8_0 blocks, unchanged while the tile lives.
    pub(crate) unsafe fn new(
        f: CpuFeatures,
        dtype: DType,
        nb: usize,
        ys: &[*const u8],
    ) -> Option<NibbleTile> {
        if !f.has_avx2() || !matches!(dtype, DType::IQ4_NL | DType::MXFP4) {
            return None;
        }
        Some(NibbleTile {
            // SAFETY: AVX-512 (VNNI implies the rest, see `CpuFeatures`); the rows as promised.
            cols: f
                .has_avx512_vnni()
                .then(|| unsafe { avx512::NibbleCols::new(nb, ys) }),
            dtype,
            nb,
            ys: ys.to_vec(),
        })
    }

    /// `out[c]` = the dot of the weight row at `x` with prepared row `c`.
    ///
    /// # Safety
    /// `x` holds `nb` blocks of the tile's type; `out` holds one value per prepared row.
    pub(crate) unsafe fn row(&self, x: *const u8, out: &mut [f32]) {
        // SAFETY: the features checked in `new`; `x` as the caller promises.
        unsafe {
            match self.dtype {
                DType::IQ4_NL => self.row_of::<BlockIQ4_NL>(x, out),
                _ => self.row_of::<BlockMXFP4>(x, out),
            }
        }
    }

    /// [`Self::row`] for blocks of `B`: the pairs, then an odd last block as `vec_dot` adds it.
    ///
    /// # Safety
    /// As [`Self::row`].
    unsafe fn row_of<B: NibbleBlock>(&self, x: *const u8, out: &mut [f32]) {
        // SAFETY: as the caller promises; AVX2 without the AVX-512 columns (`new` checked).
        unsafe {
            match &self.cols {
                Some(cols) => cols.row::<B>(x, out),
                None => avx2::nibble_cols_pairs::<B>(self.nb, x, &self.ys, out),
            }
        }
        if self.nb % 2 == 1 {
            let last = self.nb - 1;
            // SAFETY: block `last` of the weight row and of every prepared row is readable;
            // the blocks are plain bytes, read unaligned.
            let bx = unsafe { x.cast::<B>().add(last).read_unaligned() };
            for (o, &y) in out.iter_mut().zip(&self.ys) {
                // SAFETY: as above.
                let by = unsafe { y.cast::<BlockQ8_0>().add(last).read_unaligned() };
                *o = nibble_tail(*o, &bx, &by);
            }
        }
    }
}

/// The paired part of [`dot_nibble_q8_0`] (an even number of blocks), portable form.
fn nibble_pairs<B: NibbleBlock>(x: &[B], y: &[BlockQ8_0]) -> f32 {
    let mut acc = [[0f32; 8]; 2];
    for (i, (bx, by)) in x.iter().zip(y).enumerate() {
        let d = fp16::f16_to_f32(by.d) * bx.scale();
        fma_lanes(&mut acc[i % 2], d, nibble_lanes(bx, by));
    }
    hsum8(&std::array::from_fn(|k| acc[0][k] + acc[1][k]))
}

/// IQ4_NL weights · Q8_0 activations with the arithmetic of llamafile's
/// `tinyBLAS_Q0_AVX<block_iq4_nl, block_q8_0>` (ggml's path from 2 activation rows): one 8-lane
/// accumulator over all blocks, FMAs by `x.d * y.d`, `hsum` at the end. Portable reference of
/// the tiled kernel ([`super::tiled`]), used by the tests.
#[cfg(test)]
pub(crate) fn dot_iq4_nl_tinyblas(x: &[BlockIQ4_NL], y: &[BlockQ8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let d = bx.d.to_f32_const() * by.d.to_f32_const();
        fma_lanes(&mut acc, d, nibble_lanes(bx, by));
    }
    hsum8(&acc)
}

/// The body of a matrix-vector kernel over `$run`'s rows into `$out`: the run cut into two
/// stretches of consecutive rows, one row of each per `$rows::<$B, 2, true>` pass (sharing the
/// activation loads; each row a prefetched stream, as the legacy types' matrix-vector kernels
/// read theirs: see `crate::kernels::tiles::legacy::matvec_kernel`), then an odd last row
/// through `$rows::<$B, 1, true>`. A macro, so that each kernel's loop is compiled with that
/// kernel's target features. Expands to unsafe calls: the caller promises `$rows`' conditions
/// for every row of the run.
#[cfg(target_arch = "x86_64")]
macro_rules! row_streams {
    ($rows:ident, $B:ty, $run:expr, $out:expr) => {{
        let run: $crate::kernels::dots::run::RowRun = $run;
        let out: &mut [f32] = $out;
        let half = out.len() / 2;
        let row = |r: usize| run.x0.wrapping_add(r * run.row_stride);
        for r in 0..half {
            let mut pair = [0f32; 2];
            $rows::<$B, 2, true>(run.nb, [row(r), row(r + half)], run.y, &mut pair);
            [out[r], out[r + half]] = pair;
        }
        if let Some(last) = (out.len() % 2 == 1).then(|| out.len() - 1) {
            $rows::<$B, 1, true>(run.nb, [row(last)], run.y, &mut out[last..]);
        }
    }};
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests;
