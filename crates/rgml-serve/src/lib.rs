//! `rgml serve`: an OpenAI-compatible HTTP server over one model, decoding the sequences of
//! several requests in one batch (continuous batching).
//!
//! - [`generator`]: the types between the HTTP layer and what generates ([`Generator`]).
//! - [`engine`]: the real generator: slots over one multi-sequence [`rgml_llm::Session`],
//!   a batch per step, a queue when every slot is busy.
//! - [`http`]: the routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//!   `/health`, `/metrics`, the chat page at `/`), server-sent events, limits, shutdown.
#![warn(missing_docs)]

pub mod engine;
pub mod generator;
pub mod http;

pub use generator::{GenEvent, GenRequest, Generator, Prompt, Stats, Submission, SubmitError};
