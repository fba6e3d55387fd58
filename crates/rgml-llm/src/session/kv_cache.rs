//! The KV cache of a session: K and V of every layer, f16, in one buffer per device (each
//! block's on that block's device), and how many cells an attention reads.
//!
//! This module owns the cache's tensors and buffers; what is stored where is the graph's
//! business (the stores are SET_ROWS at the positions).

use crate::error::{LlmError, MemoryUse, Result};
use crate::model::Model;
use rgml::alloc::TensorAllocator;
use rgml::backend::{Buffer, BufferUsage};
use rgml::{Context, DType, TensorId};
use std::sync::Arc;

/// K and V of every layer for `cells` positions, f16, in one buffer. K is stored
/// `[n_embd_kv, cells]` (one column per position); V transposed, `[cells, n_embd_kv]`, so the
/// attention product reads it with dense rows.
pub(super) struct KvCache {
    pub(super) k: Vec<TensorId>,
    pub(super) v: Vec<TensorId>,
    /// Positions a sequence may use (the requested context length).
    pub(super) n_ctx: usize,
    /// Allocated positions: `n_ctx` rounded up to [`KV_PAD`] (as llama.cpp pads its context),
    /// so the attention can always read whole padded groups of cells.
    pub(super) cells: usize,
    _buffers: Vec<Arc<Buffer>>,
}

impl KvCache {
    /// The cache for `n_ctx` positions of `model`'s blocks, its tensors added to `ctx` and
    /// placed in one cleared buffer per device (`bufts`: each device's buffer type).
    pub(super) fn allocate(
        ctx: &mut Context,
        model: &Model,
        bufts: &[rgml::BufferTypeRef],
        n_ctx: usize,
    ) -> Result<KvCache> {
        let c = &model.config;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let cells = n_ctx
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
            let buffer =
                Buffer::alloc(buft, size).map_err(|e| LlmError::memory(e, MemoryUse::KvCache))?;
            buffer.set_usage(BufferUsage::Compute);
            // Unwritten cache cells are masked out, but must not hold NaN bit patterns that a
            // zero attention weight would still propagate. Memory allocated zeroed is left
            // untouched: clearing it would commit every page of a large cache at once.
            if !buft.alloc_is_zeroed() {
                buffer.clear(0)?;
            }
            let mut talloc = TensorAllocator::new(buffer.clone());
            for &id in &mine {
                talloc.alloc(ctx, id)?;
            }
            buffers.push(buffer);
        }
        Ok(KvCache {
            k,
            v,
            n_ctx,
            cells,
            _buffers: buffers,
        })
    }
}

/// KV cells the attention reads, as llama.cpp's `get_n_kv`: the used ones rounded up to a
/// multiple of [`KV_PAD`], at least [`KV_PAD`], at most the allocated `cells` (a multiple of
/// it), the rest masked with -inf. The exact count matters beyond the zeros the padding adds:
/// it decides how ggml's dots group the cells (tinyBLAS's lanes, and `ggml_vec_dot_f16`'s
/// steps of 32 or 64 elements with the remainder summed in f64 in generation), so computing
/// on the same padded rows reproduces llama.cpp's results bit for bit.
pub(super) fn padded_n_kv(used: usize, cells: usize) -> usize {
    used.next_multiple_of(KV_PAD)
        .max(KV_PAD)
        .min(cells)
        .max(used)
}

/// See [`padded_n_kv`]: llama.cpp pads both its context (`n_ctx`) and the attended cells to 256.
pub(super) const KV_PAD: usize = 256;
