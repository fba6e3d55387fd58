//! The route table and its handlers, the JSON fallbacks for unknown routes and methods,
//! and CORS.

use super::error::{ApiError, ErrorKind};
use super::listener::{Activity, Connections};
use super::request::{
    forced_call_grammar, json_answer_format, parse_chat, parse_completion, ToolUse,
};
use super::response::{collect, unix_now, whole, Meta, Route, NO_RESULT};
use super::{metrics, stream, tokens, HttpOptions, ShutdownFlag};
use crate::generator::{GenRequest, Generator, OutputFormat, Submission};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The chat page.
const INDEX_HTML: &str = include_str!("../page/index.html");

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AppState {
    generator: Arc<dyn Generator>,
    options: Arc<HttpOptions>,
    pub(crate) shutting_down: ShutdownFlag,
    connections: Option<Connections>,
    /// When this server started (the model's `created`).
    started: u64,
}

impl AppState {
    pub(crate) fn new(
        generator: Arc<dyn Generator>,
        options: &HttpOptions,
        connections: Option<Connections>,
    ) -> AppState {
        AppState {
            generator,
            options: Arc::new(options.clone()),
            shutting_down: ShutdownFlag::default(),
            connections,
            started: unix_now(),
        }
    }
}

/// The router over `state`.
pub(crate) fn build(state: AppState) -> Router {
    let body_limit = state.options.max_body_bytes;
    Router::new()
        .route("/", get(index))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(models))
        // Model ids may hold slashes (`org/name`).
        .route("/v1/models/{*id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/props", get(props))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn(mark_activity))
        .layer(middleware::from_fn_with_state(
            state.options.api_key.clone(),
            require_key,
        ))
        .layer(middleware::from_fn_with_state(
            state.options.cors_origins.clone().map(Arc::new),
            cors,
        ))
        .with_state(state)
}

/// Marks the connection busy from the request until its response body is sent or dropped, so
/// that its read timeout does not run meanwhile (see [`super::listener`]).
async fn mark_activity(request: Request, next: Next) -> Response {
    let guard = (request.extensions())
        .get::<ConnectInfo<Activity>>()
        .map(|info| info.0.begin());
    let response = next.run(request).await;
    match guard {
        None => response,
        Some(guard) => response.map(|body| {
            let body = body.map_frame(move |frame| {
                let _in_progress = &guard;
                frame
            });
            axum::body::Body::new(body)
        }),
    }
}

async fn chat_completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(&state, body, Route::Chat).await
}

async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(&state, body, Route::Completion).await
}

/// What a route answered at once (no generation) computes from the body.
type Answer = fn(&dyn Generator, &[u8], &HttpOptions) -> Result<serde_json::Value, ApiError>;

