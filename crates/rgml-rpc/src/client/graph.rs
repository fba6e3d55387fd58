//! rgml tensors and graphs as the protocol describes them ([`RpcTensor`], [`WireGraph`]).
//!
//! A tensor's id on the wire is its arena position plus one (0 means "none"); its `buffer` and
//! `data` are the server's buffer id and address, so every tensor a graph reaches must live in
//! a buffer of the same server. Sizes and strides travel as 32-bit values, so a tensor whose
//! shape or strides do not fit is refused (see [`expressible`](super::describe::expressible)).

use super::buffer::RpcBuffer;
use super::conn::Connection;
use super::describe::describe_unplaced;
use crate::ggml::{encode_flags, ggml_src_order};
use crate::wire::{RpcTensor, WireGraph};
use rgml::{Context, Error, Graph, Result, Tensor, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

fn wire_id(id: TensorId) -> u64 {
    id.index() as u64 + 1
}

/// Packs the tensors a graph reaches, sources before users, as ggml's client does.
struct Packer<'a> {
    ctx: &'a Context,
    conn: &'a Arc<Connection>,
    use_counts: HashMap<TensorId, i32>,
    nodes: HashSet<TensorId>,
    visited: HashSet<TensorId>,
    tensors: Vec<RpcTensor>,
}

impl Packer<'_> {
    fn add(&mut self, id: TensorId) -> Result<()> {
        if !self.visited.insert(id) {
            return Ok(());
        }
        let t = self.ctx.get(id)?;
        for &s in &t.src {
            self.add(s)?;
        }
        if let Some(v) = t.view_src {
            self.add(v)?;
        }
        let packed = self.describe(id, t)?;
        self.tensors.push(packed);
        Ok(())
    }

    fn describe(&self, id: TensorId, t: &Tensor) -> Result<RpcTensor> {
        let mut out = describe_unplaced(t)?;
        out.id = wire_id(id);
        let data = t
            .data
            .as_ref()
            .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
        let remote = data
            .buffer
            .imp()
            .downcast_ref::<RpcBuffer>()
            .filter(|b| Arc::ptr_eq(&b.conn, self.conn))
            .ok_or_else(|| Error::Backend {
                backend: format!("RPC[{}]", self.conn.endpoint()),
                message: format!(
                    "tensor '{}' is in buffer '{}', not in memory of this server",
                    t.display_name(),
                    data.buffer.name()
                ),
            })?;
        out.buffer = remote.remote;
        out.data = remote.base.wrapping_add(data.offset as u64);
        for (slot, i) in ggml_src_order(&t.op, t.src.len()).into_iter().enumerate() {
            if let Some(&s) = i.and_then(|i| t.src.get(i)) {
                out.src[slot] = wire_id(s);
            }
        }
        if let Some(v) = t.view_src {
            out.view_src = wire_id(v);
            out.view_offs = t.view_offset as u64;
        }
        let is_node = t.op != rgml::Op::None && self.nodes.contains(&id);
        out.flags = encode_flags(t.flags, is_node);
        out.use_count = self.use_counts.get(&id).copied().unwrap_or(0);
        Ok(out)
    }
}

/// `graph` of `ctx` packed for GRAPH_COMPUTE on `device` of the server behind `conn`.
pub(crate) fn pack_graph(
    ctx: &Context,
    graph: &Graph,
    conn: &Arc<Connection>,
    device: u32,
) -> Result<Vec<u8>> {
    let nodes = graph.nodes();
    // ggml counts, for each tensor, the graph nodes that read it (its CPU backend fuses a node
    // into its one reader only).
    let mut use_counts = HashMap::new();
    for &n in nodes {
        for &s in &ctx.get(n)?.src {
            *use_counts.entry(s).or_insert(0) += 1;
        }
    }
    let mut packer = Packer {
        ctx,
        conn,
        use_counts,
        nodes: nodes.iter().copied().collect(),
        visited: HashSet::new(),
        tensors: Vec::new(),
    };
    for &n in nodes {
        packer.add(n)?;
    }
    let wire = WireGraph {
        device,
        nodes: nodes.iter().map(|&n| wire_id(n)).collect(),
        tensors: packer.tensors,
    };
    let mut out = Vec::new();
    wire.encode(&mut out);
    Ok(out)
}
