//! Run one graph on two backends and compare them node by node (ggml's
//! `ggml_backend_compare_graph_backend` and `ggml_backend_graph_copy`).
//!
//! This module owns the deep graph copy ([`graph_copy`]: a graph's tensors re-created in a new
//! context, all allocated without memory reuse in one buffer of a chosen buffer type, with the
//! bytes of every stored leaf copied over) and the node-by-node comparison
//! ([`compare_graph_backend`]): each node is computed alone on both backends, both outputs are
//! read back as f32 and compared (NMSE, largest absolute difference, NaN/Inf positions), and then
//! backend 1's output is copied into backend 2's copy of the node, so an error at one node does
//! not leak into later ones and the *first* divergent node is found exactly.

use crate::alloc::alloc_ctx_tensors;
use crate::backend::{Backend, Buffer, BufferTypeRef};
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::{Op, OpKind};
use crate::tensor::TensorId;
use std::collections::HashMap;
use std::sync::Arc;

/// A deep copy of a graph in its own context and buffer (see [`graph_copy`]).
pub struct GraphCopy {
    /// The context holding the copied tensors.
    pub ctx: Context,
    /// The copied graph (same node order as the source graph).
    pub graph: Graph,
    /// Source tensor id → copied tensor id.
    pub map: HashMap<TensorId, TensorId>,
    /// The buffer holding every copied tensor (`None` when nothing needed storage).
    pub buffer: Option<Arc<Buffer>>,
}

/// Copy `graph` (whose tensors live in `src_ctx`) into a new context: every tensor the graph
/// uses is re-created, every non-view tensor gets its own storage (no reuse) in one buffer of
/// `buffer_type`, views are initialised, and the bytes of every tensor that is not computed by
/// the graph (weights, inputs, KV cache: tensors without an op) and has storage in `src_ctx` are
/// copied over. The rest of the buffer is zeroed, so two copies start identical.
pub fn graph_copy(
    src_ctx: &Context,
    graph: &Graph,
    buffer_type: &BufferTypeRef,
) -> Result<GraphCopy> {
    let mut ctx = Context::new();
    let (copy, map) = graph.copy_to(src_ctx, &mut ctx)?;
    let buffer = alloc_ctx_tensors(&mut ctx, buffer_type)?;
    if let Some(b) = &buffer {
        b.clear(0)?;
    }
    // Deterministic order (the map is a HashMap).
    let mut pairs: Vec<(TensorId, TensorId)> = map.iter().map(|(&s, &d)| (s, d)).collect();
    pairs.sort_unstable();
    for (src, dst) in pairs {
        let t = src_ctx.get(src)?;
        if t.op != Op::None || t.view_src.is_some() || t.data.is_none() || t.nbytes() == 0 {
            continue;
        }
        let bytes = src_ctx.tensor_bytes(src)?;
        ctx.tensor_set(dst, 0, &bytes)?;
    }
    Ok(GraphCopy {
        ctx,
        graph: copy,
        map,
        buffer,
    })
}

/// How one node's outputs on the two backends compare.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeComparison {
    /// Position of the node in the graph.
    pub index: usize,
    /// The node's id in the caller's context.
    pub id: TensorId,
    /// The node's name (`node_<index>` when it has none).
    pub name: String,
    /// The node's op.
    pub op: OpKind,
    /// Σ(a−b)² / Σb² over finite pairs, with `b` backend 1's output and `a` backend 2's (0 when
    /// both are all zeros). Integer outputs must match exactly: any difference gives `∞`.
    pub nmse: f64,
    /// The largest |a−b| over finite pairs.
    pub max_abs: f64,
    /// Some element is NaN or ±Inf on one backend but not the same on the other.
    pub nonfinite_mismatch: bool,
}

impl NodeComparison {
    /// Whether this node diverges beyond `tol` (NMSE above it, a NaN NMSE, or a NaN/Inf
    /// mismatch).
    pub fn diverges(&self, tol: f64) -> bool {
        self.nonfinite_mismatch || self.nmse.is_nan() || self.nmse > tol
    }
}

/// The result of [`compare_graph_backend`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareReport {
    /// Nodes compared (fewer than the graph's when the callback stopped early).
    pub n_nodes_compared: usize,
    /// Nodes that diverged beyond the tolerance.
    pub n_divergent: usize,
    /// The first node that diverged beyond the tolerance, if any.
    pub first_divergent: Option<NodeComparison>,
}

/// Run `graph` (tensors in `ctx`, leaf bytes such as weights and inputs already set) on
/// `backend1` and `backend2` node by node and compare every node's output.
///
/// The graph is deep-copied for each backend into its default buffer type ([`graph_copy`]);
/// `ctx` itself is only read. For each node in order: compute that single node on both backends
/// (view ops compute nothing but are compared too), compare the outputs (backend 1 is the
/// reference), call `callback` with the comparison (returning `false` stops), then copy backend
/// 1's output into backend 2's copy of the node. A node diverges when
/// [`NodeComparison::diverges`]`(tol)`.
///
/// Errors: a node a backend does not support, a failed compute (both name the node), a failed
/// allocation or copy.
pub fn compare_graph_backend(
    ctx: &Context,
    graph: &Graph,
    backend1: &mut dyn Backend,
    backend2: &mut dyn Backend,
    tol: f64,
    callback: &mut dyn FnMut(&NodeComparison) -> bool,
) -> Result<CompareReport> {
    let c1 = graph_copy(ctx, graph, &backend1.default_buffer_type())?;
    let c2 = graph_copy(ctx, graph, &backend2.default_buffer_type())?;
    let mut report = CompareReport::default();
    for (index, &id) in graph.nodes().iter().enumerate() {
        let t = ctx.get(id)?;
        let name = if t.name.is_empty() {
            format!("node_{index}")
        } else {
            t.name.clone()
        };
        let op = t.op.kind();
        let (n1, n2) = (c1.graph.nodes()[index], c2.graph.nodes()[index]);
        compute_node(backend1, &c1, index, n1, &name, op)?;
        compute_node(backend2, &c2, index, n2, &name, op)?;

        let a = read_values(&c2.ctx, n2)?;
        let b = read_values(&c1.ctx, n1)?;
        let (nmse, max_abs, nonfinite_mismatch) = compare_values(&a, &b);
        let cmp = NodeComparison {
            index,
            id,
            name,
            op,
            nmse,
            max_abs,
            nonfinite_mismatch,
        };
        report.n_nodes_compared += 1;
        if cmp.diverges(tol) {
            report.n_divergent += 1;
            if report.first_divergent.is_none() {
                report.first_divergent = Some(cmp.clone());
            }
        }
        // Later nodes start from the reference's value of this one.
        let bytes = c1.ctx.tensor_bytes(n1)?;
        c2.ctx.tensor_set(n2, 0, &bytes)?;
        if !callback(&cmp) {
            break;
        }
    }
    Ok(report)
}

