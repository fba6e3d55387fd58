//! Test support shared by the core crate's integration tests: a Vec-backed host buffer type
//! (`rgml::testing`), so the core crate needs no backend to test its allocators.

use rgml::testing::VecBufferType;
use rgml::BufferTypeRef;

/// A host buffer type named `name` (alignment 32) whose buffers hold at most `max_size` bytes.
pub fn vec_buffer_type(name: &str, max_size: usize) -> BufferTypeRef {
    VecBufferType::new(name).with_max_size(max_size).shared()
}
