//! Jinja chat templates: a model's `tokenizer.chat_template` (or a template file) run with
//! minijinja, the way llama.cpp's `--jinja` renders it.
//!
//! This module owns compiling a template once and rendering a conversation with the variables
//! llama.cpp passes (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools`,
//! `enable_thinking`, `date_string`/`datetime`, `preserve_reasoning` and the history variables
//! it implies) and its functions (`raise_exception`,
//! `strftime_now`). Where llama.cpp's own Jinja engine differs from Jinja's defaults and the
//! templates notice, it is mirrored here: `trim_blocks`/`lstrip_blocks` on, `tojson` as
//! Python's `json.dumps` without ASCII escaping, `True`/`False`/`None` printed Python's way,
//! and Python's string and dict methods (minijinja-contrib's `pycompat`).

mod compat;
mod concat;
mod json;
mod prepare;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};

/// A value handed to a template (messages, tools, extra variables). Maps keep their order,
/// which `tojson` output depends on.
pub type TemplateValue = Value;

const TEMPLATE_NAME: &str = "chat_template";
/// Marks an error raised by the template itself, to tell it from a rendering failure.
const RAISED: &str = "raise_exception: ";

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template text is not Jinja that minijinja can compile.
    #[error("chat template does not parse: {0}")]
    Parse(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// Rendering failed (an undefined operation, a wrong type, ...).
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// A JSON value for the template (messages, tools) does not parse.
    #[error("invalid JSON for the chat template: {0}")]
    Json(String),
}

/// What a conversation is rendered from.
#[derive(Clone, Debug)]
pub struct ChatTemplateInputs {
    /// The messages: a sequence of maps with `role`, `content` and whatever else the
    /// application sent (`tool_calls`, `tool_call_id`, `name`, `reasoning_content`).
    pub messages: TemplateValue,
    /// Tool definitions (the OpenAI `tools` list), passed only when present.
    pub tools: Option<TemplateValue>,
    /// Whether to open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// The reasoning switch of thinking models (llama.cpp passes it to every template).
    pub enable_thinking: bool,
    /// Further variables (llama.cpp's `chat_template_kwargs`), set after the others.
    pub extra: Vec<(String, TemplateValue)>,
    /// The time `strftime_now`, `date_string` and `datetime` show, in seconds since the Unix
    /// epoch (UTC); `None`: now.
    pub now: Option<i64>,
}

impl ChatTemplateInputs {
    /// Inputs for `messages` (role and content pairs) with the generation prompt on.
    pub fn from_messages(messages: &[crate::message::Message]) -> ChatTemplateInputs {
        let messages = messages.iter().map(message_value).collect::<Vec<_>>();
        ChatTemplateInputs {
            messages: Value::from(messages),
            tools: None,
            add_generation_prompt: true,
            enable_thinking: true,
            extra: Vec::new(),
            now: None,
        }
    }
}

/// A message as the OpenAI API writes it (the fields llama.cpp hands templates): `role`,
/// `content`, and where present `tool_calls` (each `{id, type, function: {name, arguments}}`,
/// the arguments JSON text, which `prepare` parses for templates that read them as a
/// mapping), `tool_call_id` and `name`.
fn message_value(m: &crate::message::Message) -> Value {
    let mut pairs = vec![
        ("role", Value::from(m.role.as_str())),
        ("content", Value::from(m.content.as_str())),
    ];
    if !m.tool_calls.is_empty() {
        let calls = m.tool_calls.iter().map(|call| {
            let function = Value::from_pairs([
                ("name", Value::from(call.name.as_str())),
                ("arguments", Value::from(call.arguments.as_str())),
            ]);
            let mut fields = Vec::new();
            if let Some(id) = &call.id {
                fields.push(("id", Value::from(id.as_str())));
            }
            fields.push(("type", Value::from("function")));
            fields.push(("function", function));
            Value::from_pairs(fields)
        });
        pairs.push(("tool_calls", Value::from(calls.collect::<Vec<_>>())));
    }
    if let Some(id) = &m.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &m.name {
        pairs.push(("name", Value::from(name.as_str())));
    }
    Value::from_pairs(pairs)
}

