//! The meta buffer type and buffer: one child buffer per device, each tensor's per-device slice
//! at the tensor's own offset in every child.
//!
//! Children are as large as the meta buffer, so a tensor placed at meta offset `o` owns
//! `[o, o + nbytes)` in every child and its slices (never larger than the tensor) fit there
//! whatever its split state: computed tensors need no state when the allocator places them.
//! (This spends the whole size on every device; giving each child only its slices' bytes is
//! the memory saving still to come.)
//!
//! `init_tensor` records every non-view tensor placed here (offset, dtype, shape, and the split
//! state its [`SplitSource`] gives, if any). Whole-tensor `set` / `get` of a split or partial
//! tensor scatter / gather ([`mod@super::scatter`]); mirrored tensors, unrecorded ranges and
//! `memset` go to every child alike (reads from the first). A part of a split tensor is an
//! error, not a silent mix-up.

use super::scatter::{gather, scatter};
use super::split::SplitState;
use crate::backend::{Buffer, BufferImpl, BufferType, BufferTypeRef, DeviceRef};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

/// Where the split states of a meta device's weights come from (the model loader: a tensor's
/// role decides its split, see `rgml_llm::tensor_split`). `None`: mirrored.
pub trait SplitSource: Send + Sync {
    /// The split of `tensor` (placed in a meta buffer), if it is split.
    fn split_state(&self, tensor: &Tensor) -> Option<SplitState>;
}

/// Splits by tensor name.
impl SplitSource for std::collections::HashMap<String, SplitState> {
    fn split_state(&self, tensor: &Tensor) -> Option<SplitState> {
        self.get(&tensor.name).cloned()
    }
}

/// A meta device's memory: one buffer of each child buffer type per meta buffer.
pub struct MetaBufferType {
    name: String,
    children: Vec<BufferTypeRef>,
    source: Arc<dyn SplitSource>,
    device: Option<Weak<dyn crate::backend::Device>>,
}

impl MetaBufferType {
    /// Over `children` (one per device, in device order), with weights' splits from `source`;
    /// `device`: the meta device, if any.
    pub fn new(
        children: Vec<BufferTypeRef>,
        source: Arc<dyn SplitSource>,
        device: Option<Weak<dyn crate::backend::Device>>,
    ) -> Result<MetaBufferType> {
        if children.is_empty() {
            return Err(Error::InvalidSplit(
                "a meta buffer type needs children".into(),
            ));
        }
        Ok(Self::build(children, source, device))
    }

    /// [`new`](Self::new) for children known to be there.
    pub(crate) fn build(
        children: Vec<BufferTypeRef>,
        source: Arc<dyn SplitSource>,
        device: Option<Weak<dyn crate::backend::Device>>,
    ) -> MetaBufferType {
        let name = format!(
            "Meta({})",
            children
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(",")
        );
        MetaBufferType {
            name,
            children,
            source,
            device,
        }
    }

    /// The child buffer types, in device order.
    pub fn children(&self) -> &[BufferTypeRef] {
        &self.children
    }
}

impl BufferType for MetaBufferType {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        let children = self
            .children
            .iter()
            .map(|c| Buffer::alloc(c, size))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(MetaBuffer {
            children,
            source: self.source.clone(),
            tensors: Mutex::new(BTreeMap::new()),
        }))
    }

    /// The strictest child's, so every child's offsets are aligned.
    fn alignment(&self) -> usize {
        self.children
            .iter()
            .map(|c| c.alignment())
            .max()
            .unwrap_or(1)
    }

    fn max_size(&self) -> usize {
        self.children
            .iter()
            .map(|c| c.max_size())
            .min()
            .unwrap_or(0)
    }

    fn device(&self) -> Option<DeviceRef> {
        self.device.as_ref()?.upgrade()
    }
}

/// A tensor recorded by [`MetaBuffer`].
#[derive(Clone, Debug)]
struct Entry {
    dtype: DType,
    ne: [usize; 4],
    nbytes: usize,
    name: String,
    state: SplitState,
}

/// A meta buffer: child buffers and the tensors placed in them.
pub struct MetaBuffer {
    children: Vec<Arc<Buffer>>,
    source: Arc<dyn SplitSource>,
    /// Tensors by offset.
    tensors: Mutex<BTreeMap<usize, Entry>>,
}

impl MetaBuffer {
    /// The child buffers, in device order.
    pub fn children(&self) -> &[Arc<Buffer>] {
        &self.children
    }

    /// The split state recorded for the tensor at `offset` (mirrored when none was given).
    pub fn split_state(&self, offset: usize) -> Option<SplitState> {
        let tensors = self.tensors.lock().unwrap_or_else(|p| p.into_inner());
        tensors.get(&offset).map(|e| e.state.clone())
    }

