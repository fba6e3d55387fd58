//! What the HTTP layer asks of the thing that generates text: a [`Generator`] takes a
//! [`GenRequest`] (prompt and sampling settings, already checked for type), checks it against
//! the model (prompt length, sampler ranges) and streams [`GenEvent`]s back until the request
//! ends. The engine (`crate::engine`) is the real one: continuous batching over a model's
//! slots. Tests of the HTTP layer use scripted generators.
//!
//! This module owns the types between the two layers; it computes nothing.

use rgml_llm::chat::Message;
use rgml_llm::grammar::Grammar;
use rgml_llm::tool_calls::ToolCallFormat;
use rgml_llm::{SamplerParams, TokenId, Tokenizer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The prompt of a request.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Text, tokenized as llama.cpp's tools do (BOS as the vocabulary asks, control tokens in
    /// the text parsed): `/v1/completions`.
    Text(String),
    /// Token ids (`/v1/completions` with a list of integers).
    Tokens(Vec<TokenId>),
    /// A conversation, formatted with the model's chat template and the assistant's turn opened:
    /// `/v1/chat/completions`.
    Chat(Vec<Message>),
    /// A conversation with tool definitions (the OpenAI `tools` list), which the model's Jinja
    /// chat template presents: `/v1/chat/completions` with `tools`.
    ChatWithTools {
        /// The conversation.
        messages: Vec<Message>,
        /// The tool definitions: the request's JSON text (its keys' order reaches the
        /// template).
        tools: String,
    },
}

/// What the answer must be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// Any text.
    #[default]
    Text,
    /// One JSON object and nothing else (OpenAI's `response_format` `json_object`): tokens that
    /// would leave no JSON object prefix are never sampled, and the answer ends when the object
    /// closes.
    JsonObject,
    /// A sentence of a grammar (llama.cpp's `grammar` in GBNF, a JSON schema's, a forced tool
    /// call in the model's frame): tokens that would leave none are never sampled, the answer ends where the grammar allows
    /// nothing more, and an end-of-generation token comes only where a sentence is complete.
    Grammar(Arc<Grammar>),
    /// A chat answer that is one JSON document (`response_format`), as llama-server's chat
    /// parser takes it ([`rgml_llm::grammar::schema::answer_to_gbnf`]): the grammar for a
    /// prompt that leaves the model's reasoning to it (`fresh`) and for one that opened it
    /// (`open`); [`OutputFormat::after_prompt`] picks one.
    JsonAnswer {
        /// The model may reason first, or shows no reasoning.
        fresh: Arc<Grammar>,
        /// The prompt opened the model's reasoning: the output continues it.
        open: Arc<Grammar>,
    },
}

impl OutputFormat {
    /// The format for a prompt that opened the model's reasoning (`reasoning_open`) or not.
    pub fn after_prompt(self, reasoning_open: bool) -> OutputFormat {
        match self {
            OutputFormat::JsonAnswer { fresh, open } => {
                OutputFormat::Grammar(if reasoning_open { open } else { fresh })
            }
            other => other,
        }
    }
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Sampling settings (temperature 0: greedy).
    pub sampling: SamplerParams,
    /// Most tokens to generate; `None`: until the end of generation or of the slot's context.
    pub max_tokens: Option<usize>,
    /// Strings that end the generation; the text up to (not including) the first one found is
    /// returned, and the finish reason is [`FinishReason::Stop`].
    pub stop: Vec<String>,
    /// How many most likely alternatives to report with each token's log-probability (`None`:
    /// no log-probabilities; `Some(0)`: the chosen token's only).
    pub n_probs: Option<usize>,
    /// Never end at an end-of-generation token (llama-server's `ignore_eos`: such tokens are
    /// not sampled), e.g. to make benchmark requests equally long.
    pub ignore_eos: bool,
    /// What the answer must be.
    pub format: OutputFormat,
}

/// A token's log-probability under the model's distribution (softmax of the raw logits).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: TokenId,
    /// Its text (invalid UTF-8 replaced).
    pub text: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability.
    pub logprob: f32,
}