/// Parses JSON text into a template value, keeping the order of object keys.
pub fn value_from_json(text: &str) -> Result<TemplateValue, ChatTemplateError> {
    serde_json::from_str(text).map_err(|e| ChatTemplateError::Json(e.to_string()))
}

/// A compiled chat template with the model's special token texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's text.
    source: String,
    bos_token: String,
    eos_token: String,
    caps: prepare::Caps,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the model's token texts.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = environment()?;
        env.add_template_owned(
            TEMPLATE_NAME,
            concat::rewrite_string_concat(&compat::rewrite_generation_tags(source)),
        )
        .map_err(|e| ChatTemplateError::Parse(describe(&e)))?;
        let mut template = ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            caps: prepare::Caps {
                system_role: true,
                object_arguments: false,
                keeps_developer: true,
                gemma4: false,
                gemma4_tool_responses: false,
            },
        };
        template.caps = prepare::probe(source, |messages, tools| {
            let mut inputs = ChatTemplateInputs::from_messages(&[]);
            inputs.messages = messages;
            inputs.tools = tools;
            inputs.now = Some(0);
            template.render_raw(&inputs).ok()
        });
        Ok(template)
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation to prompt text, after the changes llama.cpp makes to the
    /// messages for this template (a system message merged into the next where the template
    /// has no system role, `developer` as `system`, tool call arguments parsed from JSON text
    /// where the template reads them as a mapping, tool results moved into the model's turn
    /// for older Gemma 4 templates).
    pub fn render(&self, inputs: &ChatTemplateInputs) -> Result<String, ChatTemplateError> {
        let mut prepared = inputs.clone();
        prepared.messages = prepare::messages(&inputs.messages, self.caps);
        let mut prompt = self.render_raw(&prepared)?;
        // llama.cpp's Gemma 4 handler opens the model's turn where the template closed one
        // (after a model turn with tool calls) without opening the next.
        if self.caps.gemma4 && inputs.add_generation_prompt && prompt.ends_with("<turn|>\n") {
            prompt.push_str("<|turn>model\n");
        }
        Ok(prompt)
    }

    /// Renders the messages as they are.
    fn render_raw(&self, inputs: &ChatTemplateInputs) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Parse(describe(&e)))?;
        template
            .render(self.context(inputs))
            .map_err(|e| render_error(&e))
    }

    /// The variables llama.cpp's `common_chat_template_direct_apply` sets, in its order.
    fn context(&self, inputs: &ChatTemplateInputs) -> Value {
        let now = inputs.now.unwrap_or_else(unix_now);
        let mut vars: Vec<(String, Value)> = vec![
            ("messages".into(), inputs.messages.clone()),
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
            (
                "enable_thinking".into(),
                Value::from(inputs.enable_thinking),
            ),
        ];
        if let Some(tools) = &inputs.tools {
            vars.push(("tools".into(), tools.clone()));
        }
        vars.push(("datetime".into(), Value::from(strftime(now, "%b %d %Y"))));
        vars.push(("date_string".into(), Value::from(strftime(now, "%d %b %Y"))));
        vars.extend(reasoning_history(&inputs.extra));
        vars.extend(inputs.extra.iter().cloned());
        // llama.cpp sets the flag only when on: templates that test `is defined` see the same.
        if inputs.add_generation_prompt {
            vars.push(("add_generation_prompt".into(), Value::from(true)));
        }
        vars.push(("__rgml_now".into(), Value::from(now)));
        Value::from_pairs(vars)
    }
}

