//! CPU backend for rgml.
#![warn(missing_docs)]

pub mod kernels;
