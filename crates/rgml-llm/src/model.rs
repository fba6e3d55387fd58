//! Model loading: GGUF tensors into backend buffers, named and shape-checked.
//!
//! This module owns the weights (a [`Context`] whose tensors have storage) and their layout per
//! layer. CPU weights are used in place: the memory-mapped file is wrapped as a read-only
//! buffer (zero-copy). Devices that cannot wrap host memory get a copy. Graph building and
//! inference state live in [`crate::session`].

use crate::config::ModelConfig;
use crate::error::{LlmError, Result};
use crate::tokenizer::Tokenizer;
use rgml::backend::{Buffer, BufferUsage};
use rgml::{Context, DType, DeviceRef, TensorId};
use rgml_gguf::{GgufFile, TensorInfo};
use std::path::Path;
use std::sync::Arc;

/// The weights of one transformer block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMS norm before attention.
    pub attn_norm: TensorId,
    /// Query projection `[n_embd, n_embd]`.
    pub wq: TensorId,
    /// Key projection `[n_embd, n_embd_kv]`.
    pub wk: TensorId,
    /// Value projection `[n_embd, n_embd_kv]`.
    pub wv: TensorId,
    /// Attention output projection.
    pub wo: TensorId,
    /// Query bias (Qwen2).
    pub bq: Option<TensorId>,
    /// Key bias (Qwen2).
    pub bk: Option<TensorId>,
    /// Value bias (Qwen2).
    pub bv: Option<TensorId>,
    /// RMS norm before the feed-forward block.
    pub ffn_norm: TensorId,
    /// Gate projection `[n_embd, n_ff]`.
    pub ffn_gate: TensorId,
    /// Up projection `[n_embd, n_ff]`.
    pub ffn_up: TensorId,
    /// Down projection `[n_ff, n_embd]`.
    pub ffn_down: TensorId,
}

/// Called while loading with (tensors done, tensors in total).
pub type ProgressFn<'a> = &'a mut dyn FnMut(usize, usize);

/// How to load a model.
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// Device that holds the weights (default: the registry's "CPU").
    pub device: Option<DeviceRef>,
    /// Progress callback.
    pub progress: Option<ProgressFn<'a>>,
}

