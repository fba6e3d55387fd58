//! The AVX2 build's direct kernel for repacked weights ([`super::repack`]'s x4 layout): the
//! matrix-vector product of generation, one activation row against consecutive 4-row groups
//! of Q4_0, Q4_1 or Q8_0.
//!
//! Why a layout of its own on AVX2: the plain kernel reads four rows as four streams
//! ([`super::legacy::matvec_kernel`]); packed groups are one stream of consecutive bytes per
//! thread, which the hardware prefetcher follows and DRAM serves in whole pages. Each row keeps
//! the arithmetic of ggml's AVX2 pair dot (`ggml_vec_dot_q4_0_q8_0` and its siblings): per
//! block 8 lanes of exact integer sums of 4 byte products, converted to f32 and folded into
//! the row's own accumulator with one FMA by `d_x * d_y`; Q4_1's min terms multiplied then
//! added in block order; one horizontal sum at the end. The integer sums come from the
//! unsigned codes where that saves work (Q4_0: `u * y` less `8 * y`, exact), which cannot
//! change an exact integer.

use super::legacy::{layout, Q4_0, Q4_1};
use crate::kernels::fp16::h2f;
use crate::kernels::simd::x86::{cvtph4_ps, hsum8, nibbles};
use crate::kernels::simd::StreamPrefetch;
use std::arch::x86_64::*;

/// Rows per packed group (`repack::GROUP_ROWS`, which checks that they agree).
pub(super) const ROWS: usize = 4;

/// `out[r * out_stride]` = the pair dot of row `r` of `ngroups` consecutive packed groups
/// (`nb` blocks per row, from `groups`) with the activation row `y` (Q8_0 blocks for Q4_0 and
/// Q8_0, Q8_1 for Q4_1), bit for bit.
///
/// # Safety
/// `ngroups` whole packed groups of kind `K` readable from `groups`; `nb` activation blocks
/// at `y`; `out` has an element at every `r * out_stride`, `r < 4 * ngroups`; the CPU has
/// AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matvec<const K: u8>(
    nb: usize,
    groups: *const u8,
    ngroups: usize,
    y: *const u8,
    out: &mut [f32],
    out_stride: usize,
) {
    // A packed block is the 4 rows' blocks with their fields gathered in front: 4 times a
    // block's bytes, the quants after 4 times a block's fields.
    let (xb, yb, xq, yq) = layout(K);
    let (pb, pq, qbytes) = (ROWS * xb, ROWS * xq, xb - xq);
    // The groups are one stream: consecutive bytes from the first to the last.
    let mut stream = StreamPrefetch::new(groups);
    // SAFETY: reads within the groups and activation blocks the caller promised, under AVX2,
    // FMA and F16C.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        for g in 0..ngroups {
            let group = groups.add(g * nb * pb);
            let mut acc = [_mm256_setzero_ps(); ROWS];
            let mut summs = [0f32; ROWS];
            for i in 0..nb {
                let p = group.add(i * pb);
                stream.step(p);
                let py = y.add(i * yb);
                let dy = h2f(py);
                let qy = _mm256_loadu_si256(py.add(yq).cast());
                // The 4 rows' `d_x * d_y`, each one IEEE product as in the pair dot (an f16
                // converts exactly, by F16C or by ggml's table).
                let mut d = [0f32; ROWS];
                _mm_storeu_ps(d.as_mut_ptr(), _mm_mul_ps(cvtph4_ps(p), _mm_set1_ps(dy)));
                if K == Q4_1 {
                    let sy = h2f(py.add(2));
                    let mut m = [0f32; ROWS];
                    _mm_storeu_ps(m.as_mut_ptr(), cvtph4_ps(p.add(2 * ROWS)));
                    for r in 0..ROWS {
                        summs[r] += m[r] * sy;
                    }
                }
                // Q4_0's `8 * y` pair sums, once for the 4 rows.
                let yoff = match K {
                    Q4_0 => _mm256_maddubs_epi16(_mm256_set1_epi8(8), qy),
                    _ => _mm256_setzero_si256(),
                };
                for r in 0..ROWS {
                    let q = p.add(pq + r * qbytes);
                    // No saturation: |2 * 15 * 127|, |2 * 127 * 127| fit in i16.
                    let pairs = match K {
                        Q4_0 => _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles(q), qy), yoff),
                        Q4_1 => _mm256_maddubs_epi16(nibbles(q), qy),
                        _ => {
                            // Signed x signed through the sign of x (quants are never -128).
                            let qx = _mm256_loadu_si256(q.cast());
                            _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx))
                        }
                    };
                    let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[r]), sums, acc[r]);
                }
            }
            for r in 0..ROWS {
                let h = hsum8(acc[r]);
                out[(g * ROWS + r) * out_stride] = if K == Q4_1 { h + summs[r] } else { h };
            }
        }
    }
}
