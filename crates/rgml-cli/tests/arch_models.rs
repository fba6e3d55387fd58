//! Every architecture's random model (`crates/rgml-testmodels`) against llama.cpp's logits.
//!
//! `tests/fixtures/arch/<isa>/<arch>.json` holds what llama.cpp's native build for that
//! instruction set computes for the model (`scripts/gen_arch_fixtures.py`): per prompt, the
//! tokens and the top 10 logits of the last position after one batched decode, and a greedy
//! continuation of 32 single-token decodes (the generation path); `<arch>.fa-on.json` the same
//! with flash attention on (`--flash-attn on`). Here the model is written
//! afresh by the library, must have the fixture's sha256 (the generator is deterministic, so
//! the fixture describes these very bytes), and `rgml logits --greedy 32` runs it with
//! `RGML_CPU_ISA=<isa>` wherever this CPU can run that ISA: the prompt's logits and every
//! step's.
//!
//! An architecture rgml cannot run yet has its test ignored; `cargo test -- --ignored` shows
//! how far each one is.

#[allow(dead_code)] // The GPU lookup is not used here.
mod common;

use common::{greedy_worst, logits_json, root, runnable_isas, sha256_hex};
use rgml_testmodels::Arch;
use std::path::{Path, PathBuf};

/// The random model of `arch`, written into the test's scratch directory.
fn model_file(arch: Arch) -> PathBuf {
    model_file_named(arch, &arch.to_string())
}

/// [`model_file`] as `<name>.gguf` (tests running at once must not rewrite each other's).
fn model_file_named(arch: Arch, name: &str) -> PathBuf {
    common::random_model_file(arch, "arch-models", name)
}

