//! Inference state: the KV cache (module `kv_cache`), the per-batch LLaMA graph (module
//! `graph`), and evaluation (here: the session, its scheduler, inputs and outputs).
//!
//! A [`Session`] owns a [`Scheduler`] over its backends and a KV cache for one model, which it
//! shares (`Arc<Model>`) with the other sessions on it. Each call to [`Session::eval`] (or
//! [`Session::decode`], which does not copy the logits out) builds the graph for one
//! micro-batch on top of the model's weight tensors, allocates it through the scheduler (whose
//! compute buffers are reused between steps), computes it and returns logits. There is one
//! execution path: a model on one device gets a scheduler with that device's backend alone
//! (one split, no copies), a split model one backend per device and the CPU. The graph
//! depends only on the batch size and the number of cache cells attended to (a multiple of
//! 64, or 256 with flash attention: see `KvCache::attended`): where the batch goes is in its inputs (the K/V stores are SET_ROWS at the
//! positions, the mask covers the cells). So the next micro-batch of the same key computes the
//! same graph again, without building or allocating anything: generation rebuilds its graph
//! once every 64 tokens, and the steps between allocate no memory. A rebuild truncates the
//! arena back to the weights and the cache, so it does not grow.
//!
//! A model split over several devices gets one backend per device plus the CPU backend (last;
//! an offloaded model's last device is the CPU already), and its graphs run through the
//! [`Scheduler`] with [`N_COPIES_SPLIT`] copies of the split inputs (pipeline parallelism);
//! each block's KV cache lives on that block's device, so the cache stores and the attention
//! reads of a block run on the same backend. Prompt micro-batches whose logits are not read
//! are only queued (`graph_compute_async`); with
//! asynchronous backends (the `CPU0`, `CPU1`, ... devices by default) several of them are then
//! in flight across the devices, and the micro-batch whose logits are read waits for them all.
//! An error of a queued micro-batch is reported by the call that reads logits.

mod batch;
mod cells;
mod embed;
mod graph;
mod kv_cache;
mod seq;

use crate::error::{LlmError, MemoryUse, Result};
use crate::model::Model;
pub use batch::BatchToken;
use batch::UbatchPlan;
use graph::{build_graph, BatchGraph, GraphKey};
use kv_cache::KvCache;
pub use seq::SeqCheckpoint;

use rgml::backend::{BackendParams, DeviceType};
use rgml::sched::{Scheduler, SchedulerOptions};
use rgml::trace::Trace;
use rgml::{Backend, Context, DType, DeviceRef, Graph};
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
    /// Sequences the session holds at once, each with its own `n_ctx` positions of KV cache
    /// (see [`Session::decode_batch`]).
    pub n_seq: usize,
    /// Whether attention runs as one FLASH_ATTN_EXT op (llama.cpp's `--flash-attn`).
    pub flash_attn: FlashAttn,
    /// The K cache's type (llama.cpp's `--cache-type-k`): one of [`CACHE_TYPES`].
    pub cache_type_k: DType,
    /// The V cache's type (llama.cpp's `--cache-type-v`): one of [`CACHE_TYPES`]; a quantized
    /// one needs flash attention, as in llama.cpp.
    pub cache_type_v: DType,
    /// The context length the model runs under (llama.cpp's `n_ctx`, the CLI's `-c`) where
    /// the session holds fewer positions than that: it picks LongRoPE's long or short factors
    /// (Phi-3 128k), as the context does in llama.cpp. `None`: `n_ctx`.
    pub context_window: Option<usize>,
    /// Compute embeddings instead of logits (llama.cpp's `--embeddings`): each output row is
    /// the token's final-normed hidden state, `n_embd` values, and the output head is not
    /// run ([`Session::embed`] pools them).
    pub embeddings: bool,
}

/// The KV cache types a session takes: llama.cpp's `--cache-type-k/v` values that rgml's
/// attention computes as ggml does (f32, f16, q8_0, q4_0).
pub const CACHE_TYPES: [DType; 4] = rgml::op::FLASH_ATTN_KV_TYPES;

