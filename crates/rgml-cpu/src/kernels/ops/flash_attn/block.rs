//! The one-row fold over f16 K and V on x86 (AVX2, FMA and F16C; not the AVX512-FP16 build,
//! whose accumulator is f16 arithmetic), 8 cells at a time. Per head: the 8 scores first
//! (their sums reduced together), then the online softmax over them in cell order, then the
//! weighted V rows into the accumulator, held in registers across the 8 cells. Each head's
//! operations are those of ggml's one-row kernel cell by cell; only their grouping changes,
//! so every value is rounded as there.

use super::common::{mask_value, Folded};
use crate::kernels::dots::float::vec_dot_f16_in_place_x8;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::x86::mad_f16_rounded_rows;

/// Cells per block: one AVX2 register of scores.
pub(super) const CELLS: usize = 8;

/// One head's part in a block: its query (rounded to f16, as ggml converts it for f16 K),
/// its accumulator (f16 values, widened), its mask row and ALiBi slope.
pub(super) struct HeadBlock<'a> {
    pub q: &'a [f32],
    pub acc: &'a mut [f32],
    pub mask_row: Option<*const u8>,
    pub slope: f32,
}

/// The scores' factor and soft-cap (0: none), as the op's parameters give them.
#[derive(Clone, Copy)]
pub(super) struct Scoring {
    pub scale: f32,
    pub softcap: f32,
}

