//! Tool calls in a model's output: which format a chat template teaches its model
//! ([`ToolCallFormat::detect`]), the split of a finished output into text and calls
//! ([`ToolCallFormat::parse`]), and, while streaming, where text must be held back because a
//! call may be starting there ([`ToolCallFormat::hold_from`]).
//!
//! The formats are the common ones of the families rgml runs, as llama.cpp's chat parsers read
//! them: Hermes 2 Pro / Qwen (`<tool_call>{"name": .., "arguments": {..}}</tool_call>`, any
//! number of them, text around them), Llama 3.x (the whole output one JSON object with `name`
//! and `parameters`, after an optional `<|python_tag|>`), Mistral Nemo
//! (`[TOOL_CALLS][{"name": .., "arguments": {..}, "id": ..}, ..]` after any text) and Mistral's
//! later tokenizers (v11 on: Mistral Small 3.2, Devstral, Magistral, Ministral 3:
//! `[TOOL_CALLS]name[ARGS]{..}` per call, Small 3.2 with `[CALL_ID]id` before `[ARGS]`). A call
//! whose JSON does not parse stays text, as llama-server leaves it. gpt-oss's harmony calls
//! (a message to `functions.NAME` whose body is the arguments) reach the parser in the
//! canonical form [`crate::harmony`] gives them.
//!
//! The markers of some formats are control tokens (Mistral's `[TOOL_CALLS]` and `[ARGS]`),
//! which decode to nothing unless asked for: [`ToolCallFormat::markers`] names the ones a
//! server must render for the parser to see them (llama.cpp's "preserved tokens").

use crate::harmony;
use crate::markers::{marker_from, partial_suffix};
use crate::message::ToolCall;
use serde_json::Value;

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_MARKER: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const PYTHON_TAG: &str = "<|python_tag|>";

/// How a model writes its tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>` JSON `</tool_call>` blocks (Hermes 2 Pro, Qwen 2.5 / 3).
    Hermes,
    /// One JSON object with `name` and `parameters` (Llama 3.1 / 3.2 / 3.3).
    Llama3Json,
    /// `[TOOL_CALLS]` and a JSON list of calls (Mistral Nemo, Mistral Small before 3.2).
    MistralNemo,
    /// `[TOOL_CALLS]name[ARGS]{..}` per call, `[CALL_ID]id` before `[ARGS]` where the template
    /// shows ids (Mistral's v11+ tokenizers: Mistral Small 3.2, Devstral, Magistral, Ministral 3).
    MistralV11,
    /// gpt-oss's harmony messages to `functions.NAME` (see [`crate::harmony`]).
    Harmony,
}

