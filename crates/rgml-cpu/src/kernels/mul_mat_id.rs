//! MUL_MAT_ID, ggml's expert products (`ggml_compute_forward_mul_mat_id`): column `(slot, t)`
//! of the result is expert `ids[slot, t]`'s weight matrix times src1 row `(slot % n_b, t)`.
//!
//! As ggml-cpu computes it. Phase 1 (all threads): src1's rows converted to the weight type's
//! vec-dot type in the work area (quantized as ggml quantizes activations, rounded through f16
//! for F16 weights, to bf16 for BF16 weights; F32 weights read them as they are), while thread
//! 0 checks the expert ids
//! and groups the `(slot, token)` pairs by expert, in token order. Barrier. Phase 2: blocks of
//! each used expert's weight rows, taken on demand; an expert with 8 or more routed rows of a
//! K-quant type takes ggml's tiled K-quant kernel ([`kquant::row`]), every other product is
//! `vec_dot`'s: pair by pair, or through kernels with its bits (register tiles for Q4_0, Q4_1,
//! Q5_0, Q5_1 and Q8_0, nibble tiles for IQ4_NL and MXFP4, `vdpbf16ps` rows for BF16 where
//! the CPU has AVX512_BF16; ggml's tinyBLAS never takes expert products). ggml makes that choice per expert
//! (`ggml_tiled_min_batch` on the routed rows), so a token's result depends on how many tokens
//! share its expert, as in llama.cpp; with `rows_alone` every product takes `vec_dot`'s bits,
//! as a lone routed row would.

use crate::kernels::blocks::activations::quantize_activations;
use crate::kernels::blocks::convert;
use crate::kernels::dots;
use crate::kernels::dots::float::{self as vec_float, Flavor};
#[cfg(target_arch = "x86_64")]
use crate::kernels::dots::lowbit;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::{prefetch_span, PREFETCH_AHEAD};
use crate::kernels::task::{
    self, bytes, bytes_mut, f32_row, scratch_slice, NodeTask, TensorView, ThreadCtx,
};
use crate::kernels::tiles::bf16;
use crate::kernels::tiles::kquant;
#[cfg(target_arch = "x86_64")]
use crate::kernels::tiles::kquant_amx;
#[cfg(target_arch = "x86_64")]
use crate::kernels::tiles::kquant_avx2;
#[cfg(target_arch = "x86_64")]
use crate::kernels::tiles::kquant_avx512;
use crate::kernels::tiles::legacy;
use rgml::{DType, Error, Op, Result, Tensor};

/// Weight rows per unit of phase 2: four AMX blocks, so that the activation rows a unit
/// gathers serve 64 weight rows (16 per unit spent a third of a prompt's time copying), and
/// few enough claims per generation step.
const BLOCK_ROWS: usize = 64;

/// Routed pairs gathered at once for the AMX kernel (their activation rows copied together,
/// so that the kernel reads them `wrow` apart as it reads a dense src1).
const AMX_PAIRS: usize = 64;

/// f32 values of per-thread scratch MUL_MAT_ID needs beyond `work_size`'s rows: where the AMX
/// K-quant kernel may run, a gather area of [`AMX_PAIRS`] activation rows, the kernel's
/// decoded weights and a block of results; where the register-tiled ones may, a run of
/// reordered activations.
pub(crate) fn scratch_floats(f: CpuFeatures, a: &Tensor) -> Result<usize> {
    #[cfg(target_arch = "x86_64")]
    if kquant_amx::takes(f, a.dtype, kquant::MIN_ROWS) {
        let (_, wrow) = converted(f, a.dtype, a.ne[0])?;
        let nb = a.ne[0] / rgml::quant::QK_K;
        let bytes = AMX_PAIRS * wrow
            + kquant_amx::scratch_bytes(nb)
            + 4 * kquant_amx::CALL_ROWS * AMX_PAIRS;
        return Ok(bytes.div_ceil(4) + 16);
    }
    if crate::kernels::matmul::kquant_tiles(f, a.dtype, kquant::MIN_ROWS).is_some() {
        let nb = a.ne[0] / rgml::quant::QK_K;
        return Ok(kquant::run_scratch_bytes(nb).div_ceil(4));
    }
    let _ = (f, a);
    Ok(0)
}

