//! FLASH_ATTN_EXT with ggml's semantics and the arithmetic of ggml-cpu's one-row kernel
//! (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`).
//!
//! For each query row: `q` is rounded to K's dot type (f16 for f16 K) and each `k·q` is ggml's
//! `vec_dot` of that type ([`vec_float::vec_dot`]); the score is scaled, soft-capped, masked
//! (ALiBi slope times the f16 mask; `-inf` skips the cell) and folded into an online softmax
//! whose V accumulator is f16 for f16 V (each step rounded to f16, as ggml's `vec_mad_f16`
//! and `vec_scale_f16` store it) and f32 otherwise; sinks join after the last cell; the row is
//! divided by the sum and written at `(head, query)`.
//!
//! Batches of at least 64 queries with K and V of one type take ggml's tiled kernel's
//! arithmetic instead ([`tiled_row`]): f32 throughout, cells in tiles of 64, scores and the
//! V accumulation as sequential FMA chains (ggml's `simd_gemm`), each tile's probabilities by
//! ggml's vectorised `exp` ([`vexp::soft_max_row`]).
//!
//! ggml-cpu has a third kernel, for one query over at least 512 cells, that splits the cells
//! between its threads and merges their partial sums: its rounding depends on ggml's thread
//! count, which this kernel cannot know, so on those shapes it agrees with ggml only to
//! rounding.

use crate::kernels::dots::float::{self as vec_float, Flavor};
use crate::kernels::fp16;
use crate::kernels::task;
use crate::kernels::task::{f32_row, scratch_slice, NodeTask, TensorView, ThreadCtx};
use crate::kernels::vexp;
use half::f16;
use rgml::{DType, Result};

/// Widen `n` elements of a dense f16 or f32 row at `ptr` into `out`.
///
/// # Safety
/// `ptr` must point at `n` readable elements of `dtype`.
#[inline(always)]
unsafe fn widen(dtype: DType, ptr: *const u8, n: usize, out: &mut [f32]) {
    if dtype == DType::F16 {
        // SAFETY: guaranteed by the caller.
        let h = unsafe { std::slice::from_raw_parts(ptr.cast::<u16>(), n) };
        for (o, &b) in out.iter_mut().zip(h) {
            *o = fp16::f16_bits_to_f32(b);
        }
    } else {
        // SAFETY: guaranteed by the caller.
        out[..n].copy_from_slice(unsafe { f32_row(ptr, n) });
    }
}

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// ggml's ALiBi slope of head `h` of `n_head`.
#[inline(always)]
fn slope(max_bias: f32, h: u32, n_head: u32) -> f32 {
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

/// The op's parameters.
pub(crate) struct FlashParams {
    pub scale: f32,
    pub max_bias: f32,
    pub softcap: f32,
    pub mask: bool,
    pub sinks: bool,
}

/// FLASH_ATTN_EXT: this thread's share of the query rows.
pub(crate) fn flash_attn_ext(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    p: &FlashParams,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if task.features.has_avx2() {
        // SAFETY: the features say the CPU has AVX2 and FMA.
        return unsafe { flash_attn_ext_fma(task, tc, p) };
    }
    flash_attn_ext_impl(task, tc, p)
}

/// [`flash_attn_ext_impl`] compiled with AVX2 and FMA, so its `mul_add`s are single FMA
/// instructions rather than calls (the results are the same: a fused multiply-add either way).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn flash_attn_ext_fma(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    p: &FlashParams,
) -> Result<()> {
    flash_attn_ext_impl(task, tc, p)
}

