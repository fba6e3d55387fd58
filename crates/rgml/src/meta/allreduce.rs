//! All-reduce of partial sums across several backends: after [`AllReduce::run`], every device's
//! tensor holds the sum of all devices' tensors (what the meta device does where a PARTIAL
//! result must become MIRRORED, e.g. after the attention output or FFN down projection).
//!
//! This module owns the plan of the exchange (which device sends to which, in which phase),
//! the receive tensors and their buffers on each device, the small per-device ADD graphs, and
//! the ordering of copies and adds between streams. It knows no concrete backend: data moves
//! through [`Backend::cpy_tensor_async`] (or, where a backend cannot, a blocking copy through
//! host memory) and sums are computed by each device's own backend running an ADD node.
//!
//! # Algorithm
//! Let `P` be the devices that contribute (all of them unless
//! [`AllReduce::with_contributors`] says otherwise), `m = |P|` and `p` the largest power of two
//! not above `m`. The first `p` contributors form the core, the other `m - p` are extras.
//! 1. **Fold** (only when `m > p`): extra `P[p + i]` sends its tensor to core `P[i]`, which
//!    adds it to its own.
//! 2. **Butterfly** (recursive doubling, `log2 p` phases): in phase `k`, core `i` and core
//!    `i ^ 2^k` exchange their current sums and each adds the other's to its own.
//! 3. **Broadcast**: extra `P[p + i]` receives the result from core `P[i]`; a device that does
//!    not contribute receives it from core `P[j % p]` (copies straight into its tensor).
//!
//! Each phase costs one copy and one ADD per device involved; the whole tensor travels in every
//! phase (recursive doubling, not halving), which suits the small tensors of generation (one
//! token's hidden state) where latency, not bandwidth, dominates.
//!
//! # Guarantees
//! - The summation tree depends only on the number of contributors and their order, never on
//!   timing: the same inputs give the same bits on every run.
//! - Every device ends with bitwise the same values: in an exchange both partners compute
//!   `own + other`, i.e. `a + b` on one side and `b + a` on the other, which IEEE-754 addition
//!   makes identical (it is commutative, each element rounded once); extras and
//!   non-contributors receive a copy of a core's bytes.
//! - Zero-element tensors are a no-op; with no contributor at all every tensor is set to zero
//!   (the empty sum).
//! - Results are ordered in each device's stream: work queued later on backend `d` sees tensor
//!   `d` summed; synchronize backend `d` before reading tensor `d` from the host. Errors of the
//!   queued ADDs surface at that synchronize, as for any `graph_compute_async`.
//!
//! # Ordering between streams
//! A copy is queued on the *destination* stream and, by [`Backend::cpy_tensor_async`]'s
//! contract, sees the source after the source backend's queued work. What remains is the
//! write-after-read hazard on the source: a device must not overwrite its tensor (its own ADD
//! of the next phase, or the caller's later work) while a partner's stream still reads it. So
//! after each phase's copies every destination stream records an event and every source stream
//! waits for the events of its readers (or the host synchronizes the reader when its device has
//! no events). Blocking fallback copies are complete when they return and need no wait.

use crate::backend::{Backend, Buffer, Event};
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::OpKind;
use crate::tensor::TensorId;
use std::sync::Arc;

/// One copy of a phase: device `src`'s running sum goes to device `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Transfer {
    src: usize,
    dst: usize,
}

/// A step of the plan: copies that can run at the same time, then (if `add`) each destination
/// adds what it received to its own tensor; otherwise the copies land in the destinations'
/// tensors directly.
#[derive(Clone, Debug)]
struct Phase {
    transfers: Vec<Transfer>,
    add: bool,
}

/// Per-device state of the plan.
struct Slot {
    /// Backend name at plan time, to catch a run with other backends.
    name: String,
    /// Stand-in for the caller's tensor, rebound to its storage on each run.
    acc: TensorId,
    /// The caller's storage `acc` is bound to (buffer id, offset), to skip rebinding.
    bound: Option<(u64, usize)>,
    /// Receive tensor (in the device's own memory) and `acc + recv` written over `acc`, for
    /// devices that add in some phase.
    add: Option<AddStep>,
    /// Marks this stream's copies of a phase, for sources that must not overwrite what it reads.
    event: Option<Event>,
}

struct AddStep {
    recv: TensorId,
    sum: TensorId,
    graph: Graph,
    /// Keeps the receive memory alive (the tensor also holds it; this makes ownership explicit).
    _buffer: Arc<Buffer>,
}

