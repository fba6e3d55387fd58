//! Tiny synthetic LLaMA-family models, written as GGUF files with random weights, loaded with
//! [`Model::load`] and evaluated with [`Session`], against an independent float64 forward pass
//! written here from the architecture's definition (embedding lookup, RMSNorm, Q/K/V (+bias),
//! RoPE normal or NeoX as llama.cpp defines them, causal softmax attention with GQA, output
//! projection, residuals, SwiGLU, final norm, output or tied embeddings).
//!
//! These cover the variants the demo model (llama, tied, GQA, no biases) does not: an explicit
//! `output.weight`, Qwen2 biases with NeoX rope, no GQA, rope base and linear scaling from the
//! metadata, F16/BF16/Q8_0 matrices; and the load errors of malformed files.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::quant::{dequantize_row, quantize_row};
use rgml::DType;
use rgml_gguf::{GgufWriter, Value};
use rgml_llm::{EncodeOptions, LlmError, Logits, Model, Session, SessionOptions};
use std::path::PathBuf;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------------
// The synthetic model: hyper-parameters, weights (kept as the f64 values the file stores), GGUF.

#[derive(Clone, Debug)]
struct Spec {
    arch: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
    n_ff: usize,
    /// `output.weight` present (else tied to the token embeddings).
    output: bool,
    /// `blk.N.attn_{q,k,v}.bias` present.
    biases: bool,
    /// Store the matrices as F16/BF16/Q8_0 instead of F32.
    quantized: bool,
    rope_base: f32,
    /// `{arch}.rope.scaling.factor` (linear scaling: positions are divided by it).
    rope_scaling: Option<f32>,
    rms_eps: f32,
    seed: u64,
}

impl Spec {
    fn llama() -> Spec {
        Spec {
            arch: "llama",
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 96,
            output: true,
            biases: false,
            quantized: false,
            rope_base: 10_000.0,
            rope_scaling: None,
            rms_eps: 1e-5,
            seed: 1,
        }
    }

    fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    fn n_embd_kv(&self) -> usize {
        self.head_dim() * self.n_head_kv
    }

    fn neox(&self) -> bool {
        self.arch == "qwen2"
    }
}

/// A weight matrix `[rows][cols]` (GGUF `ne = [cols, rows]`), row-major; a vector has one row.
#[derive(Clone, Debug)]
struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f64>,
}

impl Mat {
    /// `W x`.
    fn mul(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        assert_eq!(self.w.len(), self.rows * self.cols);
        self.w
            .chunks_exact(self.cols)
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn row(&self, r: usize) -> &[f64] {
        &self.w[r * self.cols..(r + 1) * self.cols]
    }
}

#[derive(Clone, Debug)]
struct LayerRef {
    attn_norm: Mat,
    wq: Mat,
    wk: Mat,
    wv: Mat,
    wo: Mat,
    bias: Option<[Mat; 3]>,
    ffn_norm: Mat,
    gate: Mat,
    up: Mat,
    down: Mat,
}

#[derive(Clone, Debug)]
struct RefModel {
    spec: Spec,
    n_vocab: usize,
    tok_embd: Mat,
    output_norm: Mat,
    output: Option<Mat>,
    layers: Vec<LayerRef>,
}

/// A tensor waiting to be written.
struct RawTensor {
    name: String,
    dtype: DType,
    ne: Vec<usize>,
    data: Vec<u8>,
}

/// Random weights, stored in `dtype` and read back, so the reference uses exactly the values
/// in the file.
fn make_tensor(
    rng: &mut StdRng,
    tensors: &mut Vec<RawTensor>,
    name: String,
    dtype: DType,
    rows: usize,
    cols: usize,
    range: (f32, f32),
) -> Mat {
    let src: Vec<f32> = (0..rows * cols)
        .map(|_| rng.gen_range(range.0..range.1))
        .collect();
    let mut data = vec![0u8; dtype.row_bytes(cols).unwrap() * rows];
    quantize_row(dtype, &src, &mut data).unwrap();
    let mut back = vec![0f32; rows * cols];
    dequantize_row(dtype, &data, &mut back).unwrap();
    let ne = if rows == 1 {
        vec![cols]
    } else {
        vec![cols, rows]
    };
    tensors.push(RawTensor {
        name,
        dtype,
        ne,
        data,
    });
    Mat {
        rows,
        cols,
        w: back.into_iter().map(f64::from).collect(),
    }
}

/// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest map to 256+.
fn byte_token(b: u8) -> String {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b).to_string();
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap().to_string()
}

