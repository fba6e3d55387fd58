//! The shared blocks every architecture's graph is made of: RMS norms, Q/K/V with biases,
//! QK-norm and RoPE, the KV-cache stores, attention (global or sliding-window, GQA), gated
//! FFNs, the output head; and llama.cpp's node names for them.
//!
//! This module owns [`Builder`], which adds those nodes to a context for one micro-batch; what
//! a block is made of is each architecture's business.

use super::{AttentionWeights, LayerWeights, Matrix, Mixer, PerLayerEmbeddings, QkvWeights};
use crate::config::{FfnActivation, ModelConfig};
use crate::error::Result;
use rgml::{Context, DType, Graph, RopeParams, TensorId};

/// What the graph reads of a loaded model.
pub(crate) struct GraphModel<'a> {
    pub(crate) config: &'a ModelConfig,
    pub(crate) tok_embd: TensorId,
    /// `None`: an encoder, whose last block is its output.
    pub(crate) output_norm: Option<TensorId>,
    /// `None`: an encoder, which has no output head.
    pub(crate) output: Option<TensorId>,
    /// Per-pair RoPE frequency divisors (`rope_freqs.weight`: Llama 3.1's scaling; LongRoPE's
    /// factors for the session's context).
    pub(crate) rope_freqs: Option<TensorId>,
    /// Bias of the output projection (Qwen2's `output.bias`).
    pub(crate) output_bias: Option<TensorId>,
    /// Per-layer token embeddings (Gemma 4).
    pub(crate) per_layer_embd: Option<PerLayerEmbeddings>,
    /// An encoder's position and token-type embeddings and input norm (BERT).
    pub(crate) encoder: Option<super::EncoderInput>,
    pub(crate) layers: &'a [LayerWeights],
    /// Per block, the index of its device.
    pub(crate) layer_devices: &'a [usize],
    /// The index of the output head's device.
    pub(crate) output_device: usize,
}

/// The KV cache's tensors: K `[n_embd_kv, n_seq * cells]` per layer, and V the same with flash
/// attention, else transposed `[n_seq * cells, n_embd_kv]` (a stream's cells after another's),
/// of the cache types (f16 by default; quantized rows of whole blocks per head); local layers
/// have `local_cells` cells per stream.
pub(crate) struct CacheView<'a> {
    /// Per layer, K and V (`None`: a recurrent layer).
    pub(crate) k: &'a [Option<TensorId>],
    pub(crate) v: &'a [Option<TensorId>],
    /// Per layer, the recurrent layers' states: the convolution's `[conv_state_len, n_seq]`
    /// and the delta net's `[ssm_state_len, n_seq]` (f32; row `s` is stream `s`'s).
    pub(crate) conv: &'a [Option<TensorId>],
    pub(crate) ssm: &'a [Option<TensorId>],
    pub(crate) n_seq: usize,
    pub(crate) cells: usize,
    pub(crate) local_cells: usize,
    /// Attention is one FLASH_ATTN_EXT op (V not transposed; f16 masks).
    pub(crate) flash_attn: bool,
}

/// The graph inputs a micro-batch of `n` tokens reads.
pub(crate) struct BatchInputs<'g> {
    pub(crate) n: usize,
    /// The tokens' positions (RoPE).
    pub(crate) positions: TensorId,
    /// Each token's row in the global layers' cache (`stream * cells + cell`).
    pub(crate) kv_rows: TensorId,
    /// Each token's row in the local layers' cache, where the model has local layers.
    pub(crate) local_rows: Option<TensorId>,
    /// The tokens of each sequence, consecutive, and what their attention reads.
    pub(crate) groups: &'g [GroupInputs],
    /// The groups' token counts (the rows of each sequence, in order).
    pub(crate) row_groups: &'g [usize],
    /// Which rows' logits are computed.
    pub(crate) outputs: Outputs,
    /// How many of the output rows each sequence has, in order.
    pub(crate) out_groups: &'g [usize],
    /// llama.cpp's rotations for quantized caches (Walsh-Hadamard matrices): of Q and K where
    /// K is quantized, of V (and back, of the attention output) where V is.
    pub(crate) k_rot: Option<TensorId>,
    pub(crate) v_rot: Option<TensorId>,
    /// The local layers' rotations (their own cache's, as llama.cpp's).
    pub(crate) local_k_rot: Option<TensorId>,
    pub(crate) local_v_rot: Option<TensorId>,
}

/// The tokens of one sequence in a micro-batch: `n` of them from token `first`, in cache
/// stream `stream`, attending to the stream's first `n_kv` cells (`n_kv_local` in the local
/// layers) under their masks `[n_kv, n]`.
pub(crate) struct GroupInputs {
    pub(crate) stream: usize,
    pub(crate) first: usize,
    pub(crate) n: usize,
    pub(crate) n_kv: usize,
    pub(crate) mask: TensorId,
    pub(crate) n_kv_local: usize,
    pub(crate) local_mask: Option<TensorId>,
}

