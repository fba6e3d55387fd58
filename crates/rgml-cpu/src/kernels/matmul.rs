//! MUL_MAT: `dst[i01, i11, i12, i13] = dot(src0 row (i01, i12 / r2, i13 / r3), src1 row (i11,
//! i12, i13))` with `r2 = ne12 / ne02`, `r3 = ne13 / ne03` (ggml's broadcast over dims 2, 3).
//!
//! Phase 1 (all threads, split by src1 rows): quantize src1 to the weight type's vec-dot type
//! in the shared work area (quantized weights), or gather it into dense f32 rows (plain weights
//! with a strided src1). Barrier. A product of the same src1 as the previous one (q/k/v,
//! gate/up; `NodeTask::reuse_src1`) skips phase 1 and its barrier. Phase 2: threads take
//! contiguous blocks of src0 rows of each batch and compute all their outputs: packed weights
//! (a repacking buffer, [`super::repack`]) by runs of 4-row groups, Q2_K…Q6_K and IQ4_XS weights
//! by 8 or more src1 rows through [`super::ktiled`], plain q4_0/q4_1/q5_0/q5_1/q8_0 (and iq4_nl
//! from 2 src1 rows) through the register
//! tiles of [`super::tiled`] (matrix-vector products prefetching the weight rows ahead, on AVX2
//! by [`crate::kernels::tiles::legacy::matvec_kernel`]), one src1 row of iq4_nl or mxfp4 by
//! [`crate::kernels::dots::lowbit::nibble_matvec`]'s kernel (`vec_dot`'s order, two rows per
//! pass), one src1 row of the K-quants and iq4_xs by [`crate::kernels::dots::matvec`]'s (their
//! pair dots over a run of rows, prefetching), other quantized types (mxfp4 always: ggml has no
//! tiles for it outside its repacking buffer) pair by pair (prefetching too), F32/F16/BF16 in
//! 4 x 4 tiles whose
//! columns are all the src1 rows broadcast onto one weight matrix (GQA heads), each weight row
//! decoded once; BF16 weights on CPUs with AVX512_BF16 by [`super::bf16`] instead, with bf16
//! activation rows and `vdpbf16ps`, as ggml's build for such CPUs.
//!
//! The quantized paths give a native x86 ggml-cpu's bits (tested against outputs of the real
//! ggml, `tests/ggml_matmul.rs`). ggml picks the arithmetic by src1's row count: its tiled
//! K-quant kernel from 8 rows ([`super::ktiled`]), else llamafile's tinyBLAS_Q0 (Q4_0, Q5_0,
//! Q8_0 from 2 rows, whose per-output operations are exactly `vec_dot`'s; IQ4_NL from 2 rows,
//! whose single accumulator is not) or `vec_dot` pair by pair ([`super::dot`]). Within a path every output is computed with exactly the operations
//! of that path, so tiling, packing and the thread count change speed only. A product
//! marked `rows_alone` (`rgml::Op::MulMat`) chooses its path as for one row, so each of its
//! rows gets the bits a one-row product gives (independent sequences batched together).

use crate::kernels::blocks::activations::quantize_activations;
use crate::kernels::blocks::convert;
use crate::kernels::blocks::convert::{row_from_f32, row_to_f32};
use crate::kernels::dots;
use crate::kernels::dots::float::{vec_dot, Flavor};
use crate::kernels::dots::lowbit;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::{prefetch_span, PREFETCH_AHEAD};
use crate::kernels::task;
use crate::kernels::task::{bytes, bytes_mut, f32_row, scratch_slice, NodeTask, ThreadCtx};
use crate::kernels::tiles::bf16;
use crate::kernels::tiles::float;
use crate::kernels::tiles::float_avx2;
use crate::kernels::tiles::kquant;
#[cfg(target_arch = "x86_64")]
use crate::kernels::tiles::kquant_amx;
#[cfg(target_arch = "x86_64")]
use crate::kernels::tiles::kquant_avx2;
#[cfg(target_arch = "x86_64")]
use crate::kernels::tiles::kquant_avx512;
use crate::kernels::tiles::legacy;
use crate::kernels::tiles::q4_prompt;
use crate::kernels::tiles::repack;
use rgml::{DType, Error, Result, Tensor};
use std::ops::Range;

/// The tile kernels the floors below have for one weight type, by path (in the manner of
/// ggml's `type_traits_cpu`). Whether a path runs also depends on the CPU and the activation
/// rows ([`QuantPath::choose`]); every weight type has pair dots (`dots::vec_dot`, floor 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WeightKernels {
    /// Register tiles with `vec_dot`'s (or tinyBLAS_Q0's) arithmetic and the matrix-vector
    /// kernels ([`legacy`]).
    pub register_tiles: bool,
    /// ggml's tiled K-quant kernel from 8 activation rows ([`kquant`]; on AMX tiles where the
    /// CPU has them, [`kquant_amx`]).
    pub kquant_tiles: bool,
    /// Weights repacked 4 rows at a time ([`repack`]).
    pub repack: bool,
    /// tinyBLAS's F32/F16/BF16 tiles ([`float`], [`float_avx2`], [`bf16`]).
    pub float_tiles: bool,
}

/// The weight types MUL_MAT multiplies and their tile kernels (`None`: not a weight type).
pub(crate) const fn weight_kernels(dtype: DType) -> Option<WeightKernels> {
    use DType::*;
    let none = WeightKernels {
        register_tiles: false,
        kquant_tiles: false,
        repack: false,
        float_tiles: false,
    };
    Some(match dtype {
        F32 | F16 | BF16 => WeightKernels {
            float_tiles: true,
            ..none
        },
        Q4_0 | Q4_1 | Q8_0 => WeightKernels {
            register_tiles: true,
            repack: true,
            ..none
        },
        Q5_0 | Q5_1 | IQ4_NL => WeightKernels {
            register_tiles: true,
            ..none
        },
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => WeightKernels {
            kquant_tiles: true,
            ..none
        },
        // llamafile's sgemm and ggml's tiled kernels do not take MXFP4: `vec_dot` only.
        MXFP4 => none,
        _ => return None,
    })
}

/// The path a block of quantized weight rows takes (phase 2).
#[derive(Clone, Copy)]
enum QuantPath {
    /// Repacked weights ([`repack`]).
    Packed,
    /// One activation row by a matrix-vector kernel.
    Matvec(crate::kernels::dots::run::MatvecKernel),
    /// Several activation rows by a column kernel (AVX2 register tiles), on repacked weights
    /// where the flag says so.
    Cols(legacy::ColsKernel, bool),
    /// ggml's tiled K-quant kernel on AMX tiles.
    KquantAmx,
    /// ggml's tiled K-quant kernel in AVX-512 register tiles.
    KquantAvx512,
    /// ggml's tiled K-quant kernel in AVX2 register tiles.
    KquantAvx2,
    /// ggml's tiled K-quant kernel.
    Kquant,
    /// Register tiles.
    Tiled,
    /// Pair by pair (`vec_dot`).
    Pairs,
}

