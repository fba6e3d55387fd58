//! Request bodies of `/v1/chat/completions` and `/v1/completions`: JSON parsed and checked
//! here into a [`GenRequest`] plus how to answer (streamed or not, usage chunk or not).
//!
//! The body is parsed as a JSON value first (a syntax error is reported as such), then read
//! twice with serde: once for the fields both routes share ([`CommonFields`]), once for the
//! route's own fields. Type errors name the field at fault (`param`) through
//! `serde_path_to_error`. Ranges are checked here with the request's field names, before the
//! generator checks them again against the model.
//!
//! No field is silently ignored ([`check_fields`]): a field that would change the answer and
//! is not implemented (`functions`, `n_probs`, other samplers) is refused with a 400 that
//! names it; a field known to change nothing here (`user`, `metadata`, ...) is taken;
//! any other field is answered as if absent, with a line in the response's `warnings` (and in
//! the server's log).

use super::error::ApiError;
use super::HttpOptions;
use crate::generator::{GenRequest, OutputFormat, Prompt, SubmitError};
use rgml_llm::chat::{Message, ToolCall};
use rgml_llm::grammar::schema::{self, Framed};
use rgml_llm::grammar::{Grammar, GrammarError};
use rgml_llm::tool_calls::ToolCallFormat;
use rgml_llm::{SamplerParams, TokenId};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most stop strings a request may give (OpenAI allows 4; llama-server more).
const MAX_STOP: usize = 16;
/// Most alternatives reported per token (OpenAI's `top_logprobs` limit).
const MAX_LOGPROBS: u64 = 20;

/// A checked generation request and how to answer it.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) request: GenRequest,
    /// Answer with server-sent events.
    pub(crate) stream: bool,
    /// Streaming: send a last chunk with the token counts (`stream_options.include_usage`).
    pub(crate) include_usage: bool,
    /// The fields answered as if absent, one line each (the response's `warnings`).
    pub(crate) warnings: Vec<String>,
    /// What the request's tools ask of the answer (its calls are read out of the output
    /// unless [`ToolUse::None`]).
    pub(crate) tool_use: ToolUse,
    /// A thinking model's reasoning goes to `reasoning_content` (`reasoning_format` other
    /// than `none`; chat only).
    pub(crate) split_reasoning: bool,
    /// Choices to answer with (`n`), each generated on its own.
    pub(crate) n: usize,
    /// The schema of the one JSON document `response_format` or `json_schema` asks for (a
    /// chat's answer is then read as llama-server reads it: see `rgml_llm::json_answer`).
    pub(crate) answer_schema: Option<Value>,
}

/// What `tools` and `tool_choice` ask for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ToolUse {
    /// No tools, an empty list, or `tool_choice: "none"`.
    None,
    /// The model decides (`auto`).
    Auto,
    /// A call of one of the tools (`required`).
    Required(Vec<ForcedTool>),
    /// A call of the function named (one of the tools).
    Named(ForcedTool),
}

/// A tool a forced call may call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ForcedTool {
    pub(crate) name: String,
    /// The JSON schema of its arguments (`function.parameters`), if given.
    pub(crate) parameters: Option<Value>,
}

impl ToolUse {
    /// A call is forced: the tools it may call (one for a named function).
    pub(crate) fn forced(&self) -> Option<Vec<&ForcedTool>> {
        match self {
            ToolUse::Required(tools) => Some(tools.iter().collect()),
            ToolUse::Named(tool) => Some(vec![tool]),
            ToolUse::None | ToolUse::Auto => None,
        }
    }
}

/// The grammar of a forced call of one of `tools` in the model's own call frame (`format`):
/// the frame opening with the tool's name, arguments valid under the tool's `parameters`, the
/// frame's end. Parameters whose schema cannot be enforced (a keyword the converter refuses)
/// constrain the arguments to a JSON object only, with a warning naming the tool.
pub(crate) fn forced_call_grammar(
    format: ToolCallFormat,
    tools: &[&ForcedTool],
) -> Result<(Grammar, Vec<String>), ApiError> {
    let frames: Vec<(String, String)> = (tools.iter())
        .map(|t| format.forced_frame(&t.name))
        .collect();
    let framed: Vec<Framed<'_>> = (tools.iter().zip(&frames))
        .map(|(tool, (prefix, suffix))| Framed {
            prefix,
            schema: tool.parameters.as_ref(),
            suffix,
        })
        .collect();
    let (gbnf, refused) = schema::framed_to_gbnf(&framed).map_err(|e| grammar_error(e, "tools"))?;
    let warnings = (refused.iter())
        .map(|(i, e)| {
            format!(
                "tool `{}`: its parameters' {e}; its arguments are held to a JSON object only",
                tools[*i].name
            )
        })
        .collect();
    let grammar = Grammar::from_gbnf(&gbnf).map_err(|e| grammar_error(e, "tools"))?;
    Ok((grammar, warnings))
}

