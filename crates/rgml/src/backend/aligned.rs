//! Zero-initialised, aligned heap memory: the raw allocation under every host buffer type (the
//! CPU's, a GPU device's host staging memory) and the CPU backend's work areas.
//!
//! This module owns the allocation, its bounds checks and its release; what the bytes mean
//! and who may touch them when is the owning buffer's business (see [`Buffer`]'s locks).
//!
//! [`Buffer`]: super::Buffer

use crate::error::{Error, Result};
use std::alloc::Layout;
use std::ptr::NonNull;

/// A zero-initialised heap block of `len` bytes aligned to `align` (an empty one allocates
/// nothing).
pub struct AlignedMem {
    ptr: NonNull<u8>,
    size: usize,
    align: usize,
}

// SAFETY: `AlignedMem` owns its allocation exclusively (like a `Box<[u8]>`); the raw pointer is
// not shared with anything that outlives it, so moving it across threads is sound.
unsafe impl Send for AlignedMem {}
// SAFETY: `&AlignedMem` hands out the base pointer and bounds-checked slices; every write
// through them is synchronised by the owner (a `Buffer`'s exclusive lock, or a backend's
// `&mut self`), every read by its shared lock.
unsafe impl Sync for AlignedMem {}

impl AlignedMem {
    /// Allocate `size` zeroed bytes aligned to `align` (a power of two); `owner` names the
    /// buffer type in an out-of-memory error.
    pub fn new(size: usize, align: usize, owner: &str) -> Result<AlignedMem> {
        let oom = |reason| Error::OutOfMemory {
            buffer_type: owner.to_string(),
            size,
            reason,
        };
        let layout = Layout::from_size_align(size.max(1), align)
            .map_err(|_| oom("size too large for an allocation"))?;
        if size == 0 {
            // Aligned, never dereferenced for more than 0 bytes, never freed.
            let ptr = NonNull::new(align as *mut u8).ok_or_else(|| oom("zero alignment"))?;
            return Ok(AlignedMem { ptr, size, align });
        }
        // SAFETY: `layout` has a non-zero size and a valid power-of-two alignment (checked by
        // `from_size_align`), as `alloc_zeroed` requires.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| oom("the system allocator failed"))?;
        Ok(AlignedMem { ptr, size, align })
    }

    /// The first byte.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes allocated.
    pub fn len(&self) -> usize {
        self.size
    }

    /// Whether nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds {
                what: "host memory access".into(),
                offset,
                size: len,
                limit: self.size,
            });
        }
        Ok(())
    }

    /// `len` bytes at `offset`. The caller holds whatever excludes writers (the owning
    /// buffer's shared lock).
    pub fn bytes(&self, offset: usize, len: usize) -> Result<&[u8]> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: the range is inside the allocation (checked above), whose bytes are all
        // initialised (zeroed at allocation); writers are excluded by the caller's lock.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// Mutable view of `len` bytes at `offset` through a shared reference: the caller
    /// guarantees exclusive access (the owning buffer's write lock; `Buffer` calls every
    /// mutating `BufferImpl` method under it).
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: the range is inside the allocation (checked above); the caller holds the
        // exclusive lock, so no other reference to these bytes exists while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }
}

impl AlignedMem {
    /// Copy `data` to `offset` (the caller holds the owning buffer's exclusive lock).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.bytes_mut(offset, data.len())?.copy_from_slice(data);
        Ok(())
    }

    /// Copy `out.len()` bytes at `offset` into `out` (the caller excludes writers).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        out.copy_from_slice(self.bytes(offset, out.len())?);
        Ok(())
    }

    /// Set `size` bytes at `offset` to `value` (the caller holds the exclusive lock).
    pub fn fill(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        self.bytes_mut(offset, size)?.fill(value);
        Ok(())
    }
}

impl Drop for AlignedMem {
    fn drop(&mut self) {
        if self.size == 0 {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.size, self.align) {
            // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout (same size
            // and alignment, validated when allocating) and is freed only here, once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_bounds_checked() {
        for align in [64, 4096] {
            let m = AlignedMem::new(1000, align, "test").unwrap();
            assert_eq!(m.ptr().as_ptr() as usize % align, 0);
            assert!(m.bytes(0, 1000).unwrap().iter().all(|&b| b == 0));
            m.bytes_mut(10, 3).unwrap().copy_from_slice(&[1, 2, 3]);
            assert_eq!(m.bytes(9, 5).unwrap(), &[0, 1, 2, 3, 0]);
            assert!(m.bytes(999, 2).is_err());
            assert!(m.bytes_mut(usize::MAX, 2).is_err());
        }
        let empty = AlignedMem::new(0, 64, "test").unwrap();
        assert!(empty.is_empty() && empty.bytes(0, 0).unwrap().is_empty());
        assert!(empty.bytes(0, 1).is_err());
        assert!(AlignedMem::new(8, 3, "test").is_err());
    }
}