/// llama.cpp's `preserve_reasoning` template argument, `true` unless `extra` sets it (its tools
/// default it so), and when it is a boolean the four variables templates read it as
/// (`caps_apply_preserve_reasoning`: `preserve_thinking`, and `clear_thinking`,
/// `truncate_history_thinking` and `drop_thinking` its opposite). `extra`, set after, overrides
/// any of them.
fn reasoning_history(extra: &[(String, Value)]) -> Vec<(String, Value)> {
    let asked = extra.iter().rev().find(|(k, _)| k == "preserve_reasoning");
    let mut vars = Vec::new();
    let preserve = match asked {
        Some((_, v)) => v.clone(),
        None => {
            vars.push(("preserve_reasoning".into(), Value::from(true)));
            Value::from(true)
        }
    };
    if preserve.kind() == ValueKind::Bool {
        let on = preserve.is_true();
        vars.push(("preserve_thinking".into(), Value::from(on)));
        for name in [
            "clear_thinking",
            "truncate_history_thinking",
            "drop_thinking",
        ] {
            vars.push((name.into(), Value::from(!on)));
        }
    }
    vars
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// An environment configured like llama.cpp's Jinja engine.
fn environment() -> Result<Environment<'static>, ChatTemplateError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| ChatTemplateError::Parse(describe(&e)))?;
    env.set_syntax(syntax);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_function("namespace", compat::namespace);
    env.add_function(concat::CONCAT, concat::concat);
    env.add_filter("indent", compat::indent);
    Ok(env)
}

/// Prints values as Python's `str()` does where Jinja and minijinja differ.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut minijinja::State,
    value: &Value,
) -> Result<(), minijinja::Error> {
    let text = match value.kind() {
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        ValueKind::None => "None",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(minijinja::Error::from)
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

fn strftime_now(state: &minijinja::State, format: String) -> Result<Value, minijinja::Error> {
    let now = state
        .lookup("__rgml_now")
        .and_then(|v| v.as_i64())
        .unwrap_or_else(unix_now);
    Ok(Value::from(strftime(now, &format)))
}

/// The error's message with its source chain (minijinja puts the line in the source).
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn render_error(e: &minijinja::Error) -> ChatTemplateError {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(mj) = err.downcast_ref::<minijinja::Error>() {
            if let Some(message) = mj.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return ChatTemplateError::Raised(message.to_string());
            }
        }
        current = err.source();
    }
    ChatTemplateError::Render(describe(e))
}

/// `tojson` as llama.cpp has it: `json.dumps` with `ensure_ascii=False`, separators `", "` and
/// `": "` (`","` with an indent), keys in their order, no HTML escaping.
fn tojson(value: &Value, args: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<i64> = args.get("indent")?;
    let ensure_ascii: Option<bool> = args.get("ensure_ascii")?;
    let separators: Option<Value> = args.get("separators")?;
    let sort_keys: Option<bool> = args.get("sort_keys")?;
    args.assert_all_used()?;
    if sort_keys == Some(true) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "tojson sort_keys=true is not supported",
        ));
    }
    let indent = indent.map(|i| i.max(0) as usize);
    let mut style = json::Style {
        indent,
        item_sep: if indent.is_some() { "," } else { ", " }.to_string(),
        key_sep: ": ".to_string(),
    };
    if let Some(seps) = separators {
        if let Some(s) = seps
            .get_item_by_index(0)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
        {
            style.item_sep = s;
        }
        if let Some(s) = seps
            .get_item_by_index(1)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
        {
            style.key_sep = s;
        }
    }
    let mut text = json::to_json(value, &style)?;
    if ensure_ascii == Some(true) {
        text = json::ascii_escape(&text);
    }
    Ok(Value::from(text))
}

