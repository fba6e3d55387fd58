//! ggml's RPC protocol, version 7.0 (the one llama.cpp's `ggml-rpc-server` and `--rpc` speak):
//! remote devices for rgml and a server for any client of the protocol.
//!
//! - [`wire`]: the wire format: commands, the packed tensor description, every request's
//!   payload, framing; decoding checks every length and count before use.
//! - [`ggml`]: rgml's ops, dtypes and flags in ggml's numbering.
//! - [`client`]: a server's devices as rgml devices ([`add_server`]).
//! - [`server`]: rgml's devices for any client of the protocol ([`server::serve`]).

#![warn(missing_docs)]

pub mod client;
pub mod ggml;
pub mod server;
pub mod wire;

pub use client::{add_server, RpcBackend, RpcDevice, RpcServer};
pub use wire::{Command, Request, RpcTensor, WireError};
