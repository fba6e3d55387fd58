//! OpenAI's response shapes for both generation routes, whole (`chat.completion`,
//! `text_completion`) and in pieces (`chat.completion.chunk`, streamed `text_completion`),
//! and collecting a [`Submission`]'s events into a whole answer.
//!
//! Only shapes live here; the streaming state machine is `super::stream`.

use super::error::ApiError;
use super::request::splitmix64;
use crate::generator::{FinishReason, GenEvent, Logprobs, Submission, TokenLogprob, Usage};
use rgml_llm::chat::ToolCall;
use rgml_llm::reasoning;
use rgml_llm::tool_calls::ToolCallFormat;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Which generation route answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

impl Route {
    /// The request field that holds the prompt.
    pub(crate) fn prompt_param(self) -> &'static str {
        match self {
            Route::Chat => "messages",
            Route::Completion => "prompt",
        }
    }
}

/// What every response (and chunk) of one request shares.
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    pub(crate) route: Route,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    /// The client asked for log-probabilities (then `logprobs` is an object, even if empty).
    pub(crate) logprobs: bool,
    /// The request's fields answered as if absent (each response and chunk lists them).
    pub(crate) warnings: Vec<String>,
    /// The request gave tools: the output's calls, in the model's format, are read out of it.
    pub(crate) tool_format: Option<ToolCallFormat>,
    /// A thinking model's chat: its reasoning, in the model's syntax, goes to
    /// `reasoning_content` (with `true` when the prompt opened it).
    pub(crate) reasoning: Option<(reasoning::Syntax, bool)>,
    /// A chat answer that is one JSON document: its content is the document alone (see
    /// `rgml_llm::json_answer`; `tool_format` is then `None`, as llama-server reads no calls).
    pub(crate) json_answer: bool,
}

impl Meta {
    pub(crate) fn new(route: Route, model: &str, logprobs: bool) -> Meta {
        let prefix = match route {
            Route::Chat => "chatcmpl",
            Route::Completion => "cmpl",
        };
        Meta {
            route,
            id: format!("{prefix}-{}", unique_id()),
            created: unix_now(),
            model: model.to_owned(),
            logprobs,
            warnings: Vec::new(),
            tool_format: None,
            reasoning: None,
            json_answer: false,
        }
    }
}

/// Seconds since 1970 (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// 16 hex digits, different for every call in this process (SplitMix64 is a bijection of a
/// counter started at the first call's clock), and unlikely to repeat across restarts.
fn unique_id() -> String {
    static BASE: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}", splitmix64(base.wrapping_add(n)))
}

/// OpenAI's `finish_reason`; a shutdown cut is reported as a stop.
pub(crate) fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Shutdown => "stop",
        FinishReason::Length => "length",
    }
}

/// `usage`.
#[derive(Serialize, Debug)]
pub(crate) struct UsageOut {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptTokensDetails,
}

#[derive(Serialize, Debug)]
struct PromptTokensDetails {
    cached_tokens: usize,
}

impl From<Usage> for UsageOut {
    fn from(usage: Usage) -> UsageOut {
        UsageOut {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
        }
    }
}

/// Chat's `logprobs`: one entry per token.
#[derive(Serialize, Debug)]
pub(crate) struct ChatLogprobs {
    content: Vec<ChatTokenLogprob>,
}

#[derive(Serialize, Debug)]
struct ChatTokenLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
    top_logprobs: Vec<TopLogprob>,
}

#[derive(Serialize, Debug)]
struct TopLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
}

impl TopLogprob {
    fn new(t: &TokenLogprob) -> TopLogprob {
        TopLogprob {
            token: t.text.clone(),
            logprob: t.logprob,
            bytes: t.bytes.clone(),
        }
    }
}

impl ChatLogprobs {
    pub(crate) fn new(tokens: &[Logprobs]) -> ChatLogprobs {
        let content = tokens
            .iter()
            .map(|lp| ChatTokenLogprob {
                token: lp.chosen.text.clone(),
                logprob: lp.chosen.logprob,
                bytes: lp.chosen.bytes.clone(),
                top_logprobs: lp.top.iter().map(TopLogprob::new).collect(),
            })
            .collect();
        ChatLogprobs { content }
    }
}

