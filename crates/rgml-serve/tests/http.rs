//! The HTTP layer over a scripted generator, through real TCP connections: response shapes
//! (whole and streamed), errors as OpenAI JSON, limits, cancellation when a client goes
//! away, and graceful shutdown.
//!
//! The fake generator echoes the prompt's words back as tokens, a few milliseconds apart.
//! Words steer it: `forever` generates until cancelled or shut down, `fail` fails after one
//! token, `<hidden>` is a token with no text (held back, as a partial stop string would be).

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rgml_llm::chat::Message;
use rgml_llm::grammar::schema::{answer_to_gbnf, AnswerReasoning};
use rgml_llm::reasoning::Syntax;
use rgml_llm::tool_calls::ToolCallFormat;
use rgml_llm::{EncodeOptions, Tokenizer};
use rgml_serve::generator::{FinishReason, Logprobs, OutputFormat, TokenLogprob, TokenOut, Usage};
use rgml_serve::http::{router, serve, HttpOptions};
use rgml_serve::{GenEvent, GenRequest, Generator, Prompt, Stats, Submission, SubmitError};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const MODEL: &str = "fake-model";
/// What the fake reports as its chat template (it renders `role: content` lines).
const FAKE_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
const TOKEN_DELAY: Duration = Duration::from_millis(5);

/// What the fake's generation tasks share with the test.
#[derive(Default)]
struct Shared {
    /// Requests that saw their cancellation flag.
    cancelled: AtomicUsize,
    shutting_down: AtomicBool,
    /// The generator failed for good (`/health` says so).
    broken: AtomicBool,
}

/// A scripted [`Generator`].
#[derive(Default)]
struct Fake {
    shared: Arc<Shared>,
    /// Every request submitted, as the HTTP layer built it.
    submitted: Mutex<Vec<GenRequest>>,
    /// Refuse every request with this.
    refuse: Mutex<Option<SubmitError>>,
    /// A gpt-oss model (harmony's channels and calls), else a Qwen-style one (`<think>`,
    /// Hermes calls).
    harmony: bool,
}

impl Fake {
    fn cancelled(&self) -> usize {
        self.shared.cancelled.load(Ordering::SeqCst)
    }

    fn last_request(&self) -> GenRequest {
        let submitted = self.submitted.lock().unwrap();
        submitted.last().cloned().expect("a request was submitted")
    }
}

/// The stats `/metrics` must show.
const STATS: Stats = Stats {
    n_slots: 4,
    slots_busy: 3,
    queue_len: 2,
    requests_total: 17,
    requests_finished: 11,
    requests_cancelled: 5,
    prompt_tokens_total: 1234,
    generated_tokens_total: 5678,
    prompt_seconds_total: 1.5,
    generation_seconds_total: 2.25,
    generated_tokens_per_second: 42.5,
};

impl Generator for Fake {
    fn model_id(&self) -> &str {
        MODEL
    }

    fn n_ctx(&self) -> usize {
        4096
    }

    fn submit(&self, request: GenRequest) -> Result<Submission, SubmitError> {
        if let Some(error) = self.refuse.lock().unwrap().clone() {
            return Err(error);
        }
        if self.shared.shutting_down.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        self.submitted.lock().unwrap().push(request.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancelled = Arc::new(AtomicBool::new(false));
        let words = prompt_words(&request.prompt);
        let prompt_tokens = words.len();
        let run = Run {
            words,
            request,
            tx,
            cancelled: cancelled.clone(),
            shared: self.shared.clone(),
        };
        tokio::spawn(run.generate());
        Ok(Submission::new(
            rx,
            prompt_tokens,
            cancelled,
            Box::new(|| {}),
        ))
    }

    fn stats(&self) -> Stats {
        STATS
    }

    fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
    }

    fn healthy(&self) -> bool {
        !self.shared.broken.load(Ordering::SeqCst)
    }

    fn tool_call_format(&self) -> Option<ToolCallFormat> {
        Some(match self.harmony {
            true => ToolCallFormat::Harmony,
            false => ToolCallFormat::Hermes,
        })
    }

    fn reasoning_syntax(&self) -> Option<Syntax> {
        Some(match self.harmony {
            true => Syntax::Harmony,
            false => Syntax::Think,
        })
    }

    fn tokenizer(&self) -> Option<&Tokenizer> {
        Some(&demo_model().tokenizer)
    }

    /// `[number of tokens, first token, 1]` per input: what the route sent shows in it.
    fn embed(&self, inputs: &[Vec<u32>]) -> Option<Result<Vec<Vec<f32>>, SubmitError>> {
        if let Some(error) = self.refuse.lock().unwrap().clone() {
            return Some(Err(error));
        }
        let vectors = inputs
            .iter()
            .map(|t| vec![t.len() as f32, t[0] as f32, 1.0])
            .collect();
        Some(Ok(vectors))
    }

    fn chat_template(&self) -> Option<&str> {
        Some(FAKE_TEMPLATE)
    }

    /// `role: content` lines.
    fn apply_template(&self, prompt: &Prompt) -> Option<Result<String, SubmitError>> {
        let (Prompt::Chat(messages) | Prompt::ChatWithTools { messages, .. }) = prompt else {
            return None;
        };
        let lines = messages
            .iter()
            .map(|m| format!("{}: {}\n", m.role, m.content));
        Some(Ok(lines.collect()))
    }
}

/// The demo model, loaded once (its tokenizer serves the fake's token routes).
fn demo_model() -> &'static rgml_llm::Model {
    static MODEL: std::sync::OnceLock<rgml_llm::Model> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        rgml_cpu::register();
        rgml_llm::Model::load(path, Default::default()).expect("the demo model")
    })
}

/// The words the fake answers with: the last message's (chat), the text's, or `t<id>` per
/// token id.
fn prompt_words(prompt: &Prompt) -> Vec<String> {
    let text = match prompt {
        Prompt::Text(text) => text.clone(),
        Prompt::Chat(messages) | Prompt::ChatWithTools { messages, .. } => messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default(),
        Prompt::Tokens(ids) => ids.iter().map(|id| format!("t{id} ")).collect(),
    };
    text.split_whitespace().map(str::to_owned).collect()
}