impl QuantPath {
    /// The path of weights of `dtype` (packed or not) by `ne11` activation rows per batch whose
    /// arithmetic is chosen as for `path_rows` rows, on a CPU with `f`: the first of ggml's
    /// choices this CPU has a kernel for.
    fn choose(f: CpuFeatures, dtype: DType, packed: bool, ne11: usize, path_rows: usize) -> Self {
        let Some(caps) = weight_kernels(dtype) else {
            return QuantPath::Pairs;
        };
        // Packed weights are read only by the repacked kernels (only types with `repack` are
        // ever packed, `crate::buffer::packable`).
        if packed {
            // The AVX2 build's prompts read packed rows as the dense ones (its column kernel
            // takes a row's block positions); its generation and the AVX-512 VNNI build's
            // products have kernels of the packed layout.
            return match (ne11 > 1, legacy::cols_kernel(f, dtype)) {
                (true, Some(kernel)) => QuantPath::Cols(kernel, true),
                _ => QuantPath::Packed,
            };
        }
        let tiled = caps.register_tiles && legacy::takes(f, dtype, path_rows);
        #[cfg(target_arch = "x86_64")]
        if ne11 == 1 {
            // One row of IQ4_NL takes `vec_dot`'s arithmetic, not the tiles'; MXFP4 has only it.
            if let Some(kernel) = lowbit::nibble_matvec(f, dtype) {
                return QuantPath::Matvec(kernel);
            }
        }
        if let (1, true, Some(kernel)) = (ne11, tiled, legacy::matvec_kernel(f, dtype)) {
            return QuantPath::Matvec(kernel);
        }
        if let (true, true, Some(kernel)) = (tiled, ne11 > 1, legacy::cols_kernel(f, dtype)) {
            return QuantPath::Cols(kernel, false);
        }
        if caps.kquant_tiles && kquant::takes(dtype, path_rows) {
            #[cfg(target_arch = "x86_64")]
            if kquant_amx::takes(f, dtype, path_rows) {
                return QuantPath::KquantAmx;
            }
            match kquant_tiles(f, dtype, path_rows) {
                Some(KquantTiles::Avx512) => return QuantPath::KquantAvx512,
                Some(KquantTiles::Avx2) => return QuantPath::KquantAvx2,
                None => {}
            }
            return QuantPath::Kquant;
        }
        if tiled {
            return QuantPath::Tiled;
        }
        // `vec_dot` pair by pair: one activation row through the type's matrix-vector kernel
        // where it has one (the same products, without a call's checks per row).
        match (ne11, dots::matvec(f, dtype)) {
            (1, Some(kernel)) => QuantPath::Matvec(kernel),
            _ => QuantPath::Pairs,
        }
    }
}

/// The kernel MUL_MAT runs for one activation row against plain (not repacked) weights of
/// `dtype` on a CPU with `f`, where that path is a matrix-vector kernel (for `cargo bench`).
pub(crate) fn matvec_path(
    f: CpuFeatures,
    dtype: DType,
) -> Option<crate::kernels::dots::run::MatvecKernel> {
    match QuantPath::choose(f, dtype, false, 1, 1) {
        QuantPath::Matvec(kernel) => Some(kernel),
        _ => None,
    }
}

/// Whether the kernel handles `a · b -> t`.
pub(crate) fn supported(a: &Tensor, b: &Tensor, t: &Tensor) -> bool {
    let weight_ok = weight_kernels(a.dtype).is_some()
        && (!a.dtype.is_quantized()
            || (convert::quant_available()
                && a.ne[0].is_multiple_of(a.dtype.vec_dot_type().block_size())));
    weight_ok
        && b.dtype == DType::F32
        && t.dtype == DType::F32
        && a.rows_contiguous()
        && t.rows_contiguous()
        && a.ne[0] == b.ne[0]
        && t.ne == [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]
        && a.ne[2] > 0
        && a.ne[3] > 0
        && b.ne[2].is_multiple_of(a.ne[2])
        && b.ne[3].is_multiple_of(a.ne[3])
}

/// Bytes of the src1 copy in the shared work area (0 when src1 is used in place).
pub(crate) fn shared_size(f: CpuFeatures, a: &Tensor, b: &Tensor) -> Result<usize> {
    // Reordered rows are as long as plain ones; whether the weight is repacked is not known
    // here, so the area is sized for the longer rows of the repacked Q4_0 prompt kernel
    // where it could run.
    match src1_conversion(f, a.dtype, true, b.rows_contiguous(), b.ne[1]) {
        Some(c) => c
            .row_bytes(b.ne[0])?
            .checked_mul(b.nrows())
            .ok_or(Error::SizeOverflow),
        None => Ok(0),
    }
}

/// f32 values of per-thread scratch MUL_MAT needs beyond `work_size`'s rows: the decoded
/// weight block of the AMX K-quant kernel where it may run (the src1 row count is not known
/// here, so whenever the CPU and type allow it).
pub(crate) fn scratch_floats(f: CpuFeatures, a: &Tensor) -> usize {
    #[cfg(target_arch = "x86_64")]
    if kquant_amx::takes(f, a.dtype, kquant::MIN_ROWS) {
        return kquant_amx::scratch_bytes(a.ne[0] / rgml::quant::QK_K).div_ceil(4) + 16;
    }
    let _ = (f, a);
    0
}

/// What phase 1 makes of src1 in the work area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Src1 {
    /// Quantized to the weight type's vec-dot type.
    Quantized(DType),
    /// Quantized to Q8_K with each block's quants in the piece order of the AVX-512 K-quant
    /// tiles ([`kquant_avx512`]), which alone read them.
    Q8kPieces,
    /// Quantized to Q8_0, with each block's 4-byte sums and its scale as f32 beside it: what
    /// the prompt kernel of repacked Q4_0 weights reads ([`q4_prompt`]).
    Q8_0Sums,
    /// Rounded through F16/BF16: ggml multiplies F16/BF16 weights with activations rounded
    /// to the weight type (its `vec_dot_type`), which gives llama.cpp's answers.
    Rounded(DType),
    /// Gathered into dense f32 rows (a strided src1 of f32 weights).
    Dense,
    /// Rounded to bf16 and stored so (ggml's `vec_dot_type` for BF16 weights), for the
    /// `vdpbf16ps` kernels of [`super::bf16`] ([`CpuFeatures::bf16_products`]).
    Bf16,
}

