//! The 256-element "k-quant" super-block formats: Q4_K, Q5_K, Q6_K and Q8_K.
//!
//! Q4_K/Q5_K hold 8 sub-blocks of 32 with 6-bit scales and mins (packed into 12 bytes, see
//! [`scale_min_k4`]) under f16 super-scales; Q6_K holds 16 sub-blocks of 16 with i8 scales;
//! Q8_K is the f32-scaled activation format with per-16 sums for the k-quant dot products.
//! Quantizers are ggml's `quantize_row_q*_K_ref`, which is what `quantize_q4_K` ...
//! `quantize_q6_K` (the functions llama-quantize calls) run when given no importance matrix,
//! including its `nearest_int` rounding (round half to even) where ggml uses it. This module
//! also owns the helpers the other k-quants share ([`nearest_int`], the `make_qkx2_quants`
//! search).

use super::legacy::signed_absmax;
use super::QuantBlock;
use crate::dtype::DType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Elements per k-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K / Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Below this magnitude a group counts as all-zero (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Q4_K: 8 sub-blocks of 32, `x = d * sc * q - dmin * m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_K {
    /// Super-block scale for the quantized scales.
    pub d: f16,
    /// Super-block scale for the quantized mins.
    pub dmin: f16,
    /// 6-bit scales and mins, packed; decode with [`scale_min_k4`].
    pub scales: [u8; K_SCALE_SIZE],
    /// Nibbles: for each 64 elements, 32 bytes holding elements 0..32 low and 32..64 high.
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: as [`BlockQ4_K`] with a fifth bit per quant, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_K {
    /// Super-block scale for the quantized scales.
    pub d: f16,
    /// Super-block scale for the quantized mins.
    pub dmin: f16,
    /// 6-bit scales and mins, packed; decode with [`scale_min_k4`].
    pub scales: [u8; K_SCALE_SIZE],
    /// High bits: bit `2c` / `2c + 1` of byte `l` belong to element `64c + l` / `64c + 32 + l`.
    pub qh: [u8; QK_K / 8],
    /// Low nibbles, laid out as in [`BlockQ4_K`].
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16, `x = d * sc * (q - 32)`, q in 0..64.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6_K {
    /// Low 4 bits: per 128 elements, 64 bytes; byte l holds elements l (low) and l + 64 (high),
    /// byte l + 32 holds elements l + 32 and l + 96.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits: per 128 elements, 32 bytes; byte l holds elements l, l + 32, l + 64, l + 96
    /// in bit pairs 0, 2, 4, 6.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

/// Q8_K: `x = d * q` with an f32 scale, plus the sum of each 16 quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_K {
    /// Scale.
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sum of `qs[16 * j .. 16 * j + 16]`.
    pub bsums: [i16; QK_K / 16],
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockQ4_K>() == DType::Q4_K.block_bytes());
    assert!(size_of::<BlockQ5_K>() == DType::Q5_K.block_bytes());
    assert!(size_of::<BlockQ6_K>() == DType::Q6_K.block_bytes());
    assert!(size_of::<BlockQ8_K>() == DType::Q8_K.block_bytes());
    assert!(QK_K == DType::Q4_K.block_size() && QK_K == DType::Q8_K.block_size());
};

/// ggml's `nearest_int`: rounds half to even by adding 1.5 * 2^23 and reading the mantissa.
/// Exact for `|x| <= 4194303`; other inputs give a meaningless but harmless value, as in ggml.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Scale and min of sub-block `j` (0..8) from the 12-byte packed form used by Q4_K and Q5_K:
/// bytes 0..4 / 4..8 hold the low 6 bits of scales / mins 0..4, bytes 8..12 the low 4 bits of
/// scales / mins 4..8, and the top 2 bits of bytes 0..8 the remaining high bits.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(super) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut s = [0u8; K_SCALE_SIZE];
    s[..4].copy_from_slice(&ls[..4]);
    s[4..8].copy_from_slice(&lm[..4]);
    for j in 4..8 {
        s[j + 4] = (ls[j] & 0x0F) | ((lm[j] & 0x0F) << 4);
        s[j - 4] |= (ls[j] >> 4) << 6;
        s[j] |= (lm[j] >> 4) << 6;
    }
    s
}

/// The search parameters of ggml's `make_qkx2_quants`: quants in `0..=nmax`, and `nstep + 1`
/// candidate inverse scales `(nmax + rmin + rdelta * is) / (max - min)`; `use_mad` measures the
/// error as weighted absolute rather than squared differences.
pub(super) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

impl Qkx2 {
    /// The weighted error term of one element, as ggml accumulates it.
    fn err(&self, w: f32, diff: f32) -> f32 {
        w * if self.use_mad {
            diff.abs()
        } else {
            diff * diff
        }
    }

    /// Quantize `l.len()` values, returning the quants in `l` in `0..=nmax`.
    fn quants(&self, iscale: f32, min: f32, x: &[f32], l: &mut [u8]) {
        for (o, &v) in l.iter_mut().zip(x) {
            *o = nearest_int(iscale * (v - min)).clamp(0, self.nmax) as u8;
        }
    }

    /// ggml's `make_qkx2_quants` for one sub-block (16 or 32 values): fits `x ~ scale * L - min`
    /// by trying each candidate scale and keeping the least-squares fit of the best
    /// quantization. Returns `(scale, min)` with `min >= 0`, and the quants in `l_out`.
    pub fn search<const N: usize>(
        &self,
        x: &[f32; N],
        weights: &[f32; N],
        l_out: &mut [u8; N],
    ) -> (f32, f32) {
        let (mut min, mut max) = (x[0], x[0]);
        let mut sum_w = weights[0];
        let mut sum_x = sum_w * x[0];
        for i in 1..N {
            if x[i] < min {
                min = x[i];
            }
            if x[i] > max {
                max = x[i];
            }
            sum_w += weights[i];
            sum_x += weights[i] * x[i];
        }
        if min > 0.0 {
            min = 0.0;
        }
        if max == min {
            *l_out = [0; N];
            return (0.0, -min);
        }
        let nmax_f = self.nmax as f32;
        let iscale = nmax_f / (max - min);
        let mut scale = 1.0 / iscale;
        self.quants(iscale, min, x, l_out);
        let mut best_error = 0.0f32;
        for i in 0..N {
            best_error += self.err(weights[i], scale * f32::from(l_out[i]) + min - x[i]);
        }
        if self.nstep < 1 {
            return (scale, -min);
        }
        let mut laux = [0u8; N];
        for is in 0..=self.nstep {
            let iscale = (self.rmin + self.rdelta * is as f32 + nmax_f) / (max - min);
            self.quants(iscale, min, x, &mut laux);
            let Some((this_scale, this_min)) = fit(&laux, x, weights, sum_w, sum_x) else {
                continue;
            };
            let mut cur_error = 0.0f32;
            for i in 0..N {
                cur_error += self.err(
                    weights[i],
                    this_scale * f32::from(laux[i]) + this_min - x[i],
                );
            }
            if cur_error < best_error {
                *l_out = laux;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
        (scale, -min)
    }
}

/// Weighted least-squares `(scale, min)` (min <= 0) for fixed quants `l`, as in
/// `make_qkx2_quants`; `None` when the system is singular.
fn fit(l: &[u8], x: &[f32], weights: &[f32], sum_w: f32, sum_x: f32) -> Option<(f32, f32)> {
    let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
    for ((&q, &v), &w) in l.iter().zip(x).zip(weights) {
        let lf = f32::from(q);
        sum_l += w * lf;
        sum_l2 += w * lf * lf;
        sum_xl += w * lf * v;
    }
    let det = sum_w * sum_l2 - sum_l * sum_l;
    if det <= 0.0 || det.is_nan() {
        return None;
    }
    let this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    let this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if this_min > 0.0 {
        Some((sum_xl / sum_l2, 0.0))
    } else {
        Some((this_scale, this_min))
    }
}

/// ggml's `make_qx_quants` for one sub-block of 16 with `rmse_type == 1` (weights `x^2`) and no
/// importance matrix: symmetric quants `L - nmax` in `-nmax..nmax`, returning the scale.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32; 16], l_out: &mut [u8; 16]) -> f32 {
    let max = signed_absmax(x);
    let amax = max.abs();
    if amax < GROUP_MAX_EPS {
        *l_out = [0; 16];
        return 0.0;
    }
    let nmax_f = nmax as f32;
    // Sums for the quants obtained with inverse scale `iscale`.
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let fill = |iscale: f32, l_out: &mut [u8; 16]| {
        for (o, &v) in l_out.iter_mut().zip(x) {
            *o = (nearest_int(iscale * v).clamp(-nmax, nmax - 1) + nmax) as u8;
        }
    };
    let iscale = -nmax_f / max;
    fill(iscale, l_out);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax_f + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(iscale, l_out);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

fn sub32(x: &[f32; QK_K], j: usize) -> &[f32; 32] {
    let mut it = x.chunks_exact(32).skip(j);
    match it.next().map(<&[f32; 32]>::try_from) {
        Some(Ok(a)) => a,
        // j < 8 always; keep a total function rather than panic.
        _ => &[0.0; 32],
    }
}

/// Shared by Q4_K and Q5_K: per-sub-block scales/mins, their 6-bit packing, and final quants in
/// `0..=nmax` recomputed against the rounded scales.
fn quantize_k_scale_min(
    x: &[f32; QK_K],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> (f16, f16, [u8; K_SCALE_SIZE], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = sub32(x, j);
        let sum_x2: f32 = xs.iter().fold(0.0, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let mut lj = [0u8; 32];
        let search = Qkx2 {
            nmax,
            rmin,
            rdelta: 0.1,
            nstep,
            use_mad: false,
        };
        let (scale, min) = search.search(xs, &weights, &mut lj);
        l[32 * j..32 * j + 32].copy_from_slice(&lj);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml narrows to uint8_t before capping at 63; `as u8` wraps the same way.
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for (o, &v) in l[32 * j..32 * j + 32].iter_mut().zip(sub32(x, j)) {
            *o = nearest_int((v + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

impl QuantBlock for BlockQ4_K {
    const DTYPE: DType = DType::Q4_K;
    type Values = [f32; QK_K];

    fn quantize(x: &[f32; QK_K]) -> Self {
        let (d, dmin, scales, l) = quantize_k_scale_min(x, 15, -1.0, 20);
        let mut qs = [0u8; QK_K / 2];
        for c in 0..4 {
            for i in 0..32 {
                qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
        BlockQ4_K {
            d,
            dmin,
            scales,
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        for c in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            for i in 0..32 {
                let q = self.qs[32 * c + i];
                y[64 * c + i] = d1 * f32::from(q & 0x0F) - m1;
                y[64 * c + 32 + i] = d2 * f32::from(q >> 4) - m2;
            }
        }
    }
}

impl QuantBlock for BlockQ5_K {
    const DTYPE: DType = DType::Q5_K;
    type Values = [f32; QK_K];

    fn quantize(x: &[f32; QK_K]) -> Self {
        let (d, dmin, scales, l) = quantize_k_scale_min(x, 31, -0.5, 15);
        let mut qs = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 8];
        for c in 0..4 {
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for i in 0..32 {
                let (l1, l2) = (l[64 * c + i], l[64 * c + 32 + i]);
                if l1 > 15 {
                    qh[i] |= m1;
                }
                if l2 > 15 {
                    qh[i] |= m2;
                }
                qs[32 * c + i] = (l1 & 0x0F) | ((l2 & 0x0F) << 4);
            }
        }
        BlockQ5_K {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        for c in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for i in 0..32 {
                let q = self.qs[32 * c + i];
                let h = self.qh[i];
                let q1 = (q & 0x0F) + if h & u1 != 0 { 16 } else { 0 };
                let q2 = (q >> 4) + if h & u2 != 0 { 16 } else { 0 };
                y[64 * c + i] = d1 * f32::from(q1) - m1;
                y[64 * c + 32 + i] = d2 * f32::from(q2) - m2;
            }
        }
    }
}

impl QuantBlock for BlockQ6_K {
    const DTYPE: DType = DType::Q6_K;
    type Values = [f32; QK_K];

    fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for (ib, (xs, ls)) in x.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
            let (Ok(xs), Ok(ls)) = (<&[f32; 16]>::try_from(xs), <&mut [u8; 16]>::try_from(ls))
            else {
                continue;
            };
            let scale = make_qx_quants_rmse1(32, xs, ls);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            return BlockQ6_K::zeroed();
        }
        let iscale = -128.0 / max_scale;
        let d = f16::from_f32(1.0 / iscale);
        let sc: [i8; 16] =
            std::array::from_fn(|ib| nearest_int(iscale * scales[ib]).min(127) as i8);
        for (j, (xs, ls)) in x.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
            let dj = d.to_f32() * f32::from(sc[j]);
            if dj == 0.0 {
                continue;
            }
            for (o, &v) in ls.iter_mut().zip(xs) {
                *o = (nearest_int(v / dj).clamp(-32, 31) + 32) as u8;
            }
        }
        let mut ql = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 4];
        for h in 0..2 {
            let (lb, qlb, qhb) = (128 * h, 64 * h, 32 * h);
            for i in 0..32 {
                let q = [l[lb + i], l[lb + i + 32], l[lb + i + 64], l[lb + i + 96]];
                ql[qlb + i] = (q[0] & 0x0F) | ((q[2] & 0x0F) << 4);
                ql[qlb + i + 32] = (q[1] & 0x0F) | ((q[3] & 0x0F) << 4);
                qh[qhb + i] =
                    (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
        BlockQ6_K {
            ql,
            qh,
            scales: sc,
            d,
        }
    }

    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        for h in 0..2 {
            let (yb, qlb, qhb, sb) = (128 * h, 64 * h, 32 * h, 8 * h);
            for i in 0..32 {
                let is = sb + i / 16;
                let (lo, hi, qh) = (self.ql[qlb + i], self.ql[qlb + i + 32], self.qh[qhb + i]);
                let q1 = i32::from((lo & 0x0F) | ((qh & 3) << 4)) - 32;
                let q2 = i32::from((hi & 0x0F) | (((qh >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((lo >> 4) | (((qh >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((hi >> 4) | (((qh >> 6) & 3) << 4)) - 32;
                y[yb + i] = d * f32::from(self.scales[is]) * q1 as f32;
                y[yb + i + 32] = d * f32::from(self.scales[is + 2]) * q2 as f32;
                y[yb + i + 64] = d * f32::from(self.scales[is + 4]) * q3 as f32;
                y[yb + i + 96] = d * f32::from(self.scales[is + 6]) * q4 as f32;
            }
        }
    }
}

impl QuantBlock for BlockQ8_K {
    const DTYPE: DType = DType::Q8_K;
    type Values = [f32; QK_K];

    fn quantize(x: &[f32; QK_K]) -> Self {
        let max = signed_absmax(x);
        if max == 0.0 {
            return BlockQ8_K::zeroed();
        }
        // -127 rather than -128 keeps every quant in -127..=127 (ggml: needed by IQ2_XXS SIMD).
        let iscale = -127.0 / max;
        let qs: [i8; QK_K] = std::array::from_fn(|j| nearest_int(iscale * x[j]).min(127) as i8);
        let bsums: [i16; QK_K / 16] =
            std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| i16::from(q)).sum());
        BlockQ8_K {
            d: 1.0 / iscale,
            qs,
            bsums,
        }
    }

    fn dequantize(&self, y: &mut [f32; QK_K]) {
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = self.d * f32::from(q);
        }
    }
}
