//! Streamed answers: a [`Submission`]'s events as server-sent events, one JSON chunk per
//! `data:` line, ending with `data: [DONE]`.
//!
//! The submission is moved into the stream, so when a client disconnects and hyper drops
//! the response body, the submission is dropped with it and the request is cancelled at once.

use super::error::ApiError;
use super::response::{
    finish_reason, new_call_id, ChatLogprobs, CompletionChoice, CompletionLogprobs, Meta, Route,
    TextCompletion, ToolCallOut, UsageOut, NO_RESULT,
};
use crate::generator::{FinishReason, GenEvent, Logprobs, Submission, Usage};
use axum::response::sse::{Event, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use rgml_llm::json_answer::JsonAnswerStream;
use rgml_llm::reasoning::{Part, ReasoningStream};
use serde::Serialize;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

/// `chat.completion.chunk`.
#[derive(Serialize, Debug)]
struct ChatChunk {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageOut>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

#[derive(Serialize, Debug)]
struct ChatChunkChoice {
    index: u32,
    delta: Delta,
    logprobs: Option<ChatLogprobs>,
    finish_reason: Option<&'static str>,
}

/// What a chunk adds to the assistant's message.
#[derive(Serialize, Debug, Default)]
struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCallOut>,
}

/// The stream's state: events ready to send, and the submission until it ends.
struct State {
    meta: Meta,
    submission: Submission,
    include_usage: bool,
    ready: VecDeque<Event>,
    ended: bool,
    /// Characters of the completion so far (the legacy logprobs' `text_offset`).
    offset: usize,
    /// With tools: the output so far, and how many of its bytes were sent as text (the rest
    /// may be a tool call, held back until the end).
    output: String,
    sent: usize,
    /// Tool calls streamed in pieces so far: each one's id and the bytes of its arguments
    /// sent.
    streamed_calls: Vec<(String, usize)>,
    /// A thinking model's chat: the output split into reasoning and answer as it comes.
    reasoning: Option<ReasoningStream>,
    /// A chat answer that is one JSON document: the document out of the answer as it comes.
    json_answer: Option<JsonAnswerStream>,
    /// The choice this stream is (`n` > 1: several streams merged).
    index: usize,
    /// One of several choices: its usage goes here, and the merged stream ends them all.
    shared: Option<Arc<Mutex<Vec<Usage>>>>,
}

/// The server-sent events answering `submission`.
pub(crate) fn sse(
    meta: Meta,
    submission: Submission,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(choice_events(meta, submission, include_usage, 0, None))
}

/// The events of several choices (`n`), each chunk naming its choice's index, interleaved as
/// they come; then one usage chunk (the prompt counted once, every choice's tokens) where
/// asked, and `[DONE]`.
pub(crate) fn sse_choices(
    meta: Meta,
    submissions: Vec<Submission>,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let usages = Arc::new(Mutex::new(Vec::new()));
    let choices: Vec<_> = (submissions.into_iter().enumerate())
        .map(|(i, submission)| {
            let shared = Some(usages.clone());
            Box::pin(choice_events(meta.clone(), submission, false, i, shared))
        })
        .collect();
    let tail = stream::once(async move {
        let total = usages.lock().map(|u| u.clone()).unwrap_or_default();
        let mut events = Vec::new();
        if include_usage {
            let mut usage = total.first().copied().unwrap_or_default();
            usage.completion_tokens = total.iter().map(|u| u.completion_tokens).sum();
            let usage = Some(UsageOut::from(usage));
            let chunk = match meta.route {
                Route::Chat => json_event(&ChatChunk::envelope(&meta, Vec::new(), usage)),
                Route::Completion => json_event(&TextCompletion::usage_only(&meta, usage)),
            };
            events.push(Ok(chunk));
        }
        events.push(Ok(Event::default().data("[DONE]")));
        stream::iter(events)
    })
    .flatten();
    Sse::new(stream::select_all(choices).chain(tail))
}

/// One choice's events (see [`State`]).
fn choice_events(
    meta: Meta,
    submission: Submission,
    include_usage: bool,
    index: usize,
    shared: Option<Arc<Mutex<Vec<Usage>>>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut state = State {
        meta,
        submission,
        include_usage,
        ready: VecDeque::new(),
        ended: false,
        offset: 0,
        output: String::new(),
        sent: 0,
        streamed_calls: Vec::new(),
        reasoning: None,
        json_answer: None,
        index,
        shared,
    };
    if state.meta.json_answer {
        state.json_answer = Some(JsonAnswerStream::default());
    }
    if let Some((syntax, open)) = state.meta.reasoning {
        state.reasoning = Some(ReasoningStream::for_syntax(syntax, open));
    }
    if state.meta.route == Route::Chat {
        // OpenAI opens a chat stream with the assistant's role and no text.
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            reasoning_content: None,
            tool_calls: Vec::new(),
        };
        let chunk = state.chat_chunk(delta, None, None);
        state.ready.push_back(chunk);
    }
    stream::unfold(state, next_event)
}