/// The legacy completions' `logprobs`: parallel lists.
#[derive(Serialize, Debug)]
pub(crate) struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    /// Per token, alternative text → its log-probability.
    top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Where each token's text starts in the completion (in characters).
    text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// The entries of `tokens`, whose texts start `offset` characters into the completion;
    /// `offset` is moved past them.
    pub(crate) fn new(tokens: &[Logprobs], offset: &mut usize) -> CompletionLogprobs {
        let mut out = CompletionLogprobs {
            tokens: Vec::with_capacity(tokens.len()),
            token_logprobs: Vec::with_capacity(tokens.len()),
            top_logprobs: Vec::with_capacity(tokens.len()),
            text_offset: Vec::with_capacity(tokens.len()),
        };
        for lp in tokens {
            out.tokens.push(lp.chosen.text.clone());
            out.token_logprobs.push(lp.chosen.logprob);
            out.top_logprobs.push(
                lp.top
                    .iter()
                    .map(|t| (t.text.clone(), serde_json::Value::from(t.logprob)))
                    .collect(),
            );
            out.text_offset.push(*offset);
            *offset += lp.chosen.text.chars().count();
        }
        out
    }
}

/// A whole generation, collected.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) text: String,
    pub(crate) logprobs: Vec<Logprobs>,
    pub(crate) reason: Option<FinishReason>,
    pub(crate) usage: Usage,
}

/// Reads `submission` to its end. A failure is the server's (500).
pub(crate) async fn collect(mut submission: Submission) -> Result<Collected, ApiError> {
    let mut out = Collected::default();
    while let Some(event) = submission.events.recv().await {
        match event {
            GenEvent::Token(token) => {
                out.text.push_str(&token.text);
                out.logprobs.extend(token.logprobs);
            }
            GenEvent::Done {
                text,
                reason,
                usage,
            } => {
                out.text.push_str(&text);
                out.reason = Some(reason);
                out.usage = usage;
                return Ok(out);
            }
            GenEvent::Failed(message) => return Err(ApiError::server(message)),
        }
    }
    Err(ApiError::server(NO_RESULT))
}

/// A generator that closed a request's events without `Done` or `Failed`.
pub(crate) const NO_RESULT: &str = "the generation ended without a result";

/// `chat.completion`.
#[derive(Serialize, Debug)]
struct ChatCompletion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<ChatChoice>,
    usage: UsageOut,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

#[derive(Serialize, Debug)]
struct ChatChoice {
    index: u32,
    message: AssistantMessage,
    logprobs: Option<ChatLogprobs>,
    finish_reason: &'static str,
}

#[derive(Serialize, Debug)]
struct AssistantMessage {
    role: &'static str,
    /// `null` when the message is only tool calls, as OpenAI sends it.
    content: Option<String>,
    /// A thinking model's reasoning (llama-server's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCallOut>,
}

/// A tool call as OpenAI writes it, whole (`message.tool_calls`) or as a stream's delta (with
/// its `index`; a call streamed in pieces has its id, type and name in its first piece only).
#[derive(Serialize, Debug)]
pub(crate) struct ToolCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionOut,
}

#[derive(Serialize, Debug)]
struct FunctionOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    arguments: String,
}

impl ToolCallOut {
    /// `calls` as OpenAI's tool calls; a call without an id gets a fresh `call_...` one.
    pub(crate) fn list(calls: Vec<ToolCall>, indexed: bool) -> Vec<ToolCallOut> {
        calls
            .into_iter()
            .enumerate()
            .map(|(i, call)| ToolCallOut {
                index: indexed.then_some(i),
                id: Some(call.id.unwrap_or_else(new_call_id)),
                kind: Some("function"),
                function: FunctionOut {
                    name: Some(call.name),
                    arguments: call.arguments,
                },
            })
            .collect()
    }

    /// The first piece of streamed call `index`: its id, type and name.
    pub(crate) fn opening(index: usize, id: String, name: String) -> ToolCallOut {
        ToolCallOut {
            index: Some(index),
            id: Some(id),
            kind: Some("function"),
            function: FunctionOut {
                name: Some(name),
                arguments: String::new(),
            },
        }
    }

    /// A further piece of streamed call `index`'s arguments.
    pub(crate) fn arguments(index: usize, arguments: String) -> ToolCallOut {
        ToolCallOut {
            index: Some(index),
            id: None,
            kind: None,
            function: FunctionOut {
                name: None,
                arguments,
            },
        }
    }
}

/// A fresh tool-call id.
pub(crate) fn new_call_id() -> String {
    format!("call_{}", unique_id())
}

