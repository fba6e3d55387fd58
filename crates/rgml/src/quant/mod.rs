//! Quantized block formats and their reference codecs (placeholder: being written).
