//! What ggml-cpu's flash-attention kernels share: the op's parameters and sources, a query
//! row's indices, ALiBi slopes, the mask, sinks and the widening of K and V rows to f32.

use crate::kernels::fp16;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::task::{f32_row, NodeTask, TensorView};
use rgml::{DType, Result};

/// ggml's tile of queries and of cells (`GGML_FA_TILE_Q`, `GGML_FA_TILE_KV`).
pub(super) const TILE: usize = 64;

/// ggml's threshold for splitting one query's cells between threads.
const SPLIT_MIN_CELLS: usize = 512;

/// Which of ggml's kernels an op runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// One query (and one dim-3 slice) over 512 cells or more, f16 or f32 K and V of one type:
    /// the cells split between threads.
    SplitCells,
    /// 64 queries or more, f16 or f32 K and V of one type.
    Tiled,
    /// Each query row on its own.
    Rows,
}

impl Path {
    /// The path for `q` `[dk, n_q, n_head, ne3]` over K and V of these types with `n_kv` cells.
    pub(super) fn of(q_ne: [usize; 4], n_kv: usize, k: DType, v: DType) -> Path {
        let float_kv = matches!(k, DType::F16 | DType::F32) && k == v;
        if float_kv && q_ne[1] == 1 && q_ne[3] == 1 && n_kv >= SPLIT_MIN_CELLS {
            Path::SplitCells
        } else if float_kv && q_ne[1] >= TILE {
            Path::Tiled
        } else {
            Path::Rows
        }
    }
}

/// The op's parameters.
pub(crate) struct FlashParams {
    pub scale: f32,
    pub max_bias: f32,
    pub softcap: f32,
    pub mask: bool,
    pub sinks: bool,
}

impl FlashParams {
    /// The factor each `k·q` is multiplied by: ggml folds the soft-cap's `1 / softcap` into
    /// the scale.
    pub(super) fn score_scale(&self) -> f32 {
        if self.softcap != 0.0 {
            self.scale / self.softcap
        } else {
            self.scale
        }
    }
}

/// The op's sources.
pub(super) struct Sources<'a> {
    pub q: &'a TensorView,
    pub k: &'a TensorView,
    pub v: &'a TensorView,
    pub mask: Option<&'a TensorView>,
    pub sinks: Option<&'a TensorView>,
}

impl<'a> Sources<'a> {
    pub(super) fn of(task: &'a NodeTask, p: &FlashParams) -> Result<Sources<'a>> {
        Ok(Sources {
            q: task.src(0)?,
            k: task.src(1)?,
            v: task.src(2)?,
            mask: if p.mask { Some(task.src(3)?) } else { None },
            sinks: if p.sinks {
                Some(task.src(if p.mask { 4 } else { 3 })?)
            } else {
                None
            },
        })
    }

    /// Query rows: queries, then heads, then dim 3.
    pub(super) fn rows(&self) -> usize {
        self.q.ne[1] * self.q.ne[2] * self.q.ne[3]
    }

    /// Query `at`'s mask row, if the op has a mask.
    pub(super) fn mask_row(&self, at: RowAt) -> Option<*const u8> {
        self.mask.map(|m| {
            m.row(at.iq1, at.iq2 % m.ne[2], at.iq3 % m.ne[3])
                .cast_const()
        })
    }
}

/// Softmax state of a row over some cells: the largest score and the sum of `exp(s - max)`
/// (the weighted V rows are in the row's accumulator).
#[derive(Clone, Copy)]
pub(super) struct Folded {
    pub max: f32,
    pub sum: f32,
}

impl Folded {
    /// One cell into the softmax as ggml's one-row kernel folds it: its `k·q` scaled,
    /// soft-capped (`softcap` 0: not) and masked (`mask`: the slope times the mask value).
    /// Returns `(ms, vs)`: the accumulator's factor (1 unless the score is a new maximum) and
    /// the cell's V weight.
    #[inline(always)]
    pub(super) fn fold_cell(
        &mut self,
        dot: f32,
        scale: f32,
        softcap: f32,
        mask: f32,
    ) -> (f32, f32) {
        let mut score = dot * scale;
        if softcap != 0.0 {
            score = softcap * score.tanh();
        }
        score += mask;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if score > self.max {
            ms = (self.max - score).exp();
            self.max = score;
        } else {
            vs = (score - self.max).exp();
        }
        self.sum = self.sum.mul_add(ms, vs);
        (ms, vs)
    }
}

/// Mask element `ic` of a mask row, as f32.
///
/// # Safety
/// `row` must be a readable f16 mask row of more than `ic` elements.
#[inline(always)]
pub(super) unsafe fn mask_value(row: *const u8, ic: usize) -> f32 {
    // SAFETY: as the caller promises.
    let bits = unsafe { row.cast::<u16>().add(ic).read_unaligned() };
    fp16::f16_bits_to_f32(bits)
}

/// A query row's indices: query, head, dim 3.
#[derive(Clone, Copy)]
pub(super) struct RowAt {
    pub iq1: usize,
    pub iq2: usize,
    pub iq3: usize,
}

impl RowAt {
    /// Row `r` of `q`'s rows, counted query fastest, then head, then dim 3 (ggml's order).
    #[inline(always)]
    pub(super) fn of(r: usize, q: &TensorView) -> RowAt {
        let (n_q, n_head) = (q.ne[1], q.ne[2]);
        let iq3 = r / (n_head * n_q);
        let iq2 = (r - iq3 * n_head * n_q) / n_q;
        RowAt {
            iq1: r - iq3 * n_head * n_q - iq2 * n_q,
            iq2,
            iq3,
        }
    }