/// Formats `unix` seconds (UTC) with the C `strftime` conversions chat templates use.
pub(crate) fn strftime(unix: i64, format: &str) -> String {
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('j') => out.push_str(&format!("{:03}", day_of_year(year, month, day))),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Year, month (1-12) and day of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn day_of_year(year: i64, month: i64, day: i64) -> i64 {
    const CUMULATIVE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    CUMULATIVE[(month - 1) as usize] + day + i64::from(leap && month > 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &str) -> Result<String, ChatTemplateError> {
        let template = ChatTemplate::new(source, "<s>", "</s>")?;
        let mut inputs = ChatTemplateInputs::from_messages(&[]);
        inputs.messages = value_from_json(messages)?;
        inputs.now = Some(1_721_952_000); // 2024-07-26 00:00 UTC
        template.render(&inputs)
    }

    #[test]
    fn strftime_formats_a_known_date() {
        assert_eq!(strftime(1_721_952_000, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            strftime(1_721_952_000, "%A, %B %e %H:%M"),
            "Friday, July 26 00:00"
        );
        assert_eq!(strftime(951_782_400, "%Y-%m-%d %j"), "2000-02-29 060");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let out = render(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}",
            r#"[{"role": "user", "content": "é<&>\n", "n": [1, 2.5, true, null]}]"#,
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"é<&>\\n\", \"n\": [1, 2.5, true, null]}|{\n  \"role\": \"user\",\n  \"content\": \"é<&>\\n\",\n  \"n\": [\n    1,\n    2.5,\n    true,\n    null\n  ]\n}"
        );
    }

    #[test]
    fn raise_exception_names_the_message() {
        let err = render("{{ raise_exception('no system role') }}", "[]").unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::Raised(ref m) if m == "no system role"),
            "{err}"
        );
    }

    #[test]
    fn parse_errors_are_reported_not_panicked() {
        let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(err, ChatTemplateError::Parse(_)), "{err}");
    }

    #[test]
    fn python_methods_and_printing() {
        let out = render(
            "{% for k, v in messages[0].items() %}{{ k }}={{ v.strip().upper() }};{% endfor %}{{ true }}{{ none }}{{ 'a,b'.split(',') | length }}",
            r#"[{"role": " user ", "content": "hi"}]"#,
        )
        .unwrap();
        assert_eq!(out, "role=USER;content=HI;TrueNone2");
    }

    #[test]
    fn reasoning_history_defaults_to_preserved_and_follows_the_argument() {
        let source = "{{ preserve_reasoning }} {{ preserve_thinking }} {{ clear_thinking }} \
                      {{ truncate_history_thinking }} {{ drop_thinking }}";
        let template = ChatTemplate::new(source, "", "").unwrap();
        let mut inputs = ChatTemplateInputs::from_messages(&[]);
        assert_eq!(
            template.render(&inputs).unwrap(),
            "True True False False False"
        );
        inputs.extra = vec![("preserve_reasoning".into(), Value::from(false))];
        assert_eq!(
            template.render(&inputs).unwrap(),
            "False False True True True"
        );
        // A variable the request sets itself wins over the derived one.
        inputs
            .extra
            .push(("drop_thinking".into(), Value::from(false)));
        assert_eq!(
            template.render(&inputs).unwrap(),
            "False False True True False"
        );
    }

    /// A Gemma 4 template of the older kind (no `OpenAI Chat Completions` comment): tool
    /// results become the model turn's `tool_responses` with the reply after them, and the
    /// model's turn is opened where the template closed the last one without opening another.
    #[test]
    fn gemma4_tool_results_join_the_model_turn() {
        let source = "{% for m in messages %}<|turn>{{ m.role ~ '\\n' }}\
            {% for c in m.tool_calls or [] %}<|tool_call>call:{{ c.function.name }}{% endfor %}\
            {% for r in m.tool_responses or [] %}[{{ r.name }}={{ r.response.temp }}]{% endfor %}\
            {{ m.content ~ '<turn|>\\n' }}{% endfor %}\
            {% if add_generation_prompt and messages[-1].role != 'assistant' %}<|turn>model{% endif %}\
            {# '<|tool_call>call:' #}";
        let out = render(
            source,
            r#"[{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "dropped", "tool_calls": [{"type": "function",
                 "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
                {"role": "assistant", "content": "It is 21."}]"#,
        )
        .unwrap();
        assert_eq!(
            out,
            "<|turn>user\nWeather?<turn|>\n<|turn>assistant\n<|tool_call>call:get_weather\
             [get_weather=21]It is 21.<turn|>\n<|turn>model\n"
        );
    }
}