/// The log-probabilities of one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    /// The chosen token's.
    pub chosen: TokenLogprob,
    /// The most likely tokens', best first (`n_probs` of them).
    pub top: Vec<TokenLogprob>,
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    /// The token id.
    pub id: TokenId,
    /// Text completed by this token, ready to show (may be empty: a token can end inside a
    /// UTF-8 character, or inside a possible stop string that is held back).
    pub text: String,
    /// With `n_probs`: its log-probabilities.
    pub logprobs: Option<Logprobs>,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string (OpenAI's `stop`).
    Stop,
    /// `max_tokens`, or the slot's context is full (OpenAI's `length`).
    Length,
    /// The server is shutting down: the request was cut short (reported as `stop`).
    Shutdown,
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Of those, found in the slot's cache (not evaluated again).
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
}

/// What a generation sends while it runs: [`GenEvent::Token`]s, then exactly one
/// [`GenEvent::Done`] or [`GenEvent::Failed`].
#[derive(Clone, Debug, PartialEq)]
pub enum GenEvent {
    /// The next token.
    Token(TokenOut),
    /// Finished: any text still held back (a partial stop string that did not complete) and
    /// the reason.
    Done {
        /// Text not sent yet (usually empty).
        text: String,
        /// Why it ended.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
    /// The computation failed; the message says why (a server error, not the client's).
    Failed(String),
}

/// Why a request was refused before it started (the client's error unless said otherwise).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The chat template failed on the conversation (e.g. it raised an exception).
    #[error("{0}")]
    ChatTemplate(String),
    /// The prompt is empty (after tokenization).
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt does not fit in a slot's context.
    #[error("the prompt has {n_prompt} tokens, more than the context of {n_ctx}")]
    PromptTooLong {
        /// Tokens of the prompt.
        n_prompt: usize,
        /// A slot's context.
        n_ctx: usize,
    },
    /// `max_tokens` larger than a slot's context.
    #[error("max_tokens {max_tokens} is larger than the context of {n_ctx}")]
    MaxTokensTooLarge {
        /// Asked for.
        max_tokens: usize,
        /// A slot's context.
        n_ctx: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token {id} is outside the vocabulary of {n_vocab}")]
    InvalidToken {
        /// The id.
        id: TokenId,
        /// The vocabulary's size.
        n_vocab: usize,
    },
    /// A `logit_bias` token id outside the vocabulary.
    #[error("logit_bias: token {id} is outside the vocabulary of {n_vocab}")]
    InvalidBiasToken {
        /// The id.
        id: TokenId,
        /// The vocabulary's size.
        n_vocab: usize,
    },
    /// A sampling setting out of range (`name` is the [`SamplerParams`] field; the message
    /// names the request's).
    #[error("{} = {value}: must be {range}", request_field(name))]
    InvalidSampling {
        /// The field.
        name: &'static str,
        /// Its value.
        value: String,
        /// The allowed range.
        range: &'static str,
    },
    /// Too many requests wait already (HTTP 503/429).
    #[error("too many requests are waiting ({0}); try again later")]
    QueueFull(usize),
    /// The server is shutting down (HTTP 503).
    #[error("the server is shutting down")]
    ShuttingDown,
    /// Computing an answer failed (HTTP 500): the model or a device, not the request.
    #[error("{0}")]
    Failed(String),
    /// The model is an encoder (`arch`): it computes embeddings, not text (HTTP 501, as
    /// llama-server answers completions on an embeddings-only server).
    #[error(
        "the model ({0}) computes embeddings only: it does not generate text; use /v1/embeddings"
    )]
    EmbeddingsOnly(String),
}

/// The request's field of a sampler setting (`temperature` for the sampler's `temp`).
pub fn request_field(sampler_name: &str) -> &str {
    match sampler_name {
        "temp" => "temperature",
        other => other,
    }
}

impl SubmitError {
    /// `params`' range check ([`SamplerParams::validate`]) as a refusal naming the sampler's
    /// setting.
    pub fn check_sampling(params: &SamplerParams) -> Result<(), SubmitError> {
        params.validate().map_err(|e| match e {
            rgml_llm::LlmError::InvalidSampler { name, value, range } => {
                SubmitError::InvalidSampling {
                    name,
                    value: value.to_string(),
                    range,
                }
            }
            other => SubmitError::InvalidSampling {
                name: "sampling",
                value: other.to_string(),
                range: "valid",
            },
        })
    }
}

