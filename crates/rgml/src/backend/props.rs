//! Plain values devices and backends describe themselves with: a device's type, memory and
//! capabilities, and a backend's `key=value` parameters. A leaf: it imports nothing else of
//! `backend`.

use crate::error::{Error, Result};

/// What kind of processor a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// The host CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// A GPU sharing host memory.
    IntegratedGpu,
    /// An accelerator used alongside the CPU (e.g. a BLAS library).
    Accel,
}

impl DeviceType {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Gpu => "gpu",
            DeviceType::IntegratedGpu => "igpu",
            DeviceType::Accel => "accel",
        }
    }
}

/// Memory figures in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes free now.
    pub free: usize,
    /// Bytes in total.
    pub total: usize,
}

/// Optional capabilities of a device (ggml's `ggml_backend_dev_caps`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Set/get/copy can run asynchronously on its backends.
    pub async_io: bool,
    /// It offers a pinned host buffer type for staging.
    pub host_buffer: bool,
    /// It can wrap host memory as a buffer without copying.
    pub buffer_from_host_ptr: bool,
    /// It supports events.
    pub events: bool,
}

/// `key=value` parameters for a backend, parsed from `"NAME:key=value,key=value"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendParams {
    pairs: Vec<(String, String)>,
}

impl BackendParams {
    /// Parse `"k=v,k2=v2"` (empty string: no parameters).
    pub fn parse(text: &str) -> Result<BackendParams> {
        let mut pairs = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                return Err(Error::InvalidParams {
                    params: text.to_string(),
                    reason: format!("'{item}' is not key=value"),
                });
            };
            if k.trim().is_empty() {
                return Err(Error::InvalidParams {
                    params: text.to_string(),
                    reason: format!("'{item}' has an empty key"),
                });
            }
            pairs.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(BackendParams { pairs })
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key` parsed as `T`, if given.
    pub fn get_parsed<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| Error::InvalidParams {
                params: format!("{key}={v}"),
                reason: format!("cannot parse '{v}' for '{key}'"),
            }),
        }
    }

    /// An error if any key is not in `known`.
    pub fn check_known(&self, known: &[&str]) -> Result<()> {
        match self
            .pairs
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((k, _)) => Err(Error::InvalidParams {
                params: k.clone(),
                reason: format!("unknown key '{k}' (known: {})", known.join(", ")),
            }),
        }
    }

    /// Add or replace a parameter.
    pub fn set(&mut self, key: &str, value: impl ToString) {
        self.pairs.push((key.to_string(), value.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse() {
        let p = BackendParams::parse("n_threads=4, foo = bar").unwrap();
        assert_eq!(p.get("foo"), Some("bar"));
        assert_eq!(p.get_parsed::<usize>("n_threads").unwrap(), Some(4));
        assert!(p.get_parsed::<usize>("foo").is_err());
        assert!(p.check_known(&["n_threads"]).is_err());
        assert!(BackendParams::parse("novalue").is_err());
        assert!(BackendParams::parse("=3").is_err());
        assert_eq!(BackendParams::parse("").unwrap(), BackendParams::default());
    }
}