    /// The head and dim-3 index of K or V (`kv`) this row reads: heads are shared by groups.
    #[inline(always)]
    pub(super) fn kv_head(self, q: &TensorView, kv: &TensorView) -> (usize, usize) {
        (
            self.iq2 / (q.ne[2] / kv.ne[2]),
            self.iq3 / (q.ne[3] / kv.ne[3]),
        )
    }
}

/// ggml's ALiBi slope of head `h` of `n_head`.
#[inline(always)]
pub(super) fn slope(max_bias: f32, h: u32, n_head: u32) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = if n_head == 0 {
        1
    } else {
        1u32 << (31 - n_head.leading_zeros())
    };
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if h < n_head_log2 {
        m0.powf((h + 1) as f32)
    } else {
        m1.powf((2 * (h - n_head_log2) + 1) as f32)
    }
}

/// Widen `out.len()` elements of a dense f16 or f32 row at `ptr` into `out` (exact), with
/// F16C where `f` says the CPU has it.
///
/// # Safety
/// `ptr` must point at `out.len()` readable elements of `dtype`.
#[inline(always)]
pub(super) unsafe fn widen(f: CpuFeatures, dtype: DType, ptr: *const u8, out: &mut [f32]) {
    let n = out.len();
    if dtype == DType::F16 {
        #[cfg(target_arch = "x86_64")]
        if f.has_avx2() {
            // SAFETY: the CPU has AVX2 and F16C (the features say so); the row is readable.
            return unsafe { crate::kernels::simd::x86::widen_f16(ptr.cast(), out) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = f;
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: element `i < n` of the row.
            *o = fp16::f16_bits_to_f32(unsafe { ptr.cast::<u16>().add(i).read_unaligned() });
        }
    } else {
        // SAFETY: guaranteed by the caller.
        out.copy_from_slice(unsafe { f32_row(ptr, n) });
    }
}

/// Head `h`'s sink as one more score after the last cell (ggml adds it to the first chunk of
/// cells only): it weighs in the sum and no V row; the accumulator is f32 by then.
#[inline(always)]
pub(super) fn add_sink(
    sinks: &TensorView,
    h: usize,
    max: &mut f32,
    sum: &mut f32,
    acc: &mut [f32],
) {
    // SAFETY: element `h < n_head` of the dense f32 sinks vector (the support check makes its
    // length the head count).
    let s = unsafe { sinks.ptr.cast::<f32>().add(h).read_unaligned() };
    let (mut ms, mut vs) = (1.0f32, 1.0f32);
    if s > *max {
        ms = (*max - s).exp();
        *max = s;
        acc.iter_mut().for_each(|a| *a *= ms);
    } else {
        vs = (s - *max).exp();
    }
    // Two roundings: ggml's build does not fuse this update (its fixtures show it).
    *sum = *sum * ms + vs;
}

/// `acc / sum` (0 where the sum is 0: a row that saw no cell), as ggml scales the row.
#[inline(always)]
pub(super) fn normalise(acc: &[f32], sum: f32, out: &mut [f32]) {
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, &a) in out.iter_mut().zip(acc) {
        *o = a * inv;
    }
}