/// `text_completion`, whole or as a chunk (same shape; a chunk's `finish_reason` is null
/// until the last, and only a usage chunk has `usage`).
#[derive(Serialize, Debug)]
pub(crate) struct TextCompletion {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageOut>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

#[derive(Serialize, Debug)]
pub(crate) struct CompletionChoice {
    index: u32,
    text: String,
    logprobs: Option<CompletionLogprobs>,
    finish_reason: Option<&'static str>,
}

impl CompletionChoice {
    pub(crate) fn new(
        index: usize,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> CompletionChoice {
        CompletionChoice {
            index: index as u32,
            text,
            logprobs,
            finish_reason,
        }
    }
}

impl TextCompletion {
    /// A whole answer, or a chunk, with these choices.
    pub(crate) fn many(
        meta: &Meta,
        choices: Vec<CompletionChoice>,
        usage: Option<UsageOut>,
    ) -> TextCompletion {
        TextCompletion {
            choices,
            ..TextCompletion::usage_only(meta, usage)
        }
    }

    /// The streamed usage chunk: no choices.
    pub(crate) fn usage_only(meta: &Meta, usage: Option<UsageOut>) -> TextCompletion {
        TextCompletion {
            id: meta.id.clone(),
            object: "text_completion",
            created: meta.created,
            model: meta.model.clone(),
            choices: Vec::new(),
            usage,
            warnings: meta.warnings.clone(),
        }
    }
}

/// The whole answer's JSON for `meta`'s route: one choice per answer (`n`), the usage
/// counting the prompt once and every choice's tokens.
pub(crate) fn whole(meta: &Meta, answers: Vec<Collected>) -> Result<serde_json::Value, ApiError> {
    let mut usage = answers.first().map(|a| a.usage).unwrap_or_default();
    usage.completion_tokens = answers.iter().map(|a| a.usage.completion_tokens).sum();
    let usage = UsageOut::from(usage);
    let value = match meta.route {
        Route::Chat => {
            let choices = (answers.into_iter().enumerate())
                .map(|(i, answer)| chat_choice(meta, i, answer))
                .collect();
            serde_json::to_value(ChatCompletion {
                id: meta.id.clone(),
                object: "chat.completion",
                created: meta.created,
                model: meta.model.clone(),
                choices,
                usage,
                warnings: meta.warnings.clone(),
            })
        }
        Route::Completion => {
            let choices = (answers.into_iter().enumerate())
                .map(|(i, answer)| {
                    let reason = finish_reason(answer.reason.unwrap_or(FinishReason::Stop));
                    let logprobs = meta
                        .logprobs
                        .then(|| CompletionLogprobs::new(&answer.logprobs, &mut 0));
                    CompletionChoice::new(i, answer.text, logprobs, Some(reason))
                })
                .collect();
            serde_json::to_value(TextCompletion::many(meta, choices, Some(usage)))
        }
    };
    value.map_err(|e| ApiError::server(format!("cannot encode the response: {e}")))
}

/// Choice `index` of a chat answer: its reasoning, content and tool calls as `meta` says to
/// read them.
fn chat_choice(meta: &Meta, index: usize, collected: Collected) -> ChatChoice {
    let mut reason = finish_reason(collected.reason.unwrap_or(FinishReason::Stop));
    let (reasoning_content, answer) = match meta.reasoning {
        Some((syntax, open)) => {
            let split = syntax.split(&collected.text, open);
            (split.reasoning, split.content)
        }
        None => (None, collected.text.clone()),
    };
    let (content, tool_calls) = match meta.tool_format {
        Some(format) => {
            let parsed = format.parse(&answer);
            if !parsed.tool_calls.is_empty() && reason == "stop" {
                reason = "tool_calls";
            }
            let content = (!parsed.content.is_empty() || parsed.tool_calls.is_empty())
                .then_some(parsed.content);
            (content, ToolCallOut::list(parsed.tool_calls, false))
        }
        None if meta.json_answer => (Some(rgml_llm::json_answer::strip(&answer)), Vec::new()),
        None => (Some(answer), Vec::new()),
    };
    ChatChoice {
        index: index as u32,
        message: AssistantMessage {
            role: "assistant",
            content,
            reasoning_content,
            tool_calls,
        },
        logprobs: meta
            .logprobs
            .then(|| ChatLogprobs::new(&collected.logprobs)),
        finish_reason: reason,
    }
}