/// The fixtures of `arch`, per instruction set they were recorded on: flash attention off,
/// and on where that fixture exists.
fn fixtures(arch: Arch) -> Vec<(String, serde_json::Value)> {
    let dir = root().join("crates/rgml-cli/tests/fixtures/arch");
    let mut out: Vec<(String, serde_json::Value)> = std::fs::read_dir(&dir)
        .expect("fixtures/arch")
        .map(|e| e.expect("fixture directory").path())
        .flat_map(|isa_dir| {
            let isa = isa_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            [format!("{arch}.json"), format!("{arch}.fa-on.json")]
                .into_iter()
                .filter_map(move |name| {
                    let text = std::fs::read_to_string(isa_dir.join(name)).ok()?;
                    Some((
                        isa.clone()?,
                        serde_json::from_str(&text).expect("fixture JSON"),
                    ))
                })
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `rgml logits --json` for `prompt` under the arithmetic of `isa`.
fn logits(model: &Path, isa: &str, prompt: &str) -> serde_json::Value {
    logits_json(model, isa, prompt, &[])
}

/// Write `arch`'s model, check its bytes against every fixture's sha256, and its logits on
/// every instruction set this CPU runs.
fn check(arch: Arch) {
    let model = model_file(arch);
    let sha = sha256_hex(&std::fs::read(&model).expect("read model"));
    let fixtures = fixtures(arch);
    assert!(!fixtures.is_empty(), "{arch}: no fixture");
    let runnable = runnable_isas();
    for (isa, fixture) in &fixtures {
        assert_eq!(
            fixture["sha256"].as_str(),
            Some(sha.as_str()),
            "{arch}: rgml-testmodels must write the bytes the {isa} fixture was made from"
        );
        if !runnable.contains(&isa.as_str()) {
            continue;
        }
        let fa = fixture["flash_attn"].as_str().unwrap_or("off");
        if common::fp16_fixture_left_out(isa, fa, "f16", || arch.spec().head_dim) {
            eprintln!("{arch} on {isa}, -fa {fa}: {}", common::FP16_LEFT_OUT);
            continue;
        }
        for case in fixture["cases"].as_array().expect("cases") {
            let prompt = case["prompt"].as_str().expect("prompt");
            let what = format!("{arch} {prompt:?} on {isa}, -fa {fa}");
            let steps = case["continuation"]
                .as_array()
                .map_or(0, Vec::len)
                .to_string();
            let got = logits_json(&model, isa, prompt, &["--greedy", &steps, "-fa", fa]);
            let worst = greedy_worst(&got, case, &what);
            // 4-decimal rounding of the fixture, plus f32 spacing near |logit| 32.
            assert!(worst <= 5.1e-5, "{what}: {worst} from llama.cpp");
        }
        eprintln!("{arch} on {isa}, -fa {fa}: exact");
    }
    check_splits(arch, &model, &fixtures);
}

/// The longest prompt (past the sliding window where there is one) split over two CPU devices
/// by layers and by tensors gives one device's logits bit for bit (a hybrid model's recurrent
/// layers are not split by tensors: refused by name).
fn check_splits(arch: Arch, model: &Path, fixtures: &[(String, serde_json::Value)]) {
    let Some(isa) = runnable_isas().first().copied() else {
        return;
    };
    let prompt = fixtures
        .iter()
        .flat_map(|(_, f)| f["cases"].as_array().expect("cases"))
        .max_by_key(|c| c["tokens"].as_array().map_or(0, |t| t.len()))
        .and_then(|c| c["prompt"].as_str())
        .expect("a prompt");
    let one = logits(model, isa, prompt);
    let refusal = arch.spec().delta_net.is_some().then_some("recurrent");
    if let Some(reason) = refusal {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rgml"))
            .args(["logits", "-p", prompt, "--device", "CPU0,CPU1"])
            .args(["--split-mode", "tensor", "-m"])
            .arg(model)
            .env("RGML_CPU_DEVICES", "2")
            .output()
            .expect("run rgml logits");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(reason),
            "{arch}: {err}"
        );
    }
    let modes: &[&str] = if refusal.is_some() {
        &["layer"]
    } else {
        &["layer", "tensor"]
    };
    for &mode in modes {
        let split = logits_json(
            model,
            isa,
            prompt,
            &["--device", "CPU0,CPU1", "--split-mode", mode],
        );
        assert_eq!(
            split, one,
            "{arch}: --split-mode {mode} over two CPU devices"
        );
    }
}

#[test]
fn gemma3_gives_llama_cpps_logits() {
    check(Arch::Gemma3);
}

#[test]
fn qwen2_gives_llama_cpps_logits() {
    check(Arch::Qwen2);
}

#[test]
fn qwen3_gives_llama_cpps_logits() {
    check(Arch::Qwen3);
}

#[test]
fn llama3_gives_llama_cpps_logits() {
    check(Arch::Llama3);
}

#[test]
fn phi3_gives_llama_cpps_logits() {
    check(Arch::Phi3);
}

#[test]
fn mistral_gives_llama_cpps_logits() {
    check(Arch::Mistral);
}

#[test]
fn qwen3moe_gives_llama_cpps_logits() {
    check(Arch::Qwen3Moe);
}

#[test]
fn mixtral_gives_llama_cpps_logits() {
    check(Arch::Mixtral);
}

#[test]
fn gpt_oss_gives_llama_cpps_logits() {
    check(Arch::GptOss);
}

#[test]
fn qwen35_gives_llama_cpps_logits() {
    check(Arch::Qwen35);
}

#[test]
fn qwen35moe_gives_llama_cpps_logits() {
    check(Arch::Qwen35Moe);
}

#[test]
fn gemma4_gives_llama_cpps_logits() {
    check(Arch::Gemma4);
}

#[test]
fn gemma4moe_gives_llama_cpps_logits() {
    check(Arch::Gemma4Moe);
}

/// Current converters end Qwen3.5 files with a multi-token prediction block
/// (`nextn_predict_layers`, counted in `block_count`, its tensors under the next block's
/// index): it is accepted and never read, so the logits are those of the file without it.
#[test]
fn qwen35_files_with_a_multi_token_prediction_block_run_without_it() {
    let arch = Arch::Qwen35;
    let source = model_file_named(arch, "qwen35-mtp-source");
    let file = rgml_gguf::GgufFile::open(&source).expect("open the model");
    let key = |k: &str| format!("qwen35.{k}");
    let n_layer = file.get_u64(&key("block_count")).expect("block count") as usize;
    let mut w = rgml_gguf::GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    w.add_metadata(
        key("block_count"),
        rgml_gguf::Value::U32(n_layer as u32 + 1),
    );
    w.add_metadata(key("nextn_predict_layers"), rgml_gguf::Value::U32(1));
    let last = format!("blk.{}.", n_layer - 1);
    let mtp = format!("blk.{n_layer}.");
    for t in file.tensors() {
        let data = file.tensor_data(t);
        w.add_tensor(&t.name, t.dtype, &t.ne[..t.n_dims], data)
            .expect("add tensor");
        // The last (full-attention) block again as the prediction block's trunk.
        if let Some(rest) = t.name.strip_prefix(&last) {
            w.add_tensor(&format!("{mtp}{rest}"), t.dtype, &t.ne[..t.n_dims], data)
                .expect("add tensor");
        }
    }
    let norm = file
        .tensors()
        .iter()
        .find(|t| t.name == "output_norm.weight")
        .expect("output norm");
    for part in ["enorm", "hnorm"] {
        let name = format!("{mtp}nextn.{part}.weight");
        w.add_tensor(&name, norm.dtype, &norm.ne[..1], file.tensor_data(norm))
            .expect("add tensor");
    }
    let path = source.with_file_name("qwen35-mtp.gguf");
    w.write_file(&path).expect("write the model");
    let Some(&isa) = runnable_isas().first() else {
        return;
    };
    let prompt = "Once upon a time";
    let plain = logits_json(&source, isa, prompt, &["--greedy", "4"]);
    assert_eq!(logits_json(&path, isa, prompt, &["--greedy", "4"]), plain);
}

/// The Gemma 3 random model with `edit` applied to a copy of its metadata and tensors
/// (`None` from the tensor edit drops the tensor), written next to it as `<name>.gguf`.
fn edited_gemma3(
    name: &str,
    edit_meta: impl Fn(&mut rgml_gguf::GgufWriter),
    edit_tensor: impl Fn(&rgml_gguf::TensorInfo) -> Option<(Vec<usize>, usize)>,
) -> PathBuf {
    edited(Arch::Gemma3, name, edit_meta, edit_tensor)
}

/// [`edited_gemma3`] for the random model of `arch`.
fn edited(
    arch: Arch,
    name: &str,
    edit_meta: impl Fn(&mut rgml_gguf::GgufWriter),
    edit_tensor: impl Fn(&rgml_gguf::TensorInfo) -> Option<(Vec<usize>, usize)>,
) -> PathBuf {
    let source = model_file_named(arch, &format!("{name}-source"));
    let file = rgml_gguf::GgufFile::open(&source).expect("open the model");
    let mut w = rgml_gguf::GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    edit_meta(&mut w);
    for t in file.tensors() {
        // The edit gives the tensor's new shape and how many bytes of its data to keep.
        let Some((ne, bytes)) = edit_tensor(t) else {
            continue;
        };
        let data = &file.tensor_data(t)[..bytes];
        w.add_tensor(&t.name, t.dtype, &ne, data)
            .expect("add tensor");
    }
    let path = source.with_file_name(format!("{name}.gguf"));
    w.write_file(&path).expect("write the edited model");
    path
}

/// Loading `path` fails with an error that names `what`.
fn refused(path: &Path, what: &str) {
    rgml_cpu::register();
    let err =
        rgml_llm::Model::load(path, Default::default()).expect_err("the model must be refused");
    let text = err.to_string();
    assert!(
        text.contains(what),
        "the error should name {what:?}: {text}"
    );
}

#[test]
fn bad_or_unsupported_metadata_is_a_clear_error() {
    use rgml_gguf::Value;
    let whole = |t: &rgml_gguf::TensorInfo| Some((t.ne[..t.n_dims].to_vec(), t.size));
    let unknown = edited_gemma3(
        "unknown-arch",
        |w| w.add_metadata("general.architecture", Value::String("gemma9".into())),
        whole,
    );
    refused(&unknown, "architecture 'gemma9'");
    let missing = edited_gemma3(
        "missing-tensor",
        |_| {},
        |t| {
            (t.name != "blk.1.attn_q_norm.weight")
                .then(|| whole(t))
                .flatten()
        },
    );
    refused(&missing, "blk.1.attn_q_norm.weight");
    let wrong_shape = edited_gemma3(
        "wrong-shape",
        |_| {},
        |t| match t.name.as_str() {
            "blk.0.attn_k_norm.weight" => Some((vec![t.ne[0] / 2], t.size / 2)),
            _ => whole(t),
        },
    );
    refused(&wrong_shape, "blk.0.attn_k_norm.weight");
    let wide_window = edited_gemma3(
        "wide-window",
        |w| w.add_metadata("gemma3.attention.sliding_window", Value::U32(1 << 20)),
        whole,
    );
    refused(&wide_window, "gemma3.attention.sliding_window");
    let short_pattern = edited_gemma3(
        "short-pattern",
        |w| {
            w.add_metadata(
                "gemma3.attention.sliding_window_pattern",
                Value::Array(vec![Value::Bool(true); 2]),
            )
        },
        whole,
    );
    refused(&short_pattern, "gemma3.attention.sliding_window_pattern");
    let negative_cap = edited_gemma3(
        "negative-cap",
        |w| w.add_metadata("gemma3.final_logit_softcapping", Value::F32(-4.0)),
        whole,
    );
    refused(&negative_cap, "gemma3.final_logit_softcapping");
    let no_head_width = edited_gemma3(
        "no-key-length",
        |w| w.add_metadata("gemma3.attention.key_length", Value::String("wide".into())),
        whole,
    );
    refused(&no_head_width, "gemma3.attention.key_length");
}

#[test]
fn bad_expert_metadata_is_a_clear_error() {
    use rgml_gguf::Value;
    let whole = |t: &rgml_gguf::TensorInfo| Some((t.ne[..t.n_dims].to_vec(), t.size));
    let moe = |name: &str, key: &str, value: Value| {
        let key = key.to_string();
        edited(
            Arch::Qwen3Moe,
            name,
            move |w| w.add_metadata(key.clone(), value.clone()),
            whole,
        )
    };
    refused(
        &moe("too-many-used", "qwen3moe.expert_used_count", Value::U32(9)),
        "9 of 8 experts",
    );
    refused(
        &moe("no-experts", "qwen3moe.expert_count", Value::U32(0)),
        "qwen3moe.expert_count must be positive",
    );
    let per_layer = |counts: &[u32]| Value::Array(counts.iter().map(|&n| Value::U32(n)).collect());
    refused(
        &moe(
            "uneven-used",
            "qwen3moe.expert_used_count",
            per_layer(&[3, 2, 3]),
        ),
        "qwen3moe.expert_used_count differs between layers",
    );
    // The same count for every layer, as an array, is read as llama.cpp reads it.
    let even = moe(
        "even-used",
        "qwen3moe.expert_used_count",
        per_layer(&[3, 3, 3]),
    );
    let model = rgml_llm::Model::load(&even, Default::default()).expect("per-layer counts");
    assert_eq!(model.config.moe.as_ref().map(|m| m.n_expert_used), Some(3));
    // Expert weights of the wrong width; a block without its router.
    let narrow = edited(
        Arch::Qwen3Moe,
        "narrow-experts",
        |_| {},
        |t| match t.name.as_str() {
            "blk.1.ffn_up_exps.weight" => Some((vec![t.ne[0], t.ne[1] / 2, t.ne[2]], t.size / 2)),
            _ => whole(t),
        },
    );
    refused(&narrow, "blk.1.ffn_up_exps.weight");
    let no_router = edited(
        Arch::Qwen3Moe,
        "no-router",
        |_| {},
        |t| {
            (t.name != "blk.2.ffn_gate_inp.weight")
                .then(|| whole(t))
                .flatten()
        },
    );
    refused(&no_router, "blk.2.ffn_gate_inp.weight");
}

#[test]
fn gpt_oss_without_its_parts_is_a_clear_error() {
    use rgml_gguf::Value;
    let whole = |t: &rgml_gguf::TensorInfo| Some((t.ne[..t.n_dims].to_vec(), t.size));
    let without = |name: &str, tensor: &'static str| {
        edited(
            Arch::GptOss,
            name,
            |_| {},
            move |t| (t.name != tensor).then(|| whole(t)).flatten(),
        )
    };
    refused(
        &without("no-sinks", "blk.1.attn_sinks.weight"),
        "blk.1.attn_sinks.weight",
    );
    refused(
        &without("no-expert-bias", "blk.0.ffn_down_exps.bias"),
        "blk.0.ffn_down_exps.bias",
    );
    let no_window = edited(
        Arch::GptOss,
        "no-window",
        |w| w.add_metadata("gpt-oss.attention.sliding_window", Value::U32(0)),
        whole,
    );
    refused(&no_window, "gpt-oss.attention.sliding_window");
    let bad_scaling = edited(
        Arch::GptOss,
        "bad-scaling",
        |w| w.add_metadata("gpt-oss.rope.scaling.type", Value::String("dynamic".into())),
        whole,
    );
    refused(&bad_scaling, "gpt-oss.rope.scaling.type");
}