/// A byte-level BPE vocabulary: 256 byte tokens, a few merges, three control tokens.
fn vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8).map(byte_token).collect();
    let merges = [
        "t h", "th e", "Ġ t", "Ġt he", "i n", "e r", "a n", "o n", "r e", "Ġ a", "e n", "a t",
        "o u", "e d", "h e", "l l", "o r", "Ġ w", "i s", "Ġ s", "he ll", "hell o", "Ġw or",
        "Ġwor l", "Ġworl d", "Ġ f", "Ġf o", "Ġfo x",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![1; tokens.len()];
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(special.into());
        types.push(3);
    }
    (
        tokens,
        types,
        merges.iter().map(|s| s.to_string()).collect(),
    )
}

/// Build the reference weights and the file's metadata and tensors.
fn build(spec: &Spec) -> (RefModel, Vec<(String, Value)>, Vec<RawTensor>) {
    let (tokens, types, merges) = vocab();
    let n_vocab = tokens.len();
    let arch = spec.arch;
    let mut meta: Vec<(String, Value)> = Vec::new();
    let mut kv = |k: &str, v: Value| meta.push((k.to_string(), v));
    kv("general.architecture", Value::String(arch.into()));
    kv("general.name", Value::String("synthetic".into()));
    kv(
        &format!("{arch}.block_count"),
        Value::U32(spec.n_layer as u32),
    );
    kv(&format!("{arch}.context_length"), Value::U32(256));
    kv(
        &format!("{arch}.embedding_length"),
        Value::U32(spec.n_embd as u32),
    );
    kv(
        &format!("{arch}.feed_forward_length"),
        Value::U32(spec.n_ff as u32),
    );
    kv(
        &format!("{arch}.attention.head_count"),
        Value::U32(spec.n_head as u32),
    );
    kv(
        &format!("{arch}.attention.head_count_kv"),
        Value::U32(spec.n_head_kv as u32),
    );
    kv(
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        Value::F32(spec.rms_eps),
    );
    kv(
        &format!("{arch}.rope.freq_base"),
        Value::F32(spec.rope_base),
    );
    kv(
        &format!("{arch}.rope.dimension_count"),
        Value::U32(spec.head_dim() as u32),
    );
    if let Some(f) = spec.rope_scaling {
        kv(
            &format!("{arch}.rope.scaling.type"),
            Value::String("linear".into()),
        );
        kv(&format!("{arch}.rope.scaling.factor"), Value::F32(f));
    }
    kv(&format!("{arch}.vocab_size"), Value::U32(n_vocab as u32));
    kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    kv("tokenizer.ggml.pre", Value::String("gpt2".into()));
    kv(
        "tokenizer.ggml.tokens",
        Value::Array(tokens.into_iter().map(Value::String).collect()),
    );
    kv(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    kv(
        "tokenizer.ggml.merges",
        Value::Array(merges.into_iter().map(Value::String).collect()),
    );
    kv(
        "tokenizer.ggml.bos_token_id",
        Value::U32(n_vocab as u32 - 2),
    );
    kv(
        "tokenizer.ggml.eos_token_id",
        Value::U32(n_vocab as u32 - 1),
    );
    kv("tokenizer.ggml.add_bos_token", Value::Bool(false));

    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut t = Vec::new();
    let (e, e_kv, ff) = (spec.n_embd, spec.n_embd_kv(), spec.n_ff);
    // Matrix types: F32 for exactness, or a mix of the half and 8-bit types.
    let q = |f32_or: DType| if spec.quantized { f32_or } else { DType::F32 };
    // Uniform ranges: q/k large enough that attention is sharp (so rope and masking matter),
    // the rest about unit variance per output.
    let s = |fan_in: usize, k: f32| {
        let a = k * (3.0 / fan_in as f32).sqrt();
        (-a, a)
    };
    let norm = (0.6, 1.4);
    let tok_embd = make_tensor(
        &mut rng,
        &mut t,
        "token_embd.weight".into(),
        q(DType::Q8_0),
        n_vocab,
        e,
        (-1.0, 1.0),
    );
    let mut layers = Vec::new();
    for il in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}");
        let attn_norm = make_tensor(
            &mut rng,
            &mut t,
            n("attn_norm.weight"),
            DType::F32,
            1,
            e,
            norm,
        );
        let wq = make_tensor(
            &mut rng,
            &mut t,
            n("attn_q.weight"),
            q(DType::F16),
            e,
            e,
            s(e, 1.5),
        );
        let wk = make_tensor(
            &mut rng,
            &mut t,
            n("attn_k.weight"),
            q(DType::Q8_0),
            e_kv,
            e,
            s(e, 1.5),
        );
        let wv = make_tensor(
            &mut rng,
            &mut t,
            n("attn_v.weight"),
            q(DType::BF16),
            e_kv,
            e,
            s(e, 1.0),
        );
        let bias = spec.biases.then(|| {
            [
                ("attn_q.bias", e),
                ("attn_k.bias", e_kv),
                ("attn_v.bias", e_kv),
            ]
            .map(|(name, len)| {
                make_tensor(&mut rng, &mut t, n(name), DType::F32, 1, len, (-1.0, 1.0))
            })
        });
        let wo = make_tensor(
            &mut rng,
            &mut t,
            n("attn_output.weight"),
            q(DType::Q8_0),
            e,
            e,
            s(e, 0.7),
        );
        let ffn_norm = make_tensor(
            &mut rng,
            &mut t,
            n("ffn_norm.weight"),
            DType::F32,
            1,
            e,
            norm,
        );
        let gate = make_tensor(
            &mut rng,
            &mut t,
            n("ffn_gate.weight"),
            q(DType::F16),
            ff,
            e,
            s(e, 1.0),
        );
        let up = make_tensor(
            &mut rng,
            &mut t,
            n("ffn_up.weight"),
            q(DType::Q8_0),
            ff,
            e,
            s(e, 1.0),
        );
        let down = make_tensor(
            &mut rng,
            &mut t,
            n("ffn_down.weight"),
            q(DType::Q8_0),
            e,
            ff,
            s(ff, 0.7),
        );
        layers.push(LayerRef {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            bias,
            ffn_norm,
            gate,
            up,
            down,
        });
    }
    let output_norm = make_tensor(
        &mut rng,
        &mut t,
        "output_norm.weight".into(),
        DType::F32,
        1,
        e,
        norm,
    );
    let output = spec.output.then(|| {
        make_tensor(
            &mut rng,
            &mut t,
            "output.weight".into(),
            q(DType::F16),
            n_vocab,
            e,
            s(e, 1.0),
        )
    });
    let model = RefModel {
        spec: spec.clone(),
        n_vocab,
        tok_embd,
        output_norm,
        output,
        layers,
    };
    (model, meta, t)
}

