//! Events: points in a stream's work that other streams or the host can wait for.

use super::device::DeviceRef;
use crate::error::Result;
use std::any::Any;

/// What a device implements for events.
pub trait EventImpl: Send + Sync + Any {
    /// Block until the event is reached.
    fn synchronize(&self) -> Result<()>;
}

/// An event of one device (ggml's `ggml_backend_event`).
pub struct Event {
    device: DeviceRef,
    imp: Box<dyn EventImpl>,
}

impl Event {
    /// Wrap a device's event implementation.
    pub fn new(device: DeviceRef, imp: Box<dyn EventImpl>) -> Event {
        Event { device, imp }
    }
    /// The device the event belongs to.
    pub fn device(&self) -> &DeviceRef {
        &self.device
    }
    /// Block the host until the event is reached.
    pub fn synchronize(&self) -> Result<()> {
        self.imp.synchronize()
    }
    /// The implementation, for the owning backend.
    pub fn imp(&self) -> &dyn EventImpl {
        self.imp.as_ref()
    }
}