/// A finished output split into its text and its tool calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// The text outside the calls, trimmed.
    pub content: String,
    /// The calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl ToolCallFormat {
    /// The format a chat template teaches, from the markers its source holds; `None` for a
    /// template that shows no tool calls.
    pub fn detect(template: &str) -> Option<ToolCallFormat> {
        if harmony::is_harmony(template) {
            Some(ToolCallFormat::Harmony)
        } else if template.contains(HERMES_OPEN) {
            Some(ToolCallFormat::Hermes)
        } else if template.contains(MISTRAL_MARKER) && template.contains(MISTRAL_ARGS) {
            Some(ToolCallFormat::MistralV11)
        } else if template.contains(MISTRAL_MARKER) {
            Some(ToolCallFormat::MistralNemo)
        } else if template.contains("<|start_header_id|>") && template.contains("ipython") {
            Some(ToolCallFormat::Llama3Json)
        } else {
            None
        }
    }

    /// `text` (a whole output) as its text and tool calls.
    pub fn parse(self, text: &str) -> ParsedOutput {
        let parsed = match self {
            ToolCallFormat::Hermes => parse_hermes(text),
            ToolCallFormat::Llama3Json => parse_llama3(text),
            ToolCallFormat::MistralNemo => parse_mistral(text),
            ToolCallFormat::MistralV11 => parse_mistral_v11(text),
            ToolCallFormat::Harmony => parse_harmony(text),
        };
        parsed.unwrap_or_else(|| ParsedOutput {
            content: text.trim().to_string(),
            tool_calls: Vec::new(),
        })
    }

    /// The fixed texts around the arguments (a JSON object) of a forced call of `name`
    /// (OpenAI's `tool_choice` `required`, or a named function).
    pub fn forced_frame(self, name: &str) -> (String, String) {
        let (open, args_key, close) = match self {
            ToolCallFormat::Hermes => ("<tool_call>\n", "arguments", "\n</tool_call>"),
            ToolCallFormat::Llama3Json => ("", "parameters", ""),
            ToolCallFormat::MistralNemo => ("[TOOL_CALLS][", "arguments", "]"),
            ToolCallFormat::MistralV11 => {
                return (
                    format!("{MISTRAL_MARKER}{name}{MISTRAL_ARGS}"),
                    String::new(),
                )
            }
            // The raw output (before `harmony`'s split), as gpt-oss writes a call.
            ToolCallFormat::Harmony => {
                let (call, message) = (harmony::CALL_OPEN, harmony::MESSAGE);
                return (
                    format!("{call}{name} <|constrain|>json{message}"),
                    String::new(),
                );
            }
        };
        let name = Value::from(name).to_string();
        (
            format!("{open}{{\"name\": {name}, \"{args_key}\": "),
            format!("}}{close}"),
        )
    }

    /// The marker texts a server renders even where they are control tokens, so that the
    /// output it parses shows them (llama.cpp's preserved tokens of the format).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Hermes => &[HERMES_OPEN, HERMES_CLOSE],
            ToolCallFormat::Llama3Json => &[PYTHON_TAG],
            ToolCallFormat::MistralNemo => &[MISTRAL_MARKER],
            ToolCallFormat::MistralV11 => &[MISTRAL_MARKER, MISTRAL_ARGS, MISTRAL_CALL_ID],
            ToolCallFormat::Harmony => &harmony::MARKERS,
        }
    }

    /// Where, in a partial output, a tool call may have begun (its text from there must not be
    /// sent yet); `None`: all of it is text.
    pub fn hold_from(self, text: &str) -> Option<usize> {
        match self {
            ToolCallFormat::Hermes => marker_from(text, HERMES_OPEN),
            ToolCallFormat::MistralNemo | ToolCallFormat::MistralV11 => {
                marker_from(text, MISTRAL_MARKER)
            }
            ToolCallFormat::Harmony => marker_from(text, harmony::CALL_OPEN),
            ToolCallFormat::Llama3Json => {
                let rest = text.trim_start();
                let opens = rest.starts_with('{')
                    || rest.starts_with(PYTHON_TAG)
                    || PYTHON_TAG.starts_with(rest);
                opens.then_some(0)
            }
        }
    }
}

/// A call being written, as far as a streamed output shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialCall {
    /// The function's name (whole: a call shows once its name is).
    pub name: String,
    /// The arguments' JSON text so far, as the model writes it.
    pub arguments: String,
    /// The arguments are whole.
    pub done: bool,
}

impl ToolCallFormat {
    /// While streaming: the calls begun in `text` (the output so far) whose name is whole, in
    /// order, for calls written `{"name": .., "arguments": ..}` (or `parameters`) in that
    /// order. `None` where a call's layout is another (its name after its arguments, say):
    /// the caller then waits for the whole output.
    pub fn partial_calls(self, text: &str) -> Option<Vec<PartialCall>> {
        let mut calls = Vec::new();
        match self {
            ToolCallFormat::Hermes => {
                let mut rest = text;
                while let Some(open) = rest.find(HERMES_OPEN) {
                    let body = &rest[open + HERMES_OPEN.len()..];
                    let (call, used) = match partial_object(body)? {
                        Some(found) => found,
                        None => break,
                    };
                    calls.push(call);
                    match body.get(used..) {
                        Some(after) => rest = after,
                        None => break,
                    }
                }
            }
            ToolCallFormat::Llama3Json => {
                let body = text.trim_start();
                if PYTHON_TAG.starts_with(body) {
                    return Some(calls);
                }
                let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
                calls.extend(partial_object(body)?.map(|(call, _)| call));
            }
            ToolCallFormat::MistralNemo => {
                let Some(at) = text.find(MISTRAL_MARKER) else {
                    return Some(calls);
                };
                let rest = text[at + MISTRAL_MARKER.len()..].trim_start();
                let Some(mut rest) = rest.strip_prefix('[') else {
                    return (rest.is_empty()).then_some(calls);
                };
                while let Some((call, used)) = partial_object(rest)? {
                    calls.push(call);
                    match rest.get(used..) {
                        Some(after) => rest = after.trim_start(),
                        None => break,
                    }
                    match rest.strip_prefix(',') {
                        Some(next) => rest = next,
                        None => break,
                    }
                }
            }
            ToolCallFormat::Harmony => {
                for segment in text.split(harmony::CALL_OPEN).skip(1) {
                    let Some((name, args)) = segment.split_once(harmony::MESSAGE) else {
                        break;
                    };
                    let (args, done) = match args.find(harmony::END) {
                        Some(at) => (&args[..at], true),
                        // Not what may be the start of the end marker.
                        None => (
                            &args[..args.len() - partial_suffix(args, harmony::END)],
                            false,
                        ),
                    };
                    calls.push(PartialCall {
                        name: name.to_string(),
                        arguments: args.to_string(),
                        done,
                    });
                }
            }
            ToolCallFormat::MistralV11 => {
                for segment in text.split(MISTRAL_MARKER).skip(1) {
                    match v11_call(segment) {
                        Some(call) => calls.push(call),
                        // The name is not whole yet.
                        None => break,
                    }
                }
            }
        }
        Some(calls)
    }
}

