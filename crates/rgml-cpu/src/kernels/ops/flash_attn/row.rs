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
//!
//! Query heads that read the same K and V head (grouped-query attention) are folded together,
//! up to [`MAX_GROUP`] per pass over the cells: each K and V row is read from memory once for
//! the group instead of once per head, and each head's operations stay those of its row alone.
//! f16 K rows are dotted in place ([`vec_float::vec_dot_f16_in_place`]), not widened first.

#[cfg(target_arch = "x86_64")]
use super::block;
use super::common::{
    add_sink, mask_value, normalise, slope, widen, FlashParams, Folded, RowAt, Sources,
};
use crate::kernels::blocks::activations::quantize_activations;
use crate::kernels::blocks::convert::{round_through_f16, row_to_f32};
use crate::kernels::dots::float::{self as vec_float, Flavor};
use crate::kernels::dots::vec_dot;
use crate::kernels::fp16;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::prefetch_span;
use crate::kernels::task::{self, bytes, scratch_slice, NodeTask, ThreadCtx};
use rgml::{DType, Error, Result};
use std::ops::Range;

/// The most query heads folded together over one pass of the cells: heads that read the same
/// K and V head (grouped-query attention) share each K and V row while it is in L1.
const MAX_GROUP: usize = 8;

/// How many cells ahead of the one being folded its K and V rows are prefetched. A head's rows
/// lie one cache row apart (all heads' K of a cell, then the next cell's), a stride the
/// hardware prefetcher does not follow far enough: without it a Zen 3 spent most of its
/// decoding time at depth 4096 waiting for K and V rows from DRAM.
const CELLS_AHEAD: usize = 8;

/// f32 values of per-thread scratch the one-row kernel needs: a K and a V row widened, and per
/// head of a group the query as f32 and as K's vec-dot type, and the accumulator (f32, and f16).
pub(super) fn scratch_floats(dk: usize, dv: usize) -> usize {
    dk + dv + MAX_GROUP * head_floats(dk, dv)
}

fn head_floats(dk: usize, dv: usize) -> usize {
    2 * dk + dv + dv.div_ceil(2)
}

/// Bytes of the shared area the split needs: per head and chunk, the max, the sum and the
/// unnormalised accumulator.
pub(super) fn partials_bytes(n_head: usize, dv: usize, chunks: usize) -> Option<usize> {
    n_head
        .checked_mul(chunks)?
        .checked_mul(2 + dv)?
        .checked_mul(4)
}

/// A group's scratch: one K and one V row widened (for the types read through f32), and each
/// head's part (see [`HeadScratch`]).
struct GroupScratch<'a> {
    k: &'a mut [f32],
    v: &'a mut [f32],
    heads: &'a mut [f32],
    dk: usize,
    dv: usize,
}

/// One head's query (f32; and converted for K's dot, in `q_dot`) and accumulator (f32, and
/// f16 where the build mirrored computes in f16).
struct HeadScratch<'a> {
    q: &'a mut [f32],
    q_dot: &'a mut [f32],
    acc: &'a mut [f32],
    acc16: &'a mut [u16],
}

impl GroupScratch<'_> {
    fn of(scratch: &mut [f32], dk: usize, dv: usize) -> Result<GroupScratch<'_>> {
        let s = scratch_slice(scratch, scratch_floats(dk, dv))?;
        let (k, rest) = s.split_at_mut(dk);
        let (v, heads) = rest.split_at_mut(dv);
        Ok(GroupScratch {
            k,
            v,
            heads,
            dk,
            dv,
        })
    }

    /// Head `g`'s part (`g < MAX_GROUP`), and the shared K and V rows.
    #[inline(always)]
    fn head(&mut self, g: usize) -> (HeadScratch<'_>, &mut [f32], &mut [f32]) {
        let n = head_floats(self.dk, self.dv);
        let part = &mut self.heads[g * n..(g + 1) * n];
        let (q, rest) = part.split_at_mut(self.dk);
        let (q_dot, rest) = rest.split_at_mut(self.dk);
        let (acc, rest) = rest.split_at_mut(self.dv);
        let acc16 = &mut bytemuck::cast_slice_mut::<f32, u16>(rest)[..self.dv];
        let head = HeadScratch {
            q,
            q_dot,
            acc,
            acc16,
        };
        (head, &mut *self.k, &mut *self.v)
    }
}

