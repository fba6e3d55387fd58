//! Grammar-constrained sampling: llama.cpp's GBNF grammars ([`gbnf`]) and JSON Schemas
//! ([`schema`], turned into GBNF as llama.cpp's `json_schema_to_grammar` does), compiled to a
//! [`Grammar`]; a [`Matcher`] follows one generation through it byte by byte and says which
//! tokens of a vocabulary ([`TokenTrie`]) may come next.
//!
//! Floors: `rules` (the compiled form) under `gbnf` (text to rules) and `matcher` (stacks and
//! states), `vocab` over `matcher`; `schema` writes GBNF text over `pattern` and `numeric`.

pub mod gbnf;
mod matcher;
mod numeric;
mod pattern;
mod rules;
pub mod schema;
mod vocab;

pub use matcher::{Matcher, MAX_STACKS};
pub use rules::{Grammar, MAX_TERMS};
pub use vocab::TokenTrie;

use std::sync::{Arc, OnceLock};

/// Why a grammar or a schema was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrammarError {
    /// The GBNF text does not parse.
    #[error("grammar: {what} at line {line}, column {col}")]
    Parse {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in bytes).
        col: usize,
        /// What was expected or found.
        what: String,
    },
    /// A rule is used but never defined.
    #[error("grammar: rule `{0}` is not defined")]
    Undefined(String),
    /// There is no `root` rule.
    #[error("grammar: no `root` rule")]
    NoRoot,
    /// A rule can reach itself without reading a character.
    #[error("grammar: rule `{0}` is left-recursive")]
    LeftRecursion(String),
    /// The grammar (with its repetitions written out) is too large.
    #[error("grammar: more than {0} terms")]
    TooLarge(usize),
    /// The JSON schema uses something not supported, or is invalid.
    #[error("JSON schema: {0}")]
    Schema(String),
}

impl Grammar {
    /// The grammar of GBNF `text` (start rule `root`).
    pub fn from_gbnf(text: &str) -> Result<Grammar, GrammarError> {
        gbnf::parse(text)
    }

    /// Any JSON object (OpenAI's `response_format` `json_object`), compiled once.
    pub fn json_object() -> Arc<Grammar> {
        static OBJECT: OnceLock<Arc<Grammar>> = OnceLock::new();
        OBJECT
            .get_or_init(|| {
                let schema = serde_json::json!({"type": "object"});
                // A fixed schema the converter takes: compiled in a test too.
                let grammar = Grammar::from_json_schema(&schema).expect("the object grammar");
                Arc::new(grammar)
            })
            .clone()
    }

    /// The grammar of JSON documents valid under `schema`.
    pub fn from_json_schema(schema: &serde_json::Value) -> Result<Grammar, GrammarError> {
        gbnf::parse(&schema::to_gbnf(schema)?)
    }
}

#[cfg(test)]
mod tests;
