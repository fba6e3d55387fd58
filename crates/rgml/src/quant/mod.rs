//! Quantized block formats and their reference codecs.
//!
//! This module owns the bit layout of every quantized block (bit-compatible with ggml and GGUF)
//! and the *reference* conversions between f32 and each storage dtype: ggml's
//! quantizers as `llama-quantize` runs them without an importance matrix (`quantize_<type>(...,
//! NULL)`, which for most types is `quantize_row_*_ref`) and `dequantize_row_*`, reproduced with
//! the same float arithmetic and rounding so that files written by rgml are byte-identical to
//! ggml's. Every quantizer here works block by block (a block's bytes depend on that block's
//! values only), so a "row" may hold any number of blocks and the result does not depend on how
//! rows are grouped, just as with ggml's NULL-imatrix paths. Kernels that compute on blocks (dot
//! products, matmul) live in the backends and use the block structs exported here.
//!
//! Two levels of API:
//! - [`quantize_row`] / [`dequantize_row`]: dtype-dispatched, on raw little-endian bytes that
//!   need not be aligned;
//! - [`QuantBlock`], [`quantize_blocks`], [`dequantize_blocks`] and [`cast_blocks`]: typed
//!   blocks, for kernels that want to skip the per-call dispatch.

mod iq4;
mod kquants;
mod kquants_low;
mod legacy;
mod mxfp4;

pub use iq4::{best_index_iq4nl, BlockIQ4_NL, BlockIQ4_XS, KVALUES_IQ4NL, QK4_NL};
pub use kquants::{
    nearest_int, scale_min_k4, BlockQ4_K, BlockQ5_K, BlockQ6_K, BlockQ8_K, K_SCALE_SIZE, QK_K,
};
pub use kquants_low::{q3_k_scale, BlockQ2_K, BlockQ3_K};
pub use legacy::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK4_0, QK4_1, QK5_0, QK5_1,
    QK8_0, QK8_1,
};
pub use mxfp4::{e8m0_to_f32_half, BlockMXFP4, KVALUES_MXFP4, QK_MXFP4};

use crate::dtype::DType;
use crate::error::{Error, Result};
use bytemuck::Pod;
use half::{bf16, f16};
use std::borrow::Cow;

/// A quantized block type: `DTYPE.block_size()` values stored in `DTYPE.block_bytes()` bytes.
pub trait QuantBlock: Pod {
    /// The dtype this block stores.
    const DTYPE: DType;
    /// The decoded values of one block: `[f32; DTYPE.block_size()]`.
    type Values: Pod;
    /// Encode one block as ggml's NULL-imatrix quantizer for the type does.
    fn quantize(x: &Self::Values) -> Self;
    /// Decode one block.
    fn dequantize(&self, y: &mut Self::Values);
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

/// Views `values` as whole blocks of `B::Values`; an error if it is not a whole number of blocks.
fn value_blocks<B: QuantBlock>(values: &[f32]) -> Result<&[B::Values]> {
    bytemuck::try_cast_slice(values).map_err(|_| Error::BlockMisaligned {
        dtype: B::DTYPE,
        n: values.len(),
        block: B::DTYPE.block_size(),
    })
}

fn value_blocks_mut<B: QuantBlock>(values: &mut [f32]) -> Result<&mut [B::Values]> {
    let n = values.len();
    bytemuck::try_cast_slice_mut(values).map_err(|_| Error::BlockMisaligned {
        dtype: B::DTYPE,
        n,
        block: B::DTYPE.block_size(),
    })
}

/// Quantize `src` into typed blocks; `src.len()` must be `dst.len()` blocks.
pub fn quantize_blocks<B: QuantBlock>(src: &[f32], dst: &mut [B]) -> Result<()> {
    let xs = value_blocks::<B>(src)?;
    check_len("quantize_blocks dst blocks", xs.len(), dst.len())?;
    for (x, b) in xs.iter().zip(dst) {
        *b = B::quantize(x);
    }
    Ok(())
}

/// Decode typed blocks into `dst`; `dst.len()` must be `src.len()` blocks.
pub fn dequantize_blocks<B: QuantBlock>(src: &[B], dst: &mut [f32]) -> Result<()> {
    let ys = value_blocks_mut::<B>(dst)?;
    check_len("dequantize_blocks src blocks", ys.len(), src.len())?;
    for (b, y) in src.iter().zip(ys) {
        b.dequantize(y);
    }
    Ok(())
}

/// View raw bytes as blocks of `B`: borrowed when `bytes` is suitably aligned, copied otherwise
/// (GGUF tensor data and mmapped files give no alignment guarantee for the block structs).
pub fn cast_blocks<B: QuantBlock>(bytes: &[u8]) -> Result<Cow<'_, [B]>> {
    let size = std::mem::size_of::<B>();
    let whole = bytes.len() / size * size;
    if whole != bytes.len() {
        return Err(Error::LengthMismatch {
            what: "block bytes (not a whole number of blocks)",
            expected: whole,
            actual: bytes.len(),
        });
    }
    match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => Ok(Cow::Borrowed(blocks)),
        Err(_) => bytes
            .chunks_exact(size)
            .map(|b| {
                bytemuck::try_pod_read_unaligned(b).map_err(|_| Error::LengthMismatch {
                    what: "block bytes",
                    expected: size,
                    actual: b.len(),
                })
            })
            .collect::<Result<Vec<B>>>()
            .map(Cow::Owned),
    }
}

