//! The global device registry: backends register their registries here; callers enumerate
//! devices and open backends by name (`"CPU"`, `"Vulkan0:key=value,..."`).
//!
//! The core knows no concrete backend: a program calls each backend crate's `register()` (the
//! CLI does so for the backends it is built with).

use crate::backend::{Backend, BackendParams, DeviceRef, DeviceType};
use crate::error::{Error, Result};
use std::sync::{Arc, RwLock};

/// A provider of devices (ggml's `ggml_backend_reg`).
pub trait Registry: Send + Sync {
    /// Name of the registry (`"CPU"`, `"Vulkan"`).
    fn name(&self) -> &str;
    /// The devices it provides, in a stable order.
    fn devices(&self) -> Vec<DeviceRef>;
}

static REGISTRIES: RwLock<Vec<Arc<dyn Registry>>> = RwLock::new(Vec::new());

/// Add a registry; a second registry with the same name replaces the first.
pub fn register(registry: Arc<dyn Registry>) {
    let mut regs = REGISTRIES.write().unwrap_or_else(|e| e.into_inner());
    regs.retain(|r| r.name() != registry.name());
    regs.push(registry);
}

/// The registered registries.
pub fn registries() -> Vec<Arc<dyn Registry>> {
    REGISTRIES.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Every device of every registry, GPUs first and CPUs last (the scheduler's priority order).
pub fn devices() -> Vec<DeviceRef> {
    let mut devs: Vec<DeviceRef> = registries().iter().flat_map(|r| r.devices()).collect();
    devs.sort_by_key(|d| match d.device_type() {
        DeviceType::Gpu => 0,
        DeviceType::IntegratedGpu => 1,
        DeviceType::Accel => 2,
        DeviceType::Cpu => 3,
    });
    devs
}

/// The device called `name` (case-insensitive). With no backend registered at all, the error
/// says so and what to call (a program registers the backends it links, e.g.
/// `rgml_cpu::register()`).
pub fn device(name: &str) -> Result<DeviceRef> {
    if registries().is_empty() {
        return Err(Error::NoBackendsRegistered {
            name: name.to_string(),
        });
    }
    let devs = devices();
    devs.iter()
        .find(|d| d.name().eq_ignore_ascii_case(name))
        .cloned()
        .ok_or_else(|| Error::UnknownDevice {
            name: name.to_string(),
            available: devs
                .iter()
                .map(|d| d.name().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The first device of `device_type`.
pub fn device_by_type(device_type: DeviceType) -> Option<DeviceRef> {
    devices()
        .into_iter()
        .find(|d| d.device_type() == device_type)
}

/// Open a backend from `"NAME"` or `"NAME:key=value,key=value"`. A name may hold a bracketed
/// part with colons of its own (remote devices: `RPC0[127.0.0.1:50052]`); the parameters
/// start at the first colon after it.
pub fn init_backend(spec: &str) -> Result<Box<dyn Backend>> {
    let (name, params) = split_spec(spec);
    let device = device(name.trim())?;
    device.init_backend(&BackendParams::parse(params)?)
}

/// `"NAME:params"` into name and parameters (see [`init_backend`]).
fn split_spec(spec: &str) -> (&str, &str) {
    let search_from = match (spec.find('['), spec.find(']')) {
        (Some(open), Some(close)) if open < close => close,
        _ => 0,
    };
    match spec[search_from..].find(':') {
        Some(at) => (&spec[..search_from + at], &spec[search_from + at + 1..]),
        None => (spec, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_split_after_bracketed_names() {
        assert_eq!(split_spec("CPU"), ("CPU", ""));
        assert_eq!(split_spec("CPU:n_threads=2"), ("CPU", "n_threads=2"));
        assert_eq!(
            split_spec("RPC0[127.0.0.1:50052]"),
            ("RPC0[127.0.0.1:50052]", "")
        );
        assert_eq!(split_spec("RPC1[h:1]:a=b"), ("RPC1[h:1]", "a=b"));
    }

    #[test]
    fn unknown_device_is_an_error() {
        // Registered here so the message is the unknown-device one whatever else ran first.
        struct Empty;
        impl Registry for Empty {
            fn name(&self) -> &str {
                "Empty"
            }
            fn devices(&self) -> Vec<DeviceRef> {
                Vec::new()
            }
        }
        register(Arc::new(Empty));
        let err = init_backend("NoSuchDevice0:x=1")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("unknown device 'NoSuchDevice0'"), "{err}");
    }
}
