//! The KV cache of a session: K and V of every layer (f16, or the types asked for), in one
//! buffer per device (each
//! block's on that block's device), and how many cells an attention reads. Each sequence has
//! its own stream of cells (llama.cpp's non-unified cache), so a sequence's cells are laid out
//! as they would be alone and its attention sums in the same order whatever else is in the
//! batch. Local (sliding-window) layers hold only their window and a micro-batch per stream;
//! the other layers hold one cell per position of the context. Which position each cell holds
//! is [`Cells`]' business.
//!
//! This module owns the cache's tensors and buffers; what is stored where is the graph's
//! business (the stores are SET_ROWS at the positions).

use super::cells::{local_cache_cells, Cells, NO_WINDOW};
use super::SessionOptions;
use crate::error::{LlmError, MemoryUse, Result};
use crate::model::Model;
use rgml::alloc::TensorAllocator;
use rgml::backend::{Buffer, BufferUsage};
use rgml::{Context, DType, TensorId};
use std::sync::Arc;

/// K and V of every layer for `cells` positions of `n_seq` streams, of the session's cache
/// types (f16 by default). K is stored
/// `[n_embd_kv, n_seq * cells]` (one column per cell, stream after stream). V is stored as K
/// for flash attention (llama.cpp's layout then), else transposed, `[n_seq * cells,
/// n_embd_kv]` (each row holds one dimension of every stream's cells), so the attention
/// product reads a stream's cells as dense rows. A token's cache row is `stream * cells + cell`
/// in both.
pub(super) struct KvCache {
    /// Per layer, K and V (`None`: a recurrent layer, which keeps states instead).
    pub(super) k: Vec<Option<TensorId>>,
    pub(super) v: Vec<Option<TensorId>>,
    /// Per layer, a recurrent layer's states (f32): the short convolution's last inputs
    /// `[conv_state_len, n_seq]` and the delta net's matrices `[ssm_state_len, n_seq]`, one
    /// row per stream (llama.cpp's recurrent memory with one cell per sequence). A stream's
    /// rows hold zeros whenever it holds no position (see `Session::clear_fresh_states`).
    pub(super) conv: Vec<Option<TensorId>>,
    pub(super) ssm: Vec<Option<TensorId>>,
    /// Attention is one FLASH_ATTN_EXT op: V not transposed, and the cells attended to padded
    /// as llama.cpp pads them (see [`KvCache::attended`]).
    pub(super) flash_attn: bool,
    /// Each token attends to earlier positions only (see [`crate::ModelConfig::causal`]).
    pub(super) causal: bool,
    /// The sizes of llama.cpp's Walsh-Hadamard rotations of quantized caches (see
    /// [`rotations`]): of Q and K, of V; in the global layers, and in the local ones (llama.cpp
    /// has a cache of each kind, with its own rotations).
    pub(super) k_rot: Option<usize>,
    pub(super) v_rot: Option<usize>,
    pub(super) local_k_rot: Option<usize>,
    pub(super) local_v_rot: Option<usize>,
    /// Streams (sequences held at once).
    pub(super) n_seq: usize,
    /// Positions a sequence may use (the requested context length).
    pub(super) n_ctx: usize,
    /// Allocated positions: `n_ctx` rounded up to [`KV_PAD`] (as llama.cpp pads its context),
    /// so the attention can always read whole padded groups of cells.
    pub(super) cells: usize,
    /// Per stream, which position each cell holds.
    pub(super) streams: Vec<StreamCells>,
    /// Cells of a stream of the local layers' caches (`cells` without local layers).
    pub(super) local_cells: usize,
    _buffers: Vec<Arc<Buffer>>,
}

