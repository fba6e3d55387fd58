//! A shape model as `llama-quantize` would have written it from a converted (F16) file of the
//! real model: the header (the shape's hyper-parameters, the vocabulary's `tokenizer.*` keys,
//! then `general.quantization_version` and `general.file_type` last), the tensors in
//! llama.cpp's order ([`rules::llama_order`]) with the type its rules give each one under the
//! preset, and the random contents. This module owns that plan and hands the bytes to
//! [`crate::stream`]; the per-tensor type rules are rgml-llm's (`rgml quantize` uses the same
//! ones), not a copy.

use crate::arch::Spec;
use crate::blocks::{bias_values, norm_values, BlockFiller};
use crate::error::{Error, Result};
use crate::planned::Fill;
use crate::rng::SplitMix64;
use crate::stream::{self, Piece};
use crate::tensors;
use crate::{add_hyperparameters, copy_tokenizer, vocabulary_size, Shape, Written};
use rgml::DType;
use rgml_gguf::{GgufFile, GgufWriter, TensorDecl, Value};
use rgml_llm::quantize::{rules, ModelTraits, QuantPreset, TypeChooser, QUANTIZATION_VERSION};
use std::collections::HashMap;
use std::path::Path;

/// What a tensor of a shape model holds.
#[derive(Clone, Debug, PartialEq)]
enum Content {
    /// Random weight blocks of the tensor's type ([`BlockFiller`]).
    Weights,
    /// Norm weights near 1 (F32).
    Norm,
    /// Small biases (F32).
    Bias,
    /// Given values (F32): the rope factors.
    Values(Vec<f32>),
}

/// One tensor of a shape model.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapedTensor {
    /// llama.cpp's name.
    pub name: String,
    /// Its type under the preset.
    pub dtype: DType,
    /// Dimensions, innermost first.
    pub ne: Vec<usize>,
    content: Content,
}

impl ShapedTensor {
    /// Bytes of data.
    pub fn bytes(&self) -> usize {
        let rows: usize = self.ne.iter().skip(1).product();
        let row = self
            .dtype
            .row_bytes(self.ne.first().copied().unwrap_or(1))
            .unwrap_or(0);
        row * rows
    }
}

/// A shape model ready to write: header and tensor plan (see the module docs).
#[derive(Debug)]
pub struct ShapedModel {
    /// The name of the shape, which seeds the random streams with `seed`.
    name: String,
    seed: u64,
    n_vocab: usize,
    header: GgufWriter,
    tensors: Vec<ShapedTensor>,
}

impl ShapedModel {
    /// The model of `shape` under `preset`, with the vocabulary of `vocab` (whose path,
    /// `vocab_path`, names it in errors) and the random values of `seed`.
    pub fn new(
        shape: Shape,
        preset: QuantPreset,
        seed: u64,
        vocab: &GgufFile,
        vocab_path: &Path,
    ) -> Result<ShapedModel> {
        let spec = shape.spec();
        ShapedModel::from_spec(
            shape.name(),
            shape.gguf_arch(),
            &spec,
            preset,
            seed,
            vocab,
            vocab_path,
        )
    }

    /// The model of any `spec` (architecture `gguf_arch`, called `name`), as [`ShapedModel::new`]
    /// makes it for a shape: for small models in tests, and shapes not listed yet.
    pub fn from_spec(
        name: &str,
        gguf_arch: &str,
        spec: &Spec,
        preset: QuantPreset,
        seed: u64,
        vocab: &GgufFile,
        vocab_path: &Path,
    ) -> Result<ShapedModel> {
        let n_vocab = vocabulary_size(vocab, vocab_path)?;
        let mut header = GgufWriter::new();
        let display_name = format!("rgml random {name}");
        add_hyperparameters(&mut header, gguf_arch, &display_name, spec, n_vocab, None);
        copy_tokenizer(&mut header, vocab);
        header.add_metadata(
            "general.quantization_version",
            Value::U32(QUANTIZATION_VERSION),
        );
        header.add_metadata("general.file_type", Value::U32(preset.file_type()));
        let tensors = plan_types(name, &header, spec, n_vocab, preset)?;
        Ok(ShapedModel {
            name: name.to_string(),
            seed,
            n_vocab,
            header,
            tensors,
        })
    }

