//! Test support shared by the core crate's integration tests: a Vec-backed host buffer type,
//! so the core crate needs no backend to test its allocators.

use rgml::backend::{BufferImpl, BufferType};
use rgml::{BufferTypeRef, Result};
use std::sync::{Arc, Mutex};

struct VecBufferType {
    name: String,
    max_size: usize,
}

struct VecBuffer {
    bytes: Mutex<Vec<u8>>,
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
        32
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn is_host(&self) -> bool {
        true
    }
}

// SAFETY: no base; the bytes sit behind a mutex.
unsafe impl BufferImpl for VecBuffer {
    fn size(&self) -> usize {
        self.bytes.lock().map_or(0, |b| b.len())
    }

    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.bytes.lock().unwrap()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        out.copy_from_slice(&self.bytes.lock().unwrap()[offset..offset + out.len()]);
        Ok(())
    }
    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        self.bytes.lock().unwrap()[offset..offset + size].fill(value);
        Ok(())
    }
    unsafe fn clear(&self, value: u8) -> Result<()> {
        self.bytes.lock().unwrap().fill(value);
        Ok(())
    }
}

/// A host buffer type named `name` (alignment 32) whose buffers hold at most `max_size` bytes.
pub fn vec_buffer_type(name: &str, max_size: usize) -> BufferTypeRef {
    Arc::new(VecBufferType {
        name: name.into(),
        max_size,
    })
}