/// Whether attention runs as one FLASH_ATTN_EXT op per layer (llama.cpp's `--flash-attn
/// on|off|auto`). The results differ in rounding: with it, ggml's flash-attention kernels;
/// without it, a product, a softmax and a product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttn {
    /// Always (a device without the op leaves it to the scheduler's CPU fallback).
    On,
    /// Never.
    Off,
    /// On where every device holding the model's blocks computes FLASH_ATTN_EXT on the
    /// model's shapes, else off (llama.cpp's default, resolved as it resolves it).
    #[default]
    Auto,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 2048,
            n_ubatch: 512,
            n_threads: None,
            device_params: Vec::new(),
            n_seq: 1,
            flash_attn: FlashAttn::Auto,
            cache_type_k: DType::F16,
            cache_type_v: DType::F16,
            context_window: None,
            embeddings: false,
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
            .field("n_seq", &self.n_seq)
            .field("flash_attn", &self.flash_attn)
            .field("cache_type_k", &self.cache_type_k)
            .field("cache_type_v", &self.cache_type_v)
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
    /// The RoPE frequency divisors of the session's context (see [`Model::rope_factors`]).
    rope_factors: Option<rgml::TensorId>,
    /// Runs every graph: over the model's device alone, or over its devices and the CPU.
    sched: Box<Scheduler>,
    n_ubatch: usize,
    capture: Option<Vec<Captured>>,
    /// Output rows are embeddings, not logits ([`SessionOptions::embeddings`]).
    embeddings: bool,
    /// The graph of the last micro-batch, still allocated, with what it was built for: the
    /// next micro-batch of the same shape computes it again (see [`Session::eval_ubatch`]).
    built: Option<(GraphKey, BatchGraph)>,
    /// Host copies of the inputs and of the logits, kept between calls so that decoding
    /// allocates nothing per token.
    staging: Staging,
    /// The micro-batch being evaluated, made by [`UbatchPlan::plan`]: its memory is reused
    /// for every micro-batch.
    plan: UbatchPlan,
}

/// See [`Session::staging`].
#[derive(Default)]
struct Staging {
    logits: Vec<f32>,
    /// The batch of [`Session::decode`]'s tokens (one sequence).
    batch: Vec<BatchToken>,
    /// A batch's token indices grouped by sequence, and scratch for it.
    order: Vec<usize>,
    scratch: Vec<usize>,
    /// The micro-batch being planned, in `order`.
    ubatch: Vec<BatchToken>,
    /// Per micro-batch token (in `ubatch`), its index in the batch.
    ubatch_index: Vec<usize>,
    /// Per batch token, its row in the returned logits (`usize::MAX`: none).
    out_row: Vec<usize>,
    /// A mask converted to f16 (flash attention).
    mask16: Vec<u8>,
    /// Four positions per token (multi-section RoPE).
    positions4: Vec<i32>,
    /// Zeros to clear a recurrent state row with.
    zeros: Vec<u8>,
    /// The Walsh-Hadamard matrices of quantized caches, by size.
    rotations: std::collections::HashMap<usize, Vec<f32>>,
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

impl Session {
    /// A session with an empty KV cache on `model` (cloning the `Arc` is all a further session
    /// needs).
    pub fn new(model: Arc<Model>, options: &SessionOptions) -> Result<Session> {
        if options.n_ctx == 0 || options.n_ubatch == 0 || options.n_seq == 0 {
            return Err(LlmError::BadConfig(
                "n_ctx, n_ubatch and n_seq must be positive".into(),
            ));
        }
        let (sched, bufts) = open_backends(&model, options)?;
        let flash_attn = match options.flash_attn {
            FlashAttn::On => true,
            FlashAttn::Off => false,
            FlashAttn::Auto => flash_attn_supported(&model)?,
        };
        check_cache_types(&model.config, options, flash_attn)?;
        let options = &encoder_options(&model, options, flash_attn)?;
        let mut ctx = model.ctx.clone();
        let kv = KvCache::allocate(&mut ctx, &model, &bufts, options, flash_attn)?;
        let n_base = ctx.len();
        let rope_factors = model.rope_factors(options.context_window.unwrap_or(options.n_ctx));
        Ok(Session {
            model,
            ctx,
            n_base,
            kv,
            rope_factors,
            sched,
            n_ubatch: options.n_ubatch,
            embeddings: options.embeddings,
            capture: None,
            built: None,
            staging: Staging::default(),
            plan: UbatchPlan::default(),
        })
    }

    /// Whether output rows are embeddings ([`SessionOptions::embeddings`]) instead of logits.
    pub fn embeddings(&self) -> bool {
        self.embeddings
    }

    /// Values per output row: `n_embd` in embeddings mode, else `n_vocab`.
    pub fn row_width(&self) -> usize {
        match self.embeddings {
            true => self.model.config.n_embd,
            false => self.model.config.n_vocab,
        }
    }

    /// Whether attention runs as one FLASH_ATTN_EXT op ([`SessionOptions::flash_attn`],
    /// resolved).
    pub fn flash_attn(&self) -> bool {
        self.kv.flash_attn
    }

