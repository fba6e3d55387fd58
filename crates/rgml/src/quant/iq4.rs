//! The 4-bit non-linear formats IQ4_NL and IQ4_XS.
//!
//! Both store 4-bit indices into the 16-entry codebook [`KVALUES_IQ4NL`] (denser near zero, like
//! the values of a bell-shaped weight distribution), two to a byte: for each 32 values, byte `j`
//! of 16 holds value `j` (low nibble) and value `j + 16` (high nibble). IQ4_NL has one f16 scale
//! per 32 values; IQ4_XS has 8 sub-blocks of 32 under one f16 scale with 6-bit sub-block scales.
//!
//! Quantizers are what ggml's `quantize_iq4_nl` / `quantize_iq4_xs` (the functions llama-quantize
//! calls) do without an importance matrix: `quantize_row_iq4_nl_impl` with `x^2` weights and a
//! 15-step scale search (`ntry = 7`). Note that this differs from ggml's
//! `quantize_row_iq4_nl_ref` (`ntry = -1`, no search), which nothing in llama.cpp uses for files.
//! Each block (IQ4_NL) or super-block (IQ4_XS) is quantized on its own, so the result does not
//! depend on how blocks are grouped into rows.

use super::kquants::{nearest_int, GROUP_MAX_EPS, QK_K};
use super::legacy::signed_absmax;
use super::QuantBlock;
use crate::dtype::DType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Elements per IQ4_NL block.
pub const QK4_NL: usize = 32;

/// The IQ4 codebook (ggml's `kvalues_iq4nl`): quant `q` decodes to `d * KVALUES_IQ4NL[q]`.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// How far ggml's IQ4 quantizers search around the initial scale (`ntry` in
/// `quantize_row_iq4_nl_impl`, as `quantize_iq4_nl` / `quantize_iq4_xs` pass it).
const NTRY: i32 = 7;

/// IQ4_NL: `x = d * KVALUES_IQ4NL[q]` for 32 values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4_NL {
    /// Scale.
    pub d: f16,
    /// Codebook indices, packed as described in the module docs.
    pub qs: [u8; QK4_NL / 2],
}

/// IQ4_XS: 8 sub-blocks of 32, `x = d * (ls - 32) * KVALUES_IQ4NL[q]` with 6-bit `ls`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4_XS {
    /// Super-block scale.
    pub d: f16,
    /// High 2 bits of the sub-block scales: bits `2 * ib` hold sub-block `ib`'s.
    pub scales_h: u16,
    /// Low 4 bits of the sub-block scales: byte `ib / 2`, low nibble for even `ib`.
    pub scales_l: [u8; QK_K / 64],
    /// Codebook indices, packed as described in the module docs.
    pub qs: [u8; QK_K / 2],
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockIQ4_NL>() == DType::IQ4_NL.block_bytes());
    assert!(size_of::<BlockIQ4_XS>() == DType::IQ4_XS.block_bytes());
    assert!(QK4_NL == DType::IQ4_NL.block_size() && QK_K == DType::IQ4_XS.block_size());
};

/// ggml's `best_index_int8` on [`KVALUES_IQ4NL`]: the index of the codebook value nearest `x`
/// by bisection, the upper one on ties.
#[inline]
pub fn best_index_iq4nl(x: f32) -> u8 {
    let v = |i: usize| f32::from(KVALUES_IQ4NL[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// `sum w q x` and `sum w q^2` over a sub-block quantized with inverse scale `id`; also writes
/// the indices to `l` when given.
fn iq4_sums(id: f32, x: &[f32; 32], mut l: Option<&mut [u8; 32]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (j, &v) in x.iter().enumerate() {
        let idx = best_index_iq4nl(id * v);
        if let Some(l) = l.as_deref_mut() {
            l[j] = idx;
        }
        let q = f32::from(KVALUES_IQ4NL[usize::from(idx)]);
        let w = v * v;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The scale of one 32-value sub-block: ggml's `quantize_row_iq4_nl_impl` inner search without
/// importance weights (weights `x^2`), trying `2 * NTRY + 1` inverse scales around
/// `KVALUES_IQ4NL[0] / max` and keeping the best least-squares fit. 0 for an all-zero block.
fn iq4_sub_scale(x: &[f32; 32]) -> f32 {
    let max = signed_absmax(x);
    let amax = max.abs();
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = f32::from(KVALUES_IQ4NL[0]);
    let d = -max / v0;
    let (sumqx, sumq2) = iq4_sums(1.0 / d, x, None);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + i32::from(KVALUES_IQ4NL[0])) as f32 / max;
        let (sumqx, sumq2) = iq4_sums(id, x, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Codebook indices of 32 values for inverse scale `id`, packed two to a byte.
fn pack_iq4(id: f32, x: &[f32; 32]) -> [u8; 16] {
    let l: [u8; 32] = std::array::from_fn(|j| best_index_iq4nl(id * x[j]));
    std::array::from_fn(|j| l[j] | (l[j + 16] << 4))
}

fn sub32(x: &[f32; QK_K], ib: usize) -> [f32; 32] {
    std::array::from_fn(|j| x[32 * ib + j])
}

fn decode_iq4(dl: f32, qs: &[u8], y: &mut [f32]) {
    for (j, &q) in qs.iter().enumerate().take(16) {
        y[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]);
        y[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

impl QuantBlock for BlockIQ4_NL {
    const DTYPE: DType = DType::IQ4_NL;
    type Values = [f32; QK4_NL];

    fn quantize(x: &[f32; QK4_NL]) -> Self {
        let scale = iq4_sub_scale(x);
        // The indices are chosen against the unrounded scale, as in ggml.
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        BlockIQ4_NL {
            d: f16::from_f32(scale),
            qs: pack_iq4(id, x),
        }
    }

    fn dequantize(&self, y: &mut [f32; QK4_NL]) {
        decode_iq4(self.d.to_f32(), &self.qs, y);
    }
}

impl QuantBlock for BlockIQ4_XS {
    const DTYPE: DType = DType::IQ4_XS;
    type Values = [f32; QK_K];

    fn quantize(x: &[f32; QK_K]) -> Self {
        let scales: [f32; 8] = std::array::from_fn(|ib| iq4_sub_scale(&sub32(x, ib)));
        let max_scale = signed_absmax(&scales);
        // The sub-block scales are quantized against this unrounded f32 `d`; only the stored
        // copy is rounded to f16 (an all-zero block stores -0.0, as ggml does).
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut block = BlockIQ4_XS {
            d: f16::from_f32(d),
            scales_h: 0,
            scales_l: [0; QK_K / 64],
            qs: [0; QK_K / 2],
        };
        for (ib, &s) in scales.iter().enumerate() {
            let l = nearest_int(id * s).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            block.qs[16 * ib..16 * ib + 16].copy_from_slice(&pack_iq4(idl, &sub32(x, ib)));
            let l = (l + 32) as u8;
            block.scales_l[ib / 2] |= (l & 0x0F) << (4 * (ib % 2));
            block.scales_h |= u16::from(l >> 4) << (2 * ib);
        }
        block
    }

    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        for (ib, (qs, ys)) in self
            .qs
            .chunks_exact(16)
            .zip(y.chunks_exact_mut(32))
            .enumerate()
        {
            let ls = ((self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F)
                | ((((self.scales_h >> (2 * ib)) & 3) as u8) << 4);
            decode_iq4(d * (i32::from(ls) - 32) as f32, qs, ys);
        }
    }
}
