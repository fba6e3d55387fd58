//! Decoders of Q4_K, Q5_K and Q6_K super-blocks: their 256 quants in element order and their
//! packed scales and mins, shared by the K-quant pair dots ([`crate::kernels::dots::kquant`])
//! and the tiled K-quant kernel ([`crate::kernels::tiles::kquant`]).

use rgml::quant::{BlockQ4_K, BlockQ5_K, BlockQ6_K, QK_K};

/// The 8 scales and 8 mins of a Q4_K/Q5_K super-block ([`rgml::quant::scale_min_k4`] for every `j`), with
/// ggml's word-wise unpacking (`utmp` and `kmask1..3` in its x86 dots): a dozen integer
/// operations instead of sixteen byte extractions.
#[inline(always)]
pub(crate) fn scales_mins(scales: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let w = |i: usize| {
        u32::from_le_bytes([
            scales[4 * i],
            scales[4 * i + 1],
            scales[4 * i + 2],
            scales[4 * i + 3],
        ])
    };
    let (u0, u1, u2) = (w(0), w(1), w(2));
    // Scales 4..8: low nibbles of bytes 8..12 with the top bits of bytes 0..4; mins 4..8: the
    // high nibbles with the top bits of bytes 4..8.
    let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(u0 & KMASK1, sc_hi), join(u1 & KMASK1, m_hi))
}

/// The 256 quants of a Q4_K super-block in element order (0..16).
#[inline(always)]
pub(crate) fn q4k_quants(x: &BlockQ4_K, q: &mut [u8; QK_K]) {
    for c in 0..4 {
        for i in 0..32 {
            let b = x.qs[32 * c + i];
            q[64 * c + i] = b & 0x0F;
            q[64 * c + 32 + i] = b >> 4;
        }
    }
}

/// The 256 quants of a Q5_K super-block in element order (0..32).
#[inline(always)]
pub(crate) fn q5k_quants(x: &BlockQ5_K, q: &mut [u8; QK_K]) {
    for c in 0..4 {
        for i in 0..32 {
            let b = x.qs[32 * c + i];
            let h = x.qh[i] >> (2 * c);
            q[64 * c + i] = (b & 0x0F) | ((h & 1) << 4);
            q[64 * c + 32 + i] = (b >> 4) | ((h & 2) << 3);
        }
    }
}

/// The 256 quants of a Q6_K super-block in element order, unsigned (0..64; the value is
/// `q - 32`).
#[inline(always)]
pub(crate) fn q6k_quants(x: &BlockQ6_K, q: &mut [u8; QK_K]) {
    for h in 0..2 {
        let (qb, lb, hb) = (128 * h, 64 * h, 32 * h);
        for i in 0..32 {
            let (lo, hi, qh) = (x.ql[lb + i], x.ql[lb + i + 32], x.qh[hb + i]);
            q[qb + i] = (lo & 0x0F) | ((qh & 3) << 4);
            q[qb + i + 32] = (hi & 0x0F) | (((qh >> 2) & 3) << 4);
            q[qb + i + 64] = (lo >> 4) | (((qh >> 4) & 3) << 4);
            q[qb + i + 96] = (hi >> 4) | (((qh >> 6) & 3) << 4);
        }
    }
}