/// A `name[CALL_ID]id[ARGS]{..}` segment after `[TOOL_CALLS]`, as far as it is written: `None`
/// until `[ARGS]` shows the name whole.
fn v11_call(segment: &str) -> Option<PartialCall> {
    let (head, args) = segment.split_once(MISTRAL_ARGS)?;
    let name = head.split(MISTRAL_CALL_ID).next().unwrap_or(head);
    let args = args.trim_start();
    let (arguments, done) = match value_end(args) {
        Some(len) => (&args[..len], true),
        None => (args, false),
    };
    Some(PartialCall {
        name: name.trim().to_string(),
        arguments: arguments.to_string(),
        done,
    })
}

/// Why a streamed call object cannot be read (yet).
enum Cut {
    /// Too little is written.
    More,
    /// It is laid out otherwise.
    Other,
}

/// The start of `text` as a call object `{"name": "..", "arguments": ..`: `Some(None)` while
/// too little is written to tell its name, `None` for another layout; with the call, the
/// length of the call object (past `text`'s end while it is open).
fn partial_object(text: &str) -> Option<Option<(PartialCall, usize)>> {
    match read_call(text) {
        Ok(found) => Some(Some(found)),
        Err(Cut::More) => Some(None),
        Err(Cut::Other) => None,
    }
}

fn read_call(text: &str) -> Result<(PartialCall, usize), Cut> {
    let mut at = 0;
    for lit in ["{", "\"name\"", ":"] {
        at = literal(text, at, &[lit])?;
    }
    at = skip_ws(text, at);
    let end = value_end(&text[at..]).ok_or(Cut::More)?;
    let name: String = serde_json::from_str(&text[at..at + end]).map_err(|_| Cut::Other)?;
    at = literal(text, at + end, &[","])?;
    at = literal(text, at, &["\"arguments\"", "\"parameters\""])?;
    at = skip_ws(text, literal(text, at, &[":"])?);
    let rest = &text[at..];
    let (len, done) = match value_end(rest) {
        Some(len) => (len, true),
        None => (rest.len(), false),
    };
    let arguments = rest[..len].to_string();
    // Past the call object's other keys (Mistral's `id`) and its closing brace, once written.
    let after = done
        .then(|| value_end(&format!("{{{}", &rest[len..])))
        .flatten()
        .map_or(text.len() + 1, |n| at + len + n - 1);
    Ok((
        PartialCall {
            name,
            arguments,
            done,
        },
        after,
    ))
}

/// Past blanks and one of `options` from byte `at` of `text`.
fn literal(text: &str, at: usize, options: &[&str]) -> Result<usize, Cut> {
    let at = skip_ws(text, at);
    let rest = &text[at..];
    if let Some(lit) = options.iter().find(|lit| rest.starts_with(**lit)) {
        return Ok(at + lit.len());
    }
    match options.iter().any(|lit| lit.starts_with(rest)) {
        true => Err(Cut::More),
        false => Err(Cut::Other),
    }
}

fn skip_ws(text: &str, at: usize) -> usize {
    let rest = &text[at..];
    at + rest.len() - rest.trim_start_matches([' ', '\n', '\r', '\t']).len()
}

