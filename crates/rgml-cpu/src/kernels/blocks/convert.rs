//! Row conversions between element types and f32, and the bridge to the quantized codecs of
//! [`rgml::quant`] and the dot products of [`super::dot`].
//!
//! Plain types (F32/F16/BF16) are converted here with `half`'s slice conversions (which use the
//! CPU's conversion instructions when available); quantized rows go through the codecs.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rgml::{DType, Error, Result};

/// Whether the quantized codecs and dot products are linked in.
pub(crate) const fn quant_available() -> bool {
    QUANT
}

/// The codecs of [`rgml::quant`] and the dots of [`super::dot`] are linked in. A build
/// without them would set this to false, and the support table would drop every quantized path.
const QUANT: bool = true;

fn conversion_error(dtype: DType, what: &str) -> Error {
    Error::Unsupported {
        backend: "CPU".into(),
        what: format!("{what} for {dtype}"),
    }
}

/// Round every value to the nearest f16 and back (ggml's activations for F16 weights), with
/// `half`'s slice conversions: the CPU's conversion instructions, several values at a time,
/// where a per-value conversion costs a call each.
pub(crate) fn round_through_f16(values: &mut [f32]) {
    let mut halves = [f16::ZERO; 64];
    for chunk in values.chunks_mut(halves.len()) {
        let halves = &mut halves[..chunk.len()];
        halves.convert_from_f32_slice(chunk);
        halves.convert_to_f32_slice(chunk);
    }
}

/// Round every value to the nearest bf16 and back (ggml's activations for BF16 weights where
/// its `vec_dot_bf16` widens them: `GGML_FP32_TO_BF16`, round to nearest even, NaNs quieted
/// with their sign and top payload bits, as `half` rounds).
pub(crate) fn round_through_bf16(values: &mut [f32]) {
    for v in values {
        *v = half::bf16::from_f32(*v).to_f32();
    }
}

/// Decode a dense row of `dtype` (`dst.len()` elements) into f32.
pub(crate) fn row_to_f32(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let n = dst.len();
    match dtype {
        DType::F32 => {
            let src = src.get(..n * 4).ok_or_else(|| short(n * 4, src.len()))?;
            match bytemuck::try_cast_slice::<u8, f32>(src) {
                Ok(s) => dst.copy_from_slice(s),
                Err(_) => {
                    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                        *d = f32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
            }
            Ok(())
        }
        DType::F16 => {
            let src = src.get(..n * 2).ok_or_else(|| short(n * 2, src.len()))?;
            match bytemuck::try_cast_slice::<u8, f16>(src) {
                Ok(s) => s.convert_to_f32_slice(dst),
                Err(_) => {
                    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                        *d = f16::from_ne_bytes([c[0], c[1]]).to_f32();
                    }
                }
            }
            Ok(())
        }
        DType::BF16 => {
            let src = src.get(..n * 2).ok_or_else(|| short(n * 2, src.len()))?;
            match bytemuck::try_cast_slice::<u8, bf16>(src) {
                Ok(s) => s.convert_to_f32_slice(dst),
                Err(_) => {
                    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                        *d = bf16::from_ne_bytes([c[0], c[1]]).to_f32();
                    }
                }
            }
            Ok(())
        }
        DType::I32 | DType::I64 => Err(conversion_error(dtype, "conversion to f32")),
        q => dequantize_row(q, src, dst),
    }
}

/// Encode f32 values into a dense row of `dtype` (`src.len()` elements).
pub(crate) fn row_from_f32(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let n = src.len();
    match dtype {
        DType::F32 => {
            let len = dst.len();
            let dst = dst.get_mut(..n * 4).ok_or_else(|| short(n * 4, len))?;
            match bytemuck::try_cast_slice_mut::<u8, f32>(dst) {
                Ok(d) => d.copy_from_slice(src),
                Err(_) => {
                    for (c, v) in dst.chunks_exact_mut(4).zip(src) {
                        c.copy_from_slice(&v.to_ne_bytes());
                    }
                }
            }
            Ok(())
        }
        DType::F16 => {
            let len = dst.len();
            let dst = dst.get_mut(..n * 2).ok_or_else(|| short(n * 2, len))?;
            match bytemuck::try_cast_slice_mut::<u8, f16>(dst) {
                Ok(d) => d.convert_from_f32_slice(src),
                Err(_) => {
                    for (c, v) in dst.chunks_exact_mut(2).zip(src) {
                        c.copy_from_slice(&f16::from_f32(*v).to_ne_bytes());
                    }
                }
            }
            Ok(())
        }
        DType::BF16 => {
            let len = dst.len();
            let dst = dst.get_mut(..n * 2).ok_or_else(|| short(n * 2, len))?;
            match bytemuck::try_cast_slice_mut::<u8, bf16>(dst) {
                Ok(d) => d.convert_from_f32_slice(src),
                Err(_) => {
                    for (c, v) in dst.chunks_exact_mut(2).zip(src) {
                        c.copy_from_slice(&bf16::from_f32(*v).to_ne_bytes());
                    }
                }
            }
            Ok(())
        }
        DType::I32 | DType::I64 => Err(conversion_error(dtype, "conversion from f32")),
        q => quantize_row(q, src, dst),
    }
}

/// Read element `i` (not a block type) at `p` as f32.
///
/// # Safety
/// `p` must point to a readable element of `dtype`, which must be F32, F16 or BF16.
#[inline]
pub(crate) unsafe fn load_f32(dtype: DType, p: *const u8) -> f32 {
    // SAFETY: (all arms) the caller guarantees a readable element of `dtype` at `p`; unaligned
    // reads make no alignment assumption.
    unsafe {
        match dtype {
            DType::F16 => p.cast::<f16>().read_unaligned().to_f32(),
            DType::BF16 => p.cast::<bf16>().read_unaligned().to_f32(),
            _ => p.cast::<f32>().read_unaligned(),
        }
    }
}

/// Write `v` as an element of `dtype` at `p`.
///
/// # Safety
/// `p` must point to a writable element of `dtype` (F32, F16 or BF16) that no other thread
/// accesses concurrently.
#[inline]
pub(crate) unsafe fn store_f32(dtype: DType, p: *mut u8, v: f32) {
    // SAFETY: (all arms) guaranteed by the caller; unaligned writes.
    unsafe {
        match dtype {
            DType::F16 => p.cast::<f16>().write_unaligned(f16::from_f32(v)),
            DType::BF16 => p.cast::<bf16>().write_unaligned(bf16::from_f32(v)),
            _ => p.cast::<f32>().write_unaligned(v),
        }
    }
}

fn short(need: usize, got: usize) -> Error {
    Error::OutOfBounds {
        what: "row conversion".into(),
        offset: 0,
        size: need,
        limit: got,
    }
}

fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    rgml::quant::quantize_row(dtype, src, dst)
}

fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    rgml::quant::dequantize_row(dtype, src, dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_through_f16_is_the_per_value_conversion() {
        let mut v: Vec<f32> = (0..300)
            .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.0137)
            .collect();
        v.extend([65520.0, -1e6, 1e-8, 6.1e-5, 0.0, -0.0, f32::INFINITY]);
        let want: Vec<u32> = v
            .iter()
            .map(|&x| f16::from_f32(x).to_f32().to_bits())
            .collect();
        round_through_f16(&mut v);
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
    }
}