/// A chat answer that is one document of `schema`, for a model with `reasoning` (`None`: the
/// schema's own grammar, for a model whose reasoning syntax the frame does not cover, i.e.
/// gpt-oss's harmony channels): the grammars [`OutputFormat::JsonAnswer`] holds.
pub(crate) fn json_answer_format(
    schema: &Value,
    reasoning: Option<rgml_llm::reasoning::Syntax>,
) -> Result<OutputFormat, ApiError> {
    use rgml_llm::grammar::schema::{answer_to_gbnf, AnswerReasoning};
    use rgml_llm::reasoning::Syntax;
    let grammar = |mode: AnswerReasoning| -> Result<Arc<Grammar>, ApiError> {
        let compiled = answer_to_gbnf(schema, mode).and_then(|gbnf| Grammar::from_gbnf(&gbnf));
        Ok(Arc::new(
            compiled.map_err(|e| grammar_error(e, "response_format"))?,
        ))
    };
    Ok(match reasoning {
        None => {
            let only = grammar(AnswerReasoning::None)?;
            OutputFormat::JsonAnswer {
                fresh: only.clone(),
                open: only,
            }
        }
        Some(Syntax::Think) => OutputFormat::JsonAnswer {
            fresh: grammar(AnswerReasoning::May)?,
            open: grammar(AnswerReasoning::Open)?,
        },
        Some(Syntax::Harmony) => schema_format(schema, "response_format")?,
    })
}

/// `stop`: one string or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `seed`: OpenAI's is a signed 64-bit integer; llama.cpp's unsigned. Either is taken.
#[derive(Deserialize)]
#[serde(untagged)]
enum Seed {
    Unsigned(u64),
    Signed(i64),
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The fields both routes share.
#[derive(Deserialize)]
struct CommonFields {
    model: Option<String>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u64>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<u64>,
    seed: Option<Seed>,
    stop: Option<Stop>,
    n: Option<u64>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    logit_bias: Option<Value>,
    response_format: Option<Value>,
    /// llama-server's extensions: a GBNF grammar or a JSON schema the answer follows.
    grammar: Option<String>,
    json_schema: Option<Value>,
    /// llama-server's extension: never end at an end-of-generation token.
    ignore_eos: Option<bool>,
}

/// [`CommonFields`]' names.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "seed",
    "stop",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "response_format",
    "grammar",
    "json_schema",
    "ignore_eos",
];

/// [`ChatFields`]' names.
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "reasoning_format",
];

/// [`CompletionFields`]' names.
const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs", "echo"];

/// Fields that change nothing in an answer of this server: who asks (`user`, `metadata`),
/// OpenAI's storage and service tier, llama-server's prompt cache (prefixes are always
/// reused here), predicted outputs (a latency hint), and `parallel_tool_calls` (without
/// `tools`, which are refused).
const NO_EFFECT_FIELDS: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "cache_prompt",
    "prediction",
    "parallel_tool_calls",
];

/// Fields that would change the answer and are not implemented (in the route at hand: chat
/// takes `tools` and `tool_choice`): refused by name. `null` counts as absent; `tool_choice`
/// `"none"` or `"auto"` without tools asks for nothing and is taken.
const REFUSED_FIELDS: &[&str] = &[
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "n_predict",
    "n_probs",
    "suffix",
    "best_of",
    "modalities",
    "audio",
    "reasoning_effort",
    "reasoning_format",
    "chat_template_kwargs",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "typical_p",
    "typ_p",
    "dynatemp_range",
    "dynatemp_exponent",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "xtc_probability",
    "xtc_threshold",
    "top_n_sigma",
    "samplers",
];