impl KvCache {
    /// The cache for the options' `n_seq` sequences of `n_ctx` positions of `model`'s blocks,
    /// of their cache types, laid out for flash attention or not, its tensors added to `ctx`
    /// and placed in one cleared buffer per device (`bufts`: each device's buffer type).
    pub(super) fn allocate(
        ctx: &mut Context,
        model: &Model,
        bufts: &[rgml::BufferTypeRef],
        options: &SessionOptions,
        flash_attn: bool,
    ) -> Result<KvCache> {
        let (n_ctx, n_ubatch, n_seq) = (options.n_ctx, options.n_ubatch, options.n_seq);
        let (k_type, v_type) = (options.cache_type_k, options.cache_type_v);
        let c = &model.config;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let cells = n_ctx
            .checked_next_multiple_of(KV_PAD)
            .ok_or_else(|| LlmError::BadConfig("n_ctx too large".into()))?;
        let local_cells = match &c.sliding_window {
            Some(w) => local_cache_cells(w.window, n_ubatch, cells),
            None => cells,
        };
        let too_large = || LlmError::BadConfig(format!("{n_seq} sequences of {cells} cells"));
        let (mut conv, mut ssm) = (Vec::new(), Vec::new());
        for il in 0..c.n_layer {
            if let Some(r) = c.recurrent.as_ref().filter(|_| c.is_recurrent(il)) {
                let mut state = |len: usize, name: String| -> Result<Option<TensorId>> {
                    let t = ctx.new_tensor(DType::F32, &[len, n_seq])?;
                    ctx.set_name(t, name)?;
                    Ok(Some(t))
                };
                conv.push(state(r.conv_state_len(), format!("cache_r_l{il}"))?);
                ssm.push(state(r.ssm_state_len(), format!("cache_s_l{il}"))?);
                k.push(None);
                v.push(None);
                continue;
            }
            conv.push(None);
            ssm.push(None);
            if c.kv_layer(il) != il {
                // It attends over an earlier layer's cache.
                k.push(None);
                v.push(None);
                continue;
            }
            let per_seq = if c.is_local(il) { local_cells } else { cells };
            let n = per_seq.checked_mul(n_seq).ok_or_else(too_large)?;
            let n_embd_kv = c.heads(il).n_embd_kv();
            let kt = ctx.new_tensor(k_type, &[n_embd_kv, n])?;
            ctx.set_name(kt, format!("cache_k_l{il}"))?;
            let v_shape = match flash_attn {
                true => [n_embd_kv, n],
                false => [n, n_embd_kv],
            };
            let vt = ctx.new_tensor(v_type, &v_shape)?;
            ctx.set_name(vt, format!("cache_v_l{il}"))?;
            k.push(Some(kt));
            v.push(Some(vt));
        }
        // One cache buffer per device, holding the K and V of that device's blocks.
        let mut buffers = Vec::new();
        for (dev, buft) in bufts.iter().enumerate() {
            let mine: Vec<TensorId> = (0..c.n_layer)
                .filter(|&il| model.layer_device(il).unwrap_or(0) == dev || bufts.len() == 1)
                .flat_map(|il| [k[il], v[il], conv[il], ssm[il]])
                .flatten()
                .collect();
            if mine.is_empty() {
                continue;
            }
            let align = buft.alignment();
            let size = mine
                .iter()
                .map(|&id| rgml::alloc::align_up(buft.alloc_size(&ctx[id]), align))
                .sum::<usize>();
            let buffer =
                Buffer::alloc(buft, size).map_err(|e| LlmError::memory(e, MemoryUse::KvCache))?;
            buffer.set_usage(BufferUsage::Compute);
            // Unwritten cache cells are masked out, but must not hold NaN bit patterns that a
            // zero attention weight would still propagate; recurrent states start at zero.
            // Memory allocated zeroed is left untouched: clearing it would commit every page
            // of a large cache at once.
            if !buft.alloc_is_zeroed() {
                buffer.clear(0)?;
            }
            let mut talloc = TensorAllocator::new(buffer.clone());
            for &id in &mine {
                talloc.alloc(ctx, id)?;
            }
            buffers.push(buffer);
        }
        let stream = StreamCells {
            global: Cells::new(cells, NO_WINDOW),
            local: c
                .sliding_window
                .as_ref()
                .map(|w| Cells::new(local_cells, w.window)),
        };
        let own = |il: usize| k[il].is_some();
        let (k_rot, v_rot) = cache_rotations(c, k_type, v_type, |il| own(il) && !c.is_local(il));
        let (local_k_rot, local_v_rot) =
            cache_rotations(c, k_type, v_type, |il| own(il) && c.is_local(il));
        Ok(KvCache {
            k,
            v,
            conv,
            ssm,
            flash_attn,
            causal: c.causal,
            k_rot,
            v_rot,
            local_k_rot,
            local_v_rot,
            n_seq,
            n_ctx,
            cells,
            streams: vec![stream; n_seq],
            local_cells,
            _buffers: buffers,
        })
    }
}