    /// Largest number of tokens per graph (see [`Session::decode_batch`]).
    pub fn n_ubatch(&self) -> usize {
        self.n_ubatch
    }

    /// Tokens of sequence 0 in the KV cache (the position its next token goes to).
    pub fn n_past(&self) -> usize {
        self.seq_len(0)
    }

    /// Context length.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx
    }

    /// KV-cache cells per layer: the context (rounded up to 256) for global layers; a
    /// sliding-window layer's window and one micro-batch (rounded up to 256) for local ones;
    /// none for recurrent layers, which keep one state per sequence instead.
    pub fn kv_cells(&self) -> Vec<usize> {
        let c = &self.model.config;
        (0..c.n_layer)
            .map(|il| match (c.is_recurrent(il), c.is_local(il)) {
                (true, _) => 0,
                (false, true) => self.kv.local_cells,
                (false, false) => self.kv.cells,
            })
            .collect()
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

    /// Forget every sequence (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        for stream in &mut self.kv.streams {
            stream.clear();
        }
        self.plan.ready = false;
    }

    /// Append `tokens` to the sequence and return logits: `[n_vocab]` for [`Logits::Last`], or
    /// `[n_tokens * n_vocab]` (row per token) for [`Logits::All`]. [`Session::decode`] returns
    /// the same values without copying them into a new vector.
    ///
    /// Errors: [`LlmError::InvalidToken`] for an id outside the vocabulary,
    /// [`LlmError::ContextFull`] when the tokens do not fit in the rest of the context,
    /// [`LlmError::BadInput`] for no tokens; the sequence is then unchanged.
    /// [`LlmError::NonFinite`] when the logits hold NaN or infinity (the failing micro-batch is
    /// taken back and the first non-finite node named; in a model with recurrent layers,
    /// whose states cannot be taken back, its sequences are forgotten instead), [`LlmError::OutOfMemory`] when a
    /// compute buffer does not fit the device's free memory, and a
    /// [`rgml_gguf::GgufError::FileChanged`] (as [`LlmError::Gguf`]) when the mapped model file
    /// was truncated or written to. A failure of the computation itself ([`LlmError::Core`]) may
    /// leave part of a long prompt in the cache.
    pub fn eval(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.decode(tokens, which).map(<[f32]>::to_vec)
    }

    /// [`Session::eval`] into the session's own logits buffer, valid until the next call
    /// (llama.cpp's `llama_decode` + `llama_get_logits`). A micro-batch of the same size as
    /// the previous one, whose attention spans the same number of cache cells (generation:
    /// 64 tokens in a row, the attention span's padding), computes the previous graph again:
    /// nothing is built, allocated or planned, and the call allocates no memory. Errors as
    /// [`Session::eval`].
    pub fn decode(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        let mut batch = std::mem::take(&mut self.staging.batch);
        batch.clear();
        let last = tokens.len().saturating_sub(1);
        batch.extend(tokens.iter().enumerate().map(|(i, &token)| BatchToken {
            token,
            seq: 0,
            logits: which == Logits::All || i == last,
        }));
        let result = self.decode_batch(&batch).map(|_| ());
        self.staging.batch = batch;
        result?;
        Ok(&self.staging.logits)
    }

    /// Evaluate a batch of tokens of several sequences in one graph per micro-batch (each
    /// sequence's tokens attend to its own cells only), and return the logits of the tokens
    /// whose [`BatchToken::logits`] is set: `[n_vocab]` each, in batch order, valid until the
    /// next call. A sequence's logits are those it would get decoded alone: its tokens go
    /// to the same cells of its own cache stream and every attention sums over them in the
    /// same order. (The matrix products over the weights are per token too, but ggml's
    /// arithmetic for some weight types depends on how many tokens a product has, see
    /// `rgml_cpu`'s `mul_mat`: with those, a token decoded beside others can differ in the last
    /// bits from one decoded alone, as in llama.cpp.)
    ///
    /// Micro-batches: each sequence's tokens are cut every `n_ubatch` tokens from its first one
    /// in the batch (as [`Session::eval`] cuts a prompt, and llama.cpp a batch), and the pieces
    /// go whole into micro-batches of at most `n_ubatch` tokens, one piece per sequence each,
    /// in order: a sequence's tokens are evaluated in the same pieces as they would be alone.
    ///
    /// Errors as [`Session::eval`]; a token of a sequence outside the session's
    /// [`n_seq`](SessionOptions::n_seq) is [`LlmError::BadInput`]. Checks fail before anything
    /// is computed, leaving every sequence as it was.
    pub fn decode_batch(&mut self, batch: &[BatchToken]) -> Result<&[f32]> {
        self.check_batch(batch)?;
        self.model.check_file()?;
        let mut out = std::mem::take(&mut self.staging.logits);
        out.clear();
        let result = self.decode_batch_into(batch, &mut out);
        self.staging.logits = out;
        // A model file that changed during the computation explains any result: it is the
        // error (after a success too, as the weights read may have been garbage).
        if let Err(changed) = self.model.check_file() {
            self.staging.logits.clear();
            return Err(changed);
        }
        if let Err(e) = result {
            self.staging.logits.clear();
            return Err(e);
        }
        Ok(&self.staging.logits)
    }

    /// The logits of the last [`Session::eval`] or [`Session::decode`]: empty before the first
    /// and after one whose computation failed; a call refused by its input checks (no tokens,
    /// a full context, a token outside the vocabulary) leaves the previous logits.
    pub fn logits(&self) -> &[f32] {
        &self.staging.logits
    }

    /// [`Session::decode_batch`] after its checks: the batch grouped by sequence and cut into
    /// micro-batches, their logits into `out` in batch order.
    fn decode_batch_into(&mut self, batch: &[BatchToken], out: &mut Vec<f32>) -> Result<()> {
        let st = &mut self.staging;
        batch::group_order(batch, self.kv.n_seq, &mut st.scratch, &mut st.order);
        st.out_row.clear();
        let mut n_out = 0;
        for t in batch {
            st.out_row.push(if t.logits { n_out } else { usize::MAX });
            n_out += usize::from(t.logits);
        }
        let width = self.row_width();
        out.resize(n_out * width, 0.0);
        let mut next = 0;
        while next < batch.len() {
            let st = &mut self.staging;
            next = batch::next_ubatch(batch, &st.order, next, self.n_ubatch, &mut st.ubatch_index);
            st.ubatch.clear();
            st.ubatch.extend(st.ubatch_index.iter().map(|&k| batch[k]));
            let ubatch = std::mem::take(&mut st.ubatch);
            // Micro-batches whose logits are not read are only queued: on several devices the
            // scheduler's pipeline then keeps several of them in flight. The read one waits
            // for all of them (and reports their errors).
            let read = ubatch.iter().any(|t| t.logits);
            let result = self.eval_ubatch(&ubatch, read, out);
            self.staging.ubatch = ubatch;
            if let Err(e) = result {
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
        let mut batch = std::mem::take(&mut self.staging.batch);
        batch.clear();
        batch.extend(tokens.iter().map(|&token| BatchToken {
            token,
            seq: 0,
            logits: false,
        }));
        if let Some(last) = batch.last_mut() {
            last.logits = true;
        }
        let result = self.batch_graph(&batch);
        self.staging.batch = batch;
        Ok((&self.ctx, result?.graph))
    }

    /// A batch's checks: its sequences and tokens ([`batch::check_batch`]), and for an encoder
    /// its sequences within the position embeddings.
    fn check_batch(&mut self, batch: &[BatchToken]) -> Result<()> {
        let n_vocab = self.model.config.n_vocab;
        batch::check_batch(&self.kv, batch, n_vocab, &mut self.staging.scratch)?;
        if self.model.encoder.is_some() {
            embed::check_positions(&self.model.config, batch, self.kv.n_seq)?;
        }
        Ok(())
    }

    /// [`Session::prompt_graph`] for a batch: built, allocated and with its inputs set.
    fn batch_graph(&mut self, batch: &[BatchToken]) -> Result<BatchGraph> {
        self.check_batch(batch)?;
        if batch.len() > self.n_ubatch {
            return Err(LlmError::BadInput(format!(
                "{} tokens do not fit in one micro-batch of {}",
                batch.len(),
                self.n_ubatch
            )));
        }
        self.built = None;
        self.ctx.truncate(self.n_base);
        let st = &mut self.staging;
        batch::group_order(batch, self.kv.n_seq, &mut st.scratch, &mut st.order);
        st.ubatch.clear();
        st.ubatch.extend(st.order.iter().map(|&k| batch[k]));
        self.plan.plan(&self.kv, &self.staging.ubatch)?;
        let key = self.plan.key.clone();
        let g = self.build_ubatch(&key, true)?;
        self.set_inputs(&g)?;
        self.plan.ready = false;
        Ok(g)
    }

    /// Runs `run`, which builds and computes a graph of its own in the session's context (the
    /// K-shift, mean pooling): after the queued micro-batches, in place of the kept
    /// micro-batch graph (whose tensors it replaces), and with the context cut back after.
    fn own_graph<T>(&mut self, run: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
        self.sched.synchronize()?;
        self.built = None;
        self.ctx.truncate(self.n_base);
        let result = run(self);
        self.ctx.truncate(self.n_base);
        result
    }

    /// The micro-batch just computed is in the cache: its streams' cells become the plan's
    /// (and the plan keeps the cells as they were, to take the micro-batch back).
    fn commit_ubatch(&mut self) {
        if !self.plan.ready {
            return;
        }
        for &seq in &self.plan.touched {
            std::mem::swap(&mut self.kv.streams[seq], &mut self.plan.after[seq]);
        }
        self.plan.ready = false;
    }

    /// Take back the micro-batch [`Session::commit_ubatch`] just committed.
    fn uncommit_ubatch(&mut self) {
        for &seq in &self.plan.touched {
            std::mem::swap(&mut self.kv.streams[seq], &mut self.plan.after[seq]);
        }
    }

    /// Evaluate the micro-batch in `ubatch` (grouped by sequence; `staging.ubatch_index` maps
    /// it to the batch), writing its logits to their rows of `out` when `read`. Unless `read`
    /// (or capture is on), the scheduler only queues it.
    ///
    /// The graph of the previous micro-batch is computed again when its key matches: it is
    /// still allocated (the graph allocator and the scheduler keep their buffers until the next
    /// allocation), only the inputs change. Otherwise (or with capture on, whose graphs differ)
    /// the graph is built and allocated afresh, replacing the old one's tensors. After an error
    /// the graph is dropped, so the next call starts clean.
    fn eval_ubatch(&mut self, ubatch: &[BatchToken], read: bool, out: &mut [f32]) -> Result<()> {
        let capture = self.capture.is_some();
        self.plan.plan(&self.kv, ubatch)?;
        let graph = match self.built.take() {
            Some((built_key, g)) if built_key == self.plan.key && !capture => Ok((built_key, g)),
            _ => {
                self.ctx.truncate(self.n_base);
                let key = self.plan.key.clone();
                self.build_ubatch(&key, capture).map(|g| (key, g))
            }
        };
        let result = graph.and_then(|(key, g)| {
            let r = self
                .clear_fresh_states()
                .and_then(|()| self.run_ubatch(&g, ubatch, read, out));
            if r.is_ok() && !capture {
                self.built = Some((key, g));
            }
            r
        });
        if self.built.is_none() {
            self.ctx.truncate(self.n_base);
        }
        if let Err(LlmError::NonFinite { first: None }) = result {
            let first = self.find_non_finite(ubatch);
            self.forget_recurrent(ubatch);
            return Err(LlmError::NonFinite { first });
        }
        result
    }

    /// Zero the recurrent states of the micro-batch's sequences that hold no position yet
    /// (new ones, or ones cleared since), as llama.cpp clears a sequence's fresh cell: their
    /// first tokens start from zero states.
    fn clear_fresh_states(&mut self) -> Result<()> {
        if self.model.config.recurrent.is_none() {
            return Ok(());
        }
        let fresh: Vec<usize> = (self.plan.key.groups.iter())
            .map(|g| g.stream)
            .filter(|&s| self.kv.streams[s].global.used() == 0)
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        // Queued micro-batches may still read and write the states.
        self.sched.synchronize()?;
        for stream in fresh {
            for t in self.kv.conv.iter().chain(&self.kv.ssm).flatten() {
                let row = self.ctx[*t].nb[1];
                self.staging.zeros.resize(row, 0);
                self.ctx.tensor_set(*t, stream * row, &self.staging.zeros)?;
            }
        }
        Ok(())
    }

    /// After a micro-batch whose logits were not finite: a recurrent state cannot be taken
    /// back (the graph updated it in place), so the micro-batch's sequences are forgotten
    /// in a model that has one, rather than kept with a state that does not match them.
    fn forget_recurrent(&mut self, ubatch: &[BatchToken]) {
        if self.model.config.recurrent.is_none() {
            return;
        }
        for t in ubatch {
            if let Some(stream) = self.kv.streams.get_mut(t.seq) {
                stream.clear();
            }
        }
    }

    /// Set the inputs of the built graph `g`, compute it and read what it gives.
    fn run_ubatch(
        &mut self,
        g: &BatchGraph,
        ubatch: &[BatchToken],
        read: bool,
        out: &mut [f32],
    ) -> Result<()> {
        self.set_inputs(g)?;
        let capture = self.capture.is_some();
        if read || capture {
            self.sched.graph_compute(&mut self.ctx, &g.graph)?;
        } else {
            self.sched.graph_compute_async(&mut self.ctx, &g.graph)?;
            self.commit_ubatch();
            return Ok(());
        }
        self.commit_ubatch();
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
            self.read_logits(g, ubatch, out)?;
        }
        Ok(())
    }

    /// Copy the micro-batch's logits to their rows of `out` (batch order); non-finite logits
    /// take the micro-batch back, so that its sequences are as before it.
    fn read_logits(
        &mut self,
        g: &BatchGraph,
        ubatch: &[BatchToken],
        out: &mut [f32],
    ) -> Result<()> {
        // Values per row: logits, or embeddings in that mode.
        let width = self.row_width();
        let st = &self.staging;
        let rows = ubatch
            .iter()
            .zip(&st.ubatch_index)
            .filter(|(t, _)| t.logits)
            .map(|(_, &k)| st.out_row[k]);
        let n_rows = self.ctx[g.logits].nelements() / width.max(1);
        // One row computed when none is wanted (`OutputKey::Last` of an unread micro-batch).
        let first_row = rows.clone().next();
        let contiguous = rows
            .clone()
            .zip(first_row.unwrap_or(0)..)
            .all(|(r, e)| r == e);
        let Some(first_row) = first_row else {
            return Ok(());
        };
        let n_wanted = rows.clone().count();
        if n_wanted != n_rows {
            return Err(LlmError::BadInput(format!(
                "{n_rows} rows of logits computed for {n_wanted} wanted"
            )));
        }
        let span = first_row * width..(first_row + n_rows) * width;
        if contiguous {
            self.ctx
                .tensor_get_f32_into(g.logits, &mut out[span.clone()])?;
        } else {
            let all = self.ctx.tensor_get_f32(g.logits)?;
            for (i, r) in rows.enumerate() {
                out[r * width..(r + 1) * width].copy_from_slice(&all[i * width..(i + 1) * width]);
            }
        }
        let st = &self.staging;
        let finite = ubatch
            .iter()
            .zip(&st.ubatch_index)
            .filter(|(t, _)| t.logits)
            .all(|(_, &k)| {
                let r = st.out_row[k];
                out[r * width..(r + 1) * width]
                    .iter()
                    .all(|l| l.is_finite())
            });
        if !finite {
            self.uncommit_ubatch();
            return Err(LlmError::NonFinite { first: None });
        }
        Ok(())
    }

    /// After non-finite logits: compute the micro-batch again with every named node kept and
    /// name the first whose values are not finite (`None` if none is, or the check itself
    /// fails). The micro-batch's cache rows are written again with the same values; its
    /// sequences do not advance.
    fn find_non_finite(&mut self, ubatch: &[BatchToken]) -> Option<String> {
        self.built = None;
        self.ctx.truncate(self.n_base);
        self.plan.plan(&self.kv, ubatch).ok()?;
        let key = self.plan.key.clone();
        let found = self.build_ubatch(&key, true).ok().and_then(|g| {
            self.set_inputs(&g).ok()?;
            self.sched.graph_compute(&mut self.ctx, &g.graph).ok()?;
            let first = g.captured.iter().copied().find(|&id| {
                self.ctx
                    .tensor_get_f32(id)
                    .is_ok_and(|v| v.iter().any(|x| !x.is_finite()))
            })?;
            Some(describe_node(&self.ctx, first))
        });
        self.plan.ready = false;
        self.ctx.truncate(self.n_base);
        found
    }

    /// Build the graph for the key's micro-batch at the end of the context's tensors and
    /// allocate it.
    fn build_ubatch(&mut self, key: &GraphKey, capture: bool) -> Result<BatchGraph> {
        let g = build_graph(
            &mut self.ctx,
            &self.model,
            &self.kv,
            key,
            capture,
            self.rope_factors,
            self.embeddings,
        )?;
        // Overrides name tensor ids, which the next graph reuses: start afresh.
        self.sched.reset();
        for &(id, dev) in &g.pins {
            self.sched.set_tensor_backend(id, dev)?;
        }
        self.sched
            .alloc_graph(&mut self.ctx, &g.graph)
            .map_err(|e| LlmError::memory(e, MemoryUse::Compute))?;
        Ok(g)
    }

    /// The inputs of `g` from the plan: token ids, positions, the tokens' cache rows, the
    /// masks over each sequence's cells, the output rows.
    fn set_inputs(&mut self, g: &BatchGraph) -> Result<()> {
        let plan = &self.plan;
        self.ctx.tensor_set_i32(g.tokens, &plan.tokens)?;
        match self.ctx[g.positions].ne[0] / plan.positions.len().max(1) {
            4 => {
                // A text token's four RoPE positions: its position thrice, then 0.
                let pos = &mut self.staging.positions4;
                pos.clear();
                for _ in 0..3 {
                    pos.extend_from_slice(&plan.positions);
                }
                pos.resize(4 * plan.positions.len(), 0);
                self.ctx.tensor_set_i32(g.positions, pos)?;
            }
            _ => self.ctx.tensor_set_i32(g.positions, &plan.positions)?,
        }
        self.ctx.tensor_set_i32(g.kv_rows, &plan.kv_rows)?;
        if let Some(rows) = g.local_rows {
            self.ctx.tensor_set_i32(rows, &plan.local_rows)?;
        }
        if let Some(ids) = g.out_ids {
            self.ctx.tensor_set_i32(ids, &plan.out_ids)?;
        }
        for rot in g.rotations.into_iter().flatten() {
            let n = self.ctx[rot].ne[0];
            let matrix = self
                .staging
                .rotations
                .entry(n)
                .or_insert_with(|| kv_cache::hadamard_matrix(n));
            self.ctx.tensor_set_f32(rot, matrix)?;
        }
        let (mut at, mut at_local) = (0, 0);
        for (group, &(mask, local_mask)) in plan.key.groups.iter().zip(&g.masks) {
            let n = group.n_kv * group.n_tokens;
            set_mask(
                &self.ctx,
                mask,
                &plan.masks[at..at + n],
                &mut self.staging.mask16,
            )?;
            at += n;
            if let Some(local_mask) = local_mask {
                let n = group.n_kv_local * group.n_tokens;
                let values = &plan.local_masks[at_local..at_local + n];
                set_mask(&self.ctx, local_mask, values, &mut self.staging.mask16)?;
                at_local += n;
            }
        }
        Ok(())
    }
}

