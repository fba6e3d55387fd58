//! The client: a server's devices as rgml devices, with buffer types, buffers and streams over
//! the protocol's commands.
//!
//! ```text
//! device     RpcServer (registry), RpcDevice, RpcBackend (stream)
//! graph      rgml graphs as the protocol's tensors (the buffers' ids from `buffer`)
//! buffer     RpcBufferType / RpcBuffer
//! describe   one tensor as rpc_tensor, before it has storage or sources
//! conn       one TCP connection per server: handshake, exchanges, lost-connection state
//! ```
//! Each module imports only modules below it.

mod buffer;
mod conn;
mod describe;
mod device;
mod graph;

pub use buffer::{RpcBuffer, RpcBufferType};
pub use conn::Connection;
pub use device::{RpcBackend, RpcDevice, RpcServer};

use std::sync::Arc;

/// Connect to the server at `endpoint` (`host:port`) and register its devices with rgml's
/// registry (as the registry `RPC[host:port]`, devices `RPC0[host:port]`, ...). A server
/// registered before under the same endpoint is replaced.
pub fn add_server(endpoint: &str) -> rgml::Result<Arc<RpcServer>> {
    let server = Arc::new(RpcServer::connect(endpoint)?);
    rgml::registry::register(server.clone());
    Ok(server)
}