/// One generation of the fake.
struct Run {
    words: Vec<String>,
    request: GenRequest,
    tx: UnboundedSender<GenEvent>,
    cancelled: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

impl Run {
    async fn generate(self) {
        let endless = self.words.first().is_some_and(|w| w == "forever");
        let mut n = 0;
        loop {
            tokio::time::sleep(TOKEN_DELAY).await;
            if self.cancelled.load(Ordering::SeqCst) {
                self.shared.cancelled.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if self.shared.shutting_down.load(Ordering::SeqCst) {
                return self.done(FinishReason::Shutdown, n);
            }
            if self.request.max_tokens == Some(n) {
                return self.done(FinishReason::Length, n);
            }
            let word = match self.words.get(n) {
                _ if endless => "tick".to_owned(),
                Some(word) if self.request.stop.contains(word) => {
                    return self.done(FinishReason::Stop, n)
                }
                Some(word) => word.clone(),
                None => return self.done(FinishReason::Stop, n),
            };
            if n == 1 && self.words[0] == "fail" {
                let _ = self.tx.send(GenEvent::Failed("boom".to_owned()));
                return;
            }
            let _ = self.tx.send(GenEvent::Token(self.token(n, &word)));
            n += 1;
        }
    }

    fn token(&self, n: usize, word: &str) -> TokenOut {
        let text = match (n, word) {
            (_, "<hidden>") => String::new(),
            (0, word) => word.to_owned(),
            (_, word) => format!(" {word}"),
        };
        let logprobs = self.request.n_probs.map(|k| Logprobs {
            chosen: logprob(n as u32, &text, -0.5),
            top: (0..k)
                .map(|i| logprob(1000 + i as u32, &format!("alt{i}"), -1.0 - i as f32))
                .collect(),
        });
        TokenOut {
            id: n as u32,
            text,
            logprobs,
        }
    }

    fn done(&self, reason: FinishReason, completion_tokens: usize) {
        let usage = Usage {
            prompt_tokens: self.words.len(),
            cached_tokens: 1,
            completion_tokens,
        };
        let _ = self.tx.send(GenEvent::Done {
            text: String::new(),
            reason,
            usage,
        });
    }
}

fn logprob(id: u32, text: &str, logprob: f32) -> TokenLogprob {
    TokenLogprob {
        id,
        text: text.to_owned(),
        bytes: text.as_bytes().to_vec(),
        logprob,
    }
}

/// A server on a free port.
struct Server {
    addr: SocketAddr,
    fake: Arc<Fake>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

async fn start(options: HttpOptions) -> Server {
    start_fake(options, Fake::default()).await
}

async fn start_fake(options: HttpOptions, fake: Fake) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Arc::new(fake);
    let (shutdown, signal) = oneshot::channel::<()>();
    let generator: Arc<dyn Generator> = fake.clone();
    let signal = async move {
        let _ = signal.await;
    };
    let task = tokio::spawn(serve(listener, generator, options, signal));
    Server {
        addr,
        fake,
        shutdown: Some(shutdown),
        task,
    }
}

async fn start_default() -> Server {
    start(HttpOptions::default()).await
}

/// A client connection and the task driving it (abort it to drop the connection).
struct Client {
    sender: SendRequest<Full<Bytes>>,
    conn: JoinHandle<()>,
}

async fn connect(addr: SocketAddr) -> Client {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    Client { sender, conn }
}

fn build(
    method: &str,
    path: &str,
    body: &[u8],
    content_type: Option<&str>,
) -> hyper::Request<Full<Bytes>> {
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", content_type);
    }
    builder
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap()
}

/// A whole response.
struct Reply {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

async fn request_on(client: &mut Client, req: hyper::Request<Full<Bytes>>) -> Reply {
    let response = client.sender.send_request(req).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    content_type: Option<&str>,
) -> Reply {
    let mut client = connect(addr).await;
    request_on(&mut client, build(method, path, body, content_type)).await
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, b"", None).await
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    let body = serde_json::to_vec(body).unwrap();
    request(addr, "POST", path, &body, Some("application/json")).await
}

/// A streamed response, read event by event.
struct Events {
    status: u16,
    headers: hyper::HeaderMap,
    body: Incoming,
    buffer: String,
    client: Client,
}

async fn open_stream(addr: SocketAddr, path: &str, body: &Value) -> Events {
    let mut client = connect(addr).await;
    let body = serde_json::to_vec(body).unwrap();
    let req = build("POST", path, &body, Some("application/json"));
    let response = client.sender.send_request(req).await.unwrap();
    Events {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.into_body(),
        buffer: String::new(),
        client,
    }
}

impl Events {
    /// The next event's `data` (`None` at the end of the body).
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                assert!(!data.is_empty(), "an event without data: {event:?}");
                return Some(data.join("\n"));
            }
            let frame = self.body.frame().await?.unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }

    /// Every remaining event; the last must be `[DONE]` and the body must end after it.
    async fn rest(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(data) = self.next().await {
            if data == "[DONE]" {
                assert!(self.next().await.is_none(), "events after [DONE]");
                assert!(self.buffer.trim().is_empty());
                return out;
            }
            out.push(serde_json::from_str(&data).unwrap());
        }
        panic!("the stream ended without [DONE] after {out:?}");
    }
}

fn chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}]})
}

fn with(mut body: Value, extra: Value) -> Value {
    let (Value::Object(body_map), Value::Object(extra)) = (&mut body, extra) else {
        panic!("objects expected");
    };
    body_map.extend(extra);
    body
}

/// Asserts an OpenAI error body with `status`, `type` and `param`.
fn assert_error(reply: &Reply, status: u16, kind: &str, param: Option<&str>) -> Value {
    assert_eq!(reply.status, status, "{}", reply.body);
    assert!(reply.header("content-type").starts_with("application/json"));
    let body = reply.json();
    let error = &body["error"];
    assert_eq!(error["type"], kind, "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(error["param"].as_str(), param, "{body}");
    assert!(error.get("code").is_some(), "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completion_whole() {
    let server = start_default().await;
    let body = with(
        chat("the cat sat"),
        json!({"model": MODEL, "temperature": 0.0}),
    );
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(body["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "the cat sat"})
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
               "prompt_tokens_details": {"cached_tokens": 1}})
    );
    let request = server.fake.last_request();
    assert_eq!(request.sampling.temp, 0.0);
    assert!(
        matches!(&request.prompt, Prompt::Chat(m) if m == &[Message::new("user", "the cat sat")])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_request_fields_reach_the_generator() {
    let server = start_default().await;
    let body = json!({
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "hi"},
        ],
        "max_completion_tokens": 7, "top_p": 0.5, "top_k": 3, "min_p": 0.1, "seed": 99,
        "stop": ["x", "", "y"], "repeat_penalty": 1.1, "frequency_penalty": 0, "presence_penalty": 0.0,
        "n": 1, "logprobs": true, "top_logprobs": 2, "ignore_eos": true,
    });
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let request = server.fake.last_request();
    let Prompt::Chat(messages) = &request.prompt else {
        panic!("a chat prompt expected")
    };
    let expected = [
        Message::new("system", "be brief"),
        Message::new("assistant", "ab"),
        Message::new("user", "hi"),
    ];
    assert_eq!(messages, &expected);
    assert_eq!(request.max_tokens, Some(7));
    assert_eq!(
        (
            request.sampling.top_p,
            request.sampling.top_k,
            request.sampling.min_p
        ),
        (0.5, 3, 0.1)
    );
    assert_eq!(
        (request.sampling.seed, request.sampling.repeat_penalty),
        (99, 1.1)
    );
    // Absent: llama.cpp's default.
    assert_eq!(request.sampling.temp, 0.8);
    assert_eq!(request.stop, ["x", "y"]);
    assert_eq!(request.n_probs, Some(2));
    assert!(request.ignore_eos);

    // Defaults: sampler defaults, a random seed, the server's max_tokens default.
    let server = start(HttpOptions {
        max_tokens_default: Some(5),
        ..HttpOptions::default()
    })
    .await;
    post(server.addr, "/v1/chat/completions", &chat("a")).await;
    let first = server.fake.last_request();
    post(server.addr, "/v1/chat/completions", &chat("a")).await;
    let second = server.fake.last_request();
    assert_eq!(first.max_tokens, Some(5));
    assert_eq!(
        (
            first.sampling.top_k,
            first.sampling.top_p,
            first.sampling.min_p
        ),
        (40, 0.95, 0.05)
    );
    assert_ne!(first.sampling.seed, second.sampling.seed);
    assert_eq!(first.n_probs, None);
    assert!(!first.ignore_eos);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_and_length() {
    let server = start_default().await;
    let body = with(
        chat("one two three four"),
        json!({"max_tokens": 2, "logprobs": true, "top_logprobs": 2}),
    );
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["content"], "one two");
    assert_eq!(choice["finish_reason"], "length");
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[1]["token"], " two");
    assert_eq!(content[1]["logprob"], -0.5);
    assert_eq!(content[1]["bytes"], json!(b" two".to_vec()));
    assert_eq!(
        content[1]["top_logprobs"],
        json!([{"token": "alt0", "logprob": -1.0, "bytes": b"alt0".to_vec()},
               {"token": "alt1", "logprob": -2.0, "bytes": b"alt1".to_vec()}])
    );
    // logprobs without alternatives.
    let body = with(chat("one"), json!({"logprobs": true}));
    let body = post(server.addr, "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(
        body["choices"][0]["logprobs"]["content"][0]["top_logprobs"],
        json!([])
    );
}