/// A mask input from its f32 values (0 or `-inf`): as they are, or converted (exactly) for an
/// f16 mask through `scratch`.
fn set_mask(
    ctx: &Context,
    mask: rgml::TensorId,
    values: &[f32],
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let dtype = ctx[mask].dtype;
    if dtype != rgml::DType::F16 {
        return Ok(ctx.tensor_set_f32(mask, values)?);
    }
    scratch.resize(2 * values.len(), 0);
    rgml::quant::quantize_row(dtype, values, scratch)?;
    Ok(ctx.tensor_set(mask, 0, scratch)?)
}

/// The scheduler over the backends of `model`'s devices (and the CPU, last, when there are
/// several and the last is not it), and the KV-cache buffer type of each of the model's
/// devices.
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
    let cpu = rgml::registry::device("CPU")?;
    // A model on one GPU (or RPC server) still needs the CPU for the ops that device may not
    // have (the experts' ARGSORT and MUL_MAT_ID, Gemma's soft-capping TANH, Qwen3.5's
    // multi-section ROPE, ...): the scheduler falls back to it, and leaves a graph the device
    // takes whole in one split.
    let alone = devices.len() == 1 && rgml::backend::same_instance(&devices[0], &cpu);
    if alone {
        // One backend: one split, no copies, so one copy of the (absent) split inputs.
        let sched = Scheduler::new(backends, SchedulerOptions::default())?;
        return Ok((Box::new(sched), bufts));
    }
    // The scheduler runs what no device takes (inputs, the token embeddings in host memory)
    // on a CPU backend, which must come last: the model's last device when that is the
    // registry's CPU (an offloaded model: GPU, CPU), else one more.
    let last_is_cpu = devices
        .last()
        .is_some_and(|d| rgml::backend::same_instance(d, &cpu));
    if !last_is_cpu {
        backends.push(cpu.init_backend(&options.params_for(&cpu))?);
    }
    let sched = Scheduler::new(
        backends,
        SchedulerOptions {
            n_copies: N_COPIES_SPLIT,
            ..Default::default()
        },
    )?;
    Ok((Box::new(sched), bufts))
}

