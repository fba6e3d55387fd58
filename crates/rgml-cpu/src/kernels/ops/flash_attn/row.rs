//! ggml-cpu's one-row kernel (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`), and its use
//! for one query over many cells, split between threads (`use_split_kv_path`, merged by
//! `ggml_flash_attn_ext_reduce_partials`).
//!
//! For each query row: `q` is converted to K's vec-dot type as ggml converts it (rounded to f16
//! for f16 K, quantized as ggml-cpu quantizes activations for Q8_0 and Q4_0 K) and each `k·q`
//! is ggml's `vec_dot` of K's type; the score is scaled, soft-capped and masked (ALiBi slope
//! times the f16 mask; `-inf` skips the cell) and folded into an online softmax whose V
//! accumulator is f16 for f16 V (each step rounded to f16, as ggml's `vec_mad_f16` and
//! `vec_scale_f16` store it) and f32 otherwise (quantized V rows dequantized first).

use super::common::{add_sink, mask_value, normalise, slope, widen, FlashParams, RowAt, Sources};
use crate::kernels::blocks::activations::quantize_activations;
use crate::kernels::blocks::convert::{round_through_f16, row_to_f32};
use crate::kernels::dots::float::{self as vec_float, Flavor};
use crate::kernels::dots::vec_dot;
use crate::kernels::fp16;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::task::{self, bytes, scratch_slice, NodeTask, ThreadCtx};
use rgml::{DType, Error, Result};
use std::ops::Range;

/// f32 values of per-thread scratch the one-row kernel needs.
pub(super) fn scratch_floats(dk: usize, dv: usize) -> usize {
    2 * dk + 2 * dv + dv.div_ceil(2)
}

/// Bytes of the shared area the split needs: per head and chunk, the max, the sum and the
/// unnormalised accumulator.
pub(super) fn partials_bytes(n_head: usize, dv: usize, chunks: usize) -> Option<usize> {
    n_head
        .checked_mul(chunks)?
        .checked_mul(2 + dv)?
        .checked_mul(4)
}

/// One row's scratch: q converted for K's dot, one K and one V row widened, the accumulator
/// (f32; and f16 where the build mirrored computes in f16).
struct RowScratch<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    acc: &'a mut [f32],
    acc16: &'a mut [u16],
}

impl RowScratch<'_> {
    fn of<'s>(scratch: &'s mut [f32], dk: usize, dv: usize) -> Result<RowScratch<'s>> {
        let s = scratch_slice(scratch, scratch_floats(dk, dv))?;
        let (q, rest) = s.split_at_mut(dk);
        let (k, rest) = rest.split_at_mut(dk);
        let (acc, rest) = rest.split_at_mut(dv);
        let (v, rest) = rest.split_at_mut(dv);
        let acc16 = &mut bytemuck::cast_slice_mut::<f32, u16>(rest)[..dv];
        Ok(RowScratch {
            q,
            k,
            v,
            acc,
            acc16,
        })
    }
}

/// Softmax state of a row over some cells: the largest score and the sum of `exp(s - max)`
/// (the weighted V rows are in the scratch's accumulator).
struct Folded {
    max: f32,
    sum: f32,
}

/// The plain path: this thread's query rows, each folded over every cell.
#[inline(always)]
pub(super) fn rows(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &FlashParams) -> Result<()> {
    let src = Sources::of(task, p)?;
    let (dk, dv, n_kv) = (src.k.ne[0], src.v.ne[0], src.k.ne[1]);
    let mut s = RowScratch::of(tc.scratch, dk, dv)?;
    for r in task::split(src.rows(), tc.ith, tc.nth) {
        let at = RowAt::of(r, src.q);
        let mut f = fold(task.features, &src, p, at, 0..n_kv, &mut s)?;
        if let Some(sinks) = src.sinks {
            add_sink(sinks, at.iq2, &mut f.max, &mut f.sum, s.acc);
        }
        // SAFETY: row `(head iq2, query iq1)` of the dense f32 destination, written by this
        // thread only (rows are split between threads).
        let out = unsafe { task::f32_row_mut(task.dst.row(at.iq2, at.iq1, at.iq3), dv) };
        normalise(s.acc, f.sum, out);
    }
    Ok(())
}

