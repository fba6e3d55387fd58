//! ggml's RPC protocol, version 7.0 (the one llama.cpp's `ggml-rpc-server` and `--rpc` speak):
//! remote devices for rgml and a server for any client of the protocol.
//!
//! So far this crate holds the protocol's wire format ([`wire`]): commands, the packed tensor
//! description, the fixed-size messages and the framing, each decoded with every length and
//! count checked before use. The client and the server build on it.

pub mod wire;

pub use wire::{Command, Request, RpcTensor, WireError};