#[inline(always)]
fn flash_attn_ext_impl(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &FlashParams) -> Result<()> {
    let (dst, q, k, v) = (&task.dst, task.src(0)?, task.src(1)?, task.src(2)?);
    let mask = if p.mask { Some(task.src(3)?) } else { None };
    let sinks = if p.sinks {
        Some(task.src(if p.mask { 4 } else { 3 })?)
    } else {
        None
    };
    let (dk, dv) = (k.ne[0], v.ne[0]);
    let (n_q, n_head, n_kv) = (q.ne[1], q.ne[2], k.ne[1]);
    let scale = if p.softcap != 0.0 {
        p.scale / p.softcap
    } else {
        p.scale
    };
    let k_flavor = if k.dtype == DType::F16 {
        Flavor::F16
    } else {
        Flavor::F32
    };
    if n_q >= TILE && k.dtype == v.dtype {
        return tiled(task, tc, p, scale);
    }
    let scratch = scratch_slice(tc.scratch, 2 * dk + 2 * dv)?;
    let (q_q, rest) = scratch.split_at_mut(dk);
    let (k_row, rest) = rest.split_at_mut(dk);
    let (acc, v_row) = rest.split_at_mut(dv);
    let rows = n_q * n_head * q.ne[3];
    for r in task::split(rows, tc.ith, tc.nth) {
        let at = RowAt::of(r, q);
        let RowAt { iq1, iq2, iq3 } = at;
        let slope = slope(p.max_bias, iq2 as u32, n_head as u32);
        let (ik2, ik3) = at.kv_head(q, k);
        let (iv2, iv3) = at.kv_head(q, v);
        // SAFETY: a dense, in-bounds f32 row of `q` (the support table checks shapes).
        unsafe { widen(DType::F32, q.row(iq1, iq2, iq3), dk, q_q) };
        if k_flavor == Flavor::F16 {
            q_q.iter_mut().for_each(|x| *x = round_f16(*x));
        }
        acc.iter_mut().for_each(|a| *a = 0.0);
        let mask_row = mask.map(|m| m.row(iq1, iq2 % m.ne[2], iq3 % m.ne[3]));
        let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
        for ic in 0..n_kv {
            let mv = match mask_row {
                Some(m) => {
                    // SAFETY: element `ic < n_kv <= mask.ne0` of an in-bounds f16 mask row.
                    let bits = unsafe { m.cast::<u16>().add(ic).read_unaligned() };
                    slope * fp16::f16_bits_to_f32(bits)
                }
                None => 0.0,
            };
            if mv == f32::NEG_INFINITY {
                continue;
            }
            // SAFETY: cell `ic` of head `ik2` is a dense in-bounds row of `k`.
            unsafe { widen(k.dtype, k.row(ic, ik2, ik3), dk, k_row) };
            let mut s = vec_float::vec_dot(task.features, k_flavor, k_row, q_q) * scale;
            if p.softcap != 0.0 {
                s = p.softcap * s.tanh();
            }
            s += mv;
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if s > max {
                ms = (max - s).exp();
                max = s;
                scale_acc(acc, ms, v.dtype);
            } else {
                vs = (s - max).exp();
            }
            // SAFETY: cell `ic` of head `iv2` is a dense in-bounds row of `v`.
            unsafe { widen(v.dtype, v.row(ic, iv2, iv3), dv, v_row) };
            for (a, &x) in acc.iter_mut().zip(v_row.iter()) {
                let t = x.mul_add(vs, *a);
                *a = if v.dtype == DType::F16 {
                    round_f16(t)
                } else {
                    t
                };
            }
            sum = sum.mul_add(ms, vs);
        }
        if let Some(sk) = sinks {
            add_sink(sk, iq2, max, &mut sum, acc);
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        // SAFETY: row `(head iq2, query iq1)` of the dense f32 destination, written by this
        // thread only (rows are split between threads).
        let out = unsafe { task::f32_row_mut(dst.row(iq2, iq1, iq3), dv) };
        for (o, &a) in out.iter_mut().zip(acc.iter()) {
            *o = a * inv;
        }
    }
    Ok(())
}

/// Head `h`'s sink as one more score after the last cell: it weighs in the sum and no V row.
#[inline(always)]
fn add_sink(sinks: &task::TensorView, h: usize, max: f32, sum: &mut f32, acc: &mut [f32]) {
    // SAFETY: element `h < n_head` of the dense f32 sinks vector (the support table checks
    // its length).
    let s = unsafe { sinks.ptr.cast::<f32>().add(h).read_unaligned() };
    let (mut ms, mut vs) = (1.0f32, 1.0f32);
    if s > max {
        ms = (max - s).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
    } else {
        vs = (s - max).exp();
    }
    *sum = sum.mul_add(ms, vs);
}

/// ggml's tile of queries and of cells (`GGML_FA_TILE_Q`, `GGML_FA_TILE_KV`).
const TILE: usize = 64;

/// The tiled kernel: this thread's query rows, each by [`tiled_row`].
#[inline(always)]
fn tiled(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &FlashParams, scale: f32) -> Result<()> {
    let (dst, q) = (&task.dst, task.src(0)?);
    let (dk, dv) = (task.src(1)?.ne[0], task.src(2)?.ne[0]);
    let (n_q, n_head) = (q.ne[1], q.ne[2]);
    // q row, one K or V cell widened, the tile's scores, the accumulator.
    let need = dk + dk.max(dv) + TILE + dv;
    let scratch = scratch_slice(tc.scratch, need)?;
    let (q_row, rest) = scratch.split_at_mut(dk);
    let (cell, rest) = rest.split_at_mut(dk.max(dv));
    let (scores, acc) = rest.split_at_mut(TILE);
    let rows = n_q * n_head * q.ne[3];
    for r in task::split(rows, tc.ith, tc.nth) {
        let at = RowAt::of(r, q);
        let RowAt { iq1, iq2, iq3 } = at;
        // SAFETY: a dense, in-bounds f32 row of `q` (the support table checks shapes).
        unsafe { widen(DType::F32, q.row(iq1, iq2, iq3), dk, q_row) };
        tiled_row(task, p, scale, at, q_row, cell, scores, acc)?;
        // SAFETY: row `(head iq2, query iq1)` of the dense f32 destination, written by this
        // thread only (rows are split between threads).
        let out = unsafe { task::f32_row_mut(dst.row(iq2, iq1, iq3), dv) };
        out.copy_from_slice(acc);
    }
    Ok(())
}

/// A query row's indices: query, head, dim 3.
#[derive(Clone, Copy)]
struct RowAt {
    iq1: usize,
    iq2: usize,
    iq3: usize,
}

impl RowAt {
    /// Row `r` of `q`'s rows, counted query fastest, then head, then dim 3 (ggml's order).
    #[inline(always)]
    fn of(r: usize, q: &TensorView) -> RowAt {
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
    fn kv_head(self, q: &TensorView, kv: &TensorView) -> (usize, usize) {
        (
            self.iq2 / (q.ne[2] / kv.ne[2]),
            self.iq3 / (q.ne[3] / kv.ne[3]),
        )
    }
}

/// One query row as ggml's tiled kernel computes it, into `acc` (already divided by the sum).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tiled_row(
    task: &NodeTask,
    p: &FlashParams,
    scale: f32,
    at: RowAt,
    q_row: &[f32],
    cell: &mut [f32],
    scores: &mut [f32],
    acc: &mut [f32],
) -> Result<()> {
    let (q, k, v) = (task.src(0)?, task.src(1)?, task.src(2)?);
    let mask = if p.mask { Some(task.src(3)?) } else { None };
    let (dk, dv, n_kv, n_head) = (k.ne[0], v.ne[0], k.ne[1], q.ne[2]);
    let RowAt { iq1, iq2, iq3 } = at;
    let slope = slope(p.max_bias, iq2 as u32, n_head as u32);
    let (ik2, ik3) = at.kv_head(q, k);
    let (iv2, iv3) = at.kv_head(q, v);
    let mask_row = mask.map(|m| m.row(iq1, iq2 % m.ne[2], iq3 % m.ne[3]));
    acc.iter_mut().for_each(|a| *a = 0.0);
    let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
    for ic in (0..n_kv).step_by(TILE) {
        let n = TILE.min(n_kv - ic);
        for (t, sc) in scores.iter_mut().enumerate() {
            if t >= n {
                *sc = f32::NEG_INFINITY;
                continue;
            }
            // SAFETY: cell `ic + t < n_kv` of head `ik2` is a dense in-bounds row of `k`.
            unsafe { widen(k.dtype, k.row(ic + t, ik2, ik3), dk, cell) };
            // `simd_gemm`: one FMA chain over the dimensions, from zero.
            let dot = cell[..dk]
                .iter()
                .zip(q_row)
                .fold(0.0f32, |a, (&kx, &qx)| qx.mul_add(kx, a));
            let mut s = dot * scale;
            if p.softcap != 0.0 {
                s = s.tanh() * p.softcap;
            }
            if let Some(m) = mask_row {
                // SAFETY: element `ic + t < n_kv <= mask.ne0` of an in-bounds f16 mask row.
                let bits = unsafe { m.cast::<u16>().add(ic + t).read_unaligned() };
                s += slope * fp16::f16_bits_to_f32(bits);
            }
            *sc = s;
        }
        let tile_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if tile_max == f32::NEG_INFINITY {
            continue;
        }
        let new_max = max.max(tile_max);
        if new_max > max {
            let ms = (max - new_max).exp();
            acc.iter_mut().for_each(|a| *a *= ms);
            sum *= ms;
        }
        max = new_max;
        sum = (f64::from(sum) + vexp::soft_max_row(task.features, scores, max)) as f32;
        for (t, &w) in scores.iter().enumerate().take(n) {
            // SAFETY: cell `ic + t < n_kv` of head `iv2` is a dense in-bounds row of `v`.
            unsafe { widen(v.dtype, v.row(ic + t, iv2, iv3), dv, cell) };
            for (a, &x) in acc.iter_mut().zip(&cell[..dv]) {
                *a = w.mul_add(x, *a);
            }
        }
    }
    if p.sinks {
        add_sink(
            task.src(if p.mask { 4 } else { 3 })?,
            iq2,
            max,
            &mut sum,
            acc,
        );
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    acc.iter_mut().for_each(|a| *a *= inv);
    Ok(())
}

/// The accumulator times `ms`, rounded to f16 at each element for an f16 V (ggml's
/// `vec_scale_f16` stores f16).
#[inline(always)]
fn scale_acc(acc: &mut [f32], ms: f32, v_dtype: DType) {
    for a in acc.iter_mut() {
        let t = *a * ms;
        *a = if v_dtype == DType::F16 {
            round_f16(t)
        } else {
            t
        };
    }
}

/// Whether the task's shapes are ones [`flash_attn_ext`] reads in bounds.
pub(crate) fn supported(dst: &rgml::Tensor, s: &[&rgml::Tensor], mask: bool, sinks: bool) -> bool {
    let n = 3 + usize::from(mask) + usize::from(sinks);
    if s.len() != n {
        return false;
    }
    let (q, k, v) = (s[0], s[1], s[2]);
    let dense = |t: &rgml::Tensor| t.rows_contiguous();
    q.dtype == DType::F32
        && matches!(k.dtype, DType::F32 | DType::F16)
        && matches!(v.dtype, DType::F32 | DType::F16)
        && dense(q)
        && dense(k)
        && dense(v)
        && dst.dtype == DType::F32
        && dst.is_contiguous()
        && k.ne[0] == q.ne[0]
        && v.ne[1] == k.ne[1]
        && k.ne[2] > 0
        && v.ne[2] > 0
        && q.ne[2].is_multiple_of(k.ne[2])
        && q.ne[2].is_multiple_of(v.ne[2])
        && k.ne[3] == q.ne[3]
        && v.ne[3] == q.ne[3]
        && dst.ne == [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]
        && (!mask || {
            let m = s[3];
            m.dtype == DType::F16
                && m.rows_contiguous()
                && m.ne[0] >= k.ne[1]
                && m.ne[1] >= q.ne[1]
                && m.ne[2] > 0
                && m.ne[3] > 0
                && q.ne[2].is_multiple_of(m.ne[2])
                && q.ne[3].is_multiple_of(m.ne[3])
        })
        && (!sinks || {
            let sk = s[n - 1];
            sk.dtype == DType::F32 && sk.ne[0] == q.ne[2] && sk.rows_contiguous()
        })
}