/// The options of a session on an encoder (non-causal attention), which llama.cpp runs
/// without a KV cache: embeddings only, and the cache of the types its attention reads K and V
/// in (f16, as llama.cpp casts them for flash attention; f32 without, as computed). Another
/// requested cache type is refused. A decoder's options as they are.
fn encoder_options<'o>(
    model: &Model,
    options: &'o SessionOptions,
    flash_attn: bool,
) -> Result<std::borrow::Cow<'o, SessionOptions>> {
    let c = &model.config;
    if c.kind.is_encoder() && !options.embeddings {
        return Err(LlmError::BadConfig(format!(
            "a {} model computes embeddings only: it has no output head for logits",
            c.arch
        )));
    }
    if c.causal {
        return Ok(std::borrow::Cow::Borrowed(options));
    }
    for (flag, t) in [("k", options.cache_type_k), ("v", options.cache_type_v)] {
        if t != DType::F16 {
            return Err(LlmError::BadConfig(format!(
                "--cache-type-{flag} {t}: a model with non-causal attention ({}) keeps no KV \
                 cache between calls, so it takes no cache type",
                c.arch
            )));
        }
    }
    let t = if flash_attn { DType::F16 } else { DType::F32 };
    let mut options = options.clone();
    (options.cache_type_k, options.cache_type_v) = (t, t);
    Ok(std::borrow::Cow::Owned(options))
}

