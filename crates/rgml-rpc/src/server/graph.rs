//! A client's graph ([`WireGraph`]) rebuilt as an rgml [`Context`] and [`Graph`], trusting
//! nothing in it.
//!
//! Every tensor is rebuilt through rgml's own op builders from its rebuilt sources, so an op is
//! accepted only with operands rgml's builders accept, and the result must then have exactly
//! the dtype, sizes and strides the client stated. Ids must be unique and non-zero, every
//! source must be in the message (no dangling ids), and the walk over sources is iterative
//! with cycle detection, so a hostile graph can neither loop nor exhaust the stack. Storage is
//! resolved through the session's buffers ([`Locate`]): a tensor's bytes must lie inside the
//! client's own buffer, and a view's address must be its source's plus its offset.

use super::Refusal;
use crate::ggml::{glu, op, rope, unary};
use crate::wire::{RpcTensor, WireGraph, MAX_SRC};
use rgml::backend::Buffer;
use rgml::{Context, DType, Graph, RopeMode, RopeParams, Tensor, TensorId};
use std::collections::HashMap;
use std::sync::Arc;

/// Where a client's `(buffer, address)` is: the buffer and the byte offset in it.
pub(crate) trait Locate {
    /// The buffer `buffer` of this client and the offset of `address` in it.
    fn locate(&self, buffer: u64, address: u64) -> Result<(Arc<Buffer>, usize), Refusal>;
}

/// A rebuilt graph, ready to compute.
pub(crate) struct Rebuilt {
    pub(crate) ctx: Context,
    pub(crate) graph: Graph,
}

/// The most tensors one graph may hold (ggml's graphs of the largest models hold tens of
/// thousands).
pub(crate) const MAX_GRAPH_TENSORS: usize = 1 << 20;

fn refuse(why: impl Into<String>) -> Refusal {
    Refusal(why.into())
}

/// Rebuild `wire` with storage from `mem`.
pub(crate) fn rebuild(wire: &WireGraph, mem: &dyn Locate) -> Result<Rebuilt, Refusal> {
    if wire.tensors.len() > MAX_GRAPH_TENSORS {
        return Err(refuse(format!(
            "{} tensors in one graph",
            wire.tensors.len()
        )));
    }
    let mut by_id = HashMap::with_capacity(wire.tensors.len());
    for (i, t) in wire.tensors.iter().enumerate() {
        if t.id == 0 {
            return Err(refuse("a tensor with id 0"));
        }
        if by_id.insert(t.id, i).is_some() {
            return Err(refuse(format!("tensor id {} appears twice", t.id)));
        }
    }
    let mut b = Builder {
        wire,
        mem,
        by_id,
        done: HashMap::new(),
        ctx: Context::new(),
    };
    let mut nodes = Vec::with_capacity(wire.nodes.len());
    for &id in &wire.nodes {
        if id == 0 {
            continue;
        }
        let t = b.walk(id)?;
        nodes.push(t);
    }
    Ok(Rebuilt {
        graph: Graph::from_nodes(nodes),
        ctx: b.ctx,
    })
}

enum State {
    InProgress,
    Built(TensorId),
}

struct Builder<'a> {
    wire: &'a WireGraph,
    mem: &'a dyn Locate,
    by_id: HashMap<u64, usize>,
    done: HashMap<u64, State>,
    ctx: Context,
}

/// A tensor's references: its source slots and its view source.
fn references(t: &RpcTensor) -> impl Iterator<Item = u64> + '_ {
    t.src
        .iter()
        .copied()
        .chain(std::iter::once(t.view_src))
        .filter(|&id| id != 0)
}