/// Which position each cell of one stream holds, in the global layers and (for a model with
/// them) in the local layers.
#[derive(Clone, Debug)]
pub(super) struct StreamCells {
    pub(super) global: Cells,
    pub(super) local: Option<Cells>,
}

impl StreamCells {
    /// Become a copy of `other`, reusing this one's memory.
    pub(super) fn copy_from(&mut self, other: &StreamCells) {
        self.global.copy_from(&other.global);
        if let (Some(mine), Some(theirs)) = (&mut self.local, &other.local) {
            mine.copy_from(theirs);
        }
    }

    pub(super) fn clear(&mut self) {
        self.global.clear();
        if let Some(local) = &mut self.local {
            local.clear();
        }
    }
}

/// llama.cpp's rotations of quantized caches (`attn_rot_k`, `attn_rot_v`; on unless its
/// `LLAMA_ATTN_ROT_DISABLE` is set): for a quantized K cache and heads of a multiple of 64
/// values, Q and K are multiplied by the Walsh-Hadamard matrix of the largest power of two
/// dividing the head size; for a quantized V cache, V by the one of 64 (and the attention output
/// by it again, which undoes it). Quantization errors then spread over a head's values.
pub(super) fn rotations(head_dim: usize, k: DType, v: DType) -> (Option<usize>, Option<usize>) {
    let heads_fit = head_dim > 0 && head_dim.is_multiple_of(64);
    let k_rot = (heads_fit && k.is_quantized()).then(|| 1 << head_dim.trailing_zeros());
    let v_rot = (heads_fit && v.is_quantized()).then_some(64);
    (k_rot, v_rot)
}

/// [`rotations`] of one of llama.cpp's caches, holding the layers `mine` says: none unless they
/// all have one head width, and (as llama.cpp checks the model's first layer) layer 0's head
/// width is a multiple of 64 too.
fn cache_rotations(
    c: &crate::ModelConfig,
    k: DType,
    v: DType,
    mine: impl Fn(usize) -> bool,
) -> (Option<usize>, Option<usize>) {
    let mut widths = (0..c.n_layer)
        .filter(|&il| mine(il))
        .map(|il| c.heads(il).head_dim);
    let first = widths.next();
    match first {
        Some(hd) if widths.all(|w| w == hd) && c.heads(0).head_dim.is_multiple_of(64) => {
            rotations(hd, k, v)
        }
        _ => (None, None),
    }
}

/// The `n × n` Walsh-Hadamard matrix over `sqrt(n)`, row-major (llama.cpp's
/// `ggml_gen_hadamard`; the CPU computes the product as a transform and reads none of it, other
/// devices multiply by it).
pub(super) fn hadamard_matrix(n: usize) -> Vec<f32> {
    let mut h = vec![0f32; n * n];
    h[0] = 1.0 / (n as f32).sqrt();
    let mut s = 1;
    while s < n {
        for i in 0..s {
            for j in 0..s {
                let v = h[i * n + j];
                h[(i + s) * n + j] = v;
                h[i * n + j + s] = v;
                h[(i + s) * n + j + s] = -v;
            }
        }
        s *= 2;
    }
    h
}

