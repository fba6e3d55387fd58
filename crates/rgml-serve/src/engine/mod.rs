//! The engine: a [`Generator`] that decodes up to `n_slots` requests together on one model.
//!
//! One thread (the worker, [`worker`]) owns a [`Session`] holding one sequence per slot. Each
//! step it gives queued requests the free slots, builds one batch of every busy slot's next
//! tokens (a generating slot's last sampled token; a new request's prompt, in pieces that keep
//! the step to one micro-batch) and decodes it: continuous batching, where a request joins the
//! running batch at the next step and leaves it when it ends. A slot keeps the tokens its
//! sequence holds after its request ends, so that the next request with the same beginning (a
//! chat's next turn) evaluates only what is new; a request takes the common prefix from another
//! slot when that one has more of it ([`Session::seq_cp`]).
//!
//! This module owns the requests' way in: checking them against the model ([`Engine::submit`]),
//! the queue, cancellation and the counters. The worker and the slots own the decoding.

mod slot;
mod worker;

use crate::generator::{GenEvent, GenRequest, Generator, Prompt, Stats, Submission, SubmitError};
use rgml_llm::chat::{ChatFormat, ChatFormatter};
use rgml_llm::embed::{normalize, Pooling};
use rgml_llm::{EncodeOptions, Model, Session, SessionOptions, TokenId};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// How to run the engine.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// The name clients use for the model.
    pub model_id: String,
    /// Most requests waiting for a slot; more are refused ([`SubmitError::QueueFull`]).
    pub max_queue: usize,
    /// Tokens a step evaluates, about: with no slot generating, pieces of prompts until this
    /// many (at least one piece); while slots generate, their tokens and one prompt piece. A prompt is evaluated in pieces of the session's
    /// micro-batch, as `Session::eval` cuts it, so a long one spreads over several steps and the
    /// other slots keep generating between them.
    pub max_batch: usize,
    /// Which cached prefix a new request may keep (see [`PrefixReuse`]).
    pub prefix_reuse: PrefixReuse,
    /// A chat template's text to use instead of the model's (`--chat-template-file`).
    pub chat_template: Option<String>,
    /// Run the model's own chat template as Jinja (the default, as llama-server's; `false`:
    /// `--no-jinja`, the marker format).
    pub jinja: bool,
    /// Recurrent-state checkpoints each slot keeps (`--ctx-checkpoints`, llama-server's, with
    /// its default of 8), for a model with recurrent layers (Qwen3.5): the state after each
    /// prompt, so that a request sharing only part of what the slot holds (a chat's next turn
    /// whose template drops the last answer's thinking) starts from the newest checkpoint
    /// inside the common prefix instead of evaluating its whole prompt. 0: none.
    pub ctx_checkpoints: usize,
    /// A built-in chat format to use instead of any template (`--chat-template NAME`).
    pub chat_format: Option<ChatFormat>,
    /// How the sessions of `/v1/embeddings` are set up (threads, devices, flash attention);
    /// each request gets its own, of one sequence as long as its longest input, in
    /// embeddings mode.
    pub embedding_session: SessionOptions,
    /// How embeddings pool (`--pooling`); `None`: as the model file says, else by the last
    /// token.
    pub pooling: Option<Pooling>,
}

/// How much of a prompt a slot's cache (or another slot's, copied) may give a new request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefixReuse {
    /// Whole micro-batch pieces of an earlier prompt only: the rest of the prompt is then
    /// evaluated in the pieces a fresh evaluation would use, so the output is bit for bit a
    /// fresh request's (`rgml run`'s). A prompt shorter than a micro-batch is evaluated whole.
    /// A model with a recurrent state per sequence (Qwen3.5) keeps a slot's cache only whole,
    /// under either policy: when the prompt extends everything the slot holds (as
    /// llama-server does), else not at all.
    #[default]
    Exact,
    /// Any common prefix (a chat's whole history): faster, but the prompt's rest is evaluated
    /// in other pieces than a fresh evaluation's, and ggml's products round differently by how
    /// many rows they have, so the output may differ from a fresh request's in the last bits
    /// (as llama-server's with its cache).
    Any,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            model_id: "model".into(),
            max_queue: 1024,
            max_batch: 512,
            prefix_reuse: PrefixReuse::Exact,
            chat_template: None,
            jinja: true,
            chat_format: None,
            ctx_checkpoints: 8,
            embedding_session: SessionOptions::default(),
            pooling: None,
        }
    }
}

