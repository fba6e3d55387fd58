//! rgml tensors and graphs as the protocol describes them ([`RpcTensor`], [`WireGraph`]).
//!
//! A tensor's id on the wire is its arena position plus one (0 means "none"); its `buffer` and
//! `data` are the server's buffer id and address, so every tensor a graph reaches must live in
//! a buffer of the same server. Sizes and strides travel as 32-bit values, so a tensor whose
//! shape or strides do not fit is refused (see [`expressible`]).

use super::buffer::RpcBuffer;
use super::conn::Connection;
use crate::ggml::{encode_flags, encode_op, ggml_src_order};
use crate::wire::{RpcTensor, WireGraph, MAX_NAME, MAX_SRC};
use rgml::{Context, Error, Graph, Result, Tensor, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Whether `tensor`'s shape, strides and op fit the protocol's fields.
pub(crate) fn expressible(tensor: &Tensor) -> bool {
    let fits = |v: &usize| u32::try_from(*v).is_ok();
    tensor.ne.iter().all(fits)
        && tensor.nb.iter().all(fits)
        && tensor.src.len() <= MAX_SRC
        && encode_op(tensor).is_ok()
}

/// `tensor` without storage, sources or id: what GET_ALLOC_SIZE and INIT_TENSOR describe.
pub(crate) fn describe_unplaced(tensor: &Tensor) -> Result<RpcTensor> {
    let unfit = |what: &str| Error::InvalidArgument {
        op: tensor.op.kind(),
        reason: format!(
            "the {what} of tensor '{}' do not fit ggml's 32-bit RPC fields",
            tensor.display_name()
        ),
    };
    let mut out = RpcTensor {
        dtype: tensor.dtype.ggml_id(),
        ..RpcTensor::default()
    };
    for i in 0..4 {
        out.ne[i] = u32::try_from(tensor.ne[i]).map_err(|_| unfit("sizes"))?;
        out.nb[i] = u32::try_from(tensor.nb[i]).map_err(|_| unfit("strides"))?;
    }
    let op = encode_op(tensor).map_err(|e| Error::InvalidArgument {
        op: e.op,
        reason: e.to_string(),
    })?;
    out.op = op.op;
    out.op_params = op.params;
    out.flags = encode_flags(tensor.flags, false);
    let name = tensor.name.as_bytes();
    // ggml keeps names NUL-terminated in 64 bytes.
    let n = name.len().min(MAX_NAME - 1);
    out.name[..n].copy_from_slice(&name[..n]);
    Ok(out)
}

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
