//! Unit tests of the presets, the type rules and the conversion on synthetic models. The
//! byte-for-byte comparison with llama-quantize on the demo model is in the CLI's tests.

use super::rules::{allows_quantization, layer_of, llama_order, use_more_bits, Category};
use super::*;
use rgml_gguf::GgufWriter;

fn llama_traits(n_layer: usize) -> ModelTraits {
    ModelTraits {
        arch: "llama".into(),
        n_layer,
        n_expert: 0,
        n_gqa: 3,
        is_70b: false,
    }
}

/// The tensor names of a LLaMA-style model with `n_layer` blocks, in llama.cpp's order.
fn llama_names(n_layer: usize, tied: bool) -> Vec<String> {
    let mut names = vec!["output_norm.weight".to_string(), "token_embd.weight".into()];
    if !tied {
        names.push("output.weight".into());
    }
    for i in 0..n_layer {
        for t in [
            "attn_k",
            "attn_norm",
            "attn_output",
            "attn_q",
            "attn_v",
            "ffn_down",
            "ffn_gate",
            "ffn_norm",
            "ffn_up",
        ] {
            names.push(format!("blk.{i}.{t}.weight"));
        }
    }
    names.sort_by(|a, b| llama_order(a, b));
    names
}

/// Every tensor's chosen type under `preset`, for rows of `ne0` elements.
fn choose_all(
    traits: &ModelTraits,
    preset: QuantPreset,
    names: &[String],
    ne0: usize,
) -> Vec<(String, Option<DType>)> {
    let mut chooser = TypeChooser::new(traits, preset, names.iter().map(String::as_str));
    names
        .iter()
        .map(|n| {
            let ne: &[usize] = if n.ends_with("norm.weight") {
                &[ne0]
            } else {
                &[ne0, 64]
            };
            (n.clone(), chooser.choose(n, ne).unwrap().target)
        })
        .collect()
}

fn layers_with(types: &[(String, Option<DType>)], kind: &str, ty: DType) -> Vec<i64> {
    types
        .iter()
        .filter(|(n, t)| n.contains(kind) && *t == Some(ty))
        .map(|(n, _)| layer_of(n))
        .collect()
}

#[test]
fn use_more_bits_matches_llama_for_30_layers() {
    let more: Vec<i64> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
    // n/8 = 3, 7n/8 = 26: layers 0-2, 26-29, and every third from 3 (5, 8, ..., 23).
    assert_eq!(more, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
}

#[test]
fn q4_k_m_gives_q6_k_to_the_more_bits_layers_of_attn_v_and_ffn_down() {
    let names = llama_names(30, false);
    let types = choose_all(&llama_traits(30), QuantPreset::Q4_K_M, &names, 4096);
    let expected = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29];
    assert_eq!(layers_with(&types, "attn_v", DType::Q6_K), expected);
    assert_eq!(layers_with(&types, "ffn_down", DType::Q6_K), expected);
    assert_eq!(layers_with(&types, "attn_q", DType::Q6_K), [] as [i64; 0]);
    assert_eq!(layers_with(&types, "ffn_down", DType::Q4_K).len(), 30 - 14);
    let get = |name: &str| types.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(get("output.weight"), Some(DType::Q6_K));
    // Untied token embeddings keep the preset's type; norms are never quantized.
    assert_eq!(get("token_embd.weight"), Some(DType::Q4_K));
    assert_eq!(get("blk.3.ffn_norm.weight"), None);
    assert_eq!(get("output_norm.weight"), None);
}