/// Whether the kernel handles `as · b` routed by `ids` into `t`.
pub(crate) fn supported(a: &Tensor, b: &Tensor, ids: &Tensor, t: &Tensor) -> bool {
    let weight_ok = match a.dtype {
        DType::F32 | DType::F16 | DType::BF16 => true,
        d if d.is_quantized() => {
            convert::quant_available()
                && crate::kernels::matmul::weight_kernels(d).is_some()
                && a.ne[0].is_multiple_of(d.vec_dot_type().block_size())
                && a.ne[0].is_multiple_of(d.block_size())
        }
        _ => false,
    };
    weight_ok
        && b.dtype == DType::F32
        && ids.dtype == DType::I32
        && t.dtype == DType::F32
        && a.rows_contiguous()
        && b.rows_contiguous()
        && t.rows_contiguous()
        && a.ne[0] == b.ne[0]
        && a.ne[3] == 1
        && b.ne[3] == 1
        && b.ne[1] > 0
        && ids.ne[1] == b.ne[2]
        && ids.ne[0].is_multiple_of(b.ne[1])
        && t.ne == [a.ne[1], ids.ne[0], b.ne[2], 1]
        && u32::try_from(ids.ne[0] * ids.ne[1]).is_ok()
}

/// How phase 1 stores src1's rows for weights of `dtype` on a backend with features `f`: their
/// type and bytes per row of `k` (BF16 weights: bf16 rows for the `vdpbf16ps` kernel, else f32
/// rows rounded through bf16, as for F16).
fn converted(f: CpuFeatures, dtype: DType, k: usize) -> Result<(DType, usize)> {
    let to = match dtype {
        DType::BF16 if f.bf16_products() => DType::BF16,
        DType::F32 | DType::F16 | DType::BF16 => DType::F32,
        q => q.vec_dot_type(),
    };
    Ok((to, to.row_bytes(k)?))
}

/// Where phase 1 puts things in the work area: the converted rows, then (8-byte aligned) a
/// flag (nonzero: an id out of range), each expert's first entry (`n_expert + 1` offsets), the
/// experts with routed pairs (a count, then their ids: phase 2 claims only their blocks) and
/// the entries (two u32 each: slot, token).
struct Layout {
    wrow: usize,
    flag: usize,
    offsets: usize,
    used: usize,
    entries: usize,
    end: usize,
}

impl Layout {
    fn of(
        f: CpuFeatures,
        a_dtype: DType,
        a: &[usize; 4],
        b: &[usize; 4],
        ids: &[usize; 4],
    ) -> Result<Layout> {
        let (_, wrow) = converted(f, a_dtype, a[0])?;
        let rows = wrow.checked_mul(b[1] * b[2]).ok_or(Error::SizeOverflow)?;
        let flag = rows.next_multiple_of(8);
        let offsets = flag + 8;
        let used = offsets + 4 * (a[2] + 1);
        let entries = used + 4 * (a[2] + 1);
        let end = (ids[0] * ids[1])
            .checked_mul(8)
            .and_then(|e| e.checked_add(entries))
            .ok_or(Error::SizeOverflow)?;
        Ok(Layout {
            wrow,
            flag,
            offsets,
            used,
            entries,
            end,
        })
    }
}

/// Bytes of the work area the node needs.
pub(crate) fn shared_size(f: CpuFeatures, a: &Tensor, b: &Tensor, ids: &Tensor) -> Result<usize> {
    Ok(Layout::of(f, a.dtype, &a.ne, &b.ne, &ids.ne)?.end + 8)
}

