//! Quantized dot products (placeholder: being written).