fn quantize_bytes<B: QuantBlock>(src: &[f32], dst: &mut [u8]) -> Result<()> {
    let xs = value_blocks::<B>(src)?;
    check_len(
        "quantize_row dst bytes",
        B::DTYPE.row_bytes(src.len())?,
        dst.len(),
    )?;
    if let Ok(blocks) = bytemuck::try_cast_slice_mut::<u8, B>(dst) {
        for (x, b) in xs.iter().zip(blocks) {
            *b = B::quantize(x);
        }
    } else {
        for (x, out) in xs
            .iter()
            .zip(dst.chunks_exact_mut(std::mem::size_of::<B>()))
        {
            out.copy_from_slice(bytemuck::bytes_of(&B::quantize(x)));
        }
    }
    Ok(())
}

fn dequantize_bytes<B: QuantBlock>(src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_len(
        "dequantize_row src bytes",
        B::DTYPE.row_bytes(dst.len())?,
        src.len(),
    )?;
    let ys = value_blocks_mut::<B>(dst)?;
    let blocks = cast_blocks::<B>(src)?;
    for (b, y) in blocks.iter().zip(ys) {
        b.dequantize(y);
    }
    Ok(())
}

/// Quantize/convert a row of f32 into `dtype`'s bytes. `src.len()` must be a multiple of the
/// block size; `dst.len()` must equal `dtype.row_bytes(src.len())`. Works for F32 (copy), F16,
/// BF16 and every quantized type; `I32` is an error.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match dtype {
        DType::F32 => {
            check_len(
                "quantize_row dst bytes",
                dtype.row_bytes(src.len())?,
                dst.len(),
            )?;
            for (x, out) in src.iter().zip(dst.chunks_exact_mut(4)) {
                out.copy_from_slice(&x.to_le_bytes());
            }
            Ok(())
        }
        DType::F16 => {
            check_len(
                "quantize_row dst bytes",
                dtype.row_bytes(src.len())?,
                dst.len(),
            )?;
            f32_to_f16_bytes(src, dst);
            Ok(())
        }
        DType::BF16 => {
            check_len(
                "quantize_row dst bytes",
                dtype.row_bytes(src.len())?,
                dst.len(),
            )?;
            f32_to_bf16_bytes(src, dst);
            Ok(())
        }
        DType::I32 | DType::I64 => Err(Error::UnsupportedConversion(dtype)),
        DType::Q4_0 => quantize_bytes::<BlockQ4_0>(src, dst),
        DType::Q4_1 => quantize_bytes::<BlockQ4_1>(src, dst),
        DType::Q5_0 => quantize_bytes::<BlockQ5_0>(src, dst),
        DType::Q5_1 => quantize_bytes::<BlockQ5_1>(src, dst),
        DType::Q8_0 => quantize_bytes::<BlockQ8_0>(src, dst),
        DType::Q8_1 => quantize_bytes::<BlockQ8_1>(src, dst),
        DType::Q2_K => quantize_bytes::<BlockQ2_K>(src, dst),
        DType::Q3_K => quantize_bytes::<BlockQ3_K>(src, dst),
        DType::Q4_K => quantize_bytes::<BlockQ4_K>(src, dst),
        DType::Q5_K => quantize_bytes::<BlockQ5_K>(src, dst),
        DType::Q6_K => quantize_bytes::<BlockQ6_K>(src, dst),
        DType::Q8_K => quantize_bytes::<BlockQ8_K>(src, dst),
        DType::IQ4_NL => quantize_bytes::<BlockIQ4_NL>(src, dst),
        DType::IQ4_XS => quantize_bytes::<BlockIQ4_XS>(src, dst),
        DType::MXFP4 => quantize_bytes::<BlockMXFP4>(src, dst),
    }
}