/// Query heads `first..first + len` of one query that read the same K and V head.
#[derive(Clone, Copy)]
struct Group {
    at: RowAt,
    len: usize,
}

impl Group {
    /// How many consecutive heads a group holds: the largest divisor of the heads per K head
    /// and per V head up to [`MAX_GROUP`], so no group straddles two K or V heads.
    fn size(src: &Sources<'_>) -> usize {
        let n_head = src.q.ne[2];
        let (per_k, per_v) = (n_head / src.k.ne[2], n_head / src.v.ne[2]);
        (1..=MAX_GROUP)
            .rev()
            .find(|g| per_k.is_multiple_of(*g) && per_v.is_multiple_of(*g))
            .unwrap_or(1)
    }

    /// Group `i` of `q`'s groups of `size` heads, counted query fastest, then group, then
    /// dim 3 (ggml's row order).
    fn nth(i: usize, size: usize, q: &task::TensorView) -> Group {
        let n_q = q.ne[1];
        let per_slice = n_q * (q.ne[2] / size);
        let iq3 = i / per_slice;
        let ig = (i % per_slice) / n_q;
        Group {
            at: RowAt {
                iq1: i % n_q,
                iq2: ig * size,
                iq3,
            },
            len: size,
        }
    }

    fn head(self, g: usize) -> RowAt {
        RowAt {
            iq2: self.at.iq2 + g,
            ..self.at
        }
    }
}

