//! Op conformance (placeholder).