    /// The metadata (no tensors: they are streamed).
    pub fn header(&self) -> &GgufWriter {
        &self.header
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> &[ShapedTensor] {
        &self.tensors
    }

    /// Tokens in the vocabulary (rows of the embedding).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Bytes of tensor data (the file is this plus the header and padding).
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes() as u64).sum()
    }

    /// Write the file to `out` (under `OUT.part`, renamed when complete), making the data on
    /// `threads` threads (0: one per core). The bytes do not depend on the thread count.
    pub fn write(&self, out: &Path, threads: usize) -> Result<Written> {
        let mut fillers = HashMap::new();
        for t in self
            .tensors
            .iter()
            .filter(|t| t.content == Content::Weights)
        {
            if let std::collections::hash_map::Entry::Vacant(e) = fillers.entry(t.dtype) {
                let filler = BlockFiller::new(t.dtype).ok_or_else(|| Error::UnsupportedType {
                    tensor: t.name.clone(),
                    dtype: t.dtype,
                })?;
                e.insert(filler);
            }
        }
        let decls: Vec<TensorDecl> = self
            .tensors
            .iter()
            .map(|t| TensorDecl {
                name: t.name.clone(),
                dtype: t.dtype,
                ne: t.ne.clone(),
            })
            .collect();
        let pieces: Vec<Piece> = self
            .tensors
            .iter()
            .enumerate()
            .flat_map(|(i, t)| {
                // Vectors are made whole; matrices in pieces of whole blocks.
                let unit = match t.content {
                    Content::Weights => t.dtype.block_bytes(),
                    _ => t.bytes().max(1),
                };
                stream::pieces(i, t.bytes(), unit)
            })
            .collect();
        let fill = |p: &Piece, out: &mut [u8]| {
            let t = &self.tensors[p.tensor];
            let mut rng = SplitMix64::for_chunk(&self.name, &t.name, self.seed, p.index);
            let values = match &t.content {
                Content::Weights => {
                    // Every weight type got a filler above.
                    if let Some(f) = fillers.get(&t.dtype) {
                        f.fill(&mut rng, out);
                    }
                    return;
                }
                Content::Norm => norm_values(&mut rng, out.len() / 4),
                Content::Bias => bias_values(&mut rng, out.len() / 4),
                Content::Values(v) => v.clone(),
            };
            for (b, v) in out.chunks_exact_mut(4).zip(values) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        };
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        stream::write_file(out, &self.header, &decls, &pieces, threads, &fill)?;
        let bytes = std::fs::metadata(out)
            .map_err(|source| Error::Io {
                path: out.to_path_buf(),
                source,
            })?
            .len();
        Ok(Written {
            n_vocab: self.n_vocab,
            n_tensors: self.tensors.len(),
            bytes,
        })
    }
}