impl Builder<'_> {
    fn tensor(&self, id: u64) -> Result<&RpcTensor, Refusal> {
        self.by_id
            .get(&id)
            .map(|&i| &self.wire.tensors[i])
            .ok_or_else(|| refuse(format!("tensor id {id} is referenced but not sent")))
    }

    fn built(&self, id: u64) -> Option<TensorId> {
        match self.done.get(&id) {
            Some(State::Built(t)) => Some(*t),
            _ => None,
        }
    }

    /// Build `root` after everything it references, depth first without recursion.
    fn walk(&mut self, root: u64) -> Result<TensorId, Refusal> {
        if let Some(t) = self.built(root) {
            return Ok(t);
        }
        let mut stack = vec![root];
        self.done.insert(root, State::InProgress);
        while let Some(&id) = stack.last() {
            let wire = self.tensor(id)?;
            let pending = references(wire).find(|r| self.built(*r).is_none());
            match pending {
                Some(r) if matches!(self.done.get(&r), Some(State::InProgress)) => {
                    return Err(refuse(format!("tensor id {r} depends on itself")));
                }
                Some(r) => {
                    self.tensor(r)?;
                    self.done.insert(r, State::InProgress);
                    stack.push(r);
                }
                None => {
                    let built = self.build(id)?;
                    self.done.insert(id, State::Built(built));
                    stack.pop();
                }
            }
        }
        self.built(root)
            .ok_or_else(|| refuse("internal: a walked tensor was not built"))
    }

    fn build(&mut self, id: u64) -> Result<TensorId, Refusal> {
        let w = self.tensor(id)?.clone();
        let name = w.name();
        let fail = |e: rgml::Error| refuse(format!("tensor '{name}' (id {id}): {e}"));
        let dtype = DType::from_ggml_id(w.dtype).map_err(|_| {
            refuse(format!(
                "tensor '{name}': ggml type {} is not supported",
                w.dtype
            ))
        })?;
        let ne = w.ne.map(|v| v as usize);
        let nb = w.nb.map(|v| v as usize);
        let mut src: [Option<TensorId>; MAX_SRC] = [None; MAX_SRC];
        for (slot, &s) in w.src.iter().enumerate() {
            if s != 0 {
                src[slot] = self.built(s);
            }
        }
        let view_src = (w.view_src != 0).then(|| self.built(w.view_src)).flatten();
        let built = self
            .build_op(&w, dtype, ne, nb, &src, view_src)
            .map_err(|e| match e {
                BuildError::Core(e) => fail(e),
                BuildError::Refused(r) => refuse(format!("tensor '{name}' (id {id}): {}", r.0)),
            })?;
        let t = self.ctx.get(built).map_err(fail)?;
        if t.dtype != dtype || t.ne != ne || t.nb != nb {
            return Err(refuse(format!(
                "tensor '{name}' (id {id}): stated ggml type {} {:?} strides {:?}, but the op gives {} {:?} strides {:?}",
                w.dtype, ne, nb, t.dtype, t.ne, t.nb
            )));
        }
        self.place(built, &w)
            .map_err(|r| refuse(format!("tensor '{name}' (id {id}): {}", r.0)))?;
        if view_src.is_some() {
            self.check_in_place(built)
                .map_err(|r| refuse(format!("tensor '{name}' (id {id}): {}", r.0)))?;
        }
        if w.flags & crate::ggml::flag::INPUT != 0 {
            self.ctx.set_input(built).map_err(fail)?;
        }
        if w.flags & crate::ggml::flag::OUTPUT != 0 {
            self.ctx.set_output(built).map_err(fail)?;
        }
        self.ctx.set_name(built, name.clone()).map_err(fail)?;
        Ok(built)
    }

    /// An in-place op's result (a node the client calls a view, built as its op) must lie
    /// exactly on its first source.
    fn check_in_place(&self, id: TensorId) -> Result<(), Refusal> {
        let t = self.ctx.get(id).map_err(|e| refuse(e.to_string()))?;
        if t.view_src.is_some() || t.nelements() == 0 {
            return Ok(());
        }
        let s0 = t.src.first().and_then(|&s| self.ctx.get(s).ok());
        let same = match (s0.and_then(|s| s.data.as_ref()), t.data.as_ref()) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a.buffer, &b.buffer) && a.offset == b.offset,
            _ => false,
        };
        match same {
            true => Ok(()),
            false => Err(refuse(
                "an in-place result that does not lie on its first source",
            )),
        }
    }

    /// Give `id` its storage: a view's comes from its source and must be where the client said;
    /// anything else must lie in one of the client's buffers.
    fn place(&mut self, id: TensorId, w: &RpcTensor) -> Result<(), Refusal> {
        let (empty, view) = match self.ctx.get(id) {
            Ok(t) => (t.nelements() == 0, t.view_src.is_some()),
            Err(e) => return Err(refuse(e.to_string())),
        };
        // ggml allocates no storage for an empty tensor and computes nothing for it; and a
        // tensor outside every buffer of the client (llama.cpp's host input that only an
        // empty view reads) is left without storage: a node that computes with it is refused
        // by the backend.
        if (empty && view) || w.buffer == 0 {
            return Ok(());
        }
        let (buffer, offset) = self.mem.locate(w.buffer, w.data)?;
        let t = self.ctx.get(id).map_err(|e| refuse(e.to_string()))?;
        if t.view_src.is_some() {
            let same = t
                .data
                .as_ref()
                .is_some_and(|d| Arc::ptr_eq(&d.buffer, &buffer) && d.offset == offset);
            return if same {
                Ok(())
            } else {
                Err(refuse(
                    "a view whose address is not its source's plus its offset",
                ))
            };
        }
        self.ctx
            .set_data(id, buffer, offset)
            .map_err(|e| refuse(e.to_string()))
    }

    fn build_op(
        &mut self,
        w: &RpcTensor,
        dtype: DType,
        ne: [usize; 4],
        nb: [usize; 4],
        src: &[Option<TensorId>; MAX_SRC],
        view_src: Option<TensorId>,
    ) -> Result<TensorId, BuildError> {
        let p = &w.op_params;
        let pf = |i: usize| f32::from_bits(p[i] as u32);
        let uses = |n: usize| -> Result<(), BuildError> {
            match src[n..].iter().position(Option::is_some) {
                Some(extra) => Err(BuildError::Refused(refuse(format!(
                    "source slot {} is set, but op {} reads {n}",
                    n + extra,
                    w.op
                )))),
                None => Ok(()),
            }
        };
        let need = |i: usize| -> Result<TensorId, BuildError> {
            src[i]
                .ok_or_else(|| BuildError::Refused(refuse(format!("op {} lacks source {i}", w.op))))
        };
        let ctx = &mut self.ctx;
        let id = match w.op {
            op::NONE => {
                uses(0)?;
                match view_src {
                    Some(v) => {
                        let offset = usize::try_from(w.view_offs)
                            .map_err(|_| BuildError::refused("view offset too large"))?;
                        ctx.view(v, &ne, &nb[1..], offset)?
                    }
                    None => {
                        let t = Tensor::new(dtype, ne)?;
                        if t.nb != nb {
                            return Err(BuildError::refused("a leaf that is not contiguous"));
                        }
                        ctx.push(t)?
                    }
                }
            }
            op::RESHAPE => {
                uses(1)?;
                ctx.reshape(need(0)?, &ne)?
            }
            op::VIEW => {
                uses(1)?;
                let offset = (p[0] as u32 as u64) | ((p[1] as u32 as u64) << 32);
                let offset = usize::try_from(offset)
                    .map_err(|_| BuildError::refused("view offset too large"))?;
                ctx.view(need(0)?, &ne, &nb[1..], offset)?
            }
            op::PERMUTE => {
                uses(1)?;
                let mut axes = [0usize; 4];
                for (a, &v) in axes.iter_mut().zip(&p[..4]) {
                    *a = usize::try_from(v).map_err(|_| BuildError::refused("negative axis"))?;
                }
                ctx.permute(need(0)?, axes)?
            }
            op::TRANSPOSE => {
                uses(1)?;
                ctx.transpose(need(0)?)?
            }
            op::DUP => {
                uses(1)?;
                ctx.dup(need(0)?)?
            }
            op::CONT => {
                uses(1)?;
                ctx.cont_shape(need(0)?, &ne)?
            }
            op::CPY => {
                uses(2)?;
                ctx.cpy(need(0)?, need(1)?)?
            }
            op::ADD | op::SUB | op::MUL | op::DIV => {
                uses(2)?;
                let (a, b) = (need(0)?, need(1)?);
                match w.op {
                    op::ADD => ctx.add(a, b)?,
                    op::SUB => ctx.sub(a, b)?,
                    op::MUL => ctx.mul(a, b)?,
                    _ => ctx.div(a, b)?,
                }
            }
            op::MUL_MAT => {
                uses(2)?;
                // ggml's hint 1: src0 is the Walsh-Hadamard matrix.
                match p[1] {
                    1 => ctx.mul_mat_hadamard(need(0)?, need(1)?)?,
                    _ => ctx.mul_mat(need(0)?, need(1)?)?,
                }
            }
            op::MUL_MAT_ID => {
                uses(3)?;
                ctx.mul_mat_id(need(0)?, need(1)?, need(2)?)?
            }
            op::SCALE => {
                uses(1)?;
                ctx.scale_bias(need(0)?, pf(0), pf(1))?
            }
            op::RMS_NORM => {
                uses(1)?;
                ctx.rms_norm(need(0)?, pf(0))?
            }
            op::NORM => {
                uses(1)?;
                ctx.norm(need(0)?, pf(0))?
            }
            op::ROPE => {
                uses(3)?;
                let params = rope_params(p)?;
                ctx.rope_ext(need(0)?, need(1)?, src[2], params)?
            }
            op::SOFT_MAX => {
                // Slots: input, mask (optional), sinks (optional).
                uses(3)?;
                ctx.soft_max_sinks(need(0)?, src[1], src[2], pf(0), pf(1))?
            }
            op::DIAG_MASK_INF => {
                uses(1)?;
                let n_past =
                    usize::try_from(p[0]).map_err(|_| BuildError::refused("negative n_past"))?;
                ctx.diag_mask_inf(need(0)?, n_past)?
            }
            op::UNARY => {
                uses(1)?;
                let a = need(0)?;
                match p[0] {
                    unary::SILU => ctx.silu(a)?,
                    unary::GELU => ctx.gelu(a)?,
                    unary::TANH => ctx.tanh(a)?,
                    unary::NEG => ctx.neg(a)?,
                    unary::SIGMOID => ctx.sigmoid(a)?,
                    unary::EXP => ctx.exp(a)?,
                    unary::SOFTPLUS => ctx.softplus(a)?,
                    u => {
                        return Err(BuildError::refused(format!(
                            "unary op {u} is not supported"
                        )))
                    }
                }
            }
            op::GLU => {
                uses(2)?;
                let a = need(0)?;
                let (a, b) = match src[1] {
                    // Split form: gate and up as two operands (swapping applies to the fused
                    // form only).
                    Some(b) => (a, b),
                    // Fused form: the two halves of each row of `a` (gate first unless swapped).
                    None => {
                        let (first, second) = halves(ctx, a)?;
                        if p[1] != 0 {
                            (second, first)
                        } else {
                            (first, second)
                        }
                    }
                };
                match p[0] {
                    glu::SWIGLU => ctx.swiglu(a, b)?,
                    glu::GEGLU => ctx.geglu(a, b)?,
                    glu::SWIGLU_OAI => ctx.swiglu_oai(a, b, pf(2), pf(3))?,
                    g => return Err(BuildError::refused(format!("GLU op {g} is not supported"))),
                }
            }
            op::CONCAT => {
                uses(2)?;
                let dim =
                    usize::try_from(p[0]).map_err(|_| BuildError::refused("negative axis"))?;
                ctx.concat(need(0)?, need(1)?, dim)?
            }
            op::REPEAT => {
                // The target shape is the node's own.
                uses(1)?;
                ctx.repeat(need(0)?, &ne)?
            }
            op::ARGMAX => {
                uses(1)?;
                ctx.argmax(need(0)?)?
            }
            op::ADD_ID => {
                uses(3)?;
                ctx.add_id(need(0)?, need(1)?, need(2)?)?
            }
            op::SUM_ROWS => {
                uses(1)?;
                ctx.sum_rows(need(0)?)?
            }
            op::CLAMP => {
                uses(1)?;
                ctx.clamp(need(0)?, pf(0), pf(1))?
            }
            op::ARGSORT => {
                uses(1)?;
                let descending = match p[0] {
                    0 => false,
                    1 => true,
                    o => return Err(BuildError::refused(format!("sort order {o}"))),
                };
                ctx.argsort(need(0)?, descending)?
            }
            op::GET_ROWS => {
                uses(2)?;
                ctx.get_rows(need(0)?, need(1)?)?
            }
            op::SET_ROWS => {
                // ggml's slots: (rows, indices, destination).
                uses(3)?;
                ctx.set_rows(need(2)?, need(0)?, need(1)?)?
            }
            op::FLASH_ATTN_EXT => {
                // Slots: q, k, v, mask (optional), sinks (optional); parameter 3 is the
                // precision, which ggml's CPU computes in f32 either way.
                uses(5)?;
                if !matches!(p[3], 0 | 10) {
                    return Err(BuildError::refused(format!(
                        "precision {} is not supported",
                        p[3]
                    )));
                }
                ctx.flash_attn_ext(
                    need(0)?,
                    need(1)?,
                    need(2)?,
                    src[3],
                    src[4],
                    pf(0),
                    pf(1),
                    pf(2),
                )?
            }
            op::SSM_CONV => {
                uses(2)?;
                ctx.ssm_conv(need(0)?, need(1)?)?
            }
            op::GATED_DELTA_NET => {
                // Slots: q, k, v, g, beta, state; parameter 0 is K, the snapshot count.
                uses(6)?;
                let snapshots = usize::try_from(p[0])
                    .map_err(|_| BuildError::refused("a negative snapshot count"))?;
                let [q, k, v, g, beta, state] = [0, 1, 2, 3, 4, 5].map(need);
                ctx.gated_delta_net(q?, k?, v?, g?, beta?, state?, snapshots)?
            }
            other => {
                return Err(BuildError::refused(format!(
                    "ggml op {other} is not supported by this server"
                )))
            }
        };
        let t = ctx.get(id)?;
        // ggml's in-place ops (`ggml_scale_inplace`, ...) give a view of their first source
        // with the op's result written over it; the storage check (`Builder::place_in_place`)
        // then requires the exact alias, which the backends compute or refuse.
        let in_place = src[0].is_some_and(|s0| {
            ctx.get(s0)
                .is_ok_and(|a| a.ne == t.ne && a.nb == t.nb && a.dtype == t.dtype)
        });
        match (view_src.is_some(), t.view_src.is_some()) {
            (true, false) if in_place => {}
            (true, false) | (false, true) => {
                return Err(BuildError::refused("its view source does not match its op"))
            }
            _ => {}
        }
        Ok(id)
    }
}