/// MUL_MAT_ID.
pub(crate) fn mul_mat_id(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (a, b, ids) = (task.src(0)?, task.src(1)?, task.src(2)?);
    let layout = Layout::of(task.features, a.dtype, &a.ne, &b.ne, &ids.ne)?;
    let base = tc.shared.ptr;
    if layout.end > tc.shared.len || base.align_offset(8) != 0 {
        return Err(Error::Backend {
            backend: "CPU".into(),
            message: "MUL_MAT_ID: work area smaller than planned".into(),
        });
    }
    // Phase 1. Every thread reaches the barrier, also on errors and panics.
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if tc.ith == 0 {
            group_by_expert(ids, a.ne[2], &layout, base);
        }
        convert_rows(task, tc, &layout)
    }));
    tc.barrier.wait();
    caught.unwrap_or_else(|_| {
        Err(Error::Backend {
            backend: "CPU".into(),
            message: "MUL_MAT_ID: phase 1 panicked".into(),
        })
    })?;
    // SAFETY: the flag, offsets, used experts and entries lie in the work area (checked
    // against `end` above), 4-byte aligned, written by thread 0 before the barrier and only
    // read now.
    let (flag, offsets, used, entries) = unsafe {
        let words = |at: usize, n: usize| std::slice::from_raw_parts(base.add(at).cast::<u32>(), n);
        (
            words(layout.flag, 1)[0],
            words(layout.offsets, a.ne[2] + 1),
            words(layout.used, a.ne[2] + 1),
            words(layout.entries, 2 * ids.ne[0] * ids.ne[1]),
        )
    };
    if flag != 0 {
        return Err(Error::Backend {
            backend: "CPU".into(),
            message: format!("MUL_MAT_ID: an expert id outside 0..{}", a.ne[2]),
        });
    }
    let rows_alone = matches!(task.op, Op::MulMatId { rows_alone: true });
    let blocks = a.ne[1].div_ceil(BLOCK_ROWS);
    let mut products = Products {
        task,
        layout: &layout,
        base,
        #[cfg(target_arch = "x86_64")]
        nibbles: None,
    };
    // Units of the used experts' blocks only: claiming (an atomic add) every expert's blocks
    // costs more than a generation step's products when most experts are idle.
    let used = &used[1..1 + (used[0] as usize).min(a.ne[2])];
    for unit in task::claimed(tc.claim, used.len() * blocks) {
        let e = used[unit / blocks] as usize;
        let r0 = (unit % blocks) * BLOCK_ROWS;
        let rows = r0..(r0 + BLOCK_ROWS).min(a.ne[1]);
        let routed = &entries[2 * offsets[e] as usize..2 * offsets[e + 1] as usize];
        products.expert(e, rows, routed, rows_alone, tc.scratch)?;
    }
    Ok(())
}

/// Thread 0's part of phase 1: the routed `(slot, token)` pairs grouped by expert (a counting
/// sort in token order, as ggml lists them), or the flag set if an id is out of range.
fn group_by_expert(ids: &TensorView, n_expert: usize, layout: &Layout, base: *mut u8) {
    let (n_used, n_tokens) = (ids.ne[0], ids.ne[1]);
    let id_at = |slot: usize, t: usize| {
        // SAFETY: element (slot, t) of the I32 ids tensor, in bounds.
        unsafe {
            ids.row(t, 0, 0)
                .add(slot * ids.nb[0])
                .cast::<i32>()
                .read_unaligned()
        }
    };
    // SAFETY: the flag, offsets and entries areas lie in the work area (the caller checked
    // `end`), 4-byte aligned, and only thread 0 touches them before the barrier.
    let (flag, offsets, entries) = unsafe {
        let words =
            |at: usize, n: usize| std::slice::from_raw_parts_mut(base.add(at).cast::<u32>(), n);
        (
            words(layout.flag, 1),
            words(layout.offsets, n_expert + 1),
            words(layout.entries, 2 * n_used * n_tokens),
        )
    };
    offsets.fill(0);
    flag[0] = 0;
    for t in 0..n_tokens {
        for slot in 0..n_used {
            match usize::try_from(id_at(slot, t)) {
                Ok(e) if e < n_expert => offsets[e + 1] += 1,
                _ => {
                    flag[0] = 1;
                    return;
                }
            }
        }
    }
    for e in 0..n_expert {
        offsets[e + 1] += offsets[e];
    }
    // `offsets[e]` serves as expert e's write cursor, so it ends at e + 1's start; moving
    // every offset up one place restores the starts (kernels never allocate).
    for t in 0..n_tokens {
        for slot in 0..n_used {
            let e = id_at(slot, t) as usize;
            let at = 2 * offsets[e] as usize;
            (entries[at], entries[at + 1]) = (slot as u32, t as u32);
            offsets[e] += 1;
        }
    }
    offsets.copy_within(0..n_expert, 1);
    offsets[0] = 0;
    // SAFETY: as above: the used-experts area, thread 0's alone before the barrier.
    let used = unsafe {
        std::slice::from_raw_parts_mut(base.add(layout.used).cast::<u32>(), n_expert + 1)
    };
    let mut n_used_experts = 0;
    for e in 0..n_expert {
        if offsets[e + 1] > offsets[e] {
            n_used_experts += 1;
            used[n_used_experts] = e as u32;
        }
    }
    used[0] = n_used_experts as u32;
}

