//! The per-tensor type rules of llama.cpp's quantizer (`src/llama-quant.cpp`): which tensors
//! are quantized at all, the type each preset gives each tensor (more bits for some attn_v and
//! ffn_down layers, the output and tied token embeddings, falcon's and 8-expert models'
//! exceptions), the fallback when a row is not a whole number of blocks, and the order
//! llama.cpp writes tensors in.
//!
//! The rules count tensors of a kind as they go (the i-th attn_v, the i-th ffn_down), so
//! [`TypeChooser::choose`] must see the tensors once each, in [`llama_order`].
//!
//! Not reproduced: rules of presets rgml does not offer (IQ1/IQ2/IQ3, TQ, MXFP4), importance
//! matrices, and `llama-quantize`'s per-tensor overrides (`--tensor-type`, `--pure`, ...).

use super::{QuantPreset, QuantizeError};
use rgml::DType;
use rgml_gguf::GgufFile;
use std::cmp::Ordering;

/// What the rules need to know about the model besides tensor names and shapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelTraits {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: usize,
    /// `{arch}.expert_count` (0 for dense models).
    pub n_expert: u32,
    /// Query heads per KV head in layer 0 (0 when unknown).
    pub n_gqa: u32,
    /// Whether llama.cpp classifies the model as a 70B (its attn_v gets more bits).
    pub is_70b: bool,
}

impl ModelTraits {
    /// Read the traits from a file's metadata, with llama.cpp's defaults for optional keys.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelTraits, QuantizeError> {
        let missing = |key: String| QuantizeError::BadModel(format!("missing or invalid {key}"));
        let arch = file
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| missing("general.architecture".into()))?
            .to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let n_layer = file
            .get(&key("block_count"))
            .and_then(|v| v.as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| missing(key("block_count")))?;
        let n_expert = u32_or_first(file, &key("expert_count")).unwrap_or(0);
        let n_head = u32_or_first(file, &key("attention.head_count")).unwrap_or(0);
        let n_head_kv = u32_or_first(file, &key("attention.head_count_kv")).unwrap_or(n_head);
        let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0);
        // llama.cpp sets LLM_TYPE_70B per architecture from the layer count.
        let is_70b = match arch.as_str() {
            "llama" => n_layer == 80 && n_head != n_head_kv,
            "qwen2" | "deci" | "olmo" => n_layer == 80,
            "jais2" => n_layer == 68,
            _ => false,
        };
        Ok(ModelTraits {
            arch,
            n_layer,
            n_expert,
            n_gqa,
            is_70b,
        })
    }
}

/// A key that holds a u32 or a per-layer array of them (take layer 0's), as llama.cpp's
/// `get_key_or_arr` reads head counts.
fn u32_or_first(file: &GgufFile, key: &str) -> Option<u32> {
    let v = file.get(key)?;
    let v = match v.as_array() {
        Some(items) => items.first()?,
        None => v,
    };
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// The broad kind of a tensor, by name (llama.cpp's `tensor_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// `token_embd.weight` or `per_layer_token_embd.weight`.
    TokenEmbd,
    /// `attn_q.weight`.
    AttnQ,
    /// `attn_v.weight`.
    AttnV,
    /// `attn_k.weight`.
    AttnK,
    /// `attn_qkv.weight`.
    AttnQkv,
    /// `attn_kv_b.weight`.
    AttnKvB,
    /// `attn_output.weight`.
    AttnOutput,
    /// Anything with `ffn_up`.
    FfnUp,
    /// Anything with `ffn_gate`.
    FfnGate,
    /// Anything with `ffn_down`.
    FfnDown,
    /// `output.weight`.
    Output,
    /// Everything else.
    Other,
}

impl Category {
    /// The category of the tensor called `name`; the first matching test wins, in llama.cpp's
    /// order (so `attn_kv_b.weight` is not taken for an attn_v).
    pub fn of(name: &str) -> Category {
        const BY_SUBSTRING: [(&str, Category); 9] = [
            ("attn_qkv.weight", Category::AttnQkv),
            ("attn_kv_b.weight", Category::AttnKvB),
            ("attn_v.weight", Category::AttnV),
            ("attn_k.weight", Category::AttnK),
            ("attn_q.weight", Category::AttnQ),
            ("attn_output.weight", Category::AttnOutput),
            ("ffn_up", Category::FfnUp),
            ("ffn_gate", Category::FfnGate),
            ("ffn_down", Category::FfnDown),
        ];
        if name == "output.weight" {
            return Category::Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return Category::TokenEmbd;
        }
        BY_SUBSTRING
            .iter()
            .find(|(s, _)| name.contains(s))
            .map_or(Category::Other, |&(_, c)| c)
    }

