//! The mock buffer type: buffers that are a `Vec<u8>` behind a mutex, flagged either as host
//! memory or as memory only a device reaches. No base pointer, so no kernel can address them;
//! every byte goes through `Buffer::set` / `get`.

use crate::backend::{BufferImpl, BufferType, BufferTypeRef, Device, DeviceRef};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// A buffer type of `Vec<u8>` buffers (see the module docs).
#[derive(Clone, Debug)]
pub struct VecBufferType {
    name: String,
    alignment: usize,
    max_size: usize,
    host: bool,
    device: Option<Weak<dyn Device>>,
}

impl VecBufferType {
    /// Host-flagged memory called `name`, alignment 32, no size limit.
    pub fn new(name: impl Into<String>) -> Self {
        VecBufferType {
            name: name.into(),
            alignment: 32,
            max_size: usize::MAX,
            host: true,
            device: None,
        }
    }

    /// Memory of `device` (what [`BufferType::device`] returns, e.g. for its free memory).
    pub fn with_device(mut self, device: Weak<dyn Device>) -> Self {
        self.device = Some(device);
        self
    }

    /// Buffers of at most `max_size` bytes (multi-buffers beyond).
    pub fn with_max_size(mut self, max_size: usize) -> Self {
        self.max_size = max_size;
        self
    }

    /// Tensor offsets aligned to `alignment`.
    pub fn with_alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment;
        self
    }

    /// Memory the CPU cannot address, like a GPU's (`is_host` is false).
    pub fn device_only(mut self) -> Self {
        self.host = false;
        self
    }

    /// Shared, as buffer types are used.
    pub fn shared(self) -> BufferTypeRef {
        Arc::new(self)
    }
}

impl BufferType for VecBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        Ok(Box::new(VecBuffer {
            bytes: Mutex::new(vec![0; size]),
        }))
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn is_host(&self) -> bool {
        self.host
    }
    fn device(&self) -> Option<DeviceRef> {
        self.device.as_ref()?.upgrade()
    }
}

struct VecBuffer {
    bytes: Mutex<Vec<u8>>,
}

impl VecBuffer {
    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `bytes[offset..offset + len]`, or an error past the end.
fn range(bytes: &mut [u8], offset: usize, len: usize) -> Result<&mut [u8]> {
    let limit = bytes.len();
    offset
        .checked_add(len)
        .and_then(|end| bytes.get_mut(offset..end))
        .ok_or(Error::OutOfBounds {
            what: "a test buffer".into(),
            offset,
            size: len,
            limit,
        })
}

// SAFETY: no base (kernels never address it); the bytes sit behind a mutex.
unsafe impl BufferImpl for VecBuffer {
    fn size(&self) -> usize {
        self.bytes().len()
    }
    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        range(&mut self.bytes(), offset, data.len())?.copy_from_slice(data);
        Ok(())
    }
    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        out.copy_from_slice(range(&mut self.bytes(), offset, out.len())?);
        Ok(())
    }
    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        range(&mut self.bytes(), offset, size)?.fill(value);
        Ok(())
    }
    unsafe fn clear(&self, value: u8) -> Result<()> {
        self.bytes().fill(value);
        Ok(())
    }
}
