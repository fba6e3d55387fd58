//! Floor 1 of the kernels: blocks of quantized types in and out of registers and arrays. The
//! row conversions (any type to and from f32), the activation quantizers MUL_MAT runs before its
//! dots, and per type family the decoders of a weight block's quants and scales that the pair
//! dots (floor 2) and tile kernels (floor 3) share.

pub(crate) mod activations;
pub(crate) mod convert;
pub(crate) mod kquant;
pub(crate) mod legacy;
pub(crate) mod lowbit;