/// `/v1/chat/completions`' own fields.
#[derive(Deserialize)]
struct ChatFields {
    messages: Vec<ChatMessage>,
    max_completion_tokens: Option<u64>,
    logprobs: Option<bool>,
    top_logprobs: Option<u64>,
    tools: Option<Vec<ToolDefinition>>,
    tool_choice: Option<Value>,
    reasoning_format: Option<String>,
}

/// A tool definition: checked for its shape, handed to the template as the client wrote it.
#[derive(Deserialize)]
struct ToolDefinition {
    #[serde(rename = "type")]
    kind: String,
    function: FunctionDefinition,
}

#[derive(Deserialize)]
struct FunctionDefinition {
    name: String,
    parameters: Option<Value>,
}

impl FunctionDefinition {
    fn forced(&self) -> ForcedTool {
        ForcedTool {
            name: self.name.clone(),
            parameters: self.parameters.clone().filter(|p| !p.is_null()),
        }
    }
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    /// Absent or `null` (an assistant turn that only called tools) reads as empty.
    content: Option<Content>,
    tool_calls: Option<Vec<RequestToolCall>>,
    tool_call_id: Option<String>,
    name: Option<String>,
}

/// A tool call of an earlier assistant turn.
#[derive(Deserialize)]
struct RequestToolCall {
    id: Option<String>,
    function: RequestFunction,
}

#[derive(Deserialize)]
struct RequestFunction {
    name: String,
    /// JSON text, as OpenAI sends it (an object is taken too).
    arguments: Value,
}

/// A message's content: text, or a list of parts of which only text is supported.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// `/v1/completions`' own fields.
#[derive(Deserialize)]
struct CompletionFields {
    prompt: CompletionPrompt,
    logprobs: Option<u64>,
    echo: Option<bool>,
}

/// `prompt`: text, token ids, or a list of (exactly one) text.
#[derive(Deserialize)]
#[serde(untagged)]
enum CompletionPrompt {
    Text(String),
    Tokens(Vec<TokenId>),
    Texts(Vec<String>),
}

/// A body as JSON and the fields both routes share, for this server's model.
/// A `/tokenize` body (llama-server's route): `content`, and how to tokenize it. Unknown fields
/// are refused (these routes have no `warnings` to list them in).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenizeRequest {
    pub(crate) content: String,
    #[serde(default)]
    pub(crate) add_special: bool,
    #[serde(default = "yes")]
    pub(crate) parse_special: bool,
    #[serde(default)]
    pub(crate) with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// A `/detokenize` body: token ids (unknown fields refused).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DetokenizeRequest {
    pub(crate) tokens: Vec<TokenId>,
}

/// What `/v1/embeddings` embeds: one text, several, one token list or several.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<TokenId>),
    TokenLists(Vec<Vec<TokenId>>),
}

/// A `/v1/embeddings` body (OpenAI's): the input, and how to encode the vectors.
#[derive(Deserialize)]
pub(crate) struct EmbeddingsRequest {
    pub(crate) input: EmbeddingInput,
    #[serde(default)]
    pub(crate) model: Option<String>,
    /// `float` (default) or `base64` (the f32 values' little-endian bytes).
    #[serde(default)]
    pub(crate) encoding_format: Option<String>,
}

/// A `/v1/embeddings` body for this server's model, with a warning per unknown field;
/// `dimensions` (a shortened vector) is refused by name.
pub(crate) fn parse_embeddings(
    body: &[u8],
    model_id: &str,
) -> Result<(EmbeddingsRequest, Vec<String>), ApiError> {
    let value = parse_value(body)?;
    if value.get("dimensions").is_some_and(|d| !d.is_null()) {
        return Err(ApiError::unsupported(
            "dimensions",
            "`dimensions` (vectors shortened to a size)",
        ));
    }
    // The generation routes' fields mean nothing here: anything but these is listed.
    let known = ["input", "model", "encoding_format", "dimensions"];
    let warnings = value
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
        .filter(|k| !known.contains(&k.as_str()) && !NO_EFFECT_FIELDS.contains(&k.as_str()))
        .map(|k| format!("unknown field `{k}` ignored"))
        .collect();
    let request: EmbeddingsRequest = read(&value)?;
    check_model(request.model.as_deref(), model_id)?;
    match request.encoding_format.as_deref() {
        None | Some("float") | Some("base64") => Ok((request, warnings)),
        Some(other) => Err(ApiError::bad_request(
            format!("encoding_format {other:?}: must be \"float\" or \"base64\""),
            Some("encoding_format"),
        )),
    }
}