/// The cache types are ones the attention computes: [`CACHE_TYPES`], quantized ones on rows of
/// whole blocks per head, and a quantized V only with flash attention (llama.cpp refuses it
/// without, too: the transposed V would be quantized across cells).
fn check_cache_types(
    c: &crate::ModelConfig,
    options: &SessionOptions,
    flash_attn: bool,
) -> Result<()> {
    for (flag, t) in [("k", options.cache_type_k), ("v", options.cache_type_v)] {
        if !CACHE_TYPES.contains(&t) {
            return Err(LlmError::BadConfig(format!(
                "--cache-type-{flag} {t}: not a KV cache type rgml computes (f32, f16, q8_0, q4_0)"
            )));
        }
        let mut widths = (0..c.n_layer).map(|il| c.heads(il).head_dim);
        if let Some(hd) = widths.find(|hd| !hd.is_multiple_of(t.block_size())) {
            return Err(LlmError::BadConfig(format!(
                "--cache-type-{flag} {t}: the head size {hd} is not a whole number of {t} blocks"
            )));
        }
    }
    let quantized_v = !matches!(options.cache_type_v, DType::F16 | DType::F32);
    if quantized_v && !flash_attn {
        return Err(LlmError::BadConfig(format!(
            "--cache-type-v {}: a quantized V cache needs flash attention (-fa on)",
            options.cache_type_v
        )));
    }
    Ok(())
}

