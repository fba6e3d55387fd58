//! Standard output for code that prints from inside callbacks (which cannot return an I/O
//! error): the first failed write is kept, later ones are skipped, and the caller turns it
//! into the command's error afterwards. A closed pipe or a full disk then ends the command
//! with [`CliError::Output`] instead of a panic.

use crate::error::CliError;
use std::io::Write;

/// Locked stdout that remembers its first write error.
pub struct Out {
    stdout: std::io::StdoutLock<'static>,
    error: Option<std::io::Error>,
}

impl Out {
    /// Standard output, locked for this command.
    pub fn new() -> Out {
        Out {
            stdout: std::io::stdout().lock(),
            error: None,
        }
    }

    /// Write `args` and a newline, unless an earlier write failed.
    pub fn line(&mut self, args: std::fmt::Arguments<'_>) {
        if self.error.is_none() {
            if let Err(e) = self
                .stdout
                .write_fmt(args)
                .and_then(|()| self.stdout.write_all(b"\n"))
            {
                self.error = Some(e);
            }
        }
    }

    /// Write `text` as is, unless an earlier write failed.
    pub fn text(&mut self, text: &str) {
        if self.error.is_none() {
            if let Err(e) = self.stdout.write_all(text.as_bytes()) {
                self.error = Some(e);
            }
        }
    }

    /// Flush; the first write error, if any.
    pub fn finish(mut self) -> Result<(), CliError> {
        if let Some(e) = self.error.take() {
            return Err(e.into());
        }
        self.stdout.flush()?;
        Ok(())
    }
}