/// The OpenAI penalties and `logit_bias` (OpenAI's object and llama-server's pairs, `false`
/// banning a token) reach the sampler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_and_logit_bias_reach_the_sampler() {
    let server = start_default().await;
    let body = with(
        chat("a"),
        json!({"frequency_penalty": 0.5, "presence_penalty": -0.25,
               "logit_bias": {"3": -1.5, "7": false}}),
    );
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(server.fake.last_request().format, OutputFormat::Text);
    let sampling = server.fake.last_request().sampling;
    assert_eq!(
        (sampling.frequency_penalty, sampling.presence_penalty),
        (0.5, -0.25)
    );
    let mut bias = sampling.logit_bias.clone();
    bias.sort_by_key(|b| b.0);
    assert_eq!(bias, [(3, -1.5), (7, f32::NEG_INFINITY)]);
    // A chat's JSON answer: llama-server's frame around the document, after the reasoning
    // this model may write (or, where the prompt opened it, continues).
    let framed = |schema: &Value, reasoning| {
        let gbnf = answer_to_gbnf(schema, reasoning).unwrap();
        Arc::new(rgml_llm::grammar::Grammar::from_gbnf(&gbnf).unwrap())
    };
    let answer = |schema: &Value| framed(schema, AnswerReasoning::May);
    let body = json!({"prompt": "a", "response_format": {"type": "json_object"}});
    let reply = post(server.addr, "/v1/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(server.fake.last_request().format, OutputFormat::JsonObject);
    // A grammar, a schema through either field, compiled before the generator sees them.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let grammar_of = |route: &str, body: Value| {
        let (addr, fake) = (server.addr, server.fake.clone());
        let route = route.to_string();
        async move {
            let reply = post(addr, &route, &body).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
            match fake.last_request().format {
                OutputFormat::Grammar(g) => g,
                OutputFormat::JsonAnswer { fresh, open } => {
                    assert_ne!(fresh, open);
                    fresh
                }
                other => panic!("{other:?}"),
            }
        }
    };
    let any_object = json!({"type": "object"});
    for format in [
        json!({"type": "json_object"}),
        json!({"type": "json_object", "schema": {}}),
        json!({"type": "json_schema", "json_schema": {"name": "any"}}),
    ] {
        let body = with(chat("a"), json!({ "response_format": format }));
        let g = grammar_of("/v1/chat/completions", body).await;
        assert_eq!(g, answer(&any_object), "{format}");
    }
    let by_field = grammar_of(
        "/v1/completions",
        json!({"prompt": "a", "json_schema": schema}),
    )
    .await;
    let by_format = grammar_of(
        "/v1/chat/completions",
        with(chat("a"), json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}}})),
    )
    .await;
    let llama_form = grammar_of(
        "/v1/chat/completions",
        with(
            chat("a"),
            json!({"response_format": {"type": "json_object", "schema": schema}}),
        ),
    )
    .await;
    let compiled = rgml_llm::grammar::Grammar::from_json_schema(&schema).unwrap();
    assert_eq!(*by_field, compiled);
    for g in [by_format, llama_form] {
        assert_eq!(g, answer(&schema));
    }
    match server.fake.last_request().format {
        OutputFormat::JsonAnswer { open, .. } => {
            assert_eq!(open, framed(&schema, AnswerReasoning::Open))
        }
        other => panic!("{other:?}"),
    }
    let gbnf = "root ::= \"yes\" | \"no\"";
    let g = grammar_of("/v1/completions", json!({"prompt": "a", "grammar": gbnf})).await;
    assert_eq!(*g, rgml_llm::grammar::Grammar::from_gbnf(gbnf).unwrap());
    let body = json!({"prompt": "a", "logit_bias": [[5, 2], [9, false]]});
    let reply = post(server.addr, "/v1/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        server.fake.last_request().sampling.logit_bias,
        [(5, 2.0), (9, f32::NEG_INFINITY)]
    );
}

