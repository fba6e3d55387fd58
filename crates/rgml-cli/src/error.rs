//! The command line's error: the libraries' typed errors kept whole (so their causes can be
//! printed), or a message about the command's own arguments.

use std::error::Error as _;

/// What a command failed with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// From the model layer (loading, sessions, tokenizer).
    #[error(transparent)]
    Llm(#[from] rgml_llm::LlmError),
    /// From the core or a backend.
    #[error(transparent)]
    Core(#[from] rgml::Error),
    /// From the GGUF reader.
    #[error(transparent)]
    Gguf(#[from] rgml_gguf::GgufError),
    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
    /// A bad argument or a condition of the command itself.
    #[error("{0}")]
    Message(String),
}

impl From<String> for CliError {
    fn from(message: String) -> Self {
        CliError::Message(message)
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        CliError::Message(message.to_string())
    }
}

/// The error and each cause that its message does not already include, one per line.
pub fn report(error: &CliError) -> String {
    let mut text = format!("error: {error}");
    let mut cause = error.source();
    while let Some(c) = cause {
        let line = c.to_string();
        if !text.contains(&line) {
            text.push_str(&format!("\n  caused by: {line}"));
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_printed_once_each() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let err = CliError::from(rgml_llm::LlmError::Load {
            path: "m.gguf".into(),
            source: Box::new(rgml_llm::LlmError::Gguf(rgml_gguf::GgufError::Io {
                path: "m.gguf".into(),
                source: io,
            })),
        });
        let text = report(&err);
        assert!(text.starts_with("error: m.gguf: "), "{text}");
        assert_eq!(text.matches("denied").count(), 1, "{text}");
    }
}