/// A route answered from the body at once: `handler`'s JSON, or its error.
fn answer(state: &AppState, body: Result<Bytes, BytesRejection>, handler: Answer) -> Response {
    let result = body
        .map_err(|rejection| body_error(&rejection, state.options.max_body_bytes))
        .and_then(|body| handler(state.generator.as_ref(), &body, &state.options));
    match result {
        Ok(value) => Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `/v1/embeddings`: computed on a blocking thread (a long input takes a while).
async fn embeddings(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let computed =
        tokio::task::spawn_blocking(move || answer(&state, body, super::embeddings::embeddings))
            .await;
    computed.unwrap_or_else(|_| ApiError::server("computing the embeddings failed").into_response())
}

async fn tokenize(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(&state, body, tokens::tokenize)
}

async fn detokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(&state, body, tokens::detokenize)
}

async fn apply_template(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(&state, body, tokens::apply_template)
}

/// Either generation route: parse, submit, answer whole or streamed. The body is taken as
/// bytes whatever its `Content-Type` (curl users forget it) and parsed here, so that every
/// error is OpenAI's JSON rather than axum's plain-text rejection.
async fn generate(state: &AppState, body: Result<Bytes, BytesRejection>, route: Route) -> Response {
    match try_generate(state, body, route).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn try_generate(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    route: Route,
) -> Result<Response, ApiError> {
    let body = body.map_err(|rejection| body_error(&rejection, state.options.max_body_bytes))?;
    let model_id = state.generator.model_id();
    let mut parsed = match route {
        Route::Chat => parse_chat(&body, model_id, &state.options),
        Route::Completion => parse_completion(&body, model_id, &state.options),
    }?;
    let mut meta = Meta::new(route, model_id, parsed.request.n_probs.is_some());
    if parsed.tool_use != ToolUse::None {
        let format = state.generator.tool_call_format().ok_or_else(|| {
            ApiError::bad_request(
                "this model's chat template shows no tool-call format rgml reads (Hermes \
                 <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS], gpt-oss harmony); serve it \
                 without --no-jinja, or give such a template with --chat-template-file",
                Some("tools"),
            )
        })?;
        meta.tool_format = Some(format);
        if let Some(tools) = parsed.tool_use.forced() {
            // The call is sampled inside the model's own call frame, with a tool's name and
            // arguments its parameters' schema allows (see `forced_call_grammar`).
            let (grammar, warnings) = forced_call_grammar(format, &tools)?;
            parsed.warnings.extend(warnings);
            parsed.request.format = OutputFormat::Grammar(Arc::new(grammar));
        }
    }
    if let (Route::Chat, Some(schema)) = (route, &parsed.answer_schema) {
        // As llama-server's chat parser: after the model's reasoning, the document alone or in
        // a ```json fence; the content is the document, and no tool calls are read from it.
        let syntax = state.generator.reasoning_syntax();
        parsed.request.format = json_answer_format(schema, syntax)?;
        meta.json_answer = !matches!(parsed.request.format, OutputFormat::Grammar(_));
        if meta.json_answer {
            meta.tool_format = None;
        }
    }
    if state.options.log_warnings {
        for warning in &parsed.warnings {
            eprintln!("rgml serve: {}: {warning}", meta.id);
        }
    }
    meta.warnings = parsed.warnings;
    let submissions = submit_choices(state, parsed.request, parsed.n, route)?;
    if let Some(syntax) = state.generator.reasoning_syntax() {
        if parsed.split_reasoning {
            let open = submissions.first().is_some_and(|s| s.reasoning_open);
            meta.reasoning = Some((syntax, open));
        }
    }
    if parsed.stream {
        let mut submissions = submissions;
        if submissions.len() > 1 {
            let events = stream::sse_choices(meta, submissions, parsed.include_usage);
            return Ok(events.into_response());
        }
        if let Some(submission) = submissions.pop() {
            return Ok(stream::sse(meta, submission, parsed.include_usage).into_response());
        }
        return Err(ApiError::server(NO_RESULT));
    }
    let mut answers = Vec::with_capacity(parsed.n);
    for submission in submissions {
        answers.push(collect(submission).await?);
    }
    Ok(Json(whole(&meta, answers)?).into_response())
}

/// The `n` choices of `request`, submitted together so that they run in parallel slots; each
/// after the first samples with the next seed (the same seed would give the same answer).
/// A refusal of any drops (and so cancels) those already submitted.
fn submit_choices(
    state: &AppState,
    request: GenRequest,
    n: usize,
    route: Route,
) -> Result<Vec<Submission>, ApiError> {
    let mut submissions = Vec::with_capacity(n);
    for i in 0..n {
        let mut choice = request.clone();
        choice.sampling.seed = request.sampling.seed.wrapping_add(i as u64);
        let submission = state
            .generator
            .submit(choice)
            .map_err(|e| ApiError::from_submit(&e, route.prompt_param()))?;
        submissions.push(submission);
    }
    Ok(submissions)
}

/// A body that could not be read: too large (413) or broken off.
fn body_error(rejection: &BytesRejection, limit: usize) -> ApiError {
    let status = rejection.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::client(status, format!("the body is larger than {limit} bytes"))
    } else {
        ApiError::client(status, rejection.body_text())
    }
}

async fn index() -> Html<&'static str> {
    Html(INDEX_HTML)
}