/// The tensors of `spec` (the shape called `name`) in llama.cpp's order, each with the type
/// `llama-quantize` gives it under `preset` in a file whose metadata is `header`'s. A tensor
/// the rules leave alone keeps the type the converter writes: F32 for vectors, F16 for
/// matrices.
fn plan_types(
    name: &str,
    header: &GgufWriter,
    spec: &Spec,
    n_vocab: usize,
    preset: QuantPreset,
) -> Result<Vec<ShapedTensor>> {
    let metadata = GgufFile::from_bytes(header.to_bytes()?)?;
    let traits = ModelTraits::from_gguf(&metadata)?;
    let mut planned = tensors::plan(spec, n_vocab);
    planned.sort_by(|a, b| rules::llama_order(&a.name, &b.name));
    let mut chooser = TypeChooser::new(&traits, preset, planned.iter().map(|t| t.name.as_str()));
    planned
        .into_iter()
        .map(|t| {
            // Biases are F32 however many dimensions they have (gpt-oss's per-expert ones).
            let matrix = rules::n_dims(&t.ne) >= 2 && !t.name.ends_with(".bias");
            let content = match t.fill {
                Fill::Values(v) => Content::Values(v),
                Fill::Norm => Content::Norm,
                Fill::Uniform(_) if matrix => Content::Weights,
                Fill::Uniform(_) => Content::Bias,
                // Values with a sign of their own (delta-net decays): as the tiny models
                // draw them, from the shape's tensor name.
                Fill::Between(..) => Content::Values(t.values(name)),
            };
            // The converter writes routers (`ffn_gate_inp`, the shared expert's gate), short
            // convolutions and what is not a `.weight` in F32, other matrices in F16.
            let f32_matrix = [
                "ffn_gate_inp.weight",
                "ffn_gate_inp_shexp.weight",
                "ssm_conv1d.weight",
            ]
            .iter()
            .any(|n| t.name.ends_with(n))
                || !t.name.ends_with(".weight");
            let unchanged = if matrix && !f32_matrix {
                DType::F16
            } else {
                DType::F32
            };
            let dtype = chooser.choose(&t.name, &t.ne)?.target.unwrap_or(unchanged);
            // The rules never quantize a vector; the values are written as f32.
            if content != Content::Weights && dtype != DType::F32 {
                return Err(Error::UnsupportedType {
                    tensor: t.name,
                    dtype,
                });
            }
            Ok(ShapedTensor {
                name: t.name,
                dtype,
                ne: t.ne,
                content,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{Attention, Llama3Rope};
    use rgml_llm::quantize::rules::use_more_bits;

    /// A vocabulary file of `n` tokens with a chat template and a key that must not be copied.
    fn vocab(n: usize) -> GgufFile {
        let mut w = GgufWriter::new();
        w.add_metadata("general.name", Value::String("a vocabulary".into()));
        w.add_metadata("tokenizer.ggml.model", Value::String("gpt2".into()));
        let tokens = (0..n).map(|i| Value::String(format!("t{i}"))).collect();
        w.add_metadata("tokenizer.ggml.tokens", Value::Array(tokens));
        w.add_metadata("tokenizer.chat_template", Value::String("{{ x }}".into()));
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    const N_VOCAB: usize = 1000;

    fn model(shape: Shape, preset: QuantPreset) -> ShapedModel {
        ShapedModel::new(shape, preset, 0, &vocab(N_VOCAB), Path::new("v.gguf")).unwrap()
    }

    /// The header as a file (it has no tensors).
    fn metadata(m: &ShapedModel) -> GgufFile {
        GgufFile::from_bytes(m.header().to_bytes().unwrap()).unwrap()
    }

    fn tensor<'a>(m: &'a ShapedModel, name: &str) -> &'a ShapedTensor {
        m.tensors()
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    }

    /// The layers whose attn_v and ffn_down get more bits under the `_M` presets, written out
    /// from llama.cpp's rule (first and last eighth, every third layer between).
    fn more_bits_layers(n_layer: usize) -> &'static [usize] {
        match n_layer {
            16 => &[0, 1, 4, 7, 10, 13, 14, 15],
            28 => &[0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27],
            30 => &[0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29],
            32 => &[0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31],
            n => panic!("no list for {n} layers"),
        }
    }

    #[test]
    fn the_layer_lists_are_llama_cpp_s_rule() {
        for n in [16usize, 28, 30, 32] {
            let rule: Vec<usize> = (0..n)
                .filter(|&i| use_more_bits(i as i64, n as i64))
                .collect();
            assert_eq!(rule, more_bits_layers(n), "{n} layers");
        }
    }

    #[test]
    fn every_shape_has_its_hyperparameters_and_the_vocabulary() {
        for shape in Shape::ALL {
            let m = model(shape, QuantPreset::Q4_K_M);
            let s = shape.spec();
            let f = metadata(&m);
            let arch = shape.gguf_arch();
            let u = |k: &str| f.get_u64(&format!("{arch}.{k}")).unwrap() as usize;
            assert_eq!(f.get_str("general.architecture").unwrap(), arch);
            assert_eq!(
                f.get_str("general.name").unwrap(),
                format!("rgml random {shape}")
            );
            assert_eq!(u("block_count"), s.n_layer, "{shape}");
            assert_eq!(u("embedding_length"), s.n_embd, "{shape}");
            assert_eq!(u("feed_forward_length"), s.n_ff, "{shape}");
            assert_eq!(u("attention.head_count"), s.n_head, "{shape}");
            // One count, or (Gemma 4) one per layer, the first layer's the spec's.
            let kv = format!("{arch}.attention.head_count_kv");
            let n_head_kv = match f.get_array(&kv) {
                Ok(per_layer) => per_layer[0].as_u64().unwrap() as usize,
                Err(_) => u("attention.head_count_kv"),
            };
            assert_eq!(n_head_kv, s.n_head_kv, "{shape}");
            assert_eq!(u("context_length"), s.n_ctx_train as usize, "{shape}");
            assert_eq!(
                f.get_f32(&format!("{arch}.rope.freq_base")).unwrap(),
                s.rope_freq_base
            );
            assert_eq!(
                f.get_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"))
                    .unwrap(),
                s.rms_eps
            );
            assert_eq!(f.get_array("tokenizer.ggml.tokens").unwrap().len(), N_VOCAB);
            assert_eq!(f.get_str("tokenizer.chat_template").unwrap(), "{{ x }}");
            assert_eq!(f.get_u64("general.quantization_version").unwrap(), 2);
            // llama-quantize sets the file type last.
            let (last_key, last) = f.metadata().last().unwrap();
            assert_eq!(
                (last_key.as_str(), last.as_u64()),
                ("general.file_type", Some(15))
            );
            assert_eq!(
                f.get(&format!("{arch}.vocab_size")).and_then(Value::as_u64),
                (arch == "llama").then_some(N_VOCAB as u64),
                "{shape}"
            );
            let embd = tensor(&m, "token_embd.weight");
            assert_eq!(embd.ne, [s.n_embd, N_VOCAB], "{shape}");
            assert_eq!(m.n_vocab(), N_VOCAB);
        }
        let widths = |shape: Shape| {
            let f = metadata(&model(shape, QuantPreset::Q8_0));
            let key = |k: &str| f.get_u64(&format!("llama.{k}")).ok();
            (key("attention.key_length"), key("rope.dimension_count"))
        };
        assert_eq!(widths(Shape::Llama1B), (Some(64), Some(64)));
        assert_eq!(widths(Shape::Llama3B), (Some(128), Some(128)));
        assert_eq!(widths(Shape::Llama8B), (None, Some(128)));
        assert_eq!(widths(Shape::SmolLM2_135M), (None, Some(64)));
        let qwen = metadata(&model(Shape::Qwen7B, QuantPreset::Q8_0));
        assert_eq!(qwen.get_u64("general.file_type").unwrap(), 7);
        assert!(qwen.get("qwen2.rope.dimension_count").is_none());
    }

    /// The dense shapes (the mixture-of-experts one has its own test).
    fn dense_shapes() -> impl Iterator<Item = Shape> {
        Shape::ALL
            .into_iter()
            .filter(|s| !matches!(s.spec().ffn, crate::arch::Ffn::Experts(_)))
    }

    #[test]
    fn the_moe_shape_has_routers_in_f32_and_stacked_experts() {
        let m = model(Shape::Qwen3Moe30BA3B, QuantPreset::Q4_K_M);
        // Output, its norm, the embeddings; 12 per block (q/k norms, router, three experts).
        assert_eq!(m.tensors().len(), 3 + 12 * 48);
        let router = tensor(&m, "blk.7.ffn_gate_inp.weight");
        assert_eq!(
            (router.dtype, &router.ne[..]),
            (DType::F32, &[2048, 128][..])
        );
        let up = tensor(&m, "blk.7.ffn_up_exps.weight");
        assert_eq!((up.dtype, &up.ne[..]), (DType::Q4_K, &[2048, 768, 128][..]));
        let down = tensor(&m, "blk.0.ffn_down_exps.weight");
        assert_eq!(
            (down.dtype, &down.ne[..]),
            (DType::Q6_K, &[768, 2048, 128][..])
        );
        let few = Shape::Qwen3Moe30BA3B.spec_with_experts(16).unwrap();
        let path = Path::new("v.gguf");
        let small = ShapedModel::from_spec(
            "s",
            "qwen3moe",
            &few,
            QuantPreset::Q4_K_M,
            0,
            &vocab(N_VOCAB),
            path,
        )
        .unwrap();
        let meta = metadata(&small);
        assert_eq!(meta.get_u64("qwen3moe.expert_count").unwrap(), 16);
        assert_eq!(meta.get_u64("qwen3moe.expert_used_count").unwrap(), 8);
        assert!(small.data_bytes() * 5 < m.data_bytes());
        assert!(Shape::Llama1B.spec_with_experts(16).is_none());
    }

    #[test]
    fn every_shape_has_its_tensors_in_llama_cpp_s_order() {
        for shape in dense_shapes() {
            let m = model(shape, QuantPreset::Q8_0);
            let s = shape.spec();
            let names: Vec<&str> = m.tensors().iter().map(|t| t.name.as_str()).collect();
            let tied = matches!(shape, Shape::Llama1B | Shape::Llama3B | Shape::SmolLM2_135M);
            let rope = matches!(shape, Shape::Llama1B | Shape::Llama3B | Shape::Llama8B);
            let bias = shape == Shape::Qwen7B;
            let mut head = vec!["output.weight", "output_norm.weight", "rope_freqs.weight"];
            head.retain(|n| {
                (*n != "output.weight" || !tied) && (*n != "rope_freqs.weight" || rope)
            });
            head.push("token_embd.weight");
            assert_eq!(names[..head.len()], head[..], "{shape}");
            let per_block = if bias { 12 } else { 9 };
            assert_eq!(names.len(), head.len() + per_block * s.n_layer, "{shape}");
            let blk0: Vec<&str> = names[head.len()..head.len() + per_block].to_vec();
            let mut want = vec![
                "blk.0.attn_k.weight",
                "blk.0.attn_norm.weight",
                "blk.0.attn_output.weight",
                "blk.0.attn_q.weight",
                "blk.0.attn_v.weight",
                "blk.0.ffn_down.weight",
                "blk.0.ffn_gate.weight",
                "blk.0.ffn_norm.weight",
                "blk.0.ffn_up.weight",
            ];
            if bias {
                want.extend([
                    "blk.0.attn_k.bias",
                    "blk.0.attn_q.bias",
                    "blk.0.attn_v.bias",
                ]);
                want.sort_unstable();
            }
            assert_eq!(blk0, want, "{shape}");
            // Blocks in numeric order (blk.10 after blk.9).
            let layers: Vec<i64> = names.iter().map(|n| rules::layer_of(n)).collect();
            assert!(layers.windows(2).all(|w| w[0] <= w[1]), "{shape}");
            let hd = s.head_dim;
            let ne = |n: &str| tensor(&m, n).ne.clone();
            assert_eq!(ne("blk.3.attn_q.weight"), [s.n_embd, s.n_head * hd]);
            assert_eq!(ne("blk.3.attn_k.weight"), [s.n_embd, s.n_head_kv * hd]);
            assert_eq!(ne("blk.3.attn_v.weight"), [s.n_embd, s.n_head_kv * hd]);
            assert_eq!(ne("blk.3.attn_output.weight"), [s.n_head * hd, s.n_embd]);
            assert_eq!(ne("blk.3.ffn_gate.weight"), [s.n_embd, s.n_ff]);
            assert_eq!(ne("blk.3.ffn_down.weight"), [s.n_ff, s.n_embd]);
            assert_eq!(ne("blk.3.ffn_norm.weight"), [s.n_embd]);
            if bias {
                assert_eq!(ne("blk.3.attn_k.bias"), [s.n_head_kv * hd]);
            }
            if rope {
                assert_eq!(ne("rope_freqs.weight"), [hd / 2]);
            }
            // Q8_0 makes every matrix Q8_0 (the output and tied embeddings too); the rest F32.
            for t in m.tensors() {
                let want = if t.ne.len() == 2 {
                    DType::Q8_0
                } else {
                    DType::F32
                };
                assert_eq!(t.dtype, want, "{shape} {}", t.name);
            }
        }
    }

    /// The Q4_K_M types llama-quantize gives a shape, by hand: Q4_K matrices, Q6_K for the
    /// output (and tied embeddings) and for attn_v / ffn_down in the more-bits layers, and the
    /// fallbacks of rows that are not whole 256-blocks (Q4_K → Q5_0, Q6_K → Q8_0).
    fn q4_k_m_type(shape: Shape, name: &str, ne0: usize) -> DType {
        let fits = |ty: DType| match (ne0.is_multiple_of(256), ty) {
            (true, _) => ty,
            (false, DType::Q4_K) => DType::Q5_0,
            (false, _) => DType::Q8_0,
        };
        let layer = rules::layer_of(name);
        let more = layer >= 0 && more_bits_layers(shape.spec().n_layer).contains(&(layer as usize));
        let tied = shape.spec().tied_output;
        let output = name == "output.weight" || (tied && name == "token_embd.weight");
        let sensitive = (name.contains("attn_v") || name.contains("ffn_down")) && more;
        if name.ends_with("norm.weight") || name.ends_with(".bias") || name == "rope_freqs.weight" {
            DType::F32
        } else if output || sensitive {
            fits(DType::Q6_K)
        } else {
            fits(DType::Q4_K)
        }
    }

    #[test]
    fn q4_k_m_types_are_llama_quantize_s() {
        for shape in dense_shapes() {
            let m = model(shape, QuantPreset::Q4_K_M);
            for t in m.tensors() {
                let want = q4_k_m_type(shape, &t.name, t.ne[0]);
                assert_eq!(t.dtype, want, "{shape} {}", t.name);
            }
        }
        // Spot checks of the cases that matter.
        let m = model(Shape::Llama1B, QuantPreset::Q4_K_M);
        assert_eq!(tensor(&m, "token_embd.weight").dtype, DType::Q6_K);
        assert_eq!(tensor(&m, "blk.4.attn_v.weight").dtype, DType::Q6_K);
        assert_eq!(tensor(&m, "blk.5.attn_v.weight").dtype, DType::Q4_K);
        let m = model(Shape::Llama8B, QuantPreset::Q4_K_M);
        assert_eq!(tensor(&m, "token_embd.weight").dtype, DType::Q4_K);
        assert_eq!(tensor(&m, "output.weight").dtype, DType::Q6_K);
        let m = model(Shape::SmolLM2_135M, QuantPreset::Q4_K_M);
        assert_eq!(tensor(&m, "token_embd.weight").dtype, DType::Q8_0);
        assert_eq!(tensor(&m, "blk.0.attn_q.weight").dtype, DType::Q5_0);
        assert_eq!(tensor(&m, "blk.0.attn_v.weight").dtype, DType::Q8_0);
        assert_eq!(tensor(&m, "blk.3.ffn_down.weight").dtype, DType::Q4_K);
    }

    #[test]
    fn sizes_add_up_to_the_real_models() {
        // Parameters with the real vocabularies (128256 Llama 3, 151936 Qwen2, 49152 SmolLM2).
        let params = |shape: Shape, n_vocab: usize| -> usize {
            let m = ShapedModel::new(shape, QuantPreset::F32, 0, &vocab(n_vocab), Path::new("v"))
                .unwrap();
            m.tensors()
                .iter()
                .map(|t| t.ne.iter().product::<usize>())
                .sum()
        };
        let near = |n: usize, billions: f64| (n as f64 / 1e9 - billions).abs() < 0.01;
        assert!(near(params(Shape::Llama1B, 128_256), 1.236), "1b");
        assert!(near(params(Shape::Llama3B, 128_256), 3.213), "3b");
        assert!(near(params(Shape::Llama8B, 128_256), 8.030), "8b");
        assert!(near(params(Shape::Qwen7B, 151_936), 7.615), "7b");
        assert!(near(params(Shape::SmolLM2_135M, 49_152), 0.135), "135m");
    }

    /// A small model with what the shapes have: llama3 rope factors, biases, grouped heads,
    /// and (at width 192) rows that K-quants do not fit.
    fn tiny(n_embd: usize, tied: bool, bias: bool) -> Spec {
        Spec {
            n_layer: 2,
            n_embd,
            n_head: n_embd / 64,
            n_head_kv: 1,
            head_dim: 64,
            n_ff: 512,
            tied_output: tied,
            attention: Attention::Separate { bias },
            llama3_rope: Some(Llama3Rope {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_context: 8192,
            }),
            ..Shape::Llama8B.spec()
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "rgml-testmodels-shaped-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_tiny(
        dir: &Path,
        spec: &Spec,
        preset: QuantPreset,
        seed: u64,
        threads: usize,
    ) -> (ShapedModel, Vec<u8>) {
        let m = ShapedModel::from_spec(
            "tiny",
            "llama",
            spec,
            preset,
            seed,
            &vocab(300),
            Path::new("v"),
        )
        .unwrap();
        let out = dir.join(format!("{preset}-{seed}-{threads}.gguf"));
        let written = m.write(&out, threads).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(written.bytes, bytes.len() as u64);
        assert_eq!(written.n_tensors, m.tensors().len());
        (m, bytes)
    }

    /// Read a written file back and check every tensor: declared as planned, the right size,
    /// finite values (so finite block scales), not all zero, weights of about the intended
    /// deviation, norms near 1, the rope factors as computed.
    fn check_file(m: &ShapedModel, bytes: Vec<u8>, what: &str) {
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.tensors().len(), m.tensors().len(), "{what}");
        for (info, t) in f.tensors().iter().zip(m.tensors()) {
            assert_eq!((&info.name, info.dtype), (&t.name, t.dtype), "{what}");
            assert_eq!(&info.ne[..t.ne.len()], &t.ne[..], "{what} {}", t.name);
            let data = f.tensor_data(info);
            assert_eq!(data.len(), t.bytes(), "{what} {}", t.name);
            let n: usize = t.ne.iter().product();
            let mut v = vec![0f32; n];
            rgml::quant::dequantize_row(t.dtype, data, &mut v).unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{what} {}", t.name);
            assert!(v.iter().any(|&x| x != 0.0), "{what} {}", t.name);
            let rms = (v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / n as f64).sqrt();
            match &t.content {
                Content::Weights => {
                    assert!(
                        (0.015..0.025).contains(&rms),
                        "{what} {}: rms {rms}",
                        t.name
                    )
                }
                Content::Norm => assert!(v.iter().all(|x| (0.97..1.03).contains(x))),
                Content::Bias => assert!(v.iter().all(|x| x.abs() <= 0.02)),
                Content::Values(want) => assert_eq!(&v, want),
            }
        }
    }

    #[test]
    fn every_preset_writes_a_file_that_reads_back_whole() {
        let dir = scratch("presets");
        for (spec, label) in [
            (tiny(256, true, false), "256 tied"),
            (tiny(192, false, true), "192 biases"),
        ] {
            for preset in QuantPreset::ALL {
                let (m, bytes) = write_tiny(&dir, &spec, preset, 1, 2);
                check_file(&m, bytes, &format!("{label} {preset}"));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_seed_picks_the_values_and_the_threads_do_not() {
        let dir = scratch("seeds");
        let spec = tiny(256, false, true);
        let (m, a) = write_tiny(&dir, &spec, QuantPreset::Q4_K_M, 7, 1);
        let (_, again) = write_tiny(&dir, &spec, QuantPreset::Q4_K_M, 7, 3);
        let (_, other) = write_tiny(&dir, &spec, QuantPreset::Q4_K_M, 8, 2);
        assert_eq!(a, again, "same seed, other thread count");
        assert_eq!(a.len(), other.len());
        let (fa, fo) = (
            GgufFile::from_bytes(a).unwrap(),
            GgufFile::from_bytes(other).unwrap(),
        );
        for t in m.tensors() {
            let data = |f: &GgufFile| f.tensor_data(f.tensor(&t.name).unwrap()).to_vec();
            if matches!(t.content, Content::Values(_)) {
                assert_eq!(data(&fa), data(&fo), "{}", t.name);
            } else {
                assert_ne!(data(&fa), data(&fo), "{}", t.name);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_output_is_an_error_and_leaves_nothing() {
        let dir = scratch("unwritable");
        let m = ShapedModel::from_spec(
            "tiny",
            "llama",
            &tiny(256, true, false),
            QuantPreset::Q8_0,
            0,
            &vocab(64),
            Path::new("v"),
        )
        .unwrap();
        let out = dir.join("missing-dir/m.gguf");
        let err = m.write(&out, 1).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(err.to_string().contains("m.gguf.part"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