/// A body of one of the token routes.
pub(crate) fn parse_token_route<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    read(&parse_value(body)?)
}

/// A body as JSON, the fields both routes share for this server's model, and the warnings
/// for its unknown fields (`route_fields`: the route's own).
fn parse_common(
    body: &[u8],
    model_id: &str,
    route_fields: &[&str],
) -> Result<(Value, CommonFields, Vec<String>), ApiError> {
    let value = parse_value(body)?;
    let warnings = check_fields(&value, route_fields)?;
    let common: CommonFields = read(&value)?;
    check_model(common.model.as_deref(), model_id)?;
    Ok((value, common, warnings))
}

/// Refuses the fields of [`REFUSED_FIELDS`] that ask for something; returns a warning for
/// each field neither read nor known to change nothing.
fn check_fields(value: &Value, route_fields: &[&str]) -> Result<Vec<String>, ApiError> {
    let Some(object) = value.as_object() else {
        return Ok(Vec::new());
    };
    let mut warnings = Vec::new();
    for (name, field) in object {
        let name = name.as_str();
        if REFUSED_FIELDS.contains(&name) && !route_fields.contains(&name) {
            if asks_for_something(name, field, object) {
                return Err(ApiError::unsupported(name, &format!("`{name}`")));
            }
        } else if !(COMMON_FIELDS.contains(&name)
            || route_fields.contains(&name)
            || NO_EFFECT_FIELDS.contains(&name))
        {
            warnings.push(format!("unknown field `{name}` ignored"));
        }
    }
    Ok(warnings)
}

/// Whether refused field `name` asks for anything (see [`REFUSED_FIELDS`]).
fn asks_for_something(name: &str, field: &Value, body: &serde_json::Map<String, Value>) -> bool {
    let no_tools = body
        .get("tools")
        .is_none_or(|t| t.is_null() || t.as_array().is_some_and(Vec::is_empty));
    match (name, field) {
        (_, Value::Null) => false,
        ("tools", Value::Array(list)) => !list.is_empty(),
        ("tool_choice", Value::String(choice)) => {
            !(no_tools && (choice == "none" || choice == "auto"))
        }
        _ => true,
    }
}

/// A `/v1/chat/completions` body.
pub(crate) fn parse_chat(
    body: &[u8],
    model_id: &str,
    options: &HttpOptions,
) -> Result<Parsed, ApiError> {
    let (value, common, warnings) = parse_common(body, model_id, CHAT_FIELDS)?;
    let chat: ChatFields = read(&value)?;
    let messages = chat_messages(chat.messages)?;
    let tool_use = chat_tools(chat.tools.as_deref(), chat.tool_choice.as_ref())?;
    let n_probs = chat_n_probs(chat.logprobs, chat.top_logprobs)?;
    let max_tokens = match chat.max_completion_tokens {
        Some(n) => Some(("max_completion_tokens", n)),
        None => common.max_tokens.map(|n| ("max_tokens", n)),
    };
    let split_reasoning = match chat.reasoning_format.as_deref() {
        None | Some("auto" | "deepseek") => true,
        Some("none") => false,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("reasoning_format `{other}`: expected auto, deepseek or none"),
                Some("reasoning_format"),
            ))
        }
    };
    let prompt = match tool_use {
        ToolUse::None => Prompt::Chat(messages),
        _ => Prompt::ChatWithTools {
            messages,
            tools: raw_tools(body)?,
        },
    };
    let parsed = finish(common, prompt, max_tokens, n_probs, options)?;
    if tool_use.forced().is_some() && parsed.request.format != OutputFormat::Text {
        return Err(ApiError::bad_request(
            "response_format and a forced tool call (tool_choice) cannot both shape the answer",
            Some("tool_choice"),
        ));
    }
    Ok(Parsed {
        warnings,
        split_reasoning,
        tool_use,
        ..parsed
    })
}

/// The body's `tools` as its JSON text: parsed into a `Value` its keys would be sorted, and
/// a template's `tojson` shows their order.
fn raw_tools(body: &[u8]) -> Result<String, ApiError> {
    #[derive(Deserialize)]
    struct Raw<'a> {
        #[serde(borrow)]
        tools: Option<&'a serde_json::value::RawValue>,
    }
    let raw: Raw<'_> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("tools: {e}"), Some("tools")))?;
    Ok(raw.tools.map(|t| t.get().to_string()).unwrap_or_default())
}

