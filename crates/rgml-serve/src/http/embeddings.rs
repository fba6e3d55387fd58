//! `POST /v1/embeddings` (OpenAI's): each input's pooled, normalised embedding, as floats or
//! base64 of their little-endian bytes, with the tokens counted in `usage`.

use super::error::ApiError;
use super::request::{parse_embeddings, EmbeddingInput};
use super::tokens::{not_served, tokenizer};
use super::HttpOptions;
use crate::generator::Generator;
use base64::Engine as _;
use rgml_llm::{EncodeOptions, TokenId};
use serde_json::{json, Value};

/// The route's answer for `body` (blocking: the embeddings are computed here).
pub(crate) fn embeddings(
    generator: &dyn Generator,
    body: &[u8],
    _options: &HttpOptions,
) -> Result<Value, ApiError> {
    let (request, warnings) = parse_embeddings(body, generator.model_id())?;
    let inputs = match request.input {
        EmbeddingInput::Tokens(ids) => vec![ids],
        EmbeddingInput::TokenLists(lists) => lists,
        EmbeddingInput::Text(text) => vec![encode(generator, &text)?],
        EmbeddingInput::Texts(texts) => texts
            .iter()
            .map(|t| encode(generator, t))
            .collect::<Result<_, _>>()?,
    };
    if inputs.is_empty() {
        return Err(ApiError::bad_request(
            "input must not be empty",
            Some("input"),
        ));
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let vectors = generator
        .embed(&inputs)
        .ok_or_else(|| not_served("embeddings"))?
        .map_err(|e| ApiError::from_submit(&e, "input"))?;
    let base64 = request.encoding_format.as_deref() == Some("base64");
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match base64 {
                true => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                false => json!(v),
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    let mut answer = json!({
        "object": "list",
        "data": data,
        "model": generator.model_id(),
        "usage": { "prompt_tokens": n_tokens, "total_tokens": n_tokens },
    });
    if !warnings.is_empty() {
        answer["warnings"] = json!(warnings);
    }
    Ok(answer)
}

/// `text`'s tokens as a prompt (special tokens added and parsed, as llama-server's).
fn encode(generator: &dyn Generator, text: &str) -> Result<Vec<TokenId>, ApiError> {
    Ok(tokenizer(generator)?.encode(text, EncodeOptions::prompt()))
}