    /// Record that tensor `t` (computed, at `offset`) has split state `state` (the meta
    /// backend does this once it has propagated the states). It replaces whatever was recorded
    /// at that offset: the graph allocator reuses memory, and the bytes belong to the tensor
    /// computed there last.
    pub fn record(&self, offset: usize, t: &Tensor, state: SplitState) -> Result<()> {
        state
            .validate(t.ne, self.children.len())
            .map_err(|e| Error::InvalidSplit(format!("tensor '{}': {e}", t.display_name())))?;
        let mut tensors = self.tensors.lock().unwrap_or_else(|p| p.into_inner());
        tensors.insert(
            offset,
            Entry {
                dtype: t.dtype,
                ne: t.ne,
                nbytes: t.nbytes(),
                name: t.display_name().to_string(),
                state,
            },
        );
        Ok(())
    }

    /// The recorded tensor covering `[offset, offset + len)`, if any, with its offset.
    fn covering(&self, offset: usize, len: usize) -> Option<(usize, Entry)> {
        let tensors = self.tensors.lock().unwrap_or_else(|p| p.into_inner());
        let (&start, e) = tensors.range(..=offset).next_back()?;
        (offset + len <= start + e.nbytes && offset < start + e.nbytes.max(1))
            .then(|| (start, e.clone()))
    }

    /// The split tensor (not mirrored) that `[offset, offset + len)` touches, which must then be
    /// exactly the whole tensor.
    fn split_whole(&self, what: &str, offset: usize, len: usize) -> Result<Option<Entry>> {
        let Some((start, e)) = self.covering(offset, len) else {
            return Ok(None);
        };
        if e.state == SplitState::Mirrored {
            return Ok(None);
        }
        if start != offset || len != e.nbytes {
            return Err(Error::InvalidSplit(format!(
                "{what} of bytes {offset}..{} of split tensor '{}' (bytes {start}..{}): only the \
                 whole tensor can be scattered or gathered",
                offset + len,
                e.name,
                start + e.nbytes
            )));
        }
        Ok(Some(e))
    }
}

fn local_bytes(e: &Entry, d: usize) -> Result<usize> {
    let ne = e.state.local_shape(e.ne, d);
    let row = e.dtype.row_bytes(ne[0])?;
    ne[1..]
        .iter()
        .try_fold(row, |a, &n| a.checked_mul(n))
        .ok_or(Error::SizeOverflow)
}

// SAFETY: a meta buffer has no base; its bytes live in the child buffers, reached only through
// their own `Buffer` methods (which take the children's locks).
unsafe impl BufferImpl for MetaBuffer {
    fn size(&self) -> usize {
        self.children.first().map_or(0, |c| c.size())
    }

    fn init_tensor(&self, tensor: &Tensor) -> Result<()> {
        if tensor.view_src.is_some() {
            return Ok(());
        }
        let Some(data) = tensor.data.as_ref() else {
            return Ok(());
        };
        let state = self
            .source
            .split_state(tensor)
            .unwrap_or(SplitState::Mirrored);
        state
            .validate(tensor.ne, self.children.len())
            .map_err(|e| Error::InvalidSplit(format!("tensor '{}': {e}", tensor.display_name())))?;
        let entry = Entry {
            dtype: tensor.dtype,
            ne: tensor.ne,
            nbytes: tensor.nbytes(),
            name: tensor.display_name().to_string(),
            state,
        };
        let mut tensors = self.tensors.lock().unwrap_or_else(|p| p.into_inner());
        tensors.insert(data.offset, entry);
        Ok(())
    }

    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        match self.split_whole("a write", offset, data.len())? {
            Some(e) => {
                let parts = scatter(e.dtype, e.ne, &e.state, self.children.len(), data)?;
                for (child, part) in self.children.iter().zip(&parts) {
                    child.set(offset, part)?;
                }
                Ok(())
            }
            None => {
                for child in &self.children {
                    child.set(offset, data)?;
                }
                Ok(())
            }
        }
    }

    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        match self.split_whole("a read", offset, out.len())? {
            Some(e) => {
                let mut parts = Vec::with_capacity(self.children.len());
                for (d, child) in self.children.iter().enumerate() {
                    let mut part = vec![0u8; local_bytes(&e, d)?];
                    child.get(offset, &mut part)?;
                    parts.push(part);
                }
                out.copy_from_slice(&gather(e.dtype, e.ne, &e.state, &parts)?);
                Ok(())
            }
            None => match self.children.first() {
                Some(child) => child.get(offset, out),
                None => Err(Error::InvalidSplit("a meta buffer without children".into())),
            },
        }
    }

    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        // Every child reserves the tensor's whole range, so one range fits all slices.
        for child in &self.children {
            child.memset(offset, value, size)?;
        }
        Ok(())
    }

    unsafe fn clear(&self, value: u8) -> Result<()> {
        for child in &self.children {
            child.clear(value)?;
        }
        Ok(())
    }

    fn reset(&self) {
        self.tensors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