/// What `tools` and `tool_choice` ask for, checked (a named function must be one of the
/// tools; a forced call needs tools).
fn chat_tools(
    tools: Option<&[ToolDefinition]>,
    choice: Option<&Value>,
) -> Result<ToolUse, ApiError> {
    let tools = tools.unwrap_or_default();
    if let Some(i) = tools.iter().position(|t| t.kind != "function") {
        return Err(ApiError::bad_request(
            "only tools of type `function` are supported",
            Some(&format!("tools[{i}].type")),
        ));
    }
    if let Some(i) = tools.iter().position(|t| t.function.name.is_empty()) {
        return Err(ApiError::bad_request(
            "a function needs a name",
            Some(&format!("tools[{i}].function.name")),
        ));
    }
    let bad = |message: String| ApiError::bad_request(message, Some("tool_choice"));
    let tool_use = match choice {
        None | Some(Value::Null) => ToolUse::Auto,
        Some(Value::String(c)) if c == "auto" => ToolUse::Auto,
        Some(Value::String(c)) if c == "none" => return Ok(ToolUse::None),
        Some(Value::String(c)) if c == "required" => {
            ToolUse::Required(tools.iter().map(|t| t.function.forced()).collect())
        }
        Some(named @ Value::Object(_)) => {
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("tool_choice {named}: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")))?;
            match tools.iter().find(|t| t.function.name == name) {
                Some(tool) => ToolUse::Named(tool.function.forced()),
                None => {
                    return Err(bad(format!(
                        "tool_choice names `{name}`, which is not among the tools"
                    )))
                }
            }
        }
        Some(other) => {
            return Err(bad(format!(
                "tool_choice {other}: expected \"auto\", \"none\", \"required\" or a named function"
            )))
        }
    };
    match (tools.is_empty(), tool_use.forced()) {
        (true, Some(_)) => Err(bad("a forced tool call needs `tools`".into())),
        (true, None) => Ok(ToolUse::None),
        (false, _) => Ok(tool_use),
    }
}

/// A `/v1/completions` body.
pub(crate) fn parse_completion(
    body: &[u8],
    model_id: &str,
    options: &HttpOptions,
) -> Result<Parsed, ApiError> {
    let (value, common, warnings) = parse_common(body, model_id, COMPLETION_FIELDS)?;
    let fields: CompletionFields = read(&value)?;
    if fields.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "echo"));
    }
    let prompt = completion_prompt(fields.prompt)?;
    let n_probs = match fields.logprobs {
        Some(n) if n > MAX_LOGPROBS => Err(ApiError::bad_request(
            format!("logprobs = {n}: must be at most {MAX_LOGPROBS}"),
            Some("logprobs"),
        )),
        other => other.map(to_usize).transpose(),
    }?;
    let max_tokens = common.max_tokens.map(|n| ("max_tokens", n));
    let parsed = finish(common, prompt, max_tokens, n_probs, options)?;
    Ok(Parsed { warnings, ..parsed })
}

/// The JSON object of the body (a syntax error is the client's, 400). Anything but an
/// object is refused here: serde would read a struct out of an array too.
fn parse_value(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object",
            None,
        ));
    }
    Ok(value)
}

/// Reads `T` out of `value`, naming the field at fault when a type is wrong.
fn read<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // The root's path is "."; a missing field is reported at its parent, and named in
        // the message as "missing field `name`".
        let param = match (path.as_str(), missing_field(&inner)) {
            (".", Some(field)) => Some(field.to_owned()),
            (".", None) => None,
            (parent, Some(field)) => Some(format!("{parent}.{field}")),
            (field, None) => Some(field.to_owned()),
        };
        let message = match &param {
            Some(param) => format!("{param}: {inner}"),
            None => inner,
        };
        ApiError::bad_request(message, param.as_deref())
    })
}

/// The field a serde "missing field `x`" message names.
fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split('`').next()
}

/// A `model` other than the one served is an error; absent (or empty) means this one.
fn check_model(model: Option<&str>, model_id: &str) -> Result<(), ApiError> {
    match model {
        Some(model) if !model.is_empty() && model != model_id => {
            Err(ApiError::model_not_found(model))
        }
        _ => Ok(()),
    }
}

