//! gpt-oss's harmony output: messages on channels, each `<|start|>assistant` (optional for the
//! first), a header up to `<|message|>`, and a body up to `<|end|>` (the last ends where
//! generation stops, at `<|return|>` or `<|call|>`). The header's channel says what the body
//! is, as llama.cpp's `gpt-oss` chat parser reads it:
//! - `<|channel|>analysis`: reasoning (`reasoning_content`);
//! - `<|channel|>final`, or `commentary` without a recipient (a preamble): the answer;
//! - a recipient `to=functions.NAME` (in the header, on any channel): a tool call whose body is
//!   its JSON arguments.
//!
//! [`HarmonyStream`] splits a streamed output into reasoning and answer as
//! [`crate::reasoning::ReasoningStream`] does for `<think>`; a call goes into the answer in one
//! canonical form, `<|channel|>commentary to=functions.NAME<|message|>ARGS<|end|>`, which
//! [`crate::tool_calls::ToolCallFormat::Harmony`] parses. The markers are control tokens: a
//! server renders them ([`MARKERS`]) for this parser to see them.

use crate::markers::{partial_suffix, Part};

pub(crate) const START: &str = "<|start|>";
pub(crate) const CHANNEL: &str = "<|channel|>";
pub(crate) const MESSAGE: &str = "<|message|>";
pub(crate) const END: &str = "<|end|>";
const CONSTRAIN: &str = "<|constrain|>";

/// The control markers of harmony output a decoder must render.
pub const MARKERS: [&str; 5] = [START, CHANNEL, MESSAGE, END, CONSTRAIN];

/// A recipient naming a function.
pub(crate) const RECIPIENT: &str = "to=functions.";

/// The start of a call in the answer's canonical form (followed by the name, [`MESSAGE`], the
/// arguments and [`END`]).
pub(crate) const CALL_OPEN: &str = "<|channel|>commentary to=functions.";

/// Whether a chat template writes harmony messages.
pub fn is_harmony(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE)
}

/// What a message's body is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call of this function.
    Call(String),
}

/// The body a header announces.
fn classify(header: &str) -> Body {
    if let Some(at) = header.find(RECIPIENT) {
        let name = &header[at + RECIPIENT.len()..];
        let end = name
            .find(|c: char| c.is_whitespace() || c == '<')
            .unwrap_or(name.len());
        return Body::Call(name[..end].to_string());
    }
    match header.contains("<|channel|>analysis") {
        true => Body::Reasoning,
        false => Body::Content,
    }
}

/// Splits a streamed harmony output into reasoning and answer (see the module docs), holding
/// back only headers and what may be the start of a marker.
#[derive(Clone, Debug, Default)]
pub struct HarmonyStream {
    /// The body being read, `None` while reading a header.
    body: Option<Body>,
    held: String,
}

impl HarmonyStream {
    /// A stream at the start of the assistant's turn.
    pub fn new() -> HarmonyStream {
        HarmonyStream::default()
    }

    /// The parts `text` completes, in order.
    pub fn push(&mut self, text: &str) -> Vec<(Part, String)> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let more = match self.body.clone() {
                None => self.header(&mut out),
                Some(body) => self.body(&body, &mut out),
            };
            if !more {
                return out;
            }
        }
    }

    /// What is still held when the output ends: a body's rest (a call's closed), or a header
    /// that never opened a body, as answer text.
    pub fn finish(&mut self) -> Vec<(Part, String)> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.body.take() {
            Some(body) => emit(&mut out, &body, &held, true),
            None => push(&mut out, Part::Content, held.trim()),
        }
        out
    }

    /// Reads a header up to `<|message|>`; false when it is not whole yet.
    fn header(&mut self, out: &mut Vec<(Part, String)>) -> bool {
        let Some(at) = self.held.find(MESSAGE) else {
            return false;
        };
        let body = classify(&self.held[..at]);
        if let Body::Call(name) = &body {
            push(out, Part::Content, &format!("{CALL_OPEN}{name}{MESSAGE}"));
        }
        self.held.drain(..at + MESSAGE.len());
        self.body = Some(body);
        true
    }

    /// Reads a body up to `<|end|>` (or a next message's `<|start|>` or `<|channel|>`, where the
    /// model left out the end); false when it goes on past the text so far.
    fn body(&mut self, body: &Body, out: &mut Vec<(Part, String)>) -> bool {
        let ends = [END, START, CHANNEL].map(|m| (self.held.find(m), m));
        let first = ends
            .iter()
            .filter_map(|&(at, m)| at.map(|at| (at, m)))
            .min();
        if let Some((at, marker)) = first {
            emit(out, body, &self.held[..at], true);
            // A next message's marker begins its header.
            let skip = if marker == END { END.len() } else { 0 };
            self.held.drain(..at + skip);
            self.body = None;
            return true;
        }
        let keep = [END, START, CHANNEL]
            .iter()
            .map(|m| partial_suffix(&self.held, m))
            .max()
            .unwrap_or(0);
        let ready = self.held.len() - keep;
        emit(out, body, &self.held[..ready], false);
        self.held.drain(..ready);
        false
    }
}

/// A piece of a body as its part (a call's closed with [`END`] once `closed`).
fn emit(out: &mut Vec<(Part, String)>, body: &Body, text: &str, closed: bool) {
    match body {
        Body::Reasoning => push(out, Part::Reasoning, text),
        Body::Content => push(out, Part::Content, text),
        Body::Call(_) => {
            push(out, Part::Content, text);
            if closed {
                push(out, Part::Content, END);
            }
        }
    }
}

fn push(out: &mut Vec<(Part, String)>, part: Part, text: &str) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((last, prev)) if *last == part => prev.push_str(text),
        _ => out.push((part, text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts of `text` streamed in pieces cut at `cuts`, joined per part.
    fn stream(text: &str, cut: usize) -> (String, String) {
        let mut s = HarmonyStream::new();
        let mut parts = s.push(&text[..cut]);
        parts.extend(s.push(&text[cut..]));
        parts.extend(s.finish());
        let join = |p: Part| -> String {
            parts
                .iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, t)| t.as_str())
                .collect()
        };
        (join(Part::Reasoning), join(Part::Content))
    }

    #[test]
    fn channels_split_into_reasoning_answer_and_calls_for_every_cut() {
        let answer = "<|channel|>analysis<|message|>User asks. Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris.";
        let call = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        let in_role = "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}";
        let cases = [
            (answer, "User asks. Easy.", "Paris."),
            (
                call,
                "Need weather.",
                "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Paris\"}<|end|>",
            ),
            (
                in_role,
                "",
                "<|channel|>commentary to=functions.f<|message|>{}<|end|>",
            ),
            ("<|channel|>final<|message|>Hi <|en", "", "Hi <|en"),
        ];
        for (text, reasoning, content) in cases {
            for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
                assert_eq!(
                    stream(text, cut),
                    (reasoning.to_string(), content.to_string()),
                    "{text:?} cut at {cut}"
                );
            }
        }
        assert!(is_harmony("{{ '<|channel|>final<|message|>' }}"));
        assert!(!is_harmony("<|im_start|>"));
    }
}
