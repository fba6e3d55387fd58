//! The quantization presets (llama.cpp's `llama_ftype` as `llama-quantize` names them) and the
//! default storage type of each; the per-tensor rules pick among [`DType`]s.

use super::QuantizeError;
use rgml::DType;

/// A quantization preset: what `llama-quantize` calls a type on its command line and what
/// `general.file_type` records (llama.cpp's `llama_ftype`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantPreset {
    /// Everything in f32.
    F32,
    /// f16 (1-D tensors stay as they are).
    F16,
    /// bf16.
    BF16,
    /// Q4_0.
    Q4_0,
    /// Q4_1.
    Q4_1,
    /// Q5_0.
    Q5_0,
    /// Q5_1.
    Q5_1,
    /// Q8_0.
    Q8_0,
    /// Q2_K mix.
    Q2_K,
    /// Q3_K small.
    Q3_K_S,
    /// Q3_K medium.
    Q3_K_M,
    /// Q3_K large.
    Q3_K_L,
    /// Q4_K small.
    Q4_K_S,
    /// Q4_K medium.
    Q4_K_M,
    /// Q5_K small.
    Q5_K_S,
    /// Q5_K medium.
    Q5_K_M,
    /// Q6_K.
    Q6_K,
    /// IQ4_NL.
    IQ4_NL,
    /// IQ4_XS.
    IQ4_XS,
    /// Experts (3-D weights) in MXFP4, every other matrix in Q8_0 (gpt-oss's release format).
    MXFP4_MOE,
}

/// Names `llama-quantize` accepts that are another preset's alias.
const ALIASES: [(&str, QuantPreset); 3] = [
    ("Q3_K", QuantPreset::Q3_K_M),
    ("Q4_K", QuantPreset::Q4_K_M),
    ("Q5_K", QuantPreset::Q5_K_M),
];

impl QuantPreset {
    /// Every preset, in `llama-quantize`'s listing order.
    pub const ALL: [QuantPreset; 20] = [
        QuantPreset::Q4_0,
        QuantPreset::Q4_1,
        QuantPreset::MXFP4_MOE,
        QuantPreset::Q5_0,
        QuantPreset::Q5_1,
        QuantPreset::Q2_K,
        QuantPreset::Q3_K_S,
        QuantPreset::Q3_K_M,
        QuantPreset::Q3_K_L,
        QuantPreset::IQ4_NL,
        QuantPreset::IQ4_XS,
        QuantPreset::Q4_K_S,
        QuantPreset::Q4_K_M,
        QuantPreset::Q5_K_S,
        QuantPreset::Q5_K_M,
        QuantPreset::Q6_K,
        QuantPreset::Q8_0,
        QuantPreset::F16,
        QuantPreset::BF16,
        QuantPreset::F32,
    ];