impl Src1 {
    /// Bytes of one converted row of `n` values.
    fn row_bytes(self, n: usize) -> Result<usize> {
        let dtype = match self {
            Src1::Q8_0Sums => return q4_prompt::row_bytes(n),
            Src1::Quantized(vd) => vd,
            Src1::Q8kPieces => DType::Q8_K,
            Src1::Bf16 => DType::BF16,
            Src1::Rounded(_) | Src1::Dense => DType::F32,
        };
        Ok(dtype.row_bytes(n)?)
    }
}

/// How MUL_MAT with weights of `weight` (repacked where `packed`) converts its src1 in phase 1
/// (`None`: used in place), on a backend with features `f`, when its arithmetic is chosen as
/// for `path_rows` src1 rows ([`path_rows`]).
pub(crate) fn src1_conversion(
    f: CpuFeatures,
    weight: DType,
    packed: bool,
    src1_dense_rows: bool,
    path_rows: usize,
) -> Option<Src1> {
    if weight.is_quantized() {
        Some(if kquant_tiles(f, weight, path_rows).is_some() {
            Src1::Q8kPieces
        } else if packed && q4_prompt::takes(f, weight, path_rows) {
            Src1::Q8_0Sums
        } else {
            Src1::Quantized(weight.vec_dot_type())
        })
    } else if weight == DType::BF16 && f.bf16_products() {
        Some(Src1::Bf16)
    } else if matches!(weight, DType::F16 | DType::BF16) {
        Some(Src1::Rounded(weight))
    } else if !src1_dense_rows {
        Some(Src1::Dense)
    } else {
        None
    }
}

/// The src1 row count that chooses a MUL_MAT's arithmetic (ggml's paths depend on it): one for
/// a product whose rows are computed as alone, else src1's `ne[1]`.
pub(crate) fn path_rows(op: &rgml::Op, ne11: usize) -> usize {
    match op {
        rgml::Op::MulMat {
            rows_alone: true, ..
        } => 1,
        _ => ne11,
    }
}

/// The register-tiled K-quant kernels (which read activations in piece order, `Src1::Q8kPieces`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KquantTiles {
    Avx512,
    Avx2,
}

/// The register-tiled K-quant kernel plain weights of `dtype` by `path_rows` src1 rows take on
/// a CPU with `f` (`None`: AMX tiles, IQ4_XS, or another path); MUL_MAT_ID's experts choose the
/// same way.
pub(crate) fn kquant_tiles(f: CpuFeatures, dtype: DType, path_rows: usize) -> Option<KquantTiles> {
    #[cfg(target_arch = "x86_64")]
    if weight_kernels(dtype).is_some_and(|k| k.kquant_tiles)
        && !kquant_amx::takes(f, dtype, path_rows)
    {
        if kquant_avx512::takes(f, dtype, path_rows) {
            return Some(KquantTiles::Avx512);
        }
        if kquant_avx2::takes(f, dtype, path_rows) {
            return Some(KquantTiles::Avx2);
        }
    }
    let _ = (f, dtype, path_rows);
    None
}

/// src1 rows per tile of the quantized path.
const TILE1: usize = 16;

/// Activation rows per call of the packed-weight kernel.
const REPACK_COLS: usize = 8;

/// Weight rows per call of the packed-weight kernel (whole groups; prefetched together).
const PACKED_RUN_ROWS: usize = 16;

/// MUL_MAT.
pub(crate) fn mul_mat(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, a, b) = (&task.dst, task.src(0)?, task.src(1)?);
    let ne00 = a.ne[0];
    let quant = a.dtype.is_quantized();
    let f = task.features;
    let path_rows = path_rows(&task.op, b.ne[1]);
    let conversion = src1_conversion(f, a.dtype, a.packed, b.rows_contiguous(), path_rows);
    let converted = conversion.is_some();
    let wrow = conversion.map_or(Ok(0), |c| c.row_bytes(ne00))?;
    let nrows1 = b.nrows();
    if converted && wrow.saturating_mul(nrows1) > tc.shared.len {
        return Err(Error::Backend {
            backend: "CPU".into(),
            message: "MUL_MAT: work area smaller than planned".into(),
        });
    }

    // Phase 1: src1 into the work area. Every thread reaches the barrier, also on errors and
    // panics (the checks above depend only on the node, so all threads agree on them).
    if let (Some(conversion), false) = (conversion, task.reuse_src1) {
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            convert_src1(f, b, tc, conversion, wrow, nrows1)
        }));
        tc.barrier.wait();
        caught.unwrap_or_else(|_| {
            Err(Error::Backend {
                backend: "CPU".into(),
                message: "MUL_MAT: src1 conversion panicked".into(),
            })
        })?;
    }

    // Phase 2.
    if conversion == Some(Src1::Bf16) {
        let b_row = b_row_fn(b, tc.shared, converted, wrow);
        return bf16::products(f, dst, a, &b_row, path_rows, tc);
    }
    if !quant {
        let b_row = b_row_fn(b, tc.shared, converted, wrow);
        return float_products(f, dst, a, &b_row, path_rows, tc);
    }
    let products = QuantProducts {
        f,
        dst,
        a,
        b_row: b_row_fn(b, tc.shared, converted, wrow),
        ne11: b.ne[1],
        path_rows,
        nb: ne00 / a.dtype.vec_dot_type().block_size(),
        arow_bytes: a.row_bytes(),
        wrow,
        sums: conversion == Some(Src1::Q8_0Sums),
    };
    products.run([b.ne[2], b.ne[3]], tc)
}

/// Phase 2 of MUL_MAT with quantized weights: what every block of weight rows shares.
struct QuantProducts<'a, B> {
    f: CpuFeatures,
    dst: &'a task::TensorView,
    a: &'a task::TensorView,
    /// Where src1 row `(i11, i12, i13)` is ([`b_row_fn`]).
    b_row: B,
    /// src1 rows per batch.
    ne11: usize,
    /// The row count that chooses the arithmetic (1 for rows computed as alone).
    path_rows: usize,
    /// Blocks per weight row.
    nb: usize,
    /// Bytes of a weight row.
    arow_bytes: usize,
    /// Bytes of a src1 row in the work area.
    wrow: usize,
    /// Whether src1 is in the layout of the repacked Q4_0 prompt kernel (`Src1::Q8_0Sums`).
    sums: bool,
}