/// Whether every device holding `model`'s blocks computes FLASH_ATTN_EXT on its shapes.
fn flash_attn_supported(model: &Model) -> Result<bool> {
    let devices = model.devices();
    // One probe per device and shape of heads (most layers share one).
    let mut asked = Vec::new();
    for il in 0..model.config.n_layer {
        let key = (model.layer_device(il).unwrap_or(0), model.config.heads(il));
        if asked.contains(&key) {
            continue;
        }
        let (ctx, fa) = flash_attn_probe_layer(&model.config, il)?;
        if !devices.get(key.0).is_some_and(|d| d.supports_op(&ctx, fa)) {
            return Ok(false);
        }
        asked.push(key);
    }
    Ok(true)
}

/// A FLASH_ATTN_EXT node of a model's shapes, to ask a device whether it computes it
/// ([`rgml::backend::Device::supports_op`]; [`FlashAttn::Auto`] asks each device holding the
/// model's blocks): one query over an f16 cache of 512 cells with an f16 mask.
pub fn flash_attn_probe(config: &crate::ModelConfig) -> Result<(Context, rgml::TensorId)> {
    flash_attn_probe_layer(config, 0)
}

/// [`flash_attn_probe`] with layer `il`'s heads.
fn flash_attn_probe_layer(
    config: &crate::ModelConfig,
    il: usize,
) -> Result<(Context, rgml::TensorId)> {
    let (c, h) = (config, config.heads(il));
    let mut ctx = Context::new();
    let cells = 512;
    let q = ctx.new_tensor(rgml::DType::F32, &[h.head_dim, 1, h.n_head])?;
    let k = ctx.new_tensor(rgml::DType::F16, &[h.head_dim, cells, h.n_head_kv])?;
    let v = ctx.new_tensor(rgml::DType::F16, &[h.head_dim, cells, h.n_head_kv])?;
    let mask = ctx.new_tensor(rgml::DType::F16, &[cells, 1])?;
    let fa = ctx.flash_attn_ext(q, k, v, Some(mask), None, c.attn_scale, 0.0, 0.0)?;
    Ok((ctx, fa))
}

/// `'name' (OP of 'src0', 'src1')`: a node as an error message names it.
fn describe_node(ctx: &Context, id: rgml::TensorId) -> String {
    let t = &ctx[id];
    let sources: Vec<String> = t
        .src
        .iter()
        .map(|&s| format!("'{}'", ctx[s].display_name()))
        .collect();
    format!(
        "'{}' ({} of {})",
        t.display_name(),
        t.op.kind(),
        sources.join(", ")
    )
}
