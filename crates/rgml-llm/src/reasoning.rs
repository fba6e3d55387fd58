//! A thinking model's reasoning in its output: the `<think>` … `</think>` part that
//! llama-server returns as `reasoning_content` (its `reasoning_format` `auto`/`deepseek`), split
//! from the answer whole ([`split`]) or while streaming ([`ReasoningStream`]).
//!
//! A template that shows `<think>` teaches it ([`shows_thinking`]). The reasoning opens with
//! `<think>` at the start of the output, or is already open when the prompt ends with
//! `<think>` (DeepSeek R1 style templates open it in the generation prompt: [`opened_by`]).
//! Reasoning that never closes is reasoning all the same (the answer is empty), as in
//! llama.cpp.

use crate::harmony::HarmonyStream;
use crate::markers::partial_suffix;
pub use crate::markers::Part;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// How a model writes its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// In `<think>` … `</think>` before the answer.
    Think,
    /// On gpt-oss's `analysis` channel ([`crate::harmony`]).
    Harmony,
}

impl Syntax {
    /// The syntax a chat template shows, if any.
    pub fn detect(template: &str) -> Option<Syntax> {
        if crate::harmony::is_harmony(template) {
            Some(Syntax::Harmony)
        } else {
            shows_thinking(template).then_some(Syntax::Think)
        }
    }

    /// `text` (a whole output) split into reasoning and answer; `open`: the prompt opened the
    /// reasoning (`<think>` only).
    pub fn split(self, text: &str, open: bool) -> Split {
        match self {
            Syntax::Think => split(text, open),
            Syntax::Harmony => {
                let mut stream = HarmonyStream::new();
                let mut parts = stream.push(text);
                parts.extend(stream.finish());
                let mut out = Split::default();
                let mut reasoning: Option<String> = None;
                for (part, piece) in parts {
                    match part {
                        Part::Reasoning => reasoning.get_or_insert_default().push_str(&piece),
                        Part::Content => out.content.push_str(&piece),
                    }
                }
                out.reasoning = reasoning.map(|r| r.trim().to_string());
                out
            }
        }
    }
}

/// Whether a chat template shows reasoning in `<think>` tags.
pub fn shows_thinking(template: &str) -> bool {
    template.contains(OPEN) && template.contains(CLOSE)
}

/// Whether a prompt leaves the reasoning open (it ends with `<think>`).
pub fn opened_by(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// A whole output as its reasoning and its answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// The reasoning, trimmed; `None` when the output has none.
    pub reasoning: Option<String>,
    /// The rest (the answer), its leading whitespace dropped.
    pub content: String,
}

