//! Prompts through repacked Q4_0 weights on AVX-512 VNNI: the activation layout this kernel
//! reads ("Q8_0 with sums", written by MUL_MAT's phase 1) and the kernel.
//!
//! The kernel gives, bit for bit, what [`super::repack`]'s direct kernels and the per-pair
//! dots give (ggml's `q4_0 · q8_0`: per block 8 lanes of exact integer sums of 4 products, one
//! FMA each by `d_x * d_y`, one `hsum_float_8`). It differs only in where the exact integer
//! sums come from: `vpdpbusd` of the unsigned nibbles `q` by the signed activations `y`,
//! started from `-8 * Σy` over the same 4 bytes, which phase 1 computed once per activation
//! block. The repacked kernel for Q8_0 activations recomputes that correction (or its
//! weight-side twin) inside the loop, and converts each activation scale from f16 there: about
//! a third of its vector instructions, which this layout removes.
//!
//! # Layout of a prepared row of `nb` blocks
//! `nb` blocks of 64 bytes (the 32 quants of the Q8_0 block, then `-8 * Σ` of each 4
//! consecutive quants as 8 little-endian i32), then the `nb` block scales as f32.

use rgml::{DType, Error, Result};

use crate::kernels::isa::CpuFeatures;
use crate::kernels::tiles::repack;

#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::x86::{cvtph4_ps, hsum8x4_ps};
#[cfg(target_arch = "x86_64")]
use crate::kernels::tiles::repack::GROUP_ROWS;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Bytes of one prepared block (quants and sums; the scales follow all blocks).
const BLOCK: usize = 64;

/// Bytes of a Q8_0 block.
const Q8_0_BLOCK: usize = DType::Q8_0.block_bytes();

/// Bytes of a packed Q4_0 block (its 4 rows' blocks, see [`repack`]'s layout).
#[cfg(target_arch = "x86_64")]
const PACKED_BLOCK: usize = GROUP_ROWS * DType::Q4_0.block_bytes();

/// Whether MUL_MAT takes this kernel for weights of `dtype` (repacked) by `ne11` activation
/// rows: Q4_0 by 2 rows or more on a CPU with the repacked direct kernels. One row (a
/// generation step) keeps Q8_0 activations and the 16-row matrix-vector kernel.
pub(crate) fn takes(f: CpuFeatures, dtype: DType, ne11: usize) -> bool {
    dtype == DType::Q4_0 && ne11 >= 2 && repack::fast(f)
}

/// Bytes of a prepared row of `n` values (`n` a multiple of 32).
pub(crate) fn row_bytes(n: usize) -> Result<usize> {
    if !n.is_multiple_of(32) {
        return Err(Error::Backend {
            backend: "CPU".into(),
            message: format!("Q4_0 prompt activations: {n} values are not whole blocks"),
        });
    }
    Ok(n / 32 * (BLOCK + 4))
}

/// Rewrites in place the Q8_0 blocks at the start of `row` (as `quantize_activations` writes
/// them) into the prepared layout that fills all of `row`, on a CPU where [`takes`] holds
/// (the only one that reads the layout).
pub(crate) fn prepare(f: CpuFeatures, row: &mut [u8]) -> Result<()> {
    let bad = |message: String| Error::Backend {
        backend: "CPU".into(),
        message,
    };
    let nb = row.len() / (BLOCK + 4);
    if row.len() != nb * (BLOCK + 4) {
        let n = row.len();
        return Err(bad(format!(
            "Q4_0 prompt activations: {n} bytes are not whole blocks"
        )));
    }
    if !takes(f, DType::Q4_0, 2) {
        return Err(bad("Q4_0 prompt activations need AVX-512 VNNI".into()));
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `takes` held (the features); `row` holds `nb` prepared blocks.
    unsafe {
        prepare_vnni(nb, row.as_mut_ptr())
    };
    Ok(())
}

/// [`prepare`]'s body: backwards, so that no block is overwritten before it is read (block
/// `i` moves from `34i` to `64i` and its scale to `64nb + 4i`, both at or past the end of
/// blocks `0..i`, and each block is read whole before it is written).
///
/// # Safety
/// `row` points at `nb * 68` writable bytes; the CPU has AVX-512 F/VL, VNNI and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn prepare_vnni(nb: usize, row: *mut u8) {
    // SAFETY: every access is within the `nb * 68` bytes the caller promised.
    unsafe {
        let ones = _mm256_set1_epi8(1);
        for i in (0..nb).rev() {
            let src = row.add(i * Q8_0_BLOCK);
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                src.cast::<u16>().read_unaligned(),
            ))));
            let q = _mm256_loadu_si256(src.add(2).cast());
            // Σ of each 4 quants (1 x q), times -8.
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
            let corr = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<3>(sums));
            let dst = row.add(i * BLOCK);
            _mm256_storeu_si256(dst.cast(), q);
            _mm256_storeu_si256(dst.add(32).cast(), corr);
            row.add(nb * BLOCK + 4 * i).cast::<f32>().write_unaligned(d);
        }
    }
}

