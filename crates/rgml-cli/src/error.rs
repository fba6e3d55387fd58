//! The command line's error: the libraries' typed errors kept whole (so their causes can be
//! printed), or a message about the command's own arguments; and how each ends the process
//! (exit status 2 for a usage error, 1 for a runtime error, 141 and no message for a closed
//! output pipe, as the shell reports for Unix tools that SIGPIPE ended).

use std::error::Error as _;

/// What a command failed with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// From the model layer (loading, sessions, tokenizer).
    #[error(transparent)]
    Llm(#[from] rgml_llm::LlmError),
    /// From `quantize`.
    #[error(transparent)]
    Quantize(#[from] rgml_llm::QuantizeError),
    /// From the core or a backend.
    #[error(transparent)]
    Core(#[from] rgml::Error),
    /// From the GGUF reader.
    #[error(transparent)]
    Gguf(#[from] rgml_gguf::GgufError),
    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
    /// A bad argument, flag or environment variable (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// A condition of the command itself at run time.
    #[error("{0}")]
    Message(String),
}

/// Exit status for a usage error.
pub const EXIT_USAGE: u8 = 2;
/// Exit status for a runtime error.
pub const EXIT_RUNTIME: u8 = 1;
/// Exit status when the reader of the output went away (128 + SIGPIPE).
pub const EXIT_BROKEN_PIPE: u8 = 141;

impl CliError {
    /// A usage error with this message.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::Usage(message.into())
    }

    /// Whether the output's reader went away (`rgml ... | head -1`): not worth a message.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// The process's exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            _ if self.is_broken_pipe() => EXIT_BROKEN_PIPE,
            CliError::Usage(_) => EXIT_USAGE,
            _ => EXIT_RUNTIME,
        }
    }

    /// What to change, for errors whose fix is a flag.
    pub fn hint(&self) -> Option<&'static str> {
        use rgml_llm::{LlmError, MemoryUse};
        match self {
            CliError::Llm(LlmError::OutOfMemory { what, .. }) => Some(match what {
                MemoryUse::KvCache => "lower the context length (-c)",
                MemoryUse::Compute => "lower the context length (-c) or the micro-batch (--ubatch)",
                _ => {
                    "offload fewer layers (-ngl) or place the model on devices with more free \
                     memory (--device, --tensor-split)"
                }
            }),
            CliError::Llm(LlmError::ContextFull { .. }) => Some("raise the context length (-c)"),
            _ => None,
        }
    }
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
    if let Some(hint) = error.hint() {
        text.push_str(&format!("\n  hint: {hint}"));
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
