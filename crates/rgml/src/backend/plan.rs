//! Graph plans (ggml's `graph_plan_create` / `graph_plan_compute`): what a backend prepared
//! for one graph of one context, computed again without preparing anew.
//!
//! This module owns the plan's validity rule, nothing a backend puts in it: a plan stays valid
//! while the context it was made from is the same context (its uid) with the same tensor
//! metadata (its epoch), for the graph it was made for (the graph's uid). Checking that is
//! three integer comparisons, so a decode loop that computes one graph again pays nothing to
//! find its plan, and any change of a tensor's op, shape, strides or storage (each advances the
//! context's epoch) makes the backend prepare again.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::graph::Graph;
use std::any::Any;
use std::sync::Arc;

/// A backend's prepared form of one graph of one context.
#[derive(Clone)]
pub struct GraphPlan {
    ctx_uid: u64,
    ctx_epoch: u64,
    graph_uid: u64,
    backend: String,
    prepared: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for GraphPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphPlan")
            .field("backend", &self.backend)
            .field("ctx_uid", &self.ctx_uid)
            .field("ctx_epoch", &self.ctx_epoch)
            .field("graph_uid", &self.graph_uid)
            .finish_non_exhaustive()
    }
}

impl GraphPlan {
    /// What backend `backend` prepared (`prepared`) for `graph` of `ctx` as they are now.
    pub fn new(
        ctx: &Context,
        graph: &Graph,
        backend: &str,
        prepared: Arc<dyn Any + Send + Sync>,
    ) -> GraphPlan {
        GraphPlan {
            ctx_uid: ctx.uid(),
            ctx_epoch: ctx.epoch(),
            graph_uid: graph.uid(),
            backend: backend.to_string(),
            prepared,
        }
    }

    /// Whether this plan was made for `graph` of `ctx` as they are now.
    pub fn is_for(&self, ctx: &Context, graph: &Graph) -> bool {
        self.graph_uid == graph.uid() && self.is_current(ctx)
    }

    /// Whether `ctx` is the context the plan was made from, with unchanged metadata.
    pub fn is_current(&self, ctx: &Context) -> bool {
        self.ctx_uid == ctx.uid() && self.ctx_epoch == ctx.epoch()
    }

    /// [`is_current`](Self::is_current) as a `Result`: a plan of another context, or of one
    /// whose tensors changed since, is an error (computing it would read stale layouts).
    pub fn check_current(&self, ctx: &Context) -> Result<()> {
        if self.is_current(ctx) {
            return Ok(());
        }
        Err(Error::StalePlan {
            backend: self.backend.clone(),
        })
    }

    /// The uid of the graph the plan was made for.
    pub fn graph_uid(&self) -> u64 {
        self.graph_uid
    }

    /// The name of the backend that made the plan.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// What the backend prepared, if it is a `T` (a backend's own type).
    pub fn prepared<T: Any>(&self) -> Option<&T> {
        self.prepared.downcast_ref()
    }
}