/// Most columns of one kernel call with one group.
#[cfg(target_arch = "x86_64")]
const MAX_COLS: usize = 8;

/// The products of rows `0..4 * ngroups` of the packed Q4_0 groups at `groups` (`nb` blocks
/// per row) by the prepared activation rows `y`: row `row` of column `c` at `out[c] + row`
/// (the output columns are contiguous in MUL_MAT's destination, so each group's 4 rows are
/// one 16-byte store). One group by up to 8 columns per kernel call. (Pairs of groups by 4
/// columns, the repacked kernel's shape, were 8% slower: the compiler copies each column's
/// sums for the second group, where one group takes them straight from the load.)
///
/// # Safety
/// [`takes`] held for this CPU; `groups` points at `ngroups` whole packed groups; every `y[c]`
/// at a prepared row of `nb` blocks; `out.len() == y.len()` and every `out[c]` at `4 * ngroups`
/// writable f32 that no other thread accesses.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_groups(
    nb: usize,
    groups: *const u8,
    ngroups: usize,
    y: &[*const u8],
    out: &[*mut f32],
) {
    for g in 0..ngroups {
        let group = groups.wrapping_add(g * nb * PACKED_BLOCK);
        for (cols, outs) in y.chunks(MAX_COLS).zip(out.chunks(MAX_COLS)) {
            let outs: [*mut f32; MAX_COLS] = std::array::from_fn(|c| {
                outs.get(c)
                    .map_or(std::ptr::null_mut(), |p| p.wrapping_add(GROUP_ROWS * g))
            });
            macro_rules! cols {
                ($($n:literal),*) => {
                    match cols.len() {
                        // SAFETY: group `g` of the promised range, `cols.len()` of the
                        // promised columns and their outputs (rows 4g..4g + 4 of each);
                        // the features were detected (`takes`).
                        $($n => unsafe { tile::<$n>(nb, group, cols, &outs) },)*
                        _ => {}
                    }
                };
            }
            cols!(1, 2, 3, 4, 5, 6, 7, 8);
        }
    }
}

/// One packed Q4_0 group by `NC` prepared activation rows: per block, the group's nibbles are
/// split once (low nibbles: every row's elements 0..16; high: 16..32, row `r` in 128-bit lane
/// `r`) and each column's quants, sums and scale are loaded, with no other per-column work
/// than the products: per column, two `vpdpbusd` started from the loaded sums, one scale
/// product, two conversions and two FMAs. The final sums are the repacked kernel's
/// ([`hsum8x4_ps`]); column `c`'s 4 rows go to `out[c]`.
///
/// # Safety
/// As [`tile_groups`] with one group, `NC == y.len()` columns and their outputs' first 4
/// rows at `out[..NC]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
unsafe fn tile<const NC: usize>(
    nb: usize,
    group: *const u8,
    y: &[*const u8],
    out: &[*mut f32; MAX_COLS],
) {
    // SAFETY: reads within the groups and the prepared rows the caller promised, writes to
    // the outputs it promised.
    unsafe {
        let spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        let nib = _mm512_set1_epi8(0x0F);
        let mut acc_lo = [_mm512_setzero_ps(); NC];
        let mut acc_hi = [_mm512_setzero_ps(); NC];
        let cols: [*const u8; NC] = std::array::from_fn(|c| y[c]);
        for i in 0..nb {
            let p = group.add(i * PACKED_BLOCK);
            let dx = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(cvtph4_ps(p)));
            let v = _mm512_loadu_si512(p.add(8).cast());
            let lo = _mm512_and_si512(v, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            for c in 0..NC {
                let py = cols[c].add(i * BLOCK);
                let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(py.cast()));
                let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(py.add(16).cast()));
                let clo = _mm512_broadcast_i32x4(_mm_loadu_si128(py.add(32).cast()));
                let chi = _mm512_broadcast_i32x4(_mm_loadu_si128(py.add(48).cast()));
                let scale = cols[c].add(nb * BLOCK + 4 * i).cast::<f32>();
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(scale.read_unaligned()));
                let ilo = _mm512_dpbusd_epi32(clo, lo, ylo);
                let ihi = _mm512_dpbusd_epi32(chi, hi, yhi);
                acc_lo[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ilo), acc_lo[c]);
                acc_hi[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ihi), acc_hi[c]);
            }
        }
        for c in 0..NC {
            // Lanes 0, 4, 8 and 12 hold rows 0..4.
            let rows = _mm512_maskz_compress_ps(0x1111, hsum8x4_ps(acc_lo[c], acc_hi[c]));
            _mm_storeu_ps(out[c], _mm512_castps512_ps128(rows));
        }
    }
}