/// One query over many cells: the cells in `task.threads` chunks (ggml's thread count, so
/// the sums group as there), each chunk's per-head state into the shared area, then after a
/// barrier each head's chunks merged in order.
#[inline(always)]
pub(super) fn split_cells(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &FlashParams) -> Result<()> {
    let src = Sources::of(task, p)?;
    let (dk, dv, n_kv, n_head) = (src.k.ne[0], src.v.ne[0], src.k.ne[1], src.q.ne[2]);
    let chunks = task.threads.max(1);
    let chunk = n_kv.div_ceil(chunks);
    let need = partials_bytes(n_head, dv, chunks).filter(|&b| b <= tc.shared.len);
    if need.is_none() || tc.shared.ptr.align_offset(4) != 0 {
        return Err(Error::Backend {
            backend: "CPU".into(),
            message: "FLASH_ATTN_EXT: the work area has no room for the partial sums".into(),
        });
    }
    let partial = |h: usize, c: usize| tc.shared.at(4 * (h * chunks + c) * (2 + dv)).cast::<f32>();
    let mut s = RowScratch::of(tc.scratch, dk, dv)?;
    for c in (tc.ith..chunks).step_by(tc.nth) {
        let cells = (c * chunk).min(n_kv)..((c + 1) * chunk).min(n_kv);
        for h in 0..n_head {
            // SAFETY: partial `(h, c)` lies in the shared area (checked above: `need` bytes
            // fit, 4-byte aligned) and chunk `c` belongs to this thread alone; nobody reads the
            // partials before the barrier below.
            let out = unsafe { std::slice::from_raw_parts_mut(partial(h, c), 2 + dv) };
            if cells.is_empty() {
                (out[0], out[1]) = (f32::NEG_INFINITY, 0.0);
                continue;
            }
            let at = RowAt {
                iq1: 0,
                iq2: h,
                iq3: 0,
            };
            let mut f = fold(task.features, &src, p, at, cells.clone(), &mut s)?;
            if let (Some(sinks), 0) = (src.sinks, c) {
                add_sink(sinks, h, &mut f.max, &mut f.sum, s.acc);
            }
            (out[0], out[1]) = (f.max, f.sum);
            out[2..].copy_from_slice(s.acc);
        }
    }
    tc.barrier.wait();
    for h in (tc.ith..n_head).step_by(tc.nth) {
        // SAFETY: every partial was written before the barrier and nobody writes them now.
        let parts = (0..chunks)
            .filter(|&c| c * chunk < n_kv)
            .map(|c| unsafe { std::slice::from_raw_parts(partial(h, c).cast_const(), 2 + dv) });
        let (sum, acc) = merge(parts, s.acc);
        // SAFETY: head `h`'s row of the dense f32 destination (one query), written by this
        // thread only (heads are split between threads).
        let out = unsafe { task::f32_row_mut(task.dst.row(h, 0, 0), dv) };
        normalise(acc, sum, out);
    }
    Ok(())
}

/// The chunks' states merged in order into `acc` (as `ggml_flash_attn_ext_reduce_partials`):
/// returns the total sum and the unnormalised accumulator.
#[inline(always)]
fn merge<'a>(parts: impl Iterator<Item = &'a [f32]>, acc: &'a mut [f32]) -> (f32, &'a [f32]) {
    acc.iter_mut().for_each(|a| *a = 0.0);
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for part in parts {
        let (m, s, v) = (part[0], part[1], &part[2..]);
        if s == 0.0 {
            continue;
        }
        let new_max = max.max(m);
        let (scale_old, scale_new) = ((max - new_max).exp(), (m - new_max).exp());
        // GCC contracts `a * b + c * d` into `fma(a, b, c * d)`.
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = a.mul_add(scale_old, x * scale_new);
        }
        sum = sum.mul_add(scale_old, s * scale_new);
        max = new_max;
    }
    (sum, acc)
}