/// This thread's share of src1's rows, converted into the work area.
fn convert_rows(task: &NodeTask, tc: &mut ThreadCtx<'_>, layout: &Layout) -> Result<()> {
    let (a, b) = (task.src(0)?, task.src(1)?);
    let (to, wrow) = (converted(task.features, a.dtype, a.ne[0])?.0, layout.wrow);
    let k = b.ne[0];
    for r in tc.split(b.ne[1] * b.ne[2]) {
        // SAFETY: a dense, in-bounds f32 row of src1 (the support check).
        let src = unsafe { f32_row(b.row(r % b.ne[1], r / b.ne[1], 0), k) };
        // SAFETY: row `r` of the converted rows (in the work area: `end` checked), written by
        // this thread only; read by others only after the barrier.
        let out = unsafe { bytes_mut(tc.shared.at(r * wrow), wrow) };
        match (a.dtype, to) {
            (DType::BF16, DType::BF16) => bf16::row_to_bf16(src, out)?,
            (DType::F16 | DType::BF16, _) => {
                let tmp = scratch_slice(tc.scratch, k)?;
                tmp.copy_from_slice(src);
                if a.dtype == DType::F16 {
                    convert::round_through_f16(tmp);
                } else {
                    convert::round_through_bf16(tmp);
                }
                out.copy_from_slice(bytemuck::cast_slice(tmp));
            }
            (_, DType::F32) => out.copy_from_slice(bytemuck::cast_slice(src)),
            (_, vd) => quantize_activations(task.features, vd, src, out)?,
        }
    }
    Ok(())
}

/// Phase 2: what every unit shares.
struct Products<'a> {
    task: &'a NodeTask,
    layout: &'a Layout,
    base: *mut u8,
    /// The routed rows of the last expert this thread prepared for the nibble tiles: a
    /// thread's consecutive units are mostly blocks of one expert, which share them
    /// (preparing them per unit took a tenth of a gpt-oss prompt).
    #[cfg(target_arch = "x86_64")]
    nibbles: Option<(usize, lowbit::NibbleTile)>,
}

