//! A server's devices as rgml devices ([`RpcDevice`]), their streams ([`RpcBackend`]) and the
//! registry of one server ([`RpcServer`]).
//!
//! A stream sends its work down the server's one connection in order: writes and graphs have
//! no reply, so they return as soon as they are sent, and a later read waits behind them on the
//! server. That order is the only synchronisation needed, so `synchronize` has nothing to wait
//! for and the device offers no events.

use super::buffer::RpcBufferType;
use super::conn::{le_u32, le_u64, Connection, Reply};
use super::describe::expressible;
use super::graph::pack_graph;
use crate::wire::Request;
use rgml::backend::{
    same_instance, Backend, BackendParams, BufferTypeRef, DeviceCaps, DeviceMemory, DeviceType,
};
use rgml::registry::Registry;
use rgml::{Context, DeviceRef, Graph, Result, TensorId};
use std::sync::{Arc, Weak};

/// One device of a server (`RPC0[host:port]`, ...).
pub struct RpcDevice {
    name: String,
    description: String,
    conn: Arc<Connection>,
    index: u32,
    buffer_type: BufferTypeRef,
    me: Weak<RpcDevice>,
}

impl RpcDevice {
    /// The device's index on its server.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The server's `host:port`.
    pub fn endpoint(&self) -> &str {
        self.conn.endpoint()
    }

    fn me(&self) -> DeviceRef {
        // `me` points at the Arc this device was built in, which outlives every `&self`.
        match self.me.upgrade() {
            Some(d) => d,
            None => unreachable!("an RpcDevice lives in the Arc that `me` points to"),
        }
    }
}

impl rgml::Device for RpcDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn memory(&self) -> DeviceMemory {
        let req = Request::GetDeviceMemory { device: self.index };
        // The slot cannot fail: an unreachable server reports no memory.
        match self.conn.call(&req, Reply::Exactly(16)) {
            Ok(rsp) => DeviceMemory {
                free: usize::try_from(le_u64(&rsp, 0)).unwrap_or(usize::MAX),
                total: usize::try_from(le_u64(&rsp, 8)).unwrap_or(usize::MAX),
            },
            Err(_) => DeviceMemory::default(),
        }
    }

    fn device_type(&self) -> DeviceType {
        // Protocol 7.0 does not say what the remote device is; ggml's client calls every
        // remote device a GPU, so it is placed before local CPUs.
        DeviceType::Gpu
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }

    fn init_backend(&self, _params: &BackendParams) -> Result<Box<dyn Backend>> {
        Ok(Box::new(RpcBackend {
            name: self.name.clone(),
            device: self.me(),
            conn: self.conn.clone(),
            index: self.index,
        }))
    }

    fn buffer_type(&self) -> BufferTypeRef {
        self.buffer_type.clone()
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        let Ok(t) = ctx.get(id) else {
            return false;
        };
        expressible(t) && t.src.iter().all(|&s| ctx.get(s).is_ok_and(expressible))
    }

    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        same_instance(buffer_type, &self.buffer_type)
    }
}

/// A stream on a remote device.
pub struct RpcBackend {
    name: String,
    device: DeviceRef,
    conn: Arc<Connection>,
    index: u32,
}

impl Backend for RpcBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn device(&self) -> DeviceRef {
        self.device.clone()
    }

    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        if graph.nodes().is_empty() {
            return Ok(());
        }
        let packed = pack_graph(ctx, graph, &self.conn, self.index)?;
        self.conn.compute_graph(self.index, packed).map(drop)
    }
}

/// One server: its connection and its devices, registered as the registry `RPC[host:port]`.
pub struct RpcServer {
    name: String,
    conn: Arc<Connection>,
    devices: Vec<Arc<RpcDevice>>,
}

impl RpcServer {
    /// Connect to `endpoint` (`host:port`), shake hands and list its devices.
    pub fn connect(endpoint: &str) -> Result<RpcServer> {
        let conn = Arc::new(Connection::open(endpoint)?);
        let rsp = conn.call(&Request::DeviceCount, Reply::Exactly(4))?;
        let count = le_u32(&rsp, 0);
        let mut devices = Vec::new();
        for index in 0..count {
            devices.push(device(&conn, index)?);
        }
        Ok(RpcServer {
            name: format!("RPC[{endpoint}]"),
            conn,
            devices,
        })
    }

    /// The server's `host:port`.
    pub fn endpoint(&self) -> &str {
        self.conn.endpoint()
    }

    /// Its devices, in the server's order.
    pub fn rpc_devices(&self) -> &[Arc<RpcDevice>] {
        &self.devices
    }
}

fn device(conn: &Arc<Connection>, index: u32) -> Result<Arc<RpcDevice>> {
    let rsp = conn.call(&Request::GetAlignment { device: index }, Reply::Exactly(8))?;
    let alignment = usize::try_from(le_u64(&rsp, 0)).unwrap_or(0);
    let rsp = conn.call(&Request::GetMaxSize { device: index }, Reply::Exactly(8))?;
    let max_size = usize::try_from(le_u64(&rsp, 0)).unwrap_or(usize::MAX);
    let name = format!("RPC{index}[{}]", conn.endpoint());
    if !alignment.is_power_of_two() || max_size == 0 {
        return Err(rgml::Error::Backend {
            backend: name,
            message: format!(
                "the server reports alignment {alignment} and maximum buffer size {max_size}"
            ),
        });
    }
    Ok(Arc::new_cyclic(|me: &Weak<RpcDevice>| {
        let device: Weak<dyn rgml::Device> = me.clone();
        RpcDevice {
            description: format!("device {index} of the RPC server {}", conn.endpoint()),
            buffer_type: Arc::new(RpcBufferType {
                name: name.clone(),
                conn: conn.clone(),
                device_index: index,
                device,
                alignment,
                max_size,
                alloc_sizes: Default::default(),
            }),
            name,
            conn: conn.clone(),
            index,
            me: me.clone(),
        }
    }))
}

impl Registry for RpcServer {
    fn name(&self) -> &str {
        &self.name
    }

    fn devices(&self) -> Vec<DeviceRef> {
        self.devices
            .iter()
            .map(|d| d.clone() as DeviceRef)
            .collect()
    }
}
