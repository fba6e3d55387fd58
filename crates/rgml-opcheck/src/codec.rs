//! Conversions between f32/f64 values and a dtype's bytes, used to create inputs and to read
//! results. Plain types (f32, f16, bf16, i32) are converted here with `half`, independently of
//! any backend; quantized types go through the core's reference codecs (`rgml::quant`), which
//! the suite only trusts to *create* inputs and to *read* bytes, never to compute an op.

use rgml::{DType, Error, Result};

fn bad(msg: String) -> Error {
    Error::Backend {
        backend: "opcheck".into(),
        message: msg,
    }
}

/// Bytes of `values` stored as `dtype` (for quantized types `values.len()` must be a whole
/// number of blocks). I32 values are truncated toward zero.
pub fn encode(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    let n = values.len();
    let mut out = vec![0u8; dtype.row_bytes(n)?];
    match dtype {
        DType::F32 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
        DType::BF16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
        DType::I32 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&(*v as i32).to_le_bytes());
            }
        }
        DType::I64 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(8)) {
                o.copy_from_slice(&(*v as i64).to_le_bytes());
            }
        }
        q => rgml::quant::quantize_row(q, values, &mut out)?,
    }
    Ok(out)
}

/// The values held by `bytes` of `dtype`, one per element (quantized blocks are dequantized).
pub fn decode(dtype: DType, bytes: &[u8]) -> Result<Vec<f64>> {
    let bb = dtype.block_bytes();
    if !bytes.len().is_multiple_of(bb) {
        return Err(bad(format!(
            "{} bytes are not a whole number of {dtype} blocks",
            bytes.len()
        )));
    }
    let f32s = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
    Ok(match dtype {
        DType::F32 => bytes.chunks_exact(4).map(f32s).collect(),
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect(),
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        q => {
            let mut out = vec![0f32; bytes.len() / bb * q.block_size()];
            rgml::quant::dequantize_row(q, bytes, &mut out)?;
            out.into_iter().map(f64::from).collect()
        }
    })
}

/// `values` rounded as storing them in `dtype` and reading them back would (quantized rows are
/// quantized and dequantized: the reference round trip). `values` is one row.
pub fn round_trip(dtype: DType, values: &mut [f64]) -> Result<()> {
    match dtype {
        DType::F32 => values.iter_mut().for_each(|v| *v = *v as f32 as f64),
        DType::F16 => values
            .iter_mut()
            .for_each(|v| *v = half::f16::from_f64(*v).to_f64()),
        DType::BF16 => values
            .iter_mut()
            .for_each(|v| *v = half::bf16::from_f64(*v).to_f64()),
        DType::I32 | DType::I64 => values.iter_mut().for_each(|v| *v = v.trunc()),
        q => {
            let f: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            let back = decode(q, &encode(q, &f)?)?;
            values.copy_from_slice(&back);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_round_trips() {
        let v = [1.0f32, -2.5, 0.333_333_34, 65504.0];
        for t in [DType::F32, DType::F16, DType::BF16] {
            let back = decode(t, &encode(t, &v).unwrap()).unwrap();
            for (a, b) in v.iter().zip(&back) {
                assert!(
                    (*a as f64 - b).abs() <= a.abs() as f64 * 1e-2,
                    "{t}: {a} vs {b}"
                );
            }
        }
        assert_eq!(
            decode(DType::I32, &encode(DType::I32, &[3.0, -7.0]).unwrap()).unwrap(),
            vec![3.0, -7.0]
        );
        assert!(decode(DType::F32, &[0u8; 3]).is_err());
    }
}