/// The plain path: this thread's groups of query rows, each folded over every cell.
#[inline(always)]
pub(super) fn rows(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &FlashParams) -> Result<()> {
    let src = Sources::of(task, p)?;
    let (dk, dv, n_kv) = (src.k.ne[0], src.v.ne[0], src.k.ne[1]);
    let size = Group::size(&src);
    let mut s = GroupScratch::of(tc.scratch, dk, dv)?;
    for i in task::split(src.rows() / size, tc.ith, tc.nth) {
        let group = Group::nth(i, size, src.q);
        let mut folded = fold(task.features, &src, p, group, 0..n_kv, &mut s)?;
        for (g, f) in folded.iter_mut().enumerate().take(group.len) {
            let at = group.head(g);
            let (h, _, _) = s.head(g);
            if let Some(sinks) = src.sinks {
                add_sink(sinks, at.iq2, &mut f.max, &mut f.sum, h.acc);
            }
            // SAFETY: row `(head iq2, query iq1)` of the dense f32 destination, written by
            // this thread only (groups of rows are split between threads).
            let out = unsafe { task::f32_row_mut(task.dst.row(at.iq2, at.iq1, at.iq3), dv) };
            normalise(h.acc, f.sum, out);
        }
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
    let size = Group::size(&src);
    let mut s = GroupScratch::of(tc.scratch, dk, dv)?;
    for c in (tc.ith..chunks).step_by(tc.nth) {
        let cells = (c * chunk).min(n_kv)..((c + 1) * chunk).min(n_kv);
        for i in 0..n_head / size {
            let group = Group::nth(i, size, src.q);
            let mut folded = match cells.is_empty() {
                true => {
                    [Folded {
                        max: f32::NEG_INFINITY,
                        sum: 0.0,
                    }; MAX_GROUP]
                }
                false => fold(task.features, &src, p, group, cells.clone(), &mut s)?,
            };
            for (g, f) in folded.iter_mut().enumerate().take(group.len) {
                let h = group.head(g).iq2;
                let (head, _, _) = s.head(g);
                if let (Some(sinks), 0, false) = (src.sinks, c, cells.is_empty()) {
                    add_sink(sinks, h, &mut f.max, &mut f.sum, head.acc);
                }
                // SAFETY: partial `(h, c)` lies in the shared area (checked above: `need`
                // bytes fit, 4-byte aligned) and chunk `c` belongs to this thread alone;
                // nobody reads the partials before the barrier below.
                let out = unsafe { std::slice::from_raw_parts_mut(partial(h, c), 2 + dv) };
                (out[0], out[1]) = (f.max, f.sum);
                if !cells.is_empty() {
                    out[2..].copy_from_slice(head.acc);
                }
            }
        }
    }
    tc.barrier.wait();
    let (merged, _, _) = s.head(0);
    for h in (tc.ith..n_head).step_by(tc.nth) {
        // SAFETY: every partial was written before the barrier and nobody writes them now.
        let parts = (0..chunks)
            .filter(|&c| c * chunk < n_kv)
            .map(|c| unsafe { std::slice::from_raw_parts(partial(h, c).cast_const(), 2 + dv) });
        let (sum, acc) = merge(parts, merged.acc);
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

/// A head's fixed part of the fold: its query converted for K's dot, its mask row and slope.
#[derive(Clone, Copy)]
struct HeadSetup {
    query: QueryFor,
    mask_row: Option<*const u8>,
    slope: f32,
}

/// The group's rows folded over `cells`, each into its head's accumulator (zeroed first; for
/// f16 V it holds f16 values, widened). Every head's operations are those of ggml's one-row
/// kernel for that row alone; the heads only share the reading of each K and V row.
#[inline(always)]
fn fold(
    f: CpuFeatures,
    src: &Sources<'_>,
    p: &FlashParams,
    group: Group,
    cells: Range<usize>,
    s: &mut GroupScratch<'_>,
) -> Result<[Folded; MAX_GROUP]> {
    let (q, k, v) = (src.q, src.k, src.v);
    let (ik2, ik3) = group.at.kv_head(q, k);
    let (iv2, iv3) = group.at.kv_head(q, v);
    let mut setup = [HeadSetup {
        query: QueryFor::Float(Flavor::F32),
        mask_row: None,
        slope: 1.0,
    }; MAX_GROUP];
    for (g, hs) in setup.iter_mut().enumerate().take(group.len) {
        let at = group.head(g);
        let (h, _, _) = s.head(g);
        // SAFETY: a dense, in-bounds f32 row of `q` (the support check makes q's rows dense).
        unsafe { widen(f, DType::F32, q.row(at.iq1, at.iq2, at.iq3), h.q) };
        *hs = HeadSetup {
            query: convert_q(f, k.dtype, h.q, h.q_dot)?,
            mask_row: src.mask_row(at),
            slope: slope(p.max_bias, at.iq2 as u32, q.ne[2] as u32),
        };
        h.acc.iter_mut().for_each(|a| *a = 0.0);
        h.acc16.iter_mut().for_each(|a| *a = 0);
    }
    // ggml's f16 accumulator in half-precision arithmetic (see `CpuFeatures::f16_vectors`)
    // where rows have a whole step of it; shorter rows are all leftovers, computed as without
    // it (f32, rounded), which the general path does faster.
    let native16 = v.dtype == DType::F16 && f.f16_vectors() && v.ne[0] >= f16_vectors::STEP;
    let scale = p.score_scale();
    let mut state = [Folded {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    }; MAX_GROUP];
    #[cfg(target_arch = "x86_64")]
    if k.dtype == DType::F16 && v.dtype == DType::F16 && !native16 && f.has_avx2() {
        let scoring = block::Scoring {
            scale,
            softcap: p.softcap,
        };
        let heads = &setup[..group.len];
        // SAFETY: the features say the CPU has AVX2, FMA and F16C; K's and V's heads
        // `(ik2, ik3)` and `(iv2, iv3)` are in bounds (`kv_head` of an in-bounds row).
        unsafe {
            fold_blocks(
                f,
                (k, v),
                [ik2, ik3, iv2, iv3],
                cells,
                heads,
                &mut state,
                s,
                scoring,
            )
        };
        return Ok(state);
    }
    let end = cells.end;
    for ic in cells {
        if ic + CELLS_AHEAD < end {
            prefetch_span(k.row(ic + CELLS_AHEAD, ik2, ik3), k.row_bytes());
            prefetch_span(v.row(ic + CELLS_AHEAD, iv2, iv3), v.row_bytes());
        }
        let (k_row, v_row) = (k.row(ic, ik2, ik3), v.row(ic, iv2, iv3));
        let (mut k_widened, mut v_widened) = (false, false);
        for (g, (hs, st)) in setup
            .iter()
            .zip(state.iter_mut())
            .enumerate()
            .take(group.len)
        {
            // SAFETY: `ic < n_kv <= mask.ne0` (the support check) of an in-bounds mask row.
            let mv = hs
                .mask_row
                .map_or(0.0, |m| hs.slope * unsafe { mask_value(m, ic) });
            if mv == f32::NEG_INFINITY {
                continue;
            }
            let (h, kw, vw) = s.head(g);
            let dot = key_dot(f, k, k_row, hs.query, &h, kw, &mut k_widened)?;
            let max_before = st.max;
            let (ms, vs) = st.fold_cell(dot, scale, p.softcap, mv);
            if st.max != max_before {
                match native16 {
                    true => f16_vectors::scale(h.acc16, ms),
                    false => scale_acc(f, h.acc, ms, v.dtype),
                }
            }
            match native16 {
                true => f16_vectors::mad(h.acc16, v_row, vs),
                false => add_value_row(f, v, v_row, vs, vw, &mut v_widened, h.acc)?,
            }
        }
    }
    if native16 {
        for g in 0..group.len {
            let (h, _, _) = s.head(g);
            for (a, &b) in h.acc.iter_mut().zip(h.acc16.iter()) {
                *a = fp16::f16_bits_to_f32(b);
            }
        }
    }
    Ok(state)
}

/// [`fold`] for f16 K and V on the AVX2 build: the cells in blocks of [`block::CELLS`], each
/// block folded into every head of the group in turn, the next block's K and V rows prefetched.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `kv` are in-bounds heads (and dim-3 indices) of
/// K and V, whose rows are dense f16 rows of the heads' query and accumulator lengths; `cells`
/// lie within K's cells and every head's mask row.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fold_blocks(
    f: CpuFeatures,
    (k, v): (&task::TensorView, &task::TensorView),
    [ik2, ik3, iv2, iv3]: [usize; 4],
    cells: Range<usize>,
    heads: &[HeadSetup],
    state: &mut [Folded; MAX_GROUP],
    s: &mut GroupScratch<'_>,
    scoring: block::Scoring,
) {
    let end = cells.end;
    for first in cells.step_by(block::CELLS) {
        let len = block::CELLS.min(end - first);
        for ic in (first + CELLS_AHEAD)..(first + CELLS_AHEAD + block::CELLS).min(end) {
            prefetch_span(k.row(ic, ik2, ik3), k.row_bytes());
            prefetch_span(v.row(ic, iv2, iv3), v.row_bytes());
        }
        let (mut k_rows, mut v_rows) = (
            [std::ptr::null(); block::CELLS],
            [std::ptr::null(); block::CELLS],
        );
        for (c, (kr, vr)) in k_rows.iter_mut().zip(v_rows.iter_mut()).enumerate() {
            let ic = first + c.min(len - 1);
            *kr = k.row(ic, ik2, ik3).cast::<u16>().cast_const();
            *vr = v.row(ic, iv2, iv3).cast::<u16>().cast_const();
        }
        for (g, (hs, st)) in heads.iter().zip(state.iter_mut()).enumerate() {
            let (h, _, _) = s.head(g);
            let head = block::HeadBlock {
                q: h.q,
                acc: h.acc,
                mask_row: hs.mask_row,
                slope: hs.slope,
            };
            // SAFETY: the rows and the mask row are as the caller promises; the query was
            // rounded to f16 for f16 K (`convert_q`).
            unsafe { block::fold_block(f, &k_rows, &v_rows, (first, len), head, scoring, st) };
        }
    }
}

/// How the converted query row is held for K's dot.
#[derive(Clone, Copy)]
enum QueryFor {
    /// f32 values in the scratch's `q` (rounded to f16 for f16 K); its `k` widens each K row.
    Float(Flavor),
    /// This many bytes of K's vec-dot type at the start of the scratch's `k`.
    Quantized(usize),
}

/// Convert `q` as ggml converts it for K's dot (`from_float` of K's vec-dot type): rounded
/// to f16 in place for f16 K, quantized into `q_dot` for quantized K.
#[inline(always)]
fn convert_q(f: CpuFeatures, k_dtype: DType, q: &mut [f32], q_dot: &mut [f32]) -> Result<QueryFor> {
    match k_dtype {
        DType::F32 => Ok(QueryFor::Float(Flavor::F32)),
        DType::F16 => {
            round_through_f16(q);
            Ok(QueryFor::Float(Flavor::F16))
        }
        quant => {
            let dot_type = quant.vec_dot_type();
            let len = dot_type.row_bytes(q.len())?;
            let out = bytemuck::cast_slice_mut::<f32, u8>(q_dot);
            let out = out.get_mut(..len).ok_or_else(|| Error::Backend {
                backend: "CPU".into(),
                message: format!("FLASH_ATTN_EXT: no room for q as {dot_type}"),
            })?;
            quantize_activations(f, dot_type, q, out)?;
            Ok(QueryFor::Quantized(len))
        }
    }
}

/// ggml's `vec_dot` of K's type between the K row at `k_row` and a head's converted query;
/// an f32 K row is widened into `k_f32` once per cell (`widened` says whether it is).
#[inline(always)]
fn key_dot(
    f: CpuFeatures,
    k: &task::TensorView,
    k_row: *const u8,
    query: QueryFor,
    h: &HeadScratch<'_>,
    k_f32: &mut [f32],
    widened: &mut bool,
) -> Result<f32> {
    match query {
        QueryFor::Float(Flavor::F16) => {
            // SAFETY: a dense, in-bounds f16 row of `k` of `q.len()` values (the support
            // check makes its rows dense and as long as q's).
            let dot = unsafe { vec_float::vec_dot_f16_in_place(f, k_row.cast(), h.q) };
            Ok(dot)
        }
        QueryFor::Float(flavor) => {
            if !*widened {
                // SAFETY: a dense, in-bounds row of `k` (the support check makes its rows
                // dense).
                unsafe { widen(f, k.dtype, k_row, k_f32) };
                *widened = true;
            }
            Ok(vec_float::vec_dot(f, flavor, k_f32, h.q))
        }
        QueryFor::Quantized(len) => {
            // SAFETY: a dense, in-bounds row of `k`, `row_bytes` long.
            let k_bytes = unsafe { bytes(k_row, k.row_bytes()) };
            let q_bytes = &bytemuck::cast_slice::<f32, u8>(h.q_dot)[..len];
            vec_dot(f, k.dtype, k.ne[0], k_bytes, q_bytes)
        }
    }
}

/// `acc += v_row * w` (ggml's `vec_mad`): rounded to f16 at each element for an f16 V. A V row
/// read through f32 is widened (or dequantized) into `v_f32` once per cell (`widened` says
/// whether it is).
#[inline(always)]
fn add_value_row(
    f: CpuFeatures,
    v: &task::TensorView,
    v_row: *const u8,
    w: f32,
    v_f32: &mut [f32],
    widened: &mut bool,
    acc: &mut [f32],
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if v.dtype == DType::F16 && f.has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (the features say so); `v_row` is a dense,
        // in-bounds f16 row of `acc.len()` values (the support check makes V's rows dense).
        unsafe { crate::kernels::simd::x86::mad_f16_rounded(acc, v_row.cast(), w) };
        return Ok(());
    }
    if !*widened {
        match v.dtype {
            // SAFETY: a dense, in-bounds row of `v` (the support check makes its rows dense).
            DType::F16 | DType::F32 => unsafe { widen(f, v.dtype, v_row, v_f32) },
            // SAFETY: as above, `row_bytes` long.
            t => row_to_f32(t, unsafe { bytes(v_row, v.row_bytes()) }, v_f32)?,
        }
        *widened = true;
    }
    for (a, &x) in acc.iter_mut().zip(v_f32.iter()) {
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