/// Views of the first and second halves of each row of `a` (ggml's fused GLU operand).
fn halves(ctx: &mut Context, a: TensorId) -> Result<(TensorId, TensorId), BuildError> {
    let t = ctx.get(a)?;
    let (ne, nb, dtype) = (t.ne, t.nb, t.dtype);
    if dtype != DType::F32 || !ne[0].is_multiple_of(2) {
        return Err(BuildError::refused(
            "a fused GLU operand must be f32 with an even row",
        ));
    }
    let half = [ne[0] / 2, ne[1], ne[2], ne[3]];
    let first = ctx.view(a, &half, &nb[1..], 0)?;
    let second = ctx.view(a, &half, &nb[1..], half[0] * dtype.block_bytes())?;
    Ok((first, second))
}

fn rope_params(p: &[i32; 16]) -> Result<RopeParams, BuildError> {
    let pf = |i: usize| f32::from_bits(p[i] as u32);
    let section = |i: usize| {
        u32::try_from(p[rope::SECTIONS_AT + i])
            .map_err(|_| BuildError::refused("a negative rope section"))
    };
    let sections = [section(0)?, section(1)?, section(2)?, section(3)?];
    let mode = match p[2] {
        rope::NORMAL | rope::NEOX if sections != [0; 4] => {
            return Err(BuildError::refused("rope sections in a one-position mode"))
        }
        rope::NORMAL => RopeMode::Normal,
        rope::NEOX => RopeMode::Neox,
        rope::MROPE => RopeMode::Mrope { sections },
        rope::IMROPE => RopeMode::Imrope { sections },
        rope::VISION => {
            return Err(BuildError::refused(
                "the vision rope mode (24) is not supported",
            ))
        }
        m => {
            return Err(BuildError::refused(format!(
                "rope mode {m} is not supported"
            )))
        }
    };
    if p[rope::N_OFFS_AT] != 0 {
        return Err(BuildError::refused(
            "rope offsets (n_offs) are not supported",
        ));
    }
    let count = |v: i32| usize::try_from(v).map_err(|_| BuildError::refused("negative rope size"));
    Ok(RopeParams {
        mode,
        n_dims: count(p[1])?,
        n_ctx_orig: count(p[4])?,
        freq_base: pf(5),
        freq_scale: pf(6),
        ext_factor: pf(7),
        attn_factor: pf(8),
        beta_fast: pf(9),
        beta_slow: pf(10),
    })
}

