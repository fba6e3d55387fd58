//! One tensor of a random model as planned: its name, type, shape and how its values are made
//! (and the value ranges the plans share). This module owns [`Planned`] and [`Fill`]; which
//! tensors a model has is `tensors`' (and `gemma4`'s) business.

use crate::error::Result;
use crate::rng::SplitMix64;
use rgml::DType;

pub(crate) const MATRIX: f32 = 0.2;
pub(crate) const QUERY_KEY: f32 = 0.25;
pub(crate) const EMBEDDING: f32 = 0.3;
pub(crate) const NORM_SPREAD: f32 = 0.1;

/// How a tensor's values are made.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Fill {
    /// Uniform in ±amplitude.
    Uniform(f32),
    /// A norm weight: 1 plus uniform in ±[`NORM_SPREAD`].
    Norm,
    /// Uniform in `[low, high)`.
    Between(f32, f32),
    /// Given values (computed, not random).
    Values(Vec<f32>),
}

/// One tensor to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// llama.cpp's name.
    pub name: String,
    /// Storage type.
    pub dtype: DType,
    /// Dimensions, innermost first.
    pub ne: Vec<usize>,
    pub(crate) fill: Fill,
}

impl Planned {
    pub(crate) fn matrix(name: String, n_in: usize, n_out: usize, amplitude: f32) -> Planned {
        Planned {
            name,
            dtype: DType::Q8_0,
            ne: vec![n_in, n_out],
            fill: Fill::Uniform(amplitude),
        }
    }

    pub(crate) fn vector(name: String, n: usize, fill: Fill) -> Planned {
        Planned {
            name,
            dtype: DType::F32,
            ne: vec![n],
            fill,
        }
    }

    /// A 2-D F32 tensor (not quantized: llama.cpp's convolution wants F32 taps).
    pub(crate) fn float_matrix(name: String, n_in: usize, n_out: usize, amplitude: f32) -> Planned {
        Planned {
            dtype: DType::F32,
            ..Planned::matrix(name, n_in, n_out, amplitude)
        }
    }

    /// The tensor's values, drawn from the stream of `model`/`name`.
    pub(crate) fn values(&self, model: &str) -> Vec<f32> {
        let n: usize = self.ne.iter().product();
        let mut rng = SplitMix64::for_tensor(model, &self.name);
        match &self.fill {
            Fill::Values(v) => v.clone(),
            Fill::Uniform(amplitude) => (0..n).map(|_| rng.symmetric(*amplitude)).collect(),
            Fill::Norm => (0..n).map(|_| 1.0 + rng.symmetric(NORM_SPREAD)).collect(),
            Fill::Between(low, high) => {
                let (mid, half) = ((low + high) / 2.0, (high - low) / 2.0);
                (0..n).map(|_| mid + rng.symmetric(half)).collect()
            }
        }
    }

    /// The tensor's bytes: its [`Planned::values`] stored as its type (Q8_0 by ggml's
    /// reference quantizer).
    pub fn bytes(&self, model: &str) -> Result<Vec<u8>> {
        let values = self.values(model);
        let mut out = vec![0u8; self.dtype.row_bytes(values.len())?];
        rgml::quant::quantize_row(self.dtype, &values, &mut out)?;
        Ok(out)
    }
}