/// A request accepted: its tokens, its settings and where its events go.
pub(crate) struct Job {
    pub(crate) prompt: Vec<TokenId>,
    pub(crate) request: GenRequest,
    pub(crate) events: tokio::sync::mpsc::UnboundedSender<GenEvent>,
    pub(crate) cancelled: Arc<AtomicBool>,
}

impl Job {
    /// The client went away (dropped its submission or its receiver).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire) || self.events.is_closed()
    }
}

/// What the submitters and the worker share.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Signalled on a new request, a cancellation and shutdown.
    pub(crate) wake: Condvar,
}

/// The queue and the counters.
pub(crate) struct State {
    pub(crate) queue: VecDeque<Job>,
    pub(crate) shutdown: bool,
    pub(crate) stats: Stats,
    /// Generated tokens of recent steps, for the tokens/s gauge.
    pub(crate) recent: VecDeque<(Instant, usize)>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters and a queue: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The generator of `rgml serve`: see the [module docs](self).
pub struct Engine {
    model: Arc<Model>,
    options: EngineOptions,
    n_ctx: usize,
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Conversations to prompt text (the model's Jinja template, compiled once).
    formatter: ChatFormatter,
}

impl Engine {
    /// An engine decoding `session`'s sequences (one slot each, `session.n_ctx()` tokens
    /// each); starts its worker thread.
    pub fn start(session: Session, options: EngineOptions) -> std::io::Result<Engine> {
        let model = session.model().clone();
        let formatter = match options.chat_format {
            Some(format) => ChatFormatter::Markers(format),
            None => {
                ChatFormatter::for_model(&model, options.chat_template.as_deref(), options.jinja)
            }
        };
        let n_ctx = session.n_ctx();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                shutdown: false,
                stats: Stats {
                    n_slots: session.n_seq(),
                    ..Default::default()
                },
                recent: VecDeque::new(),
            }),
            wake: Condvar::new(),
        });
        let worker_shared = shared.clone();
        let policy = worker::Policy {
            max_batch: options.max_batch.max(1),
            reuse: options.prefix_reuse,
            n_ubatch: session.n_ubatch().max(1),
            recurrent: session.model().config.recurrent.is_some(),
            checkpoints: options.ctx_checkpoints,
            preserved: formatter
                .tool_format()
                .map_or(Vec::new(), |f| model.tokenizer.special_ids(f.markers())),
        };
        let handle = std::thread::Builder::new()
            .name("rgml-serve-engine".into())
            .spawn(move || {
                let shared = worker_shared.clone();
                let run =
                    std::panic::AssertUnwindSafe(|| worker::run(session, worker_shared, policy));
                if std::panic::catch_unwind(run).is_err() {
                    // A bug, not a request's fault: the running requests' channels closed with
                    // the slots (a server error to their clients); refuse what waits and what
                    // comes, rather than let it wait for ever.
                    let mut state = shared.lock();
                    state.shutdown = true;
                    for job in state.queue.drain(..) {
                        let _ = job
                            .events
                            .send(GenEvent::Failed("the engine stopped".into()));
                    }
                }
            })?;
        Ok(Engine {
            model,
            options,
            n_ctx,
            shared,
            worker: Mutex::new(Some(handle)),
            formatter,
        })
    }

    /// Wait for the worker to end (after [`Generator::shutdown`], once the running requests
    /// have ended).
    pub fn join(&self) {
        let handle = self.worker.lock().map(|mut h| h.take()).ok().flatten();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }

    /// The prompt's tokens: text tokenized as llama.cpp's tools do, a conversation formatted
    /// with the model's chat template first (as `rgml run --chat`); and whether the formatted
    /// conversation opened the model's reasoning.
    fn tokenize(&self, prompt: &Prompt) -> Result<(Vec<TokenId>, bool), SubmitError> {
        let tok = &self.model.tokenizer;
        let chat = |text: Result<String, rgml_llm::chat_template::ChatTemplateError>| {
            let text = text.map_err(|e| SubmitError::ChatTemplate(e.to_string()))?;
            let open = rgml_llm::reasoning::opened_by(&text);
            Ok((tok.encode(&text, EncodeOptions::prompt()), open))
        };
        match prompt {
            Prompt::Text(text) => Ok((tok.encode(text, EncodeOptions::prompt()), false)),
            Prompt::Chat(messages) => chat(self.formatter.apply(messages)),
            Prompt::ChatWithTools { messages, tools } => chat(
                self.formatter
                    .apply_with_tools(messages, Some(tools.as_str())),
            ),
            Prompt::Tokens(ids) => {
                let n_vocab = self.model.config.n_vocab;
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= n_vocab) {
                    return Err(SubmitError::InvalidToken { id, n_vocab });
                }
                Ok((ids.clone(), false))
            }
        }
    }

    /// Check `request` against the model and the context.
    fn check(&self, request: &GenRequest, prompt: &[TokenId]) -> Result<(), SubmitError> {
        if prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        // At least one token must follow the prompt.
        if prompt.len() >= self.n_ctx {
            return Err(SubmitError::PromptTooLong {
                n_prompt: prompt.len(),
                n_ctx: self.n_ctx,
            });
        }
        if let Some(max_tokens) = request.max_tokens {
            if max_tokens > self.n_ctx {
                return Err(SubmitError::MaxTokensTooLarge {
                    max_tokens,
                    n_ctx: self.n_ctx,
                });
            }
        }
        let n_vocab = self.model.config.n_vocab;
        let bias = &request.sampling.logit_bias;
        if let Some(&(id, _)) = bias.iter().find(|(id, _)| *id as usize >= n_vocab) {
            return Err(SubmitError::InvalidBiasToken { id, n_vocab });
        }
        SubmitError::check_sampling(&request.sampling)
    }
}

