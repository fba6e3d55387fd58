//! The low-bit k-quant super-block formats: Q2_K and Q3_K.
//!
//! Both hold 16 sub-blocks of 16 values under one f16 super-scale, with the quants' low 2 bits
//! packed four to a byte the same way (for each 128 values, byte `l` of a 32-byte group holds
//! values `l`, `l + 32`, `l + 64`, `l + 96` in bit pairs 0, 2, 4, 6). Q2_K adds a minimum per
//! sub-block (4-bit scale and 4-bit min); Q3_K is symmetric with 6-bit scales and keeps the
//! third bit in a separate mask.
//!
//! Quantizers are what ggml's `quantize_q2_K` / `quantize_q3_K` do without an importance matrix,
//! namely `quantize_row_q2_K_ref` / `quantize_row_q3_K_ref`. Each super-block is quantized on
//! its own, so the result does not depend on how blocks are grouped into rows.

use super::kquants::{nearest_int, Qkx2, GROUP_MAX_EPS, QK_K};
use super::legacy::signed_absmax;
use super::QuantBlock;
use crate::dtype::DType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Q2_K: 16 sub-blocks of 16, `x = d * sc * q - dmin * m`, q in 0..4.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2_K {
    /// Per sub-block: 4-bit scale (low nibble) and 4-bit min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants, packed as described in the module docs.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the quantized scales.
    pub d: f16,
    /// Super-block scale for the quantized mins.
    pub dmin: f16,
}

/// Q3_K: 16 sub-blocks of 16, `x = d * (sc - 32) * (q - 4)`, q in 0..8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3_K {
    /// Third bit of each quant: bit `j / 32` of byte `j % 32` belongs to value `j`.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants, packed as described in the module docs.
    pub qs: [u8; QK_K / 4],
    /// 6-bit scales, packed; decode with [`q3_k_scale`].
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockQ2_K>() == DType::Q2_K.block_bytes());
    assert!(size_of::<BlockQ3_K>() == DType::Q3_K.block_bytes());
    assert!(QK_K == DType::Q2_K.block_size() && QK_K == DType::Q3_K.block_size());
};

/// The 6-bit scale of Q3_K sub-block `j` (0..16), still offset by 32: bytes 0..8 hold the low
/// nibbles (sub-blocks 0..8 low, 8..16 high), bytes 8..12 the high bit pairs, sub-block `j`'s at
/// bits `2 * (j / 4)` of byte `8 + j % 4`. `j` is a sub-block index chosen by the caller and
/// must be below 16.
#[inline]
pub fn q3_k_scale(j: usize, scales: &[u8; 12]) -> u8 {
    let low = if j < 8 {
        scales[j] & 0x0F
    } else {
        scales[j - 8] >> 4
    };
    low | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)
}

fn pack_q3_k_scales(ls: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in ls.iter().enumerate() {
        if j < 8 {
            s[j] = l & 0x0F;
        } else {
            s[j - 8] |= (l & 0x0F) << 4;
        }
        s[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
    }
    s
}

/// Packs 256 two-bit quants (each < 4) the way Q2_K and Q3_K store them.
fn pack_2bit(l: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for h in 0..2 {
        for i in 0..32 {
            let b = 128 * h + i;
            qs[32 * h + i] = l[b] | (l[b + 32] << 2) | (l[b + 64] << 4) | (l[b + 96] << 6);
        }
    }
    qs
}

/// The 2-bit quant of value `e` (0..256) in a packed array.
#[inline]
fn unpack_2bit(qs: &[u8; QK_K / 4], e: usize) -> u8 {
    let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
    (qs[32 * h + l] >> (2 * j)) & 3
}

fn sub16(x: &[f32; QK_K], j: usize) -> [f32; 16] {
    std::array::from_fn(|i| x[16 * j + i])
}

/// The first pass of Q2_K: per sub-block scale/min fits (ggml's `make_qkx2_quants` with
/// absolute-value weights and absolute-error search), and their maxima.
fn q2_k_sub_fits(x: &[f32; QK_K], l: &mut [u8; QK_K]) -> ([f32; 16], [f32; 16], f32, f32) {
    let search = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = sub16(x, j);
        let weights = xs.map(f32::abs);
        let mut lj = [0u8; 16];
        (scales[j], mins[j]) = search.search(&xs, &weights, &mut lj);
        l[16 * j..16 * j + 16].copy_from_slice(&lj);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    (scales, mins, max_scale, max_min)
}

impl QuantBlock for BlockQ2_K {
    const DTYPE: DType = DType::Q2_K;
    type Values = [f32; QK_K];

    fn quantize(x: &[f32; QK_K]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let mut l = [0u8; QK_K];
        let (scales, mins, max_scale, max_min) = q2_k_sub_fits(x, &mut l);
        let mut sc = [0u8; 16];
        let mut d = f16::ZERO;
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            // ggml stores the int into a uint8_t: `as u8` truncates the same way.
            for (o, &s) in sc.iter_mut().zip(&scales) {
                *o = nearest_int(iscale * s) as u8;
            }
            d = f16::from_f32(max_scale / Q4SCALE);
        }
        let mut dmin = f16::ZERO;
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (o, &m) in sc.iter_mut().zip(&mins) {
                *o |= (nearest_int(iscale * m) << 4) as u8;
            }
            dmin = f16::from_f32(max_min / Q4SCALE);
        }
        // Requantize against the rounded scales; sub-blocks whose scale rounded to zero keep
        // the quants of their fit, as in ggml.
        for ((&s, xs), ls) in sc
            .iter()
            .zip(x.chunks_exact(16))
            .zip(l.chunks_exact_mut(16))
        {
            let dj = d.to_f32() * f32::from(s & 0x0F);
            if dj == 0.0 {
                continue;
            }
            let dm = dmin.to_f32() * f32::from(s >> 4);
            for (o, &v) in ls.iter_mut().zip(xs) {
                *o = nearest_int((v + dm) / dj).clamp(0, 3) as u8;
            }
        }
        BlockQ2_K {
            scales: sc,
            qs: pack_2bit(&l),
            d,
            dmin,
        }
    }

    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        for (e, out) in y.iter_mut().enumerate() {
            let sc = self.scales[e / 16];
            let dl = d * f32::from(sc & 0x0F);
            let ml = min * f32::from(sc >> 4);
            *out = dl * f32::from(unpack_2bit(&self.qs, e)) - ml;
        }
    }
}

