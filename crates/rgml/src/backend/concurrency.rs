//! Concurrency plans: which nodes of a graph a backend may run at the same time (the seed's
//! "concurrency list", ggml-metal's concurrent groups).
//!
//! This module owns the plan type and the generic dependency analysis that builds one; a
//! backend that overlaps nodes reports its plan through
//! [`Backend::graph_concurrency`](super::Backend::graph_concurrency), and the
//! [`GraphAllocator`](crate::alloc::GraphAllocator) honours it: memory freed by a node of a
//! group only becomes reusable after the whole group, and no node of a group takes over (in
//! place) a tensor another node of the group reads. So nodes of one group never get each
//! other's memory, nor memory a node of the group still reads.
//!
//! A plan splits the graph's node list into *contiguous* groups (levels in graph order). The
//! allocator walks nodes in graph order, so groups that jump around in the node list would
//! need the graph to be reordered first; contiguous groups keep the allocator's walk and the
//! backend's encoding order the same.
//!
//! The plan is part of the backend API (what a backend reports, like a [`super::GraphPlan`]),
//! so it lives here, below the allocator that reads it; `rgml::alloc::Concurrency` is the same
//! type.

use crate::context::Context;
use crate::error::{GraphAllocError, Result};
use crate::graph::Graph;
use crate::tensor::TensorId;
use std::collections::HashSet;
use std::ops::Range;

/// Contiguous groups of a graph's nodes that may run concurrently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Concurrency {
    /// Index of each group's first node, strictly increasing, starting at 0 (empty for an
    /// empty graph).
    starts: Vec<usize>,
    n_nodes: usize,
}

impl Concurrency {
    /// Every node in a group of its own: no concurrency (what the allocator assumes without a
    /// plan).
    pub fn sequential(n_nodes: usize) -> Concurrency {
        Concurrency {
            starts: (0..n_nodes).collect(),
            n_nodes,
        }
    }

    /// Groups starting at `starts` (strictly increasing, the first 0, all below `n_nodes`).
    pub fn from_starts(starts: Vec<usize>, n_nodes: usize) -> Result<Concurrency> {
        let bad = |why: &str| Err(GraphAllocError::BadConcurrencyPlan(why.to_string()).into());
        if n_nodes == 0 {
            return if starts.is_empty() {
                Ok(Concurrency { starts, n_nodes })
            } else {
                bad("group starts for an empty graph")
            };
        }
        if starts.first() != Some(&0) {
            return bad("the first group must start at node 0");
        }
        if starts.windows(2).any(|w| w[0] >= w[1]) {
            return bad("group starts must be strictly increasing");
        }
        if starts.last().is_some_and(|&s| s >= n_nodes) {
            return bad("a group starts past the last node");
        }
        Ok(Concurrency { starts, n_nodes })
    }

    /// Greedy levels in graph order: a node joins the current group unless it reads memory a
    /// node of the group writes, or writes memory a node of the group reads or writes; then it
    /// starts the next group. Memory is identified by the *root* tensor (views resolved to
    /// their source), so graph edges, views and writes into views of existing storage (a KV
    /// cache updated by one node and read through another view by a later one) all count.
    /// Distinct roots are assumed not to overlap, which holds for tensors the allocator has
    /// yet to place once it honours this plan.
    pub fn from_dependencies(ctx: &Context, graph: &Graph) -> Result<Concurrency> {
        let root = |mut id: TensorId| -> Result<TensorId> {
            // View chains are short; the bound only guards against a malformed cycle.
            for _ in 0..64 {
                match ctx.get(id)?.view_src {
                    Some(r) => id = r,
                    None => return Ok(id),
                }
            }
            Err(GraphAllocError::BadConcurrencyPlan("view chain too long or cyclic".into()).into())
        };
        let mut starts = Vec::new();
        let mut read: HashSet<TensorId> = HashSet::new();
        let mut written: HashSet<TensorId> = HashSet::new();
        for (i, &node) in graph.nodes().iter().enumerate() {
            let t = ctx.get(node)?;
            // View ops compute nothing: they neither read nor write when the graph runs (their
            // consumers depend on the writer of the viewed memory through its root).
            if t.op.kind().is_view() {
                if i == 0 {
                    starts.push(0);
                }
                continue;
            }
            let mut reads = Vec::with_capacity(t.src.len());
            for &s in &t.src {
                reads.push(root(s)?);
            }
            let write = root(node)?;
            let conflict = i == 0
                || reads.iter().any(|r| written.contains(r))
                || written.contains(&write)
                || read.contains(&write);
            if conflict {
                starts.push(i);
                read.clear();
                written.clear();
            }
            read.extend(reads);
            written.insert(write);
        }
        Concurrency::from_starts(starts, graph.n_nodes())
    }

    /// Number of nodes the plan covers.
    pub fn n_nodes(&self) -> usize {
        self.n_nodes
    }

    /// Number of groups.
    pub fn n_groups(&self) -> usize {
        self.starts.len()
    }

    /// The groups, as node index ranges, in order.
    pub fn groups(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.starts.iter().enumerate().map(|(g, &s)| {
            let end = self.starts.get(g + 1).copied().unwrap_or(self.n_nodes);
            s..end
        })
    }

    /// Whether node `i` is the last of its group (true past the end).
    pub fn is_group_end(&self, i: usize) -> bool {
        i + 1 >= self.n_nodes || self.starts.binary_search(&(i + 1)).is_ok()
    }

    /// This plan's groups, shifted by `offset` nodes, appended to `starts` (for building the
    /// plan of a graph made of several parts).
    pub fn append_starts(&self, offset: usize, starts: &mut Vec<usize>) {
        starts.extend(self.starts.iter().map(|&s| s + offset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_are_validated() {
        assert!(Concurrency::from_starts(vec![0, 2], 4).is_ok());
        assert!(Concurrency::from_starts(vec![1], 4).is_err());
        assert!(Concurrency::from_starts(vec![0, 2, 2], 4).is_err());
        assert!(Concurrency::from_starts(vec![0, 4], 4).is_err());
        assert!(Concurrency::from_starts(vec![0], 0).is_err());
        let c = Concurrency::from_starts(vec![0, 2], 4).unwrap();
        assert_eq!(c.groups().collect::<Vec<_>>(), vec![0..2, 2..4]);
        assert!(!c.is_group_end(0) && c.is_group_end(1) && c.is_group_end(3));
        let s = Concurrency::sequential(3);
        assert_eq!(s.n_groups(), 3);
        assert!((0..3).all(|i| s.is_group_end(i)));
    }
}