/// The length of the JSON value `text` begins with, once it is whole (a number or literal
/// counts as whole once something follows it).
fn value_end(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &c) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t' if depth == 0 => {
                return (i > 0).then_some(i);
            }
            _ => {}
        }
    }
    None
}

/// A call from a JSON object with `name` and `args_key` (an object, or JSON text).
fn call(value: &Value, args_keys: &[&str]) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?.to_string();
    let args = args_keys.iter().find_map(|k| value.get(*k))?;
    let arguments = match args {
        Value::String(text) => text.clone(),
        other => serde_json::to_string(other).ok()?,
    };
    let id = value.get("id").and_then(Value::as_str).map(String::from);
    Some(ToolCall {
        id,
        name,
        arguments,
    })
}

fn parse_hermes(text: &str) -> Option<ParsedOutput> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(HERMES_OPEN) {
        content.push_str(&rest[..open]);
        let body = &rest[open + HERMES_OPEN.len()..];
        let (json, after) = match body.find(HERMES_CLOSE) {
            Some(close) => (&body[..close], &body[close + HERMES_CLOSE.len()..]),
            None => (body, ""),
        };
        let value: Value = serde_json::from_str(json.trim()).ok()?;
        calls.push(call(&value, &["arguments", "parameters"])?);
        rest = after;
    }
    content.push_str(rest);
    Some(ParsedOutput {
        content: content.trim().to_string(),
        tool_calls: calls,
    })
}

fn parse_llama3(text: &str) -> Option<ParsedOutput> {
    let body = text.trim_start();
    let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim();
    if !body.starts_with('{') {
        return None;
    }
    let value: Value = serde_json::from_str(body).ok()?;
    Some(ParsedOutput {
        content: String::new(),
        tool_calls: vec![call(&value, &["parameters", "arguments"])?],
    })
}

fn parse_mistral(text: &str) -> Option<ParsedOutput> {
    let at = text.find(MISTRAL_MARKER)?;
    let list: Vec<Value> = serde_json::from_str(text[at + MISTRAL_MARKER.len()..].trim()).ok()?;
    let calls = list
        .iter()
        .map(|v| call(v, &["arguments", "parameters"]))
        .collect::<Option<Vec<_>>>()?;
    Some(ParsedOutput {
        content: text[..at].trim().to_string(),
        tool_calls: calls,
    })
}

/// Mistral v11+: the text before the first `[TOOL_CALLS]`, then one call per marker, each
/// `name`, an optional `[CALL_ID]id` and `[ARGS]` with its JSON arguments.
fn parse_mistral_v11(text: &str) -> Option<ParsedOutput> {
    let mut segments = text.split(MISTRAL_MARKER);
    let content = segments.next().unwrap_or_default().trim().to_string();
    let mut calls = Vec::new();
    for segment in segments {
        let (head, args) = segment.split_once(MISTRAL_ARGS)?;
        let (name, id) = match head.split_once(MISTRAL_CALL_ID) {
            Some((name, id)) => (name, Some(id.trim().to_string())),
            None => (head, None),
        };
        let args: Value = serde_json::from_str(args.trim()).ok()?;
        let name = name.trim();
        if name.is_empty() {
            return None;
        }
        calls.push(ToolCall {
            id,
            name: name.to_string(),
            arguments: match args {
                Value::String(text) => text,
                other => serde_json::to_string(&other).ok()?,
            },
        });
    }
    Some(ParsedOutput {
        content,
        tool_calls: calls,
    })
}