/// ggml's `make_q3_quants` with `do_rmse`: symmetric quants in `-nmax..nmax` (returned offset
/// by `nmax`) for one sub-block of 16, weights `x^2`, refined by up to five passes of
/// coordinate descent on the least-squares scale. Returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32; 16], l_out: &mut [i8; 16]) -> f32 {
    let max = signed_absmax(x);
    let amax = max.abs();
    if amax < GROUP_MAX_EPS {
        *l_out = [0; 16];
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (o, &v) in l.iter_mut().zip(x) {
        *o = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let (w, lf) = (v * v, *o as f32);
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *li as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li {
                    let nf = new_l as f32;
                    slx += w * v * nf;
                    sl2 += w * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        (*li, sumlx, suml2) = (new_l, slx, sl2);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (o, &q) in l_out.iter_mut().zip(&l) {
        *o = (q + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The first pass of Q3_K: per sub-block scales (quants in `l`) and the one of largest
/// magnitude (the first such on ties).
fn q3_k_sub_fits(x: &[f32; QK_K], l: &mut [i8; QK_K]) -> ([f32; 16], f32) {
    let mut scales = [0.0f32; 16];
    for j in 0..16 {
        let mut lj = [0i8; 16];
        scales[j] = make_q3_quants(4, &sub16(x, j), &mut lj);
        l[16 * j..16 * j + 16].copy_from_slice(&lj);
    }
    (scales, signed_absmax(&scales))
}

/// Splits Q3_K quants (0..8) into the high-bit mask and the low 2 bits.
fn split_q3_k(l: &[i8; QK_K]) -> ([u8; QK_K / 8], [u8; QK_K]) {
    let mut hmask = [0u8; QK_K / 8];
    let mut low = [0u8; QK_K];
    for (j, (&q, o)) in l.iter().zip(low.iter_mut()).enumerate() {
        let q = q as u8;
        if q > 3 {
            hmask[j % 32] |= 1 << (j / 32);
        }
        *o = q & 3;
    }
    (hmask, low)
}

impl QuantBlock for BlockQ3_K {
    const DTYPE: DType = DType::Q3_K;
    type Values = [f32; QK_K];

    fn quantize(x: &[f32; QK_K]) -> Self {
        let mut l = [0i8; QK_K];
        let (scales, max_scale) = q3_k_sub_fits(x, &mut l);
        let mut packed = [0u8; 12];
        let mut d = f16::ZERO;
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            // ggml narrows nearest_int's result to int8_t before clamping: `as i8` does too.
            let ls: [u8; 16] = std::array::from_fn(|j| {
                ((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32) as u8
            });
            packed = pack_q3_k_scales(&ls);
            d = f16::from_f32(1.0 / iscale);
        }
        for j in 0..16 {
            let sc = i32::from(q3_k_scale(j, &packed)) - 32;
            let dj = d.to_f32() * sc as f32;
            if dj == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / dj).clamp(-4, 3) + 4) as i8;
            }
        }
        let (hmask, low) = split_q3_k(&l);
        BlockQ3_K {
            hmask,
            qs: pack_2bit(&low),
            scales: packed,
            d,
        }
    }

    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        for (e, out) in y.iter_mut().enumerate() {
            let dl = d * (i32::from(q3_k_scale(e / 16, &self.scales)) - 32) as f32;
            let high = self.hmask[e % 32] & (1 << (e / 32)) != 0;
            let q = i32::from(unpack_2bit(&self.qs, e)) - if high { 0 } else { 4 };
            *out = dl * q as f32;
        }
    }
}