    /// The attention-value-like kinds, the most sensitive to quantization.
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// Name parts that keep a tensor out of quantization whatever the preset.
const NEVER_QUANTIZED: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// More name parts kept out of quantization in glm5-next models.
const NEVER_QUANTIZED_GLM5_NEXT: &[&str] = &[
    "hc_",
    "indexer.attn_q_b",
    "indexer.attn_k",
    "indexer.proj",
    "indexer_compressor_gate",
    "indexer_compressor_ape",
    "ssm_f_a.weight",
    "ssm_f_b.weight",
    "ssm_g_a.weight",
    "ssm_g_b.weight",
    "ssm_beta.weight",
    "attn_kv_a_mqa.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
];

/// ggml's `ggml_n_dims`: the number of dimensions up to the last one above 1 (at least 1).
pub fn n_dims(ne: &[usize]) -> usize {
    ne.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// Whether a tensor may be converted at all (`tensor_allows_quantization`): weights of two
/// or more dimensions, except norms, routers, small or positional tables and the like.
pub fn allows_quantization(arch: &str, name: &str, ne: &[usize]) -> bool {
    if n_dims(ne) < 2 || !name.ends_with("weight") {
        return false;
    }
    if name == "position_embd.weight" || name == "token_types.weight" {
        return false;
    }
    let glm: &[&str] = if arch == "glm5-next" {
        NEVER_QUANTIZED_GLM5_NEXT
    } else {
        &[]
    };
    !NEVER_QUANTIZED.iter().chain(glm).any(|s| name.contains(s))
}

/// The layer number of a `blk.N.` tensor, read as C's `sscanf(name, "blk.%d.", ...)` reads it
/// (leading spaces and a sign allowed, digits up to the first non-digit); -1 for any other.
pub fn layer_of(name: &str) -> i64 {
    let Some(rest) = name.strip_prefix("blk.") else {
        return -1;
    };
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (sign, digits) = match rest.as_bytes().first() {
        Some(b'-') => (-1, &rest[1..]),
        Some(b'+') => (1, &rest[1..]),
        _ => (1, rest),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return -1;
    }
    // Saturate instead of overflowing; no real file has a layer number near i64's range.
    let n = digits[..end].bytes().fold(0i64, |n, d| {
        n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
    });
    sign * n
}

/// The order llama.cpp's model loader keeps tensors in, and so the order of the output file:
/// tensors outside blocks first, then block by block, each group sorted by name.
pub fn llama_order(a: &str, b: &str) -> Ordering {
    layer_of(a)
        .cmp(&layer_of(b))
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// A type that did not fit a tensor's rows and the one used instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fallback {
    /// The type the rules chose.
    pub wanted: DType,
    /// The type used, whose block divides the row length.
    pub used: DType,
}

/// The type decided for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeChoice {
    /// The new type; `None` when the tensor is not quantizable and stays as it is.
    pub target: Option<DType>,
    /// Set when the rules' type did not fit the row length.
    pub fallback: Option<Fallback>,
}

/// llama.cpp's `quantize_state_impl` for one run: the preset, the model traits and the
/// counters that the layer-dependent rules advance. Feed it every tensor once, in
/// [`llama_order`].
#[derive(Clone, Debug)]
pub struct TypeChooser<'a> {
    traits: &'a ModelTraits,
    preset: QuantPreset,
    has_tied_embeddings: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

impl<'a> TypeChooser<'a> {
    /// A chooser for a model whose tensors are called `names` (all of them, any order).
    pub fn new<'n>(
        traits: &'a ModelTraits,
        preset: QuantPreset,
        names: impl IntoIterator<Item = &'n str>,
    ) -> TypeChooser<'a> {
        let mut n_attention_wv = 0;
        let mut has_tied_embeddings = true;
        for name in names {
            match Category::of(name) {
                c if c.is_attn_v() => n_attention_wv += 1,
                Category::Output => has_tied_embeddings = false,
                _ => {}
            }
        }
        TypeChooser {
            traits,
            preset,
            has_tied_embeddings,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
        }
    }

    /// The type of the tensor `name` with dimensions `ne` (`llama_tensor_get_type`).
    pub fn choose(&mut self, name: &str, ne: &[usize]) -> Result<TypeChoice, QuantizeError> {
        if !allows_quantization(&self.traits.arch, name, ne) {
            return Ok(TypeChoice {
                target: None,
                fallback: None,
            });
        }
        let default = self.preset.default_type();
        if !default.is_quantized() {
            return Ok(TypeChoice {
                target: Some(default),
                fallback: None,
            });
        }
        let ne0 = ne.first().copied().unwrap_or(1);
        let wanted = self.rule_type(name, ne, default)?;
        let used = self.fallback(ne0, wanted);
        Ok(TypeChoice {
            target: Some(used),
            fallback: (used != wanted).then_some(Fallback { wanted, used }),
        })
    }

    /// `llama_tensor_get_type_impl` for the presets rgml offers.
    fn rule_type(&mut self, name: &str, ne: &[usize], ty: DType) -> Result<DType, QuantizeError> {
        let t = self.traits;
        let ne0 = ne.first().copied().unwrap_or(1);
        let glm_min_q8 = ["attn_q_a", "attn_q_b", "nextn.eh_proj"];
        // glm5-next keeps these at Q8_0 or better; only float presets (which never reach the
        // rules) would go higher.
        if t.arch == "glm5-next" && glm_min_q8.iter().any(|s| name.contains(s)) {
            return Ok(DType::Q8_0);
        }
        let category = Category::of(name);
        if category == Category::Output
            || (self.has_tied_embeddings && category == Category::TokenEmbd)
        {
            return Ok(match self.preset {
                QuantPreset::MXFP4_MOE => DType::Q8_0,
                _ => self.output_type(ne0, ty),
            });
        }
        if self.preset == QuantPreset::MXFP4_MOE {
            // Experts (stacked on dim 2) in MXFP4, every other matrix in Q8_0.
            let experts = ne.get(2).is_some_and(|&n| n > 1);
            return Ok(if experts { DType::MXFP4 } else { DType::Q8_0 });
        }
        Ok(match category {
            // Untied token embeddings change only under presets rgml does not offer.
            Category::TokenEmbd => ty,
            c if c.is_attn_v() => self.attn_v_type(ty),
            Category::AttnK if t.n_expert == 8 => DType::Q8_0,
            Category::FfnDown => self.ffn_down_type(name, ty)?,
            Category::AttnOutput => self.attn_output_type(ty),
            Category::FfnGate => {
                // Rules only for IQ3_XS; still validates the layer and advances the count.
                self.layer_info(self.i_ffn_gate, name)?;
                self.i_ffn_gate += 1;
                ty
            }
            Category::FfnUp => {
                self.layer_info(self.i_ffn_up, name)?;
                self.i_ffn_up += 1;
                ty
            }
            _ => ty,
        })
    }

    /// The output matrix, and the token embeddings when they double as it: Q6_K unless the
    /// rows do not fit the preset's block (or the model is a falcon), then Q8_0.
    fn output_type(&self, ne0: usize, ty: DType) -> DType {
        if self.traits.arch == "falcon" || !ne0.is_multiple_of(ty.block_size()) {
            DType::Q8_0
        } else if ty != DType::Q8_0 {
            DType::Q6_K
        } else {
            ty
        }
    }

    fn attn_v_type(&mut self, ty: DType) -> DType {
        let t = self.traits;
        let (i, n) = (self.i_attention_wv, self.n_attention_wv);
        let mut ty = match self.preset {
            QuantPreset::Q2_K if t.n_gqa >= 4 => DType::Q4_K,
            QuantPreset::Q2_K => DType::Q3_K,
            QuantPreset::Q3_K_M if i < 2 => DType::Q5_K,
            QuantPreset::Q3_K_M => DType::Q4_K,
            QuantPreset::Q3_K_L => DType::Q5_K,
            QuantPreset::IQ4_NL | QuantPreset::IQ4_XS if t.n_gqa >= 4 => DType::Q5_K,
            QuantPreset::Q4_K_M | QuantPreset::Q5_K_M if use_more_bits(i, n) => DType::Q6_K,
            QuantPreset::Q4_K_S if i < 4 => DType::Q5_K,
            _ => ty,
        };
        // A 70B's attn_v is 8x smaller than its attn_q: more bits cost almost nothing.
        if t.is_70b && matches!(ty, DType::Q3_K | DType::Q4_K) {
            ty = DType::Q5_K;
        }
        if t.n_expert == 8 {
            ty = DType::Q8_0;
        }
        self.i_attention_wv += 1;
        ty
    }

    fn ffn_down_type(&mut self, name: &str, ty: DType) -> Result<DType, QuantizeError> {
        let (i, n) = self.layer_info(self.i_ffn_down, name)?;
        let falcon = self.traits.arch == "falcon";
        let more = use_more_bits(i, n);
        let ty = match self.preset {
            QuantPreset::Q2_K => DType::Q3_K,
            QuantPreset::Q3_K_M if i < n / 16 => DType::Q5_K,
            QuantPreset::Q3_K_M if !falcon || more => DType::Q4_K,
            QuantPreset::Q3_K_M => DType::Q3_K,
            QuantPreset::Q3_K_L if falcon => DType::Q4_K,
            QuantPreset::Q3_K_L => DType::Q5_K,
            QuantPreset::Q4_K_M if falcon && i < n / 16 => DType::Q6_K,
            QuantPreset::Q4_K_M if falcon && more => DType::Q5_K,
            QuantPreset::Q4_K_M if falcon => DType::Q4_K,
            QuantPreset::Q4_K_M if more => DType::Q6_K,
            QuantPreset::IQ4_NL | QuantPreset::IQ4_XS if i < n / 8 => DType::Q5_K,
            QuantPreset::Q5_K_M if more => DType::Q6_K,
            QuantPreset::Q4_K_S if !falcon && i < n / 8 => DType::Q5_K,
            _ => ty,
        };
        self.i_ffn_down += 1;
        Ok(ty)
    }

    fn attn_output_type(&self, ty: DType) -> DType {
        let p = self.preset;
        if self.traits.arch == "falcon" {
            return if p == QuantPreset::Q3_K_L {
                DType::Q4_K
            } else {
                ty
            };
        }
        if self.traits.n_expert == 8 {
            let bumped = [
                QuantPreset::Q2_K,
                QuantPreset::Q3_K_S,
                QuantPreset::Q3_K_M,
                QuantPreset::IQ4_NL,
                QuantPreset::Q4_K_S,
                QuantPreset::Q4_K_M,
                QuantPreset::IQ4_XS,
            ];
            return if bumped.contains(&p) { DType::Q5_K } else { ty };
        }
        match p {
            QuantPreset::Q2_K => DType::Q3_K,
            QuantPreset::Q3_K_M => DType::Q4_K,
            QuantPreset::Q3_K_L => DType::Q5_K,
            _ => ty,
        }
    }

    /// The layer of an ffn tensor and the layer count. Dense models count ffn tensors in
    /// order; mixture-of-experts models read the layer from the name, because their expert
    /// tensors are not in layer order.
    fn layer_info(&self, counter: i64, name: &str) -> Result<(i64, i64), QuantizeError> {
        let n_layer = i64::try_from(self.traits.n_layer).unwrap_or(i64::MAX);
        if self.traits.n_expert <= 1 {
            return Ok((counter, n_layer));
        }
        let i = layer_of(name);
        if !name.starts_with("blk.") || i < 0 || i >= n_layer {
            return Err(QuantizeError::BadModel(format!(
                "cannot tell the layer (0..{n_layer}) of expert tensor '{name}'"
            )));
        }
        Ok((i, n_layer))
    }

    /// `tensor_type_fallback`: a type whose block divides the row length `ne0`.
    fn fallback(&self, ne0: usize, ty: DType) -> DType {
        if ne0.is_multiple_of(ty.block_size()) {
            return ty;
        }
        let fallback = match ty {
            DType::IQ4_XS => DType::IQ4_NL,
            DType::Q2_K | DType::Q3_K => DType::Q4_0,
            DType::Q4_K => DType::Q5_0,
            DType::Q5_K => DType::Q5_1,
            DType::Q6_K => DType::Q8_0,
            // 32-block types have nothing smaller to go to (F16 below); the rest are no targets.
            _ => ty,
        };
        if ne0.is_multiple_of(fallback.block_size()) {
            fallback
        } else {
            DType::F16
        }
    }
}

/// The layers that get more bits under the `_M` presets: the first and last eighth, and every
/// third layer in between.
pub fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}