/// Multiply-adds per second of this kernel and of the repacked kernel on Q8_0 activations, 1
/// thread: K 2048 by 256 weight rows by `ntok` activation rows, in the loops MUL_MAT runs (16
/// weight rows by 8 columns per call). `None` where this kernel does not run.
#[cfg(target_arch = "x86_64")]
pub(crate) fn bench_macs(ntok: usize) -> Option<[f64; 2]> {
    const K: usize = 2048;
    let f = CpuFeatures::detect();
    if !takes(f, DType::Q4_0, ntok) {
        return None;
    }
    let nrows = 256;
    let nb = K / 32;
    let values = |n: usize, s: usize| -> Vec<f32> {
        (0..n).map(|i| ((i * s % 13) as f32 - 6.0) / 7.0).collect()
    };
    let rb = DType::Q4_0.row_bytes(K).ok()?;
    let mut w = vec![0u8; rb * nrows];
    for r in w.chunks_exact_mut(rb) {
        rgml::quant::quantize_row(DType::Q4_0, &values(K, 7), r).ok()?;
    }
    let mut packed = vec![0u8; w.len()];
    repack::pack(DType::Q4_0, K, &w, &mut packed).ok()?;
    let yrow = DType::Q8_0.row_bytes(K).ok()?;
    let prow = row_bytes(K).ok()?;
    let mut q8 = vec![0u8; yrow * ntok];
    let mut prepared = vec![0u8; prow * ntok];
    for (q, p) in q8
        .chunks_exact_mut(yrow)
        .zip(prepared.chunks_exact_mut(prow))
    {
        rgml::quant::quantize_row(DType::Q8_0, &values(K, 5), q).ok()?;
        p[..yrow].copy_from_slice(q);
        prepare(f, p).ok()?;
    }
    let mut out = [0f32; 16 * 8];
    let mut columns = [0f32; 16 * 8];
    let mut scratch = vec![0u8; 4 * rb];
    let mut run = |acts: &[u8], row: usize, new: bool| {
        crate::kernels::tiles::kquant::best_of_7(|| {
            for c0 in (0..ntok).step_by(8) {
                let y: Vec<*const u8> = (c0..(c0 + 8).min(ntok))
                    .map(|c| acts[c * row..].as_ptr())
                    .collect();
                for r0 in (0..nrows).step_by(16) {
                    let group = packed[r0 * rb..].as_ptr();
                    // SAFETY: `takes` held; 4 whole packed groups of `nb` blocks; activation
                    // rows of `nb` blocks in the layout each kernel reads; `out` holds 16 x 8.
                    unsafe {
                        if new {
                            let base = columns.as_mut_ptr();
                            let outs: Vec<*mut f32> =
                                (0..y.len()).map(|c| base.wrapping_add(16 * c)).collect();
                            tile_groups(nb, group, 4, &y, &outs);
                        } else {
                            repack::tile_groups(
                                f,
                                DType::Q4_0,
                                nb,
                                group,
                                4,
                                &y,
                                &mut out,
                                8,
                                &mut scratch,
                            );
                        }
                    }
                    std::hint::black_box((&out, &columns));
                }
            }
        })
    };
    let macs = (K * ntok * nrows) as f64;
    let new = run(&prepared, prow, true);
    let old = run(&q8, yrow, false);
    Some([macs / new, macs / old])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::blocks::activations::quantize_activations;
    use crate::kernels::dots::vec_dot;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The prepared layout holds each Q8_0 block's quants, its 4-byte sums times -8 and its
    /// scale, for rows of 1 to 9 blocks.
    #[test]
    fn prepare_writes_the_documented_layout() {
        let f = CpuFeatures::detect();
        if !takes(f, DType::Q4_0, 2) {
            assert!(prepare(f, &mut [0u8; 68]).is_err());
            eprintln!("no AVX-512 VNNI here: the Q4_0 prompt layout is not written");
            return;
        }
        let mut rng = StdRng::seed_from_u64(11);
        for nb in 1..=9 {
            let v: Vec<f32> = (0..32 * nb).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let mut q8 = vec![0u8; nb * Q8_0_BLOCK];
            rgml::quant::quantize_row(DType::Q8_0, &v, &mut q8).unwrap();
            let mut row = vec![0u8; row_bytes(32 * nb).unwrap()];
            row[..q8.len()].copy_from_slice(&q8);
            prepare(f, &mut row).unwrap();
            for (i, b) in q8.chunks_exact(Q8_0_BLOCK).enumerate() {
                let p = &row[i * BLOCK..(i + 1) * BLOCK];
                assert_eq!(p[..32], b[2..], "nb {nb} block {i}: quants");
                for j in 0..8 {
                    let s: i32 = b[2 + 4 * j..6 + 4 * j]
                        .iter()
                        .map(|&q| q as i8 as i32)
                        .sum();
                    let got = i32::from_le_bytes(p[32 + 4 * j..36 + 4 * j].try_into().unwrap());
                    assert_eq!(got, -8 * s, "nb {nb} block {i} sum {j}");
                }
                let d = f32::from_le_bytes(row[nb * BLOCK + 4 * i..][..4].try_into().unwrap());
                assert_eq!(d, half::f16::from_le_bytes([b[0], b[1]]).to_f32());
            }
        }
        assert!(row_bytes(48).is_err());
        assert!(prepare(f, &mut [0u8; 67]).is_err());
    }

    /// The kernel equals the pair dots bit for bit: random Q4_0 groups (random bytes and
    /// scales) by activations quantized as MUL_MAT does, every column count and 1 to 5 groups.
    #[test]
    fn tile_groups_equal_the_pair_dots() {
        let f = CpuFeatures::detect();
        if !takes(f, DType::Q4_0, 2) {
            eprintln!("no AVX-512 VNNI here: the Q4_0 prompt kernel is not run");
            return;
        }
        let mut rng = StdRng::seed_from_u64(12);
        for nb in [1, 3, 18, 64] {
            let ne0 = 32 * nb;
            let rb = DType::Q4_0.row_bytes(ne0).unwrap();
            for ngroups in 1..=5 {
                let mut w = vec![0u8; 4 * ngroups * rb];
                for b in w.chunks_exact_mut(18) {
                    let d: f32 =
                        rng.gen_range(1e-3..2.0) * if rng.gen_bool(0.5) { 1.0 } else { -1.0 };
                    b[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
                    rng.fill(&mut b[2..]);
                }
                let mut packed = vec![0u8; w.len()];
                repack::pack(DType::Q4_0, ne0, &w, &mut packed).unwrap();
                let mut q8 = Vec::new();
                let mut prepared = Vec::new();
                for _ in 0..11 {
                    let v: Vec<f32> = (0..ne0).map(|_| rng.gen_range(-3.0..3.0)).collect();
                    let mut q = vec![0u8; DType::Q8_0.row_bytes(ne0).unwrap()];
                    quantize_activations(f, DType::Q8_0, &v, &mut q).unwrap();
                    let mut p = vec![0u8; row_bytes(ne0).unwrap()];
                    p[..q.len()].copy_from_slice(&q);
                    prepare(f, &mut p).unwrap();
                    q8.push(q);
                    prepared.push(p);
                }
                for nc in [2, 3, 4, 5, 8, 11] {
                    let y: Vec<*const u8> = prepared[..nc].iter().map(|p| p.as_ptr()).collect();
                    // Columns `stride` apart, with a gap after each.
                    let stride = 4 * ngroups + 1;
                    let mut out = vec![f32::NAN; nc * stride];
                    let outs: Vec<*mut f32> =
                        (0..nc).map(|c| out[c * stride..].as_mut_ptr()).collect();
                    // SAFETY: `takes` held; `ngroups` whole packed groups of `nb` blocks;
                    // prepared rows of `nb` blocks; each column has its 4 * ngroups rows.
                    unsafe { tile_groups(nb, packed.as_ptr(), ngroups, &y, &outs) };
                    for c in 0..nc {
                        assert!(out[c * stride + 4 * ngroups].is_nan(), "written past");
                    }
                    for row in 0..4 * ngroups {
                        for c in 0..nc {
                            let x = &w[row * rb..(row + 1) * rb];
                            let want = vec_dot(f, DType::Q4_0, ne0, x, &q8[c]).unwrap();
                            assert_eq!(
                                out[c * stride + row].to_bits(),
                                want.to_bits(),
                                "nb {nb} groups {ngroups} cols {nc} ({row}, {c})"
                            );
                        }
                    }
                }
            }
        }
    }
}
