//! The operands of a matrix-vector kernel: a run of weight rows against one activation row.

/// A matrix-vector kernel: `out[r] = dot(row r, y)` for the `out.len()` weight rows of the
/// run, each output bit for bit `vec_dot`'s.
///
/// # Safety
/// Each of the `out.len()` rows of the run holds `nb` readable blocks of the kernel's type;
/// `y` holds `nb` readable activation blocks.
pub(crate) type MatvecKernel = unsafe fn(RowRun, &mut [f32]);

/// The operands of a [`MatvecKernel`] but the outputs.
#[derive(Clone, Copy)]
pub(crate) struct RowRun {
    /// Blocks per row.
    pub nb: usize,
    /// The first weight row.
    pub x0: *const u8,
    /// Bytes from one weight row to the next.
    pub row_stride: usize,
    /// The activation row (blocks of the weight type's `vec_dot_type`).
    pub y: *const u8,
}
