//! Inference state: the KV cache, the per-batch LLaMA graph, and evaluation.
//!
//! A [`Session`] owns a [`Scheduler`] over its backends and a KV cache for one model, which it
//! shares (`Arc<Model>`) with the other sessions on it. Each call to [`Session::eval`] (or
//! [`Session::decode`], which does not copy the logits out) builds the graph for one
//! micro-batch on top of the model's weight tensors, allocates it through the scheduler (whose
//! compute buffers are reused between steps), computes it and returns logits. There is one
//! execution path: a model on one device gets a scheduler with that device's backend alone
//! (one split, no copies), a split model one backend per device and the CPU. The graph
//! depends only on the batch size and the number of cache cells attended to (a multiple of
//! 32): where the batch goes is in its inputs (the K/V stores are SET_ROWS at the
//! positions, the mask covers the cells). So the next micro-batch of the same key computes the
//! same graph again, without building or allocating anything: generation rebuilds its graph
//! once every 32 tokens, and the steps between allocate no memory. A rebuild truncates the
//! arena back to the weights and the cache, so it does not grow.
//!
//! A model split over several devices gets one backend per device plus the CPU backend (last),
//! and its graphs run through the [`Scheduler`] with [`N_COPIES_SPLIT`] copies of the split
//! inputs (pipeline parallelism); each block's KV cache lives on that block's device, so the
//! cache stores and the attention reads of a block run on the same backend. Prompt
//! micro-batches whose logits are not read are only queued (`graph_compute_async`); with
//! asynchronous backends (the `CPU0`, `CPU1`, ... devices by default) several of them are then
//! in flight across the devices, and the micro-batch whose logits are read waits for them all.
//! An error of a queued micro-batch is reported by the call that reads logits.

use crate::error::{LlmError, Result};
use crate::model::Model;
use rgml::alloc::TensorAllocator;
use rgml::backend::{BackendParams, Buffer, BufferUsage, DeviceType};
use rgml::sched::{Scheduler, SchedulerOptions};
use rgml::trace::Trace;
use rgml::{Backend, Context, DType, DeviceRef, Graph, RopeParams, TensorFlags, TensorId};
use std::sync::Arc;

/// Which positions' logits an evaluation returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every token's (perplexity).
    All,
}

/// How to set up a session.
#[derive(Clone)]
pub struct SessionOptions {
    /// Context length (KV cache positions).
    pub n_ctx: usize,
    /// Largest number of tokens computed in one graph; longer prompts go in several.
    pub n_ubatch: usize,
    /// Threads of each CPU backend the session opens (`None`: the backend's default). Only
    /// CPU devices get it.
    pub n_threads: Option<usize>,
    /// Further parameters for the backends of particular devices (the device's own keys, e.g.
    /// `isa=avx2` for a CPU, `n_cb=2` for a GPU), by device.
    pub device_params: Vec<(DeviceRef, BackendParams)>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 2048,
            n_ubatch: 512,
            n_threads: None,
            device_params: Vec::new(),
        }
    }
}

impl std::fmt::Debug for SessionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let params: Vec<(&str, &BackendParams)> = self
            .device_params
            .iter()
            .map(|(d, p)| (d.name(), p))
            .collect();
        f.debug_struct("SessionOptions")
            .field("n_ctx", &self.n_ctx)
            .field("n_ubatch", &self.n_ubatch)
            .field("n_threads", &self.n_threads)
            .field("device_params", &params)
            .finish()
    }
}

impl SessionOptions {
    /// The parameters of `device`'s backend: its own from [`device_params`](Self::device_params),
    /// and `n_threads` for a CPU device (for a meta device, when its devices are CPUs).
    fn params_for(&self, device: &DeviceRef) -> BackendParams {
        let mut params = self
            .device_params
            .iter()
            .find(|(d, _)| rgml::backend::same_instance(d, device) || d.name() == device.name())
            .map(|(_, p)| p.clone())
            .unwrap_or_default();
        if let Some(n) = self.n_threads {
            if device.device_type() == DeviceType::Cpu {
                params.set("n_threads", n);
            }
        }
        params
    }
}