/// A planned all-reduce of f32 tensors of one shape over a fixed list of backends: build once
/// (receive buffers, ADD graphs, events), then [`run`](AllReduce::run) as often as needed.
pub struct AllReduce {
    ne: [usize; 4],
    contributes: Vec<bool>,
    phases: Vec<Phase>,
    ctx: Context,
    slots: Vec<Slot>,
}

impl std::fmt::Debug for AllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllReduce")
            .field("ne", &self.ne)
            .field("devices", &self.slots.len())
            .field("contributes", &self.contributes)
            .field("phases", &self.phases)
            .finish()
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: OpKind::Add,
        reason: format!("all-reduce: {}", reason.into()),
    }
}

/// The phases for `n` devices of which those with `contributes[d]` hold partial sums.
fn plan(contributes: &[bool]) -> Vec<Phase> {
    let parts: Vec<usize> = (0..contributes.len()).filter(|&d| contributes[d]).collect();
    let m = parts.len();
    if m == 0 {
        return Vec::new();
    }
    let p = if m.is_power_of_two() {
        m
    } else {
        m.next_power_of_two() / 2
    };
    let mut phases = Vec::new();
    if m > p {
        phases.push(Phase {
            transfers: (0..m - p)
                .map(|i| Transfer {
                    src: parts[p + i],
                    dst: parts[i],
                })
                .collect(),
            add: true,
        });
    }
    let mut bit = 1;
    while bit < p {
        phases.push(Phase {
            transfers: (0..p)
                .map(|i| Transfer {
                    src: parts[i ^ bit],
                    dst: parts[i],
                })
                .collect(),
            add: true,
        });
        bit <<= 1;
    }
    // Spread the broadcast over the core so no single device sends everything.
    let mut broadcast: Vec<Transfer> = (0..m - p)
        .map(|i| Transfer {
            src: parts[i],
            dst: parts[p + i],
        })
        .collect();
    let others = (0..contributes.len()).filter(|&d| !contributes[d]);
    broadcast.extend(others.enumerate().map(|(j, d)| Transfer {
        src: parts[j % p],
        dst: d,
    }));
    if !broadcast.is_empty() {
        phases.push(Phase {
            transfers: broadcast,
            add: false,
        });
    }
    phases
}

impl AllReduce {
    /// Plan an all-reduce over `backends` (one per device, in the order tensors will be passed
    /// to [`run`](Self::run)) for f32 tensors of shape `dims` (ggml order, up to 4 dims), every
    /// device contributing. Allocates one receive tensor per device in its backend's default
    /// buffer type.
    ///
    /// Errors: no backends, a bad shape, an allocation failure.
    pub fn new(backends: &mut [Box<dyn Backend>], dims: &[usize]) -> Result<AllReduce> {
        let all = vec![true; backends.len()];
        Self::with_contributors(backends, dims, &all)
    }

    /// As [`new`](Self::new), but only devices with `contributes[d]` hold a partial sum (e.g.
    /// a device whose slice of the contraction axis is empty); the others' tensors are only
    /// written (with the sum), never read.
    ///
    /// Errors: no backends, `contributes` of another length, a bad shape, an allocation failure.
    pub fn with_contributors(
        backends: &mut [Box<dyn Backend>],
        dims: &[usize],
        contributes: &[bool],
    ) -> Result<AllReduce> {
        let n = backends.len();
        if n == 0 {
            return Err(invalid("no backends"));
        }
        if contributes.len() != n {
            return Err(Error::LengthMismatch {
                what: "all-reduce contributor flags",
                expected: n,
                actual: contributes.len(),
            });
        }
        let phases = plan(contributes);
        let mut ctx = Context::new();
        let mut needs_add = vec![false; n];
        for phase in phases.iter().filter(|ph| ph.add) {
            for t in &phase.transfers {
                needs_add[t.dst] = true;
            }
        }
        let mut slots = Vec::with_capacity(n);
        let mut ne = [1usize; 4];
        for (d, backend) in backends.iter_mut().enumerate() {
            let acc = ctx.new_tensor(DType::F32, dims)?;
            ctx.set_name(acc, format!("allreduce.acc{d}"))?;
            ne = ctx[acc].ne;
            let empty = ctx[acc].nelements() == 0;
            let add = if needs_add[d] && !empty {
                let recv = ctx.new_tensor(DType::F32, dims)?;
                ctx.set_name(recv, format!("allreduce.recv{d}"))?;
                let buffer =
                    Buffer::alloc(&backend.default_buffer_type(), ctx[recv].nbytes().max(1))?;
                ctx.set_data(recv, buffer.clone(), 0)?;
                // Operand order `own + received` on every device: with commutative IEEE
                // addition both partners of an exchange get the same bits.
                let sum = ctx.add(acc, recv)?;
                ctx.set_name(sum, format!("allreduce.sum{d}"))?;
                let graph = Graph::from_nodes(vec![sum]);
                Some(AddStep {
                    recv,
                    sum,
                    graph,
                    _buffer: buffer,
                })
            } else {
                None
            };
            // Without events the host synchronizes instead (slower, same result).
            let event = crate::backend::event_if_supported(backend.device().as_ref())?;
            slots.push(Slot {
                name: backend.name().to_string(),
                acc,
                bound: None,
                add,
                event,
            });
        }
        Ok(AllReduce {
            ne,
            contributes: contributes.to_vec(),
            phases,
            ctx,
            slots,
        })
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.slots.len()
    }