/// A running request: its events, and cancellation when dropped (a client that disconnects
/// frees its slot at once: the HTTP layer drops the submission).
pub struct Submission {
    /// The request's events, in order; closed after `Done` or `Failed`.
    pub events: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// The prompt opened the model's reasoning (it ends with `<think>`): the output starts
    /// inside it.
    pub reasoning_open: bool,
    cancel: CancelOnDrop,
}

impl Submission {
    /// A submission reading `events`, which sets `cancelled` when dropped.
    pub fn new(
        events: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
        prompt_tokens: usize,
        cancelled: Arc<AtomicBool>,
        wake: Box<dyn Fn() + Send + Sync>,
    ) -> Submission {
        Submission {
            events,
            prompt_tokens,
            reasoning_open: false,
            cancel: CancelOnDrop { cancelled, wake },
        }
    }

    /// Cancel now (as dropping does).
    pub fn cancel(&self) {
        self.cancel.fire();
    }
}

struct CancelOnDrop {
    cancelled: Arc<AtomicBool>,
    /// Tells the generator to look (it may be waiting for work).
    wake: Box<dyn Fn() + Send + Sync>,
}

impl CancelOnDrop {
    fn fire(&self) {
        if !self.cancelled.swap(true, Ordering::AcqRel) {
            (self.wake)();
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.fire();
    }
}

/// Counters for `/metrics` (totals since start, and what is happening now).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Slots (sequences decoded together).
    pub n_slots: usize,
    /// Slots running a request now.
    pub slots_busy: usize,
    /// Requests waiting for a slot.
    pub queue_len: usize,
    /// Requests accepted.
    pub requests_total: u64,
    /// Requests that ended (any reason, including cancelled and failed).
    pub requests_finished: u64,
    /// Requests cancelled by their client.
    pub requests_cancelled: u64,
    /// Prompt tokens evaluated (cached ones not counted).
    pub prompt_tokens_total: u64,
    /// Tokens generated.
    pub generated_tokens_total: u64,
    /// Seconds spent computing batches with prompt tokens.
    pub prompt_seconds_total: f64,
    /// Seconds spent computing generation-only batches.
    pub generation_seconds_total: f64,
    /// Generated tokens per second over the last few seconds (0 when idle).
    pub generated_tokens_per_second: f64,
}

/// A text generator the HTTP layer serves.
pub trait Generator: Send + Sync + 'static {
    /// The model's name (`/v1/models`, the `model` field of responses and requests).
    fn model_id(&self) -> &str;
    /// Tokens a slot holds (prompt and generated).
    fn n_ctx(&self) -> usize;
    /// Check `request` and start it (queued while every slot is busy).
    fn submit(&self, request: GenRequest) -> Result<Submission, SubmitError>;
    /// Counters for `/metrics`.
    fn stats(&self) -> Stats;
    /// Stop accepting requests; end running ones at their next token with
    /// [`FinishReason::Shutdown`], fail queued ones. Returns at once.
    fn shutdown(&self);
    /// Whether it can serve requests (`/health`); `false` once it failed for good.
    fn healthy(&self) -> bool {
        true
    }
    /// How the model writes tool calls (its chat template's format); `None`: requests with
    /// `tools` are refused, as their calls could not be read.
    fn tool_call_format(&self) -> Option<ToolCallFormat> {
        None
    }
    /// How the model writes its reasoning, where its chat template shows it (`<think>` tags,
    /// harmony's analysis channel): a chat answer's reasoning is then returned as
    /// `reasoning_content`.
    fn reasoning_syntax(&self) -> Option<rgml_llm::reasoning::Syntax> {
        None
    }
    /// The model's tokenizer (`/tokenize`, `/detokenize`); `None`: those routes answer 501.
    fn tokenizer(&self) -> Option<&Tokenizer> {
        None
    }
    /// A conversation's prompt as the chat template renders it (`/apply-template`); `None`:
    /// the route answers 501.
    fn apply_template(&self, _prompt: &Prompt) -> Option<Result<String, SubmitError>> {
        None
    }
    /// The Jinja chat template that renders conversations (`/props`' `chat_template`); `None`
    /// where none runs.
    fn chat_template(&self) -> Option<&str> {
        None
    }
    /// Each input's pooled embedding, normalised to length 1 (`/v1/embeddings`); blocks while
    /// it computes them. `None`: the route answers 501.
    fn embed(&self, _inputs: &[Vec<TokenId>]) -> Option<Result<Vec<Vec<f32>>, SubmitError>> {
        None
    }
}