/// Row `at` folded over `cells` into `s.acc` (zeroed first); for f16 V the accumulator holds
/// f16 values, widened.
#[inline(always)]
fn fold(
    f: CpuFeatures,
    src: &Sources<'_>,
    p: &FlashParams,
    at: RowAt,
    cells: Range<usize>,
    s: &mut RowScratch<'_>,
) -> Result<Folded> {
    let (q, k, v) = (src.q, src.k, src.v);
    let n_head = q.ne[2];
    let slope = slope(p.max_bias, at.iq2 as u32, n_head as u32);
    let (ik2, ik3) = at.kv_head(q, k);
    let (iv2, iv3) = at.kv_head(q, v);
    // SAFETY: a dense, in-bounds f32 row of `q` (the support check makes q's rows dense).
    unsafe { widen(f, DType::F32, q.row(at.iq1, at.iq2, at.iq3), s.q) };
    let query = convert_q(f, k.dtype, s)?;
    s.acc.iter_mut().for_each(|a| *a = 0.0);
    s.acc16.iter_mut().for_each(|a| *a = 0);
    // ggml's f16 accumulator in half-precision arithmetic (see `CpuFeatures::f16_vectors`)
    // where rows have a whole step of it; shorter rows are all leftovers, computed as without
    // it (f32, rounded), which the general path does faster.
    let native16 = v.dtype == DType::F16 && f.f16_vectors() && v.ne[0] >= f16_vectors::STEP;
    let mask_row = src.mask_row(at);
    let scale = p.score_scale();
    let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
    for ic in cells {
        // SAFETY: `ic < n_kv <= mask.ne0` (the support check) of an in-bounds mask row.
        let mv = mask_row.map_or(0.0, |m| slope * unsafe { mask_value(m, ic) });
        if mv == f32::NEG_INFINITY {
            continue;
        }
        let mut score = key_dot(f, k, k.row(ic, ik2, ik3), query, s)? * scale;
        if p.softcap != 0.0 {
            score = p.softcap * score.tanh();
        }
        score += mv;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if score > max {
            ms = (max - score).exp();
            max = score;
            match native16 {
                true => f16_vectors::scale(s.acc16, ms),
                false => scale_acc(f, s.acc, ms, v.dtype),
            }
        } else {
            vs = (score - max).exp();
        }
        match native16 {
            true => f16_vectors::mad(s.acc16, v.row(ic, iv2, iv3), vs),
            false => add_value_row(f, v, v.row(ic, iv2, iv3), vs, s.v, s.acc)?,
        }
        sum = sum.mul_add(ms, vs);
    }
    if native16 {
        for (a, &h) in s.acc.iter_mut().zip(s.acc16.iter()) {
            *a = fp16::f16_bits_to_f32(h);
        }
    }
    Ok(Folded { max, sum })
}

/// How the converted query row is held for K's dot.
#[derive(Clone, Copy)]
enum QueryFor {
    /// f32 values in the scratch's `q` (rounded to f16 for f16 K); its `k` widens each K row.
    Float(Flavor),
    /// This many bytes of K's vec-dot type at the start of the scratch's `k`.
    Quantized(usize),
}

/// Convert the scratch's `q` as ggml converts it for K's dot (`from_float` of K's vec-dot
/// type).
#[inline(always)]
fn convert_q(f: CpuFeatures, k_dtype: DType, s: &mut RowScratch<'_>) -> Result<QueryFor> {
    match k_dtype {
        DType::F32 => Ok(QueryFor::Float(Flavor::F32)),
        DType::F16 => {
            round_through_f16(s.q);
            Ok(QueryFor::Float(Flavor::F16))
        }
        quant => {
            let dot_type = quant.vec_dot_type();
            let len = dot_type.row_bytes(s.q.len())?;
            let out = bytemuck::cast_slice_mut::<f32, u8>(s.k);
            let out = out.get_mut(..len).ok_or_else(|| Error::Backend {
                backend: "CPU".into(),
                message: format!("FLASH_ATTN_EXT: no room for q as {dot_type}"),
            })?;
            quantize_activations(f, dot_type, s.q, out)?;
            Ok(QueryFor::Quantized(len))
        }
    }
}

/// ggml's `vec_dot` of K's type between the K row at `k_row` and the converted query.
#[inline(always)]
fn key_dot(
    f: CpuFeatures,
    k: &task::TensorView,
    k_row: *const u8,
    query: QueryFor,
    s: &mut RowScratch<'_>,
) -> Result<f32> {
    match query {
        QueryFor::Float(flavor) => {
            // SAFETY: a dense, in-bounds row of `k` (the support check makes its rows dense).
            unsafe { widen(f, k.dtype, k_row, s.k) };
            Ok(vec_float::vec_dot(f, flavor, s.k, s.q))
        }
        QueryFor::Quantized(len) => {
            // SAFETY: a dense, in-bounds row of `k`, `row_bytes` long.
            let k_bytes = unsafe { bytes(k_row, k.row_bytes()) };
            let q_bytes = &bytemuck::cast_slice::<f32, u8>(s.k)[..len];
            vec_dot(f, k.dtype, k.ne[0], k_bytes, q_bytes)
        }
    }
}