fn chat_messages(messages: Vec<ChatMessage>) -> Result<Vec<Message>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            let role = chat_role(&message.role)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        format!(
                            "unknown role `{}`: must be system, developer, user, assistant or tool",
                            message.role
                        ),
                        Some(&format!("messages[{i}].role")),
                    )
                })?
                .to_owned();
            // Only an assistant's turn may come without content (OpenAI's tool calls).
            if message.content.is_none() && role != "assistant" {
                return Err(ApiError::bad_request(
                    format!("a {role} message needs `content`"),
                    Some(&format!("messages[{i}].content")),
                ));
            }
            let content = content_text(message.content, i)?;
            let tool_calls = message
                .tool_calls
                .unwrap_or_default()
                .into_iter()
                .map(|call| ToolCall {
                    id: call.id,
                    name: call.function.name,
                    arguments: match call.function.arguments {
                        Value::String(text) => text,
                        other => other.to_string(),
                    },
                })
                .collect();
            Ok(Message {
                role,
                content,
                tool_calls,
                tool_call_id: message.tool_call_id,
                name: message.name,
            })
        })
        .collect()
}

/// The chat template's role for a request's role (`developer` is OpenAI's new `system`).
fn chat_role(role: &str) -> Option<&'static str> {
    match role {
        "system" | "developer" => Some("system"),
        "user" => Some("user"),
        "assistant" => Some("assistant"),
        "tool" => Some("tool"),
        _ => None,
    }
}

/// A message's text: the string, or its text parts joined.
fn content_text(content: Option<Content>, index: usize) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(text)) => Ok(text),
        Some(Content::Parts(parts)) => parts
            .into_iter()
            .map(|part| match (part.kind.as_str(), part.text) {
                ("text", Some(text)) => Ok(text),
                ("text", None) => Err(ApiError::bad_request(
                    "a text part needs `text`",
                    Some(&format!("messages[{index}].content")),
                )),
                (kind, _) => Err(ApiError::bad_request(
                    format!("content parts of type `{kind}` are not supported (only `text`)"),
                    Some(&format!("messages[{index}].content")),
                )),
            })
            .collect(),
    }
}

/// Chat's `logprobs` (a flag) and `top_logprobs` (how many alternatives) as `n_probs`.
fn chat_n_probs(logprobs: Option<bool>, top: Option<u64>) -> Result<Option<usize>, ApiError> {
    let logprobs = logprobs.unwrap_or(false);
    match top {
        Some(n) if n > MAX_LOGPROBS => Err(ApiError::bad_request(
            format!("top_logprobs = {n}: must be at most {MAX_LOGPROBS}"),
            Some("top_logprobs"),
        )),
        Some(_) if !logprobs => Err(ApiError::bad_request(
            "top_logprobs needs logprobs: true",
            Some("top_logprobs"),
        )),
        _ if !logprobs => Ok(None),
        top => to_usize(top.unwrap_or(0)).map(Some),
    }
}

fn completion_prompt(prompt: CompletionPrompt) -> Result<Prompt, ApiError> {
    match prompt {
        CompletionPrompt::Text(text) => Ok(Prompt::Text(text)),
        CompletionPrompt::Tokens(tokens) if tokens.is_empty() => {
            Err(ApiError::bad_request("the prompt is empty", Some("prompt")))
        }
        CompletionPrompt::Tokens(tokens) => Ok(Prompt::Tokens(tokens)),
        CompletionPrompt::Texts(mut texts) if texts.len() == 1 => {
            Ok(Prompt::Text(texts.swap_remove(0)))
        }
        CompletionPrompt::Texts(_) => Err(ApiError::bad_request(
            "only one prompt per request is supported",
            Some("prompt"),
        )),
    }
}