impl<B: Fn(usize, usize, usize) -> *const u8> QuantProducts<'_, B> {
    /// This thread's blocks of weight rows of the `ne12 x ne13` batches, each by the path
    /// the weights take: packed, register tiles, or pair by pair.
    fn run(&self, [ne12, ne13]: [usize; 2], tc: &mut ThreadCtx<'_>) -> Result<()> {
        let (f, a) = (self.f, self.a);
        let ne01 = a.ne[1];
        let r2 = ne12 / a.ne[2].max(1);
        let r3 = ne13 / a.ne[3].max(1);
        let batches = ne12 * ne13;
        // Packed weights are addressed by whole groups of rows (their row count is a multiple
        // of the group).
        let group = if a.packed { repack::GROUP_ROWS } else { 1 };
        let blk = task::row_block(ne01, batches, tc.nth, 1, group);
        let nblk = ne01.div_ceil(blk);
        let path = QuantPath::choose(f, a.dtype, a.packed, self.ne11, self.path_rows);
        // Blocks on demand: a descheduled thread's share goes to the others.
        for unit in task::claimed(tc.claim, batches * nblk) {
            let batch = unit / nblk;
            let i0 = (unit % nblk) * blk;
            let (i12, i13) = (batch % ne12, batch / ne12);
            let (i02, i03) = (i12 / r2.max(1), i13 / r3.max(1));
            let rows = i0..(i0 + blk).min(ne01);
            let at = [i02, i03, i12, i13];
            match path {
                QuantPath::Packed => {
                    let scratch = bytemuck::cast_slice_mut::<f32, u8>(&mut *tc.scratch);
                    self.packed(rows, at, scratch);
                }
                QuantPath::Matvec(kernel) => self.matvec(kernel, rows, at),
                QuantPath::Cols(kernel, packed) => {
                    self.cols(kernel, packed, rows, at, tc.scratch)?
                }
                #[cfg(target_arch = "x86_64")]
                QuantPath::KquantAmx => {
                    let scratch = bytemuck::cast_slice_mut::<f32, u8>(&mut *tc.scratch);
                    self.ktiled_amx(rows, at, scratch)?;
                }
                #[cfg(target_arch = "x86_64")]
                QuantPath::KquantAvx512 => {
                    // SAFETY: `kquant_tiles` chose the kernel for this CPU and type; the loop
                    // passes dense in-bounds weight rows of `nb` blocks and the src1 rows,
                    // complete in the work area since the barrier, `nb` Q8_K blocks each in
                    // piece order (`Q8kPieces`).
                    let tiles = |x: &[*const u8], y: &[*const u8], out: &mut _| unsafe {
                        kquant_avx512::rows(f, a.dtype, self.nb, x, y, out)
                    };
                    // SAFETY: `tiles` computes every output of the rows it is given.
                    unsafe { self.ktiled_strips(rows, at, tiles) }
                }
                #[cfg(target_arch = "x86_64")]
                QuantPath::KquantAvx2 => {
                    // SAFETY: as for `KquantAvx512`.
                    let tiles = |x: &[*const u8], y: &[*const u8], out: &mut _| unsafe {
                        kquant_avx2::rows(a.dtype, self.nb, x, y, out)
                    };
                    // SAFETY: `tiles` computes every output of the rows it is given.
                    unsafe { self.ktiled_strips(rows, at, tiles) }
                }
                #[cfg(not(target_arch = "x86_64"))]
                QuantPath::KquantAmx | QuantPath::KquantAvx512 | QuantPath::KquantAvx2 => {
                    self.ktiled(rows, at)
                }
                QuantPath::Kquant => self.ktiled(rows, at),
                QuantPath::Tiled => self.tiled(rows, at),
                QuantPath::Pairs => self.pairs(rows, at)?,
            }
        }
        Ok(())
    }

    /// Weight rows `rows` of weight batch (i02, i03) times src1 batch (i12, i13), packed
    /// weights (a repacking buffer): each group of rows is one contiguous stream of interleaved
    /// blocks; runs of groups are multiplied by up to 8 activation rows per kernel call.
    /// `scratch` holds a group (sized by `work_size`).
    fn packed(&self, rows: Range<usize>, [i02, i03, i12, i13]: [usize; 4], scratch: &mut [u8]) {
        let (f, a, ne11) = (self.f, self.a, self.ne11);
        let g = repack::GROUP_ROWS;
        let mut out = [0f32; PACKED_RUN_ROWS * REPACK_COLS];
        for t0 in (0..ne11).step_by(TILE1) {
            let t1 = (t0 + TILE1).min(ne11);
            for r0 in rows.clone().step_by(PACKED_RUN_ROWS) {
                let r1 = (r0 + PACKED_RUN_ROWS).min(rows.end);
                let first = a.row(r0, i02, i03).cast_const();
                if ne11 == 1 && !repack::avx2_matvec(f) {
                    self.prefetch_rows(first, r1 - r0);
                }
                for c0 in (t0..t1).step_by(REPACK_COLS) {
                    let c1 = (c0 + REPACK_COLS).min(t1);
                    let mut y = [std::ptr::null::<u8>(); REPACK_COLS];
                    for (slot, i11) in y.iter_mut().zip(c0..c1) {
                        *slot = (self.b_row)(i11, i12, i13);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if self.sums {
                        let mut outs = [std::ptr::null_mut::<f32>(); REPACK_COLS];
                        for (slot, i11) in outs.iter_mut().zip(c0..c1) {
                            *slot = self.dst.row(i11, i12, i13).wrapping_add(r0 * 4).cast();
                        }
                        // SAFETY: as below; phase 1 wrote the rows in the prepared layout,
                        // which `src1_conversion` chose only where `q4_prompt::takes` holds;
                        // rows r0..r1 of each destination column are in bounds (dense f32
                        // rows of ne01) and written by this thread only (its row block).
                        unsafe {
                            q4_prompt::tile_groups(
                                self.nb,
                                first,
                                (r1 - r0) / g,
                                &y[..c1 - c0],
                                &outs[..c1 - c0],
                            )
                        };
                        continue;
                    }
                    // SAFETY: `a.packed` means the weight is in the packed layout (the backend
                    // checked its dtype and shape); rows r0..r1 are whole groups (r0 and ne01
                    // are multiples of the group size) in bounds; the src1 rows are complete
                    // in the work area since phase 1, `nb` blocks each; `out` holds
                    // (r1 - r0) x REPACK_COLS; the scratch holds a group.
                    unsafe {
                        repack::tile_groups(
                            f,
                            a.dtype,
                            self.nb,
                            first,
                            (r1 - r0) / g,
                            &y[..c1 - c0],
                            &mut out,
                            REPACK_COLS,
                            scratch,
                        )
                    };
                    store_tile(self.dst, r0..r1, c0..c1, i12, i13, &out, REPACK_COLS);
                }
            }
        }
    }

    /// As [`Self::packed`], plain weights in register tiles: rows x columns computed
    /// together, bit-equal to the pair dots.
    fn tiled(&self, rows: Range<usize>, [i02, i03, i12, i13]: [usize; 4]) {
        let (f, a, ne11) = (self.f, self.a, self.ne11);
        let (rm, rn) = (legacy::tile_rows(f), legacy::tile_cols(f));
        let mut out = [0f32; 4 * legacy::TILE_COLS];
        for t0 in (0..ne11).step_by(TILE1) {
            let t1 = (t0 + TILE1).min(ne11);
            for r0 in rows.clone().step_by(rm) {
                let r1 = (r0 + rm).min(rows.end);
                let mut x = [std::ptr::null::<u8>(); 4];
                for (slot, i01) in x.iter_mut().zip(r0..r1) {
                    *slot = a.row(i01, i02, i03).cast_const();
                }
                if ne11 == 1 {
                    self.prefetch_rows(x[0], r1 - r0);
                }
                for c0 in (t0..t1).step_by(rn) {
                    let c1 = (c0 + rn).min(t1);
                    let mut y = [std::ptr::null::<u8>(); legacy::TILE_COLS];
                    for (slot, i11) in y.iter_mut().zip(c0..c1) {
                        *slot = (self.b_row)(i11, i12, i13);
                    }
                    // SAFETY: tiled::takes(f, a.dtype, ..); the src0 rows are dense and in
                    // bounds, the src1 rows complete in the work area since the barrier, each
                    // `nb` blocks; `out` holds rm x TILE_COLS.
                    unsafe {
                        legacy::tile(
                            f,
                            a.dtype,
                            self.nb,
                            &x[..r1 - r0],
                            &y[..c1 - c0],
                            &mut out,
                            rn,
                        )
                    };
                    store_tile(self.dst, r0..r1, c0..c1, i12, i13, &out, rn);
                }
            }
        }
    }

    /// One activation row (a generation step) by `kernel`: on the AVX2 build (see
    /// [`crate::kernels::tiles::legacy::matvec_kernel`]), and for IQ4_NL and MXFP4 weights on
    /// either build ([`crate::kernels::dots::lowbit::nibble_matvec`]).
    fn matvec(
        &self,
        kernel: crate::kernels::dots::run::MatvecKernel,
        rows: Range<usize>,
        [i02, i03, i12, i13]: [usize; 4],
    ) {
        let a = self.a;
        let y = (self.b_row)(0, i12, i13);
        let mut out = [0f32; task::MAX_BLOCK_ROWS];
        // One pass: `row_block` makes blocks of at most MAX_BLOCK_ROWS rows.
        for r0 in rows.clone().step_by(task::MAX_BLOCK_ROWS) {
            let r1 = (r0 + task::MAX_BLOCK_ROWS).min(rows.end);
            let run = crate::kernels::dots::run::RowRun {
                nb: self.nb,
                x0: a.row(r0, i02, i03).cast_const(),
                row_stride: a.nb[1],
                y,
            };
            // SAFETY: `kernel` is the matrix-vector kernel of the weight type; the src0 rows
            // r0..r1 are dense, in bounds and `a.nb[1]` apart, `nb` blocks each; the src1 row
            // is complete in the work area since the barrier, `nb` blocks.
            unsafe { kernel(run, &mut out[..r1 - r0]) };
            store_tile(self.dst, r0..r1, 0..1, i12, i13, &out, 1);
        }
    }

    /// Several activation rows on the AVX2 build, by `kernel` (see
    /// [`crate::kernels::tiles::legacy::cols_kernel`]): chunks of weight rows, each by every tile of up to
    /// [`crate::kernels::tiles::legacy::COLS`] columns, whose block scales are widened once per chunk into
    /// `scratch`.
    fn cols(
        &self,
        kernel: legacy::ColsKernel,
        packed: bool,
        rows: Range<usize>,
        [i02, i03, i12, i13]: [usize; 4],
        scratch: &mut [f32],
    ) -> Result<()> {
        const COLS: usize = legacy::COLS;
        // Weight rows per chunk: their bytes stay in L1/L2 while every column tile reads them.
        const CHUNK: usize = 128;
        let (a, ne11) = (self.a, self.ne11);
        let scales = scratch_slice(scratch, legacy::scales_len(self.nb))?;
        let mut out = [0f32; COLS];
        for r0 in rows.clone().step_by(CHUNK) {
            let r1 = (r0 + CHUNK).min(rows.end);
            for c0 in (0..ne11).step_by(COLS) {
                let c1 = (c0 + COLS).min(ne11);
                let mut y = [std::ptr::null::<u8>(); COLS];
                for (slot, i11) in y.iter_mut().zip(c0..c1) {
                    *slot = (self.b_row)(i11, i12, i13);
                }
                let y = &y[..c1 - c0];
                // SAFETY: the src1 rows are complete in the work area since the barrier, `nb`
                // blocks of the vec-dot type each; `scales` holds scales_len(nb).
                unsafe { legacy::widen_scales(a.dtype, self.nb, y, scales) };
                for i01 in r0..r1 {
                    let g = repack::GROUP_ROWS;
                    let x = match packed {
                        true => repack::row_view(a.dtype, a.row(i01 / g * g, i02, i03), i01 % g),
                        false => Some(legacy::WeightRow::dense(a.dtype, a.row(i01, i02, i03))),
                    };
                    let x = x.ok_or_else(|| Error::Backend {
                        backend: "CPU".into(),
                        message: format!("MUL_MAT: {} weights are never repacked", a.dtype),
                    })?;
                    // SAFETY: `kernel` is the weight type's; the src0 row is in bounds with
                    // `nb` blocks, dense or (`packed`: the weight is in the packed layout, whole
                    // groups) in its group; `y` and `scales` as above; `out` holds COLS.
                    unsafe { kernel(self.nb, x, y, scales, &mut out) };
                    store_tile(self.dst, i01..i01 + 1, c0..c1, i12, i13, &out, COLS);
                }
            }
        }
        Ok(())
    }

    /// As [`Self::packed`], K-quant weights by 8 or more activation rows, with the arithmetic
    /// of ggml's tiled kernel ([`super::ktiled`]): each weight row against runs of up to
    /// [`crate::kernels::tiles::kquant::COLS`] activation rows, its blocks decoded once per run.
    fn ktiled(&self, rows: Range<usize>, [i02, i03, i12, i13]: [usize; 4]) {
        const COLS: usize = kquant::COLS;
        let (a, ne11) = (self.a, self.ne11);
        let mut acc = [0f32; COLS];
        let mut y = [std::ptr::null::<u8>(); COLS];
        for c0 in (0..ne11).step_by(COLS) {
            let c1 = (c0 + COLS).min(ne11);
            for (slot, i11) in y.iter_mut().zip(c0..c1) {
                *slot = (self.b_row)(i11, i12, i13);
            }
            for i01 in rows.clone() {
                let x = a.row(i01, i02, i03).cast_const();
                // SAFETY: `ktiled::takes` checked the type; the src0 row is dense and in
                // bounds with `nb` blocks, the src1 rows complete in the work area since the
                // barrier, `nb` Q8_K blocks each.
                unsafe { kquant::row(self.f, a.dtype, self.nb, x, &y[..c1 - c0], &mut acc) };
                for (&v, i11) in acc.iter().zip(c0..c1) {
                    let out = self.dst.row(i11, i12, i13).wrapping_add(i01 * 4);
                    // SAFETY: output element (i01, i11, i12, i13) is in bounds and written
                    // only by the thread owning row block (batch, i01).
                    unsafe { out.cast::<f32>().write(v) };
                }
            }
        }
    }

    /// As [`Self::ktiled`] in register tiles of `R` weight rows ([`kquant_avx512`],
    /// [`kquant_avx2`], called as `kernel(weight rows, activation rows, out)`; phase 1 left the
    /// activations in piece order): runs of up to [`kquant::TILE_RUN`] activation rows, each by
    /// strips of `R` weight rows whose blocks are decoded once per run.
    ///
    /// # Safety
    /// `kernel` computes `out[c][r]` for the strip's rows and the run's columns from rows as
    /// this loop passes them (dense, in bounds, `nb` blocks; `Q8kPieces` activations).
    unsafe fn ktiled_strips<const R: usize>(
        &self,
        rows: Range<usize>,
        [i02, i03, i12, i13]: [usize; 4],
        kernel: impl Fn(&[*const u8], &[*const u8], &mut [[f32; R]; kquant::TILE_RUN]),
    ) {
        const COLS: usize = kquant::TILE_RUN;
        let (a, ne11) = (self.a, self.ne11);
        let mut out = [[0f32; R]; COLS];
        let mut y = [std::ptr::null::<u8>(); COLS];
        for c0 in (0..ne11).step_by(COLS) {
            let c1 = (c0 + COLS).min(ne11);
            for (slot, i11) in y.iter_mut().zip(c0..c1) {
                *slot = (self.b_row)(i11, i12, i13);
            }
            for r0 in rows.clone().step_by(R) {
                let r1 = (r0 + R).min(rows.end);
                let x: [*const u8; R] =
                    std::array::from_fn(|r| a.row((r0 + r).min(r1 - 1), i02, i03).cast_const());
                kernel(&x[..r1 - r0], &y[..c1 - c0], &mut out);
                for (col, i11) in out.iter().zip(c0..c1) {
                    let dst = self.dst.row(i11, i12, i13).wrapping_add(r0 * 4);
                    // SAFETY: output elements (r0..r1, i11, i12, i13) are in bounds, dense
                    // (f32 rows), and written only by the thread owning row block (batch, r0).
                    unsafe { kquant::store_column(col, dst.cast(), r1 - r0) };
                }
            }
        }
    }

    /// As [`Self::ktiled`] on AMX tiles ([`kquant_amx`]): runs of 64 weight rows, each
    /// decoded once into `scratch` for all the activation rows.
    #[cfg(target_arch = "x86_64")]
    fn ktiled_amx(
        &self,
        rows: Range<usize>,
        [i02, i03, i12, i13]: [usize; 4],
        scratch: &mut [u8],
    ) -> Result<()> {
        let a = self.a;
        let need = kquant_amx::scratch_bytes(self.nb);
        let len = scratch.len();
        let scratch = scratch.get_mut(..need).ok_or_else(|| Error::Backend {
            backend: "CPU".into(),
            message: format!("MUL_MAT: AMX scratch of {len} bytes too small for {need}"),
        })?;
        let y0 = (self.b_row)(0, i12, i13);
        let dst0 = self.dst.row(0, i12, i13);
        for r0 in rows.clone().step_by(kquant_amx::CALL_ROWS) {
            let mrows = kquant_amx::CALL_ROWS.min(rows.end - r0);
            // SAFETY: `kquant_amx::takes` checked the CPU and type; weight rows r0..r0 + mrows
            // are dense and in bounds, `a.nb[1]` apart, `nb` blocks each; the ne11 src1 rows
            // of batch (i12, i13) are complete in the work area since the barrier, `wrow`
            // apart, `nb` Q8_K blocks each; the outputs (i01 in r0..r0 + mrows, every i11)
            // are in bounds, `dst.nb[1]` apart, and written only by the thread owning this
            // row block; `scratch` has the size the kernel needs.
            unsafe {
                kquant_amx::rows(
                    a.dtype,
                    self.nb,
                    (a.row(r0, i02, i03).cast_const(), a.nb[1], mrows),
                    (y0, self.wrow, self.ne11),
                    (dst0.wrapping_add(r0 * 4), self.dst.nb[1]),
                    scratch,
                )
            };
        }
        Ok(())
    }

    /// Matrix-vector products stream weights from memory; the hardware prefetcher alone
    /// reaches about 12 GB/s here (measured), software prefetch of the `nrows` weight rows
    /// from `first` PREFETCH_AHEAD bytes on about 40% more.
    #[inline(always)]
    fn prefetch_rows(&self, first: *const u8, nrows: usize) {
        prefetch_span(first.wrapping_add(PREFETCH_AHEAD), nrows * self.arow_bytes);
    }

    /// As [`Self::packed`], other quantized weights pair by pair. Tiles of src1 rows keep a
    /// block of weight rows and a tile of activations in cache while every pair is multiplied.
    fn pairs(&self, rows: Range<usize>, [i02, i03, i12, i13]: [usize; 4]) -> Result<()> {
        let (f, a, ne11) = (self.f, self.a, self.ne11);
        let arow_bytes = self.arow_bytes;
        for t0 in (0..ne11).step_by(TILE1) {
            for i01 in rows.clone() {
                let row = a.row(i01, i02, i03).cast_const();
                if ne11 == 1 {
                    self.prefetch_rows(row, 1);
                }
                // SAFETY: a dense, in-bounds src0 row, read-only during this node.
                let x = unsafe { bytes(row, arow_bytes) };
                for i11 in t0..(t0 + TILE1).min(ne11) {
                    // SAFETY: a src1 row in the work area, complete since the barrier.
                    let y = unsafe { bytes((self.b_row)(i11, i12, i13), self.wrow) };
                    let v = dots::vec_dot(f, a.dtype, a.ne[0], x, y)?;
                    let out = self.dst.row(i11, i12, i13).wrapping_add(i01 * 4);
                    // SAFETY: output element (i01, i11, i12, i13) is in bounds and written
                    // only by the thread owning row block (batch, i01).
                    unsafe { out.cast::<f32>().write(v) };
                }
            }
        }
        Ok(())
    }
}