    /// The planned shape (ggml order).
    pub fn shape(&self) -> [usize; 4] {
        self.ne
    }

    /// Number of copy phases a run goes through (fold, butterfly, broadcast).
    pub fn n_phases(&self) -> usize {
        self.phases.len()
    }

    /// Check the caller's tensors and point the plan's stand-ins at their storage.
    fn bind(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        ctx: &Context,
        tensors: &[TensorId],
    ) -> Result<()> {
        let n = self.slots.len();
        if backends.len() != n {
            return Err(Error::LengthMismatch {
                what: "all-reduce backends",
                expected: n,
                actual: backends.len(),
            });
        }
        if tensors.len() != n {
            return Err(Error::LengthMismatch {
                what: "all-reduce tensors",
                expected: n,
                actual: tensors.len(),
            });
        }
        let empty = self.ne.contains(&0);
        let mut storage = Vec::with_capacity(n);
        for (d, (&id, backend)) in tensors.iter().zip(backends.iter()).enumerate() {
            if backend.name() != self.slots[d].name {
                return Err(invalid(format!(
                    "backend {d} is '{}', planned for '{}'",
                    backend.name(),
                    self.slots[d].name
                )));
            }
            let t = ctx.get(id)?;
            if t.dtype != DType::F32 {
                return Err(Error::UnsupportedDType {
                    op: OpKind::Add,
                    dtype: t.dtype,
                    reason: "all-reduce sums f32 tensors",
                });
            }
            if t.ne != self.ne {
                return Err(Error::ShapeMismatch {
                    op: OpKind::Add,
                    lhs: self.ne,
                    rhs: t.ne,
                    reason: "all-reduce tensor differs from the planned shape",
                });
            }
            if empty {
                continue;
            }
            if !t.is_contiguous() {
                return Err(invalid(format!(
                    "tensor '{}' is not contiguous",
                    t.display_name()
                )));
            }
            let data = t
                .data
                .as_ref()
                .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
            if !backend.supports_buffer_type(data.buffer.buffer_type()) {
                return Err(invalid(format!(
                    "tensor '{}' lives in '{}' memory, which backend '{}' cannot use",
                    t.display_name(),
                    data.buffer.name(),
                    backend.name()
                )));
            }
            // Two devices summing into one place would double-count and race.
            if storage
                .iter()
                .any(|&(b, o, _): &(u64, usize, _)| b == data.buffer.id() && o == data.offset)
            {
                return Err(invalid(format!(
                    "tensor '{}' shares its storage with another device's tensor",
                    t.display_name()
                )));
            }
            storage.push((data.buffer.id(), data.offset, data.buffer.clone()));
        }
        for (slot, (id, offset, buffer)) in self.slots.iter_mut().zip(storage) {
            if slot.bound == Some((id, offset)) {
                continue;
            }
            slot.bound = None;
            self.ctx.set_data(slot.acc, buffer.clone(), offset)?;
            if let Some(add) = &slot.add {
                // The ADD writes over its first operand (an exact in-place alias).
                self.ctx.set_data(add.sum, buffer, offset)?;
            }
            slot.bound = Some((id, offset));
        }
        Ok(())
    }