/// K and V of every layer for `cells` positions, f16, in one buffer. K is stored
/// `[n_embd_kv, cells]` (one column per position); V transposed, `[cells, n_embd_kv]`, so the
/// attention product reads it with dense rows.
struct KvCache {
    k: Vec<TensorId>,
    v: Vec<TensorId>,
    /// Positions a sequence may use (the requested context length).
    n_ctx: usize,
    /// Allocated positions: `n_ctx` rounded up to [`KV_PAD`] (as llama.cpp pads its context),
    /// so the attention can always read whole padded groups of cells.
    cells: usize,
    _buffers: Vec<Arc<Buffer>>,
}

/// Copies of the split inputs when a model is split over several devices, so consecutive
/// prompt micro-batches can be in flight together (llama.cpp's default pipeline depth).
pub const N_COPIES_SPLIT: usize = 4;

/// Inference state for one sequence.
///
/// A session shares its model through an [`Arc`], so it has no lifetime: it can be stored
/// beside the model (say in a map of a server's sequences) or moved to another thread. It is
/// `Send` but not `Sync`: one thread at a time drives it (`&mut self`). Several sessions on one
/// model compute at the same time, each reading the weights shared.
pub struct Session {
    model: Arc<Model>,
    ctx: Context,
    n_base: usize,
    kv: KvCache,
    /// Runs every graph: over the model's device alone, or over its devices and the CPU.
    sched: Box<Scheduler>,
    n_past: usize,
    n_ubatch: usize,
    capture: Option<Vec<Captured>>,
    /// The graph of the last micro-batch, still allocated, with what it was built for: the
    /// next micro-batch of the same shape computes it again (see [`Session::eval_ubatch`]).
    built: Option<(GraphKey, BatchGraph)>,
    /// Host copies of the inputs and of the logits, kept between calls so that decoding
    /// allocates nothing per token.
    staging: Staging,
}

/// What a built graph depends on besides the weights and the cache: the graph is the same
/// for every micro-batch with the same key, wherever in the sequence it goes (the cache rows
/// written and the mask are inputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GraphKey {
    n_tokens: usize,
    n_kv: usize,
    all_logits: bool,
}

/// See [`Session::staging`].
#[derive(Default)]
struct Staging {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    mask: Vec<f32>,
    logits: Vec<f32>,
}

/// An intermediate tensor kept by [`Session::set_capture`]: llama.cpp's name for it (such as
/// `attn_norm-0`, `kq_soft_max-3`, `l_out-29`, `result_norm`), its shape and its values.
#[derive(Clone, Debug)]
pub struct Captured {
    /// llama.cpp's name (`<what>-<layer>`).
    pub name: String,
    /// `ne`, innermost first.
    pub ne: [usize; 4],
    /// The values, row-major from `ne[0]`.
    pub data: Vec<f32>,
}

/// The input tensors and the logits of one built graph.
struct BatchGraph {
    graph: Graph,
    tokens: TensorId,
    positions: TensorId,
    mask: TensorId,
    logits: TensorId,
    /// Intermediates named and kept for [`Session::set_capture`].
    captured: Vec<TensorId>,
    /// Nodes to run on a given device (index into the model's devices) when split: the norms,
    /// which the scheduler would otherwise leave on the previous block's device, so that the
    /// hidden state would cross twice (llama.cpp pins them the same way).
    pins: Vec<(TensorId, usize)>,
}

impl Session {
    /// A session with an empty KV cache on `model` (cloning the `Arc` is all a further session
    /// needs).
    pub fn new(model: Arc<Model>, options: &SessionOptions) -> Result<Session> {
        if options.n_ctx == 0 || options.n_ubatch == 0 {
            return Err(LlmError::BadConfig(
                "n_ctx and n_ubatch must be positive".into(),
            ));
        }
        let (sched, bufts) = open_backends(&model, options)?;
        let mut ctx = model.ctx.clone();
        let c = &model.config;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let cells = options
            .n_ctx
            .checked_next_multiple_of(KV_PAD)
            .ok_or_else(|| LlmError::BadConfig("n_ctx too large".into()))?;
        for il in 0..c.n_layer {
            let kt = ctx.new_tensor(DType::F16, &[c.n_embd_kv(), cells])?;
            ctx.set_name(kt, format!("cache_k_l{il}"))?;
            let vt = ctx.new_tensor(DType::F16, &[cells, c.n_embd_kv()])?;
            ctx.set_name(vt, format!("cache_v_l{il}"))?;
            k.push(kt);
            v.push(vt);
        }
        // One cache buffer per device, holding the K and V of that device's blocks.
        let mut buffers = Vec::new();
        for (dev, buft) in bufts.iter().enumerate() {
            let mine: Vec<TensorId> = (0..c.n_layer)
                .filter(|&il| model.layer_device(il).unwrap_or(0) == dev || bufts.len() == 1)
                .flat_map(|il| [k[il], v[il]])
                .collect();
            if mine.is_empty() {
                continue;
            }
            let align = buft.alignment();
            let size = mine
                .iter()
                .map(|&id| rgml::alloc::align_up(buft.alloc_size(&ctx[id]), align))
                .sum::<usize>();
            let buffer = Buffer::alloc(buft, size)?;
            buffer.set_usage(BufferUsage::Compute);
            // Unwritten cache cells are masked out, but must not hold NaN bit patterns that a
            // zero attention weight would still propagate.
            buffer.clear(0)?;
            let mut talloc = TensorAllocator::new(buffer.clone());
            for &id in &mine {
                talloc.alloc(&mut ctx, id)?;
            }
            buffers.push(buffer);
        }
        let n_base = ctx.len();
        Ok(Session {
            model,
            ctx,
            n_base,
            kv: KvCache {
                k,
                v,
                n_ctx: options.n_ctx,
                cells,
                _buffers: buffers,
            },
            sched,
            n_past: 0,
            n_ubatch: options.n_ubatch,
            capture: None,
            built: None,
            staging: Staging::default(),
        })
    }

