//! FLASH_ATTN_EXT with ggml's semantics and the arithmetic of ggml-cpu's three kernels, picked
//! as ggml picks them (`ggml_compute_forward_flash_attn_ext_f16`):
//! - one query over 512 cells or more, f16 or f32 K and V: the cells split into one chunk per
//!   thread of the backend, merged in order ([`row::split_cells`]); as in ggml, the rounding
//!   follows the backend's thread count (not the governor's: see [`crate::backend`]);
//! - 64 queries or more, f16 or f32 K and V of one type: the tiled kernel ([`tiled`]);
//! - otherwise, and for quantized K or V, each query row on its own ([`row::rows`]).
//!
//! Every path computes each output with the same operations however the rows are shared
//! between the running threads.

#[cfg(target_arch = "x86_64")]
mod block;
mod common;
mod row;
mod tiled;

pub(crate) use common::FlashParams;

use crate::kernels::task::{NodeTask, ThreadCtx};
use common::Path;
use rgml::{DType, Result, Tensor};

/// FLASH_ATTN_EXT: this thread's share.
pub(crate) fn flash_attn_ext(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    p: &FlashParams,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if task.features.has_avx512() {
        // SAFETY: the features say the CPU has AVX-512 F, DQ, BW and VL, AVX2, FMA and F16C.
        return unsafe { flash_attn_ext_avx512(task, tc, p) };
    }
    #[cfg(target_arch = "x86_64")]
    if task.features.has_avx2() {
        // SAFETY: the features say the CPU has AVX2, FMA and F16C.
        return unsafe { flash_attn_ext_fma(task, tc, p) };
    }
    dispatch(task, tc, p)
}

/// [`dispatch`] compiled with AVX2 and FMA: the `mul_add`s are single FMA instructions and the
/// per-element loops vectorise (each element's operations stay the same).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn flash_attn_ext_fma(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    p: &FlashParams,
) -> Result<()> {
    dispatch(task, tc, p)
}

/// [`dispatch`] compiled with AVX-512: 16-lane vectors for the same per-element operations.
///
/// # Safety
/// The CPU must support AVX-512 F, DQ, BW and VL, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn flash_attn_ext_avx512(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    p: &FlashParams,
) -> Result<()> {
    dispatch(task, tc, p)
}

#[inline(always)]
fn dispatch(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &FlashParams) -> Result<()> {
    let (q, k, v) = (task.src(0)?, task.src(1)?, task.src(2)?);
    match Path::of(q.ne, k.ne[1], k.dtype, v.dtype) {
        Path::SplitCells => row::split_cells(task, tc, p),
        Path::Tiled => tiled::tiled(task, tc, p),
        Path::Rows => row::rows(task, tc, p),
    }
}

/// The work a FLASH_ATTN_EXT node needs on a backend of `threads` threads: `(shared bytes,
/// per-thread f32 values)`.
pub(crate) fn work_size(s: &[&Tensor], threads: usize) -> Option<(usize, usize)> {
    let (q, k, v) = (s.first()?, s.get(1)?, s.get(2)?);
    let (dk, dv) = (k.ne[0], v.ne[0]);
    Some(match Path::of(q.ne, k.ne[1], k.dtype, v.dtype) {
        Path::SplitCells => (
            row::partials_bytes(q.ne[2], dv, threads.max(1))?,
            row::scratch_floats(dk, dv),
        ),
        Path::Tiled => (0, tiled::scratch_floats(dk, dv)),
        Path::Rows => (0, row::scratch_floats(dk, dv)),
    })
}

/// K and V types the kernels take: f16 and f32, and the quantized caches llama.cpp's
/// `--cache-type-k/v` offers that have been checked against ggml here (Q8_0, Q4_0).
pub(crate) fn kv_type_supported(t: DType) -> bool {
    rgml::op::FLASH_ATTN_KV_TYPES.contains(&t)
}

/// Whether the task's shapes are ones [`flash_attn_ext`] reads in bounds.
pub(crate) fn supported(dst: &Tensor, s: &[&Tensor], mask: bool, sinks: bool) -> bool {
    let n = 3 + usize::from(mask) + usize::from(sinks);
    if s.len() != n {
        return false;
    }
    let (q, k, v) = (s[0], s[1], s[2]);
    let dense = |t: &Tensor| t.rows_contiguous();
    q.dtype == DType::F32
        && kv_type_supported(k.dtype)
        && kv_type_supported(v.dtype)
        && k.ne[0].is_multiple_of(k.dtype.block_size())
        && v.ne[0].is_multiple_of(v.dtype.block_size())
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
