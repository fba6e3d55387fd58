//! The engine: slots over one multi-sequence session, continuous batching (being written).