    /// Sum `tensors` (tensor `d` of `ctx` in memory of backend `d`, f32, the planned shape,
    /// contiguous, pairwise distinct storage) in place: afterwards each holds the sum over the
    /// contributing devices, bitwise the same on every device. Queues work on the backends and
    /// may return before it completes (see the module docs for ordering).
    ///
    /// The plan keeps a reference to the buffers of the last tensors it summed (its stand-ins
    /// point there, so a run over the same storage skips rebinding) until the next run over
    /// other storage or until it is dropped.
    ///
    /// Errors (nothing is queued then): other backends than planned, a wrong number of tensors,
    /// a tensor of another dtype or shape, non-contiguous, without storage, in memory its
    /// backend cannot use, or sharing storage with another; then whatever a backend reports.
    pub fn run(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        ctx: &Context,
        tensors: &[TensorId],
    ) -> Result<()> {
        self.bind(backends, ctx, tensors)?;
        if self.ne.contains(&0) {
            return Ok(());
        }
        if !self.contributes.iter().any(|&c| c) {
            let zeros = vec![0u8; ctx.get(tensors[0])?.nbytes()];
            for (backend, &id) in backends.iter_mut().zip(tensors) {
                backend.set_tensor_async(ctx, id, 0, &zeros)?;
            }
            return Ok(());
        }
        let mut asynchronous = Vec::new();
        for phase in &self.phases {
            asynchronous.clear();
            for t in &phase.transfers {
                let src = self.slots[t.src].acc;
                let dst = if phase.add {
                    match &self.slots[t.dst].add {
                        Some(a) => a.recv,
                        None => return Err(invalid("a receiving device has no ADD step")),
                    }
                } else {
                    self.slots[t.dst].acc
                };
                let (db, sb) =
                    crate::backend::two_mut(backends, t.dst, t.src).ok_or_else(|| {
                        invalid(format!(
                            "cannot borrow backends {} and {} together",
                            t.dst, t.src
                        ))
                    })?;
                let mode = crate::backend::tensor_copy_async(
                    db.as_mut(),
                    sb.as_mut(),
                    &self.ctx,
                    src,
                    dst,
                )?;
                if mode == crate::backend::CopyMode::Queued {
                    asynchronous.push(*t);
                }
            }
            self.order_reads(backends, &asynchronous)?;
            if phase.add {
                for t in &phase.transfers {
                    let Some(add) = &self.slots[t.dst].add else {
                        return Err(invalid("a receiving device has no ADD step"));
                    };
                    backends[t.dst].graph_compute_async(&self.ctx, &add.graph)?;
                }
            }
        }
        Ok(())
    }

    /// Make each source stream of the queued copies `transfers` wait until the destination
    /// streams that read its tensor are past those reads.
    fn order_reads(&self, backends: &mut [Box<dyn Backend>], transfers: &[Transfer]) -> Result<()> {
        let n = self.slots.len();
        let mut recorded = vec![false; n];
        for t in transfers {
            if recorded[t.dst] {
                continue;
            }
            recorded[t.dst] = true;
            match &self.slots[t.dst].event {
                Some(e) => backends[t.dst].event_record(e)?,
                None => backends[t.dst].synchronize()?,
            }
        }
        for t in transfers {
            if let Some(e) = &self.slots[t.dst].event {
                backends[t.src].event_wait(e)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulate the plan on exact integers: every device must end with the full sum, and
    /// every core pair must exchange symmetrically.
    fn simulate(contributes: &[bool]) -> Vec<u64> {
        let n = contributes.len();
        let mut v: Vec<u64> = (0..n)
            .map(|d| if contributes[d] { 1u64 << d } else { 0 })
            .collect();
        for phase in plan(contributes) {
            let before = v.clone();
            let mut seen = vec![false; n];
            for t in &phase.transfers {
                assert!(!seen[t.dst], "two copies into one device in a phase");
                seen[t.dst] = true;
                v[t.dst] = if phase.add {
                    before[t.dst] + before[t.src]
                } else {
                    before[t.src]
                };
            }
        }
        v
    }

    #[test]
    fn plan_sums_everything_for_any_count() {
        for n in 1..=13 {
            let all = vec![true; n];
            let want = (1u64 << n) - 1;
            assert_eq!(simulate(&all), vec![want; n], "n = {n}");
        }
        let some = [true, false, true, true, false];
        assert_eq!(simulate(&some), vec![0b01101; 5]);
        assert!(plan(&[false, false]).is_empty());
    }

    #[test]
    fn plan_phase_counts() {
        let count = |n: usize| plan(&vec![true; n]).len();
        assert_eq!(count(1), 0);
        assert_eq!(count(2), 1);
        assert_eq!(count(3), 3); // fold, 1 exchange, broadcast
        assert_eq!(count(4), 2);
        assert_eq!(count(5), 4); // fold, 2 exchanges, broadcast
        assert_eq!(count(8), 3);
    }
}
