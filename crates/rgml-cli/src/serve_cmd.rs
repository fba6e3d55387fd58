//! `rgml serve`: the OpenAI-compatible HTTP server of `rgml-serve` on a model, with one
//! sequence per slot decoded in one batch.
//!
//! This module turns flags into the engine's and the HTTP layer's options, runs the server on
//! a tokio runtime, and ends it on SIGTERM or Ctrl-C (running streams end cleanly first).

use crate::error::CliError;
use crate::model_cmds::ModelArgs;
use clap::Args;
use rgml_llm::embed::Pooling;
use rgml_serve::engine::{Engine, EngineOptions, PrefixReuse};
use rgml_serve::http::HttpOptions;
use rgml_serve::Generator;
use std::sync::Arc;
use std::time::Duration;

/// Flags of `rgml serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Slots: requests decoded together, each with its own `-c` tokens of context (llama-server
    /// divides its `-c` among its slots; here each slot has all of it). Also `-np`.
    #[arg(long = "parallel", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    parallel: u16,
    /// The model's name in the API (default: the file's name without `.gguf`).
    #[arg(long)]
    alias: Option<String>,
    /// Requests waiting for a slot at most; more get HTTP 429.
    #[arg(long, default_value_t = 1024)]
    max_queue: usize,
    /// Open connections at most; more wait to be accepted.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// What a new request may keep of a slot's cache: `exact` (whole `--ubatch` pieces of an
    /// earlier prompt: outputs bit for bit those of a fresh request, as `rgml run`'s) or `any`
    /// (the whole common prefix, e.g. a chat's history: faster, last bits may differ).
    #[arg(long, default_value = "exact", value_parser = ["exact", "any"])]
    prefix_reuse: String,
    /// A Jinja chat template to use instead of the model's `tokenizer.chat_template`.
    #[arg(long)]
    chat_template_file: Option<std::path::PathBuf>,
    /// One of llama.cpp's 54 built-in chat formats by name (chatml, llama3, mistral-v7, ...)
    /// or a Jinja template's text, instead of the model's (llama-server's `--chat-template`).
    #[arg(long)]
    chat_template: Option<String>,
    /// Run the model's `tokenizer.chat_template` as Jinja: the default, as in llama-server
    /// (accepted for its command lines).
    #[arg(long)]
    jinja: bool,
    /// Recognise the model's chat format from markers in its template instead of running the
    /// template as Jinja (llama-server's `--no-jinja`).
    #[arg(long, conflicts_with = "jinja")]
    no_jinja: bool,
    /// Require `Authorization: Bearer KEY` on every route but `GET /health` and the chat page
    /// (llama-server's `--api-key`).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Recurrent-state checkpoints each slot keeps, for a model with recurrent layers (Qwen3.5):
    /// the state after each prompt, so that a next turn sharing only part of what the slot
    /// holds goes back to one instead of evaluating its whole prompt (llama-server's flag and
    /// default). 0: none.
    #[arg(
        long = "ctx-checkpoints",
        alias = "swa-checkpoints",
        default_value_t = 8
    )]
    ctx_checkpoints: usize,
    /// How `/v1/embeddings` pools a sequence's hidden states (llama.cpp's `--pooling`):
    /// `mean`, `cls` or `last`; default: as the model file says, else by the last token.
    #[arg(long, value_parser = Pooling::NAMES)]
    pooling: Option<String>,
    /// The origins browser pages may call from, comma-separated (`scheme://host[:port]`;
    /// llama-server's flag). Default: any (`*`).
    #[arg(long, value_delimiter = ',')]
    cors_origins: Option<Vec<String>>,
    /// Seconds a connection may go without a byte of its next request, or a client without
    /// taking a byte of its response, before it is closed (llama-server's `--timeout`; a
    /// response being computed or streamed is never cut). 0: never.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Largest request body, in KiB.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..))]
    max_body_kib: u32,
}

/// Serve until SIGTERM or Ctrl-C.
pub fn run(args: ServeArgs) -> Result<bool, CliError> {
    let chat = crate::model_cmds::chat_choice(
        args.chat_template.as_deref(),
        args.chat_template_file.as_deref(),
    )?;
    let model = args.model.load()?;
    let n_slots = usize::from(args.parallel);
    let mut options = args.model.session_options(args.model.ctx_size(), n_slots);
    // An encoder's slots never generate: its session computes embeddings.
    options.embeddings = model.config.kind.is_encoder();
    let session = args.model.session_with(&model, &options)?;
    let model_id = args.alias.clone().unwrap_or_else(|| {
        let stem = args.model.model.file_stem().unwrap_or_default();
        stem.to_string_lossy().into_owned()
    });
    let engine = Engine::start(
        session,
        EngineOptions {
            model_id: model_id.clone(),
            max_queue: args.max_queue,
            max_batch: args.model.ubatch,
            prefix_reuse: match args.prefix_reuse.as_str() {
                "any" => PrefixReuse::Any,
                _ => PrefixReuse::Exact,
            },
            chat_template: chat.template,
            chat_format: chat.format,
            jinja: !args.no_jinja,
            ctx_checkpoints: args.ctx_checkpoints,
            embedding_session: args.model.session_options(args.model.ctx_size(), 1),
            pooling: args.pooling.as_deref().and_then(Pooling::from_name),
        },
    )
    .map_err(|e| CliError::Message(format!("starting the engine: {e}")))?;
    let engine = Arc::new(engine);
    let http = HttpOptions {
        max_body_bytes: (args.max_body_kib as usize).saturating_mul(1024),
        max_connections: args.max_connections as usize,
        log_warnings: true,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        cors_origins: args
            .cors_origins
            .clone()
            .filter(|list| !list.iter().any(|o| o == "*")),
        timeout: (args.timeout > 0).then(|| Duration::from_secs(args.timeout)),
        model_path: Some(args.model.model.display().to_string()),
        ..Default::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Message(format!("starting the runtime: {e}")))?;
    let endpoint = format!("{}:{}", args.host, args.port);
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&endpoint)
            .await
            .map_err(|e| CliError::Message(format!("cannot listen on {endpoint}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| CliError::Message(format!("{endpoint}: {e}")))?;
        crate::note!(
            "rgml serve: {model_id} on http://{local} ({n_slots} slots of {} tokens)",
            args.model.ctx_size()
        );
        let generator: Arc<dyn Generator> = engine.clone();
        rgml_serve::http::serve(listener, generator, http, shutdown_signal())
            .await
            .map_err(|e| CliError::Message(format!("serving on {endpoint}: {e}")))
    });
    engine.shutdown();
    engine.join();
    crate::note!("rgml serve: stopped");
    args.model.finish()?;
    served.map(|()| true)
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    crate::note!("rgml serve: shutting down (running requests end first)");
}
