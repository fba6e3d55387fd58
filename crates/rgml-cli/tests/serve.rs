//! `rgml serve` with real clients: the PyPI `openai` package (`tests/serve/openai_client.py`:
//! chat and completions, streaming and not, greedy output equal to `rgml run --temp 0`, 8
//! concurrent streams each giving its solo output, bad requests, a dropped connection freeing
//! its slot) and Debian's Chromium driving the chat page (`tests/serve/browser.py`); and a
//! graceful shutdown ending a running stream cleanly; tools, JSON-schema answers and embeddings
//! through `openai` (`tests/serve/openai_structured.py`); a BERT encoder serving embeddings
//! and refusing to generate.
//!
//! The clients run in the Python of `RGML_SERVE_PYTHON` (a venv with `openai`, `jsonschema` and `selenium`,
//! made by `scripts/test.sh`); without it the client tests skip, unless
//! `RGML_REQUIRE_SERVE_CLIENTS=1` (set by `scripts/test.sh`, so CI never skips).

#[allow(dead_code)]
mod common;

use common::{demo_model, root};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The Python with the client packages, if there is one.
fn python() -> Option<PathBuf> {
    let path = std::env::var_os("RGML_SERVE_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.exists());
    if path.is_none() {
        common::skip_unless_required(
            "RGML_REQUIRE_SERVE_CLIENTS",
            "no RGML_SERVE_PYTHON (a venv with openai, jsonschema and selenium)",
        );
    }
    path
}

/// `rgml serve` on the demo model on a free port; killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::start_model(&demo_model(), extra)
    }

    /// `rgml serve` on `model`.
    fn start_model(model: &std::path::Path, extra: &[&str]) -> Server {
        Server::spawn(model, extra, None)
    }

    /// `rgml serve` on the demo model in instruction set `isa`'s arithmetic (`RGML_CPU_ISA`).
    fn start_isa(isa: &str, extra: &[&str]) -> Server {
        Server::spawn(&demo_model(), extra, Some(isa))
    }

    fn spawn(model: &std::path::Path, extra: &[&str], isa: Option<&str>) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rgml"));
        if let Some(isa) = isa {
            command.env("RGML_CPU_ISA", isa);
        }
        let mut child = command
            .args(["serve", "-m"])
            .arg(model)
            .args(["--port", "0", "-t", "2"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start rgml serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("rgml serve exited before listening")
                .expect("read its stderr");
            if let Some(at) = line.find("http://") {
                let url = line[at..].split_whitespace().next().unwrap_or_default();
                break url.to_string();
            }
        };
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Server { child, url }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        self.child.wait().expect("wait for rgml serve")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `rgml run --temp 0 -n N` prints after the prompt (with `chat`, for the user's
/// message).
fn run_greedy(prompt: &str, chat: bool, n: usize) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rgml"));
    cmd.args(["run", "-m"]).arg(demo_model()).args([
        "--temp",
        "0",
        "-t",
        "2",
        "-n",
        &n.to_string(),
        "-p",
        prompt,
    ]);
    if chat {
        cmd.arg("--chat");
    }
    let out = cmd.stderr(Stdio::null()).output().expect("rgml run");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let text = text.strip_suffix('\n').unwrap_or(&text);
    match chat {
        true => text.to_string(),
        false => text
            .strip_prefix(prompt)
            .expect("run echoes the prompt")
            .to_string(),
    }
}

const MAX_TOKENS: usize = 32;
const COMPLETIONS: [&str; 2] = ["Once upon a time", "The three primary colours are"];
const CHATS: [&str; 8] = [
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
    "What is 2 + 2?",
    "Give me a word that rhymes with cat.",
    "What colour is the sky?",
    "Who wrote Romeo and Juliet?",
];

#[test]
fn openai_clients_and_the_chat_page_in_chromium() {
    let Some(python) = python() else { return };
    let expected = serde_json::json!({
        "model": common::DEMO_STEM,
        "max_tokens": MAX_TOKENS,
        "completion": COMPLETIONS.iter().map(|p| (p.to_string(), run_greedy(p, false, MAX_TOKENS).into()))
            .collect::<serde_json::Map<_, _>>(),
        "chat": CHATS.iter().map(|p| (p.to_string(), run_greedy(p, true, MAX_TOKENS).into()))
            .collect::<serde_json::Map<_, _>>(),
    });
    let file =
        std::env::temp_dir().join(format!("rgml-serve-expected-{}.json", std::process::id()));
    std::fs::write(&file, expected.to_string()).expect("write the expectations");
    let mut server = Server::start(&["-np", "4", "-c", "512"]);
    let scripts = root().join("tests/serve");
    let client = Command::new(&python)
        .arg(scripts.join("openai_client.py"))
        .arg(&server.url)
        .arg(&file)
        .status()
        .expect("run the openai client");
    let _ = std::fs::remove_file(&file);
    assert!(
        client.success(),
        "the openai client tests failed (see above)"
    );
    let browser = Command::new(&python)
        .arg(scripts.join("browser.py"))
        .arg(&server.url)
        .status()
        .expect("run the browser test");
    assert!(browser.success(), "the chat page test failed (see above)");
    assert!(server.terminate().success());
}

/// With `--api-key`, the chat page asks for the key, sends it, and chats.
#[test]
fn the_chat_page_asks_for_the_api_key() {
    let Some(python) = python() else { return };
    let mut server = Server::start(&["-np", "1", "-c", "512", "--api-key", "s3cret"]);
    let browser = Command::new(&python)
        .arg(root().join("tests/serve/browser.py"))
        .arg(&server.url)
        .arg("s3cret")
        .status()
        .expect("run the browser test");
    assert!(
        browser.success(),
        "the chat page with a key failed (see above)"
    );
    assert!(server.terminate().success());
}

/// Tools, structured output and embeddings through the `openai` package
/// (`tests/serve/openai_structured.py`): forced tool calls whose arguments validate against the
/// tool's schema, 20 seeded `json_schema` answers that validate, embeddings of norm 1, an
/// agent's loop (call, tool result, answer), and 400s for bad fields; on a server with Qwen
/// 2.5's template (Hermes tool calls).
#[test]
fn openai_tools_structured_output_and_embeddings() {
    let Some(python) = python() else { return };
    let template =
        root().join("crates/rgml-llm/tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    let template = template.to_str().expect("a UTF-8 path");
    let mut server = Server::start(&["-np", "2", "-c", "1024", "--chat-template-file", template]);
    let client = Command::new(&python)
        .arg(root().join("tests/serve/openai_structured.py"))
        .arg(&server.url)
        .arg(common::DEMO_STEM)
        .status()
        .expect("run the openai client");
    assert!(
        client.success(),
        "the structured-output client tests failed (see above)"
    );
    assert!(server.terminate().success());
}

/// llama-server's greedy chat answers on the demo model with its `--jinja` default (the
/// model's own template; `scripts/gen_serve_fixtures.py`): plain turns, a default system
/// message, JSON-schema and JSON-object answers (in a ```json fence, one cut short; under Qwen
/// 3's template, which lets a model reason first, and DeepSeek R1's, which opens the reasoning
/// in the prompt), and with Qwen 2.5's template (the demo
/// model's has no tool-call format) required and named tool calls and a tool result. Each request goes to a
/// fresh `rgml serve` in the fixture's arithmetic, as each went to a fresh llama-server, and
/// gives the same message, finish reason and token counts.
#[test]
fn greedy_chat_answers_are_llama_servers() {
    let path = root().join("crates/rgml-cli/tests/fixtures/serve/llama-server-avx2.json");
    let text = std::fs::read_to_string(&path).expect("llama-server fixture");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
    let isa = fixture["isa"].as_str().expect("isa");
    if !common::runnable_isas().contains(&isa) {
        eprintln!("this CPU cannot run the {isa} arithmetic: llama-server's answers not compared");
        return;
    }
    let cases = fixture["cases"].as_object().expect("cases");
    for (name, case) in cases {
        let template = case["template"].as_str().map(|t| root().join(t));
        let extra: Vec<&str> = match &template {
            Some(file) => vec!["--chat-template-file", file.to_str().expect("a UTF-8 path")],
            None => Vec::new(),
        };
        let server = Server::start_isa(isa, &extra);
        let (status, got) = post(
            &server.url,
            "/v1/chat/completions",
            &case["request"].to_string(),
        );
        assert_eq!(status, 200, "{name}: {got}");
        let choice = &got["choices"][0];
        let mut message = choice["message"].clone();
        let message = message.as_object_mut().expect("a message");
        // The reasoning as text: llama.cpp's parser keeps the whitespace around it that its
        // template's tags do not name, rgml trims it.
        let reasoning = |m: &serde_json::Value| {
            m["reasoning_content"]
                .as_str()
                .map(|r| r.trim().to_string())
        };
        assert_eq!(
            reasoning(&serde_json::Value::Object(message.clone())),
            reasoning(&case["message"]),
            "{name}: reasoning"
        );
        message.retain(|k, _| k == "content" || k == "tool_calls");
        let mut want = case["message"].clone();
        want.as_object_mut()
            .expect("a fixture message")
            .retain(|k, _| k == "content" || k == "tool_calls");
        for call in message
            .get_mut("tool_calls")
            .and_then(|c| c.as_array_mut())
            .into_iter()
            .flatten()
        {
            call.as_object_mut().map(|c| c.remove("id"));
        }
        assert_eq!(serde_json::Value::Object(message.clone()), want, "{name}");
        assert_eq!(choice["finish_reason"], case["finish_reason"], "{name}");
        for count in ["prompt_tokens", "completion_tokens"] {
            assert_eq!(got["usage"][count], case["usage"][count], "{name}: {count}");
        }
    }
}

/// A POST of `body` to `path` in raw HTTP: the status and the JSON answer.
fn post(url: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    request(url, "POST", path, body)
}

/// A `method` request of `body` to `path` in raw HTTP: the status and the JSON answer.
fn request(url: &str, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let addr = url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(addr).expect("connect");
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    let body = match head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        true => dechunk(body),
        false => body.to_string(),
    };
    let json = serde_json::from_str(&body).expect("a JSON body");
    (status.expect("a status line"), json)
}

/// The data of a chunked HTTP body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[test]
fn a_bert_model_serves_embeddings_and_refuses_to_generate() {
    let model = common::random_model_file(rgml_testmodels::Arch::Bert, "serve", "bert");
    let server = Server::start_model(&model, &["-np", "1"]);
    let prompts = ["Hello, world", "naïve café"];
    let body = serde_json::json!({ "input": prompts }).to_string();
    let (status, answer) = post(&server.url, "/v1/embeddings", &body);
    assert_eq!(status, 200, "{answer}");
    for (i, prompt) in prompts.iter().enumerate() {
        // `rgml embed` is held to llama.cpp's vectors (tests/embeddings.rs): the server must
        // give its vector, pooled by the file's CLS and normalised.
        let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
            .args(["embed", "-t", "2", "-p", prompt, "-m"])
            .arg(&model)
            .output()
            .expect("rgml embed");
        let cli: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(
            answer["data"][i]["embedding"], cli["embedding"],
            "{prompt:?}"
        );
    }
    let chat = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
    let (status, answer) = post(&server.url, "/v1/chat/completions", chat);
    assert_eq!(status, 501, "{answer}");
    assert_eq!(answer["error"]["type"], "not_supported_error");
    let long = serde_json::json!({ "input": "word ".repeat(600) }).to_string();
    let (status, answer) = post(&server.url, "/v1/embeddings", &long);
    assert_eq!(status, 400, "{answer}");
    let (status, props) = request(&server.url, "GET", "/props", "");
    assert_eq!(status, 200, "{props}");
    assert_eq!(props["model_path"], model.display().to_string());
}

/// A streamed request in raw HTTP: the response so far after `wait`.
fn open_stream(url: &str, max_tokens: usize) -> TcpStream {
    let addr = url.trim_start_matches("http://");
    let mut conn = TcpStream::connect(addr).expect("connect");
    let body = format!(
        r#"{{"prompt": "Once upon a time", "max_tokens": {max_tokens}, "stream": true, "temperature": 0}}"#
    );
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    conn
}

#[test]
fn sigterm_ends_running_streams_cleanly() {
    let mut server = Server::start(&["-np", "2", "-c", "1024"]);
    let mut conn = open_stream(&server.url, 900);
    // Wait for the first token's event.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = conn.read(&mut buf).expect("read");
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    let status = server.terminate();
    conn.read_to_end(&mut seen).expect("read the rest");
    let text = String::from_utf8_lossy(&seen);
    assert!(status.success(), "rgml serve exited with {status}");
    // The body is chunked: the last event, not the last bytes, is `[DONE]`.
    let last_event = text.rsplit("data: ").next().unwrap_or_default();
    assert!(
        text.contains("\"finish_reason\":\"stop\"") && last_event.starts_with("[DONE]"),
        "the stream did not end cleanly: ...{}",
        &text[text.len().saturating_sub(400)..]
    );
    // Not all 900 tokens: the stream was cut short.
    assert!(text.matches("\"text\"").count() < 900);
}

#[test]
fn a_bad_address_or_slot_count_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(["serve", "-np", "0"])
        .output()
        .expect("rgml serve");
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(["serve", "-m"])
        .arg(demo_model())
        .args(["--host", "256.1.1.1"])
        .output()
        .expect("rgml serve");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
}