/// The next event to send, waiting for the generator when none is ready.
async fn next_event(mut state: State) -> Option<(Result<Event, Infallible>, State)> {
    loop {
        if let Some(event) = state.ready.pop_front() {
            return Some((Ok(event), state));
        }
        if state.ended {
            return None;
        }
        let event = state.submission.events.recv().await;
        state.on_event(event);
    }
}

impl State {
    fn on_event(&mut self, event: Option<GenEvent>) {
        match event {
            Some(GenEvent::Token(token)) => {
                // A token that ends inside a character or a possible stop string shows no
                // text yet; it is worth a chunk only for its log-probabilities.
                let text = self.answer_of(token.text, false);
                let text = self.sendable(text);
                if !text.is_empty() || token.logprobs.is_some() {
                    let logprobs: Vec<Logprobs> = token.logprobs.into_iter().collect();
                    let chunk = self.piece(text, &logprobs, None);
                    self.ready.push_back(chunk);
                }
                if self.meta.route == Route::Chat {
                    let pieces = self.call_pieces();
                    self.push_calls(pieces);
                }
            }
            Some(GenEvent::Done {
                text,
                reason,
                usage,
            }) => self.on_done(text, reason, usage),
            Some(GenEvent::Failed(message)) => self.on_failed(&message),
            None => self.on_failed(NO_RESULT),
        }
    }

    /// The answer's part of a new piece of output (`last`: the output ends with it): all of
    /// it, or for a thinking model what follows its reasoning, the reasoning sent here as
    /// `reasoning_content` deltas.
    fn answer_of(&mut self, text: String, last: bool) -> String {
        let Some(stream) = self.reasoning.as_mut() else {
            return text;
        };
        let mut parts = stream.push(&text);
        if last {
            parts.extend(stream.finish());
        }
        let mut answer = String::new();
        for (part, piece) in parts {
            match part {
                Part::Content => answer.push_str(&piece),
                Part::Reasoning => {
                    let delta = Delta {
                        reasoning_content: Some(piece),
                        ..Delta::default()
                    };
                    let chunk = self.chat_chunk(delta, None, None);
                    self.ready.push_back(chunk);
                }
            }
        }
        answer
    }

    /// What of a new piece of text can be sent now: all of it, with tools the output's text
    /// up to where a tool call may begin, or of a JSON answer its document.
    fn sendable(&mut self, text: String) -> String {
        if let Some(document) = self.json_answer.as_mut() {
            return document.push(&text);
        }
        let Some(format) = self.meta.tool_format else {
            return text;
        };
        self.output.push_str(&text);
        let upto = format
            .hold_from(&self.output)
            .unwrap_or(self.output.len())
            .max(self.sent);
        let piece = self.output[self.sent..upto].to_string();
        self.sent = upto;
        piece
    }

    /// With tools, the pieces of the calls in the held-back output not sent yet, as llama-server
    /// streams them: a call's id, type and name once its name is whole, then its arguments'
    /// text as it comes. Nothing where the calls' layout does not stream (their name after
    /// their arguments): they then go whole at the end.
    fn call_pieces(&mut self) -> Vec<ToolCallOut> {
        let Some(format) = self.meta.tool_format else {
            return Vec::new();
        };
        let Some(calls) = format.partial_calls(&self.output[self.sent..]) else {
            return Vec::new();
        };
        let mut pieces = Vec::new();
        for (i, call) in calls.into_iter().enumerate() {
            if i == self.streamed_calls.len() {
                let id = new_call_id();
                pieces.push(ToolCallOut::opening(i, id.clone(), call.name));
                self.streamed_calls.push((id, 0));
            }
            let sent = &mut self.streamed_calls[i].1;
            if let Some(new) = call.arguments.get(*sent..).filter(|a| !a.is_empty()) {
                pieces.push(ToolCallOut::arguments(i, new.to_string()));
                *sent = call.arguments.len();
            }
        }
        pieces
    }

    /// A chunk of tool calls or their pieces, if there are any.
    fn push_calls(&mut self, tool_calls: Vec<ToolCallOut>) {
        if !tool_calls.is_empty() {
            let delta = Delta {
                tool_calls,
                ..Delta::default()
            };
            let chunk = self.chat_chunk(delta, None, None);
            self.ready.push_back(chunk);
        }
    }

