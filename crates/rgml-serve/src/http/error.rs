//! Errors as clients see them: a status code and OpenAI's error body
//! `{"error": {"message", "type", "param", "code"}}`. Every failure the HTTP layer reports,
//! including axum's own rejections (body too large, unknown route, wrong method), goes
//! through [`ApiError`], so a client always gets JSON it can parse.

use crate::generator::{request_field, SubmitError};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// OpenAI's error `type`s used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// The request is wrong (400, 404, 405, 413).
    InvalidRequest,
    /// Too many requests wait already (429).
    RateLimit,
    /// The server failed or is going away (500, 503).
    Server,
    /// No or a wrong API key (401).
    Authentication,
    /// What the request asks the server does not do with its model (501).
    NotSupported,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Server => "server_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotSupported => "not_supported_error",
        }
    }
}

/// An error response: status, OpenAI error type, message, the request field at fault and a
/// machine-readable code where there is one.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
    pub(crate) param: Option<String>,
    pub(crate) code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param` (if any).
    pub(crate) fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// A client error with another status (404, 405, 413).
    pub(crate) fn client(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 500 `server_error`: generation failed.
    pub(crate) fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: ErrorKind::Server,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The requested model is not the one served (404 `model_not_found`).
    pub(crate) fn model_not_found(model: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: ErrorKind::InvalidRequest,
            message: format!("the model `{model}` does not exist"),
            param: Some("model".to_owned()),
            code: Some("model_not_found"),
        }
    }

    /// `param` names a feature this server does not have.
    pub(crate) fn unsupported(param: &str, what: &str) -> ApiError {
        ApiError::bad_request(format!("{what} is not supported"), Some(param))
    }

    /// The body of the error (also sent as a server-sent event when a stream fails).
    pub(crate) fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind.as_str(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// A generator's refusal: the client's error (400) unless the server is full (429) or
    /// going away (503). `prompt_param` names the prompt's field in this route.
    pub(crate) fn from_submit(error: &SubmitError, prompt_param: &str) -> ApiError {
        let message = error.to_string();
        match error {
            SubmitError::EmptyPrompt
            | SubmitError::PromptTooLong { .. }
            | SubmitError::ChatTemplate(_) => ApiError::bad_request(message, Some(prompt_param)),
            SubmitError::MaxTokensTooLarge { .. } => {
                ApiError::bad_request(message, Some("max_tokens"))
            }
            SubmitError::InvalidToken { .. } => ApiError::bad_request(message, Some("prompt")),
            SubmitError::InvalidBiasToken { .. } => {
                ApiError::bad_request(message, Some("logit_bias"))
            }
            SubmitError::InvalidSampling { name, .. } => {
                ApiError::bad_request(message, Some(request_field(name)))
            }
            SubmitError::QueueFull(_) => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                kind: ErrorKind::RateLimit,
                message,
                param: None,
                code: None,
            },
            SubmitError::ShuttingDown => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: ErrorKind::Server,
                message,
                param: None,
                code: None,
            },
            SubmitError::Failed(_) => ApiError::server(message),
            SubmitError::EmbeddingsOnly(_) => ApiError {
                status: StatusCode::NOT_IMPLEMENTED,
                kind: ErrorKind::NotSupported,
                message,
                param: None,
                code: None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