#[test]
fn other_presets_bump_their_own_layers() {
    let names = llama_names(32, false);
    let traits = llama_traits(32);
    let q4_k_s = choose_all(&traits, QuantPreset::Q4_K_S, &names, 4096);
    assert_eq!(layers_with(&q4_k_s, "attn_v", DType::Q5_K), [0, 1, 2, 3]);
    assert_eq!(layers_with(&q4_k_s, "ffn_down", DType::Q5_K), [0, 1, 2, 3]);
    let q3_k_m = choose_all(&traits, QuantPreset::Q3_K_M, &names, 4096);
    assert_eq!(layers_with(&q3_k_m, "attn_v", DType::Q5_K), [0, 1]);
    assert_eq!(layers_with(&q3_k_m, "ffn_down", DType::Q5_K), [0, 1]);
    assert_eq!(layers_with(&q3_k_m, "attn_output", DType::Q4_K).len(), 32);
    let q6_k = choose_all(&traits, QuantPreset::Q6_K, &names, 4096);
    assert!(q6_k
        .iter()
        .all(|(n, t)| n.ends_with("norm.weight") || *t == Some(DType::Q6_K)));
}

#[test]
fn tied_embeddings_take_the_output_rule_and_odd_rows_fall_back() {
    // The demo model's case: tied embeddings, rows of 576 (not a multiple of 256).
    let names = llama_names(30, true);
    let traits = llama_traits(30);
    let types = choose_all(&traits, QuantPreset::Q4_K_M, &names, 576);
    let get = |name: &str| types.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(get("token_embd.weight"), Some(DType::Q8_0));
    assert_eq!(get("blk.0.attn_v.weight"), Some(DType::Q8_0)); // Q6_K -> Q8_0
    assert_eq!(get("blk.3.attn_v.weight"), Some(DType::Q5_0)); // Q4_K -> Q5_0
    assert_eq!(get("blk.0.attn_q.weight"), Some(DType::Q5_0));
    // With 32-multiple rows, Q4_0's embeddings go to Q6_K, then fall back to Q8_0 at 576.
    let q4_0 = choose_all(&traits, QuantPreset::Q4_0, &names, 576);
    assert_eq!(q4_0[1], ("token_embd.weight".into(), Some(DType::Q8_0)));
    let q4_0 = choose_all(&traits, QuantPreset::Q4_0, &names, 512);
    assert_eq!(q4_0[1], ("token_embd.weight".into(), Some(DType::Q6_K)));
    // Q5_K_M: Q5_K -> Q5_1 where it does not fit.
    let q5 = choose_all(&traits, QuantPreset::Q5_K_M, &names, 576);
    assert_eq!(layers_with(&q5, "attn_q", DType::Q5_1).len(), 30);
    // Rows not a multiple of 32: f16.
    let mut chooser = TypeChooser::new(&traits, QuantPreset::Q4_0, ["blk.0.attn_q.weight"]);
    let choice = chooser.choose("blk.0.attn_q.weight", &[48, 4]).unwrap();
    assert_eq!(choice.target, Some(DType::F16));
    assert_eq!(
        choice.fallback,
        Some(Fallback {
            wanted: DType::Q4_0,
            used: DType::F16
        })
    );
}

#[test]
fn float_presets_skip_the_rules_but_not_the_exclusions() {
    let names = llama_names(4, true);
    let types = choose_all(&llama_traits(4), QuantPreset::F16, &names, 576);
    for (n, t) in types {
        let want = if n.ends_with("norm.weight") {
            None
        } else {
            Some(DType::F16)
        };
        assert_eq!(t, want, "{n}");
    }
}

#[test]
fn model_kinds_change_the_rules() {
    let names = llama_names(8, false);
    let falcon = ModelTraits {
        arch: "falcon".into(),
        ..llama_traits(8)
    };
    let types = choose_all(&falcon, QuantPreset::Q4_K_M, &names, 4096);
    assert_eq!(
        types.iter().find(|(n, _)| n == "output.weight").unwrap().1,
        Some(DType::Q8_0)
    );
    let experts = ModelTraits {
        n_expert: 8,
        ..llama_traits(8)
    };
    let types = choose_all(&experts, QuantPreset::Q4_K_M, &names, 4096);
    assert_eq!(layers_with(&types, "attn_v", DType::Q8_0).len(), 8);
    assert_eq!(layers_with(&types, "attn_k", DType::Q8_0).len(), 8);
    assert_eq!(layers_with(&types, "attn_output", DType::Q5_K).len(), 8);
    let big = ModelTraits {
        is_70b: true,
        ..llama_traits(8)
    };
    let types = choose_all(&big, QuantPreset::Q3_K_M, &names, 4096);
    assert_eq!(layers_with(&types, "attn_v", DType::Q5_K).len(), 8);
    // An expert tensor whose layer cannot be read is an error naming it.
    let mut chooser = TypeChooser::new(&experts, QuantPreset::Q4_K_M, ["ffn_down_exps.weight"]);
    let err = chooser
        .choose("ffn_down_exps.weight", &[256, 4, 8])
        .unwrap_err();
    assert!(err.to_string().contains("ffn_down_exps.weight"), "{err}");
}