/// Cache cells (sequences times positions) of the session that embeds a request's inputs:
/// inputs of up to 256 tokens go 32 at a time (as many as fit a micro-batch share a graph).
const EMBED_CELLS: usize = 8192;

impl Engine {
    /// [`Generator::embed`]: the inputs checked (none empty, ids in the vocabulary), then
    /// embedded in groups, one sequence each, in a session of their own beside the slots (the
    /// worker's session computes logits).
    fn embed_all(&self, inputs: &[Vec<TokenId>]) -> Result<Vec<Vec<f32>>, SubmitError> {
        let n_vocab = self.model.config.n_vocab;
        // An encoder takes an input whole, in one micro-batch, within its position embeddings.
        let limit = match self.model.config.causal {
            true => self.n_ctx,
            false => (self.options.embedding_session.n_ubatch).min(self.model.config.n_ctx_train),
        };
        for input in inputs {
            if input.is_empty() {
                return Err(SubmitError::EmptyPrompt);
            }
            if let Some(&id) = input.iter().find(|&&id| id as usize >= n_vocab) {
                return Err(SubmitError::InvalidToken { id, n_vocab });
            }
            if input.len() > limit {
                return Err(SubmitError::PromptTooLong {
                    n_prompt: input.len(),
                    n_ctx: limit,
                });
            }
        }
        let longest = inputs.iter().map(Vec::len).max().unwrap_or(1);
        // Whole pieces of 256 positions, as the slots' contexts are padded.
        let n_ctx = longest.next_multiple_of(256);
        // Several inputs per graph (one sequence each), within EMBED_CELLS cells of cache.
        let n_seq = (EMBED_CELLS / n_ctx).clamp(1, inputs.len().max(1));
        let options = SessionOptions {
            n_ctx,
            n_seq,
            embeddings: true,
            ..self.options.embedding_session.clone()
        };
        let failed = |e: rgml_llm::LlmError| SubmitError::Failed(e.to_string());
        let mut session = Session::new(self.model.clone(), &options).map_err(failed)?;
        let pooling = self.options.pooling.or(self.model.config.pooling);
        let mut out = Vec::with_capacity(inputs.len());
        for group in inputs.chunks(n_seq) {
            let group: Vec<&[TokenId]> = group.iter().map(Vec::as_slice).collect();
            let vectors = session
                .embed_batch(&group, pooling.unwrap_or(Pooling::Last))
                .map_err(failed)?;
            for mut v in vectors {
                normalize(&mut v);
                out.push(v);
            }
        }
        Ok(out)
    }
}