async fn health(State(state): State<AppState>) -> Response {
    if state.shutting_down.load(Ordering::Acquire) {
        let body = Json(json!({"status": "shutting down"}));
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    } else if !state.generator.healthy() {
        let body = Json(json!({"status": "error"}));
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    let open = state.connections.as_ref().map(Connections::open);
    let text = metrics::render(&state.generator.stats(), open);
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response()
}

fn model_object(state: &AppState) -> serde_json::Value {
    json!({
        "id": state.generator.model_id(),
        "object": "model",
        "created": state.started,
        "owned_by": "rgml",
    })
}

/// llama-server's `/props`, with what this server can say truly: the sampling defaults a
/// request gets, a slot's context, the slots, the model's name and rgml's version.
async fn props(State(state): State<AppState>) -> Json<serde_json::Value> {
    let d = rgml_llm::SamplerParams::default();
    let generator = &state.generator;
    Json(json!({
        "default_generation_settings": {
            "n_ctx": generator.n_ctx(),
            "params": {
                "temperature": d.temp,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty,
                "repeat_last_n": d.repeat_last_n,
                "frequency_penalty": d.frequency_penalty,
                "presence_penalty": d.presence_penalty,
                "n_predict": state.options.max_tokens_default.map_or(-1, |n| n as i64),
            },
        },
        "total_slots": generator.stats().n_slots,
        "model_alias": generator.model_id(),
        "model_path": state.options.model_path,
        "build_info": concat!("rgml ", env!("CARGO_PKG_VERSION")),
        "chat_template": generator.chat_template(),
    }))
}

async fn models(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [model_object(&state)]}))
}

async fn model(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    if id == state.generator.model_id() {
        Json(model_object(&state)).into_response()
    } else {
        ApiError::model_not_found(&id).into_response()
    }
}

async fn not_found(request: Request) -> ApiError {
    let message = format!("no route {} {}", request.method(), request.uri().path());
    ApiError::client(StatusCode::NOT_FOUND, message)
}

async fn method_not_allowed(request: Request) -> ApiError {
    let message = format!(
        "method {} is not allowed on {}",
        request.method(),
        request.uri().path()
    );
    ApiError::client(StatusCode::METHOD_NOT_ALLOWED, message)
}

/// With an API key: requests other than `GET /health`, the chat page and CORS preflights
/// without `Authorization: Bearer KEY` get a 401. The key is compared in time that does not
/// depend on where it differs.
async fn require_key(State(key): State<Option<String>>, request: Request, next: Next) -> Response {
    let open = request.method() == Method::OPTIONS
        || (request.method() == Method::GET && matches!(request.uri().path(), "/health" | "/"));
    let Some(key) = key.filter(|_| !open) else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if same_key(given.as_bytes(), key.as_bytes()) {
        return next.run(request).await;
    }
    ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: ErrorKind::Authentication,
        message: "Invalid API Key".into(),
        param: None,
        code: Some("invalid_api_key"),
    }
    .into_response()
}

/// `a == b`, looking at every byte of both whatever they hold.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let diff = (0..n).fold(a.len() ^ b.len(), |acc, i| {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        acc | usize::from(x ^ y)
    });
    diff == 0
}

/// CORS for browser clients on other origins: any origin may call (no credentials are
/// involved), or those of `--cors-origins` only, and preflight `OPTIONS` requests are
/// answered here, before routing. A request from another origin is still answered (CORS is
/// the browser's check), without the header that lets a browser page read the answer.
async fn cors(
    State(origins): State<Option<Arc<Vec<String>>>>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = match &origins {
        None => Some(HeaderValue::from_static("*")),
        Some(list) => request
            .headers()
            .get(header::ORIGIN)
            .filter(|o| o.to_str().is_ok_and(|o| list.iter().any(|a| a == o)))
            .cloned(),
    };
    let mut response = if request.method() == Method::OPTIONS {
        preflight(&request)
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    if let Some(origin) = allowed {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    }
    if origins.is_some() {
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

fn preflight(request: &Request) -> Response {
    // `*` does not cover `Authorization`, so the headers asked for are allowed by name.
    let allow_headers = request
        .headers()
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
    (
        StatusCode::NO_CONTENT,
        [
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            ),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers),
            (
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("86400"),
            ),
        ],
    )
        .into_response()
}