    /// Tokens in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Context length.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx
    }

    /// The model, shared with the other sessions on it.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The backend of the model's (first) device, e.g. to set a CPU thread count.
    pub fn backend_mut(&mut self) -> Option<&mut (dyn Backend + 'static)> {
        self.sched.backend_mut(0)
    }

    /// The scheduler that runs the session's graphs (for its splits and copy statistics): one
    /// split on one backend for a model on one device.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Record evaluations into `trace`: the scheduler's splits and copies, a track per backend
    /// (see [`Scheduler::set_trace`]); backends add their own spans (a GPU's command buffers).
    pub fn set_trace(&mut self, recorder: Arc<Trace>) {
        self.sched.set_trace(recorder);
    }

    /// Observe nodes while evaluating, as llama.cpp's `cb_eval` does, whatever devices the
    /// model is on: `callback(ctx, id, true)` asks whether the caller wants node `id` (named
    /// as llama.cpp names it, `ctx[id].name`: `attn_norm-0`, `ffn_swiglu-3`, `result_norm`,
    /// ...); for those it wants, the node is computed and `callback(ctx, id, false)` is called
    /// while its values can be read (`ctx.tensor_get_f32(id)`); returning `false` then stops
    /// the evaluation with an error ([`rgml::Error::Aborted`]). Replaces any earlier callback;
    /// nodes are computed one group at a time while one is set, so it costs speed.
    pub fn set_eval_callback(&mut self, callback: rgml::sched::EvalCallback) {
        self.sched.set_eval_callback(callback);
    }

    /// Stop calling the eval callback.
    pub fn clear_eval_callback(&mut self) {
        self.sched.clear_eval_callback();
    }

    /// Debugging aid: while on, every evaluation also keeps the main intermediate tensors of its
    /// last micro-batch (named as llama.cpp names them, so they can be compared with a
    /// `cb_eval` dump); read them with [`Session::captured`]. Costs memory (the tensors are
    /// marked as outputs, so the allocator does not reuse them).
    pub fn set_capture(&mut self, on: bool) {
        self.capture = on.then(Vec::new);
    }

    /// The tensors kept by the last evaluation with capture on (empty otherwise).
    pub fn captured(&self) -> &[Captured] {
        self.capture.as_deref().unwrap_or(&[])
    }

    /// Forget the sequence (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Append `tokens` to the sequence and return logits: `[n_vocab]` for [`Logits::Last`], or
    /// `[n_tokens * n_vocab]` (row per token) for [`Logits::All`]. [`Session::decode`] returns
    /// the same values without copying them into a new vector.
    ///
    /// Errors: [`LlmError::InvalidToken`] for an id outside the vocabulary,
    /// [`LlmError::ContextFull`] when the tokens do not fit in the rest of the context,
    /// [`LlmError::BadInput`] for no tokens; the sequence is then unchanged. A failure of the
    /// computation itself ([`LlmError::Core`]) may leave part of a long prompt in the cache.
    pub fn eval(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.decode(tokens, which).map(<[f32]>::to_vec)
    }

    /// [`Session::eval`] into the session's own logits buffer, valid until the next call
    /// (llama.cpp's `llama_decode` + `llama_get_logits`). A micro-batch of the same size as
    /// the previous one, whose attention spans the same number of cache cells (generation:
    /// 32 tokens in a row, the attention span's padding), computes the previous graph again: nothing is
    /// built, allocated or planned, and the call allocates no memory. Errors as
    /// [`Session::eval`].
    pub fn decode(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        self.check_tokens(tokens)?;
        let mut out = std::mem::take(&mut self.staging.logits);
        out.clear();
        let result = self.decode_into(tokens, which, &mut out);
        self.staging.logits = out;
        result?;
        Ok(&self.staging.logits)
    }

    /// The logits of the last [`Session::eval`] or [`Session::decode`] (empty before the first
    /// and after a failed one).
    pub fn logits(&self) -> &[f32] {
        &self.staging.logits
    }

    fn decode_into(&mut self, tokens: &[u32], which: Logits, out: &mut Vec<f32>) -> Result<()> {
        let n_chunks = tokens.len().div_ceil(self.n_ubatch);
        for (i, chunk) in tokens.chunks(self.n_ubatch).enumerate() {
            let read = which == Logits::All || i + 1 == n_chunks;
            // Micro-batches whose logits are not read are only queued: on several devices the
            // scheduler's pipeline then keeps several of them in flight. The read one waits
            // for all of them (and reports their errors).
            if let Err(e) = self.eval_ubatch(chunk, which == Logits::All, read, out) {
                // Let queued micro-batches finish before reporting; theirs would be stale.
                let _ = self.sched.synchronize();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Debugging aid (graph comparison, `rgml compare`): build the graph that [`Session::eval`]
    /// would compute for `tokens` at the current position (one micro-batch, last logits only),
    /// allocate it and set its inputs, but compute nothing. Intermediate nodes carry llama.cpp's
    /// names (`attn_norm-0`, `ffn_swiglu-3`, ...). Returns the context holding the graph's
    /// tensors (weights and KV cache included) and the graph; they stay valid until the next
    /// call that changes the session. The sequence does not advance.
    pub fn prompt_graph(&mut self, tokens: &[u32]) -> Result<(&Context, Graph)> {
        self.check_tokens(tokens)?;
        if tokens.len() > self.n_ubatch {
            return Err(LlmError::BadInput(format!(
                "{} tokens do not fit in one micro-batch of {}",
                tokens.len(),
                self.n_ubatch
            )));
        }
        self.built = None;
        self.ctx.truncate(self.n_base);
        let key = self.graph_key(tokens.len(), false);
        let g = self.build_ubatch(key, true)?;
        self.set_inputs(&g, tokens)?;
        Ok((&self.ctx, g.graph))
    }

    /// Errors for an empty batch, a full context or a token outside the vocabulary.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(LlmError::BadInput("no tokens to evaluate".into()));
        }
        if self.n_past + tokens.len() > self.kv.n_ctx {
            return Err(LlmError::ContextFull {
                n_ctx: self.kv.n_ctx,
                needed: self.n_past + tokens.len(),
            });
        }
        let n_vocab = self.model.config.n_vocab;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(LlmError::InvalidToken { id, n_vocab });
        }
        Ok(())
    }

    /// The key of the graph for `n_tokens` tokens at the current position.
    fn graph_key(&self, n_tokens: usize, all_logits: bool) -> GraphKey {
        GraphKey {
            n_tokens,
            n_kv: padded_n_kv(self.n_past + n_tokens, self.kv.cells),
            all_logits,
        }
    }

    /// Evaluate one micro-batch, appending its logits to `out` when `read`. Unless `read` (or
    /// capture is on), the scheduler only queues it.
    ///
    /// The graph of the previous micro-batch is computed again when its key matches: it is
    /// still allocated (the graph allocator and the scheduler keep their buffers until the next
    /// allocation), only the inputs change. Otherwise (or with capture on, whose graphs differ)
    /// the graph is built and allocated afresh, replacing the old one's tensors. After an error
    /// the graph is dropped, so the next call starts clean.
    fn eval_ubatch(
        &mut self,
        tokens: &[u32],
        all_logits: bool,
        read: bool,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let capture = self.capture.is_some();
        let key = self.graph_key(tokens.len(), all_logits);
        let graph = match self.built.take() {
            Some((built_key, g)) if built_key == key && !capture => Ok(g),
            _ => {
                self.ctx.truncate(self.n_base);
                self.build_ubatch(key, capture)
            }
        };
        let result = graph.and_then(|g| {
            let r = self.run_ubatch(&g, tokens, read, out);
            if r.is_ok() && !capture {
                self.built = Some((key, g));
            }
            r
        });
        if self.built.is_none() {
            self.ctx.truncate(self.n_base);
        }
        result
    }

    /// Set the inputs of the built graph `g`, compute it and read what it gives.
    fn run_ubatch(
        &mut self,
        g: &BatchGraph,
        tokens: &[u32],
        read: bool,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.set_inputs(g, tokens)?;
        let capture = self.capture.is_some();
        if read || capture {
            self.sched.graph_compute(&mut self.ctx, &g.graph)?;
        } else {
            self.sched.graph_compute_async(&mut self.ctx, &g.graph)?;
            self.n_past += tokens.len();
            return Ok(());
        }
        self.n_past += tokens.len();
        if let Some(kept) = &mut self.capture {
            kept.clear();
            for &id in &g.captured {
                let t = &self.ctx[id];
                kept.push(Captured {
                    name: t.name.clone(),
                    ne: t.ne,
                    data: self.ctx.tensor_get_f32(id)?,
                });
            }
        }
        if read {
            let start = out.len();
            out.resize(start + self.ctx[g.logits].nelements(), 0.0);
            self.ctx.tensor_get_f32_into(g.logits, &mut out[start..])?;
        }
        Ok(())
    }

    /// Build the graph for the key's micro-batch at the end of the context's tensors and
    /// allocate it.
    fn build_ubatch(&mut self, key: GraphKey, capture: bool) -> Result<BatchGraph> {
        let g = build_graph(&mut self.ctx, &self.model, &self.kv, key, capture)?;
        // Overrides name tensor ids, which the next graph reuses: start afresh.
        self.sched.reset();
        for &(id, dev) in &g.pins {
            self.sched.set_tensor_backend(id, dev)?;
        }
        self.sched.alloc_graph(&mut self.ctx, &g.graph)?;
        Ok(g)
    }

    /// The inputs of `g` for `tokens` at the current position: token ids, positions (which
    /// also name the cache rows the batch's K and V go to) and the causal mask over the cells.
    fn set_inputs(&mut self, g: &BatchGraph, tokens: &[u32]) -> Result<()> {
        let (n, n_past) = (tokens.len(), self.n_past);
        let staging = &mut self.staging;
        staging.tokens.clear();
        staging.tokens.extend(tokens.iter().map(|&t| t as i32));
        self.ctx.tensor_set_i32(g.tokens, &staging.tokens)?;
        staging.positions.clear();
        staging
            .positions
            .extend((n_past..n_past + n).map(|p| p as i32));
        self.ctx.tensor_set_i32(g.positions, &staging.positions)?;
        let n_kv = self.ctx[g.mask].ne[0];
        staging.mask.clear();
        staging.mask.resize(n_kv * n, 0.0);
        for (i, row) in staging.mask.chunks_exact_mut(n_kv).enumerate() {
            for cell in row.iter_mut().skip(n_past + i + 1) {
                *cell = f32::NEG_INFINITY;
            }
        }
        self.ctx.tensor_set_f32(g.mask, &staging.mask)?;
        Ok(())
    }
}

