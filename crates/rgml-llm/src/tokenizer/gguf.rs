//! Reading a [`Tokenizer`](super::Tokenizer) from GGUF metadata (`tokenizer.ggml.*`).