impl KvCache {
    /// Cells of a stream of `cells` an attention reads when `used` of them are in use: as
    /// [`padded_n_kv`] without flash attention; with it, as llama.cpp's `get_n_kv` (the used
    /// cells rounded up to 256, at least 256, at most `cells`), because ggml's kernel for one
    /// query over 512 cells or more splits the cells between threads by that count.
    ///
    /// Without causal attention, exactly the used cells: llama.cpp's cache-less attention
    /// reads the batch's K and V themselves, so its sums run over that many.
    pub(super) fn attended(&self, used: usize, cells: usize) -> usize {
        if !self.causal {
            return used;
        }
        match self.flash_attn {
            true => used.next_multiple_of(KV_PAD).max(KV_PAD).min(cells),
            false => padded_n_kv(used, cells),
        }
    }
}

/// KV cells the attention reads: the `used` ones (at least one; the session checks that they
/// fit the context) rounded up to a multiple of [`ATTEND_PAD`], at most the allocated `cells`
/// (a multiple of it).
///
/// llama.cpp (`get_n_kv`) attends to the used cells rounded up to 256 and masks the rest with
/// -inf. Those masked cells change nothing but the grouping of ggml's sums: their softmax
/// weights are exactly 0, so each adds an exact 0 to the f64 softmax sum, and `0 * v` to every
/// accumulator of the weighted sum of values; the grouping of the dots over cells (steps of 32
/// elements in `ggml_vec_dot_f16` on AVX2, 64 on AVX-512, then the remainder in f64; tinyBLAS's
/// vectors of at most 16) is the same for any count that is a multiple of 64 and has no
/// remainder. So attending to a multiple of 64 gives llama.cpp's results bit for bit while a
/// short context reads a quarter of the cells (generation from an empty context: ~10% faster).
fn padded_n_kv(used: usize, cells: usize) -> usize {
    used.next_multiple_of(ATTEND_PAD).min(cells)
}

/// llama.cpp pads its context (`n_ctx`) to 256: the cache holds as many cells as its does.
pub(super) const KV_PAD: usize = 256;

/// See [`padded_n_kv`]: the widest step of ggml's dots over cells.
const ATTEND_PAD: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LayerHeads, SlidingWindow};

    /// Gemma 4 E2B's heads: local layers 256 wide, every fifth layer global and 512 wide.
    fn gemma4_like(local_width: usize) -> crate::ModelConfig {
        let mut c = crate::config::smollm_config();
        let n = 10;
        c.n_layer = n;
        c.n_layer_kv = n;
        let layers: Vec<bool> = (0..n).map(|il| il % 5 != 4).collect();
        c.layer_heads = Some(
            layers
                .iter()
                .map(|&local| LayerHeads {
                    n_head: 8,
                    n_head_kv: 1,
                    head_dim: if local { local_width } else { 512 },
                    n_rot: 64,
                })
                .collect(),
        );
        c.sliding_window = Some(SlidingWindow {
            window: 512,
            layers,
            rope_freq_base: 10_000.0,
            rope_freq_scale: 1.0,
            rope_factors: false,
        });
        c
    }

    #[test]
    fn each_kind_of_layer_gets_its_own_rotations_as_llama_cpps_two_caches() {
        let c = gemma4_like(256);
        let q = DType::Q8_0;
        let global = cache_rotations(&c, q, q, |il| !c.is_local(il));
        let local = cache_rotations(&c, q, q, |il| c.is_local(il));
        assert_eq!(global, (Some(512), Some(64)));
        assert_eq!(local, (Some(256), Some(64)));
        // An f16 cache is not rotated.
        let f16 = DType::F16;
        assert_eq!(cache_rotations(&c, f16, f16, |_| true), (None, None));
        // Mixed widths in one cache: none (llama.cpp's `n_embd_head_k_all` is -1).
        assert_eq!(cache_rotations(&c, q, q, |_| true), (None, None));
    }

    #[test]
    fn no_rotation_when_the_first_layers_heads_are_not_a_multiple_of_64() {
        // llama.cpp checks `n_embd_head_k()` of layer 0 for both of its caches.
        let c = gemma4_like(32);
        let q = DType::Q8_0;
        assert_eq!(
            cache_rotations(&c, q, q, |il| !c.is_local(il)),
            (None, None)
        );
    }
}