/// The rows of the last block's output that go through the output head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outputs {
    /// Every token's.
    All,
    /// The last token's (a view).
    Last,
    /// The rows listed in this `[n_out]` i32 input (llama.cpp's `inp_out_ids`).
    Rows(TensorId),
}

/// `x` rotated by the Walsh-Hadamard matrix `rot` (`n × n`) in runs of `n` values, in `x`'s
/// shape (llama.cpp's `llama_mul_mat_hadamard`; the matrix is its own inverse, so the same
/// product undoes it).
pub(crate) fn hadamard(ctx: &mut Context, rot: TensorId, x: TensorId) -> Result<TensorId> {
    let (n, ne) = (ctx[rot].ne[0], ctx[x].ne);
    let x = match ctx[x].is_contiguous() {
        true => x,
        false => ctx.cont(x)?,
    };
    let rows = ctx.reshape(x, &[n, ne.iter().product::<usize>() / n])?;
    let y = ctx.mul_mat_hadamard(rot, rows)?;
    Ok(ctx.reshape(y, &ne)?)
}

/// A layer's cache tensor, or the error of a layer without one.
fn no_cache(t: Option<TensorId>, il: usize) -> Result<TensorId> {
    t.ok_or_else(|| crate::LlmError::BadConfig(format!("layer {il} has no KV cache")))
}

/// The attention weights of a block that attends.
pub(crate) fn attention_weights(l: &LayerWeights) -> Result<&AttentionWeights> {
    match &l.mixer {
        Mixer::Attention(a) => Ok(a),
        Mixer::DeltaNet(_) => Err(crate::LlmError::BadConfig(
            "a delta-net layer where attention was expected".into(),
        )),
    }
}

/// RoPE of block `il`: the local layers' base and scale where it is local.
pub(crate) fn rope_params(c: &ModelConfig, il: usize) -> RopeParams {
    let (base, scale) = match &c.sliding_window {
        Some(w) if c.is_local(il) => (w.rope_freq_base, w.rope_freq_scale),
        _ => (c.rope_freq_base, c.rope_freq_scale),
    };
    let mut rope = RopeParams::new(c.rope_mode, c.heads(il).n_rot, base);
    rope.freq_scale = scale;
    rope.attn_factor = c.rope_attn_factor;
    rope.ext_factor = c.rope_ext_factor;
    rope.n_ctx_orig = c.n_ctx_orig;
    rope
}

/// The RoPE frequency factors block `il` divides by: the model's, unless it is a local layer
/// of a model whose local layers take none (Gemma 4).
pub(crate) fn layer_rope_factors(
    c: &ModelConfig,
    il: usize,
    factors: Option<TensorId>,
) -> Option<TensorId> {
    match &c.sliding_window {
        Some(w) if c.is_local(il) && !w.rope_factors => None,
        _ => factors,
    }
}

/// What the blocks share while they add their nodes.
pub(crate) struct Builder<'a> {
    ctx: &'a mut Context,
    model: GraphModel<'a>,
    kv: CacheView<'a>,
    inputs: BatchInputs<'a>,
    capture: bool,
    pub(crate) captured: Vec<TensorId>,
    /// Nodes to run on a given device (see `BatchGraph::pins`).
    pub(crate) pins: Vec<(TensorId, usize)>,
    pub(crate) graph: Graph,
    /// The per-layer inputs `[n_embd_per_layer, n, n_layer]` (Gemma 4), once made.
    pub(crate) per_layer_inputs: Option<TensorId>,
}