/// `acc += v_row * w` (ggml's `vec_mad`): rounded to f16 at each element for an f16 V.
#[inline(always)]
fn add_value_row(
    f: CpuFeatures,
    v: &task::TensorView,
    v_row: *const u8,
    w: f32,
    widened: &mut [f32],
    acc: &mut [f32],
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if v.dtype == DType::F16 && f.has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (the features say so); `v_row` is a dense,
        // in-bounds f16 row of `acc.len()` values (the support check makes V's rows dense).
        unsafe { crate::kernels::simd::x86::mad_f16_rounded(acc, v_row.cast(), w) };
        return Ok(());
    }
    match v.dtype {
        // SAFETY: a dense, in-bounds row of `v` (the support check makes its rows dense).
        DType::F16 | DType::F32 => unsafe { widen(f, v.dtype, v_row, widened) },
        // SAFETY: as above, `row_bytes` long.
        t => row_to_f32(t, unsafe { bytes(v_row, v.row_bytes()) }, widened)?,
    }
    for (a, &x) in acc.iter_mut().zip(widened.iter()) {
        *a = x.mul_add(w, *a);
    }
    if v.dtype == DType::F16 {
        round_through_f16(acc);
    }
    Ok(())
}

/// The accumulator times `ms`, rounded to f16 at each element for an f16 V (ggml's
/// `vec_scale_f16` stores f16).
#[inline(always)]
fn scale_acc(f: CpuFeatures, acc: &mut [f32], ms: f32, v_dtype: DType) {
    #[cfg(target_arch = "x86_64")]
    if v_dtype == DType::F16 && f.has_avx2() {
        // SAFETY: the CPU has AVX2 and F16C (the features say so).
        unsafe { crate::kernels::simd::x86::scale_f16_rounded(acc, ms) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = f;
    acc.iter_mut().for_each(|a| *a *= ms);
    if v_dtype == DType::F16 {
        round_through_f16(acc);
    }
}

/// ggml's `vec_mad_f16` and `vec_scale_f16` as a build with `__AVX512FP16__` computes them:
/// whole steps of 128 elements in f16 vectors (the f32 weight rounded to f16, each lane one
/// f16 operation), the rest in f32, rounded to f16. Only called where
/// [`CpuFeatures::f16_vectors`] holds, which promises the instructions.
mod f16_vectors {
    use crate::kernels::fp16;
    use half::f16;

    /// ggml's `GGML_F16_STEP` with AVX512-FP16.
    pub(super) const STEP: usize = 128;

    /// `acc += v_row * w`, `v_row` an f16 row of `acc.len()` values.
    #[inline(always)]
    pub(super) fn mad(acc: &mut [u16], v_row: *const u8, w: f32) {
        let np = acc.len() - acc.len() % STEP;
        let x = v_row.cast::<u16>();
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `f16_vectors` holds (the caller's promise), so the CPU has AVX512-FP16, F and
        // BW; `v_row` is a dense, in-bounds f16 row of `acc.len() >= np` values.
        unsafe {
            crate::kernels::simd::fp16::fma(&mut acc[..np], x, f16::from_f32(w).to_bits())
        };
        for (i, a) in acc.iter_mut().enumerate().skip(np) {
            // SAFETY: element `i < acc.len()` of the row.
            let xv = fp16::f16_bits_to_f32(unsafe { x.add(i).read_unaligned() });
            *a = f16::from_f32(xv.mul_add(w, fp16::f16_bits_to_f32(*a))).to_bits();
        }
    }

    /// `acc *= w`.
    #[inline(always)]
    pub(super) fn scale(acc: &mut [u16], w: f32) {
        let np = acc.len() - acc.len() % STEP;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `f16_vectors` holds (the caller's promise): the CPU has AVX512-FP16, F, BW.
        unsafe {
            crate::kernels::simd::fp16::mul(&mut acc[..np], f16::from_f32(w).to_bits())
        };
        for a in acc.iter_mut().skip(np) {
            *a = f16::from_f32(fp16::f16_bits_to_f32(*a) * w).to_bits();
        }
    }
}