#[test]
fn categories_and_exclusions_follow_llama() {
    assert_eq!(Category::of("blk.0.attn_kv_b.weight"), Category::AttnKvB);
    assert_eq!(Category::of("blk.0.attn_v.weight"), Category::AttnV);
    assert_eq!(
        Category::of("blk.0.ffn_down_exps.weight"),
        Category::FfnDown
    );
    assert_eq!(Category::of("output.weight"), Category::Output);
    assert_eq!(Category::of("blk.0.attn_norm.weight"), Category::Other);
    assert!(allows_quantization(
        "llama",
        "blk.0.attn_q.weight",
        &[64, 64]
    ));
    assert!(!allows_quantization(
        "llama",
        "blk.0.attn_q.weight",
        &[64, 1, 1]
    ));
    assert!(!allows_quantization(
        "llama",
        "blk.0.attn_q.bias",
        &[64, 64]
    ));
    assert!(!allows_quantization(
        "llama",
        "blk.0.attn_norm.weight",
        &[64, 64]
    ));
    assert!(!allows_quantization(
        "llama",
        "blk.0.ffn_gate_inp.weight",
        &[64, 8]
    ));
    assert!(!allows_quantization(
        "llama",
        "position_embd.weight",
        &[64, 64]
    ));
    assert!(allows_quantization("llama", "blk.0.hc_x.weight", &[64, 64]));
    assert!(!allows_quantization(
        "glm5-next",
        "blk.0.hc_x.weight",
        &[64, 64]
    ));
}

#[test]
fn tensor_order_is_the_loaders() {
    let mut names = vec![
        "blk.10.attn_q.weight",
        "output.weight",
        "blk.2.ffn_up.weight",
        "blk.2.attn_q.weight",
        "token_embd.weight",
        "output_norm.weight",
    ];
    names.sort_by(|a, b| llama_order(a, b));
    assert_eq!(
        names,
        [
            "output.weight",
            "output_norm.weight",
            "token_embd.weight",
            "blk.2.attn_q.weight",
            "blk.2.ffn_up.weight",
            "blk.10.attn_q.weight",
        ]
    );
    assert_eq!(layer_of("blk.-3.x"), -3);
    assert_eq!(layer_of("blk.x"), -1);
    assert_eq!(layer_of("blk. 7.x"), 7);
}

#[test]
fn presets_parse_like_llama_quantize() {
    assert_eq!(QuantPreset::parse("q4_k_m").unwrap(), QuantPreset::Q4_K_M);
    assert_eq!(QuantPreset::parse("Q4_K").unwrap(), QuantPreset::Q4_K_M);
    assert_eq!(QuantPreset::parse("7").unwrap(), QuantPreset::Q8_0);
    assert_eq!(QuantPreset::parse("bf16").unwrap().file_type(), 32);
    for p in QuantPreset::ALL {
        assert_eq!(QuantPreset::parse(p.name()).unwrap(), p);
        assert_eq!(QuantPreset::parse(&p.file_type().to_string()).unwrap(), p);
    }
    let err = QuantPreset::parse("Q9_9").unwrap_err().to_string();
    assert!(err.contains("Q9_9") && err.contains("Q4_K_M"), "{err}");
}