    /// The name on `llama-quantize`'s command line.
    pub const fn name(self) -> &'static str {
        match self {
            QuantPreset::F32 => "F32",
            QuantPreset::F16 => "F16",
            QuantPreset::BF16 => "BF16",
            QuantPreset::Q4_0 => "Q4_0",
            QuantPreset::Q4_1 => "Q4_1",
            QuantPreset::Q5_0 => "Q5_0",
            QuantPreset::Q5_1 => "Q5_1",
            QuantPreset::Q8_0 => "Q8_0",
            QuantPreset::Q2_K => "Q2_K",
            QuantPreset::Q3_K_S => "Q3_K_S",
            QuantPreset::Q3_K_M => "Q3_K_M",
            QuantPreset::Q3_K_L => "Q3_K_L",
            QuantPreset::Q4_K_S => "Q4_K_S",
            QuantPreset::Q4_K_M => "Q4_K_M",
            QuantPreset::Q5_K_S => "Q5_K_S",
            QuantPreset::Q5_K_M => "Q5_K_M",
            QuantPreset::Q6_K => "Q6_K",
            QuantPreset::IQ4_NL => "IQ4_NL",
            QuantPreset::IQ4_XS => "IQ4_XS",
            QuantPreset::MXFP4_MOE => "MXFP4_MOE",
        }
    }

    /// The `llama_ftype` number, written to `general.file_type`.
    pub const fn file_type(self) -> u32 {
        match self {
            QuantPreset::F32 => 0,
            QuantPreset::F16 => 1,
            QuantPreset::Q4_0 => 2,
            QuantPreset::Q4_1 => 3,
            QuantPreset::Q8_0 => 7,
            QuantPreset::Q5_0 => 8,
            QuantPreset::Q5_1 => 9,
            QuantPreset::Q2_K => 10,
            QuantPreset::Q3_K_S => 11,
            QuantPreset::Q3_K_M => 12,
            QuantPreset::Q3_K_L => 13,
            QuantPreset::Q4_K_S => 14,
            QuantPreset::Q4_K_M => 15,
            QuantPreset::Q5_K_S => 16,
            QuantPreset::Q5_K_M => 17,
            QuantPreset::Q6_K => 18,
            QuantPreset::IQ4_NL => 25,
            QuantPreset::IQ4_XS => 30,
            QuantPreset::BF16 => 32,
            QuantPreset::MXFP4_MOE => 38,
        }
    }

    /// The preset whose `general.file_type` number is `n`, if any.
    pub fn from_file_type(n: u32) -> Option<QuantPreset> {
        QuantPreset::ALL.into_iter().find(|p| p.file_type() == n)
    }

    /// The type of every quantizable tensor before the per-tensor rules
    /// (`llama_ftype_get_default_type`).
    pub const fn default_type(self) -> DType {
        match self {
            QuantPreset::F32 => DType::F32,
            QuantPreset::F16 => DType::F16,
            QuantPreset::BF16 => DType::BF16,
            QuantPreset::Q4_0 => DType::Q4_0,
            QuantPreset::Q4_1 => DType::Q4_1,
            QuantPreset::Q5_0 => DType::Q5_0,
            QuantPreset::Q5_1 => DType::Q5_1,
            QuantPreset::Q8_0 => DType::Q8_0,
            QuantPreset::Q2_K => DType::Q2_K,
            QuantPreset::Q3_K_S | QuantPreset::Q3_K_M | QuantPreset::Q3_K_L => DType::Q3_K,
            QuantPreset::Q4_K_S | QuantPreset::Q4_K_M => DType::Q4_K,
            QuantPreset::Q5_K_S | QuantPreset::Q5_K_M => DType::Q5_K,
            QuantPreset::Q6_K => DType::Q6_K,
            QuantPreset::IQ4_NL => DType::IQ4_NL,
            QuantPreset::IQ4_XS => DType::IQ4_XS,
            QuantPreset::MXFP4_MOE => DType::MXFP4,
        }
    }

    /// Parse a preset as `llama-quantize` does: a name or alias in any case (`q4_k_m`, `Q4_K`),
    /// or the `general.file_type` number.
    pub fn parse(text: &str) -> Result<QuantPreset, QuantizeError> {
        let by_name = QuantPreset::ALL
            .into_iter()
            .map(|p| (p.name(), p))
            .chain(ALIASES)
            .find(|(name, _)| name.eq_ignore_ascii_case(text))
            .map(|(_, p)| p);
        let by_number = || QuantPreset::from_file_type(text.trim().parse().ok()?);
        by_name
            .or_else(by_number)
            .ok_or_else(|| QuantizeError::UnknownPreset(text.to_string()))
    }

    /// The names `parse` also accepts for a preset (`Q4_K` for `Q4_K_M`).
    pub fn aliases(self) -> impl Iterator<Item = &'static str> {
        ALIASES
            .into_iter()
            .filter(move |&(_, p)| p == self)
            .map(|(alias, _)| alias)
    }

    /// The preset names, comma-separated, for usage messages.
    pub fn names() -> String {
        let names: Vec<&str> = QuantPreset::ALL.iter().map(|p| p.name()).collect();
        names.join(", ")
    }
}

impl std::fmt::Display for QuantPreset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