impl<'a> Builder<'a> {
    pub(crate) fn new(
        ctx: &'a mut Context,
        model: GraphModel<'a>,
        kv: CacheView<'a>,
        inputs: BatchInputs<'a>,
        capture: bool,
    ) -> Builder<'a> {
        Builder {
            ctx,
            model,
            kv,
            inputs,
            capture,
            captured: Vec::new(),
            pins: Vec::new(),
            graph: Graph::new(),
            per_layer_inputs: None,
        }
    }

    pub(crate) fn ctx(&mut self) -> &mut Context {
        self.ctx
    }

    pub(crate) fn model(&self) -> &GraphModel<'a> {
        &self.model
    }

    /// The tokens' positions (an input).
    pub(crate) fn positions(&self) -> TensorId {
        self.inputs.positions
    }

    /// Whether the micro-batch is one sequence's tokens (llama.cpp's node names are kept).
    pub(crate) fn one_sequence(&self) -> bool {
        self.inputs.row_groups.len() <= 1
    }

    pub(crate) fn config(&self) -> &'a ModelConfig {
        self.model.config
    }

    /// The device of block `il` (0 past the last).
    fn device(&self, il: usize) -> usize {
        self.model.layer_devices.get(il).copied().unwrap_or(0)
    }

    /// Names `id` like llama.cpp and, when capturing, keeps it.
    pub(crate) fn keep(&mut self, id: TensorId, name: String) -> Result<TensorId> {
        // Named always, so an eval callback can pick nodes by name.
        self.ctx.set_name(id, name)?;
        if self.capture && self.ctx[id].is_contiguous() {
            self.ctx.set_output(id)?;
            self.captured.push(id);
        }
        Ok(id)
    }

    /// `m · x`, then its scale, then its bias (llama.cpp's attention projections:
    /// `build_lora_mm` with the scale, the bias after).
    pub(crate) fn linear(&mut self, m: &Matrix, x: TensorId) -> Result<TensorId> {
        let mut y = self.project(m.w, x)?;
        if let Some(s) = m.scale {
            y = self.ctx.mul(y, s)?;
        }
        if let Some(b) = m.bias {
            y = self.ctx.add(y, b)?;
        }
        Ok(y)
    }

    /// `m · x`, then its bias, then its scale (llama.cpp's `build_ffn` order).
    pub(crate) fn linear_ffn(&mut self, m: &Matrix, x: TensorId) -> Result<TensorId> {
        let mut y = self.project(m.w, x)?;
        if let Some(b) = m.bias {
            y = self.ctx.add(y, b)?;
        }
        if let Some(s) = m.scale {
            y = self.ctx.mul(y, s)?;
        }
        Ok(y)
    }

    /// `w · x` for rows `x` of the micro-batch (all of them, or the output rows), each
    /// sequence's rows computed as they are alone (see [`Builder::by_sequence`]).
    pub(crate) fn project(&mut self, w: TensorId, x: TensorId) -> Result<TensorId> {
        self.by_sequence(x, &mut |b, part, alone| match alone {
            true => Ok(b.ctx.mul_mat_rows_alone(w, part)?),
            false => Ok(b.ctx.mul_mat(w, part)?),
        })
    }

    /// `f` of the rows `x` `[ne0, rows]` of the micro-batch (all of them, or the output
    /// rows), each sequence's rows given to `f` as a part of their own: ggml's CPU arithmetic
    /// of a product depends on its row count, so one sequence's rows are one product; runs of
    /// sequences with one row each (generation steps) are one part with `alone` set, for `f`
    /// to compute row by row as alone ([`Context::mul_mat_rows_alone`]). The parts' results
    /// `[_, rows of the part]` are concatenated in order; with one sequence, `f(x, false)`.
    pub(crate) fn by_sequence(
        &mut self,
        x: TensorId,
        f: &mut dyn FnMut(&mut Self, TensorId, bool) -> Result<TensorId>,
    ) -> Result<TensorId> {
        self.by_sequence_at(x, &mut |b, part, _, alone| f(b, part, alone))
    }

    /// [`Builder::by_sequence`] with each part's first row in `x` given to `f` too, for `f`
    /// to take the same rows of other tensors.
    pub(crate) fn by_sequence_at(
        &mut self,
        x: TensorId,
        f: &mut dyn FnMut(&mut Self, TensorId, usize, bool) -> Result<TensorId>,
    ) -> Result<TensorId> {
        let rows = self.ctx[x].ne[1];
        let groups = match rows == self.inputs.n {
            true => self.inputs.row_groups,
            false => self.inputs.out_groups,
        };
        if groups.len() <= 1 || groups.iter().sum::<usize>() != rows {
            return f(self, x, 0, false);
        }
        let mut out: Option<TensorId> = None;
        let (mut first, mut i) = (0, 0);
        while i < groups.len() {
            let singles = groups[i..].iter().take_while(|&&g| g == 1).count();
            let (n, alone) = match singles {
                0 => (groups[i], false),
                _ => (singles, true),
            };
            i += singles.max(1);
            let part = match n == rows {
                true => x,
                false => {
                    let (ne0, nb1) = (self.ctx[x].ne[0], self.ctx[x].nb[1]);
                    self.ctx.view(x, &[ne0, n], &[nb1], first * nb1)?
                }
            };
            let result = f(self, part, first, alone)?;
            out = Some(self.append_rows(out, result)?);
            first += n;
        }
        out.ok_or_else(|| crate::LlmError::BadInput("an empty batch".into()))
    }

    /// Add `t` and what it reads to the graph now (llama.cpp's `ggml_build_forward_expand`:
    /// the order of expansion is the order of execution).
    pub(crate) fn expand(&mut self, t: TensorId) -> Result<()> {
        Ok(self.graph.expand(self.ctx, t)?)
    }

    /// `rows` after the rows of `before` (dim 1), or `rows` alone.
    pub(crate) fn append_rows(
        &mut self,
        before: Option<TensorId>,
        rows: TensorId,
    ) -> Result<TensorId> {
        match before {
            Some(before) => Ok(self.ctx.concat(before, rows, 1)?),
            None => Ok(rows),
        }
    }

    /// RMS norm of `x` times `weight`, the norm pinned to block `il`'s device: the scheduler
    /// would otherwise leave it on the previous block's device, so that the hidden state
    /// crossed twice (llama.cpp pins them the same way).
    pub(crate) fn norm(&mut self, x: TensorId, weight: TensorId, il: usize) -> Result<TensorId> {
        let cur = self.ctx.rms_norm(x, self.config().rms_eps)?;
        self.pins.push((cur, self.device(il)));
        Ok(self.ctx.mul(cur, weight)?)
    }

    /// RMS norm of `x`'s rows times `weight` (no pin: QK-norm inside a block).
    pub(crate) fn row_norm(&mut self, x: TensorId, weight: TensorId) -> Result<TensorId> {
        let cur = self.ctx.rms_norm(x, self.config().rms_eps)?;
        Ok(self.ctx.mul(cur, weight)?)
    }

    /// `attn` and `x` cut to the output rows where `il` is the last block (llama.cpp's
    /// `inp_out_ids`): its FFN runs on those rows only. Not only faster: F16/BF16/F32 weights
    /// by one activation row take ggml's `vec_dot` order, not tinyBLAS's, so this gives
    /// llama.cpp's logits bit for bit.
    pub(crate) fn cut_to_output(
        &mut self,
        il: usize,
        attn: TensorId,
        x: TensorId,
    ) -> Result<(TensorId, TensorId)> {
        if il + 1 == self.model.layers.len() && !self.config().output_rows_after_norm {
            Ok((self.output_rows(attn)?, self.output_rows(x)?))
        } else {
            Ok((attn, x))
        }
    }

    /// The rows of `x` `[n_embd, n]` whose logits are wanted (`x` itself for all of them).
    pub(crate) fn output_rows(&mut self, x: TensorId) -> Result<TensorId> {
        match self.inputs.outputs {
            Outputs::Last if self.ctx[x].ne[1] > 1 => self.last_row(x),
            Outputs::Rows(ids) => Ok(self.ctx.get_rows(x, ids)?),
            _ => Ok(x),
        }
    }

    /// The attention half of a pre-norm block on the hidden state `x`: RMS norm, Q/K/V, the
    /// cache stores, attention through the output projection. Returns the attention output
    /// and `x`, both cut to the output position where [`Builder::cut_to_output`] says so.
    pub(crate) fn self_attention(
        &mut self,
        il: usize,
        l: &LayerWeights,
        x: TensorId,
    ) -> Result<(TensorId, TensorId)> {
        let cur = self.norm(x, l.attn_norm, il)?;
        let cur = self.keep(cur, format!("attn_norm-{il}"))?;
        let a = attention_weights(l)?;
        let (q, kv, gate) = self.qkv(il, a, cur)?;
        // Where the cache is quantized, Q and K (and V) are rotated first, as llama.cpp does
        // (the V rotation is undone on the attention output).
        let (k_rot, v_rot) = self.rotations(il);
        let q = match k_rot {
            Some(rot) => self.hadamard(rot, q)?,
            None => q,
        };
        // A layer that attends over an earlier layer's cache stores nothing.
        if let Some((k, v)) = kv {
            let k = match k_rot {
                Some(rot) => self.hadamard(rot, k)?,
                None => k,
            };
            let v = match v_rot {
                Some(rot) => self.hadamard(rot, v)?,
                None => v,
            };
            self.store_kv(il, k, v)?;
        }
        let attn = self.attention(il, a, q, gate)?;
        self.cut_to_output(il, attn, x)
    }

    /// `x` rotated by the Walsh-Hadamard matrix `rot` (`n × n`) in runs of `n` values, in
    /// `x`'s shape (llama.cpp's `llama_mul_mat_hadamard`).
    fn hadamard(&mut self, rot: TensorId, x: TensorId) -> Result<TensorId> {
        hadamard(self.ctx, rot, x)
    }

    /// The last position's row `[n_embd, 1]` of the `[n_embd, n]` tensor `x` (a view).
    fn last_row(&mut self, x: TensorId) -> Result<TensorId> {
        let (ne0, nrows, row) = (self.ctx[x].ne[0], self.ctx[x].ne[1], self.ctx[x].nb[1]);
        Ok(self.ctx.view(x, &[ne0, 1], &[row], (nrows - 1) * row)?)
    }

    /// Q, K and V of the normed input `cur` of block `il`: Q and K `[hd, heads, n]`, with
    /// biases, QK-norm, RoPE (the layer's own base where it is local) and Q's scaling as the
    /// architecture has them; V flat (or normed per head, Gemma 4); and, where the model gates
    /// the attention output, the gate `[n_embd_q, n]` (dense). No K and V for a layer that
    /// attends over an earlier layer's cache.
    #[allow(clippy::type_complexity)]
    pub(crate) fn qkv(
        &mut self,
        il: usize,
        a: &AttentionWeights,
        cur: TensorId,
    ) -> Result<(TensorId, Option<(TensorId, TensorId)>, Option<TensorId>)> {
        let c = self.config();
        let (h, n) = (c.heads(il), self.inputs.n);
        let own_kv = c.kv_layer(il) == il;
        let (q_full, kv) = match &a.qkv {
            QkvWeights::Separate { q, k, v } => {
                let q = self.linear(q, cur)?;
                let kv = match (own_kv, k) {
                    (true, Some(k)) => {
                        let k = self.linear(k, cur)?;
                        // Without a value projection the keys' is the values' (Gemma 4).
                        let v = match v {
                            Some(v) => self.linear(v, cur)?,
                            None => k,
                        };
                        Some((self.ctx.reshape(k, &[h.head_dim, h.n_head_kv, n])?, v))
                    }
                    (true, None) => {
                        return Err(crate::LlmError::MissingTensor(format!(
                            "blk.{il}.attn_k.weight"
                        )))
                    }
                    (false, _) => None,
                };
                (q, kv)
            }
            QkvWeights::Fused(wqkv) => {
                let (q, k, v) = self.fused_qkv(il, wqkv, cur)?;
                (q, own_kv.then_some((k, v)))
            }
        };
        let (mut q, gate) = self.split_query(il, q_full)?;
        if let Some(w) = a.q_norm {
            q = self.row_norm(q, w)?;
            q = self.keep(q, format!("Qcur_normed-{il}"))?;
        }
        let kv = kv.map(|(k, v)| self.key_value(il, a, k, v)).transpose()?;
        let (rope, factors) = (
            rope_params(c, il),
            layer_rope_factors(c, il, self.model.rope_freqs),
        );
        let q = self.ctx.rope_ext(q, self.inputs.positions, factors, rope)?;
        let mut q = self.keep(q, format!("Qcur-{il}"))?;
        let kv = kv
            .map(|(k, v)| -> Result<_> {
                let k = self.ctx.rope_ext(k, self.inputs.positions, factors, rope)?;
                Ok((self.keep(k, format!("Kcur-{il}"))?, v))
            })
            .transpose()?;
        if c.attn_scale_on_q {
            q = self.ctx.scale(q, c.attn_scale)?;
        }
        Ok((q, kv, gate))
    }

    /// K `[hd, n_head_kv, n]` with its QK-norm, and V, RMS-normed per head without a weight
    /// where the model norms its values (Gemma 4).
    fn key_value(
        &mut self,
        il: usize,
        a: &AttentionWeights,
        mut k: TensorId,
        mut v: TensorId,
    ) -> Result<(TensorId, TensorId)> {
        if let Some(w) = a.k_norm {
            k = self.row_norm(k, w)?;
            k = self.keep(k, format!("Kcur_normed-{il}"))?;
        }
        if self.config().value_norm {
            let h = self.config().heads(il);
            let n = self.inputs.n;
            v = match self.ctx[v].is_contiguous() {
                true => self.ctx.reshape(v, &[h.head_dim, h.n_head_kv, n])?,
                false => self.ctx.cont_shape(v, &[h.head_dim, h.n_head_kv, n])?,
            };
            v = self.ctx.rms_norm(v, self.config().rms_eps)?;
            v = self.keep(v, format!("Vcur_normed-{il}"))?;
        }
        Ok((k, v))
    }

    /// The queries `[hd, n_head, n]` from the first rows of `q` `[_, n]` (the query
    /// projection, or a fused one whose first rows are the queries), viewed straight from it;
    /// and where the model gates the attention output, each head's gate after its query
    /// (`[n_embd_q, n]`, made dense as llama.cpp's `ggml_cont_2d`).
    fn split_query(&mut self, il: usize, q: TensorId) -> Result<(TensorId, Option<TensorId>)> {
        let c = self.config();
        let h = c.heads(il);
        let (hd, n, f32b) = (h.head_dim, self.ctx[q].ne[1], DType::F32.block_bytes());
        let (head, row) = (hd * f32b, self.ctx[q].nb[1]);
        if !c.attn_output_gate {
            let whole = self.ctx[q].ne[0] == h.n_embd_q() && self.ctx[q].is_contiguous();
            let q = match whole {
                true => self.ctx.reshape(q, &[hd, h.n_head, n])?,
                false => self.ctx.view(q, &[hd, h.n_head, n], &[head, row], 0)?,
            };
            return Ok((q, None));
        }
        let gated = [2 * head, row];
        let query = self.ctx.view(q, &[hd, h.n_head, n], &gated, 0)?;
        let gate = self.ctx.view(q, &[hd, h.n_head, n], &gated, head)?;
        let gate = self.ctx.cont_shape(gate, &[h.n_embd_q(), n])?;
        Ok((query, Some(gate)))
    }

    /// The projection (whose first rows are Q's: `n_embd_q`, twice that with a gate), K `[hd,
    /// n_head_kv, n]` and V `[n_embd_kv, n]`: views of one fused projection's rows (as
    /// llama.cpp's `build_qkv`; RoPE reads the strided views).
    pub(crate) fn fused_qkv(
        &mut self,
        il: usize,
        wqkv: &Matrix,
        cur: TensorId,
    ) -> Result<(TensorId, TensorId, TensorId)> {
        let c = self.config();
        let h = c.heads(il);
        let (hd, n) = (h.head_dim, self.inputs.n);
        let q_rows = match c.attn_output_gate {
            true => 2 * h.n_embd_q(),
            false => h.n_embd_q(),
        };
        let qkv = self.linear(wqkv, cur)?;
        let row = self.ctx[qkv].nb[1];
        let f32b = DType::F32.block_bytes();
        // Q's rows are the first ones: `split_query` views them from the projection itself
        // (a view of a view would give the tensor split other states to follow).
        let q = qkv;
        let k = self
            .ctx
            .view(qkv, &[hd, h.n_head_kv, n], &[hd * f32b, row], q_rows * f32b)?;
        let v = self.ctx.view(
            qkv,
            &[h.n_embd_kv(), n],
            &[row],
            (q_rows + h.n_embd_kv()) * f32b,
        )?;
        Ok((q, k, v))
    }

    /// Store this batch's K and V in layer `il`'s cache, at the rows the inputs name
    /// (SET_ROWS, as llama.cpp stores them): the graph then does not depend on where the batch
    /// goes, so decoding reuses one graph for many tokens (see `Session::eval_ubatch`).
    pub(crate) fn store_kv(&mut self, il: usize, k: TensorId, v: TensorId) -> Result<()> {
        let (n, n_embd_kv) = (self.inputs.n, self.config().heads(il).n_embd_kv());
        let rows = self.stream_cells(il) * self.kv.n_seq;
        let kv_rows = match self.is_local(il) {
            true => self.inputs.local_rows.unwrap_or(self.inputs.kv_rows),
            false => self.inputs.kv_rows,
        };
        let k_flat = self.ctx.reshape(k, &[n_embd_kv, n])?;
        let k_store = self.ctx.set_rows(self.cache_k(il)?, k_flat, kv_rows)?;
        if self.kv.flash_attn {
            // V as K: one row per cell (a view of a fused projection made dense first).
            let v = match self.ctx[v].is_contiguous() {
                true => v,
                false => self.ctx.cont(v)?,
            };
            let v_flat = self.ctx.reshape(v, &[n_embd_kv, n])?;
            let v_store = self.ctx.set_rows(self.cache_v(il)?, v_flat, kv_rows)?;
            self.graph.expand(self.ctx, k_store)?;
            self.graph.expand(self.ctx, v_store)?;
            return Ok(());
        }
        // (Without flash attention V is f16 or f32: elements, not blocks.)
        let es = self.ctx[self.cache_v(il)?].dtype.block_bytes();
        // V is stored transposed: its "rows" are single elements, one per cell, in a
        // `[1, rows, n_embd_kv]` view of the cache, and the batch's values are the matching
        // `[1, n, n_embd_kv]` view of `v`.
        let v_cells = self.ctx.view(
            self.cache_v(il)?,
            &[1, rows, n_embd_kv],
            &[es, rows * es],
            0,
        )?;
        // A view of a fused projection is made dense first: the split model can then view it
        // again (and the copy is exact).
        let v = match self.ctx[v].is_contiguous() {
            true => v,
            false => self.ctx.cont(v)?,
        };
        let f32b = DType::F32.block_bytes();
        let v_rows = self
            .ctx
            .view(v, &[1, n, n_embd_kv], &[n_embd_kv * f32b, f32b], 0)?;
        let v_store = self.ctx.set_rows(v_cells, v_rows, kv_rows)?;

        // The stores enter the graph before anything that reads the cache, so they run first
        // (as in llama.cpp: the order of expansion is the order of execution).
        self.graph.expand(self.ctx, k_store)?;
        self.graph.expand(self.ctx, v_store)?;
        Ok(())
    }

    /// The K cache layer `il` attends over: its own, or the earlier layer's it shares (an
    /// error for a recurrent layer, which has none).
    fn cache_k(&self, il: usize) -> Result<TensorId> {
        let src = self.config().kv_layer(il);
        no_cache(self.kv.k.get(src).copied().flatten(), il)
    }

    /// The V cache layer `il` attends over.
    fn cache_v(&self, il: usize) -> Result<TensorId> {
        let src = self.config().kv_layer(il);
        no_cache(self.kv.v.get(src).copied().flatten(), il)
    }

    /// Layer `il`'s recurrent states (convolution, delta net) and the number of streams.
    pub(crate) fn recurrent_state(&self, il: usize) -> Result<(TensorId, TensorId)> {
        let conv = self.kv.conv.get(il).copied().flatten();
        let ssm = self.kv.ssm.get(il).copied().flatten();
        conv.zip(ssm)
            .ok_or_else(|| crate::LlmError::BadConfig(format!("layer {il} has no recurrent state")))
    }

    /// The groups of the micro-batch (one per sequence, in order).
    pub(crate) fn groups(&self) -> &'a [GroupInputs] {
        self.inputs.groups
    }

    /// The rotations of block `il`'s cache (K, V), where it is quantized.
    fn rotations(&self, il: usize) -> (Option<TensorId>, Option<TensorId>) {
        match self.is_local(il) {
            true => (self.inputs.local_k_rot, self.inputs.local_v_rot),
            false => (self.inputs.k_rot, self.inputs.v_rot),
        }
    }

    /// Whether block `il` is a local one (with the local layers' inputs).
    fn is_local(&self, il: usize) -> bool {
        self.inputs.local_rows.is_some() && self.config().is_local(il)
    }

    /// Cells of one stream of block `il`'s cache.
    fn stream_cells(&self, il: usize) -> usize {
        match self.is_local(il) {
            true => self.kv.local_cells,
            false => self.kv.cells,
        }
    }

    /// Attention of the roped `q` `[hd, n_head, n]` over the cached positions of layer `il`
    /// that each token's mask lets it see, through the output projection. Each sequence's
    /// tokens attend to their own stream's cells, in a product of their own: a token's sums run
    /// over the same cells in the same order whatever else is in the batch.
    pub(crate) fn attention(
        &mut self,
        il: usize,
        a: &AttentionWeights,
        q: TensorId,
        gate: Option<TensorId>,
    ) -> Result<TensorId> {
        let groups = self.inputs.groups;
        let mut attn: Option<TensorId> = None;
        for g in groups {
            // One sequence (the usual case): its product reads `q` itself.
            let q_g = match groups.len() {
                1 => q,
                _ => {
                    let (ne, nb) = (self.ctx[q].ne, self.ctx[q].nb);
                    self.ctx
                        .view(q, &[ne[0], ne[1], g.n], &[nb[1], nb[2]], g.first * nb[2])?
                }
            };
            let out = self.group_attention(il, g, q_g, a.sinks, groups.len() == 1)?;
            attn = Some(self.append_rows(attn, out)?);
        }
        let attn = attn.ok_or_else(|| crate::LlmError::BadInput("an empty batch".into()))?;
        let attn = match self.rotations(il).1 {
            Some(rot) => self.hadamard(rot, attn)?,
            None => attn,
        };
        let mut attn = self.keep(attn, format!("kqv_out-{il}"))?;
        if let Some(gate) = gate {
            // Qwen3.5's gated attention: the output times the sigmoid of its gate.
            let gate = self.ctx.sigmoid(gate)?;
            attn = self.ctx.mul(attn, gate)?;
            attn = self.keep(attn, format!("attn_gated-{il}"))?;
        }
        let attn = self.linear(&a.wo, attn)?;
        self.keep(attn, format!("attn_out-{il}"))
    }

    /// One sequence's attention: `q` `[hd, n_head, g.n]` over its stream's cells (and each
    /// head's sink, where the model has them), to `[n_embd_q, g.n]`. `name` keeps llama.cpp's
    /// names for the intermediates.
    fn group_attention(
        &mut self,
        il: usize,
        g: &GroupInputs,
        q: TensorId,
        sinks: Option<TensorId>,
        name: bool,
    ) -> Result<TensorId> {
        let c = self.config();
        let (n_kv, mask) = match (self.is_local(il), g.local_mask) {
            (true, Some(mask)) => (g.n_kv_local, mask),
            _ => (g.n_kv, g.mask),
        };
        let h = c.heads(il);
        let (hd, n_embd_kv) = (h.head_dim, h.n_embd_kv());
        let cells = self.stream_cells(il);
        // Bytes of one head's row and of one cell's rows, in the cache's type.
        let row_bytes = |ctx: &Context, t: TensorId, n: usize| {
            ctx[t]
                .dtype
                .row_bytes(n)
                .map_err(|e| crate::LlmError::BadConfig(format!("KV cache: {e}")))
        };
        let (k_head, k_cell) = (
            row_bytes(self.ctx, self.cache_k(il)?, hd)?,
            row_bytes(self.ctx, self.cache_k(il)?, n_embd_kv)?,
        );
        let k_all = self.ctx.view(
            self.cache_k(il)?,
            &[hd, h.n_head_kv, n_kv],
            &[k_head, k_cell],
            g.stream * cells * k_cell,
        )?;
        let k_all = self.ctx.permute(k_all, [0, 2, 1, 3])?; // [hd, n_kv, n_head_kv]
        let q = self.ctx.permute(q, [0, 2, 1, 3])?; // [hd, n, n_head]
        let kq_scale = if c.attn_scale_on_q { 1.0 } else { c.attn_scale };
        if self.kv.flash_attn {
            // V's cells are rows, as K's.
            let (v_head, v_cell) = (
                row_bytes(self.ctx, self.cache_v(il)?, hd)?,
                row_bytes(self.ctx, self.cache_v(il)?, n_embd_kv)?,
            );
            let v_all = self.ctx.view(
                self.cache_v(il)?,
                &[hd, h.n_head_kv, n_kv],
                &[v_head, v_cell],
                g.stream * cells * v_cell,
            )?;
            let v_all = self.ctx.permute(v_all, [0, 2, 1, 3])?; // [hd, n_kv, n_head_kv]
            let kqv =
                self.ctx
                    .flash_attn_ext(q, k_all, v_all, Some(mask), sinks, kq_scale, 0.0, 0.0)?;
            // [hd, n_head, n], dense.
            return Ok(self.ctx.reshape(kqv, &[h.n_embd_q(), g.n])?);
        }
        let kq = self.ctx.mul_mat(k_all, q)?; // [n_kv, n, n_head]
        let kq = match name {
            true => self.keep(kq, format!("kq-{il}"))?,
            false => kq,
        };
        let kq = self
            .ctx
            .soft_max_sinks(kq, Some(mask), sinks, kq_scale, 0.0)?;
        let kq = match name {
            true => self.keep(kq, format!("kq_soft_max-{il}"))?,
            false => kq,
        };
        // A stream's cells of one dimension are one dense run of each row of V.
        let es = self.ctx[self.cache_v(il)?].dtype.block_bytes();
        let row = cells * self.kv.n_seq * es;
        let v_all = self.ctx.view(
            self.cache_v(il)?,
            &[n_kv, hd, h.n_head_kv],
            &[row, row * hd],
            g.stream * cells * es,
        )?;
        let kqv = self.ctx.mul_mat(v_all, kq)?; // [hd, n, n_head]
        let kqv = self.ctx.permute(kqv, [0, 2, 1, 3])?; // [hd, n_head, n]
        Ok(self.ctx.cont_shape(kqv, &[h.n_embd_q(), g.n])?)
    }

    /// The gated FFN of block `il` on the normed `cur`: `down(act(gate(cur)) * up(cur))`;
    /// `gate` `None`: fused in `up`.
    pub(crate) fn dense_ffn(
        &mut self,
        il: usize,
        gate: Option<&Matrix>,
        up: &Matrix,
        down: &Matrix,
        cur: TensorId,
    ) -> Result<TensorId> {
        let (gate, up) = match gate {
            Some(gate) => {
                // llama.cpp computes up first.
                let up = self.linear_ffn(up, cur)?;
                let gate = self.linear_ffn(gate, cur)?;
                let gate = self.keep(gate, format!("ffn_gate-{il}"))?;
                (gate, self.keep(up, format!("ffn_up-{il}"))?)
            }
            None => {
                // Gate and up fused: the gate's half of each row, then the up's (ggml's
                // single-operand SWIGLU on the fused rows).
                let both = self.linear_ffn(up, cur)?;
                let both = self.keep(both, format!("ffn_up-{il}"))?;
                // Rows of `cur`: one where the last block runs on the output position only.
                let (ff, n, row) = (
                    self.config().n_ff_at(il),
                    self.ctx[both].ne[1],
                    self.ctx[both].nb[1],
                );
                let gate = self.ctx.view(both, &[ff, n], &[row], 0)?;
                let f32b = DType::F32.block_bytes();
                (gate, self.ctx.view(both, &[ff, n], &[row], ff * f32b)?)
            }
        };
        let act = match self.config().ffn_activation {
            FfnActivation::Silu => {
                let act = self.ctx.swiglu(gate, up)?;
                self.keep(act, format!("ffn_swiglu-{il}"))?
            }
            FfnActivation::Gelu => {
                let act = self.ctx.geglu(gate, up)?;
                self.keep(act, format!("ffn_geglu-{il}"))?
            }
            // llama.cpp has it for experts only.
            FfnActivation::SwigluOai => {
                return Err(crate::LlmError::BadConfig(
                    "gpt-oss's SwiGLU in a dense FFN".into(),
                ))
            }
        };
        let down = self.linear_ffn(down, act)?;
        self.keep(down, format!("ffn_out-{il}"))
    }

    /// The output rows' final-normed hidden states (`result_norm`), as the graph's output
    /// instead of logits (embeddings); expanded into the graph.
    pub(crate) fn output_embeddings(&mut self, x: TensorId) -> Result<TensorId> {
        let cur = self.output_norm(x)?;
        self.ctx.set_output(cur)?;
        self.graph.expand(self.ctx, cur)?;
        Ok(cur)
    }

    /// The last block's `x` cut to the output rows (see [`Outputs`]) and normed by the output
    /// norm (`result_norm`).
    fn output_norm(&mut self, mut x: TensorId) -> Result<TensorId> {
        let after_norm = self.config().output_rows_after_norm;
        if self.model.layers.is_empty() && !after_norm {
            // The last block cuts to the output rows; without blocks, cut here.
            x = self.output_rows(x)?;
        }
        let Some(norm) = self.model.output_norm else {
            return self.keep(x, "result_embd".into());
        };
        let cur = self.ctx.rms_norm(x, self.config().rms_eps)?;
        self.pins.push((cur, self.model.output_device));
        let mut cur = self.ctx.mul(cur, norm)?;
        if after_norm {
            cur = self.output_rows(cur)?;
        }
        self.keep(cur, "result_norm".into())
    }

    /// The output head on the last block's `x`: the logits of the output rows (see
    /// [`Outputs`]); expanded into the graph.
    pub(crate) fn output(&mut self, x: TensorId) -> Result<TensorId> {
        let output = self.model.output.ok_or_else(|| {
            crate::LlmError::BadConfig(format!(
                "a {} model computes embeddings only: it has no output head",
                self.config().arch
            ))
        })?;
        let cur = self.output_norm(x)?;
        let mut logits = self.project(output, cur)?;
        if let Some(b) = self.model.output_bias {
            logits = self.ctx.add(logits, b)?;
        }
        if let Some(cap) = self.config().final_logit_softcap {
            // As llama.cpp: scale down, tanh, scale up (three roundings).
            logits = self.ctx.scale(logits, 1.0 / cap)?;
            logits = self.ctx.tanh(logits)?;
            logits = self.ctx.scale(logits, cap)?;
        }
        self.ctx.set_name(logits, "logits")?;
        self.ctx.set_output(logits)?;
        self.graph.expand(self.ctx, logits)?;
        Ok(logits)
    }
}