/// Decode bytes of `dtype` into f32. `dst.len()` elements are produced; `src.len()` must equal
/// `dtype.row_bytes(dst.len())`. Works for F32, F16, BF16 and every quantized type; `I32` is an
/// error.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    match dtype {
        DType::F32 => {
            check_len(
                "dequantize_row src bytes",
                dtype.row_bytes(dst.len())?,
                src.len(),
            )?;
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            Ok(())
        }
        DType::F16 => {
            check_len(
                "dequantize_row src bytes",
                dtype.row_bytes(dst.len())?,
                src.len(),
            )?;
            f16_bytes_to_f32(src, dst);
            Ok(())
        }
        DType::BF16 => {
            check_len(
                "dequantize_row src bytes",
                dtype.row_bytes(dst.len())?,
                src.len(),
            )?;
            bf16_bytes_to_f32(src, dst);
            Ok(())
        }
        DType::I32 | DType::I64 => Err(Error::UnsupportedConversion(dtype)),
        DType::Q4_0 => dequantize_bytes::<BlockQ4_0>(src, dst),
        DType::Q4_1 => dequantize_bytes::<BlockQ4_1>(src, dst),
        DType::Q5_0 => dequantize_bytes::<BlockQ5_0>(src, dst),
        DType::Q5_1 => dequantize_bytes::<BlockQ5_1>(src, dst),
        DType::Q8_0 => dequantize_bytes::<BlockQ8_0>(src, dst),
        DType::Q8_1 => dequantize_bytes::<BlockQ8_1>(src, dst),
        DType::Q2_K => dequantize_bytes::<BlockQ2_K>(src, dst),
        DType::Q3_K => dequantize_bytes::<BlockQ3_K>(src, dst),
        DType::Q4_K => dequantize_bytes::<BlockQ4_K>(src, dst),
        DType::Q5_K => dequantize_bytes::<BlockQ5_K>(src, dst),
        DType::Q6_K => dequantize_bytes::<BlockQ6_K>(src, dst),
        DType::Q8_K => dequantize_bytes::<BlockQ8_K>(src, dst),
        DType::IQ4_NL => dequantize_bytes::<BlockIQ4_NL>(src, dst),
        DType::IQ4_XS => dequantize_bytes::<BlockIQ4_XS>(src, dst),
        DType::MXFP4 => dequantize_bytes::<BlockMXFP4>(src, dst),
    }
}

// The half-precision helpers take the slice-conversion fast path (which uses F16C and similar
// when available) whenever the byte buffer happens to be aligned, and go element by element
// otherwise. Both round to nearest even, like ggml's GGML_FP32_TO_FP16 / GGML_FP32_TO_BF16.
// Callers have checked that the lengths match (2 bytes per value).

fn f32_to_f16_bytes(src: &[f32], dst: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    if let Ok(out) = bytemuck::try_cast_slice_mut::<u8, f16>(dst) {
        out.convert_from_f32_slice(src);
    } else {
        for (x, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
            out.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
        }
    }
}

fn f16_bytes_to_f32(src: &[u8], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    if let Ok(h) = bytemuck::try_cast_slice::<u8, f16>(src) {
        h.convert_to_f32_slice(dst);
    } else {
        for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *y = f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
    }
}

fn f32_to_bf16_bytes(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
    }
}

fn bf16_bytes_to_f32(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

#[cfg(test)]
mod tests;