/// A GGUF file in the temp directory, deleted on drop.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn write(name: &str, meta: &[(String, Value)], tensors: &[RawTensor]) -> TempFile {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k.clone(), v.clone());
    }
    for t in tensors {
        w.add_tensor(&t.name, t.dtype, &t.ne, &t.data).unwrap();
    }
    let path =
        std::env::temp_dir().join(format!("rgml-synthetic-{}-{name}.gguf", std::process::id()));
    w.write_file(&path).unwrap();
    TempFile(path)
}

fn load(file: &TempFile) -> rgml_llm::Result<Model> {
    rgml_cpu::register();
    Model::load(&file.0, Default::default())
}

// ---------------------------------------------------------------------------------------------
// The float64 reference forward pass.

fn rms_norm(x: &[f64], w: &Mat, eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (ms + eps).sqrt();
    x.iter().zip(&w.w).map(|(v, g)| v * scale * g).collect()
}

fn add_bias(mut x: Vec<f64>, b: Option<&Mat>) -> Vec<f64> {
    if let Some(b) = b {
        for (v, b) in x.iter_mut().zip(&b.w) {
            *v += b;
        }
    }
    x
}

/// RoPE on one head in place, as llama.cpp defines it: θ_i = pos · scale · base^(-2i/n_rot);
/// normal mode rotates (x[2i], x[2i+1]), NeoX rotates (x[i], x[i + n_rot/2]).
fn rope(x: &mut [f64], pos: usize, n_rot: usize, base: f64, scale: f64, neox: bool) {
    for i in 0..n_rot / 2 {
        let theta = pos as f64 * scale * base.powf(-2.0 * i as f64 / n_rot as f64);
        let (sin, cos) = theta.sin_cos();
        let (a, b) = if neox {
            (i, i + n_rot / 2)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * cos - x1 * sin;
        x[b] = x0 * sin + x1 * cos;
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Logits `[n_tokens][n_vocab]` for a sequence starting at position 0.
fn reference(m: &RefModel, tokens: &[u32]) -> Vec<Vec<f64>> {
    let s = &m.spec;
    let (hd, n_rot) = (s.head_dim(), s.head_dim());
    let group = s.n_head / s.n_head_kv;
    let eps = f64::from(s.rms_eps);
    let base = f64::from(s.rope_base);
    let scale = s.rope_scaling.map_or(1.0, |f| 1.0 / f64::from(f));
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| m.tok_embd.row(t as usize).to_vec())
        .collect();
    for l in &m.layers {
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, xt) in x.iter().enumerate() {
            let h = rms_norm(xt, &l.attn_norm, eps);
            let b = l.bias.as_ref();
            let mut q = add_bias(l.wq.mul(&h), b.map(|b| &b[0]));
            let mut k = add_bias(l.wk.mul(&h), b.map(|b| &b[1]));
            let v = add_bias(l.wv.mul(&h), b.map(|b| &b[2]));
            for head in q.chunks_exact_mut(hd) {
                rope(head, pos, n_rot, base, scale, s.neox());
            }
            for head in k.chunks_exact_mut(hd) {
                rope(head, pos, n_rot, base, scale, s.neox());
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for (t, xt) in x.iter_mut().enumerate() {
            let mut attn = vec![0.0; s.n_embd];
            for h in 0..s.n_head {
                let kvh = h / group;
                let q = &qs[t][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=t)
                    .map(|j| {
                        let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|sc| (sc - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for (j, p) in exps.iter().enumerate() {
                    let v = &vs[j][kvh * hd..(kvh + 1) * hd];
                    for (o, vv) in attn[h * hd..(h + 1) * hd].iter_mut().zip(v) {
                        *o += p / sum * vv;
                    }
                }
            }
            let out = l.wo.mul(&attn);
            for (a, o) in xt.iter_mut().zip(out) {
                *a += o;
            }
            let h = rms_norm(xt, &l.ffn_norm, eps);
            let act: Vec<f64> = l
                .gate
                .mul(&h)
                .into_iter()
                .zip(l.up.mul(&h))
                .map(|(g, u)| silu(g) * u)
                .collect();
            for (a, d) in xt.iter_mut().zip(l.down.mul(&act)) {
                *a += d;
            }
        }
    }
    let out = m.output.as_ref().unwrap_or(&m.tok_embd);
    x.iter()
        .map(|xt| out.mul(&rms_norm(xt, &m.output_norm, eps)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Comparison.

/// max |got - want| / max |want| over all positions' logits.
fn rel_err(got: &[f32], want: &[Vec<f64>]) -> f64 {
    let n_vocab = want[0].len();
    assert_eq!(got.len(), want.len() * n_vocab, "logit count");
    assert!(got.iter().all(|v| v.is_finite()), "non-finite logits");
    let scale = want.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    let diff = got
        .chunks_exact(n_vocab)
        .zip(want)
        .flat_map(|(g, w)| g.iter().zip(w).map(|(a, b)| (f64::from(*a) - b).abs()))
        .fold(0f64, f64::max);
    diff / scale
}

fn options(n_ubatch: usize) -> SessionOptions {
    SessionOptions {
        n_ctx: 64,
        n_ubatch,
        n_threads: None,
        device_params: Vec::new(),
        ..Default::default()
    }
}

/// A prompt through the model's own tokenizer, plus ids from all over the vocabulary.
fn prompt(model: &Model) -> Vec<u32> {
    let mut tokens = model
        .tokenizer
        .encode("hello world, the fox", EncodeOptions::default());
    let n_vocab = model.config.n_vocab as u32;
    assert!(
        tokens.iter().any(|&t| t >= 256),
        "the merges are used: {tokens:?}"
    );
    tokens.extend([0, n_vocab - 1, 200, 7, n_vocab - 4, 42]);
    tokens
}

/// Loads `spec`'s model, evaluates a prompt in one batch, checks its logits against the
/// reference within `tol` (relative to the largest logit), and returns the error.
fn check(name: &str, spec: &Spec, tol: f64) -> f64 {
    let (reference_model, meta, tensors) = build(spec);
    let file = write(name, &meta, &tensors);
    let model = Arc::new(load(&file).unwrap());
    assert_eq!(model.config.arch, spec.arch);
    assert_eq!(model.config.n_vocab, reference_model.n_vocab);
    assert_eq!(model.config.n_head_kv, spec.n_head_kv);
    let tokens = prompt(&model);
    let want = reference(&reference_model, &tokens);
    let mut session = Session::new(model.clone(), &options(512)).unwrap();
    let got = session.eval(&tokens, Logits::All).unwrap();
    let err = rel_err(&got, &want);
    eprintln!("{name}: max relative logit error {err:.2e}");
    assert!(
        err < tol,
        "{name}: logits differ from the reference by {err:.3e} (bound {tol:.0e})"
    );
    err
}

/// F32 weights: the only roundings are f16 in the KV cache and in the attention products.
const TOL_F32: f64 = 2e-3;
/// F16/BF16/Q8_0 matrices (the reference uses the stored values; activations are rounded to
/// the matrix type's vec-dot type, BF16 and Q8_0 being the coarsest).
const TOL_QUANT: f64 = 3e-2;

// ---------------------------------------------------------------------------------------------
// Cases.

#[test]
fn llama_with_output_weight() {
    check("llama-output", &Spec::llama(), TOL_F32);
}

#[test]
fn llama_tied_embeddings() {
    let spec = Spec {
        output: false,
        seed: 2,
        ..Spec::llama()
    };
    check("llama-tied", &spec, TOL_F32);
}

#[test]
fn qwen2_biases_and_neox_rope() {
    let spec = Spec {
        arch: "qwen2",
        biases: true,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        seed: 3,
        ..Spec::llama()
    };
    check("qwen2", &spec, TOL_F32);
}

#[test]
fn no_gqa_with_rope_scaling() {
    let spec = Spec {
        arch: "mistral",
        n_head_kv: 4,
        output: false,
        rope_base: 500_000.0,
        rope_scaling: Some(2.0),
        seed: 4,
        ..Spec::llama()
    };
    check("no-gqa", &spec, TOL_F32);
}

#[test]
fn quantized_matrices() {
    for (name, spec) in [
        (
            "quant-llama",
            Spec {
                quantized: true,
                seed: 5,
                ..Spec::llama()
            },
        ),
        (
            "quant-qwen2",
            Spec {
                arch: "qwen2",
                quantized: true,
                biases: true,
                output: false,
                seed: 6,
                ..Spec::llama()
            },
        ),
    ] {
        check(name, &spec, TOL_QUANT);
    }
}

#[test]
fn micro_batches_and_single_steps_match_the_reference() {
    for (name, spec) in [
        ("steps-llama", Spec::llama()),
        (
            "steps-qwen2",
            Spec {
                arch: "qwen2",
                biases: true,
                seed: 7,
                ..Spec::llama()
            },
        ),
    ] {
        let (reference_model, meta, tensors) = build(&spec);
        let file = write(name, &meta, &tensors);
        let model = Arc::new(load(&file).unwrap());
        let tokens = prompt(&model);
        let want = reference(&reference_model, &tokens);
        let n_vocab = model.config.n_vocab;

        // Micro-batches of 3 (the last one shorter), every position's logits.
        let mut batched = Session::new(model.clone(), &options(3)).unwrap();
        let got = batched.eval(&tokens, Logits::All).unwrap();
        let err = rel_err(&got, &want);
        assert!(err < TOL_F32, "{name}: n_ubatch 3 off by {err:.3e}");

        // Micro-batches, last position only.
        let mut last = Session::new(model.clone(), &options(3)).unwrap();
        let got = last.eval(&tokens, Logits::Last).unwrap();
        let err = rel_err(&got, &want[tokens.len() - 1..]);
        assert!(
            err < TOL_F32,
            "{name}: n_ubatch 3, last logits off by {err:.3e}"
        );

        // One token at a time, through the KV cache.
        let mut stepped = Session::new(model.clone(), &options(512)).unwrap();
        let mut got = Vec::with_capacity(tokens.len() * n_vocab);
        for &t in &tokens {
            got.extend(stepped.eval(&[t], Logits::Last).unwrap());
        }
        assert_eq!(stepped.n_past(), tokens.len());
        let err = rel_err(&got, &want);
        assert!(err < TOL_F32, "{name}: token by token off by {err:.3e}");

        // Two uneven calls that continue the same sequence.
        let mut split = Session::new(model.clone(), &options(4)).unwrap();
        let mut got = split.eval(&tokens[..5], Logits::All).unwrap();
        got.extend(split.eval(&tokens[5..], Logits::All).unwrap());
        let err = rel_err(&got, &want);
        assert!(err < TOL_F32, "{name}: split prompt off by {err:.3e}");

        // After a reset the cache is overwritten from position 0.
        split.reset();
        let got = split.eval(&tokens, Logits::All).unwrap();
        let err = rel_err(&got, &want);
        assert!(err < TOL_F32, "{name}: after reset off by {err:.3e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Malformed files: clear errors, no panics.

fn load_modified(
    name: &str,
    spec: &Spec,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<RawTensor>),
) -> rgml_llm::Result<Model> {
    let (_, mut meta, mut tensors) = build(spec);
    edit(&mut meta, &mut tensors);
    let file = write(name, &meta, &tensors);
    load(&file)
}

#[test]
fn missing_tensor_is_an_error() {
    for missing in [
        "blk.1.ffn_up.weight",
        "blk.0.attn_k.weight",
        "token_embd.weight",
        "output_norm.weight",
    ] {
        let err = load_modified("missing", &Spec::llama(), |_, t| {
            t.retain(|t| t.name != missing)
        })
        .unwrap_err();
        match &err {
            LlmError::MissingTensor(name) => assert_eq!(name, missing),
            other => panic!("missing {missing}: expected MissingTensor, got {other:?}"),
        }
        assert!(err.to_string().contains(missing), "{err}");
    }
}

#[test]
fn wrong_shaped_tensor_is_an_error() {
    let spec = Spec::llama();
    // (tensor, new shape): a K projection as wide as Q (no GQA), a transposed FFN matrix, a
    // norm of the wrong width, an output matrix one token short, a bias of the wrong width.
    let cases: [(&str, Vec<usize>); 5] = [
        ("blk.0.attn_k.weight", vec![64, 64]),
        ("blk.1.ffn_down.weight", vec![64, 96]),
        ("blk.1.attn_norm.weight", vec![32]),
        ("output.weight", vec![64, 10]),
        ("blk.0.attn_v.bias", vec![64]),
    ];
    for (name, ne) in cases {
        let err = load_modified("shape", &spec, |_, t| {
            t.retain(|t| t.name != name);
            let n: usize = ne.iter().product();
            t.push(RawTensor {
                name: name.into(),
                dtype: DType::F32,
                ne: ne.clone(),
                data: vec![0; n * 4],
            });
        })
        .unwrap_err();
        assert!(
            matches!(err, LlmError::BadTensor(_)),
            "{name} {ne:?}: expected BadTensor, got {err:?}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
    // Integer weights are refused when loading, not when the graph first runs.
    for name in ["blk.0.attn_q.weight", "token_embd.weight"] {
        let err = load_modified("int-weight", &spec, |_, t| {
            let w = t.iter_mut().find(|t| t.name == name).unwrap();
            w.dtype = DType::I32;
            w.data = vec![0; w.ne.iter().product::<usize>() * 4];
        })
        .unwrap_err();
        assert!(
            matches!(err, LlmError::BadTensor(_)) && err.to_string().contains(name),
            "{name} as i32: expected BadTensor, got {err:?}"
        );
    }
    // A norm weight must be f32.
    let err = load_modified("norm-dtype", &spec, |_, t| {
        let norm = t
            .iter_mut()
            .find(|t| t.name == "output_norm.weight")
            .unwrap();
        norm.dtype = DType::F16;
        norm.data.truncate(norm.data.len() / 2);
    })
    .unwrap_err();
    assert!(matches!(err, LlmError::BadTensor(_)), "{err:?}");
}

#[test]
fn unsupported_architecture_is_an_error() {
    let err = load_modified("arch", &Spec::llama(), |meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("gptj".into());
            }
        }
    })
    .unwrap_err();
    assert!(
        matches!(err, LlmError::UnsupportedModel(_)),
        "expected UnsupportedModel, got {err:?}"
    );
    assert!(err.to_string().contains("gptj"), "{err}");
}

#[test]
fn bad_hyper_parameters_are_errors() {
    // Heads that do not divide the width, and a missing required key.
    let err = load_modified("heads", &Spec::llama(), |meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "llama.attention.head_count_kv" {
                *v = Value::U32(3);
            }
        }
    })
    .unwrap_err();
    assert!(matches!(err, LlmError::BadConfig(_)), "{err:?}");
    let err = load_modified("no-key", &Spec::llama(), |meta, _| {
        meta.retain(|(k, _)| k != "llama.embedding_length")
    })
    .unwrap_err();
    assert!(err.to_string().contains("embedding_length"), "{err}");
}
