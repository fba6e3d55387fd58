//! Typed reads of an architecture's `{arch}.*` metadata keys, with errors naming the key.

use crate::error::{LlmError, Result};
use rgml_gguf::{GgufFile, Value};

/// The `{arch}.*` keys of one file.
pub(super) struct Keys<'a> {
    pub(super) gguf: &'a GgufFile,
    arch: &'a str,
}

impl<'a> Keys<'a> {
    pub(super) fn new(gguf: &'a GgufFile, arch: &'a str) -> Keys<'a> {
        Keys { gguf, arch }
    }

    /// The full key name of `k`.
    pub(super) fn name(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub(super) fn has(&self, k: &str) -> bool {
        self.gguf.get(&self.name(k)).is_some()
    }

    pub(super) fn value(&self, k: &str) -> Option<&'a Value> {
        self.gguf.get(&self.name(k))
    }

    pub(super) fn usize(&self, k: &str) -> Result<usize> {
        let v = self.gguf.get_u64(&self.name(k))?;
        usize::try_from(v)
            .map_err(|_| LlmError::BadConfig(format!("{} = {v} is too large", self.name(k))))
    }

    pub(super) fn usize_or(&self, k: &str, default: usize) -> Result<usize> {
        if self.has(k) {
            self.usize(k)
        } else {
            Ok(default)
        }
    }

    pub(super) fn f32(&self, k: &str) -> Result<f32> {
        Ok(self.gguf.get_f32(&self.name(k))?)
    }

    pub(super) fn f32_opt(&self, k: &str) -> Result<Option<f32>> {
        if self.has(k) {
            self.f32(k).map(Some)
        } else {
            Ok(None)
        }
    }
}