impl Generator for Engine {
    fn model_id(&self) -> &str {
        &self.options.model_id
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn tool_call_format(&self) -> Option<rgml_llm::tool_calls::ToolCallFormat> {
        self.formatter.tool_format()
    }

    fn chat_template(&self) -> Option<&str> {
        self.formatter.template_source()
    }

    fn reasoning_syntax(&self) -> Option<rgml_llm::reasoning::Syntax> {
        self.formatter.reasoning_syntax()
    }

    fn tokenizer(&self) -> Option<&rgml_llm::Tokenizer> {
        Some(&self.model.tokenizer)
    }

    fn embed(&self, inputs: &[Vec<TokenId>]) -> Option<Result<Vec<Vec<f32>>, SubmitError>> {
        Some(self.embed_all(inputs))
    }

    fn apply_template(&self, prompt: &Prompt) -> Option<Result<String, SubmitError>> {
        let text = match prompt {
            Prompt::Chat(messages) => self.formatter.apply(messages),
            Prompt::ChatWithTools { messages, tools } => self
                .formatter
                .apply_with_tools(messages, Some(tools.as_str())),
            Prompt::Text(_) | Prompt::Tokens(_) => return None,
        };
        Some(text.map_err(|e| SubmitError::ChatTemplate(e.to_string())))
    }

    fn submit(&self, request: GenRequest) -> Result<Submission, SubmitError> {
        if self.model.config.kind.is_encoder() {
            return Err(SubmitError::EmbeddingsOnly(self.model.config.arch.clone()));
        }
        let (prompt, reasoning_open) = self.tokenize(&request.prompt)?;
        let mut request = request;
        request.format = std::mem::take(&mut request.format).after_prompt(reasoning_open);
        self.check(&request, &prompt)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let n_prompt = prompt.len();
        {
            let mut state = self.shared.lock();
            if state.shutdown {
                return Err(SubmitError::ShuttingDown);
            }
            if state.queue.len() >= self.options.max_queue {
                return Err(SubmitError::QueueFull(state.queue.len()));
            }
            state.queue.push_back(Job {
                prompt,
                request,
                events: tx,
                cancelled: cancelled.clone(),
            });
            state.stats.requests_total += 1;
            state.stats.queue_len = state.queue.len();
        }
        self.shared.wake.notify_all();
        let shared = self.shared.clone();
        let wake = Box::new(move || {
            // Taking the lock orders the flag before the worker's next look.
            drop(shared.lock());
            shared.wake.notify_all();
        });
        let mut submission = Submission::new(rx, n_prompt, cancelled, wake);
        submission.reasoning_open = reasoning_open;
        Ok(submission)
    }

    fn stats(&self) -> Stats {
        let mut state = self.shared.lock();
        let now = Instant::now();
        worker::trim_recent(&mut state.recent, now);
        let recent: usize = state.recent.iter().map(|&(_, n)| n).sum();
        let mut stats = state.stats;
        stats.generated_tokens_per_second = recent as f64 / worker::RECENT.as_secs_f64();
        stats
    }

    fn shutdown(&self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
    }

    /// The worker runs (it ends only at shutdown, or after a bug).
    fn healthy(&self) -> bool {
        let running = self
            .worker
            .lock()
            .map(|h| h.as_ref().is_some_and(|h| !h.is_finished()));
        running.unwrap_or(false) || self.shared.lock().shutdown
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
        self.join();
    }
}
