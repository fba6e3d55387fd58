//! The changes llama.cpp makes to a conversation before rendering it, decided by what the
//! template can do (llama.cpp's `common/jinja/caps.cpp` and `workaround::` in `chat.cpp`).
//!
//! llama.cpp finds a template's capabilities by rendering probe conversations and tracking
//! which values the template reads; here a probe value carries a marker text and counts as
//! read when the marker reaches the output (or `tojson` output), which is the same for the
//! templates that print what they read.

use minijinja::Value;

const SYSTEM_MARKER: &str = "rgml-probe-system-7f3a";
const ARGUMENT_MARKER: &str = "rgml-probe-argument-7f3a";

/// What a template does with the messages, as far as llama.cpp's workarounds care.
#[derive(Clone, Copy, Debug)]
pub(super) struct Caps {
    /// It prints a leading system message (else llama.cpp merges it into the next message).
    pub system_role: bool,
    /// It reads tool call arguments as a mapping (else they stay JSON text).
    pub object_arguments: bool,
    /// It is a GPT-OSS (harmony) template, which keeps the `developer` role.
    pub keeps_developer: bool,
    /// It is a Gemma 4 template (calls written `<|tool_call>call:`).
    pub gemma4: bool,
    /// It is an older Gemma 4 template, which reads tool results from the model's turn (its
    /// `tool_responses`) rather than from `tool` messages.
    pub gemma4_tool_responses: bool,
}

/// Probes `render` (a conversation to its text, `None` on failure) for the capabilities.
pub(super) fn probe(source: &str, render: impl Fn(Value, Option<Value>) -> Option<String>) -> Caps {
    let system = Value::from(vec![
        message(&[("role", "system".into()), ("content", SYSTEM_MARKER.into())]),
        message(&[("role", "user".into()), ("content", "User message".into())]),
    ]);
    let system_role = render(system, None).is_some_and(|out| out.contains(SYSTEM_MARKER));
    let object_arguments = render(tool_conversation(), Some(tool_list()))
        .is_some_and(|out| out.contains(ARGUMENT_MARKER));
    let gemma4 = source.contains("'<|tool_call>call:'");
    Caps {
        system_role,
        object_arguments,
        keeps_developer: source.contains("<|channel|>"),
        gemma4,
        gemma4_tool_responses: gemma4 && !source.contains("{#- OpenAI Chat Completions:"),
    }
}

fn message(fields: &[(&str, Value)]) -> Value {
    Value::from_pairs(fields.iter().cloned())
}

/// llama.cpp's probe: a call with object arguments, its result, and a reply.
fn tool_conversation() -> Value {
    let arguments = message(&[("arg", ARGUMENT_MARKER.into())]);
    let function = message(&[("name", "tool1".into()), ("arguments", arguments)]);
    let call = message(&[
        ("id", "call00001".into()),
        ("type", "function".into()),
        ("function", function),
    ]);
    Value::from(vec![
        message(&[("role", "user".into()), ("content", "User message".into())]),
        message(&[
            ("role", "assistant".into()),
            ("content", "".into()),
            ("tool_calls", Value::from(vec![call])),
        ]),
        message(&[
            ("role", "tool".into()),
            ("content", "Tool response".into()),
            ("tool_call_id", "call00001".into()),
        ]),
        message(&[
            ("role", "assistant".into()),
            ("content", "The tool response was 'tool response'".into()),
        ]),
        message(&[("role", "user".into()), ("content", "User message".into())]),
    ])
}

fn tool_list() -> Value {
    let parameters = super::value_from_json(
        r#"{"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}}, "required": ["arg"]}"#,
    )
    .unwrap_or_default();
    let function = message(&[
        ("name", "tool1".into()),
        ("description", "Tool description".into()),
        ("parameters", parameters),
    ]);
    Value::from(vec![message(&[
        ("name", "tool".into()),
        ("type", "function".into()),
        ("function", function),
    ])])
}

/// The messages as llama.cpp renders them for a template with `caps`.
pub(super) fn messages(messages: &Value, caps: Caps) -> Value {
    let Ok(iter) = messages.try_iter() else {
        return messages.clone();
    };
    let mut list: Vec<Value> = iter
        .map(|m| {
            let m = if caps.keeps_developer {
                m
            } else {
                developer_to_system(&m)
            };
            if caps.object_arguments {
                parse_arguments(&m)
            } else {
                m
            }
        })
        .collect();
    if !caps.system_role && field(list.first(), "role").as_deref() == Some("system") {
        merge_system(&mut list);
    }
    if caps.gemma4_tool_responses {
        list = model_turns_with_tool_responses(list);
    }
    Value::from(list)
}

