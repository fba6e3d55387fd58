//! Bump allocation of tensors in one buffer.

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

/// Allocate one buffer of `buffer_type` holding every tensor of `ctx` that has no storage yet
/// (views are pointed at their sources). Returns `None` when there is nothing to allocate.
pub fn alloc_ctx_tensors(
    ctx: &mut Context,
    buffer_type: &BufferTypeRef,
) -> Result<Option<Arc<Buffer>>> {
    let align = buffer_type.alignment();
    let pending: Vec<TensorId> = ctx
        .ids()
        .filter(|&id| ctx[id].data.is_none() && ctx[id].view_src.is_none())
        .collect();
    let mut size = 0usize;
    for &id in &pending {
        size = align_up(size, align)
            .checked_add(buffer_type.alloc_size(&ctx[id]))
            .ok_or(Error::SizeOverflow)?;
    }
    if pending.is_empty() {
        return Ok(None);
    }
    let buffer = Buffer::alloc(buffer_type, size.max(1))?;
    let mut alloc = TensorAllocator::new(buffer.clone());
    for id in pending {
        alloc.alloc(ctx, id)?;
    }
    let views: Vec<TensorId> = ctx
        .ids()
        .filter(|&id| ctx[id].data.is_none() && ctx[id].view_src.is_some())
        .collect();
    for id in views {
        ctx.init_view(id)?;
    }
    Ok(Some(buffer))
}