/// No field is dropped silently: unknown ones are listed in `warnings` (whole answers and
/// every chunk); fields that change nothing, and refused fields that ask for nothing, are
/// taken without a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_answered_with_warnings() {
    let server = start_default().await;
    let quiet = with(
        chat("a"),
        json!({"user": "u", "metadata": {"k": "v"}, "store": false, "tools": null,
               "tool_choice": "none", "response_format": {"type": "text"}}),
    );
    let reply = post(server.addr, "/v1/chat/completions", &quiet).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert!(body.get("warnings").is_none(), "{body}");

    let noisy = with(chat("a"), json!({"frobnicate": 1, "top_a": 0.2}));
    let reply = post(server.addr, "/v1/chat/completions", &noisy).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    let want = json!([
        "unknown field `frobnicate` ignored",
        "unknown field `top_a` ignored"
    ]);
    assert_eq!(body["warnings"], want);

    let reply = post(
        server.addr,
        "/v1/completions",
        &json!({"prompt": "a", "xyz": true}),
    )
    .await;
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["warnings"], json!(["unknown field `xyz` ignored"]));

    let streamed = with(noisy, json!({"stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &streamed).await;
    let chunks = events.rest().await;
    assert!(chunks.len() >= 2, "{chunks:?}");
    for chunk in &chunks {
        assert_eq!(chunk["warnings"], want, "{chunk}");
    }
}

const WEATHER_TOOLS: &str = r#"[{"type": "function", "function": {"name": "weather",
    "description": "The weather in a city", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]"#;

/// The fake echoes the last message: one that writes a Hermes tool call.
const CALLING: &str =
    r#"Checking. <tool_call>{"name":"weather","arguments":{"city":"Paris"}}</tool_call>"#;

/// With `tools`, the model's tool calls come back as OpenAI `tool_calls` (its text beside them
/// as `content`, `finish_reason` `tool_calls`), the tools reach the template as sent, and
/// earlier calls and tool results in the conversation reach it as messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_read_out_of_the_output() {
    let server = start_default().await;
    let tools: Value = serde_json::from_str(WEATHER_TOOLS).unwrap();
    let body = json!({
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "weather", "content": "cold"},
            {"role": "user", "content": CALLING},
        ],
        "tools": tools,
    });
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Checking.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(
        calls[0]["function"],
        json!({"name": "weather", "arguments": "{\"city\":\"Paris\"}"})
    );
    let Prompt::ChatWithTools {
        messages,
        tools: sent,
    } = server.fake.last_request().prompt
    else {
        panic!("a chat with tools expected")
    };
    assert_eq!(serde_json::from_str::<Value>(&sent).unwrap(), tools);
    assert_eq!(messages[1].tool_calls.len(), 1);
    assert_eq!(messages[1].tool_calls[0].name, "weather");
    assert_eq!(messages[1].tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
    assert_eq!(messages[2].role, "tool");
    assert_eq!(messages[2].tool_call_id.as_deref(), Some("call_1"));

    // No call in the output: plain content; without tools nothing is parsed.
    let body = json!({"messages": [{"role": "user", "content": "just text"}], "tools": tools});
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        answer["choices"][0]["message"],
        json!({"role": "assistant", "content": "just text"})
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let reply = post(server.addr, "/v1/chat/completions", &chat(CALLING)).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], CALLING);
    assert!(answer["choices"][0]["message"].get("tool_calls").is_none());
    // tool_choice "none": the tools do not go to the model.
    let body = with(
        chat(CALLING),
        json!({"tools": tools, "tool_choice": "none"}),
    );
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(matches!(server.fake.last_request().prompt, Prompt::Chat(_)));

    // A forced call is sampled inside the model's call frame with a tool's name written (the
    // one named, or one of the tools').
    let body = with(
        chat("a"),
        json!({"tools": tools, "tool_choice": "required"}),
    );
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let takes = |format: OutputFormat, text: &str| {
        let OutputFormat::Grammar(grammar) = format else {
            panic!("a forced call's grammar, not {format:?}");
        };
        let mut m = rgml_llm::grammar::Matcher::new(grammar);
        m.push(text.as_bytes()) && m.finished()
    };
    let call = |name: &str, args: &str| {
        format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
    };
    let format = server.fake.last_request().format;
    assert!(takes(
        format.clone(),
        &call("weather", r#"{"city": "Oslo"}"#)
    ));
    assert!(
        !takes(format.clone(), &call("weather", "{}")),
        "`city` is required"
    );
    assert!(
        !takes(format.clone(), &call("weather", r#"{"city": 3}"#)),
        "`city` is a string"
    );
    assert!(
        !takes(format, &call("time", r#"{"city": "Oslo"}"#)),
        "not a tool"
    );
    // Named: that tool only. A tool whose parameters cannot be enforced takes any object, and
    // the answer says so.
    let two: Value = json!([tools[0], {"type": "function", "function": {"name": "time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^(?=[A-Z])"}}}}}]);
    for (name, args, warned) in [
        ("weather", r#"{"city": "Oslo"}"#, false),
        ("time", r#"{"any": [1]}"#, true),
    ] {
        let named = json!({"type": "function", "function": {"name": name}});
        let body = with(chat("a"), json!({"tools": two, "tool_choice": named}));
        let reply = post(server.addr, "/v1/chat/completions", &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let format = server.fake.last_request().format;
        assert!(takes(format.clone(), &call(name, args)), "{name}");
        let other = if name == "weather" { "time" } else { "weather" };
        assert!(
            !takes(format, &call(other, r#"{"city": "Oslo"}"#)),
            "{name}"
        );
        let warnings = reply.json()["warnings"].to_string();
        assert_eq!(warnings.contains("`pattern`"), warned, "{warnings}");
    }

    // Refused: a forced call of no tool or of an unknown one, with a JSON format too, and a
    // tool that is not a function.
    let unknown = json!({"type": "function", "function": {"name": "time"}});
    for (extra, param) in [
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": tools, "tool_choice": unknown}),
            "tool_choice",
        ),
        (
            json!({"tools": tools, "tool_choice": "always"}),
            "tool_choice",
        ),
        (
            json!({"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
        ),
        (
            json!({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}),
            "tools[0].type",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": ""}}]}),
            "tools[0].function.name",
        ),
    ] {
        let reply = post(server.addr, "/v1/chat/completions", &with(chat("a"), extra)).await;
        assert_error(&reply, 400, "invalid_request_error", Some(param));
    }
    let reply = post(
        server.addr,
        "/v1/completions",
        &json!({"prompt": "a", "tools": tools}),
    )
    .await;
    assert_error(&reply, 400, "invalid_request_error", Some("tools"));
}

/// The tool-call pieces of a stream's chunks, in order.
fn call_pieces(chunks: &[Value]) -> Vec<Value> {
    (chunks.iter())
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .cloned()
        .collect()
}

/// Streamed with tools: text flows until a call may begin, then each call streams as
/// llama-server streams it (its index, id, type and name first, then its arguments' text in
/// pieces), and the finish reason is `tool_calls`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_stream_as_deltas() {
    let server = start_default().await;
    let tools: Value = serde_json::from_str(WEATHER_TOOLS).unwrap();
    // The fake writes a word per token: the second call's arguments come in several.
    let two_calls = format!(
        "{CALLING} <tool_call>{{\"name\": \"weather\", \"arguments\": {{\"city\": \"New York\", \"days\": 3}}}}</tool_call>"
    );
    let body = with(chat(&two_calls), json!({"tools": tools, "stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    let text: String = (chunks.iter())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Checking. ");
    let pieces = call_pieces(&chunks);
    for (index, args) in [
        (0, "{\"city\":\"Paris\"}"),
        (1, "{\"city\": \"New York\", \"days\": 3}"),
    ] {
        let mine: Vec<&Value> = pieces.iter().filter(|p| p["index"] == index).collect();
        let first = mine[0];
        assert!(
            first["id"].as_str().unwrap().starts_with("call_"),
            "{first}"
        );
        assert_eq!(
            (&first["type"], &first["function"]["name"]),
            (&json!("function"), &json!("weather"))
        );
        assert!(mine[1..]
            .iter()
            .all(|p| p.get("id").is_none() && p["function"].get("name").is_none()));
        let streamed: String = mine
            .iter()
            .map(|p| p["function"]["arguments"].as_str().unwrap())
            .collect();
        assert_eq!(streamed, args);
        if index == 1 {
            assert!(mine.len() >= 4, "the arguments come in pieces: {mine:?}");
        }
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    // A call whose name comes after its arguments goes whole at the end.
    let late = r#"<tool_call>{"arguments": {"city": "Oslo"}, "name": "weather"}</tool_call>"#;
    let body = with(chat(late), json!({"tools": tools, "stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    let pieces = call_pieces(&chunks);
    assert_eq!(pieces.len(), 1, "{pieces:?}");
    assert_eq!(pieces[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");

    // Without a call, every word still arrives.
    let body = with(
        chat("no calls here <tool"),
        json!({"tools": tools, "stream": true}),
    );
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "no calls here <tool");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

/// A thinking model's `<think>` part comes back as `reasoning_content` (whole, and streamed
/// as its own deltas), unless `reasoning_format` is `none`; a tool call after the reasoning
/// is still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_goes_to_reasoning_content() {
    let server = start_default().await;
    let thinking = "<think> the capital, surely </think> Paris.";
    let reply = post(server.addr, "/v1/chat/completions", &chat(thinking)).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        answer["choices"][0]["message"],
        json!({"role": "assistant", "content": "Paris.", "reasoning_content": "the capital, surely"})
    );
    let body = with(chat(thinking), json!({"reasoning_format": "none"}));
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], thinking);
    let body = with(chat(thinking), json!({"reasoning_format": "hidden"}));
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_error(
        &reply,
        400,
        "invalid_request_error",
        Some("reasoning_format"),
    );

    let body = with(chat(thinking), json!({"stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    let join = |field: &str| joined_deltas(&chunks, field);
    assert_eq!(join("reasoning_content").trim(), "the capital, surely");
    assert_eq!(join("content"), "Paris.");

    let tools: Value = serde_json::from_str(WEATHER_TOOLS).unwrap();
    let calling = format!("<think> use the tool </think> {CALLING}");
    let body = with(chat(&calling), json!({"tools": tools}));
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "use the tool");
    assert_eq!(message["content"], "Checking.");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "weather");
}

/// A chat answer with a `response_format`: as llama-server reads it, the content is the JSON
/// document alone (no fence, no whitespace around it), after the reasoning; whole and
/// streamed alike, and no tool call is read out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_answers_are_the_document_alone() {
    let server = start_default().await;
    let format = json!({"response_format": {"type": "json_object"}});
    let tools: Value = serde_json::from_str(WEATHER_TOOLS).unwrap();
    for (said, reasoning, document) in [
        (
            "<think> why not </think> ```json {\"n\": [1, 2]} ```",
            Some("why not"),
            "{\"n\": [1, 2]}",
        ),
        ("  {\"n\": \"a ``` b\"}  ", None, "{\"n\": \"a ``` b\"}"),
    ] {
        let body = with(chat(said), format.clone());
        let reply = post(server.addr, "/v1/chat/completions", &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let answer: Value = serde_json::from_str(&reply.body).unwrap();
        let message = &answer["choices"][0]["message"];
        assert_eq!(message["content"], document, "{said}");
        assert_eq!(message["reasoning_content"].as_str(), reasoning, "{said}");
        let body = with(
            with(chat(said), format.clone()),
            json!({"stream": true, "tools": tools}),
        );
        let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
        let chunks = events.rest().await;
        assert_eq!(joined_deltas(&chunks, "content"), document, "{said}");
        assert!(chunks
            .iter()
            .all(|c| c["choices"][0]["delta"]["tool_calls"].is_null()));
    }
    // A Hermes call inside the document stays content.
    let body = with(with(chat(CALLING), format.clone()), json!({"tools": tools}));
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    assert!(
        answer["choices"][0]["message"]["tool_calls"].is_null(),
        "{answer}"
    );
}

/// `n` choices: each generated on its own (the next seed each), answered together with their
/// indexes; the usage counts the prompt once and every choice's tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_come_back_together() {
    let server = start_default().await;
    let body = with(chat("one two three"), json!({"n": 3, "seed": 7}));
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let choices = answer["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(choice["message"]["content"], "one two three");
    }
    assert_eq!(answer["usage"]["prompt_tokens"], 3);
    assert_eq!(answer["usage"]["completion_tokens"], 9);
    let seeds: Vec<u64> = {
        let submitted = server.fake.submitted.lock().unwrap();
        submitted.iter().map(|r| r.sampling.seed).collect()
    };
    assert_eq!(seeds, [7, 8, 9]);
    let body = json!({"prompt": "a b", "n": 2, "max_tokens": 5});
    let reply = post(server.addr, "/v1/completions", &body).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let texts: Vec<&str> = (answer["choices"].as_array().unwrap().iter())
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["a b", "a b"]);
    assert_eq!(answer["choices"][1]["index"], 1);

    // Streamed: each choice's chunks name its index, interleaved as they come; one usage
    // chunk and one `[DONE]` end them all.
    let body = with(
        chat("one two three"),
        json!({"n": 2, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    for index in 0..2 {
        let text: String = (chunks.iter())
            .filter(|c| c["choices"][0]["index"] == index)
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "one two three", "choice {index}");
        let finished = (chunks.iter())
            .filter(|c| c["choices"][0]["index"] == index)
            .filter(|c| c["choices"][0]["finish_reason"] == "stop")
            .count();
        assert_eq!(finished, 1, "choice {index}");
    }
    let usages: Vec<&Value> = chunks.iter().filter(|c| !c["usage"].is_null()).collect();
    assert_eq!(usages.len(), 1);
    assert_eq!(usages[0]["usage"]["completion_tokens"], 6);
    assert_eq!(usages[0]["usage"]["prompt_tokens"], 3);
}

/// The text of a streamed chat's deltas of `field` (`content`, `reasoning_content`), joined.
fn joined_deltas(chunks: &[Value], field: &str) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"][field].as_str())
        .collect()
}

/// gpt-oss's harmony output: the analysis channel comes back as `reasoning_content`, the
/// final channel as the content, and a message to `functions.NAME` as a tool call (whole and
/// streamed in pieces).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harmony_channels_give_reasoning_content_and_tool_calls() {
    let fake = Fake {
        harmony: true,
        ..Fake::default()
    };
    let server = start_fake(HttpOptions::default(), fake).await;
    let answer = "<|channel|>analysis<|message|>the capital <|end|><|start|>assistant<|channel|>final<|message|>Paris.";
    let reply = post(server.addr, "/v1/chat/completions", &chat(answer)).await;
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        body["choices"][0]["message"],
        json!({"role": "assistant", "content": "Paris.", "reasoning_content": "the capital"})
    );
    let tools: Value = serde_json::from_str(WEATHER_TOOLS).unwrap();
    let call = "<|channel|>analysis<|message|>use the tool <|end|><|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
    let body = with(chat(call), json!({"tools": tools}));
    let reply = post(server.addr, "/v1/chat/completions", &body).await;
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["reasoning_content"], "use the tool");
    assert_eq!(choice["message"]["content"], Value::Null);
    let function = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(function["name"], "weather");
    let args: Value = serde_json::from_str(function["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));

    let body = with(chat(call), json!({"tools": tools, "stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    let join = |field: &str| joined_deltas(&chunks, field);
    assert_eq!(join("reasoning_content").trim(), "use the tool");
    assert_eq!(join("content"), "");
    // Each chunk's pieces of the call (the opening, then the arguments as they come).
    let args: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .filter_map(|piece| piece["function"]["arguments"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&args).unwrap(),
        json!({"city": "Paris"})
    );
}

/// llama-server's token routes: `/tokenize` (ids as the tokenizer gives them, with pieces on
/// request), `/detokenize` (back to the text), `/apply-template` (the chat prompt); `/props`;
/// bad bodies name the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_and_apply_template() {
    let server = start_default().await;
    let tok = &demo_model().tokenizer;
    let text = "Hello <|im_start|> world, naïve!";
    let reply = post(server.addr, "/tokenize", &json!({"content": text})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    let want = tok.encode(
        text,
        EncodeOptions {
            add_special: false,
            parse_special: true,
        },
    );
    assert_eq!(body["tokens"], json!(want));
    let plain = tok.encode(
        text,
        EncodeOptions {
            add_special: false,
            parse_special: false,
        },
    );
    assert_ne!(plain, want, "the control token is parsed by default");
    let reply = post(
        server.addr,
        "/tokenize",
        &json!({"content": text, "parse_special": false, "with_pieces": true}),
    )
    .await;
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    let pieces = body["tokens"].as_array().unwrap();
    assert_eq!(pieces.len(), plain.len());
    assert_eq!(pieces[0]["id"], plain[0]);
    assert_eq!(pieces[0]["piece"], "Hello");

    let reply = post(server.addr, "/detokenize", &json!({"tokens": want})).await;
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["content"], text);

    let reply = post(
        server.addr,
        "/apply-template",
        &json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["prompt"], "system: s\nuser: u\n");

    let reply = get(server.addr, "/props").await;
    let props: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(props["total_slots"], STATS.n_slots);
    assert_eq!(props["model_alias"], MODEL);
    assert_eq!(props["chat_template"], FAKE_TEMPLATE);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 4096);
    assert_eq!(props["default_generation_settings"]["params"]["top_k"], 40);

    for (path, body, param) in [
        ("/tokenize", json!({}), Some("content")),
        ("/tokenize", json!({"content": 3}), Some("content")),
        (
            "/tokenize",
            json!({"content": "a", "bogus": 1}),
            Some("bogus"),
        ),
        (
            "/detokenize",
            json!({"tokens": [1, 99999999]}),
            Some("tokens"),
        ),
        ("/detokenize", json!({"tokens": "x"}), Some("tokens")),
        ("/apply-template", json!({"messages": []}), Some("messages")),
    ] {
        let reply = post(server.addr, path, &body).await;
        assert_error(&reply, 400, "invalid_request_error", param);
    }
}

/// With an API key, every route but `GET /health`, the chat page and CORS preflights needs
/// `Authorization: Bearer KEY`; otherwise a 401 `authentication_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_every_route_but_health() {
    let server = start(HttpOptions {
        api_key: Some("s3cret".into()),
        ..HttpOptions::default()
    })
    .await;
    let with_auth = |auth: Option<&str>, method: &str, path: &str| {
        let body = if method == "POST" {
            serde_json::to_vec(&chat("a")).unwrap()
        } else {
            Vec::new()
        };
        let mut req = build(method, path, &body, Some("application/json"));
        if let Some(auth) = auth {
            req.headers_mut()
                .insert("authorization", auth.parse().unwrap());
        }
        req
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cre"),
        Some("s3cret"),
    ] {
        for (method, path) in [
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
        ] {
            let mut client = connect(server.addr).await;
            let reply = request_on(&mut client, with_auth(auth, method, path)).await;
            let body = assert_error(&reply, 401, "authentication_error", None);
            assert_eq!(body["error"]["code"], "invalid_api_key", "{auth:?} {path}");
        }
    }
    for (method, path) in [("POST", "/v1/chat/completions"), ("GET", "/v1/models")] {
        let mut client = connect(server.addr).await;
        let reply = request_on(&mut client, with_auth(Some("Bearer s3cret"), method, path)).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    }
    for path in ["/health", "/"] {
        assert_eq!(get(server.addr, path).await.status, 200, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream() {
    let server = start_default().await;
    let body = with(
        chat("a <hidden> b"),
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    assert_eq!(events.status, 200);
    assert!(events.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks = events.rest().await;
    let id = chunks[0]["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("chatcmpl-"));
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], id.as_str());
        assert_eq!(chunk["model"], MODEL);
    }
    // Role first, one chunk per visible token (the hidden one skipped), the finish, usage.
    let choices: Vec<&Value> = chunks.iter().map(|c| &c["choices"]).collect();
    assert_eq!(choices.len(), 5, "{chunks:?}");
    assert_eq!(
        choices[0][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(choices[1][0]["delta"], json!({"content": "a"}));
    assert_eq!(choices[2][0]["delta"], json!({"content": " b"}));
    for choice in &choices[..3] {
        assert!(choice[0]["finish_reason"].is_null());
        assert!(choice[0]["logprobs"].is_null());
    }
    assert_eq!(choices[3][0]["delta"], json!({}));
    assert_eq!(choices[3][0]["finish_reason"], "stop");
    assert_eq!(choices[4], &json!([]));
    assert_eq!(chunks[4]["usage"]["completion_tokens"], 3);
    assert_eq!(chunks[4]["usage"]["total_tokens"], 6);
    assert!(chunks[3].get("usage").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_without_usage_with_logprobs() {
    let server = start_default().await;
    let body = with(
        chat("a <hidden> b"),
        json!({"stream": true, "logprobs": true, "max_tokens": 2}),
    );
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    // The hidden token carries log-probabilities, so it has a chunk of its own.
    assert_eq!(chunks.len(), 4, "{chunks:?}");
    assert_eq!(chunks[2]["choices"][0]["delta"], json!({"content": ""}));
    assert_eq!(
        chunks[2]["choices"][0]["logprobs"]["content"][0]["logprob"],
        -0.5
    );
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_whole_and_prompts() {
    let server = start_default().await;
    let body = json!({"prompt": "x y z", "max_tokens": 2, "logprobs": 1, "stop": "q"});
    let reply = post(server.addr, "/v1/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], "x y");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(
        choice["logprobs"],
        json!({"tokens": ["x", " y"], "token_logprobs": [-0.5, -0.5],
               "top_logprobs": [{"alt0": -1.0}, {"alt0": -1.0}], "text_offset": [0, 1]})
    );
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(server.fake.last_request().stop, ["q"]);

    // A stop word: finish reason stop.
    let body = post(
        server.addr,
        "/v1/completions",
        &json!({"prompt": "x q z", "stop": ["q"]}),
    )
    .await
    .json();
    assert_eq!(body["choices"][0]["text"], "x");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["choices"][0]["logprobs"].is_null());

    // Token ids, and a list of one string.
    let body = post(server.addr, "/v1/completions", &json!({"prompt": [5, 6]}))
        .await
        .json();
    assert_eq!(body["choices"][0]["text"], "t5 t6");
    assert!(matches!(server.fake.last_request().prompt, Prompt::Tokens(ref t) if t == &[5, 6]));
    let body = post(
        server.addr,
        "/v1/completions",
        &json!({"prompt": ["only one"]}),
    )
    .await
    .json();
    assert_eq!(body["choices"][0]["text"], "only one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_stream() {
    let server = start_default().await;
    let body = json!({"prompt": "p q", "stream": true, "logprobs": 0, "stream_options": {"include_usage": true}});
    let mut events = open_stream(server.addr, "/v1/completions", &body).await;
    let chunks = events.rest().await;
    assert_eq!(chunks.len(), 4, "{chunks:?}");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "text_completion");
        assert!(chunk["id"].as_str().unwrap().starts_with("cmpl-"));
    }
    assert_eq!(chunks[0]["choices"][0]["text"], "p");
    assert_eq!(chunks[1]["choices"][0]["text"], " q");
    assert_eq!(
        chunks[1]["choices"][0]["logprobs"]["text_offset"],
        json!([1])
    );
    assert!(chunks[1]["choices"][0]["finish_reason"].is_null());
    assert_eq!(chunks[2]["choices"][0]["text"], "");
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(chunks[3]["usage"]["completion_tokens"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_failures() {
    let server = start_default().await;
    let reply = post(server.addr, "/v1/chat/completions", &chat("fail now")).await;
    assert_error(&reply, 500, "server_error", None);
    assert_eq!(reply.json()["error"]["message"], "boom");

    let body = with(chat("fail now"), json!({"stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    let chunks = events.rest().await;
    let last = chunks.last().unwrap();
    assert_eq!(last["error"]["message"], "boom");
    assert_eq!(last["error"]["type"], "server_error");
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "fail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors() {
    let server = start_default().await;
    let addr = server.addr;
    let chat_path = "/v1/chat/completions";
    let reply = request(
        addr,
        "POST",
        chat_path,
        b"{\"messages\": [",
        Some("application/json"),
    )
    .await;
    assert_error(&reply, 400, "invalid_request_error", None);
    // No Content-Type, or another one: the body is still read as JSON.
    let body = serde_json::to_vec(&chat("hello")).unwrap();
    assert_eq!(
        request(addr, "POST", chat_path, &body, None).await.status,
        200
    );
    assert_eq!(
        request(addr, "POST", chat_path, &body, Some("text/plain"))
            .await
            .status,
        200
    );

    let cases: [(Value, &str, Option<&str>); 29] = [
        (json!({}), chat_path, Some("messages")),
        (json!([1]), chat_path, None),
        (
            with(chat("a"), json!({"temperature": "hot"})),
            chat_path,
            Some("temperature"),
        ),
        (
            with(chat("a"), json!({"temperature": -1})),
            chat_path,
            Some("temperature"),
        ),
        (
            with(chat("a"), json!({"top_p": 0})),
            chat_path,
            Some("top_p"),
        ),
        (
            with(chat("a"), json!({"min_p": 2})),
            chat_path,
            Some("min_p"),
        ),
        (
            with(chat("a"), json!({"max_tokens": 0})),
            chat_path,
            Some("max_tokens"),
        ),
        (
            with(chat("a"), json!({"max_tokens": -3})),
            chat_path,
            Some("max_tokens"),
        ),
        (with(chat("a"), json!({"n": 0})), chat_path, Some("n")),
        (with(chat("a"), json!({"n": 17})), chat_path, Some("n")),
        (
            with(chat("a"), json!({"tool_choice": "required"})),
            chat_path,
            Some("tool_choice"),
        ),
        (
            with(
                chat("a"),
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}}),
            ),
            chat_path,
            Some("response_format.json_schema.schema"),
        ),
        (
            with(
                chat("a"),
                json!({"response_format": {"type": "json_schema"}}),
            ),
            chat_path,
            Some("response_format.json_schema"),
        ),
        (
            json!({"prompt": "a", "grammar": "root ::= \"x"}),
            "/v1/completions",
            Some("grammar"),
        ),
        (
            json!({"prompt": "a", "grammar": 3}),
            "/v1/completions",
            Some("grammar"),
        ),
        (
            json!({"prompt": "a", "json_schema": {"type": "string", "pattern": "(?=a)"}}),
            "/v1/completions",
            Some("json_schema"),
        ),
        (
            json!({"prompt": "a", "grammar": "root ::= \"x\"", "response_format": {"type": "json_object"}}),
            "/v1/completions",
            Some("grammar"),
        ),
        (
            with(chat("a"), json!({"mirostat": 2})),
            chat_path,
            Some("mirostat"),
        ),
        (
            with(chat("a"), json!({"logit_bias": {"hello": 1}})),
            chat_path,
            Some("logit_bias"),
        ),
        (
            with(chat("a"), json!({"logit_bias": [[3, "x"]]})),
            chat_path,
            Some("logit_bias"),
        ),
        (
            with(chat("a"), json!({"frequency_penalty": "x"})),
            chat_path,
            Some("frequency_penalty"),
        ),
        (
            with(chat("a"), json!({"top_logprobs": 3})),
            chat_path,
            Some("top_logprobs"),
        ),
        (
            with(chat("a"), json!({"logprobs": true, "top_logprobs": 21})),
            chat_path,
            Some("top_logprobs"),
        ),
        (
            with(chat("a"), json!({"stop": vec!["s"; 17]})),
            chat_path,
            Some("stop"),
        ),
        (json!({"messages": []}), chat_path, Some("messages")),
        (
            json!({"messages": [{"role": "function", "content": "x"}]}),
            chat_path,
            Some("messages[0].role"),
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            chat_path,
            Some("messages[0].content"),
        ),
        (
            json!({"prompt": ["a", "b"]}),
            "/v1/completions",
            Some("prompt"),
        ),
        (
            json!({"prompt": "a", "echo": true}),
            "/v1/completions",
            Some("echo"),
        ),
    ];
    for (body, path, param) in cases {
        let reply = post(addr, path, &body).await;
        assert_error(&reply, 400, "invalid_request_error", param);
    }
    for (body, param) in [
        (json!({"prompt": "a", "logprobs": 21}), Some("logprobs")),
        (json!({"prompt": []}), Some("prompt")),
        (json!({"prompt": 3}), Some("prompt")),
        (json!({}), Some("prompt")),
    ] {
        let reply = post(addr, "/v1/completions", &body).await;
        assert_error(&reply, 400, "invalid_request_error", param);
    }
    // Nothing invalid reached the generator.
    assert_eq!(server.fake.submitted.lock().unwrap().len(), 2);

    let reply = post(addr, chat_path, &with(chat("a"), json!({"model": "gpt-4"}))).await;
    let body = assert_error(&reply, 404, "invalid_request_error", Some("model"));
    assert_eq!(body["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_limit_routes_and_methods() {
    let server = start(HttpOptions {
        max_body_bytes: 1024,
        ..HttpOptions::default()
    })
    .await;
    let addr = server.addr;
    let big = chat(&"word ".repeat(400));
    let reply = post(addr, "/v1/chat/completions", &big).await;
    assert_error(&reply, 413, "invalid_request_error", None);
    let reply = get(addr, "/v2/nothing").await;
    assert_error(&reply, 404, "invalid_request_error", None);
    let reply = get(addr, "/v1/chat/completions").await;
    assert_error(&reply, 405, "invalid_request_error", None);
    let reply = request(addr, "POST", "/health", b"", None).await;
    assert_error(&reply, 405, "invalid_request_error", None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_errors_map_to_statuses() {
    let server = start_default().await;
    let cases = [
        (
            SubmitError::EmptyPrompt,
            400,
            "invalid_request_error",
            Some("messages"),
        ),
        (
            SubmitError::PromptTooLong {
                n_prompt: 9,
                n_ctx: 4,
            },
            400,
            "invalid_request_error",
            Some("messages"),
        ),
        (
            SubmitError::MaxTokensTooLarge {
                max_tokens: 9,
                n_ctx: 4,
            },
            400,
            "invalid_request_error",
            Some("max_tokens"),
        ),
        (
            SubmitError::InvalidToken { id: 9, n_vocab: 4 },
            400,
            "invalid_request_error",
            Some("prompt"),
        ),
        (
            SubmitError::InvalidSampling {
                name: "temp",
                value: "9".into(),
                range: "small",
            },
            400,
            "invalid_request_error",
            Some("temperature"),
        ),
        (SubmitError::QueueFull(8), 429, "rate_limit_error", None),
        (SubmitError::ShuttingDown, 503, "server_error", None),
    ];
    for (error, status, kind, param) in cases {
        *server.fake.refuse.lock().unwrap() = Some(error.clone());
        let reply = post(server.addr, "/v1/chat/completions", &chat("a")).await;
        let body = assert_error(&reply, status, kind, param);
        assert_eq!(body["error"]["message"], error.to_string());
        // Streamed requests are refused the same way, before any event.
        let reply = post(
            server.addr,
            "/v1/chat/completions",
            &with(chat("a"), json!({"stream": true})),
        )
        .await;
        assert_error(&reply, status, kind, param);
    }
    *server.fake.refuse.lock().unwrap() = Some(SubmitError::EmptyPrompt);
    let reply = post(server.addr, "/v1/completions", &json!({"prompt": ""})).await;
    assert_error(&reply, 400, "invalid_request_error", Some("prompt"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_metrics_page_cors() {
    let server = start_default().await;
    let addr = server.addr;
    let body = get(addr, "/v1/models").await.json();
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["id"], MODEL);
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["owned_by"], "rgml");
    assert!(data[0]["created"].is_u64());
    assert_eq!(
        get(addr, &format!("/v1/models/{MODEL}")).await.json(),
        data[0]
    );
    let reply = get(addr, "/v1/models/other").await;
    assert_error(&reply, 404, "invalid_request_error", Some("model"));

    let reply = get(addr, "/health").await;
    assert_eq!((reply.status, reply.json()), (200, json!({"status": "ok"})));
    server.fake.shared.broken.store(true, Ordering::SeqCst);
    let reply = get(addr, "/health").await;
    assert_eq!(
        (reply.status, reply.json()),
        (503, json!({"status": "error"}))
    );
    server.fake.shared.broken.store(false, Ordering::SeqCst);

    let reply = get(addr, "/metrics").await;
    assert_eq!(reply.status, 200);
    assert!(reply
        .header("content-type")
        .starts_with("text/plain; version=0.0.4"));
    for (name, kind, value) in [
        ("rgml_requests_total", "counter", "17"),
        ("rgml_requests_finished_total", "counter", "11"),
        ("rgml_requests_cancelled_total", "counter", "5"),
        ("rgml_prompt_tokens_total", "counter", "1234"),
        ("rgml_generated_tokens_total", "counter", "5678"),
        ("rgml_prompt_seconds_total", "counter", "1.5"),
        ("rgml_generation_seconds_total", "counter", "2.25"),
        ("rgml_slots", "gauge", "4"),
        ("rgml_slots_busy", "gauge", "3"),
        ("rgml_queue_length", "gauge", "2"),
        ("rgml_generated_tokens_per_second", "gauge", "42.5"),
    ] {
        assert!(reply.body.contains(&format!("# HELP {name} ")), "{name}");
        assert!(
            reply.body.contains(&format!("# TYPE {name} {kind}\n")),
            "{name}"
        );
        assert!(
            reply.body.contains(&format!("\n{name} {value}\n")),
            "{name}: {}",
            reply.body
        );
    }

    // At least this request's own connection (earlier ones may not be closed yet).
    let name = "rgml_http_connections";
    assert!(reply.body.contains(&format!("# TYPE {name} gauge\n")));
    let open: usize = reply
        .body
        .lines()
        .find_map(|line| line.strip_prefix("rgml_http_connections "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(open >= 1);

    let reply = get(addr, "/").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), "text/html; charset=utf-8");
    for needle in [
        "id=\"input\"",
        "id=\"send\"",
        "id=\"messages\"",
        "data-done",
        "getReader",
    ] {
        assert!(reply.body.contains(needle), "{needle}");
    }

    // CORS: every answer allows any origin; a preflight is answered.
    assert_eq!(reply.header("access-control-allow-origin"), "*");
    let mut client = connect(addr).await;
    let preflight = hyper::Request::builder()
        .method("OPTIONS")
        .uri("/v1/chat/completions")
        .header("host", "localhost")
        .header("origin", "http://elsewhere.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type, authorization",
        )
        .body(Full::new(Bytes::new()))
        .unwrap();
    let reply = request_on(&mut client, preflight).await;
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("access-control-allow-origin"), "*");
    assert!(reply
        .header("access-control-allow-methods")
        .contains("POST"));
    assert_eq!(
        reply.header("access-control-allow-headers"),
        "content-type, authorization"
    );
    let reply = post(addr, "/v1/chat/completions", &chat("a")).await;
    assert_eq!(reply.header("access-control-allow-origin"), "*");
}

/// `router` alone serves the same routes (without the connection gauge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_without_serve() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake: Arc<dyn Generator> = Arc::new(Fake::default());
    let app = router(fake, &HttpOptions::default());
    tokio::spawn(async move { axum_serve(listener, app).await });
    let body = post(addr, "/v1/chat/completions", &chat("hi there"))
        .await
        .json();
    assert_eq!(body["choices"][0]["message"]["content"], "hi there");
    let metrics = get(addr, "/metrics").await.body;
    assert!(metrics.contains("rgml_slots 4\n"));
    assert!(!metrics.contains("rgml_http_connections"));
}

async fn axum_serve(listener: tokio::net::TcpListener, app: axum::Router) {
    let _ = axum::serve(listener, app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_cancels_its_request() {
    let server = start_default().await;
    let body = with(chat("forever"), json!({"stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    for _ in 0..3 {
        events.next().await.unwrap();
    }
    assert_eq!(server.fake.cancelled(), 0);
    events.client.conn.abort();
    drop(events);
    let start = Instant::now();
    while server.fake.cancelled() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "not cancelled within a second"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A whole (unstreamed) request is cancelled too when its client goes away.
    let mut client = connect(server.addr).await;
    let body = serde_json::to_vec(&chat("forever")).unwrap();
    let pending = client.sender.send_request(build(
        "POST",
        "/v1/chat/completions",
        &body,
        Some("application/json"),
    ));
    let _ = tokio::time::timeout(Duration::from_millis(50), pending).await;
    client.conn.abort();
    let start = Instant::now();
    while server.fake.cancelled() == 1 {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "not cancelled within a second"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_wait() {
    let server = start(HttpOptions {
        max_connections: 1,
        ..HttpOptions::default()
    })
    .await;
    let mut first = connect(server.addr).await;
    let reply = request_on(&mut first, build("GET", "/health", b"", None)).await;
    assert_eq!(reply.status, 200);
    // The second connection is not answered while the first stays open...
    let mut second = connect(server.addr).await;
    let waiting =
        tokio::spawn(
            async move { request_on(&mut second, build("GET", "/health", b"", None)).await },
        );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    // ...and is once it closes.
    first.conn.abort();
    drop(first);
    let reply = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_ends_streams() {
    let mut server = start_default().await;
    let body = with(chat("forever"), json!({"stream": true}));
    let mut events = open_stream(server.addr, "/v1/chat/completions", &body).await;
    for _ in 0..3 {
        events.next().await.unwrap();
    }
    server.shutdown.take().unwrap().send(()).unwrap();
    let chunks = events.rest().await;
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{chunks:?}");
    assert_eq!(last["choices"][0]["delta"], json!({}));
    let served = tokio::time::timeout(Duration::from_secs(5), server.task).await;
    served.unwrap().unwrap().unwrap();
    assert!(server.fake.shared.shutting_down.load(Ordering::SeqCst));
    assert!(TcpStream::connect(server.addr).await.is_err());
}

/// `/v1/embeddings`: texts (tokenized as prompts) and token lists reach the generator, vectors
/// come back in order as floats or base64 of their bytes, with the tokens counted; unknown
/// fields are listed, `dimensions` and other encodings refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_route() {
    let server = start_default().await;
    let tok = &demo_model().tokenizer;
    let hello = tok.encode("Hello there", EncodeOptions::prompt());
    let reply = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": ["Hello there", "x"], "model": MODEL, "user": "u", "shape": 3}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], MODEL);
    let x = tok.encode("x", EncodeOptions::prompt());
    assert_eq!(v["data"][0]["index"], 0);
    assert_eq!(v["data"][0]["object"], "embedding");
    assert_eq!(
        v["data"][0]["embedding"],
        json!([hello.len() as f32, hello[0] as f32, 1.0])
    );
    assert_eq!(
        v["data"][1]["embedding"],
        json!([x.len() as f32, x[0] as f32, 1.0])
    );
    assert_eq!(v["usage"]["prompt_tokens"], hello.len() + x.len());
    assert_eq!(v["warnings"], json!(["unknown field `shape` ignored"]));
    let reply = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": [7, 8, 9], "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let text = reply.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_owned();
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap();
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [3.0, 7.0, 1.0]);
    let reply = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": [[1], [2, 3]]}),
    )
    .await;
    assert_eq!(reply.json()["data"][1]["embedding"], json!([2.0, 2.0, 1.0]));
    let refused = [
        (json!({"input": "a", "dimensions": 8}), 400, "dimensions"),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            400,
            "encoding_format",
        ),
        (json!({"input": []}), 400, "input"),
        (json!({}), 400, "input"),
    ];
    for (body, status, param) in refused {
        let reply = post(server.addr, "/v1/embeddings", &body).await;
        assert_error(&reply, status, "invalid_request_error", Some(param));
    }
    let reply = post(
        server.addr,
        "/v1/embeddings",
        &json!({"input": "a", "model": "other"}),
    )
    .await;
    assert_eq!(reply.status, 404);
}

/// `--cors-origins`: only the listed origins get the header that lets a page read the answer
/// (named back, with `Vary: Origin`); others are answered without it, preflights too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_origins_limit_who_may_read() {
    let server = start(HttpOptions {
        cors_origins: Some(vec!["http://app.example".into()]),
        ..Default::default()
    })
    .await;
    for (origin, allowed) in [
        ("http://app.example", true),
        ("http://elsewhere.example", false),
    ] {
        for method in ["GET", "OPTIONS"] {
            let mut client = connect(server.addr).await;
            let req = hyper::Request::builder()
                .method(method)
                .uri("/v1/models")
                .header("host", "localhost")
                .header("origin", origin)
                .header("access-control-request-method", "GET")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let reply = request_on(&mut client, req).await;
            assert!(reply.status < 300, "{method} {origin}: {}", reply.status);
            let header = reply.headers.get("access-control-allow-origin");
            match allowed {
                true => assert_eq!(header.unwrap(), origin),
                false => assert!(header.is_none(), "{method} {origin}"),
            }
            assert_eq!(reply.header("vary"), "origin");
        }
    }
}

/// Reads from `tcp` until the peer closes; how long that took (`None`: still open after 5 s).
async fn closed_after(tcp: &mut TcpStream) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(t0.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// `timeout`: an idle keep-alive connection, a silent one and a request sent too slowly are
/// closed once it passes; a response that takes longer to compute is not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_close_idle_and_slow_connections_but_not_long_answers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timeout = Duration::from_millis(300);
    let server = start(HttpOptions {
        timeout: Some(timeout),
        ..HttpOptions::default()
    })
    .await;
    // 120 tokens of 5 ms: twice the timeout, with nothing written meanwhile.
    let body = json!({"prompt": "forever", "max_tokens": 120}).to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while !String::from_utf8_lossy(&got).contains("\"finish_reason\"") {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before the answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        t0.elapsed() > 2 * timeout,
        "the answer took {:?}",
        t0.elapsed()
    );
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    // Then idle: closed after about the timeout.
    let idle = closed_after(&mut tcp)
        .await
        .expect("the idle connection is closed");
    assert!(
        idle >= timeout / 2 && idle < Duration::from_secs(3),
        "{idle:?}"
    );
    // Silent from the start, and a request stalled halfway.
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut stalled = TcpStream::connect(server.addr).await.unwrap();
    stalled
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    for (i, tcp) in [&mut silent, &mut stalled].into_iter().enumerate() {
        closed_after(tcp).await.expect("closed");
        let t = t0.elapsed();
        assert!(t >= timeout / 2 && t < Duration::from_secs(3), "{i}: {t:?}");
    }
    // A streamed answer longer than the timeout arrives whole too.
    let body = json!({"prompt": "forever", "max_tokens": 120, "stream": true});
    let reply = post(server.addr, "/v1/completions", &body).await;
    assert_eq!(reply.status, 200);
    assert!(reply.body.contains("[DONE]"), "{}", reply.body);
}
