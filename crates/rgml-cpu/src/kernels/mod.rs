//! CPU kernels.

pub mod dot;