    /// With tools, the output's tool calls once it is whole (its text before them sent
    /// first), unless they were streamed in pieces; empty where it has none (then all its
    /// text has been sent).
    fn tool_calls(&mut self) -> Vec<ToolCallOut> {
        let Some(format) = self.meta.tool_format else {
            return Vec::new();
        };
        if !self.streamed_calls.is_empty() {
            return Vec::new();
        }
        let calls = format.parse(&self.output).tool_calls;
        if calls.is_empty() {
            let rest = self.output[self.sent..].to_string();
            self.sent = self.output.len();
            if !rest.is_empty() {
                let chunk = self.piece(rest, &[], None);
                self.ready.push_back(chunk);
            }
        }
        ToolCallOut::list(calls, true)
    }

    fn on_done(&mut self, text: String, reason: FinishReason, usage: Usage) {
        let mut reason = finish_reason(reason);
        match self.meta.route {
            Route::Chat => {
                let text = self.answer_of(text, true);
                let text = self.sendable(text);
                if !text.is_empty() {
                    let chunk = self.piece(text, &[], None);
                    self.ready.push_back(chunk);
                }
                let pieces = self.call_pieces();
                self.push_calls(pieces);
                let tool_calls = self.tool_calls();
                let called = !tool_calls.is_empty() || !self.streamed_calls.is_empty();
                self.push_calls(tool_calls);
                if called && reason == "stop" {
                    reason = "tool_calls";
                }
                let chunk = self.chat_chunk(Delta::default(), None, Some(reason));
                self.ready.push_back(chunk);
            }
            Route::Completion => {
                let chunk = self.piece(text, &[], Some(reason));
                self.ready.push_back(chunk);
            }
        }
        if let Some(shared) = &self.shared {
            if let Ok(mut usages) = shared.lock() {
                usages.push(usage);
            }
        } else if self.include_usage {
            let chunk = self.usage_chunk(usage);
            self.ready.push_back(chunk);
        }
        self.end();
    }

    fn on_failed(&mut self, message: &str) {
        let error = ApiError::server(message);
        self.ready.push_back(json_event(&error.body()));
        self.end();
    }

    /// The stream ends (with `[DONE]` unless it is one of several choices, whose merged
    /// stream sends it).
    fn end(&mut self) {
        if self.shared.is_none() {
            self.ready.push_back(Event::default().data("[DONE]"));
        }
        self.ended = true;
    }

    /// A chunk carrying generated text (and its tokens' log-probabilities).
    fn piece(
        &mut self,
        text: String,
        logprobs: &[Logprobs],
        reason: Option<&'static str>,
    ) -> Event {
        match self.meta.route {
            Route::Chat => {
                let logprobs = (!logprobs.is_empty()).then(|| ChatLogprobs::new(logprobs));
                let delta = Delta {
                    role: None,
                    content: Some(text),
                    reasoning_content: None,
                    tool_calls: Vec::new(),
                };
                self.chat_chunk(delta, logprobs, reason)
            }
            Route::Completion => {
                let logprobs = (self.meta.logprobs)
                    .then(|| CompletionLogprobs::new(logprobs, &mut self.offset));
                let choice = CompletionChoice::new(self.index, text, logprobs, reason);
                json_event(&TextCompletion::many(&self.meta, vec![choice], None))
            }
        }
    }

    fn chat_chunk(
        &self,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> Event {
        let choice = ChatChunkChoice {
            index: self.index as u32,
            delta,
            logprobs,
            finish_reason,
        };
        json_event(&self.chunk_envelope(vec![choice], None))
    }

    fn usage_chunk(&self, usage: Usage) -> Event {
        let usage = Some(UsageOut::from(usage));
        match self.meta.route {
            Route::Chat => json_event(&self.chunk_envelope(Vec::new(), usage)),
            Route::Completion => json_event(&TextCompletion::usage_only(&self.meta, usage)),
        }
    }

    fn chunk_envelope(&self, choices: Vec<ChatChunkChoice>, usage: Option<UsageOut>) -> ChatChunk {
        ChatChunk::envelope(&self.meta, choices, usage)
    }
}

impl ChatChunk {
    fn envelope(meta: &Meta, choices: Vec<ChatChunkChoice>, usage: Option<UsageOut>) -> ChatChunk {
        ChatChunk {
            id: meta.id.clone(),
            object: "chat.completion.chunk",
            created: meta.created,
            model: meta.model.clone(),
            choices,
            usage,
            warnings: meta.warnings.clone(),
        }
    }
}

/// `value` as one `data:` line. Serializing these types cannot fail (string keys only);
/// were it to, the client gets an error event rather than nothing.
fn json_event<T: Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(json) => Event::default().data(json),
        Err(e) => {
            let error = ApiError::server(format!("cannot encode a chunk: {e}"));
            Event::default().data(error.body().to_string())
        }
    }
}