/// Compute node `node` (position `index`) of `copy` alone on `backend`.
fn compute_node(
    backend: &mut dyn Backend,
    copy: &GraphCopy,
    index: usize,
    node: TensorId,
    name: &str,
    op: OpKind,
) -> Result<()> {
    let what = || format!("node #{index} '{name}' ({op})");
    if !op.is_view() && !backend.supports_op(&copy.ctx, node) {
        return Err(Error::Unsupported {
            backend: backend.name().to_string(),
            what: what(),
        });
    }
    let single = copy.graph.view(index..index + 1);
    backend
        .graph_compute(&copy.ctx, &single)
        .and_then(|()| backend.synchronize())
        .map_err(|e| Error::Backend {
            backend: backend.name().to_string(),
            message: format!("{}: {e}", what()),
        })
}

/// A tensor's elements in logical (row-major from `ne[0]`) order.
enum Values {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// Read tensor `id` (any strides) as f32, dequantizing non-f32 dtypes; I32 stays integer.
fn read_values(ctx: &Context, id: TensorId) -> Result<Values> {
    let t = ctx.get(id)?;
    let bytes = ctx.tensor_bytes(id)?;
    let dtype = t.dtype;
    let row_bytes = t.row_bytes();
    let dense_rows = t.rows_contiguous();
    if !dense_rows && dtype.block_size() != 1 {
        return Err(Error::UnsupportedDType {
            op: t.op.kind(),
            dtype,
            reason: "comparing a quantized tensor whose rows are not dense",
        });
    }
    let esize = dtype.block_bytes();
    let mut row = vec![0u8; row_bytes];
    let mut f = Vec::new();
    let mut i = Vec::new();
    let mut frow = vec![0f32; t.ne[0]];
    let slice = |start: usize, len: usize| -> Result<&[u8]> {
        bytes.get(start..start + len).ok_or(Error::OutOfBounds {
            what: format!("comparing tensor '{}'", t.display_name()),
            offset: start,
            size: len,
            limit: bytes.len(),
        })
    };
    for i3 in 0..t.ne[3] {
        for i2 in 0..t.ne[2] {
            for i1 in 0..t.ne[1] {
                let base = t.offset_of([0, i1, i2, i3]);
                if dense_rows {
                    row.copy_from_slice(slice(base, row_bytes)?);
                } else {
                    for (i0, dst) in row.chunks_exact_mut(esize).enumerate() {
                        dst.copy_from_slice(slice(base + i0 * t.nb[0], esize)?);
                    }
                }
                if dtype == DType::I32 {
                    i.extend(
                        row.chunks_exact(4)
                            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    );
                } else {
                    crate::quant::dequantize_row(dtype, &row, &mut frow)?;
                    f.extend_from_slice(&frow);
                }
            }
        }
    }
    Ok(if dtype == DType::I32 {
        Values::I32(i)
    } else {
        Values::F32(f)
    })
}

/// (nmse, max_abs, nonfinite_mismatch) of `a` against the reference `b`.
fn compare_values(a: &Values, b: &Values) -> (f64, f64, bool) {
    match (a, b) {
        (Values::I32(a), Values::I32(b)) => {
            let max_abs = a
                .iter()
                .zip(b)
                .map(|(&x, &y)| (i64::from(x) - i64::from(y)).unsigned_abs() as f64)
                .fold(0.0, f64::max);
            let nmse = if a == b { 0.0 } else { f64::INFINITY };
            (nmse, max_abs, false)
        }
        (Values::F32(a), Values::F32(b)) => {
            let (mut err, mut norm, mut max_abs, mut mismatch) = (0f64, 0f64, 0f64, false);
            for (&x, &y) in a.iter().zip(b) {
                if !x.is_finite() || !y.is_finite() {
                    let same = (x.is_nan() && y.is_nan()) || x == y;
                    mismatch |= !same;
                    continue;
                }
                let d = f64::from(x) - f64::from(y);
                err += d * d;
                norm += f64::from(y) * f64::from(y);
                max_abs = max_abs.max(d.abs());
            }
            let nmse = if err == 0.0 {
                0.0
            } else if norm == 0.0 {
                f64::INFINITY
            } else {
                err / norm
            };
            (nmse, max_abs, mismatch || a.len() != b.len())
        }
        // Same graph, same dtypes: cannot happen; report it as a divergence rather than panic.
        _ => (f64::INFINITY, f64::INFINITY, true),
    }
}
