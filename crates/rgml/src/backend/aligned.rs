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
    /// The first aligned byte.
    ptr: NonNull<u8>,
    size: usize,
    /// What was allocated (`None`: nothing, for an empty block) and where it starts.
    allocation: Option<(NonNull<u8>, Layout)>,
}

/// The largest alignment the system allocator's `calloc` path serves. Larger alignments are
/// had by over-allocating with this one and aligning by hand: Rust's allocator zeroes an
/// allocation aligned beyond it with a `memset`, which touches (commits) every page at once,
/// while `calloc` of a large block maps zero pages that cost memory only when written.
const CALLOC_ALIGN: usize = 16;

// SAFETY: `AlignedMem` owns its allocation exclusively (like a `Box<[u8]>`); the raw pointer is
// not shared with anything that outlives it, so moving it across threads is sound.
unsafe impl Send for AlignedMem {}
// SAFETY: through `&AlignedMem` safe code gets only the address and the length; every access to
// the bytes is an `unsafe` call whose caller excludes conflicting accesses (a `Buffer`'s lock,
// or a backend's `&mut self`).
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
        if !align.is_power_of_two() {
            return Err(oom("the alignment is not a power of two"));
        }
        if size == 0 {
            // Aligned, never dereferenced for more than 0 bytes, never freed.
            let ptr = NonNull::new(align as *mut u8).ok_or_else(|| oom("zero alignment"))?;
            return Ok(AlignedMem {
                ptr,
                size,
                allocation: None,
            });
        }
        let padding = align.saturating_sub(CALLOC_ALIGN);
        let layout = size
            .checked_add(padding)
            .and_then(|total| Layout::from_size_align(total, align.min(CALLOC_ALIGN)).ok())
            .ok_or_else(|| oom("size too large for an allocation"))?;
        // SAFETY: `layout` has a non-zero size and a valid power-of-two alignment (checked by
        // `from_size_align`), as `alloc_zeroed` requires.
        let raw = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| oom("the system allocator failed"))?;
        let offset = raw.as_ptr().align_offset(align);
        if offset > padding {
            // SAFETY: `raw` was allocated just above with `layout`.
            unsafe { std::alloc::dealloc(raw.as_ptr(), layout) };
            return Err(oom("the allocation cannot be aligned"));
        }
        // SAFETY: `offset <= padding`, so `raw + offset .. raw + offset + size` lies inside
        // the `size + padding` bytes allocated.
        let ptr = unsafe { raw.add(offset) };
        Ok(AlignedMem {
            ptr,
            size,
            allocation: Some((raw, layout)),
        })
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

    /// `len` bytes at `offset` (bounds-checked).
    ///
    /// # Safety
    /// Nothing writes these bytes while the slice lives (the caller holds the owning buffer's
    /// lock, or has the memory exclusively).
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> Result<&[u8]> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: the range is inside the allocation (checked above), whose bytes are all
        // initialised (zeroed at allocation); writers are excluded by the caller (this
        // function's contract).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// Mutable view of `len` bytes at `offset` (bounds-checked) through a shared reference.
    ///
    /// # Safety
    /// No other reference to these bytes exists, and nothing else accesses them, while the
    /// slice lives (the caller holds the owning buffer's exclusive lock; `Buffer` calls every
    /// mutating `BufferImpl` method under it).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: the range is inside the allocation (checked above); by this function's
        // contract no other reference to these bytes exists while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }
}

impl AlignedMem {
    /// Copy `data` to `offset`.
    ///
    /// # Safety
    /// As [`bytes_mut`](Self::bytes_mut): nothing else accesses these bytes meanwhile.
    pub unsafe fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.bytes_mut(offset, data.len())? }.copy_from_slice(data);
        Ok(())
    }

    /// Copy `out.len()` bytes at `offset` into `out`.
    ///
    /// # Safety
    /// As [`bytes`](Self::bytes): nothing writes these bytes meanwhile.
    pub unsafe fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        out.copy_from_slice(unsafe { self.bytes(offset, out.len())? });
        Ok(())
    }

    /// Set `size` bytes at `offset` to `value`.
    ///
    /// # Safety
    /// As [`bytes_mut`](Self::bytes_mut): nothing else accesses these bytes meanwhile.
    pub unsafe fn fill(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.bytes_mut(offset, size)? }.fill(value);
        Ok(())
    }

    /// The whole block, mutably: safe, since `&mut self` excludes every other access.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.size == 0 {
            return &mut [];
        }
        // SAFETY: the allocation holds `size` initialised bytes and `&mut self` is the only
        // way to reach them now.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) }
    }
}

impl Drop for AlignedMem {
    fn drop(&mut self) {
        if let Some((raw, layout)) = self.allocation.take() {
            // SAFETY: `raw` was returned by `alloc_zeroed` with exactly `layout` and is freed
            // only here, once.
            unsafe { std::alloc::dealloc(raw.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_bounds_checked() {
        for align in [1, 16, 32, 64, 4096] {
            let mut m = AlignedMem::new(1000, align, "test").unwrap();
            assert_eq!(m.ptr().as_ptr() as usize % align, 0);
            assert!(m.as_mut_slice().iter().all(|&b| b == 0));
            m.as_mut_slice()[10..13].copy_from_slice(&[1, 2, 3]);
            // SAFETY: `m` is owned here and no other slice of it lives.
            unsafe {
                assert_eq!(m.bytes(9, 5).unwrap(), &[0, 1, 2, 3, 0]);
                assert!(m.bytes(999, 2).is_err());
                assert!(m.bytes_mut(usize::MAX, 2).is_err());
            }
        }
        let empty = AlignedMem::new(0, 64, "test").unwrap();
        // SAFETY: `empty` is owned here.
        unsafe {
            assert!(empty.is_empty() && empty.bytes(0, 0).unwrap().is_empty());
            assert!(empty.bytes(0, 1).is_err());
        }
        assert!(AlignedMem::new(8, 3, "test").is_err());
    }

    /// Resident memory of this process in bytes (Linux).
    #[cfg(target_os = "linux")]
    fn resident() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<usize>()
            .unwrap()
            * 1024
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_block_costs_memory_only_where_written() {
        const SIZE: usize = 1 << 30;
        let before = resident();
        let mut m = AlignedMem::new(SIZE, 64, "test").unwrap();
        let slice = m.as_mut_slice();
        slice[0] = 1;
        slice[SIZE - 1] = 2;
        let grown = resident().saturating_sub(before);
        assert!(
            grown < 64 << 20,
            "a 1 GiB block made {grown} bytes resident"
        );
        assert_eq!((slice[0], slice[SIZE / 2], slice[SIZE - 1]), (1, 0, 2));
    }
}
