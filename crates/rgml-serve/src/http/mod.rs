//! The HTTP layer of `rgml serve`: OpenAI's routes over any [`Generator`], limits on bodies
//! and connections, CORS, and graceful shutdown.
//!
//! This module owns everything between a TCP connection and [`Generator::submit`]: parsing
//! and checking requests (`request`), OpenAI's response shapes (`response`), server-sent
//! events (`stream`), errors as JSON bodies (`error`), `/metrics` (`metrics`), the
//! connection limit (`listener`) and the routes themselves (`routes`). It never touches the
//! model.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
//! `GET /v1/models/{id}`, `GET /health`, `GET /metrics`, and the chat page at `GET /`.

mod embeddings;
mod error;
mod listener;
mod metrics;
mod request;
mod response;
mod routes;
mod stream;
mod tokens;

use crate::generator::Generator;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Limits and defaults of the HTTP layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpOptions {
    /// Largest request body accepted, in bytes (larger: 413). Default 8 MiB.
    pub max_body_bytes: usize,
    /// Connections served at once; more wait in the accept queue (0 is taken as 1).
    /// Default 256.
    pub max_connections: usize,
    /// `max_tokens` of a request that gives none (`None`: until the end of generation or
    /// of the slot's context). Default `None`.
    pub max_tokens_default: Option<usize>,
    /// Print each request's warnings (fields answered as if absent) to stderr. Default off.
    pub log_warnings: bool,
    /// Every route but `GET /health` and the chat page asks for `Authorization: Bearer KEY`
    /// (llama-server's `--api-key`). Default none.
    pub api_key: Option<String>,
    /// The origins browsers may call from (`--cors-origins`): `None`, any (`*`); else only
    /// these (`scheme://host[:port]`), each answered with its own name and `Vary: Origin`.
    /// Default any.
    pub cors_origins: Option<Vec<String>>,
    /// How long a connection may go without a byte of its next request, or a client without
    /// taking a byte of its response, before it is closed (llama-server's `--timeout`;
    /// `None`: never). A response being computed or streamed is never cut. Default 600 s.
    pub timeout: Option<std::time::Duration>,
    /// The model file's path, as `/props` reports it (`model_path`). Default none.
    pub model_path: Option<String>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            max_body_bytes: 8 << 20,
            max_connections: 256,
            max_tokens_default: None,
            log_warnings: false,
            api_key: None,
            cors_origins: None,
            timeout: Some(std::time::Duration::from_secs(600)),
            model_path: None,
        }
    }
}

/// The routes over `generator`, with `options`' body limit and defaults. `/health` reports
/// shutdown only when served by [`serve`]; `/metrics` then also counts open connections.
pub fn router(generator: Arc<dyn Generator>, options: &HttpOptions) -> axum::Router {
    routes::build(routes::AppState::new(generator, options, None))
}

/// Serves `generator` on `listener` until `shutdown` resolves.
///
/// At most `options.max_connections` connections are open at once. When `shutdown`
/// resolves, `/health` turns to 503, the generator is told to shut down (it ends running
/// requests with a last token and fails queued ones), no new connection is accepted, and
/// this returns once every response in flight has ended, streams included (they end with
/// their finish chunk and `data: [DONE]`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    generator: Arc<dyn Generator>,
    options: HttpOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let connections = listener::Connections::new(options.max_connections);
    let state = routes::AppState::new(generator.clone(), &options, Some(connections.clone()));
    let shutting_down = state.shutting_down.clone();
    let app = routes::build(state);
    let signal = async move {
        shutdown.await;
        shutting_down.store(true, Ordering::Release);
        generator.shutdown();
    };
    let listener = listener::LimitedListener::new(listener, connections, options.timeout);
    let app = app.into_make_service_with_connect_info::<listener::Activity>();
    axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await
}

/// Whether shutdown began (shared by the routes and [`serve`]'s signal).
type ShutdownFlag = Arc<AtomicBool>;
