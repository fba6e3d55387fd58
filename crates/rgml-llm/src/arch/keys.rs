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

    /// A per-layer array of booleans (or of 32-bit integers, 0 or not) for the first
    /// `n_layer` layers, as llama.cpp's `get_key_or_arr` reads one; `None` where the value is
    /// not an array.
    pub(super) fn layer_flags(&self, k: &str, n_layer: usize) -> Result<Option<Vec<bool>>> {
        let Some(Value::Array(items)) = self.value(k) else {
            return Ok(None);
        };
        let bad = |what: &str| LlmError::BadConfig(format!("{}: {what}", self.name(k)));
        if items.len() < n_layer {
            return Err(bad(&format!(
                "{} entries for {n_layer} layers",
                items.len()
            )));
        }
        items
            .iter()
            .take(n_layer)
            .map(|v| match (v, v.as_i64()) {
                (Value::Bool(b), _) => Ok(*b),
                // llama.cpp reads u32/i32 arrays too (llama_model_saver writes u32).
                (Value::U32(_) | Value::I32(_), Some(n)) => Ok(n != 0),
                _ => Err(bad("an array of booleans or 32-bit integers expected")),
            })
            .collect::<Result<Vec<bool>>>()
            .map(Some)
    }

    /// One integer for every one of `n_layer` layers, or an array of one per layer (llama.cpp's
    /// `get_key_or_arr`).
    pub(super) fn usize_per_layer(&self, k: &str, n_layer: usize) -> Result<Vec<usize>> {
        match self.usize_array(k, n_layer)? {
            Some(per_layer) => Ok(per_layer),
            None => Ok(vec![self.usize(k)?; n_layer]),
        }
    }

    /// The first `n` entries of an array of integers (`None` where the value is not an
    /// array).
    pub(super) fn usize_array(&self, k: &str, n: usize) -> Result<Option<Vec<usize>>> {
        let Some(Value::Array(items)) = self.value(k) else {
            return Ok(None);
        };
        let bad = |what: &str| LlmError::BadConfig(format!("{}: {what}", self.name(k)));
        if items.len() < n {
            return Err(bad(&format!("{} entries, {n} expected", items.len())));
        }
        items
            .iter()
            .take(n)
            .map(|v| {
                let x = v
                    .as_u64()
                    .ok_or_else(|| bad("an array of integers expected"))?;
                usize::try_from(x).map_err(|_| bad("too large"))
            })
            .collect::<Result<Vec<usize>>>()
            .map(Some)
    }
}