/// A small llama model: 2 layers, rows of `ne0`, weights in `dtype` (from a fixed ramp).
fn tiny_model(ne0: usize, dtype: DType) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()));
    w.add_metadata("general.file_type", Value::U32(0));
    w.add_metadata("llama.block_count", Value::U32(2));
    w.add_metadata("split.count", Value::U16(1));
    let f32_row = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7 + seed * 13) % 29) as f32 - 14.0) / 9.0)
            .collect()
    };
    let mut add = |name: &str, ne: &[usize], dtype: DType| {
        let n: usize = ne.iter().product();
        let mut bytes = vec![0u8; dtype.row_bytes(ne[0]).unwrap() * (n / ne[0])];
        rgml::quant::quantize_row(dtype, &f32_row(n, name.len()), &mut bytes).unwrap();
        w.add_tensor(name, dtype, ne, &bytes).unwrap();
    };
    add("token_embd.weight", &[ne0, 8], dtype);
    for i in 0..2 {
        add(&format!("blk.{i}.attn_norm.weight"), &[ne0], DType::F32);
        for t in ["attn_q", "attn_v", "ffn_down"] {
            add(&format!("blk.{i}.{t}.weight"), &[ne0, 4], dtype);
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn quantize_bytes(file: &GgufFile, options: &QuantizeOptions) -> Result<Vec<u8>, QuantizeError> {
    let plan = plan(file, options)?;
    let header = output_metadata(file, options.preset);
    let mut out = Vec::new();
    let path = Path::new("out.gguf");
    write_tensors(file, &plan, &header, &mut out, path, options, &mut |_| {})?;
    Ok(out)
}

#[test]
fn output_bytes_do_not_depend_on_the_thread_count() {
    let file = tiny_model(256 * 64, DType::F32); // big enough to run threads
    let mut options = QuantizeOptions::new(QuantPreset::Q4_K_M);
    options.n_threads = 1;
    let one = quantize_bytes(&file, &options).unwrap();
    options.n_threads = 3;
    assert_eq!(quantize_bytes(&file, &options).unwrap(), one);
    let out = GgufFile::from_bytes(one).unwrap();
    let types: Vec<_> = out.tensors().iter().map(|t| t.dtype).collect();
    assert!(
        types.contains(&DType::Q4_K) && types.contains(&DType::Q6_K),
        "{types:?}"
    );
}

#[test]
fn metadata_gets_version_and_file_type_last_and_loses_split_keys() {
    let file = tiny_model(64, DType::F32);
    let out = quantize_bytes(&file, &QuantizeOptions::new(QuantPreset::Q8_0)).unwrap();
    let out = GgufFile::from_bytes(out).unwrap();
    let keys: Vec<_> = out.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "general.architecture",
            "llama.block_count",
            "general.quantization_version",
            "general.file_type"
        ]
    );
    assert_eq!(out.get_u64("general.file_type").unwrap(), 7);
    // Norms are copied bit for bit; the rest is Q8_0 that decodes near the input.
    let norm = "blk.1.attn_norm.weight";
    assert_eq!(
        out.tensor_data(out.tensor(norm).unwrap()),
        file.tensor_data(file.tensor(norm).unwrap())
    );
    let q = out.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dtype, DType::Q8_0);
}

#[test]
fn quantized_inputs_need_allow_requantize() {
    let file = tiny_model(64, DType::Q4_1);
    let mut options = QuantizeOptions::new(QuantPreset::Q8_0);
    let err = plan(&file, &options).unwrap_err().to_string();
    assert!(
        err.contains("token_embd.weight") && err.contains("requantizing from type q4_1"),
        "{err}"
    );
    options.allow_requantize = true;
    let out = GgufFile::from_bytes(quantize_bytes(&file, &options).unwrap()).unwrap();
    assert_eq!(
        out.tensor("blk.0.attn_v.weight").unwrap().dtype,
        DType::Q8_0
    );
    // The same preset as the input: the blocks' weights are copied, only the tied embeddings
    // (Q6_K, falling back to Q8_0) are converted.
    options.preset = QuantPreset::Q4_1;
    let same = plan(&file, &options).unwrap();
    for t in &same.tensors {
        let converted = t.from != t.to;
        assert_eq!(converted, t.name == "token_embd.weight", "{t:?}");
    }
}
