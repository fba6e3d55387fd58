//! Model loading: GGUF tensors into backend buffers, named and shape-checked.
//!
//! This module owns the weights (a [`Context`] whose tensors have storage), their layout per
//! layer, and where each part of the model goes ([`Placement`] resolved into a `LayerMap`).
//! CPU weights are used in place: the memory-mapped file is wrapped as a read-only buffer
//! (zero-copy). Devices that cannot wrap host memory (or whose backends cannot use such a wrap)
//! get a copy, in as many buffers as the device's largest allocation asks. Graph building and
//! inference state live in [`crate::session`].
//!
//! # Layer split
//! With several devices ([`Placement::Layers`]) the blocks are assigned as llama.cpp's
//! `--split-mode layer` does: contiguous ranges in device order, in proportion to the
//! placement's shares (default even). The token embeddings stay in host memory (the
//! registry's "CPU" device), as llama.cpp keeps input embeddings on the CPU; the output norm
//! and output projection go to the last device (a file with tied embeddings gets a second
//! tensor over the same data there, as llama.cpp duplicates it).
//!
//! # Offload
//! [`Placement::Offload`] is llama.cpp's `-ngl N` with one GPU: exact counts, not shares.
//! llama.cpp (since its PR 18148, in the vendored llama-cpp-python 0.3.36) counts the output
//! head as layer `n_layer` and offloads from the top, the head first: `N` layers are the
//! output head and the last `N - 1` blocks, `N > n_layer` is everything, `0` nothing. The
//! token embeddings stay on the CPU device, as llama.cpp's input layer does.

use crate::config::ModelConfig;
use crate::error::{LlmError, MemoryUse, Result};
use crate::tensor_split::{TensorSplitPlan, TensorSync};
use crate::tokenizer::Tokenizer;
use rgml::alloc::TensorAllocator;
use rgml::backend::{Buffer, BufferUsage};
use rgml::meta::MetaDevice;
use rgml::{Context, DType, DeviceRef, OpKind, TensorId};
use rgml_gguf::{GgufFile, TensorInfo};
use std::path::Path;
use std::sync::Arc;

pub use crate::arch::{EncoderInput, LayerWeights, PerLayerEmbeddings};

/// Called while loading with (tensors done, tensors in total).
pub type ProgressFn<'a> = &'a mut dyn FnMut(usize, usize);

/// Where a model's weights go: a value, not device names, so any device (a remote one whose
/// name holds `:` or `,` included) can be given.
#[derive(Clone)]
pub enum Placement {
    /// Every weight on one device.
    Single(DeviceRef),
    /// Whole blocks over the devices, in order (layer split; pipeline parallelism), each
    /// device's share of the blocks in proportion to `shares` (any unit, `[3, 1]`: three
    /// quarters on the first; empty: even).
    Layers {
        /// The devices, in order.
        devices: Vec<DeviceRef>,
        /// Share of the blocks per device.
        shares: Vec<f32>,
    },
    /// llama.cpp's `-ngl`: the last `n_gpu_layers` layers on `gpu`, the rest and the token
    /// embeddings on `cpu`, where the output head (output norm and projection) counts as the
    /// top layer and goes first (see the module docs): `1` is the head alone, `n_layer + 1` or
    /// more is every block and the head, `0` is everything on `cpu`. `gpu` may be any device
    /// (the caller chooses which GPU); it must not be `cpu`.
    Offload {
        /// Where the offloaded layers go.
        gpu: DeviceRef,
        /// Where the other blocks and the token embeddings go (a CPU device).
        cpu: DeviceRef,
        /// Layers offloaded, the output head counted as one (llama.cpp's `n_gpu_layers`).
        n_gpu_layers: usize,
    },
    /// Every block's weights split across the devices (tensor parallelism, a meta device; see
    /// `crate::tensor_split`), each device's share of every split weight in proportion to
    /// `shares` (empty: even), joined as `sync` says.
    Tensor {
        /// The devices (at least two).
        devices: Vec<DeviceRef>,
        /// Share of every split weight per device.
        shares: Vec<f32>,
        /// How the devices' work is joined (see [`TensorSync`]).
        sync: TensorSync,
    },
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |d: &[DeviceRef]| d.iter().map(|d| d.name().to_string()).collect::<Vec<_>>();
        match self {
            Placement::Single(d) => f.debug_tuple("Single").field(&d.name()).finish(),
            Placement::Layers { devices, shares } => f
                .debug_struct("Layers")
                .field("devices", &names(devices))
                .field("shares", shares)
                .finish(),
            Placement::Offload {
                gpu,
                cpu,
                n_gpu_layers,
            } => f
                .debug_struct("Offload")
                .field("gpu", &gpu.name())
                .field("cpu", &cpu.name())
                .field("n_gpu_layers", n_gpu_layers)
                .finish(),
            Placement::Tensor {
                devices,
                shares,
                sync,
            } => f
                .debug_struct("Tensor")
                .field("devices", &names(devices))
                .field("shares", shares)
                .field("sync", sync)
                .finish(),
        }
    }
}

/// How to load a model.
#[derive(Default)]
pub struct LoadOptions<'a> {
    /// Where the weights go (default: all on the registry's "CPU" device).
    pub placement: Option<Placement>,
    /// Weights that go elsewhere than the placement puts them (llama.cpp's
    /// `--override-tensor`; the first match wins). Not with [`Placement::Tensor`].
    pub overrides: Vec<TensorOverride>,
    /// Progress callback.
    pub progress: Option<ProgressFn<'a>>,
}

/// llama.cpp's `--override-tensor PATTERN=DEVICE`: the weights whose name `pattern` matches
/// (anywhere in the name, as llama.cpp's `std::regex_search`) go to `device`, whatever the
/// placement says of their block; the ops that read them follow them there (the scheduler
/// runs an op where its weights are). `--cpu-moe` is `\.ffn_(up|down|gate)_exps` on the CPU:
/// the experts, most of a mixture-of-experts model's bytes, in host memory, the rest on the
/// GPU.
#[derive(Clone)]
pub struct TensorOverride {
    /// Matched against each tensor's name.
    pub pattern: regex::Regex,
    /// Where the matching tensors go.
    pub device: DeviceRef,
}