/// The scheduler over the backends of `model`'s devices (and the CPU, last, when there are
/// several), and the KV-cache buffer type of each of the model's devices.
fn open_backends(
    model: &Model,
    options: &SessionOptions,
) -> Result<(Box<Scheduler>, Vec<rgml::BufferTypeRef>)> {
    let devices = model.devices();
    let mut backends = Vec::with_capacity(devices.len() + 1);
    for d in devices {
        backends.push(d.init_backend(&options.params_for(d))?);
    }
    let bufts: Vec<rgml::BufferTypeRef> =
        backends.iter().map(|b| b.default_buffer_type()).collect();
    if devices.len() == 1 {
        // One backend: one split, no copies, so one copy of the (absent) split inputs.
        let sched = Scheduler::new(backends, SchedulerOptions::default())?;
        return Ok((Box::new(sched), bufts));
    }
    // The scheduler runs what no device takes (inputs, the token embeddings in host memory)
    // on a CPU backend, which must come last.
    let cpu = rgml::registry::device("CPU")?;
    backends.push(cpu.init_backend(&options.params_for(&cpu))?);
    let sched = Scheduler::new(
        backends,
        SchedulerOptions {
            n_copies: N_COPIES_SPLIT,
            ..Default::default()
        },
    )?;
    Ok((Box::new(sched), bufts))
}