/// Write a tile's outputs: `out[r * stride + c]` is element (row `rows.start + r`, column
/// `cols.start + c`) of batch (i12, i13). The caller's thread owns the row block `rows` of
/// that batch (every quantized path splits the work so), and the indices are below `dst.ne`.
fn store_tile(
    dst: &task::TensorView,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    i12: usize,
    i13: usize,
    out: &[f32],
    stride: usize,
) {
    // Column by column: a column's rows are adjacent in `dst`, so its writes fill whole cache
    // lines in order instead of touching a line of every column for each row.
    for (c, i11) in cols.enumerate() {
        let column = dst.row(i11, i12, i13);
        for (r, i01) in rows.clone().enumerate() {
            let dst_el = column.wrapping_add(i01 * 4);
            // SAFETY: output element (i01, i11, i12, i13) is in bounds and written only by the
            // thread owning its row block (see above).
            unsafe { dst_el.cast::<f32>().write(out[r * stride + c]) };
        }
    }
}

/// Where src1 row `(i11, i12, i13)` is after phase 1: in the work area, or in place.
fn b_row_fn<'a>(
    b: &'a task::TensorView,
    shared: task::SharedWork,
    converted: bool,
    wrow: usize,
) -> impl Fn(usize, usize, usize) -> *const u8 + 'a {
    let (ne11, ne12) = (b.ne[1], b.ne[2]);
    move |i11, i12, i13| {
        if converted {
            shared
                .ptr
                .wrapping_add((i11 + ne11 * (i12 + ne12 * i13)) * wrow)
                .cast_const()
        } else {
            b.row(i11, i12, i13).cast_const()
        }
    }
}