impl std::fmt::Debug for TensorOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.pattern.as_str(), self.device.name())
    }
}

/// A loaded LLaMA-family model: configuration, tokenizer and weights.
///
/// `Send + Sync` and never changed after loading: share it with `Arc<Model>` between the
/// [`Session`](crate::Session)s and threads that use it.
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// The tokenizer from the file's metadata.
    pub tokenizer: Tokenizer,
    /// Weight tensors (with storage).
    pub(crate) ctx: Context,
    /// Token embeddings `[n_embd, n_vocab]`.
    pub tok_embd: TensorId,
    /// Final RMS norm (`None`: an encoder, whose last block is its output).
    pub output_norm: Option<TensorId>,
    /// Output projection (the token embeddings when the file ties them; `None`: an encoder,
    /// which computes embeddings only).
    pub output: Option<TensorId>,
    /// RoPE frequency divisors per rotated pair (`rope_freqs.weight`, Llama 3.1's scaling).
    pub rope_freqs: Option<TensorId>,
    /// LongRoPE's divisors (`rope_factors_long.weight`, `rope_factors_short.weight`: Phi-3
    /// 128k), chosen by the context length (see [`Model::rope_factors`]).
    pub rope_long_short: Option<(TensorId, TensorId)>,
    /// Bias of the output projection `[n_vocab]` (`output.bias`: Qwen2).
    pub output_bias: Option<TensorId>,
    /// Per-layer token embeddings (Gemma 4).
    pub per_layer_embd: Option<PerLayerEmbeddings>,
    /// An encoder's position and token-type embeddings and input norm (BERT).
    pub encoder: Option<EncoderInput>,
    /// Per-block weights.
    pub layers: Vec<LayerWeights>,
    /// The devices holding the weights (one unless split).
    devices: Vec<DeviceRef>,
    /// The index in `devices` of each block.
    layer_devices: Vec<usize>,
    /// The index in `devices` of the output norm and projection.
    output_device: usize,
    buffers: Vec<Arc<Buffer>>,
    file_type: String,
    chat_template: Option<String>,
    n_params: usize,
    size_bytes: usize,
    /// The mapped file the weights come from, to notice it changing under us.
    file: Option<Arc<rgml_gguf::FileStamp>>,
    /// The tensors a [`TensorOverride`] placed: name, device index, bytes.
    overridden: Vec<(String, usize, usize)>,
    /// See [`Model::kept_on_host`].
    kept_on_host: Vec<(String, usize, usize)>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field(
                "devices",
                &self.devices.iter().map(|d| d.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Load a GGUF file.
    pub fn load(path: impl AsRef<Path>, options: LoadOptions<'_>) -> Result<Model> {
        let path = path.as_ref();
        let gguf = GgufFile::open(path).map_err(|e| match e {
            // Opening or mapping failed: the error names the file already.
            e @ (rgml_gguf::GgufError::Io { .. } | rgml_gguf::GgufError::NotAFile { .. }) => {
                LlmError::from(e)
            }
            e => LlmError::Load {
                path: path.display().to_string(),
                source: Box::new(e.into()),
            },
        })?;
        Self::from_gguf(&gguf, options)
    }

    /// Build a model from an opened GGUF file.
    ///
    /// Everything that can be checked without touching tensor data is checked first: the
    /// hyper-parameters, the tokenizer, every weight's presence, shape and dtype against them,
    /// and no blocks beyond the block count; only then are weights placed (mapped or copied,
    /// each copy checked against its device's free memory before it is allocated).
    pub fn from_gguf(gguf: &GgufFile, mut options: LoadOptions<'_>) -> Result<Model> {
        let config = ModelConfig::from_gguf(gguf)?;
        let tokenizer = Tokenizer::from_gguf(gguf)?;
        let tensor_split = matches!(options.placement, Some(Placement::Tensor { .. }));
        if tensor_split && !options.overrides.is_empty() {
            return Err(LlmError::BadConfig(
                "tensor overrides (--override-tensor, --cpu-moe) do not combine with a tensor \
                 split"
                    .into(),
            ));
        }
        let (mut devices, mut map) = resolve_placement(gguf, &config, options.placement.take())?;
        map.overrides = override_devices(&mut devices, &options.overrides);

        let (mut ctx, ids) = weights_context(gguf)?;
        check_blocks(gguf, config.n_layer + config.n_layer_nextn)?;
        let weights = NamedWeights::resolve(&ids, &config)?;
        weights.check_shapes(&ctx, &config)?;

        let has_head = !config.kind.is_encoder();
        let (mut placed, tied_output, overridden) =
            assign_tensors(gguf, &mut ctx, &ids, &map, has_head)?;
        let cpu = rgml::registry::device("CPU").ok();
        let mut host = match map.inputs {
            Some(_) => None,
            None => Some(cpu.clone().unwrap_or_else(|| devices[0].clone())),
        };
        let mut kept_on_host = Vec::new();
        if let Some(cpu) = cpu {
            let experts_used = config.moe.as_ref().map_or(1, |m| m.n_expert_used);
            let probe = (&cpu, experts_used);
            kept_on_host =
                keep_unreadable_weights_on_host(&ctx, &mut placed, &devices, &overridden, probe)?;
            if !kept_on_host.is_empty() {
                // A model on one device has no host part otherwise.
                host.get_or_insert(cpu);
            }
        }
        let buffers = place_weights(
            gguf,
            &mut ctx,
            &placed,
            &devices,
            host.as_ref(),
            &mut options.progress,
        )?;

        let NamedWeights {
            tok_embd,
            output_norm,
            output,
            rope_freqs,
            rope_long_short,
            output_bias,
            per_layer_embd,
            encoder,
            layers,
            unread: _,
        } = weights;
        Ok(Model {
            config,
            tokenizer,
            ctx,
            tok_embd,
            output_norm,
            // Tied embeddings: files without `output.weight` reuse the token embeddings (or
            // the copy of them made on the output's device when that is not theirs).
            output: has_head.then(|| output.or(tied_output).unwrap_or(tok_embd)),
            rope_freqs,
            rope_long_short,
            output_bias,
            per_layer_embd,
            encoder,
            layers,
            devices,
            layer_devices: map.blocks,
            output_device: map.output,
            buffers,
            file_type: file_type_name(gguf),
            chat_template: gguf
                .get_str("tokenizer.chat_template")
                .ok()
                .map(str::to_string),
            n_params: gguf
                .tensors()
                .iter()
                .map(|t| t.ne.iter().product::<usize>())
                .sum(),
            size_bytes: gguf.tensors().iter().map(|t| t.size).sum(),
            file: gguf.file_stamp().cloned(),
            overridden,
            kept_on_host,
        })
    }

    /// The weights left in host memory because the device their layer is on cannot compute
    /// the ops that read them: `(name, device index into [`Model::devices`], bytes)`, in file
    /// order.
    pub fn kept_on_host(&self) -> &[(String, usize, usize)] {
        &self.kept_on_host
    }

    /// The tensors a [`TensorOverride`] placed, as `(name, device index into
    /// [`Model::devices`], bytes)`, in file order.
    pub fn overridden_tensors(&self) -> &[(String, usize, usize)] {
        &self.overridden
    }

    /// The RoPE frequency divisors of a context of `n_ctx` positions per sequence, as
    /// llama.cpp's `get_rope_factors`: `rope_freqs.weight`, else LongRoPE's long factors for
    /// a context beyond the original one and its short factors within it, else none.
    pub fn rope_factors(&self, n_ctx: usize) -> Option<TensorId> {
        self.rope_freqs.or_else(|| {
            self.rope_long_short
                .map(|(long, short)| match n_ctx > self.config.n_ctx_orig {
                    true => long,
                    false => short,
                })
        })
    }

    /// The device holding the weights (the first one when split).
    pub fn device(&self) -> &DeviceRef {
        &self.devices[0]
    }

    /// The devices holding the weights, in split order (one unless the model is split).
    pub fn devices(&self) -> &[DeviceRef] {
        &self.devices
    }

    /// The index in [`devices`](Self::devices) of the device holding block `il` (and its KV
    /// cache); `None` past the last block.
    pub fn layer_device(&self, il: usize) -> Option<usize> {
        self.layer_devices.get(il).copied()
    }

    /// The index in [`devices`](Self::devices) of the device holding the output head (the
    /// output norm and projection).
    pub fn output_device(&self) -> usize {
        self.output_device
    }

    /// The buffers holding the weights (file mappings, device memory). Sessions only read
    /// them: computations of several sessions hold them shared at the same time.
    pub fn weight_buffers(&self) -> &[Arc<Buffer>] {
        &self.buffers
    }

    /// An error if the mapped model file was truncated or written to since it was loaded
    /// (its weights, read in place, could no longer be trusted); sessions check before every
    /// evaluation. A cheap `fstat`; always `Ok` for a model not read from a mapped file.
    pub fn check_file(&self) -> Result<()> {
        match &self.file {
            Some(stamp) => Ok(stamp.check()?),
            None => Ok(()),
        }
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
}

/// Tensors of the file by name, with their metadata.
type FileTensors<'g> = std::collections::HashMap<&'g str, (TensorId, &'g TensorInfo)>;

/// Tensors with their file metadata and target (see [`assign_tensors`]).
type PlacedTensors<'g> = Vec<(TensorId, &'g TensorInfo, Option<usize>)>;

/// Where each part of a model goes: indices into the model's devices.
#[derive(Debug)]
struct LayerMap {
    /// The device of each block (and of its KV cache).
    blocks: Vec<usize>,
    /// The device of the output norm and projection.
    output: usize,
    /// The device of the other tensors (the token embeddings; `rope_freqs`), or `None` for
    /// host memory (the registry's "CPU" device).
    inputs: Option<usize>,
    /// Tensors whose name matches go to the device, whatever their part.
    overrides: Vec<(regex::Regex, usize)>,
}

impl LayerMap {
    /// Everything on device `dev`.
    fn all_on(dev: usize, n_layer: usize) -> LayerMap {
        LayerMap {
            blocks: vec![dev; n_layer],
            output: dev,
            inputs: Some(dev),
            overrides: Vec::new(),
        }
    }
}

/// The devices the weights go to and where each part goes, from the placement (default: the
/// registry's "CPU" device); a tensor split becomes one meta device.
fn resolve_placement(
    gguf: &GgufFile,
    config: &ModelConfig,
    placement: Option<Placement>,
) -> Result<(Vec<DeviceRef>, LayerMap)> {
    let placement = match placement {
        Some(p) => p,
        None => Placement::Single(rgml::registry::device("CPU")?),
    };
    let n_layer = config.n_layer;
    Ok(match placement {
        Placement::Single(d) => (vec![d], LayerMap::all_on(0, n_layer)),
        Placement::Layers { devices, .. } if devices.is_empty() => {
            return Err(LlmError::BadConfig(
                "a layer split needs at least one device".into(),
            ))
        }
        Placement::Layers { devices, shares } => {
            let blocks = assign_layers(n_layer, devices.len(), &shares)?;
            let map = LayerMap {
                blocks,
                output: devices.len() - 1,
                inputs: (devices.len() == 1).then_some(0),
                overrides: Vec::new(),
            };
            (devices, map)
        }
        Placement::Offload {
            gpu,
            cpu,
            n_gpu_layers,
        } => offload(gpu, cpu, n_gpu_layers, n_layer)?,
        Placement::Tensor { devices, .. } if devices.len() < 2 => {
            return Err(LlmError::BadConfig(
                "a tensor split needs at least two devices".into(),
            ))
        }
        Placement::Tensor {
            devices,
            shares,
            sync,
        } => (
            vec![meta_device(gguf, config, devices, &shares, sync)?],
            LayerMap::all_on(0, n_layer),
        ),
    })
}

/// [`Placement::Offload`]'s devices and map: `[gpu, cpu]` (the GPU first, as llama.cpp's
/// scheduler has its GPUs before the CPU), or `[cpu]` alone when nothing is offloaded.
fn offload(
    gpu: DeviceRef,
    cpu: DeviceRef,
    n_gpu_layers: usize,
    n_layer: usize,
) -> Result<(Vec<DeviceRef>, LayerMap)> {
    if rgml::backend::same_instance(&gpu, &cpu) {
        return Err(LlmError::BadConfig(format!(
            "offloading needs two devices; {} was given as both",
            gpu.name()
        )));
    }
    Ok(match offload_map(n_layer, n_gpu_layers) {
        Some(map) => (vec![gpu, cpu], map),
        None => (vec![cpu], LayerMap::all_on(0, n_layer)),
    })
}

/// Where `n_gpu_layers` offloaded layers of a model of `n_layer` blocks go over devices
/// `[gpu, cpu]`: llama.cpp's `load_tensors` numbers the output head `n_layer` and offloads
/// the layers `il >= n_layer + 1 - n_gpu_layers`, so the head first, then the blocks from the
/// last down. `None`: nothing is offloaded.
fn offload_map(n_layer: usize, n_gpu_layers: usize) -> Option<LayerMap> {
    const GPU: usize = 0;
    const CPU: usize = 1;
    if n_gpu_layers == 0 {
        return None;
    }
    let first_offloaded = (n_layer + 1).saturating_sub(n_gpu_layers);
    Some(LayerMap {
        blocks: (0..n_layer)
            .map(|il| if il < first_offloaded { CPU } else { GPU })
            .collect(),
        output: GPU,
        inputs: Some(CPU),
        overrides: Vec::new(),
    })
}

/// The overrides as indices into `devices`, a device not among them added at the end (the
/// blocks keep their devices; the session opens a backend for every device).
fn override_devices(
    devices: &mut Vec<DeviceRef>,
    overrides: &[TensorOverride],
) -> Vec<(regex::Regex, usize)> {
    overrides
        .iter()
        .map(|o| {
            let at = devices
                .iter()
                .position(|d| rgml::backend::same_instance(d, &o.device))
                .unwrap_or_else(|| {
                    devices.push(o.device.clone());
                    devices.len() - 1
                });
            (o.pattern.clone(), at)
        })
        .collect()
}

/// A context with one tensor (no storage yet) per tensor of the file, named as in the file.
fn weights_context(gguf: &GgufFile) -> Result<(Context, FileTensors<'_>)> {
    let mut ctx = Context::new();
    let mut ids = FileTensors::new();
    for info in gguf.tensors() {
        let id = ctx.new_tensor(info.dtype, &info.ne[..info.n_dims.max(1)])?;
        ctx.set_name(id, info.name.clone())?;
        ids.insert(info.name.as_str(), (id, info));
    }
    Ok((ctx, ids))
}

/// A file whose blocks go beyond its block count was written for another configuration (or
/// its count was edited): refuse it rather than run with blocks left out.
fn check_blocks(gguf: &GgufFile, n_layer: usize) -> Result<()> {
    match gguf
        .tensors()
        .iter()
        .find(|t| block_index(&t.name).is_some_and(|il| il >= n_layer))
    {
        Some(extra) => Err(LlmError::BadConfig(format!(
            "tensor '{}' belongs to a block beyond the block count {n_layer}",
            extra.name
        ))),
        None => Ok(()),
    }
}

/// Where each tensor goes, as `map` says: an index into the model's devices, or `None` for
/// host memory. Where the output head's device is not the token embeddings', a file with tied
/// embeddings gets a second tensor over the embeddings' file data for the head; its id is
/// returned, with the tensors an override placed (name, device, bytes).
#[allow(clippy::type_complexity)]
fn assign_tensors<'g>(
    gguf: &'g GgufFile,
    ctx: &mut Context,
    ids: &FileTensors<'g>,
    map: &LayerMap,
    has_head: bool,
) -> Result<(
    PlacedTensors<'g>,
    Option<TensorId>,
    Vec<(String, usize, usize)>,
)> {
    let mut placed: PlacedTensors<'g> = Vec::new();
    let mut overridden = Vec::new();
    for info in gguf.tensors() {
        let (id, _) = ids[info.name.as_str()];
        let matched = map.overrides.iter().find(|(re, _)| re.is_match(&info.name));
        let where_ = if let Some(&(_, dev)) = matched {
            overridden.push((info.name.clone(), dev, info.size));
            Some(dev)
        } else if let Some(il) = block_index(&info.name) {
            // `check_blocks` has refused blocks beyond the count.
            Some(map.blocks.get(il).copied().unwrap_or(map.output))
        } else if info.name.starts_with("output") {
            Some(map.output)
        } else {
            map.inputs
        };
        placed.push((id, info, where_));
    }
    let mut tied_output = None;
    if has_head && map.inputs != Some(map.output) && !ids.contains_key("output.weight") {
        if let Some(&(_, info)) = ids.get("token_embd.weight") {
            let id = ctx.new_tensor(info.dtype, &info.ne[..info.n_dims.max(1)])?;
            ctx.set_name(id, "output.weight")?;
            placed.push((id, info, Some(map.output)));
            tied_output = Some(id);
        }
    }
    Ok((placed, tied_output, overridden))
}

/// Weights whose device cannot compute the ops that read them stay in host memory, where the
/// CPU computes those ops (llama.cpp's loader likewise falls back to the CPU's buffer type for
/// them): left on the device, the scheduler would copy them to the CPU for every graph, which
/// for a mixture of experts on a GPU without MUL_MAT_ID (the exact arithmetic) is most of the
/// model's bytes per token. What an override placed stays where it was put. Returns the
/// tensors moved: name, the device they were for, bytes.
fn keep_unreadable_weights_on_host(
    ctx: &Context,
    placed: &mut PlacedTensors<'_>,
    devices: &[DeviceRef],
    overridden: &[(String, usize, usize)],
    (cpu, experts_used): (&DeviceRef, usize),
) -> Result<Vec<(String, usize, usize)>> {
    let mut moved = Vec::new();
    let tied = !placed.iter().any(|p| ctx[p.0].name == "output.weight");
    for (id, info, where_) in placed.iter_mut() {
        let Some((index, device)) = where_.and_then(|i| Some((i, devices.get(i)?))) else {
            continue;
        };
        let on_cpu = rgml::backend::same_instance(cpu, device);
        let name = &ctx[*id].name;
        if on_cpu || overridden.iter().any(|o| &o.0 == name) {
            continue;
        }
        for op in weight_uses(name, tied) {
            if !op_runs_on(device, &ctx[*id], op, experts_used)? {
                *where_ = None;
                moved.push((name.clone(), index, info.size));
                break;
            }
        }
    }
    Ok(moved)
}

/// Tokens of llama.cpp's probe of where a weight can be read (`weight_buft_supported`).
const PROBE_TOKENS: usize = 512;

/// Whether `device` computes `op` reading a weight shaped as `w`, over [`PROBE_TOKENS`] tokens
/// (each routed to `experts_used` experts), as llama.cpp probes it.
fn op_runs_on(
    device: &DeviceRef,
    w: &rgml::Tensor,
    op: OpKind,
    experts_used: usize,
) -> Result<bool> {
    let mut ctx = Context::new();
    let weight = ctx.new_tensor(w.dtype, &w.ne)?;
    let node = match op {
        OpKind::MulMat => {
            let b = ctx.new_tensor(DType::F32, &[w.ne[0], PROBE_TOKENS, w.ne[2], w.ne[3]])?;
            ctx.mul_mat(weight, b)?
        }
        OpKind::MulMatId => {
            let used = experts_used.max(1);
            let b = ctx.new_tensor(DType::F32, &[w.ne[0], used, PROBE_TOKENS])?;
            let ids = ctx.new_tensor(DType::I32, &[used, PROBE_TOKENS])?;
            ctx.mul_mat_id(weight, b, ids)?
        }
        OpKind::GetRows => {
            let rows = ctx.new_tensor(DType::I32, &[PROBE_TOKENS])?;
            ctx.get_rows(weight, rows)?
        }
        _ => return Ok(true),
    };
    Ok(device.supports_op(&ctx, node))
}

/// The weights the graph reads, found by name.
struct NamedWeights {
    tok_embd: TensorId,
    /// Absent in an encoder.
    output_norm: Option<TensorId>,
    /// `output.weight`, absent when the file ties it to the token embeddings.
    output: Option<TensorId>,
    /// `rope_freqs.weight`, where the architecture reads it.
    rope_freqs: Option<TensorId>,
    /// LongRoPE's long and short factors, where the architecture reads them.
    rope_long_short: Option<(TensorId, TensorId)>,
    /// `output.bias`, where the architecture reads it.
    output_bias: Option<TensorId>,
    /// Per-layer token embeddings, where the model has them.
    per_layer_embd: Option<PerLayerEmbeddings>,
    /// An encoder's input embeddings and norm.
    encoder: Option<EncoderInput>,
    layers: Vec<LayerWeights>,
    /// Tensors accepted and never read: Qwen3's reranker head (`cls.output.weight`, read
    /// only by llama.cpp's rank pooling, which rgml does not have).
    unread: Vec<TensorId>,
}

impl NamedWeights {
    fn resolve(ids: &FileTensors<'_>, config: &ModelConfig) -> Result<NamedWeights> {
        let get = |name: &str| ids.get(name).map(|&(id, _)| id);
        let required =
            |name: &str| get(name).ok_or_else(|| LlmError::MissingTensor(name.to_string()));
        let layers = (0..config.n_layer)
            .map(|il| crate::arch::layer_weights(config, il, &get))
            .collect::<Result<Vec<_>>>()?;
        // Left out where the graph would not read them, so such a file is refused.
        let kind = config.kind;
        let encoder = match kind.is_encoder() {
            true => Some(EncoderInput {
                type_embd: get("token_types.weight"),
                pos_embd: required("position_embd.weight")?,
                norm: [
                    required("token_embd_norm.weight")?,
                    required("token_embd_norm.bias")?,
                ],
            }),
            false => None,
        };
        let rope_long_short = match kind.has_longrope_factors() {
            true => get("rope_factors_long.weight").zip(get("rope_factors_short.weight")),
            false => None,
        };
        let weights = NamedWeights {
            tok_embd: required("token_embd.weight")?,
            output_norm: match encoder {
                Some(_) => None,
                None => Some(required("output_norm.weight")?),
            },
            output: get("output.weight").filter(|_| encoder.is_none()),
            rope_freqs: get("rope_freqs.weight").filter(|_| kind.has_rope_freqs()),
            rope_long_short,
            output_bias: get("output.bias").filter(|_| kind.has_output_bias()),
            per_layer_embd: match config.n_embd_per_layer > 0 {
                true => Some(PerLayerEmbeddings {
                    tok_embd: required("per_layer_token_embd.weight")?,
                    model_proj: required("per_layer_model_proj.weight")?,
                    proj_norm: required("per_layer_proj_norm.weight")?,
                }),
                false => None,
            },
            encoder,
            layers,
            unread: get("cls.output.weight")
                .filter(|_| kind == crate::config::Arch::Qwen3)
                .into_iter()
                .collect(),
        };
        weights.check_all_used(ids, config)?;
        Ok(weights)
    }

    /// A tensor the graph would not read means a part of the model rgml does not know:
    /// refused (as llama.cpp refuses files with unused tensors), not silently left out.
    fn check_all_used(&self, ids: &FileTensors<'_>, config: &ModelConfig) -> Result<()> {
        let mut used: std::collections::HashSet<TensorId> = [self.tok_embd].into_iter().collect();
        used.extend(self.output_norm);
        if let Some(e) = self.encoder {
            used.extend(e.type_embd.into_iter().chain([e.pos_embd]).chain(e.norm));
        }
        used.extend(self.output);
        used.extend(self.rope_freqs);
        used.extend(self.rope_long_short.into_iter().flat_map(|(l, s)| [l, s]));
        used.extend(self.output_bias);
        if let Some(p) = self.per_layer_embd {
            used.extend([p.tok_embd, p.model_proj, p.proj_norm]);
        }
        used.extend(self.unread.iter().copied());
        for (il, l) in self.layers.iter().enumerate() {
            used.extend(
                crate::arch::layer_shapes(config, il, l)
                    .into_iter()
                    .map(|(id, ..)| id),
            );
        }
        let mtp = config.n_layer..config.n_layer + config.n_layer_nextn;
        let mut unused: Vec<&str> = ids
            .iter()
            .filter(|(_, (id, _))| !used.contains(id))
            .map(|(name, _)| *name)
            .filter(|name| !block_index(name).is_some_and(|il| mtp.contains(&il)))
            .collect();
        unused.sort_unstable();
        match unused.first() {
            Some(name) => Err(LlmError::BadTensor(format!(
                "'{name}' is not part of a {} model ({} such tensors)",
                config.arch,
                unused.len()
            ))),
            None => Ok(()),
        }
    }

    /// Every weight's shape and dtype against the configuration.
    fn check_shapes(&self, ctx: &Context, c: &ModelConfig) -> Result<()> {
        let expect = |id: TensorId, ne: [usize; 4]| -> Result<()> {
            let t = &ctx[id];
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
        expect(
            self.output.unwrap_or(self.tok_embd),
            [c.n_embd, c.n_vocab, 1, 1],
        )?;
        let mut vectors: Vec<TensorId> = self.output_norm.into_iter().collect();
        if let Some(e) = self.encoder {
            if let Some(t) = e.type_embd {
                expect(t, [c.n_embd, c.n_token_types, 1, 1])?;
            }
            expect(e.pos_embd, [c.n_embd, c.n_ctx_train, 1, 1])?;
            vectors.extend(e.norm);
        }
        for &v in &vectors {
            expect(v, [c.n_embd, 1, 1, 1])?;
        }
        let factors = self.rope_freqs.into_iter();
        let factors = factors.chain(self.rope_long_short.into_iter().flat_map(|(l, s)| [l, s]));
        for f in factors.clone() {
            expect(f, [c.n_rot / 2, 1, 1, 1])?;
        }
        if let Some(b) = self.output_bias {
            expect(b, [c.n_vocab, 1, 1, 1])?;
        }
        if let Some(p) = self.per_layer_embd {
            let all = c.n_embd_per_layer * c.n_layer;
            expect(p.tok_embd, [all, c.n_vocab, 1, 1])?;
            expect(p.model_proj, [c.n_embd, all, 1, 1])?;
            expect(p.proj_norm, [c.n_embd_per_layer, 1, 1, 1])?;
        }
        let norm_f32 = |id: TensorId| -> Result<()> {
            match ctx[id].dtype {
                DType::F32 => Ok(()),
                _ => Err(LlmError::BadTensor(format!(
                    "'{}' must be f32 (a norm, scale or other vector-like weight)",
                    ctx[id].name
                ))),
            }
        };
        for v in vectors {
            norm_f32(v)?;
        }
        if let Some(f) = factors.into_iter().find(|&f| ctx[f].dtype != DType::F32) {
            return Err(LlmError::BadTensor(format!(
                "'{}' must be f32, not {}",
                ctx[f].name, ctx[f].dtype
            )));
        }
        for (il, l) in self.layers.iter().enumerate() {
            for (id, ne, is_norm) in crate::arch::layer_shapes(c, il, l) {
                expect(id, ne)?;
                if is_norm {
                    norm_f32(id)?;
                }
            }
        }
        Ok(())
    }
}

/// The block index of a tensor called `blk.<i>.<...>`.
fn block_index(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// One meta device over `devices` with the weights split as [`TensorSplitPlan`] says; the
/// granules are the block sizes of the weights whose contraction axis is split.
fn meta_device(
    gguf: &GgufFile,
    config: &ModelConfig,
    devices: Vec<DeviceRef>,
    shares: &[f32],
    sync: TensorSync,
) -> Result<DeviceRef> {
    if config.recurrent.is_some() {
        // The delta net's heads would have to split with their states and convolution
        // channels: not done yet.
        return Err(LlmError::UnsupportedModel(format!(
            "a tensor split of {}'s recurrent (delta-net) layers; use a layer split",
            config.arch
        )));
    }
    let granule = |suffix: &str| {
        gguf.tensors()
            .iter()
            .filter(|t| t.name.ends_with(suffix))
            .map(|t| t.dtype.block_size())
            .max()
            .unwrap_or(1)
    };
    // Only a split contraction axis (Reduce) must fall on whole quantization blocks; Gather
    // splits every weight by whole rows.
    let (attn_granule, ffn_granule) = match sync {
        TensorSync::Reduce => (
            granule("attn_output.weight"),
            granule("ffn_down.weight").max(granule("ffn_down_exps.weight")),
        ),
        TensorSync::Gather => (1, 1),
    };
    let plan = TensorSplitPlan::new(config, shares, devices.len(), attn_granule, ffn_granule)?;
    let states = Arc::new(plan.name_states(config.n_layer, sync));
    Ok(MetaDevice::new(devices, states)?)
}

/// The device index of each of `n_layer` blocks over `n_dev` devices, as llama.cpp's layer
/// split assigns them: contiguous ranges in proportion to `split` (empty: even).
fn assign_layers(n_layer: usize, n_dev: usize, split: &[f32]) -> Result<Vec<usize>> {
    let shares: Vec<f32> = if split.is_empty() {
        vec![1.0; n_dev]
    } else {
        split.to_vec()
    };
    if shares.len() != n_dev {
        return Err(LlmError::BadConfig(format!(
            "{} split proportions for {n_dev} devices",
            shares.len()
        )));
    }
    if shares.iter().any(|s| !s.is_finite() || *s < 0.0) {
        return Err(LlmError::BadConfig(format!(
            "split proportions must be finite and not negative, got {shares:?}"
        )));
    }
    let total: f32 = shares.iter().sum();
    if total <= 0.0 {
        return Err(LlmError::BadConfig(
            "split proportions must not all be zero".into(),
        ));
    }
    // Cumulative fractions; block `il` goes to the first device whose cumulative fraction
    // exceeds `il / n_layer` (llama.cpp's `upper_bound`).
    let mut cum = Vec::with_capacity(n_dev);
    let mut acc = 0.0f32;
    for s in &shares {
        acc += s;
        cum.push(acc / total);
    }
    Ok((0..n_layer)
        .map(|il| {
            let x = il as f32 / n_layer as f32;
            cum.iter().position(|&c| c > x).unwrap_or(n_dev - 1)
        })
        .collect())
}

/// Give every weight storage: on `devices[i]` for `Some(i)`, in host memory (`host`) for
/// `None`. A device that can wrap host memory, and whose backends can use the wrap, uses the
/// weights in place in the file mapping (zero-copy); other devices get a buffer of their own
/// buffer type with a copy.
fn place_weights(
    gguf: &GgufFile,
    ctx: &mut Context,
    placed: &[(TensorId, &TensorInfo, Option<usize>)],
    devices: &[DeviceRef],
    host: Option<&DeviceRef>,
    progress: &mut Option<ProgressFn<'_>>,
) -> Result<Vec<Arc<Buffer>>> {
    let total = placed.len();
    let mut done = 0;
    let mut report = |n: usize| {
        done += n;
        if let Some(p) = progress.as_mut() {
            p(done, total)
        }
    };
    let mut buffers = Vec::new();
    // Tied embeddings: the output projection reads `token_embd` itself.
    let tied = !placed.iter().any(|p| ctx[p.0].name == "output.weight");
    let targets = devices
        .iter()
        .enumerate()
        .map(|(i, d)| (Some(i), d))
        .chain(host.map(|h| (None, h)));
    for (which, device) in targets {
        let mut mine: Vec<(TensorId, &TensorInfo)> = placed
            .iter()
            .filter(|p| p.2 == which)
            .map(|p| (p.0, p.1))
            .collect();
        if mine.is_empty() {
            continue;
        }
        // Weights the device keeps in a layout of its own (e.g. CPU_REPACK) are copied there;
        // the rest follow below.
        for buft in device.extra_buffer_types() {
            let (taken, rest): (Vec<_>, Vec<_>) = mine.into_iter().partition(|&(id, _)| {
                buft.accepts_weight(&ctx[id], &weight_uses(&ctx[id].name, tied))
            });
            mine = rest;
            if !taken.is_empty() {
                buffers.push(copy_weights(gguf, ctx, &taken, &buft, &mut report)?);
            }
        }
        if mine.is_empty() {
            continue;
        }
        if device.caps().buffer_from_host_ptr {
            let max_tensor = mine.iter().map(|t| t.1.size).max().unwrap_or(0);
            // A device may still decline (e.g. this mapping cannot be imported): then copy.
            let buffer = match device.buffer_from_host_memory(gguf.memory(), max_tensor) {
                Ok(buffer) => Some(buffer),
                Err(rgml::Error::Unsupported { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            if let Some(buffer) = buffer.filter(|b| device.supports_buffer_type(b.buffer_type())) {
                buffer.set_usage(BufferUsage::Weights);
                for &(id, info) in &mine {
                    ctx.set_data(id, buffer.clone(), gguf.data_offset() + info.offset)?;
                    report(1);
                }
                buffers.push(buffer);
                continue;
            }
        }
        buffers.push(copy_weights(
            gguf,
            ctx,
            &mine,
            &device.buffer_type(),
            &mut report,
        )?);
    }
    Ok(buffers)
}

/// A buffer of `buft` holding `tensors`, their file bytes copied in: one allocation, or a
/// multi-buffer over several where they exceed the buffer type's largest (as ggml's
/// `alloc_ctx_tensors_from_buft` packs them: a model bigger than a GPU's largest buffer still
/// loads). The whole size is compared with the device's free memory before any part is taken,
/// so a model that does not fit is an error naming its size.
fn copy_weights(
    gguf: &GgufFile,
    ctx: &mut Context,
    tensors: &[(TensorId, &TensorInfo)],
    buft: &rgml::BufferTypeRef,
    report: &mut impl FnMut(usize),
) -> Result<Arc<Buffer>> {
    let sizes: Vec<usize> = tensors
        .iter()
        .map(|&(id, _)| buft.alloc_size(&ctx[id]))
        .collect();
    let parts = pack_parts(&sizes, buft.alignment(), buft.max_size()).map_err(|i| {
        rgml::Error::TensorTooLarge {
            tensor: ctx[tensors[i].0].display_name().to_string(),
            buffer_type: buft.name().to_string(),
            size: sizes[i],
            max_size: buft.max_size(),
        }
    })?;
    let total = parts.iter().map(|p| p.1).sum::<usize>();
    check_free(buft, total).map_err(|e| LlmError::memory(e, MemoryUse::Weights))?;
    let mut buffers = Vec::with_capacity(parts.len());
    let mut first = 0;
    for &(end, size) in &parts {
        let buffer = Buffer::alloc(buft, size.max(1))
            .map_err(|e| LlmError::memory(e, MemoryUse::Weights))?;
        buffer.set_usage(BufferUsage::Weights);
        let mut talloc = TensorAllocator::new(buffer.clone());
        for &(id, info) in &tensors[first..end] {
            talloc.alloc(ctx, id)?;
            ctx.tensor_set(id, 0, gguf.tensor_data(info))?;
            report(1);
        }
        buffers.push(buffer);
        first = end;
    }
    match buffers.len() {
        1 => Ok(buffers.remove(0)),
        _ => Ok(Buffer::multi(buffers)?),
    }
}

/// Tensors of `sizes` bytes packed in order into parts of at most `max_size` bytes (offsets
/// aligned to `align`): per part, one past its last tensor and its bytes. `Err(i)`: tensor `i`
/// alone is larger than `max_size`.
fn pack_parts(
    sizes: &[usize],
    align: usize,
    max_size: usize,
) -> std::result::Result<Vec<(usize, usize)>, usize> {
    let mut parts = Vec::new();
    let (mut first, mut used) = (0, 0usize);
    for (i, &size) in sizes.iter().enumerate() {
        if size > max_size {
            return Err(i);
        }
        let end = rgml::alloc::align_up(used, align).saturating_add(size);
        if end > max_size && i > first {
            parts.push((i, used));
            (first, used) = (i, size);
        } else {
            used = end;
        }
    }
    parts.push((sizes.len(), used));
    Ok(parts)
}

/// An error naming the sizes when `size` bytes exceed what `buft`'s device has free (as
/// [`Buffer::alloc`] checks each allocation; this checks several together).
fn check_free(buft: &rgml::BufferTypeRef, size: usize) -> rgml::Result<()> {
    let Some(device) = buft.device() else {
        return Ok(());
    };
    let memory = device.memory();
    if memory.total > 0 && size > memory.free {
        return Err(rgml::Error::InsufficientMemory {
            device: device.name().to_string(),
            buffer_type: buft.name().to_string(),
            size,
            free: memory.free,
        });
    }
    Ok(())
}

/// The ops that read weight `name` in the graphs this model builds (empty: other ops, or
/// unknown). `tied`: the output projection reuses the token embeddings.
fn weight_uses(name: &str, tied: bool) -> Vec<OpKind> {
    const MATRICES: [&str; 9] = [
        "attn_qkv.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
        "ffn_gate_inp.weight",
    ];
    const EXPERTS: [&str; 3] = [
        "ffn_gate_exps.weight",
        "ffn_up_exps.weight",
        "ffn_down_exps.weight",
    ];
    let field = block_index(name)
        .and(name.split_once('.'))
        .and_then(|(_, rest)| rest.split_once('.'))
        .map(|(_, field)| field);
    match name {
        "token_embd.weight" if tied => vec![OpKind::GetRows, OpKind::MulMat],
        "token_embd.weight" => vec![OpKind::GetRows],
        "output.weight" => vec![OpKind::MulMat],
        _ if field.is_some_and(|f| MATRICES.contains(&f)) => vec![OpKind::MulMat],
        _ if field.is_some_and(|f| EXPERTS.contains(&f)) => vec![OpKind::MulMatId],
        _ => Vec::new(),
    }
}

/// The file's type as llama.cpp names it: its `general.file_type` preset (`Q4_K_M`), else the
/// type of most weight bytes (`q8_0`).
fn file_type_name(gguf: &GgufFile) -> String {
    gguf.get_u64("general.file_type")
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .and_then(crate::quantize::QuantPreset::from_file_type)
        .map(|p| p.name().to_string())
        .unwrap_or_else(|| dominant_type(gguf.tensors()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_split_like_llama_cpp() {
        let even = assign_layers(30, 2, &[]).unwrap();
        assert_eq!(even.iter().filter(|&&d| d == 0).count(), 15);
        let three_one = assign_layers(30, 2, &[3.0, 1.0]).unwrap();
        assert_eq!(three_one.iter().filter(|&&d| d == 0).count(), 23);
        assert!(
            three_one.windows(2).all(|w| w[0] <= w[1]),
            "contiguous ranges"
        );
        assert_eq!(assign_layers(4, 2, &[0.0, 1.0]).unwrap(), [1, 1, 1, 1]);
        assert!(assign_layers(4, 2, &[1.0]).is_err());
        assert!(assign_layers(4, 2, &[0.0, 0.0]).is_err());
        assert!(assign_layers(4, 2, &[-1.0, 2.0]).is_err());
        assert_eq!(block_index("blk.12.attn_q.weight"), Some(12));
        assert_eq!(block_index("output.weight"), None);
    }

    /// Blocks on the GPU (device 0) of `-ngl n` over 30 blocks, and whether the head is.
    fn offloaded(n: usize) -> (usize, bool) {
        match offload_map(30, n) {
            None => (0, false),
            Some(map) => {
                assert_eq!(map.inputs, Some(1), "token embeddings on the CPU");
                let on_gpu = map.blocks.iter().filter(|&&d| d == 0).count();
                // The offloaded blocks are the last ones.
                assert!(map.blocks[30 - on_gpu..].iter().all(|&d| d == 0), "{n}");
                (on_gpu, map.output == 0)
            }
        }
    }

    #[test]
    fn offload_counts_the_output_head_first_like_llama_cpp() {
        // 0: all on the CPU. 1: the output head alone (llama.cpp's "offloading output layer
        // to GPU, 0 repeating layers").
        assert_eq!(offloaded(0), (0, false));
        assert_eq!(offloaded(1), (0, true));
        assert_eq!(offloaded(8), (7, true));
        // n_layer: the head and all blocks but the first; n_layer + 1 and more: everything.
        assert_eq!(offloaded(30), (29, true));
        assert_eq!(offloaded(31), (30, true));
        assert_eq!(offloaded(99), (30, true));
        assert_eq!(offloaded(usize::MAX), (30, true));
        assert_eq!(offload_map(0, 5).map(|m| m.output), Some(0), "no blocks");
    }

    #[test]
    fn weights_pack_into_parts_of_the_largest_buffer() {
        // One part when everything fits (aligned offsets: 10 -> 16).
        assert_eq!(pack_parts(&[10, 10], 16, 100), Ok(vec![(2, 26)]));
        // A new part where the next tensor would cross the limit.
        assert_eq!(
            pack_parts(&[60, 30, 30, 100], 1, 100),
            Ok(vec![(2, 90), (3, 30), (4, 100)])
        );
        assert_eq!(pack_parts(&[10, 101], 1, 100), Err(1));
    }
}