/// KV cells the attention reads: the used ones rounded up to a multiple of [`KV_PAD`] (at most
/// the allocated `cells`, itself a multiple of it), masked with -inf. llama.cpp pads the same way, and its SIMD softmax and tinyBLAS
/// dots then process whole groups of 8; computing on the same padded rows reproduces its
/// results bit for bit (the padding adds exact zeros).
fn padded_n_kv(used: usize, n_ctx: usize) -> usize {
    used.next_multiple_of(KV_PAD).min(n_ctx).max(used)
}

/// See [`padded_n_kv`].
const KV_PAD: usize = 32;

/// The LLaMA graph for a micro-batch of `key.n_tokens` tokens attending to `key.n_kv` cache
/// cells; where the batch goes in the sequence is only in its inputs (positions, mask).
fn build_graph(
    ctx: &mut Context,
    model: &Model,
    kv: &KvCache,
    key: GraphKey,
    capture: bool,
) -> Result<BatchGraph> {
    let GraphKey {
        n_tokens: n,
        n_kv,
        all_logits,
    } = key;
    let mut captured = Vec::new();
    let mut pins = Vec::new();
    // Names `id` like llama.cpp and, when capturing, keeps it.
    let mut keep = |ctx: &mut Context, id: TensorId, name: String| -> Result<TensorId> {
        // Named always, so an eval callback can pick nodes by name.
        ctx.set_name(id, name)?;
        if capture && ctx[id].is_contiguous() {
            ctx.set_output(id)?;
            captured.push(id);
        }
        Ok(id)
    };
    let c = &model.config;
    let (hd, n_embd_kv) = (c.head_dim, c.n_embd_kv());
    let f16 = DType::F16.block_bytes();

    let tokens = ctx.new_tensor(DType::I32, &[n])?;
    ctx.set_name(tokens, "inp_tokens")?;
    let positions = ctx.new_tensor(DType::I32, &[n])?;
    ctx.set_name(positions, "inp_pos")?;
    let mask = ctx.new_tensor(DType::F32, &[n_kv, n])?;
    ctx.set_name(mask, "kq_mask")?;
    for id in [tokens, positions, mask] {
        ctx.set_flags(id, TensorFlags::INPUT)?;
    }

    let mut rope = RopeParams::new(c.rope_mode, c.n_rot, c.rope_freq_base);
    rope.freq_scale = c.rope_freq_scale;
    rope.n_ctx_orig = c.n_ctx_train;
    let kq_scale = 1.0 / (hd as f32).sqrt();

    let mut graph = Graph::new();
    let mut x = ctx.get_rows(model.tok_embd, tokens)?;
    for (il, l) in model.layers.iter().enumerate() {
        let dev = model.layer_device(il).unwrap_or(0);
        let cur = ctx.rms_norm(x, c.rms_eps)?;
        pins.push((cur, dev));
        let cur = ctx.mul(cur, l.attn_norm)?;
        let cur = keep(ctx, cur, format!("attn_norm-{il}"))?;

        let mut q = ctx.mul_mat(l.wq, cur)?;
        let mut k = ctx.mul_mat(l.wk, cur)?;
        let mut v = ctx.mul_mat(l.wv, cur)?;
        if let Some(b) = l.bq {
            q = ctx.add(q, b)?;
        }
        if let Some(b) = l.bk {
            k = ctx.add(k, b)?;
        }
        if let Some(b) = l.bv {
            v = ctx.add(v, b)?;
        }
        let q = ctx.reshape(q, &[hd, c.n_head, n])?;
        let q = ctx.rope(q, positions, rope)?;
        let q = keep(ctx, q, format!("Qcur-{il}"))?;
        let k = ctx.reshape(k, &[hd, c.n_head_kv, n])?;
        let k = ctx.rope(k, positions, rope)?;
        let k = keep(ctx, k, format!("Kcur-{il}"))?;

        // Store this batch's K and V in the cache, at the rows the positions name (SET_ROWS,
        // as llama.cpp stores them): the graph then does not depend on where the batch goes,
        // so decoding reuses one graph for many tokens (see `Session::eval_ubatch`).
        let k_flat = ctx.reshape(k, &[n_embd_kv, n])?;
        let k_store = ctx.set_rows(kv.k[il], k_flat, positions)?;
        // V is stored transposed: its "rows" are single elements, one per position, in a
        // `[1, cells, n_embd_kv]` view of the cache, and the batch's values are the matching
        // `[1, n, n_embd_kv]` view of `v`.
        let v_cells = ctx.view(
            kv.v[il],
            &[1, kv.cells, n_embd_kv],
            &[f16, kv.cells * f16],
            0,
        )?;
        let f32b = DType::F32.block_bytes();
        let v_rows = ctx.view(v, &[1, n, n_embd_kv], &[n_embd_kv * f32b, f32b], 0)?;
        let v_store = ctx.set_rows(v_cells, v_rows, positions)?;

        // The stores enter the graph before anything that reads the cache, so they run first
        // (as in llama.cpp: the order of expansion is the order of execution).
        graph.expand(ctx, k_store)?;
        graph.expand(ctx, v_store)?;

        // Attention over every cached position.
        let k_all = ctx.view(
            kv.k[il],
            &[hd, c.n_head_kv, n_kv],
            &[hd * f16, n_embd_kv * f16],
            0,
        )?;
        let k_all = ctx.permute(k_all, [0, 2, 1, 3])?; // [hd, n_kv, n_head_kv]
        let q = ctx.permute(q, [0, 2, 1, 3])?; // [hd, n, n_head]
        let kq = ctx.mul_mat(k_all, q)?; // [n_kv, n, n_head]
        let kq = keep(ctx, kq, format!("kq-{il}"))?;
        let kq = ctx.soft_max_ext(kq, Some(mask), kq_scale, 0.0)?;
        let kq = keep(ctx, kq, format!("kq_soft_max-{il}"))?;
        let v_all = ctx.view(
            kv.v[il],
            &[n_kv, hd, c.n_head_kv],
            &[kv.cells * f16, kv.cells * f16 * hd],
            0,
        )?;
        let kqv = ctx.mul_mat(v_all, kq)?; // [hd, n, n_head]
        let kqv = ctx.permute(kqv, [0, 2, 1, 3])?; // [hd, n_head, n]
        let attn = ctx.cont_shape(kqv, &[c.n_embd, n])?;
        let attn = keep(ctx, attn, format!("kqv_out-{il}"))?;
        let attn = ctx.mul_mat(l.wo, attn)?;
        let attn = keep(ctx, attn, format!("attn_out-{il}"))?;
        let x_attn = ctx.add(attn, x)?;
        let x_attn = keep(ctx, x_attn, format!("ffn_inp-{il}"))?;

        let cur = ctx.rms_norm(x_attn, c.rms_eps)?;
        pins.push((cur, dev));
        let cur = ctx.mul(cur, l.ffn_norm)?;
        let cur = keep(ctx, cur, format!("ffn_norm-{il}"))?;
        let gate = ctx.mul_mat(l.ffn_gate, cur)?;
        let up = ctx.mul_mat(l.ffn_up, cur)?;
        let gate = keep(ctx, gate, format!("ffn_gate-{il}"))?;
        let up = keep(ctx, up, format!("ffn_up-{il}"))?;
        let act = ctx.swiglu(gate, up)?;
        let act = keep(ctx, act, format!("ffn_swiglu-{il}"))?;
        let down = ctx.mul_mat(l.ffn_down, act)?;
        let down = keep(ctx, down, format!("ffn_out-{il}"))?;
        x = ctx.add(down, x_attn)?;
        x = keep(ctx, x, format!("l_out-{il}"))?;
    }
    if !all_logits && n > 1 {
        // Only the last position's logits are needed: skip the output projection for the rest.
        let row = ctx[x].nb[1];
        x = ctx.view(x, &[c.n_embd, 1], &[row], (n - 1) * row)?;
    }
    let cur = ctx.rms_norm(x, c.rms_eps)?;
    pins.push((cur, model.devices().len() - 1));
    let cur = ctx.mul(cur, model.output_norm)?;
    let cur = keep(ctx, cur, "result_norm".into())?;
    let logits = ctx.mul_mat(model.output, cur)?;
    ctx.set_name(logits, "logits")?;
    ctx.set_output(logits)?;
    graph.expand(ctx, logits)?;
    Ok(BatchGraph {
        graph,
        tokens,
        positions,
        mask,
        logits,
        captured,
        pins,
    })
}