/// Phase 2 for F32/F16/BF16 weights. The activation rows that share a weight matrix (every
/// src1 row of the `r2 x r3` batches broadcast onto it: grouped-query attention's heads) are
/// one set of columns, so each weight row is decoded once for all of them, and multiplied in
/// 4 x 4 tiles (edge tiles repeat a row or column and drop the copies) in `dot_f32_tinyblas`'s order.
fn float_products(
    f: CpuFeatures,
    dst: &task::TensorView,
    a: &task::TensorView,
    b_row: &dyn Fn(usize, usize, usize) -> *const u8,
    path_rows: usize,
    tc: &mut ThreadCtx<'_>,
) -> Result<()> {
    let (ne00, ne01) = (a.ne[0], a.ne[1]);
    // Where tinyBLAS declines, ggml runs the type's `vec_dot` pair by pair.
    let pairwise = !tinyblas_takes(f, ne00, ne01, path_rows);
    // The AVX-512 build's `vec_dot` reads weights in place where the CPU has AVX-512; its
    // tinyBLAS tiles are below.
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() && (!f.wide() || (pairwise && f.has_avx512())) {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C, and AVX-512 F/DQ/BW/VL where `wide`
        // is passed; `a` is F32/F16/BF16 (the caller's dispatch) with dense rows
        // (`supported`); `b_row` gives dense f32 rows of `ne00` (src1 in place, or
        // rounded/gathered in the work area since phase 1's barrier); tinyBLAS's order only
        // where `ne00 % 8 == 0` (`tinyblas_takes`) and never with `wide`.
        return unsafe { float_avx2::products(dst, a, b_row, tc, pairwise, f.wide()) };
    }
    let weight_batches = a.ne[2] * a.ne[3];
    let columns = task::Columns::new(dst, a);
    let ncols = columns.n;
    let column = |c: usize, i02: usize, i03: usize| columns.at(c, i02, i03);
    let blk = task::row_block(ne01, weight_batches, tc.nth, 4, 1);
    let nblk = ne01.div_ceil(blk);
    let arow_bytes = a.row_bytes();
    let avx512 = float::f32_tile_avx512(f);
    let flavor = match a.dtype {
        DType::F16 => Flavor::F16,
        DType::BF16 => Flavor::Bf16,
        _ => Flavor::F32,
    };
    // F16 rows (the KV cache) widen in registers instead of being decoded first.
    let direct_f16 = !pairwise && avx512 && a.dtype == DType::F16 && cfg!(target_arch = "x86_64");
    // Blocks on demand: a descheduled thread's share goes to the others.
    for unit in task::claimed(tc.claim, weight_batches * nblk) {
        let (i02, i03) = ((unit / nblk) % a.ne[2], unit / nblk / a.ne[2]);
        let i0 = (unit % nblk) * blk;
        let rows0 = i0..(i0 + blk).min(ne01);
        for r0 in rows0.clone().step_by(4) {
            let nr = (rows0.end - r0).min(4);
            let mut xs: [&[f32]; 4] = [&[]; 4];
            let mut halves: [&[u16]; 4] = [&[]; 4];
            if direct_f16 {
                for (slot, i01) in halves.iter_mut().zip(r0..r0 + nr) {
                    // SAFETY: a dense, in-bounds F16 row of src0, read-only during this node.
                    let src = unsafe { bytes(a.row(i01, i02, i03), arow_bytes) };
                    *slot = bytemuck::try_cast_slice(src).map_err(|_| Error::Backend {
                        backend: "CPU".into(),
                        message: "MUL_MAT: misaligned F16 row".into(),
                    })?;
                }
                for r in nr..4 {
                    halves[r] = halves[nr - 1];
                }
            } else if a.dtype == DType::F32 {
                for (slot, i01) in xs.iter_mut().zip(r0..r0 + nr) {
                    // SAFETY: a dense, in-bounds f32 row of src0, read-only during this node.
                    *slot = unsafe { f32_row(a.row(i01, i02, i03), ne00) };
                }
            } else {
                let tmp = scratch_slice(tc.scratch, nr * ne00)?;
                for (i01, row) in (r0..r0 + nr).zip(tmp.chunks_exact_mut(ne00.max(1))) {
                    // SAFETY: a dense, in-bounds F16/BF16 row of src0, read-only here.
                    let src = unsafe { bytes(a.row(i01, i02, i03), arow_bytes) };
                    row_to_f32(a.dtype, src, row)?;
                }
                for (slot, row) in xs.iter_mut().zip(tmp.chunks_exact(ne00.max(1))) {
                    *slot = row;
                }
            }
            for r in nr..4 {
                xs[r] = xs[nr - 1];
            }
            for c0 in (0..ncols).step_by(4) {
                let nc = (ncols - c0).min(4);
                let mut ys: [&[f32]; 4] = [&[]; 4];
                let mut at = [(0, 0, 0); 4];
                for (k, (slot, place)) in ys.iter_mut().zip(at.iter_mut()).enumerate() {
                    *place = column(c0 + k.min(nc - 1), i02, i03);
                    let (i11, i12, i13) = *place;
                    // SAFETY: a dense f32 src1 row (in place or in the work area).
                    *slot = unsafe { f32_row(b_row(i11, i12, i13), ne00) };
                }
                let mut out = [[0f32; 4]; 4];
                if pairwise {
                    for (row, x) in out.iter_mut().zip(&xs).take(nr) {
                        for (o, y) in row.iter_mut().zip(&ys).take(nc) {
                            *o = vec_dot(f, flavor, x, y);
                        }
                    }
                } else {
                    float::float_tile(f, direct_f16, &xs, &halves, &ys, &mut out);
                }
                for (r, row) in out.iter().enumerate().take(nr) {
                    for (&v, &(i11, i12, i13)) in row.iter().zip(&at).take(nc) {
                        let dst_el = dst.row(i11, i12, i13).wrapping_add((r0 + r) * 4);
                        // SAFETY: output element (r0 + r, i11, i12, i13) is in bounds and
                        // written only by the thread owning row block (i02, i03, r0 + r).
                        unsafe { dst_el.cast::<f32>().write(v) };
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether llamafile's tinyBLAS takes a float product of `ne01` weight rows of `ne00` by `ne11`
/// activation rows (`llamafile_sgemm` for F32, F16 and BF16 weights): two activation rows or
/// more (`n < 2` declines), whole vectors along the row (`k % KN`: 8 lanes on AVX2, 16 on
/// AVX-512) and whole 4-row tiles (`m % 4`).
pub(super) fn tinyblas_takes(f: CpuFeatures, ne00: usize, ne01: usize, ne11: usize) -> bool {
    let lanes = if f.wide() { 16 } else { 8 };
    ne11 >= 2 && ne00.is_multiple_of(lanes) && ne01.is_multiple_of(4)
}

/// Phase 1 of MUL_MAT: this thread's rows of src1 into the work area, as `conversion` says.
fn convert_src1(
    f: CpuFeatures,
    b: &task::TensorView,
    tc: &mut ThreadCtx<'_>,
    conversion: Src1,
    wrow: usize,
    nrows1: usize,
) -> Result<()> {
    let ne00 = b.ne[0];
    let round_to = match conversion {
        Src1::Rounded(t) => Some(t),
        _ => None,
    };
    for r in tc.split(nrows1) {
        let (i11, i12, i13) = b.row_index(r);
        let srow = b.row(i11, i12, i13);
        let out = tc.shared.ptr.wrapping_add(r * wrow);
        let row: &[f32] = if b.rows_contiguous() && round_to.is_none() {
            // SAFETY: a dense, in-bounds f32 row of src1, read-only during this node.
            unsafe { f32_row(srow, ne00) }
        } else {
            let tmp = scratch_slice(tc.scratch, ne00)?;
            for (t, v) in tmp.iter_mut().enumerate() {
                // SAFETY: element `t` of an in-bounds src1 row.
                *v = unsafe { srow.add(t * b.nb[0]).cast::<f32>().read_unaligned() };
            }
            match round_to {
                Some(DType::F16) => convert::round_through_f16(tmp),
                Some(DType::BF16) => convert::round_through_bf16(tmp),
                _ => {}
            }
            tmp
        };
        // SAFETY: row `r` of the work area (in bounds: the caller checked the area's size),
        // written by this thread only; other threads read it only after the barrier.
        let dstb = unsafe { bytes_mut(out, wrow) };
        match conversion {
            Src1::Quantized(vd) => quantize_activations(f, vd, row, dstb)?,
            Src1::Q8kPieces => {
                quantize_activations(f, DType::Q8_K, row, dstb)?;
                kquant::to_piece_order(dstb)?;
            }
            Src1::Q8_0Sums => {
                let q8 = DType::Q8_0.row_bytes(ne00)?;
                quantize_activations(f, DType::Q8_0, row, &mut dstb[..q8])?;
                q4_prompt::prepare(f, dstb)?;
            }
            Src1::Bf16 => bf16::row_to_bf16(row, dstb)?,
            Src1::Rounded(_) | Src1::Dense => row_from_f32(DType::F32, row, dstb)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The capability table says what the floors' own checks say, for every type.
    #[test]
    fn the_table_agrees_with_the_kernels() {
        let f = CpuFeatures::detect();
        for dtype in DType::ALL {
            let Some(caps) = weight_kernels(dtype) else {
                assert!(
                    !repack::supported(dtype) && !kquant::takes(dtype, 64),
                    "{dtype}"
                );
                continue;
            };
            assert_eq!(caps.repack, repack::supported(dtype), "{dtype}");
            assert_eq!(caps.kquant_tiles, kquant::takes(dtype, 64), "{dtype}");
            if f.has_avx2() {
                assert_eq!(caps.register_tiles, legacy::supported(f, dtype), "{dtype}");
            }
            assert_eq!(caps.float_tiles, !dtype.is_quantized(), "{dtype}");
        }
    }

    /// MXFP4 weights take `vec_dot`'s arithmetic at every row count, as in ggml (no tinyBLAS,
    /// tiled or AMX kernel takes them): the pair dots, or for one row the matrix-vector kernel
    /// with `vec_dot`'s bits where the CPU has AVX2.
    #[test]
    fn mxfp4_takes_only_vec_dot_paths() {
        let native = CpuFeatures::detect();
        for f in [native, native.without_simd()] {
            for rows in [1, 2, 5, 8, 16, 64] {
                let path = QuantPath::choose(f, DType::MXFP4, false, rows, rows);
                let matvec = matches!(path, QuantPath::Matvec(_));
                assert!(matvec || matches!(path, QuantPath::Pairs), "{rows} rows");
                assert_eq!(matvec, rows == 1 && f.has_avx2(), "{rows} rows");
            }
        }
    }
}