impl Products<'_> {
    /// Where output row `row` of routed pair `(slot, token)` is in the destination (a pair's
    /// rows are consecutive f32s).
    fn output(&self, row: usize, slot: u32, token: u32) -> *mut f32 {
        self.task
            .dst
            .row(slot as usize, token as usize, 0)
            .wrapping_add(row * 4)
            .cast()
    }

    /// The converted src1 row of pair `(slot, token)`.
    fn activation(&self, b: &TensorView, slot: u32, token: u32) -> *const u8 {
        let r = slot as usize % b.ne[1] + token as usize * b.ne[1];
        self.base.wrapping_add(r * self.layout.wrow).cast_const()
    }

    /// Weight rows `rows` of expert `e` times each routed pair, into the destination.
    fn expert(
        &mut self,
        e: usize,
        rows: std::ops::Range<usize>,
        routed: &[u32],
        rows_alone: bool,
        scratch: &mut [f32],
    ) -> Result<()> {
        let f = self.task.features;
        let (a, b) = (self.task.src(0)?, self.task.src(1)?);
        let n_routed = routed.len() / 2;
        if !rows_alone && kquant::takes(a.dtype, n_routed) {
            #[cfg(target_arch = "x86_64")]
            if kquant_amx::takes(f, a.dtype, n_routed) {
                return self.expert_amx(e, rows, routed, scratch);
            }
            #[cfg(target_arch = "x86_64")]
            if let Some(tiles) = crate::kernels::matmul::kquant_tiles(f, a.dtype, n_routed) {
                return self.expert_in_tiles(tiles, e, rows, routed, scratch);
            }
            let nb = a.ne[0] / rgml::quant::QK_K;
            let mut acc = [0f32; kquant::COLS];
            let mut ys = [std::ptr::null::<u8>(); kquant::COLS];
            for pairs in routed.chunks(2 * kquant::COLS) {
                let n = pairs.len() / 2;
                for (y, p) in ys.iter_mut().zip(pairs.chunks_exact(2)) {
                    *y = self.activation(b, p[0], p[1]);
                }
                let ys = &ys[..n];
                for row in rows.clone() {
                    // SAFETY: `kquant::takes` accepted the type; the weight row is dense and
                    // in bounds with `nb` blocks, each activation row `nb` Q8_K blocks in the
                    // work area (complete since the barrier).
                    unsafe { kquant::row(f, a.dtype, nb, a.row(row, e, 0), ys, &mut acc) };
                    for (p, v) in pairs.chunks_exact(2).zip(acc) {
                        // SAFETY: output (row, slot, token) is in bounds and written only by the
                        // thread that claimed this expert's row block.
                        unsafe { self.output(row, p[0], p[1]).write(v) };
                    }
                }
            }
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if !rows_alone && n_routed >= 2 && self.expert_nibbles(e, rows.clone(), routed)? {
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if n_routed == 1 && self.expert_matvec(e, rows.clone(), routed)? {
            return Ok(());
        }
        if n_routed >= 2 && self.expert_legacy(e, rows.clone(), routed)? {
            return Ok(());
        }
        if a.dtype == DType::BF16 && f.bf16_products() {
            return self.expert_bf16(e, rows, routed);
        }
        let k = a.ne[0];
        let wrow = self.layout.wrow;
        let flavor = match a.dtype {
            DType::F16 => Flavor::F16,
            _ => Flavor::Bf16,
        };
        for row in rows {
            let x = a.row(row, e, 0).cast_const();
            // Generation streams each expert's rows from memory once: prefetched ahead, as
            // the matrix-vector path does (the hardware prefetcher alone is slower).
            prefetch_span(x.wrapping_add(PREFETCH_AHEAD), a.row_bytes());
            let widened = match a.dtype {
                DType::F16 | DType::BF16 => {
                    let w = scratch_slice(scratch, k)?;
                    // SAFETY: a dense, in-bounds f16/bf16 weight row of `k` values.
                    convert::row_to_f32(a.dtype, unsafe { bytes(x, a.row_bytes()) }, w)?;
                    Some(&*w)
                }
                _ => None,
            };
            for p in routed.chunks_exact(2) {
                let y = self.activation(b, p[0], p[1]);
                let v = match (a.dtype, widened) {
                    (DType::F16 | DType::BF16, Some(w)) => {
                        // SAFETY: a converted row of `k` f32 values in the work area.
                        let y = unsafe { f32_row(y, k) };
                        vec_float::vec_dot(f, flavor, w, y)
                    }
                    (DType::F32, _) => {
                        // SAFETY: dense f32 rows of `k` values (weight, converted src1).
                        let (x, y) = unsafe { (f32_row(x, k), f32_row(y, k)) };
                        vec_float::vec_dot(f, Flavor::F32, x, y)
                    }
                    (t, _) => {
                        // SAFETY: a dense weight row and a converted activation row, in bounds.
                        let (x, y) = unsafe { (bytes(x, a.row_bytes()), bytes(y, wrow)) };
                        dots::vec_dot(f, t, k, x, y)?
                    }
                };
                // SAFETY: as above.
                unsafe { self.output(row, p[0], p[1]).write(v) };
            }
        }
        Ok(())
    }

    /// [`Self::expert`]'s BF16 products on a CPU with AVX512_BF16 (bf16 activation rows in the
    /// work area): `ggml_vec_dot_bf16`'s `vdpbf16ps` order, [`bf16::VEC_DOT_ROWS`] weight rows
    /// per call, each routed pair in turn.
    fn expert_bf16(&self, e: usize, rows: std::ops::Range<usize>, routed: &[u32]) -> Result<()> {
        let f = self.task.features;
        let (a, b) = (self.task.src(0)?, self.task.src(1)?);
        for r0 in rows.clone().step_by(bf16::VEC_DOT_ROWS) {
            let nr = (rows.end - r0).min(bf16::VEC_DOT_ROWS);
            // Edge groups repeat their last row and drop its copies.
            let x: [*const u8; bf16::VEC_DOT_ROWS] =
                std::array::from_fn(|r| a.row(r0 + r.min(nr - 1), e, 0).cast_const());
            prefetch_span(x[0].wrapping_add(PREFETCH_AHEAD), nr * a.row_bytes());
            for p in routed.chunks_exact(2) {
                let y = self.activation(b, p[0], p[1]);
                // SAFETY: dense, in-bounds weight rows of `k` bf16 values and a converted bf16
                // activation row of `k` values in the work area (complete since the barrier).
                let out = unsafe { bf16::vec_dot_rows(f, x, y, a.ne[0])? };
                for (r, &v) in out.iter().enumerate().take(nr) {
                    // SAFETY: output (row, slot, token) is in bounds and written only by the
                    // thread that claimed this expert's row block.
                    unsafe { self.output(r0 + r, p[0], p[1]).write(v) };
                }
            }
        }
        Ok(())
    }

    /// [`Self::expert`]'s Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 products in register tiles
    /// ([`legacy::tile`], `vec_dot`'s bits, as MUL_MAT's tiled path): each tile of weight rows
    /// against the routed activation rows, a tile of them at a time. False (nothing done)
    /// where the CPU or the type does not take it (IQ4_NL's tiles are tinyBLAS's arithmetic,
    /// not `vec_dot`'s).
    fn expert_legacy(
        &self,
        e: usize,
        rows: std::ops::Range<usize>,
        routed: &[u32],
    ) -> Result<bool> {
        let f = self.task.features;
        let (a, b) = (self.task.src(0)?, self.task.src(1)?);
        if a.dtype == DType::IQ4_NL || !legacy::supported(f, a.dtype) {
            return Ok(false);
        }
        let nb = a.ne[0] / a.dtype.block_size();
        let (rm, rn) = (legacy::tile_rows(f), legacy::tile_cols(f));
        let ys: Vec<*const u8> = routed
            .chunks_exact(2)
            .map(|p| self.activation(b, p[0], p[1]))
            .collect();
        let mut out = [0f32; 4 * legacy::TILE_COLS];
        for r0 in rows.clone().step_by(rm) {
            let r1 = (r0 + rm).min(rows.end);
            let x: [*const u8; 4] =
                std::array::from_fn(|r| a.row((r0 + r).min(r1 - 1), e, 0).cast_const());
            for (pairs, y) in routed.chunks(2 * rn).zip(ys.chunks(rn)) {
                // SAFETY: `legacy::supported` holds for the CPU and type; the weight rows are
                // dense and in bounds with `nb` blocks, each activation row `nb` blocks of the
                // vec-dot type in the work area (complete since the barrier); `out` holds
                // rm x TILE_COLS.
                unsafe { legacy::tile(f, a.dtype, nb, &x[..r1 - r0], y, &mut out, rn) };
                for (r, row) in (r0..r1).enumerate() {
                    for (c, p) in pairs.chunks_exact(2).enumerate() {
                        // SAFETY: output (row, slot, token) is in bounds and written only by
                        // the thread that claimed this expert's row block.
                        unsafe { self.output(row, p[0], p[1]).write(out[r * rn + c]) };
                    }
                }
            }
        }
        Ok(true)
    }

    /// [`Self::expert`] for one routed pair (a generation step) through the type's
    /// matrix-vector kernel ([`dots::matvec`]: IQ4_NL, MXFP4, the K-quants and IQ4_XS;
    /// `vec_dot`'s bits, rows prefetched ahead): the block's rows in one call instead of a
    /// `vec_dot` dispatch per row. False (nothing done) for other types.
    #[cfg(target_arch = "x86_64")]
    fn expert_matvec(
        &self,
        e: usize,
        rows: std::ops::Range<usize>,
        routed: &[u32],
    ) -> Result<bool> {
        let f = self.task.features;
        let (a, b) = (self.task.src(0)?, self.task.src(1)?);
        let (Some(kernel), [slot, token]) = (dots::matvec(f, a.dtype), routed) else {
            return Ok(false);
        };
        let run = dots::run::RowRun {
            nb: a.ne[0] / a.dtype.block_size(),
            x0: a.row(rows.start, e, 0).cast_const(),
            row_stride: a.nb[1],
            y: self.activation(b, *slot, *token),
        };
        let first = self.output(rows.start, *slot, *token);
        // SAFETY: dense, in-bounds weight rows `rows` of expert `e`, `a.nb[1]` apart, of `nb`
        // blocks each, and a converted activation row of `nb` Q8_0 blocks in the work area
        // (complete since the barrier); the outputs (rows, slot, token) are consecutive f32s of
        // the dense destination, written only by the thread that claimed this row block.
        unsafe { kernel(run, task::f32_row_mut(first.cast(), rows.len())) };
        Ok(true)
    }

    /// [`Self::expert`]'s IQ4_NL and MXFP4 products with AVX-512 VNNI ([`lowbit::NibbleTile`],
    /// `vec_dot`'s bits): the routed activation rows prepared once, each weight row decoded
    /// once for all of them. False (nothing done) where the CPU or the type does not take it.
    #[cfg(target_arch = "x86_64")]
    fn expert_nibbles(
        &mut self,
        e: usize,
        rows: std::ops::Range<usize>,
        routed: &[u32],
    ) -> Result<bool> {
        let f = self.task.features;
        let (a, b) = (self.task.src(0)?, self.task.src(1)?);
        if !matches!(a.dtype, DType::IQ4_NL | DType::MXFP4) {
            return Ok(false);
        }
        let nb = a.ne[0] / a.dtype.block_size();
        if self.nibbles.as_ref().is_none_or(|(held, _)| *held != e) {
            let ys: Vec<*const u8> = routed
                .chunks_exact(2)
                .map(|p| self.activation(b, p[0], p[1]))
                .collect();
            // SAFETY: each activation row holds `nb` Q8_0 blocks in the work area, complete
            // since the barrier and unchanged until the node ends (`self` lives only in it).
            let Some(tile) = (unsafe { lowbit::NibbleTile::new(f, a.dtype, nb, &ys) }) else {
                return Ok(false);
            };
            self.nibbles = Some((e, tile));
        }
        let Some((_, tile)) = &self.nibbles else {
            return Ok(false);
        };
        let n_routed = routed.len() / 2;
        let mut out = vec![0f32; n_routed];
        for row in rows {
            let x = a.row(row, e, 0).cast_const();
            prefetch_span(x.wrapping_add(PREFETCH_AHEAD), a.row_bytes());
            // SAFETY: a dense, in-bounds weight row of `nb` blocks of the tile's type.
            unsafe { tile.row(x, &mut out) };
            for (p, &v) in routed.chunks_exact(2).zip(&out) {
                // SAFETY: output (row, slot, token) is in bounds and written only by the
                // thread that claimed this expert's row block.
                unsafe { self.output(row, p[0], p[1]).write(v) };
            }
        }
        Ok(true)
    }

    /// [`Self::expert`]'s tiled K-quant products in the register tiles `tiles` (see
    /// [`Self::expert_tiles`]): AVX-512 tiles reorder the routed rows in registers, AVX2 tiles
    /// with the portable copy.
    #[cfg(target_arch = "x86_64")]
    fn expert_in_tiles(
        &self,
        tiles: crate::kernels::matmul::KquantTiles,
        e: usize,
        rows: std::ops::Range<usize>,
        routed: &[u32],
        scratch: &mut [f32],
    ) -> Result<()> {
        use crate::kernels::matmul::KquantTiles;
        let f = self.task.features;
        let a = self.task.src(0)?;
        let nb = a.ne[0] / rgml::quant::QK_K;
        // SAFETY: `kquant_tiles` chose the kernel for this CPU and type (AVX-512 or AVX2); the
        // gathers get activation rows of `nb` Q8_K blocks, the kernels dense in-bounds weight
        // rows of `nb` blocks and the gathered rows.
        unsafe {
            match tiles {
                KquantTiles::Avx512 => self.expert_tiles(
                    e,
                    rows,
                    routed,
                    scratch,
                    |nb, y, scratch| kquant_avx512::permute_activations(nb, y, scratch),
                    |x, y, out| kquant_avx512::rows(f, a.dtype, nb, x, y, out),
                ),
                KquantTiles::Avx2 => self.expert_tiles(
                    e,
                    rows,
                    routed,
                    scratch,
                    |nb, y, scratch| {
                        kquant::gather_pieces(nb, y, scratch, |s, d| kquant::reorder_block(s, d))
                    },
                    |x, y, out| kquant_avx2::rows(a.dtype, nb, x, y, out),
                ),
            }
        }
    }

    /// [`Self::expert`]'s tiled K-quant products in register tiles of `R` weight rows
    /// ([`kquant_avx512`], [`kquant_avx2`]; the same bits): the routed activation rows copied in
    /// piece order by `gather(nb, rows, scratch)`, [`kquant::TILE_RUN`] at a time, each run by
    /// strips of `R` weight rows (`kernel(weight rows, activation rows, out)`).
    ///
    /// # Safety
    /// `gather` may be called on activation rows of `nb` Q8_K blocks, `kernel` on dense
    /// in-bounds weight rows of `nb` blocks and `gather`'s rows.
    #[cfg(target_arch = "x86_64")]
    unsafe fn expert_tiles<const R: usize>(
        &self,
        e: usize,
        rows: std::ops::Range<usize>,
        routed: &[u32],
        scratch: &mut [f32],
        gather: impl Fn(usize, &[*const u8], &mut [u8]) -> Option<[*const u8; kquant::TILE_RUN]>,
        kernel: impl Fn(&[*const u8], &[*const u8], &mut [[f32; R]; kquant::TILE_RUN]),
    ) -> Result<()> {
        const COLS: usize = kquant::TILE_RUN;
        let (a, b) = (self.task.src(0)?, self.task.src(1)?);
        let nb = a.ne[0] / rgml::quant::QK_K;
        let scratch = bytemuck::cast_slice_mut::<f32, u8>(scratch);
        let mut ys = [std::ptr::null::<u8>(); COLS];
        let mut out = [[0f32; R]; COLS];
        for pairs in routed.chunks(2 * COLS) {
            let n = pairs.len() / 2;
            for (y, p) in ys.iter_mut().zip(pairs.chunks_exact(2)) {
                *y = self.activation(b, p[0], p[1]);
            }
            let run = gather(nb, &ys[..n], scratch).ok_or_else(|| Error::Backend {
                backend: "CPU".into(),
                message: "MUL_MAT_ID: scratch too small for the reordered activations".into(),
            })?;
            for r0 in rows.clone().step_by(R) {
                let r1 = (r0 + R).min(rows.end);
                let x: [*const u8; R] =
                    std::array::from_fn(|r| a.row((r0 + r).min(r1 - 1), e, 0).cast_const());
                kernel(&x[..r1 - r0], &run[..n], &mut out);
                for (p, col) in pairs.chunks_exact(2).zip(&out) {
                    let at = self.output(r0, p[0], p[1]);
                    // SAFETY: outputs (r0..r1, slot, token) are in bounds, dense (f32 rows),
                    // and written only by the thread that claimed this expert's row block.
                    unsafe { kquant::store_column(col, at, r1 - r0) };
                }
            }
        }
        Ok(())
    }

    /// [`Self::expert`]'s tiled K-quant products on AMX tiles ([`kquant_amx`], the same bits):
    /// the routed pairs in chunks of [`AMX_PAIRS`], each chunk's activation rows gathered into
    /// `scratch`, then every run of up to 64 weight rows against them, the results scattered.
    #[cfg(target_arch = "x86_64")]
    fn expert_amx(
        &self,
        e: usize,
        rows: std::ops::Range<usize>,
        routed: &[u32],
        scratch: &mut [f32],
    ) -> Result<()> {
        let (a, b) = (self.task.src(0)?, self.task.src(1)?);
        let (wrow, nb) = (self.layout.wrow, a.ne[0] / rgml::quant::QK_K);
        let scratch = bytemuck::cast_slice_mut::<f32, u8>(scratch);
        let (gathered, rest) = scratch
            .split_at_mut_checked(AMX_PAIRS * wrow)
            .ok_or_else(small_scratch)?;
        let (results, amx) = rest
            .split_at_mut_checked(4 * kquant_amx::CALL_ROWS * AMX_PAIRS)
            .ok_or_else(small_scratch)?;
        let amx = amx
            .get_mut(..kquant_amx::scratch_bytes(nb))
            .ok_or_else(small_scratch)?;
        for pairs in routed.chunks(2 * AMX_PAIRS) {
            let n = pairs.len() / 2;
            for (i, p) in pairs.chunks_exact(2).enumerate() {
                let y = self.activation(b, p[0], p[1]);
                // SAFETY: a converted activation row of `wrow` bytes in the work area,
                // complete since the barrier.
                let y = unsafe { bytes(y, wrow) };
                gathered[i * wrow..(i + 1) * wrow].copy_from_slice(y);
            }
            for r0 in rows.clone().step_by(kquant_amx::CALL_ROWS) {
                let mrows = kquant_amx::CALL_ROWS.min(rows.end - r0);
                // SAFETY: `kquant_amx::takes` checked the CPU and type; weight rows r0..r0 +
                // mrows of expert `e` are dense and in bounds, `a.nb[1]` apart, `nb` blocks
                // each; the `n` gathered rows are `wrow` apart in `gathered`, `nb` Q8_K
                // blocks each; `results` holds 64 floats per pair; `amx` is the kernel's
                // scratch size.
                unsafe {
                    kquant_amx::rows(
                        a.dtype,
                        nb,
                        (a.row(r0, e, 0).cast_const(), a.nb[1], mrows),
                        (gathered.as_ptr(), wrow, n),
                        (results.as_mut_ptr(), 4 * kquant_amx::CALL_ROWS),
                        amx,
                    )
                };
                for (i, p) in pairs.chunks_exact(2).enumerate() {
                    let out = self.output(r0, p[0], p[1]).cast::<u8>();
                    let from = &results[i * 4 * kquant_amx::CALL_ROWS..][..4 * mrows];
                    // SAFETY: outputs (r0..r0 + mrows, slot, token) are in bounds, dense in
                    // the row, and written only by the thread that claimed this row block.
                    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), out, 4 * mrows) };
                }
            }
        }
        Ok(())
    }
}

/// The error of a per-thread scratch smaller than [`scratch_floats`] planned.
fn small_scratch() -> Error {
    Error::Backend {
        backend: "CPU".into(),
        message: "MUL_MAT_ID: per-thread scratch smaller than planned".into(),
    }
}
