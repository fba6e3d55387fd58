//! Test doubles for code that exercises the backend traits without a real device (only with
//! the `testing` feature). This module owns nothing the library itself uses.
//!
//! - [`VecBufferType`] (`buffer`): a mock buffer type whose buffers are a `Vec<u8>` behind a
//!   mutex, flagged as host memory or as memory only a device reaches;
//! - [`TestDevice`] / [`TestBackend`] (`device`): a configurable host device (name, CPU or
//!   accelerator, which ops it supports, events, queued copies) whose synchronous backend
//!   computes a handful of f32 ops ([`TestDevice::KERNELS`]) with plain reference arithmetic
//!   (`kernels`), in `VecBufferType` memory. It refuses nodes it does not support and memory
//!   it cannot use, and logs the nodes it computed, so the scheduler's and the meta device's
//!   tests in this crate check where work ran as well as what it computed.
//!
//! Imports go one way: `device` → `kernels`, `device` → `buffer`.

mod buffer;
mod device;
mod kernels;

pub use buffer::VecBufferType;
pub use device::{TestBackend, TestDevice, TestDeviceBuilder};