/// Why one tensor could not be built.
enum BuildError {
    Core(rgml::Error),
    Refused(Refusal),
}

impl BuildError {
    fn refused(why: impl Into<String>) -> BuildError {
        BuildError::Refused(refuse(why))
    }
}

impl From<rgml::Error> for BuildError {
    fn from(e: rgml::Error) -> BuildError {
        BuildError::Core(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{encode_op, ggml_src_order};
    use rgml::{Device as _, Op};

    /// Buffer 1 of a client, at address 0.
    struct OneBuffer(Arc<Buffer>);

    impl Locate for OneBuffer {
        fn locate(&self, buffer: u64, address: u64) -> Result<(Arc<Buffer>, usize), Refusal> {
            match buffer {
                1 => Ok((self.0.clone(), address as usize)),
                _ => Err(refuse("an unknown buffer")),
            }
        }
    }

    /// Every tensor of `ctx` (no views) as ggml's client packs it, one after another in
    /// buffer 1, with `op_params` changed by `edit` for the last one; and what the server
    /// rebuilds of it.
    fn round_trip(ctx: &Context, edit: impl Fn(&mut [i32; 16])) -> Result<Rebuilt, Refusal> {
        let mut tensors = Vec::new();
        let mut data = 0;
        for id in ctx.ids() {
            let t = &ctx[id];
            let g = encode_op(t).map_err(|e| refuse(e.to_string()))?;
            let mut w = RpcTensor {
                id: id.index() as u64 + 1,
                dtype: t.dtype.ggml_id(),
                buffer: 1,
                ne: t.ne.map(|v| v as u32),
                nb: t.nb.map(|v| v as u32),
                op: g.op,
                op_params: g.params,
                data,
                ..RpcTensor::default()
            };
            for (slot, i) in ggml_src_order(&t.op, t.src.len()).into_iter().enumerate() {
                if let Some(i) = i {
                    w.src[slot] = t.src[i].index() as u64 + 1;
                }
            }
            data += (t.nbytes() as u64).next_multiple_of(64);
            tensors.push(w);
        }
        let last = tensors.last_mut().ok_or_else(|| refuse("no tensors"))?;
        edit(&mut last.op_params);
        let wire = WireGraph {
            device: 0,
            nodes: vec![last.id],
            tensors,
        };
        let cpu = rgml_cpu::CpuDevice::new("CPU").buffer_type();
        let buffer = Buffer::alloc(&cpu, data as usize).map_err(|e| refuse(e.to_string()))?;
        rebuild(&wire, &OneBuffer(buffer))
    }

    /// The rebuilt graph's node equals the one sent.
    fn same_node(ctx: &Context, rebuilt: &Rebuilt) {
        let sent = ctx.ids().last().map(|id| &ctx[id]).unwrap();
        let node = rebuilt.graph.nodes()[0];
        let got = &rebuilt.ctx[node];
        assert_eq!(
            (got.op, got.ne, got.src.len()),
            (sent.op, sent.ne, sent.src.len())
        );
    }

    #[test]
    fn qwen35s_ops_round_trip_and_the_vision_rope_is_refused() {
        let sections = [11, 11, 10, 0];
        for mode in [RopeMode::Mrope { sections }, RopeMode::Imrope { sections }] {
            let mut ctx = Context::new();
            let x = ctx.new_tensor(DType::F32, &[256, 2, 3]).unwrap();
            let pos = ctx.new_tensor(DType::I32, &[12]).unwrap();
            let ff = ctx.new_tensor(DType::F32, &[32]).unwrap();
            let p = RopeParams::new(mode, 64, 1e7);
            ctx.rope_ext(x, pos, Some(ff), p).unwrap();
            same_node(&ctx, &round_trip(&ctx, |_| ()).unwrap());
            // Vision mode, negative sections, offsets: refused by name.
            for (at, value, why) in [
                (2, 24, "vision"),
                (12, -1, "negative rope section"),
                (15, 2, "n_offs"),
            ] {
                let e = round_trip(&ctx, |p| p[at] = value).err().unwrap();
                assert!(e.0.contains(why), "{}", e.0);
            }
        }
        let mut ctx = Context::new();
        let sx = ctx.new_tensor(DType::F32, &[6, 8, 2]).unwrap();
        let c = ctx.new_tensor(DType::F32, &[4, 8]).unwrap();
        ctx.ssm_conv(sx, c).unwrap();
        same_node(&ctx, &round_trip(&ctx, |_| ()).unwrap());

        let mut ctx = Context::new();
        let mut f32s = |ne: &[usize]| ctx.new_tensor(DType::F32, ne).unwrap();
        let (q, k, v) = (
            f32s(&[8, 1, 3, 2]),
            f32s(&[8, 1, 3, 2]),
            f32s(&[8, 2, 3, 2]),
        );
        let (g, beta, s) = (
            f32s(&[8, 2, 3, 2]),
            f32s(&[1, 2, 3, 2]),
            f32s(&[8, 8, 2, 2]),
        );
        ctx.gated_delta_net(q, k, v, g, beta, s, 2).unwrap();
        let rebuilt = round_trip(&ctx, |_| ()).unwrap();
        same_node(&ctx, &rebuilt);
        let node = rebuilt.graph.nodes()[0];
        assert_eq!(rebuilt.ctx[node].op, Op::GatedDeltaNet { snapshots: 2 });
        // K is the result's shape: another K states another size, and K = 0 is refused.
        for k in [1, 0, -1] {
            assert!(round_trip(&ctx, |p| p[0] = k).is_err());
        }
    }

    /// REPEAT (ggml op 20, llama.cpp's per-expert scales) is rebuilt with the node's own shape
    /// as its target; a type ggml-cpu does not repeat is refused, not computed.
    #[test]
    fn repeat_round_trips_with_its_shape() {
        for (dtype, from, to) in [
            (DType::F32, [1, 8, 1, 1], [1, 8, 5, 1]),
            (DType::F16, [4, 3, 1, 1], [8, 6, 2, 1]),
            (DType::I32, [3, 1, 1, 1], [3, 2, 2, 2]),
        ] {
            let mut ctx = Context::new();
            let a = ctx.new_tensor(dtype, &from).unwrap();
            let r = ctx.repeat(a, &to).unwrap();
            let t = ctx.get(r).unwrap();
            assert_eq!(encode_op(t).unwrap().op, op::REPEAT);
            let rebuilt = round_trip(&ctx, |_| ()).unwrap();
            same_node(&ctx, &rebuilt);
            let node = rebuilt.graph.nodes()[0];
            assert_eq!(rebuilt.ctx[node].op, Op::Repeat);
        }
        // A Q8_0 REPEAT as a client could send it (rgml's builder refuses to make one).
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::Q8_0, &[32, 2]).unwrap();
        let mut node = Tensor::new(DType::Q8_0, [64, 2, 1, 1]).unwrap();
        node.op = Op::Repeat;
        node.src = vec![a];
        ctx.push(node).unwrap();
        let e = round_trip(&ctx, |_| ()).err().unwrap();
        assert!(e.0.contains("REPEAT"), "{}", e.0);
    }
}
