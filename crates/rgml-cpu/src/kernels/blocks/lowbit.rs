//! Decoders of Q2_K, Q3_K, IQ4_XS, IQ4_NL and MXFP4 blocks: their quants (or codebook values)
//! in element order and their unpacked scales, shared by the low-bit pair dots
//! ([`crate::kernels::dots::lowbit`]) and the tile kernels ([`crate::kernels::tiles`]).
//! IQ4_NL and MXFP4 share one layout, 32 indices into a 16-entry codebook under one scale
//! ([`NibbleBlock`]).

use crate::kernels::fp16;
use bytemuck::Pod;
use rgml::quant::{
    e8m0_to_f32_half, BlockIQ4_NL, BlockIQ4_XS, BlockMXFP4, BlockQ2_K, BlockQ3_K, KVALUES_IQ4NL,
    KVALUES_MXFP4, QK_K,
};

/// A block of 32 4-bit indices into a 16-entry codebook under one scale, the layout IQ4_NL and
/// MXFP4 share: byte `j` of the 16 index bytes holds value `j` in its low nibble and value
/// `j + 16` in its high nibble, and the bytes follow the scale. ggml's `vec_dot`s of both
/// with Q8_0 do the same arithmetic but for the scale's format.
pub(crate) trait NibbleBlock: Pod {
    /// The values the indices stand for, before the scale.
    const CODEBOOK: [i8; 16];
    /// The offset of the 16 index bytes in the block.
    const QS: usize;
    /// The block's scale as f32 (exact).
    fn scale(&self) -> f32;
    /// The 16 index bytes.
    fn qs(&self) -> &[u8; 16];
    /// [`Self::scale`] of the block whose bytes start at `p`.
    ///
    /// # Safety
    /// The block's first [`Self::QS`] bytes are readable at `p`.
    unsafe fn scale_at(p: *const u8) -> f32;
}

impl NibbleBlock for BlockIQ4_NL {
    const CODEBOOK: [i8; 16] = KVALUES_IQ4NL;
    const QS: usize = 2;
    #[inline(always)]
    fn scale(&self) -> f32 {
        fp16::f16_to_f32(self.d)
    }
    #[inline(always)]
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    #[inline(always)]
    unsafe fn scale_at(p: *const u8) -> f32 {
        // SAFETY: the f16 scale's two bytes, as the caller promises.
        fp16::f16_bits_to_f32(unsafe { p.cast::<u16>().read_unaligned() })
    }
}

/// [`e8m0_to_f32_half`] of every byte: the kernels read a scale per block, and building it
/// from its bits took a dozen scalar instructions per block (gpt-oss-20b's tg32 5.2 -> 6.2
/// tok/s with the table).
static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = e8m0_to_f32_half(e as u8);
        e += 1;
    }
    t
};

impl NibbleBlock for BlockMXFP4 {
    const CODEBOOK: [i8; 16] = KVALUES_MXFP4;
    const QS: usize = 1;
    /// Half the E8M0 scale, as ggml's dot takes it (its codebook holds doubled values).
    #[inline(always)]
    fn scale(&self) -> f32 {
        e8m0_to_f32_half(self.e)
    }
    #[inline(always)]
    fn qs(&self) -> &[u8; 16] {
        &self.qs
    }
    #[inline(always)]
    unsafe fn scale_at(p: *const u8) -> f32 {
        // SAFETY: the scale byte, as the caller promises.
        E8M0_HALF[usize::from(unsafe { p.read() })]
    }
}

/// The 256 2-bit quants of a Q2_K (or the low bits of a Q3_K) super-block in element order:
/// for each 128 values, byte `l` of the 32-byte group holds values `l + 32 t` at bits `2t`.
#[inline(always)]
fn low2_quants(qs: &[u8; 64], q: &mut [u8; QK_K]) {
    for h in 0..2 {
        for t in 0..4 {
            for l in 0..32 {
                q[128 * h + 32 * t + l] = (qs[32 * h + l] >> (2 * t)) & 3;
            }
        }
    }
}

/// Q2_K quants in element order (0..4).
#[inline(always)]
pub(crate) fn q2k_quants(x: &BlockQ2_K, q: &mut [u8; QK_K]) {
    low2_quants(&x.qs, q);
}

/// Q3_K codes in element order, unsigned (0..8; the value is `code - 4`): the low 2 bits and
/// the hmask bit as bit 2 (value `j`'s at bit `j / 32` of byte `j % 32`).
#[inline(always)]
pub(crate) fn q3k_codes(x: &BlockQ3_K, q: &mut [u8; QK_K]) {
    low2_quants(&x.qs, q);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= ((x.hmask[j % 32] >> (j / 32)) & 1) << 2;
    }
}

/// Q3_K's 16 sub-block scales, signed (`scale - 32`).
#[inline(always)]
pub(crate) fn q3k_scales(x: &BlockQ3_K) -> [i8; 16] {
    // ggml's word-wise unpacking (`aux`, `kmask1/2` in its x86 dot): each word's low nibbles
    // or high nibbles, with the matching 2-bit field of word 2 as bits 4..6 (`q3_k_scale` for
    // every `j`, a dozen integer operations instead of 16 extractions).
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let s = &x.scales;
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, t) = (w(0), w(1), w(2));
    let words = [
        (a0 & KMASK2) | ((t & KMASK1) << 4),
        (a1 & KMASK2) | (((t >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((t >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((t >> 6) & KMASK1) << 4),
    ];
    std::array::from_fn(|j| (words[j / 4] >> (8 * (j % 4))) as u8 as i8 - 32)
}

/// IQ4_XS's 8 sub-block scales, signed (`ls - 32`).
#[inline(always)]
pub(crate) fn iq4xs_scales(x: &BlockIQ4_XS) -> [i8; 8] {
    std::array::from_fn(|ib| {
        let lo = (x.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let hi = ((x.scales_h >> (2 * ib)) & 3) as u8;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// The 32 `codebook` values of 16 packed bytes in element order (low nibbles first).
#[inline(always)]
pub(crate) fn nibble_values(codebook: &[i8; 16], qs: &[u8], v: &mut [i8]) {
    for (j, &b) in qs.iter().enumerate().take(16) {
        v[j] = codebook[usize::from(b & 0x0F)];
        v[j + 16] = codebook[usize::from(b >> 4)];
    }
}

/// IQ4_XS values in element order.
#[inline(always)]
pub(crate) fn iq4xs_values(x: &BlockIQ4_XS, v: &mut [i8; QK_K]) {
    for (qs, vs) in x.qs.chunks_exact(16).zip(v.chunks_exact_mut(32)) {
        nibble_values(&KVALUES_IQ4NL, qs, vs);
    }
}
/// The 32 `codebook` values of the 16 packed bytes at `qs` in element order (low nibbles in
/// the low 128 bits).
///
/// # Safety
/// 16 readable bytes at `qs`; AVX2.
#[inline(always)]
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn nibble_values_avx2(
    codebook: &[i8; 16],
    qs: *const u8,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: as the caller promises; the codebook is 16 bytes.
    unsafe {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(codebook.as_ptr().cast()));
        _mm256_shuffle_epi8(table, crate::kernels::simd::x86::nibbles(qs))
    }
}