/// The checks and settings both routes share, and the request.
fn finish(
    common: CommonFields,
    prompt: Prompt,
    max_tokens: Option<(&'static str, u64)>,
    n_probs: Option<usize>,
    options: &HttpOptions,
) -> Result<Parsed, ApiError> {
    let n = choices(&common)?;
    let max_tokens = match max_tokens {
        Some((field, 0)) => Err(ApiError::bad_request(
            format!("{field} must be at least 1"),
            Some(field),
        )),
        Some((_, n)) => to_usize(n).map(Some),
        None => Ok(options.max_tokens_default),
    }?;
    let sampling = sampling(&common)?;
    let (format, answer_schema) = output_format(&common)?;
    let ignore_eos = common.ignore_eos.unwrap_or(false);
    let stop = stop_strings(common.stop)?;
    let include_usage = common
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok(Parsed {
        request: GenRequest {
            prompt,
            sampling,
            max_tokens,
            stop,
            n_probs,
            ignore_eos,
            format,
        },
        stream: common.stream.unwrap_or(false),
        include_usage,
        warnings: Vec::new(),
        split_reasoning: false,
        tool_use: ToolUse::None,
        n,
        answer_schema,
    })
}

/// What the answer must be: `response_format` (`text`, `json_object`, `json_schema`, and
/// llama-server's `json_object` with a `schema`), llama-server's `grammar` (GBNF) or its
/// `json_schema`; at most one of them. With the format, the schema of the JSON document it
/// asks for (not for a `grammar`). A grammar or schema that cannot be compiled is the client's
/// error (400), named.
fn output_format(common: &CommonFields) -> Result<(OutputFormat, Option<Value>), ApiError> {
    let mut given: Vec<(&str, OutputFormat, Option<Value>)> = Vec::new();
    if let Some((schema, param)) = response_format(common.response_format.as_ref())? {
        let format = match schema == any_object() {
            true => OutputFormat::JsonObject,
            false => schema_format(&schema, param)?,
        };
        given.push(("response_format", format, Some(schema)));
    }
    if let Some(gbnf) = &common.grammar {
        let grammar = Grammar::from_gbnf(gbnf).map_err(|e| grammar_error(e, "grammar"))?;
        given.push(("grammar", OutputFormat::Grammar(Arc::new(grammar)), None));
    }
    if let Some(schema) = common.json_schema.as_ref().filter(|s| !s.is_null()) {
        let schema = or_any_object(schema);
        let format = schema_format(&schema, "json_schema")?;
        given.push(("json_schema", format, Some(schema)));
    }
    match given.len() {
        0 => Ok((OutputFormat::Text, None)),
        1 => {
            let (_, format, schema) = given.remove(0);
            Ok((format, schema))
        }
        _ => {
            let names: Vec<&str> = given.iter().map(|g| g.0).collect();
            Err(ApiError::bad_request(
                format!("{} each shape the answer: give one", names.join(" and ")),
                Some(names[1]),
            ))
        }
    }
}

/// The document schema of a `response_format` and the parameter it is in (`None`: text).
fn response_format(value: Option<&Value>) -> Result<Option<(Value, &'static str)>, ApiError> {
    let kind = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v.get("type").and_then(Value::as_str),
    };
    let format = value.unwrap_or(&Value::Null);
    let given = |spec: &Value| {
        spec.get("schema")
            .filter(|s| !s.is_null())
            .map(or_any_object)
    };
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => {
            let schema = given(format).unwrap_or_else(any_object);
            Ok(Some((schema, "response_format.schema")))
        }
        Some("json_schema") => {
            let spec = format
                .get("json_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "response_format `json_schema` needs a `json_schema` object",
                        Some("response_format.json_schema"),
                    )
                })?;
            let schema = given(spec).unwrap_or_else(any_object);
            Ok(Some((schema, "response_format.json_schema.schema")))
        }
        _ => Err(ApiError::bad_request(
            "response_format needs a `type`: text, json_object or json_schema",
            Some("response_format"),
        )),
    }
}

/// As llama-server: an absent or empty schema means any object.
fn any_object() -> Value {
    serde_json::json!({"type": "object"})
}

fn or_any_object(schema: &Value) -> Value {
    match schema.as_object() {
        Some(obj) if obj.is_empty() => any_object(),
        _ => schema.clone(),
    }
}

/// The grammar of the documents `schema` validates.
fn schema_format(schema: &Value, param: &str) -> Result<OutputFormat, ApiError> {
    let grammar = Grammar::from_json_schema(schema).map_err(|e| grammar_error(e, param))?;
    Ok(OutputFormat::Grammar(Arc::new(grammar)))
}

fn grammar_error(e: GrammarError, param: &str) -> ApiError {
    ApiError::bad_request(format!("{param}: {e}"), Some(param))
}

/// The most choices one request may ask for.
pub(crate) const MAX_CHOICES: u64 = 16;

