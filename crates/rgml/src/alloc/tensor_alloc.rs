//! Bump allocation of tensors: [`TensorAllocator`] over one buffer, and
//! [`alloc_ctx_tensors`], which sizes and fills the buffer(s) of a whole context, splitting
//! into a multi-buffer when a buffer type's maximum size requires it.

use crate::backend::{Buffer, BufferTypeRef};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::TensorId;
use std::sync::Arc;

/// `offset` rounded up to a multiple of `align` (a power of two or any positive number).
pub fn align_up(offset: usize, align: usize) -> usize {
    let align = align.max(1);
    offset.div_ceil(align) * align
}

/// Places tensors one after another in a buffer (ggml's `ggml_tallocr`).
pub struct TensorAllocator {
    buffer: Arc<Buffer>,
    offset: usize,
}

impl TensorAllocator {
    /// Allocate from the start of `buffer`.
    pub fn new(buffer: Arc<Buffer>) -> Self {
        TensorAllocator { buffer, offset: 0 }
    }

    /// Bytes used so far.
    pub fn used(&self) -> usize {
        self.offset
    }

    /// Give tensor `id` storage (views get their source's storage, which must exist).
    pub fn alloc(&mut self, ctx: &mut Context, id: TensorId) -> Result<()> {
        let t = ctx.get(id)?;
        if t.view_src.is_some() {
            return ctx.init_view(id);
        }
        let size = self.buffer.alloc_size(t);
        let offset = align_up(self.offset, self.buffer.alignment());
        let end = offset.checked_add(size).ok_or(Error::SizeOverflow)?;
        if end > self.buffer.size() {
            return Err(Error::OutOfMemory {
                buffer_type: self.buffer.name().to_string(),
                size,
                reason: "tensor allocator: buffer is full",
            });
        }
        ctx.set_data(id, self.buffer.clone(), offset)?;
        self.offset = end;
        Ok(())
    }
}

/// Allocate storage of `buffer_type` for every tensor of `ctx` that has none yet (views are
/// pointed at their sources), ggml's `ggml_backend_alloc_ctx_tensors_from_buft`. Returns `None`
/// when there is nothing to allocate.
///
/// When everything fits in one buffer of at most [`BufferType::max_size`] bytes that buffer is
/// returned. Otherwise tensors are packed in creation order into several buffers, starting a new
/// one whenever the next tensor does not fit in the current one, and a multi-buffer over them is
/// returned ([`Buffer::multi`]); each tensor points at the part it lives in. A tensor larger
/// than `max_size` is [`Error::TensorTooLarge`].
///
/// [`BufferType::max_size`]: crate::backend::BufferType::max_size
pub fn alloc_ctx_tensors(
    ctx: &mut Context,
    buffer_type: &BufferTypeRef,
) -> Result<Option<Arc<Buffer>>> {
    let align = buffer_type.alignment();
    let max_size = buffer_type.max_size();
    let pending: Vec<TensorId> = ctx
        .ids()
        .filter(|&id| ctx[id].data.is_none() && ctx[id].view_src.is_none())
        .collect();
    if pending.is_empty() {
        return Ok(None);
    }
    // Pack into groups: (first index in `pending`, one past the last, bytes needed).
    let mut groups: Vec<(usize, usize, usize)> = Vec::new();
    let (mut first, mut size) = (0usize, 0usize);
    for (i, &id) in pending.iter().enumerate() {
        let t = &ctx[id];
        let need = buffer_type.alloc_size(t);
        if need > max_size {
            return Err(Error::TensorTooLarge {
                tensor: t.display_name().to_string(),
                buffer_type: buffer_type.name().to_string(),
                size: need,
                max_size,
            });
        }
        let end = align_up(size, align)
            .checked_add(need)
            .ok_or(Error::SizeOverflow)?;
        if end > max_size && i > first {
            groups.push((first, i, size));
            first = i;
            size = need;
        } else {
            size = end;
        }
    }
    groups.push((first, pending.len(), size));

    // Allocate every part before placing anything, so a failed allocation leaves `ctx` as it was.
    let parts = groups
        .iter()
        .map(|&(_, _, size)| Buffer::alloc(buffer_type, size.max(1)))
        .collect::<Result<Vec<_>>>()?;
    for (&(lo, hi, _), buffer) in groups.iter().zip(&parts) {
        let mut alloc = TensorAllocator::new(buffer.clone());
        for &id in &pending[lo..hi] {
            alloc.alloc(ctx, id)?;
        }
    }
    let mut parts = parts;
    let views: Vec<TensorId> = ctx
        .ids()
        .filter(|&id| ctx[id].data.is_none() && ctx[id].view_src.is_some())
        .collect();
    for id in views {
        ctx.init_view(id)?;
    }
    if parts.len() == 1 {
        return Ok(parts.pop());
    }
    Buffer::multi(parts).map(Some)
}