/// Harmony calls in their canonical form (`crate::harmony`), each
/// `CALL_OPEN name <|message|> args <|end|>`, and the text around them.
fn parse_harmony(text: &str) -> Option<ParsedOutput> {
    let mut segments = text.split(harmony::CALL_OPEN);
    let mut content = segments.next().unwrap_or_default().to_string();
    let mut calls = Vec::new();
    for segment in segments {
        let (name, rest) = segment.split_once(harmony::MESSAGE)?;
        let (args, after) = rest.split_once(harmony::END).unwrap_or((rest, ""));
        let args: Value = serde_json::from_str(args.trim()).ok()?;
        calls.push(ToolCall {
            id: None,
            name: name.trim().to_string(),
            arguments: match args {
                Value::String(text) => text,
                other => serde_json::to_string(&other).ok()?,
            },
        });
        content.push_str(after);
    }
    Some(ParsedOutput {
        content: content.trim().to_string(),
        tool_calls: calls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: None,
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn formats_are_detected_from_the_template() {
        let qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools> <tool_call>{%- endif %}";
        assert_eq!(ToolCallFormat::detect(qwen), Some(ToolCallFormat::Hermes));
        let llama = "<|start_header_id|>ipython<|end_header_id|>{{ content }}";
        assert_eq!(
            ToolCallFormat::detect(llama),
            Some(ToolCallFormat::Llama3Json)
        );
        let mistral = "[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS] [TOOL_CALLS]";
        assert_eq!(
            ToolCallFormat::detect(mistral),
            Some(ToolCallFormat::MistralNemo)
        );
        let v11 = "{{- '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}";
        assert_eq!(
            ToolCallFormat::detect(v11),
            Some(ToolCallFormat::MistralV11)
        );
        assert_eq!(ToolCallFormat::detect("{{ messages }}<|im_start|>"), None);
    }

    #[test]
    fn hermes_calls_and_the_text_around_them() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\", \"arguments\": \"{}\"}</tool_call>";
        let parsed = ToolCallFormat::Hermes.parse(text);
        assert_eq!(parsed.content, "Let me check.");
        assert_eq!(
            parsed.tool_calls,
            [call("weather", r#"{"city":"Paris"}"#), call("time", "{}")]
        );
        // Broken JSON stays text; no call is plain text.
        let broken = "<tool_call>{\"name\": \"weather\", </tool_call>";
        assert_eq!(ToolCallFormat::Hermes.parse(broken).content, broken);
        assert!(ToolCallFormat::Hermes.parse(broken).tool_calls.is_empty());
        assert_eq!(
            ToolCallFormat::Hermes.parse(" Hello "),
            ParsedOutput {
                content: "Hello".into(),
                tool_calls: Vec::new()
            }
        );
    }

    #[test]
    fn llama3_and_mistral_calls() {
        let text = "<|python_tag|>{\"name\": \"weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        let parsed = ToolCallFormat::Llama3Json.parse(text);
        assert_eq!(parsed.tool_calls, [call("weather", r#"{"city":"Oslo"}"#)]);
        assert_eq!(parsed.content, "");
        assert!(ToolCallFormat::Llama3Json
            .parse("Oslo is cold.")
            .tool_calls
            .is_empty());
        let text = "Sure. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abc123XYZ\"}]";
        let parsed = ToolCallFormat::MistralNemo.parse(text);
        assert_eq!(parsed.content, "Sure.");
        let mut want = call("a", r#"{"x":1}"#);
        want.id = Some("abc123XYZ".into());
        assert_eq!(parsed.tool_calls, [want.clone()]);
        // v11: one marker per call, ids where Mistral Small 3.2 writes them.
        let v11 = ToolCallFormat::MistralV11;
        let text = "Sure. [TOOL_CALLS]a[CALL_ID]abc123XYZ[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}";
        let parsed = v11.parse(text);
        assert_eq!(parsed.content, "Sure.");
        assert_eq!(parsed.tool_calls, [want, call("b", "{}")]);
        let broken = "[TOOL_CALLS]a[ARGS]{\"x\":";
        assert!(v11.parse(broken).tool_calls.is_empty());
        assert_eq!(v11.parse(broken).content, broken);
    }

    /// A forced call's frame around any JSON object parses as a call of that function.
    #[test]
    fn forced_frames_parse_as_calls() {
        for format in [
            ToolCallFormat::Hermes,
            ToolCallFormat::Llama3Json,
            ToolCallFormat::MistralNemo,
            ToolCallFormat::MistralV11,
        ] {
            let (open, close) = format.forced_frame("get \"x\"");
            let parsed = format.parse(&format!("{open}{{\"a\": 1}}{close}"));
            assert_eq!(
                parsed.tool_calls,
                [call("get \"x\"", r#"{"a":1}"#)],
                "{format:?}"
            );
        }
    }

    /// gpt-oss's forced call, written raw, is a call once harmony's channels are split; and
    /// its templates are told by their markers.
    #[test]
    fn harmony_calls_parse_after_the_channel_split() {
        let h = ToolCallFormat::Harmony;
        let (open, close) = h.forced_frame("get");
        let raw = format!("{open}{{\"a\": 1}}{close}");
        let split = crate::reasoning::Syntax::Harmony.split(&raw, false);
        assert_eq!(
            h.parse(&split.content).tool_calls,
            [call("get", r#"{"a":1}"#)]
        );
        let text = "Checking.<|channel|>commentary to=functions.f<|message|>{}<|end|> done";
        let parsed = h.parse(text);
        assert_eq!(parsed.content, "Checking. done");
        assert_eq!(parsed.tool_calls, [call("f", "{}")]);
        let template = "{{- '<|start|>assistant<|channel|>final<|message|>' }}";
        assert_eq!(ToolCallFormat::detect(template), Some(h));
        assert_eq!(h.hold_from("Checking.<|chan"), Some(9));
    }

    #[test]
    fn streaming_holds_back_from_where_a_call_may_begin() {
        let h = ToolCallFormat::Hermes;
        assert_eq!(h.hold_from("plain text"), None);
        assert_eq!(h.hold_from("text <tool"), Some(5));
        assert_eq!(h.hold_from("text <tool_call>{\"na"), Some(5));
        assert_eq!(h.hold_from("a <"), Some(2));
        assert_eq!(h.hold_from("a < b"), None);
        assert_eq!(ToolCallFormat::MistralNemo.hold_from("x [TOOL"), Some(2));
        assert_eq!(ToolCallFormat::MistralV11.hold_from("x [TOOL"), Some(2));
        let l = ToolCallFormat::Llama3Json;
        assert_eq!(l.hold_from(""), Some(0));
        assert_eq!(l.hold_from(" {\"name\""), Some(0));
        assert_eq!(l.hold_from("<|python"), Some(0));
        assert_eq!(l.hold_from("The answer"), None);
    }

    #[test]
    fn partial_calls_grow_with_the_output_and_end_as_the_parse() {
        let outputs = [
            (ToolCallFormat::Hermes, "Let me check. <tool_call>\n{\"name\": \"get \\\"x\\\"\", \"arguments\": {\"city\": \"Pa}ris\", \"n\": [1, 2]}}\n</tool_call>\n<tool_call>{\"name\": \"time\", \"arguments\": {}}</tool_call>"),
            (ToolCallFormat::Llama3Json, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": -1.5e3, \"b\": null}}"),
            (ToolCallFormat::MistralNemo, "ok [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": \"[x]\"}}, {\"name\": \"g\", \"arguments\": {\"z\": true}}]"),
            (ToolCallFormat::MistralV11, "ok [TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{\"q\": \"[x]\"}[TOOL_CALLS]g[ARGS]{\"z\": true}"),
            (ToolCallFormat::Harmony, "<|channel|>commentary to=functions.f<|message|>{\"q\": 1}<|end|><|channel|>commentary to=functions.g<|message|>{}<|end|>"),
        ];
        for (format, output) in outputs {
            let whole = format.parse(output).tool_calls;
            let mut seen: Vec<PartialCall> = Vec::new();
            for cut in (0..=output.len()).filter(|&i| output.is_char_boundary(i)) {
                let calls = format
                    .partial_calls(&output[..cut])
                    .expect("this layout streams");
                assert!(
                    calls.len() >= seen.len(),
                    "{format:?} at {cut}: calls went away"
                );
                for (old, new) in seen.iter().zip(&calls) {
                    assert_eq!(old.name, new.name);
                    assert!(
                        new.arguments.starts_with(&old.arguments),
                        "{format:?} at {cut}"
                    );
                }
                seen = calls;
            }
            assert_eq!(seen.len(), whole.len(), "{format:?}");
            for (partial, call) in seen.iter().zip(&whole) {
                assert!(partial.done);
                assert_eq!(partial.name, call.name);
                let a: Value = serde_json::from_str(&partial.arguments).unwrap();
                let b: Value = serde_json::from_str(&call.arguments).unwrap();
                assert_eq!(a, b, "{format:?}");
            }
        }
        // The arguments first: not streamed, the caller waits for the whole output.
        let late = "<tool_call>{\"arguments\": {}, \"name\": \"f\"}</tool_call>";
        assert_eq!(ToolCallFormat::Hermes.partial_calls(late), None);
        assert_eq!(
            ToolCallFormat::Hermes.partial_calls("text <tool_call>{\"na"),
            Some(vec![])
        );
    }
}