/// Cells `first..first + len` (`1 <= len <= CELLS`) folded into one head's state and
/// accumulator: `k_rows[c]` and `v_rows[c]` are cell `first + c`'s rows (the lanes past
/// `len` repeat a valid row and are ignored). A cell whose mask is `-inf` is skipped, as ggml
/// skips it.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; every K row must point at `head.q.len()` readable
/// f16 values and every V row at `head.acc.len()`; the mask row, if any, must hold more than
/// `first + len - 1` f16 values.
#[inline(always)]
pub(super) unsafe fn fold_block(
    f: CpuFeatures,
    k_rows: &[*const u16; CELLS],
    v_rows: &[*const u16; CELLS],
    (first, len): (usize, usize),
    head: HeadBlock<'_>,
    scoring: Scoring,
    st: &mut Folded,
) {
    let mut mask = [0f32; CELLS];
    if let Some(m) = head.mask_row {
        for (c, mv) in mask.iter_mut().enumerate().take(len) {
            // SAFETY: `first + c < first + len` elements of the mask row (the caller's promise).
            *mv = head.slope * unsafe { mask_value(m, first + c) };
        }
    }
    if mask[..len].iter().all(|&mv| mv == f32::NEG_INFINITY) {
        return;
    }
    // SAFETY: each K row holds `q.len()` values (the caller's promise).
    let dots = unsafe { vec_dot_f16_in_place_x8(f, k_rows, head.q) };
    let mut rows = [std::ptr::null(); CELLS];
    let mut weights = [(1.0f32, 1.0f32); CELLS];
    let mut n = 0;
    for c in 0..len {
        if mask[c] == f32::NEG_INFINITY {
            continue;
        }
        let weight = st.fold_cell(dots[c], scoring.scale, scoring.softcap, mask[c]);
        (rows[n], weights[n]) = (v_rows[c], weight);
        n += 1;
    }
    // SAFETY: the instructions and the V rows' length, as the caller promises.
    unsafe { mad_f16_rounded_rows(head.acc, &rows[..n], &weights[..n]) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dots::float::vec_dot_f16_in_place;
    use half::f16;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// ggml's one-row kernel over `cells`, one cell at a time, written out with scalar f16
    /// rounding: the state and the accumulator.
    fn cell_by_cell(
        f: CpuFeatures,
        (k, v, mask): (&[Vec<u16>], &[Vec<u16>], &[u16]),
        q: &[f32],
        slope: f32,
        scoring: Scoring,
    ) -> (Folded, Vec<f32>) {
        let round = |x: f32| f16::from_f32(x).to_f32();
        let mut st = Folded {
            max: f32::NEG_INFINITY,
            sum: 0.0,
        };
        let mut acc = vec![0f32; v[0].len()];
        for (ic, (k_row, v_row)) in k.iter().zip(v).enumerate() {
            let mv = slope * f16::from_bits(mask[ic]).to_f32();
            if mv == f32::NEG_INFINITY {
                continue;
            }
            // SAFETY: the row holds `q.len()` values.
            let mut s = unsafe { vec_dot_f16_in_place(f, k_row.as_ptr(), q) } * scoring.scale;
            if scoring.softcap != 0.0 {
                s = scoring.softcap * s.tanh();
            }
            s += mv;
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if s > st.max {
                ms = (st.max - s).exp();
                st.max = s;
                acc.iter_mut().for_each(|a| *a = round(*a * ms));
            } else {
                vs = (s - st.max).exp();
            }
            for (a, &x) in acc.iter_mut().zip(v_row) {
                *a = round(f16::from_bits(x).to_f32().mul_add(vs, *a));
            }
            st.sum = st.sum.mul_add(ms, vs);
        }
        (st, acc)
    }

    #[test]
    fn blocks_of_cells_fold_as_one_cell_at_a_time() {
        let f = CpuFeatures::detect();
        if !f.has_avx2() {
            return;
        }
        let mut rng = StdRng::seed_from_u64(31);
        let mut f16_row = |n: usize, scale: f32| -> Vec<u16> {
            (0..n)
                .map(|_| f16::from_f32(rng.gen_range(-scale..scale)).to_bits())
                .collect()
        };
        let n_cells = 29; // three whole blocks and a partial one
        for (d, softcap, slope) in [
            (64, 0.0, 1.0),
            (80, 0.0, 0.5),
            (128, 20.0, 1.0),
            (256, 0.0, 0.25),
        ] {
            let q: Vec<f32> = f16_row(d, 2.0)
                .iter()
                .map(|&b| f16::from_bits(b).to_f32())
                .collect();
            let k: Vec<Vec<u16>> = (0..n_cells).map(|_| f16_row(d, 2.0)).collect();
            let v: Vec<Vec<u16>> = (0..n_cells).map(|_| f16_row(d, 2.0)).collect();
            // Some cells masked out, among them all of the second block; the rest of the
            // mask small random values.
            let mut mask = f16_row(n_cells, 1.0);
            for c in (8..16).chain([3, 20, 28]) {
                mask[c] = f16::NEG_INFINITY.to_bits();
            }
            let scoring = Scoring {
                scale: 1.0 / (d as f32).sqrt(),
                softcap,
            };
            let (want_st, want_acc) = cell_by_cell(f, (&k, &v, &mask), &q, slope, scoring);
            let mut st = Folded {
                max: f32::NEG_INFINITY,
                sum: 0.0,
            };
            let mut acc = vec![0f32; d];
            for first in (0..n_cells).step_by(CELLS) {
                let len = CELLS.min(n_cells - first);
                let k_rows = std::array::from_fn(|c| k[first + c.min(len - 1)].as_ptr());
                let v_rows = std::array::from_fn(|c| v[first + c.min(len - 1)].as_ptr());
                let head = HeadBlock {
                    q: &q,
                    acc: &mut acc,
                    mask_row: Some(mask.as_ptr().cast()),
                    slope,
                };
                // SAFETY: AVX2, FMA and F16C (checked); rows of `d` values, a mask of
                // `n_cells`.
                unsafe { fold_block(f, &k_rows, &v_rows, (first, len), head, scoring, &mut st) };
            }
            assert_eq!(st.max.to_bits(), want_st.max.to_bits(), "d = {d}");
            assert_eq!(st.sum.to_bits(), want_st.sum.to_bits(), "d = {d}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&acc), bits(&want_acc), "d = {d}");
            assert!(want_acc.iter().any(|&a| a != 0.0));
        }
    }
}