/// `text` split into reasoning and answer; `open`: the prompt opened the reasoning.
pub fn split(text: &str, open: bool) -> Split {
    let body = match (open, text.trim_start().strip_prefix(OPEN)) {
        (_, Some(rest)) => rest,
        (true, None) => text,
        (false, None) => {
            return Split {
                reasoning: None,
                content: text.to_string(),
            }
        }
    };
    let (reasoning, content) = match body.find(CLOSE) {
        Some(at) => (&body[..at], body[at + CLOSE.len()..].trim_start()),
        None => (body, ""),
    };
    Split {
        reasoning: Some(reasoning.trim().to_string()),
        content: content.to_string(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace or a beginning of `<think>` yet.
    Undecided,
    Reasoning,
    /// After `</think>`, before the answer's first non-space.
    AfterReasoning,
    Content,
}

/// Splits streamed output as [`split`] does, handing out each piece as soon as it is known,
/// holding back only what may be the start of a tag.
#[derive(Clone, Debug)]
pub struct ReasoningStream {
    phase: Phase,
    held: String,
    /// Harmony's channels instead of `<think>`.
    harmony: Option<HarmonyStream>,
}

impl ReasoningStream {
    /// A stream of `syntax`; `open`: the prompt opened the reasoning (`<think>` only).
    pub fn for_syntax(syntax: Syntax, open: bool) -> ReasoningStream {
        let mut stream = ReasoningStream::new(open);
        if syntax == Syntax::Harmony {
            stream.harmony = Some(HarmonyStream::new());
        }
        stream
    }

    /// A stream whose reasoning the prompt opened (`open`), or that may open it.
    pub fn new(open: bool) -> ReasoningStream {
        ReasoningStream {
            phase: if open {
                Phase::Reasoning
            } else {
                Phase::Undecided
            },
            held: String::new(),
            harmony: None,
        }
    }

    /// The parts `text` completes, in order.
    pub fn push(&mut self, text: &str) -> Vec<(Part, String)> {
        if let Some(h) = &mut self.harmony {
            return h.push(text);
        }
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Undecided => {
                    let rest = self.held.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.held = after.to_string();
                        self.phase = Phase::Reasoning;
                    } else if rest.is_empty() || OPEN.starts_with(rest) {
                        return out;
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::Reasoning => {
                    if let Some(at) = self.held.find(CLOSE) {
                        push(&mut out, Part::Reasoning, &self.held[..at]);
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.phase = Phase::AfterReasoning;
                        continue;
                    }
                    let keep = partial_suffix(&self.held, CLOSE);
                    let ready = self.held.len() - keep;
                    push(&mut out, Part::Reasoning, &self.held[..ready]);
                    self.held.drain(..ready);
                    return out;
                }
                Phase::AfterReasoning => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.phase = Phase::Content;
                }
                Phase::Content => {
                    push(&mut out, Part::Content, &self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// What is still held when the output ends.
    pub fn finish(&mut self) -> Vec<(Part, String)> {
        if let Some(h) = &mut self.harmony {
            return h.finish();
        }
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.phase {
            Phase::Reasoning => push(&mut out, Part::Reasoning, &held),
            Phase::Undecided | Phase::Content => push(&mut out, Part::Content, &held),
            Phase::AfterReasoning => {}
        }
        out
    }
}

fn push(out: &mut Vec<(Part, String)>, part: Part, text: &str) {
    if !text.is_empty() {
        out.push((part, text.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_outputs_split_as_llama_server_splits_them() {
        let s = split("<think>\nLet me see.\n</think>\n\nParis.", false);
        assert_eq!(s.reasoning.as_deref(), Some("Let me see."));
        assert_eq!(s.content, "Paris.");
        let s = split("Let me see.</think>Paris.", true);
        assert_eq!(s.reasoning.as_deref(), Some("Let me see."));
        assert_eq!(s.content, "Paris.");
        assert_eq!(split("Paris.", false).reasoning, None);
        assert_eq!(split("Paris.", false).content, "Paris.");
        let unclosed = split("<think>still thinking", false);
        assert_eq!(unclosed.reasoning.as_deref(), Some("still thinking"));
        assert_eq!(unclosed.content, "");
        assert!(opened_by("<|Assistant|><think>\n"));
        assert!(!opened_by("<|im_start|>assistant\n"));
        assert!(shows_thinking("{{ '<think>' }}{{ c }}{{ '</think>' }}"));
        assert!(!shows_thinking("<|im_start|>"));
    }

    /// Any cut of the output into pieces streams the same parts as the whole split.
    #[test]
    fn streaming_gives_the_whole_split_for_every_cut() {
        for (text, open) in [
            ("<think>\nLet me see.\n</think>\n\nParis.", false),
            ("  <think>a</think>b", false),
            ("Let me see.</think>\nParis.", true),
            ("Paris is <thin> not a tag", false),
            ("<thi", false),
            ("<think>never closed </thi", false),
        ] {
            let whole = split(text, open);
            for cut in 1..text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let mut stream = ReasoningStream::new(open);
                let mut parts = stream.push(&text[..cut]);
                parts.extend(stream.push(&text[cut..]));
                parts.extend(stream.finish());
                let join = |p: Part| {
                    parts
                        .iter()
                        .filter(|(k, _)| *k == p)
                        .map(|(_, t)| t.as_str())
                        .collect::<String>()
                };
                let reasoning = join(Part::Reasoning);
                assert_eq!(
                    whole.reasoning.as_deref().unwrap_or(""),
                    reasoning.trim(),
                    "{text:?} cut at {cut}"
                );
                assert_eq!(whole.content, join(Part::Content), "{text:?} cut at {cut}");
            }
        }
    }
}