/// `n`: how many choices, 1 to [`MAX_CHOICES`].
fn choices(common: &CommonFields) -> Result<usize, ApiError> {
    match common.n.unwrap_or(1) {
        0 => Err(ApiError::bad_request("n must be at least 1", Some("n"))),
        n if n > MAX_CHOICES => Err(ApiError::bad_request(
            format!("n = {n}: at most {MAX_CHOICES} choices per request"),
            Some("n"),
        )),
        n => to_usize(n),
    }
}

/// `logit_bias` as OpenAI writes it (`{"15043": -100}`: token ids as keys) or as llama-server
/// also takes it (`[[15043, -100], ...]`); a bias of `false` bans the token (`-inf`). Keys or
/// tokens given as text are refused (they would need the tokenizer here); ids are checked
/// against the vocabulary when the request is submitted.
fn logit_bias(value: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("logit_bias: {why}"), Some("logit_bias"));
    let bias = |v: &Value| match v {
        Value::Bool(false) => Ok(f32::NEG_INFINITY),
        Value::Number(n) => n
            .as_f64()
            .map(|b| b as f32)
            .filter(|b| b.is_finite())
            .ok_or_else(|| bad(format!("bias {n} is out of range"))),
        other => Err(bad(format!(
            "a bias must be a number or false, not {other}"
        ))),
    };
    let id = |text: &str| {
        text.trim().parse::<u32>().map_err(|_| {
            bad(format!(
                "`{text}` is not a token id (token text is not supported)"
            ))
        })
    };
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map.iter().map(|(k, v)| Ok((id(k)?, bias(v)?))).collect(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([Value::Number(t), b]) => {
                    let t = t.as_u64().and_then(|t| u32::try_from(t).ok());
                    Ok((
                        t.ok_or_else(|| bad(format!("{pair} has no token id")))?,
                        bias(b)?,
                    ))
                }
                _ => Err(bad(format!("{pair} is not a [token id, bias] pair"))),
            })
            .collect(),
        Some(other) => Err(bad(format!(
            "expected an object or a list of pairs, not {other}"
        ))),
    }
}

fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stop = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(list)) => list,
    };
    if stop.len() > MAX_STOP {
        return Err(ApiError::bad_request(
            format!("at most {MAX_STOP} stop strings"),
            Some("stop"),
        ));
    }
    // An empty stop string would end every generation at once; llama-server ignores them.
    Ok(stop.into_iter().filter(|s| !s.is_empty()).collect())
}

/// The sampler's settings: the request's, llama.cpp's defaults for absent ones.
fn sampling(common: &CommonFields) -> Result<SamplerParams, ApiError> {
    let defaults = SamplerParams::default();
    let params = SamplerParams {
        temp: common.temperature.unwrap_or(defaults.temp),
        top_k: common
            .top_k
            .map(to_usize)
            .transpose()?
            .unwrap_or(defaults.top_k),
        top_p: common.top_p.unwrap_or(defaults.top_p),
        min_p: common.min_p.unwrap_or(defaults.min_p),
        repeat_penalty: common.repeat_penalty.unwrap_or(defaults.repeat_penalty),
        repeat_last_n: common
            .repeat_last_n
            .map(to_usize)
            .transpose()?
            .unwrap_or(defaults.repeat_last_n),
        frequency_penalty: common
            .frequency_penalty
            .unwrap_or(defaults.frequency_penalty),
        presence_penalty: common.presence_penalty.unwrap_or(defaults.presence_penalty),
        logit_bias: logit_bias(common.logit_bias.as_ref())?,
        seed: match common.seed {
            Some(Seed::Unsigned(seed)) => seed,
            // The bits of a negative seed are as good a seed as any.
            Some(Seed::Signed(seed)) => seed as u64,
            None => random_seed(),
        },
    };
    check_ranges(&params)?;
    Ok(params)
}

/// The sampler's own range checks, named by the request's fields.
fn check_ranges(p: &SamplerParams) -> Result<(), ApiError> {
    SubmitError::check_sampling(p).map_err(|e| ApiError::from_submit(&e, "prompt"))
}

fn to_usize(n: u64) -> Result<usize, ApiError> {
    usize::try_from(n).map_err(|_| ApiError::bad_request(format!("{n} is too large"), None))
}

/// A seed for a request that gave none: the clock's nanoseconds and a counter, mixed
/// (SplitMix64's finalizer) so that requests in the same nanosecond still differ.
fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    splitmix64(nanos ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// SplitMix64's output function: a bijection that spreads every input bit over the output.
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
