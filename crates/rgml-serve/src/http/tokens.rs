//! llama-server's token and template routes: `POST /tokenize` (text to ids, optionally with
//! each token's piece), `POST /detokenize` (ids to text) and `POST /apply-template` (a chat
//! request's messages to the prompt the model would get), over the generator's tokenizer and
//! chat template.

use super::error::ApiError;
use super::request::{parse_chat, parse_token_route, DetokenizeRequest, TokenizeRequest};
use super::HttpOptions;
use crate::generator::Generator;
use axum::http::StatusCode;
use rgml_llm::{EncodeOptions, Tokenizer};
use serde_json::{json, Value};

/// A route this generator cannot serve (it has no tokenizer, template or embeddings): 501.
pub(super) fn not_served(what: &str) -> ApiError {
    ApiError::client(
        StatusCode::NOT_IMPLEMENTED,
        format!("this server has no {what}"),
    )
}

/// The generator's tokenizer, or the 501 of a route that needs one.
pub(super) fn tokenizer(generator: &dyn Generator) -> Result<&Tokenizer, ApiError> {
    generator.tokenizer().ok_or_else(|| not_served("tokenizer"))
}

/// `/tokenize`: `{"tokens": [ids]}`, or with `with_pieces` `{"tokens": [{"id", "piece"}]}`
/// where a piece that is not whole UTF-8 is given as its bytes.
pub(crate) fn tokenize(
    generator: &dyn Generator,
    body: &[u8],
    _options: &HttpOptions,
) -> Result<Value, ApiError> {
    let request: TokenizeRequest = parse_token_route(body)?;
    let tok = tokenizer(generator)?;
    let options = EncodeOptions {
        add_special: request.add_special,
        parse_special: request.parse_special,
    };
    let ids = tok.encode(&request.content, options);
    if !request.with_pieces {
        return Ok(json!({ "tokens": ids }));
    }
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = tok.token_to_piece(id, true).unwrap_or_default();
            let piece = match std::str::from_utf8(bytes) {
                Ok(text) => json!(text),
                Err(_) => json!(bytes),
            };
            json!({ "id": id, "piece": piece })
        })
        .collect();
    Ok(json!({ "tokens": tokens }))
}

/// `/detokenize`: `{"content": text}`; an id outside the vocabulary is the client's error.
pub(crate) fn detokenize(
    generator: &dyn Generator,
    body: &[u8],
    _options: &HttpOptions,
) -> Result<Value, ApiError> {
    let request: DetokenizeRequest = parse_token_route(body)?;
    let tok = tokenizer(generator)?;
    let n_vocab = tok.n_vocab();
    if let Some(id) = request.tokens.iter().find(|&&id| id as usize >= n_vocab) {
        return Err(ApiError::bad_request(
            format!("token {id} is outside the vocabulary of {n_vocab}"),
            Some("tokens"),
        ));
    }
    let bytes = tok
        .decode_bytes(&request.tokens, true)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("tokens")))?;
    Ok(json!({ "content": String::from_utf8_lossy(&bytes) }))
}

/// `/apply-template`: `{"prompt": text}` for a chat request's messages (and tools).
pub(crate) fn apply_template(
    generator: &dyn Generator,
    body: &[u8],
    options: &HttpOptions,
) -> Result<Value, ApiError> {
    let parsed = parse_chat(body, generator.model_id(), options)?;
    let prompt = generator
        .apply_template(&parsed.request.prompt)
        .ok_or_else(|| not_served("chat template"))?
        .map_err(|e| ApiError::from_submit(&e, "messages"))?;
    Ok(json!({ "prompt": prompt }))
}
