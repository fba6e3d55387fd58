//! Computation graphs: the nodes that compute an output, in topological order, and the leafs
//! they read.
//!
//! A [`Graph`] only lists tensor ids of one [`Context`]; it owns no tensors. Its `uid` changes
//! whenever its node list changes, so schedulers and allocators can cache per-graph work.

use crate::context::Context;
use crate::error::Result;
use crate::op::Op;
use crate::tensor::{TensorFlags, TensorId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

fn next_uid() -> u64 {
    NEXT_UID.fetch_add(1, Ordering::Relaxed)
}

/// Nodes (tensors computed by an op, in an order where sources come first) and leafs (tensors
/// without an op).
#[derive(Clone, Debug)]
pub struct Graph {
    nodes: Vec<TensorId>,
    leafs: Vec<TensorId>,
    uid: u64,
    visited: std::collections::HashSet<TensorId>,
}

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Graph {
            nodes: Vec::new(),
            leafs: Vec::new(),
            uid: next_uid(),
            visited: Default::default(),
        }
    }

    /// A graph computing `outputs` (each is marked as a graph output).
    pub fn build(ctx: &mut Context, outputs: &[TensorId]) -> Result<Graph> {
        let mut g = Graph::new();
        for &o in outputs {
            ctx.set_output(o)?;
            g.expand(ctx, o)?;
        }
        Ok(g)
    }

    /// Add `tensor` and everything it depends on that is not yet in the graph (ggml's
    /// `build_forward_expand`).
    pub fn expand(&mut self, ctx: &Context, tensor: TensorId) -> Result<()> {
        ctx.get(tensor)?;
        // Iterative post-order DFS: deep graphs (hundreds of layers) must not overflow the stack.
        let mut stack: Vec<(TensorId, usize)> = vec![(tensor, 0)];
        if !self.visited.insert(tensor) {
            return Ok(());
        }
        while let Some(&mut (id, ref mut next_src)) = stack.last_mut() {
            let t = &ctx[id];
            if let Some(&src) = t.src.get(*next_src) {
                *next_src += 1;
                if self.visited.insert(src) {
                    stack.push((src, 0));
                }
                continue;
            }
            stack.pop();
            if t.op == Op::None && !t.flags.contains(TensorFlags::PARAM) {
                self.leafs.push(id);
            } else {
                self.nodes.push(id);
            }
        }
        self.uid = next_uid();
        Ok(())
    }

    /// Nodes in topological order.
    pub fn nodes(&self) -> &[TensorId] {
        &self.nodes
    }

    /// Leafs (tensors without an op).
    pub fn leafs(&self) -> &[TensorId] {
        &self.leafs
    }

    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Identifier that changes whenever the node list changes.
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// A graph of nodes `range` of this one (ggml's `graph_view`), e.g. one scheduler split.
    pub fn view(&self, range: std::ops::Range<usize>) -> Graph {
        let nodes =
            self.nodes[range.start.min(self.nodes.len())..range.end.min(self.nodes.len())].to_vec();
        Graph {
            visited: nodes.iter().copied().collect(),
            nodes,
            leafs: Vec::new(),
            uid: next_uid(),
        }
    }

    /// A graph from an explicit node list (sources must precede their users).
    pub fn from_nodes(nodes: Vec<TensorId>) -> Graph {
        Graph {
            visited: nodes.iter().copied().collect(),
            nodes,
            leafs: Vec::new(),
            uid: next_uid(),
        }
    }

    /// A graph from explicit node and leaf lists (sources must precede their users), e.g. a
    /// scheduler's graph with extra copy nodes.
    pub fn from_parts(nodes: Vec<TensorId>, leafs: Vec<TensorId>) -> Graph {
        Graph {
            visited: nodes.iter().chain(leafs.iter()).copied().collect(),
            nodes,
            leafs,
            uid: next_uid(),
        }
    }

    /// Every tensor the graph touches: its leafs and nodes and all they reference, sources and
    /// view roots before the tensors that use them. View roots may be outside the node and
    /// leaf lists (e.g. a view of an unlisted tensor), so graph copies walk this order.
    pub fn all_tensors(&self, ctx: &Context) -> Result<Vec<TensorId>> {
        let mut order = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for &id in self.leafs.iter().chain(self.nodes.iter()) {
            ctx.get(id)?;
            let mut stack = vec![(id, false)];
            while let Some((t, done)) = stack.pop() {
                if done {
                    order.push(t);
                    continue;
                }
                if !seen.insert(t) {
                    continue;
                }
                stack.push((t, true));
                let tensor = ctx.get(t)?;
                for &s in tensor.src.iter().chain(tensor.view_src.iter()) {
                    if !seen.contains(&s) {
                        stack.push((s, false));
                    }
                }
            }
        }
        Ok(order)
    }

    /// Copy this graph's tensors (metadata only, without storage) into `dst`; returns the copied
    /// graph and the map from old ids to new ones. The copy can then be allocated elsewhere.
    pub fn copy_to(
        &self,
        src: &Context,
        dst: &mut Context,
    ) -> Result<(Graph, HashMap<TensorId, TensorId>)> {
        let mut map: HashMap<TensorId, TensorId> = HashMap::new();
        let order = self.all_tensors(src)?;
        for id in order {
            let mut t = src[id].clone();
            t.data = None;
            t.src = t.src.iter().map(|s| map[s]).collect();
            t.view_src = t.view_src.map(|s| map[&s]);
            map.insert(id, dst.push(t)?);
        }
        let graph = Graph {
            nodes: self.nodes.iter().map(|n| map[n]).collect(),
            leafs: self.leafs.iter().map(|n| map[n]).collect(),
            uid: next_uid(),
            visited: self
                .visited
                .iter()
                .filter_map(|n| map.get(n).copied())
                .collect(),
        };
        Ok((graph, map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn topological_order_and_leafs() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[4]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[4]).unwrap();
        let s = ctx.add(a, b).unwrap();
        let m = ctx.mul(s, a).unwrap();
        let out = ctx.silu(m).unwrap();
        let g = Graph::build(&mut ctx, &[out]).unwrap();
        assert_eq!(g.nodes(), &[s, m, out]);
        assert_eq!(g.leafs(), &[a, b]);
        let mut g2 = g.clone();
        g2.expand(&ctx, out).unwrap();
        assert_eq!(g2.n_nodes(), 3, "expanding with known nodes adds nothing");

        let mut ctx2 = Context::new();
        let (copy, map) = g.copy_to(&ctx, &mut ctx2).unwrap();
        assert_eq!(copy.n_nodes(), 3);
        assert_eq!(ctx2[map[&m]].src, vec![map[&s], map[&a]]);
        assert_ne!(copy.uid(), g.uid());
    }
}