/// A loaded LLaMA-family model: configuration, tokenizer and weights.
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// The tokenizer from the file's metadata.
    pub tokenizer: Tokenizer,
    /// Weight tensors (with storage).
    pub(crate) ctx: Context,
    /// Token embeddings `[n_embd, n_vocab]`.
    pub tok_embd: TensorId,
    /// Final RMS norm.
    pub output_norm: TensorId,
    /// Output projection (the token embeddings when the file ties them).
    pub output: TensorId,
    /// Per-block weights.
    pub layers: Vec<LayerWeights>,
    device: DeviceRef,
    _buffers: Vec<Arc<Buffer>>,
    file_type: String,
    chat_template: Option<String>,
    n_params: usize,
    size_bytes: usize,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("device", &self.device.name())
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Load a GGUF file.
    pub fn load(path: impl AsRef<Path>, options: LoadOptions<'_>) -> Result<Model> {
        let path = path.as_ref();
        let gguf = GgufFile::open(path).map_err(|e| LlmError::Load {
            path: path.display().to_string(),
            source: Box::new(e.into()),
        })?;
        Self::from_gguf(&gguf, options)
    }

    /// Build a model from an opened GGUF file.
    pub fn from_gguf(gguf: &GgufFile, mut options: LoadOptions<'_>) -> Result<Model> {
        let config = ModelConfig::from_gguf(gguf)?;
        let tokenizer = Tokenizer::from_gguf(gguf)?;
        let device = match options.device.take() {
            Some(d) => d,
            None => rgml::registry::device("CPU")?,
        };

        let mut ctx = Context::new();
        let mut ids = std::collections::HashMap::new();
        let total = gguf.tensors().len();
        for info in gguf.tensors() {
            let id = ctx.new_tensor(info.dtype, &info.ne[..info.n_dims.max(1)])?;
            ctx.set_name(id, info.name.clone())?;
            ids.insert(info.name.as_str(), (id, info));
        }

        let buffers = place_weights(gguf, &mut ctx, &ids, &device, &mut options.progress, total)?;

        let get = |name: &str| -> Result<TensorId> {
            ids.get(name)
                .map(|&(id, _)| id)
                .ok_or_else(|| LlmError::MissingTensor(name.to_string()))
        };
        let opt = |name: &str| ids.get(name).map(|&(id, _)| id);
        let tok_embd = get("token_embd.weight")?;
        let output_norm = get("output_norm.weight")?;
        // Tied embeddings: files without `output.weight` reuse the token embeddings.
        let output = opt("output.weight").unwrap_or(tok_embd);
        let mut layers = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            layers.push(LayerWeights {
                attn_norm: get(&n("attn_norm.weight"))?,
                wq: get(&n("attn_q.weight"))?,
                wk: get(&n("attn_k.weight"))?,
                wv: get(&n("attn_v.weight"))?,
                wo: get(&n("attn_output.weight"))?,
                bq: opt(&n("attn_q.bias")),
                bk: opt(&n("attn_k.bias")),
                bv: opt(&n("attn_v.bias")),
                ffn_norm: get(&n("ffn_norm.weight"))?,
                ffn_gate: get(&n("ffn_gate.weight"))?,
                ffn_up: get(&n("ffn_up.weight"))?,
                ffn_down: get(&n("ffn_down.weight"))?,
            });
        }
        let n_params = gguf
            .tensors()
            .iter()
            .map(|t| t.ne.iter().product::<usize>())
            .sum();
        let size_bytes = gguf.tensors().iter().map(|t| t.size).sum();
        let file_type = dominant_type(gguf.tensors());
        let chat_template = gguf
            .get_str("tokenizer.chat_template")
            .ok()
            .map(str::to_string);
        let model = Model {
            config,
            tokenizer,
            ctx,
            tok_embd,
            output_norm,
            output,
            layers,
            device,
            _buffers: buffers,
            file_type,
            chat_template,
            n_params,
            size_bytes,
        };
        model.check_shapes()?;
        Ok(model)
    }

    /// The device holding the weights.
    pub fn device(&self) -> &DeviceRef {
        &self.device
    }

    /// The chat template text from the file (`tokenizer.chat_template`), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Number of parameters.
    pub fn n_params(&self) -> usize {
        self.n_params
    }

    /// Bytes of weights.
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// The most common weight dtype (e.g. `"q4_1"`), as llama-bench names a model's type.
    pub fn file_type(&self) -> &str {
        &self.file_type
    }

    fn check_shapes(&self) -> Result<()> {
        let c = &self.config;
        let expect = |id: TensorId, ne: [usize; 4]| -> Result<()> {
            let t = &self.ctx[id];
            if t.ne != ne {
                return Err(LlmError::BadTensor(format!(
                    "'{}' has shape {:?}, the config needs {:?}",
                    t.name, t.ne, ne
                )));
            }
            if !t.dtype.is_float() {
                return Err(LlmError::BadTensor(format!(
                    "'{}' has dtype {}, a weight must hold floats",
                    t.name, t.dtype
                )));
            }
            Ok(())
        };
        expect(self.tok_embd, [c.n_embd, c.n_vocab, 1, 1])?;
        expect(self.output, [c.n_embd, c.n_vocab, 1, 1])?;
        expect(self.output_norm, [c.n_embd, 1, 1, 1])?;
        for l in &self.layers {
            expect(l.attn_norm, [c.n_embd, 1, 1, 1])?;
            expect(l.wq, [c.n_embd, c.n_embd, 1, 1])?;
            expect(l.wk, [c.n_embd, c.n_embd_kv(), 1, 1])?;
            expect(l.wv, [c.n_embd, c.n_embd_kv(), 1, 1])?;
            expect(l.wo, [c.n_embd, c.n_embd, 1, 1])?;
            for (b, n) in [
                (l.bq, c.n_embd),
                (l.bk, c.n_embd_kv()),
                (l.bv, c.n_embd_kv()),
            ] {
                if let Some(b) = b {
                    expect(b, [n, 1, 1, 1])?;
                }
            }
            expect(l.ffn_norm, [c.n_embd, 1, 1, 1])?;
            expect(l.ffn_gate, [c.n_embd, c.n_ff, 1, 1])?;
            expect(l.ffn_up, [c.n_embd, c.n_ff, 1, 1])?;
            expect(l.ffn_down, [c.n_ff, c.n_embd, 1, 1])?;
        }
        for t in [self.output_norm]
            .iter()
            .chain(self.layers.iter().flat_map(|l| [&l.attn_norm, &l.ffn_norm]))
        {
            if self.ctx[*t].dtype != DType::F32 {
                return Err(LlmError::BadTensor(format!(
                    "norm weight '{}' must be f32",
                    self.ctx[*t].name
                )));
            }
        }
        Ok(())
    }
}

/// Give every weight storage on `device`: in place in the file mapping when the device can
/// wrap host memory, else copied into a device buffer.
fn place_weights(
    gguf: &GgufFile,
    ctx: &mut Context,
    ids: &std::collections::HashMap<&str, (TensorId, &TensorInfo)>,
    device: &DeviceRef,
    progress: &mut Option<ProgressFn<'_>>,
    total: usize,
) -> Result<Vec<Arc<Buffer>>> {
    let mut report = |done: usize| {
        if let Some(p) = progress.as_mut() {
            p(done, total)
        }
    };
    if device.caps().buffer_from_host_ptr {
        let max_tensor = gguf.tensors().iter().map(|t| t.size).max().unwrap_or(0);
        let buffer = device.buffer_from_host_memory(gguf.memory(), max_tensor)?;
        buffer.set_usage(BufferUsage::Weights);
        for (done, info) in gguf.tensors().iter().enumerate() {
            let (id, _) = ids[info.name.as_str()];
            ctx.set_data(id, buffer.clone(), gguf.data_offset() + info.offset)?;
            report(done + 1);
        }
        return Ok(vec![buffer]);
    }
    let buft = device.buffer_type();
    let buffer = rgml::alloc::alloc_ctx_tensors(ctx, &buft)?
        .ok_or_else(|| LlmError::BadTensor("the file has no tensors".into()))?;
    buffer.set_usage(BufferUsage::Weights);
    for (done, info) in gguf.tensors().iter().enumerate() {
        let (id, _) = ids[info.name.as_str()];
        ctx.tensor_set(id, 0, gguf.tensor_data(info))?;
        report(done + 1);
    }
    Ok(vec![buffer])
}

fn dominant_type(tensors: &[TensorInfo]) -> String {
    let mut bytes: std::collections::BTreeMap<DType, usize> = Default::default();
    for t in tensors.iter().filter(|t| t.n_dims >= 2) {
        *bytes.entry(t.dtype).or_default() += t.size;
    }
    bytes
        .into_iter()
        .max_by_key(|&(_, b)| b)
        .map(|(t, _)| t.name().to_string())
        .unwrap_or_else(|| "f32".into())
}