/// llama.cpp's `convert_tool_responses_gemma4`: each assistant message with tool calls, the
/// `tool` messages after it and a plain assistant reply after those become one assistant
/// message, `{role, tool_calls, tool_responses, content, reasoning_content}` (the last three
/// where there are some; the calling message's own content is dropped, as there).
fn model_turns_with_tool_responses(list: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::with_capacity(list.len());
    let mut rest = list.into_iter().peekable();
    while let Some(m) = rest.next() {
        let calls = m.get_attr("tool_calls").unwrap_or_default();
        if field(Some(&m), "role").as_deref() != Some("assistant") || !non_empty(&calls) {
            out.push(m);
            continue;
        }
        let reasoning = m
            .get_attr("reasoning_content")
            .ok()
            .filter(|r| r.as_str().is_some());
        let mut responses = Vec::new();
        while let Some(result) = rest.next_if(|r| field(Some(r), "role").as_deref() == Some("tool"))
        {
            responses.push(tool_response(&result, &calls, responses.len()));
        }
        let reply = rest.next_if(|r| {
            field(Some(r), "role").as_deref() == Some("assistant")
                && !non_empty(&r.get_attr("tool_calls").unwrap_or_default())
                && non_empty(&r.get_attr("content").unwrap_or_default())
        });
        let mut turn = vec![("role", Value::from("assistant")), ("tool_calls", calls)];
        if !responses.is_empty() {
            turn.push(("tool_responses", Value::from(responses)));
        }
        if let Some(reply) = reply {
            turn.push(("content", reply.get_attr("content").unwrap_or_default()));
        }
        if let Some(reasoning) = reasoning {
            turn.push(("reasoning_content", reasoning));
        }
        out.push(message(&turn));
    }
    out
}

/// A non-empty string or sequence.
fn non_empty(v: &Value) -> bool {
    match v.as_str() {
        Some(text) => !text.is_empty(),
        None => v.kind() == minijinja::value::ValueKind::Seq && v.len().is_some_and(|n| n > 0),
    }
}

/// Tool result `result` as Gemma 4's `{name, response}`: the content parsed as JSON where it
/// is JSON, the name that of call `index` (else the result's `tool_call_id`).
fn tool_response(result: &Value, calls: &Value, index: usize) -> Value {
    let content = result.get_attr("content").unwrap_or_default();
    let response = match content.as_str() {
        Some(text) => super::value_from_json(text).unwrap_or(content),
        None => content,
    };
    let called = calls
        .get_item(&Value::from(index))
        .and_then(|call| call.get_attr("function"))
        .and_then(|function| function.get_attr("name"))
        .ok()
        .and_then(|name| name.as_str().map(String::from))
        .filter(|name| !name.is_empty());
    let name = called
        .or_else(|| field(Some(result), "tool_call_id"))
        .unwrap_or_default();
    message(&[("name", Value::from(name)), ("response", response)])
}

fn field(message: Option<&Value>, key: &str) -> Option<String> {
    message?.get_attr(key).ok()?.as_str().map(String::from)
}

/// `message` with `key` set to `value`, keeping the order of its fields.
fn with_field(message: &Value, key: &str, value: Value) -> Value {
    let mut pairs: Vec<(Value, Value)> = match message.try_iter() {
        Ok(keys) => keys
            .map(|k| {
                let v = message.get_item(&k).unwrap_or_default();
                (k, v)
            })
            .collect(),
        Err(_) => return message.clone(),
    };
    match pairs.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
        Some(pair) => pair.1 = value,
        None => pairs.push((Value::from(key), value)),
    }
    Value::from_pairs(pairs)
}

fn developer_to_system(message: &Value) -> Value {
    if field(Some(message), "role").as_deref() == Some("developer") {
        with_field(message, "role", Value::from("system"))
    } else {
        message.clone()
    }
}

/// Tool call arguments given as JSON text, parsed (llama.cpp's `func_args_not_string`).
fn parse_arguments(message: &Value) -> Value {
    let calls = message.get_attr("tool_calls").unwrap_or_default();
    if calls.is_undefined() || calls.is_none() {
        return message.clone();
    }
    let Ok(iter) = calls.try_iter() else {
        return message.clone();
    };
    let calls: Vec<Value> = iter
        .map(|call| {
            let Ok(function) = call.get_attr("function") else {
                return call;
            };
            let parsed = function
                .get_attr("arguments")
                .ok()
                .and_then(|a| a.as_str().map(String::from))
                .and_then(|text| super::value_from_json(&text).ok());
            match parsed {
                Some(args) => {
                    with_field(&call, "function", with_field(&function, "arguments", args))
                }
                None => call,
            }
        })
        .collect();
    with_field(message, "tool_calls", Value::from(calls))
}

/// A leading system message joined to the next one with a newline, or dropped if alone.
fn merge_system(list: &mut Vec<Value>) {
    let system = list.remove(0);
    if let Some(next) = list.first_mut() {
        let joined = format!(
            "{}\n{}",
            field(Some(&system), "content").unwrap_or_default(),
            field(Some(next), "content").unwrap_or_default()
        );
        *next = with_field(next, "content", Value::from(joined));
    }
}
