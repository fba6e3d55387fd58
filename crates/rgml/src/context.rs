//! The tensor arena and the op builders.
//!
//! A [`Context`] owns tensor metadata; every builder validates its operands (shapes, dtypes,
//! parameters) and returns an error instead of building a graph that cannot run. Storage is
//! assigned later by an allocator; reading and writing tensor bytes goes through the tensor's
//! buffer ([`Context::tensor_set`] and friends).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{Op, OpKind, RopeParams, UnaryOp};
use crate::tensor::{contiguous_strides, Tensor, TensorData, TensorFlags, TensorId, MAX_DIMS};
use std::ops::Index;

mod recurrent;

/// An arena of tensors.
///
/// Every context has a process-unique [`uid`](Self::uid) (a clone gets a new one) and an
/// [`epoch`](Self::epoch) that every change of tensor metadata advances (a new tensor, a
/// truncation, any mutable access to a tensor: its op, shape, strides, storage, name, flags).
/// Changing tensor *values* (`tensor_set`) does not. So work prepared from a graph of a
/// context (a backend's [`GraphPlan`](crate::backend::GraphPlan), a scheduler's splits) stays
/// valid exactly while the graph's uid, the context's uid and its epoch are unchanged: an O(1)
/// check.
#[derive(Debug)]
pub struct Context {
    tensors: Vec<Tensor>,
    /// `serials[i]` is the serial of `tensors[i]` (see [`TensorId`]).
    serials: Vec<u64>,
    uid: u64,
    epoch: u64,
}

static NEXT_CONTEXT_UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_context_uid() -> u64 {
    NEXT_CONTEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Tensor serials are unique in the process, across contexts, so an id is never valid in a
/// context that did not create its tensor (or clone it from the one that did). 64 bits do not
/// wrap in any process lifetime.
static NEXT_TENSOR_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_tensor_serial() -> u64 {
    NEXT_TENSOR_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Default for Context {
    fn default() -> Self {
        Context {
            tensors: Vec::new(),
            serials: Vec::new(),
            uid: next_context_uid(),
            epoch: 0,
        }
    }
}

/// A copy with its own uid: the two may change independently from here on, so work prepared
/// for one must never be taken for the other.
impl Clone for Context {
    fn clone(&self) -> Self {
        Context {
            tensors: self.tensors.clone(),
            serials: self.serials.clone(),
            uid: next_context_uid(),
            epoch: self.epoch,
        }
    }
}

/// `ctx[id]` for an id known to be of this context (the builders' results, ids already
/// checked by [`Context::get`]).
///
/// # Panics
/// If `id` does not belong to this context (see [`TensorId`]); [`Context::get`] returns the
/// error instead.
impl Index<TensorId> for Context {
    type Output = Tensor;
    fn index(&self, id: TensorId) -> &Tensor {
        match self.get(id) {
            Ok(tensor) => tensor,
            Err(err) => panic!("{err}"),
        }
    }
}

/// The element count of shape `ne`, `None` if it overflows (a shape from a file or a peer may
/// be anything).
fn checked_count(ne: [usize; MAX_DIMS]) -> Option<usize> {
    ne.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n))
}

fn shape4(dims: &[usize], op: OpKind) -> Result<[usize; MAX_DIMS]> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("a tensor has 1 to 4 dimensions, got {}", dims.len()),
        });
    }
    let mut ne = [1; MAX_DIMS];
    ne[..dims.len()].copy_from_slice(dims);
    Ok(ne)
}

/// ggml's rules for the sections of a multi-section ROPE of rows of `ne0` values: one of the
/// first three is not 0 (`ggml_compute_forward_rope`), and they sum to at most `ne0` pairs
/// (`ggml_mrope_cache_init`).
fn check_rope_sections(sections: [u32; 4], ne0: usize) -> Result<()> {
    let total: u64 = sections.iter().map(|&s| u64::from(s)).sum();
    if sections[..3].iter().all(|&s| s == 0) || total > ne0 as u64 {
        return Err(Error::InvalidArgument {
            op: OpKind::Rope,
            reason: format!(
                "rope sections {sections:?} must not all be 0 in the first three and must sum \
                 to at most ne0 {ne0}"
            ),
        });
    }
    Ok(())
}

/// Whether `b` can be broadcast (repeated) to the shape of `a`.
pub fn can_repeat(b: &Tensor, a: &Tensor) -> bool {
    (0..MAX_DIMS).all(|i| b.ne[i] != 0 && a.ne[i].is_multiple_of(b.ne[i]))
}

impl Context {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// This context's process-unique id (see the type's docs).
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// How many times tensor metadata has changed (see the type's docs).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the arena is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// All tensor ids, in creation order.
    pub fn ids(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.serials
            .iter()
            .enumerate()
            .map(|(index, &serial)| TensorId {
                index: index as u32,
                serial,
            })
    }

    /// The id of the tensor at arena position `index` (for code that keeps positions, such as
    /// a plan reused for a graph rebuilt with the same structure).
    pub fn id_at(&self, index: usize) -> Option<TensorId> {
        let serial = *self.serials.get(index)?;
        Some(TensorId {
            index: u32::try_from(index).ok()?,
            serial,
        })
    }

    /// Whether `id` names a tensor of this context (see [`TensorId`]).
    pub fn contains(&self, id: TensorId) -> bool {
        self.serials.get(id.index()) == Some(&id.serial)
    }

    /// The tensor `id`, or [`Error::InvalidTensor`] if it does not belong to this context.
    pub fn get(&self, id: TensorId) -> Result<&Tensor> {
        if !self.contains(id) {
            return Err(Error::InvalidTensor(id.index()));
        }
        Ok(&self.tensors[id.index()])
    }

    /// Mutable access to tensor `id` (advances the epoch: the caller may change anything).
    pub fn get_mut(&mut self, id: TensorId) -> Result<&mut Tensor> {
        if !self.contains(id) {
            return Err(Error::InvalidTensor(id.index()));
        }
        self.epoch += 1;
        Ok(&mut self.tensors[id.index()])
    }

    /// Drop every tensor created after the first `len` (e.g. a per-token graph built on top of
    /// the weights), so the arena does not grow with each step.
    pub fn truncate(&mut self, len: usize) {
        if len < self.tensors.len() {
            self.epoch += 1;
        }
        self.tensors.truncate(len);
        self.serials.truncate(len);
    }

    /// The first tensor named `name`.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.ids().find(|&id| self[id].name == name)
    }

    /// Add a tensor as is (used by graph copies and loaders); returns its id.
    pub fn push(&mut self, tensor: Tensor) -> Result<TensorId> {
        for &s in tensor.src.iter().chain(tensor.view_src.iter()) {
            self.get(s)?;
        }
        let index = u32::try_from(self.tensors.len()).map_err(|_| Error::SizeOverflow)?;
        let serial = next_tensor_serial();
        self.epoch += 1;
        self.tensors.push(tensor);
        self.serials.push(serial);
        Ok(TensorId { index, serial })
    }

    /// The id the tensor pushed `ahead` pushes from now will get, its serial reserved now:
    /// for callers that name tensors before they can push them (see [`Self::push_reserved`]).
    pub(crate) fn reserve_id(&self, ahead: usize) -> Result<TensorId> {
        let index = self
            .tensors
            .len()
            .checked_add(ahead)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or(Error::SizeOverflow)?;
        Ok(TensorId {
            index,
            serial: next_tensor_serial(),
        })
    }

    /// Push `tensor` under an id from [`Self::reserve_id`]; the reserved ids must be pushed in
    /// the order of their positions, with nothing pushed between.
    pub(crate) fn push_reserved(&mut self, id: TensorId, tensor: Tensor) -> Result<TensorId> {
        if id.index() != self.tensors.len() {
            return Err(Error::InvalidTensor(id.index()));
        }
        for &s in tensor.src.iter().chain(tensor.view_src.iter()) {
            self.get(s)?;
        }
        self.epoch += 1;
        self.tensors.push(tensor);
        self.serials.push(id.serial);
        Ok(id)
    }

    /// A new leaf tensor with contiguous layout; `dims` has 1 to 4 entries.
    pub fn new_tensor(&mut self, dtype: DType, dims: &[usize]) -> Result<TensorId> {
        let ne = shape4(dims, OpKind::None)?;
        self.push(Tensor::new(dtype, ne)?)
    }

    /// Set a tensor's name.
    pub fn set_name(&mut self, id: TensorId, name: impl Into<String>) -> Result<()> {
        self.get_mut(id)?.name = name.into();
        Ok(())
    }

    /// Add role flags to a tensor.
    pub fn set_flags(&mut self, id: TensorId, flags: TensorFlags) -> Result<()> {
        self.get_mut(id)?.flags.insert(flags);
        Ok(())
    }

    /// Mark `id` as a graph input.
    pub fn set_input(&mut self, id: TensorId) -> Result<()> {
        self.set_flags(id, TensorFlags::INPUT)
    }

    /// Mark `id` as a graph output.
    pub fn set_output(&mut self, id: TensorId) -> Result<()> {
        self.set_flags(id, TensorFlags::OUTPUT)
    }

    /// Give tensor `id` storage at `offset` in `buffer` (views get their source's storage
    /// through [`Context::init_view`]). Checks that the tensor fits the buffer.
    pub fn set_data(
        &mut self,
        id: TensorId,
        buffer: std::sync::Arc<crate::backend::Buffer>,
        offset: usize,
    ) -> Result<()> {
        let t = self.get(id)?;
        let size = buffer.alloc_size(t);
        if offset
            .checked_add(size)
            .is_none_or(|end| end > buffer.size())
        {
            return Err(Error::OutOfBounds {
                what: format!(
                    "tensor '{}' in buffer '{}'",
                    t.display_name(),
                    buffer.name()
                ),
                offset,
                size,
                limit: buffer.size(),
            });
        }
        // As in ggml, the buffer sees the tensor with its storage set (so it knows where the
        // tensor lives); a refusal leaves the tensor without storage.
        let init = buffer.clone();
        self.get_mut(id)?.data = Some(TensorData { buffer, offset });
        if let Err(e) = init.init_tensor(self.get(id)?) {
            self.get_mut(id)?.data = None;
            return Err(e);
        }
        Ok(())
    }

    /// Give view `id` the storage of its view source (which must already have storage).
    pub fn init_view(&mut self, id: TensorId) -> Result<()> {
        let t = self.get(id)?;
        let Some(src) = t.view_src else {
            return Ok(());
        };
        let view_offset = t.view_offset;
        let data = self[src]
            .data
            .clone()
            .ok_or_else(|| Error::NoStorage(self[src].display_name().to_string()))?;
        let t = self.get_mut(id)?;
        t.data = Some(TensorData {
            buffer: data.buffer,
            offset: data.offset + view_offset,
        });
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Builders.

    fn node(
        &mut self,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        op: Op,
        src: &[TensorId],
    ) -> Result<TensorId> {
        let mut t = Tensor::new(dtype, ne)?;
        t.op = op;
        t.src = src.to_vec();
        self.push(t)
    }

    fn view_node(
        &mut self,
        a: TensorId,
        ne: [usize; MAX_DIMS],
        nb: [usize; MAX_DIMS],
        offset: usize,
        op: Op,
        dtype: DType,
    ) -> Result<TensorId> {
        let src = self.get(a)?;
        let (root, root_offset) = match src.view_src {
            Some(root) => (root, src.view_offset + offset),
            None => (a, offset),
        };
        let mut t = Tensor::new(dtype, ne)?;
        t.nb = nb;
        t.op = op;
        t.src = vec![a];
        t.view_src = Some(root);
        t.view_offset = root_offset;
        let root_bytes = self[root].nbytes();
        if root_offset + t.nbytes() > root_bytes {
            return Err(Error::InvalidArgument {
                op: op.kind(),
                reason: format!(
                    "view of {} bytes at offset {root_offset} exceeds its source's {root_bytes} bytes",
                    t.nbytes()
                ),
            });
        }
        if let Some(data) = &self[root].data {
            t.data = Some(TensorData {
                buffer: data.buffer.clone(),
                offset: data.offset + root_offset,
            });
        }
        self.push(t)
    }

    fn expect_dtype(
        &self,
        op: OpKind,
        id: TensorId,
        allowed: &[DType],
        which: &'static str,
    ) -> Result<()> {
        let dtype = self.get(id)?.dtype;
        if allowed.contains(&dtype) {
            Ok(())
        } else {
            Err(Error::UnsupportedDType {
                op,
                dtype,
                reason: which,
            })
        }
    }

    fn expect_same_shape(&self, op: OpKind, a: TensorId, b: TensorId) -> Result<()> {
        let (ta, tb) = (self.get(a)?, self.get(b)?);
        if ta.ne != tb.ne {
            return Err(Error::ShapeMismatch {
                op,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "shapes must be equal",
            });
        }
        Ok(())
    }

    /// A contiguous copy of `a` (same dtype).
    pub fn dup(&mut self, a: TensorId) -> Result<TensorId> {
        let t = self.get(a)?;
        let (dtype, ne) = (t.dtype, t.ne);
        self.node(dtype, ne, Op::Dup, &[a])
    }

    /// Copy `a` into `b` converting the dtype; the result is a view of `b`. Element counts must match.
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let (ta, tb) = (self.get(a)?, self.get(b)?);
        if ta.nelements() != tb.nelements() {
            return Err(Error::ShapeMismatch {
                op: OpKind::Cpy,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "element counts must match",
            });
        }
        if !ta.dtype.is_float() && ta.dtype != tb.dtype {
            return Err(Error::UnsupportedDType {
                op: OpKind::Cpy,
                dtype: ta.dtype,
                reason: "i32 copies only to i32",
            });
        }
        if ta.dtype.is_quantized() && tb.dtype != DType::F32 && tb.dtype != ta.dtype {
            return Err(Error::UnsupportedDType {
                op: OpKind::Cpy,
                dtype: ta.dtype,
                reason: "quantized sources copy to f32 or the same type",
            });
        }
        let (ne, nb, dtype) = (tb.ne, tb.nb, tb.dtype);
        let id = self.view_node(b, ne, nb, 0, Op::Cpy, dtype)?;
        self.get_mut(id)?.src = vec![a, b];
        Ok(id)
    }

    /// A contiguous copy of `a` (same dtype and shape).
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        let ne = self.get(a)?.ne;
        self.cont_shape(a, &ne)
    }

    /// A contiguous copy of `a` with the new shape `dims` (same element count).
    pub fn cont_shape(&mut self, a: TensorId, dims: &[usize]) -> Result<TensorId> {
        let ne = shape4(dims, OpKind::Cont)?;
        let t = self.get(a)?;
        if Some(t.nelements()) != checked_count(ne) {
            return Err(Error::ShapeMismatch {
                op: OpKind::Cont,
                lhs: t.ne,
                rhs: ne,
                reason: "element counts must match",
            });
        }
        let dtype = t.dtype;
        self.node(dtype, ne, Op::Cont, &[a])
    }

    /// `a` (contiguous) seen with shape `dims`.
    pub fn reshape(&mut self, a: TensorId, dims: &[usize]) -> Result<TensorId> {
        let ne = shape4(dims, OpKind::Reshape)?;
        let t = self.get(a)?;
        if !t.is_contiguous() {
            return Err(Error::InvalidArgument {
                op: OpKind::Reshape,
                reason: format!("source '{}' is not contiguous", t.display_name()),
            });
        }
        if Some(t.nelements()) != checked_count(ne) {
            return Err(Error::ShapeMismatch {
                op: OpKind::Reshape,
                lhs: t.ne,
                rhs: ne,
                reason: "element counts must match",
            });
        }
        let dtype = t.dtype;
        let nb = contiguous_strides(dtype, ne)?;
        self.view_node(a, ne, nb, 0, Op::Reshape, dtype)
    }

    /// A view of `a` with shape `dims`, strides `nb_outer` for dims 1.. (dim 0 stays dense), at
    /// byte `offset`. Must lie within `a`'s memory.
    pub fn view(
        &mut self,
        a: TensorId,
        dims: &[usize],
        nb_outer: &[usize],
        offset: usize,
    ) -> Result<TensorId> {
        let ne = shape4(dims, OpKind::View)?;
        let t = self.get(a)?;
        let dtype = t.dtype;
        if nb_outer.len() + 1 != dims.len() {
            return Err(Error::InvalidArgument {
                op: OpKind::View,
                reason: format!(
                    "{} dims need {} strides, got {}",
                    dims.len(),
                    dims.len() - 1,
                    nb_outer.len()
                ),
            });
        }
        let mut nb = contiguous_strides(dtype, ne)?;
        for (i, &s) in nb_outer.iter().enumerate() {
            nb[i + 1] = s;
        }
        // Unused dims keep a stride consistent with the last given one.
        for i in dims.len()..MAX_DIMS {
            nb[i] = nb[i - 1] * ne[i - 1];
        }
        self.view_node(a, ne, nb, offset, Op::View { offset }, dtype)
    }

    /// Reorder dims: source dim `i` goes to position `axes[i]`.
    pub fn permute(&mut self, a: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        let mut seen = [false; 4];
        for &x in &axes {
            if x >= 4 || seen[x] {
                return Err(Error::InvalidArgument {
                    op: OpKind::Permute,
                    reason: format!("{axes:?} is not a permutation of 0..4"),
                });
            }
            seen[x] = true;
        }
        let t = self.get(a)?;
        let (mut ne, mut nb) = ([0; 4], [0; 4]);
        for i in 0..4 {
            ne[axes[i]] = t.ne[i];
            nb[axes[i]] = t.nb[i];
        }
        let dtype = t.dtype;
        let id = self.view_node(a, ne, [0; 4], 0, Op::Permute { axes }, dtype)?;
        self.get_mut(id)?.nb = nb;
        Ok(id)
    }

    /// Swap dims 0 and 1.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        let id = self.permute(a, [1, 0, 2, 3])?;
        self.get_mut(id)?.op = Op::Transpose;
        Ok(id)
    }

    /// Rows of `a` picked by I32 indices `rows` (`[n, a.ne2, a.ne3]`): result f32
    /// `[a.ne0, n, a.ne2, a.ne3]` (i32 for i32 sources).
    pub fn get_rows(&mut self, a: TensorId, rows: TensorId) -> Result<TensorId> {
        self.expect_dtype(
            OpKind::GetRows,
            rows,
            &[DType::I32],
            "row indices must be i32",
        )?;
        let (ta, tb) = (self.get(a)?, self.get(rows)?);
        if ta.dtype == DType::I64 {
            return Err(Error::UnsupportedDType {
                op: OpKind::GetRows,
                dtype: ta.dtype,
                reason: "rows must be floating point or i32",
            });
        }
        if ta.ne[2] != tb.ne[1] || tb.ne[3] != 1 || ta.ne[3] != tb.ne[2] {
            return Err(Error::ShapeMismatch {
                op: OpKind::GetRows,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "indices must be [n, src.ne2, src.ne3]",
            });
        }
        let dtype = if ta.dtype == DType::I32 {
            DType::I32
        } else {
            DType::F32
        };
        let ne = [ta.ne[0], tb.ne[0], tb.ne[1], tb.ne[2]];
        self.node(dtype, ne, Op::GetRows, &[a, rows])
    }

    /// Write the f32 rows of `src` into `dst` at I32 or I64 indices `rows` (`[src.ne1, k2, k3]`, src dims
    /// 2 and 3 multiples of k2, k3); the result is a view of `dst`.
    pub fn set_rows(&mut self, dst: TensorId, src: TensorId, rows: TensorId) -> Result<TensorId> {
        self.expect_dtype(
            OpKind::SetRows,
            src,
            &[DType::F32],
            "source rows must be f32",
        )?;
        self.expect_dtype(
            OpKind::SetRows,
            rows,
            &[DType::I32, DType::I64],
            "row indices must be i32 or i64",
        )?;
        let (ta, tb, tc) = (self.get(dst)?, self.get(src)?, self.get(rows)?);
        if ta.ne[0] != tb.ne[0] || ta.ne[2] != tb.ne[2] || ta.ne[3] != tb.ne[3] {
            return Err(Error::ShapeMismatch {
                op: OpKind::SetRows,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "destination and source differ in dims 0, 2 or 3",
            });
        }
        if tb.ne[1] != tc.ne[0]
            || tc.ne[1] == 0
            || tc.ne[2] == 0
            || !tb.ne[2].is_multiple_of(tc.ne[1])
            || !tb.ne[3].is_multiple_of(tc.ne[2])
            || tc.ne[3] != 1
        {
            return Err(Error::ShapeMismatch {
                op: OpKind::SetRows,
                lhs: tb.ne,
                rhs: tc.ne,
                reason: "indices must be [src.ne1, k2, k3] with k2, k3 dividing src dims 2, 3",
            });
        }
        let (ne, nb, dtype) = (ta.ne, ta.nb, ta.dtype);
        let id = self.view_node(dst, ne, nb, 0, Op::SetRows, dtype)?;
        self.get_mut(id)?.src = vec![dst, src, rows];
        Ok(id)
    }

    fn binary(&mut self, op: Op, a: TensorId, b: TensorId) -> Result<TensorId> {
        let kind = op.kind();
        let (ta, tb) = (self.get(a)?, self.get(b)?);
        for t in [ta, tb] {
            if t.dtype.is_quantized() || !t.dtype.is_float() {
                return Err(Error::UnsupportedDType {
                    op: kind,
                    dtype: t.dtype,
                    reason: "operands must be f32, f16 or bf16",
                });
            }
        }
        if !can_repeat(tb, ta) {
            return Err(Error::ShapeMismatch {
                op: kind,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "src1 must broadcast to src0",
            });
        }
        let (dtype, ne) = (ta.dtype, ta.ne);
        self.node(dtype, ne, op, &[a, b])
    }

    /// `a + b` (b broadcast to a's shape).
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Add, a, b)
    }
    /// `a - b` (b broadcast to a's shape).
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Sub, a, b)
    }
    /// `a * b` (b broadcast to a's shape).
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Mul, a, b)
    }
    /// `a / b` (b broadcast to a's shape).
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Div, a, b)
    }

    fn unary_like(&mut self, op: Op, a: TensorId) -> Result<TensorId> {
        let t = self.get(a)?;
        if t.dtype != DType::F32 {
            return Err(Error::UnsupportedDType {
                op: op.kind(),
                dtype: t.dtype,
                reason: "operand must be f32",
            });
        }
        let ne = t.ne;
        self.node(DType::F32, ne, op, &[a])
    }

    /// `a * scale`.
    pub fn scale(&mut self, a: TensorId, scale: f32) -> Result<TensorId> {
        self.scale_bias(a, scale, 0.0)
    }

    /// `a * scale + bias`.
    pub fn scale_bias(&mut self, a: TensorId, scale: f32, bias: f32) -> Result<TensorId> {
        self.unary_like(Op::Scale { scale, bias }, a)
    }

    /// Matrix product per ggml: `a` `[k, m, ...]` (any weight dtype) and `b` `[k, n, b2, b3]`
    /// (f32) give f32 `[m, n, b2, b3]`; `a`'s dims 2 and 3 broadcast to `b`'s.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.mul_mat_op(a, b, false)
    }

    /// [`Context::mul_mat`] whose every `b` row is computed as a product of that row alone
    /// would compute it (see [`Op::MulMat`]): the rows of independent sequences batched
    /// together give their results alone, bit for bit.
    pub fn mul_mat_rows_alone(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.mul_mat_op(a, b, true)
    }

    /// Expert products (ggml's `ggml_mul_mat_id`, see [`Op::MulMatId`]): `as` `[k, n,
    /// n_expert]` weights, `b` f32 `[k, n_b, n_tokens]`, `ids` I32 `[n_used, n_tokens]` with
    /// `n_b` dividing `n_used`; f32 `[n, n_used, n_tokens]`.
    pub fn mul_mat_id(&mut self, as_: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        self.mul_mat_id_op(as_, b, ids, false)
    }

    /// [`Context::mul_mat_id`] whose every product takes the arithmetic of a lone routed row
    /// (see [`Op::MulMatId`]).
    pub fn mul_mat_id_rows_alone(
        &mut self,
        as_: TensorId,
        b: TensorId,
        ids: TensorId,
    ) -> Result<TensorId> {
        self.mul_mat_id_op(as_, b, ids, true)
    }

    fn mul_mat_id_op(
        &mut self,
        as_: TensorId,
        b: TensorId,
        ids: TensorId,
        rows_alone: bool,
    ) -> Result<TensorId> {
        let kind = OpKind::MulMatId;
        self.expect_dtype(kind, b, &[DType::F32], "src1 must be f32")?;
        self.expect_dtype(kind, ids, &[DType::I32], "ids must be i32")?;
        let (ta, tb, ti) = (self.get(as_)?, self.get(b)?, self.get(ids)?);
        if !ta.dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: kind,
                dtype: ta.dtype,
                reason: "src0 must hold floats",
            });
        }
        if ta.is_transposed() {
            return Err(Error::InvalidArgument {
                op: kind,
                reason: "src0 must not be transposed".into(),
            });
        }
        let shapes_fit = ta.ne[3] == 1
            && tb.ne[3] == 1
            && ti.ne[2] == 1
            && ti.ne[3] == 1
            && ti.ne[1] == tb.ne[2]
            && ta.ne[0] == tb.ne[0]
            && ta.ne[2] > 0
            && tb.ne[1] > 0
            && ti.ne[0].is_multiple_of(tb.ne[1]);
        if !shapes_fit {
            return Err(Error::ShapeMismatch {
                op: kind,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "need as [k, n, experts], b [k, n_b, tokens], ids [n_used, tokens] with n_b dividing n_used",
            });
        }
        let ne = [ta.ne[1], ti.ne[0], tb.ne[2], 1];
        self.node(DType::F32, ne, Op::MulMatId { rows_alone }, &[as_, b, ids])
    }

    fn mul_mat_op(&mut self, a: TensorId, b: TensorId, rows_alone: bool) -> Result<TensorId> {
        self.expect_dtype(OpKind::MulMat, b, &[DType::F32], "src1 must be f32")?;
        let (ta, tb) = (self.get(a)?, self.get(b)?);
        if !ta.dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: OpKind::MulMat,
                dtype: ta.dtype,
                reason: "src0 must hold floats",
            });
        }
        if ta.ne[0] != tb.ne[0]
            || ta.ne[2] == 0
            || ta.ne[3] == 0
            || !tb.ne[2].is_multiple_of(ta.ne[2])
            || !tb.ne[3].is_multiple_of(ta.ne[3])
        {
            return Err(Error::ShapeMismatch {
                op: OpKind::MulMat,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "need equal ne0 and src0 dims 2, 3 dividing src1's",
            });
        }
        if ta.is_transposed() {
            return Err(Error::InvalidArgument {
                op: OpKind::MulMat,
                reason: "src0 must not be transposed".into(),
            });
        }
        let ne = [ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3]];
        let op = Op::MulMat {
            rows_alone,
            hadamard: false,
        };
        self.node(DType::F32, ne, op, &[a, b])
    }

    /// `h · x` for `h` the `n × n` Walsh-Hadamard matrix over `sqrt(n)` (f32, `n` a power of
    /// two; its values are the caller's to set) and `x` f32 or f16 with rows of `n`: a
    /// [`Op::MulMat`] marked `hadamard`, which ggml-cpu computes as a fast Walsh-Hadamard
    /// transform (llama.cpp's `llama_mul_mat_hadamard` of quantized KV caches).
    pub fn mul_mat_hadamard(&mut self, h: TensorId, x: TensorId) -> Result<TensorId> {
        let kind = OpKind::MulMat;
        self.expect_dtype(kind, h, &[DType::F32], "the Hadamard matrix must be f32")?;
        self.expect_dtype(
            kind,
            x,
            &[DType::F32, DType::F16],
            "src1 must be f32 or f16",
        )?;
        let (th, tx) = (self.get(h)?, self.get(x)?);
        let n = th.ne[0];
        if th.ne != [n, n, 1, 1] || !n.is_power_of_two() || tx.ne[0] != n {
            return Err(Error::ShapeMismatch {
                op: kind,
                lhs: th.ne,
                rhs: tx.ne,
                reason: "need a square matrix of a power-of-two size and rows of that size",
            });
        }
        if !th.is_contiguous() || !tx.rows_contiguous() {
            return Err(Error::NotContiguous(tx.display_name().to_string()));
        }
        let ne = [n, tx.ne[1], tx.ne[2], tx.ne[3]];
        let op = Op::MulMat {
            rows_alone: false,
            hadamard: true,
        };
        self.node(DType::F32, ne, op, &[h, x])
    }

    /// Root-mean-square normalization of each row.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.unary_like(Op::RmsNorm { eps }, a)
    }

    /// Mean/variance normalization of each row.
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.unary_like(Op::Norm { eps }, a)
    }

    /// Rotary embedding of `a` `[head_dim, n_head, n_tokens, 1]` at I32 positions `pos` `[n_tokens]`.
    pub fn rope(&mut self, a: TensorId, pos: TensorId, params: RopeParams) -> Result<TensorId> {
        self.rope_ext(a, pos, None, params)
    }

    /// [`rope`](Self::rope) with optional frequency factors (ggml's `ggml_rope_ext` with its
    /// third source, Llama 3's `rope_freqs.weight`): pair `i`'s angle before YaRN is
    /// `pos · θ_scale^i / freq_factors[i]`.
    ///
    /// The factors must be a contiguous f32 tensor with `ne[0] >= n_dims / 2`: ggml's rule
    /// (`c->ne[0] >= n_dims/2`), so the tensors ggml accepts are accepted here; only the first
    /// `n_dims / 2` values are read. They become the node's third source.
    ///
    /// With a multi-section mode ([`Mrope`](crate::RopeMode::Mrope),
    /// [`Imrope`](crate::RopeMode::Imrope): ggml's `ggml_rope_multi`) `pos` holds four
    /// positions per token (`[4 ne2]`) and the sections must be ggml's: not all of the first
    /// three 0, and at most `ne0` pairs in all.
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        params: RopeParams,
    ) -> Result<TensorId> {
        self.expect_dtype(OpKind::Rope, pos, &[DType::I32], "positions must be i32")?;
        let (ta, tp) = (self.get(a)?, self.get(pos)?);
        let per_token = params.mode.positions_per_token();
        let want = ta.ne[2].checked_mul(per_token);
        if want != Some(tp.ne[0]) || tp.ne[1..] != [1, 1, 1] {
            return Err(Error::ShapeMismatch {
                op: OpKind::Rope,
                lhs: ta.ne,
                rhs: tp.ne,
                reason: if per_token == 1 {
                    "one position per src0.ne2"
                } else {
                    "four positions per src0.ne2"
                },
            });
        }
        if let Some(sections) = params.mode.sections() {
            check_rope_sections(sections, ta.ne[0])?;
        }
        if params.n_dims == 0 || !params.n_dims.is_multiple_of(2) || params.n_dims > ta.ne[0] {
            return Err(Error::InvalidArgument {
                op: OpKind::Rope,
                reason: format!(
                    "n_dims {} must be even and at most ne0 {}",
                    params.n_dims, ta.ne[0]
                ),
            });
        }
        if !(params.freq_base > 0.0 && params.freq_base.is_finite()) {
            return Err(Error::InvalidArgument {
                op: OpKind::Rope,
                reason: format!("freq_base {} must be positive", params.freq_base),
            });
        }
        if let Some(ff) = freq_factors {
            self.expect_dtype(
                OpKind::Rope,
                ff,
                &[DType::F32],
                "frequency factors must be f32",
            )?;
            let tf = self.get(ff)?;
            if tf.ne[0] < params.n_dims / 2 {
                return Err(Error::ShapeMismatch {
                    op: OpKind::Rope,
                    lhs: ta.ne,
                    rhs: tf.ne,
                    reason: "frequency factors need ne0 >= n_dims / 2",
                });
            }
            if !tf.is_contiguous() {
                return Err(Error::InvalidArgument {
                    op: OpKind::Rope,
                    reason: "frequency factors must be contiguous".into(),
                });
            }
        }
        let id = self.unary_like(Op::Rope(params), a)?;
        let src = &mut self.get_mut(id)?.src;
        src.push(pos);
        src.extend(freq_factors);
        Ok(id)
    }

    /// Row-wise softmax.
    pub fn soft_max(&mut self, a: TensorId) -> Result<TensorId> {
        self.soft_max_ext(a, None, 1.0, 0.0)
    }

    /// Row-wise softmax of `a * scale + mask` (mask f32/f16 `[ne0, >= ne1, ...]`, broadcast over
    /// dims 2 and 3), with ALiBi when `max_bias > 0`.
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        self.soft_max_sinks(a, mask, None, scale, max_bias)
    }

    /// [`Context::soft_max_ext`] with per-head attention sinks (f32 `[a.ne2]`; ggml's
    /// `ggml_soft_max_add_sinks`): head `i2`'s sink joins each row's softmax as one more score.
    pub fn soft_max_sinks(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        sinks: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        if let Some(m) = mask {
            self.expect_dtype(
                OpKind::SoftMax,
                m,
                &[DType::F32, DType::F16],
                "mask must be f32 or f16",
            )?;
            let (ta, tm) = (self.get(a)?, self.get(m)?);
            if tm.ne[0] != ta.ne[0]
                || tm.ne[1] < ta.ne[1]
                || tm.ne[2] == 0
                || tm.ne[3] == 0
                || !ta.ne[2].is_multiple_of(tm.ne[2])
                || !ta.ne[3].is_multiple_of(tm.ne[3])
            {
                return Err(Error::ShapeMismatch {
                    op: OpKind::SoftMax,
                    lhs: ta.ne,
                    rhs: tm.ne,
                    reason: "mask must be [ne0, >= ne1, k2, k3] with k2, k3 dividing src dims",
                });
            }
            if !tm.rows_contiguous() {
                return Err(Error::InvalidArgument {
                    op: OpKind::SoftMax,
                    reason: "mask rows must be contiguous".into(),
                });
            }
        } else if max_bias > 0.0 {
            return Err(Error::InvalidArgument {
                op: OpKind::SoftMax,
                reason: "ALiBi (max_bias > 0) needs a mask".into(),
            });
        }
        if let Some(s) = sinks {
            self.expect_dtype(OpKind::SoftMax, s, &[DType::F32], "sinks must be f32")?;
            let (ta, ts) = (self.get(a)?, self.get(s)?);
            if ts.ne != [ta.ne[2], 1, 1, 1] || !ts.is_contiguous() {
                return Err(Error::ShapeMismatch {
                    op: OpKind::SoftMax,
                    lhs: ta.ne,
                    rhs: ts.ne,
                    reason: "sinks must be a dense [ne2] vector",
                });
            }
        }
        let op = Op::SoftMax {
            scale,
            max_bias,
            sinks: sinks.is_some(),
        };
        let id = self.unary_like(op, a)?;
        let src = &mut self.get_mut(id)?.src;
        src.extend(mask);
        src.extend(sinks);
        Ok(id)
    }

    /// Causal mask: elements with column `> n_past + row` become -inf.
    pub fn diag_mask_inf(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        self.unary_like(Op::DiagMaskInf { n_past }, a)
    }

    /// `x * sigmoid(x)`.
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(UnaryOp::Silu), a)
    }

    /// GELU (tanh approximation).
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(UnaryOp::Gelu), a)
    }

    /// gpt-oss's SwiGLU (ggml's `ggml_swiglu_oai`, split form; see [`Op::SwigluOai`]): `a`
    /// the gate, `b` the up projection, equal shapes.
    pub fn swiglu_oai(
        &mut self,
        a: TensorId,
        b: TensorId,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId> {
        let kind = OpKind::SwigluOai;
        self.expect_dtype(kind, b, &[DType::F32], "operands must be f32")?;
        self.expect_same_shape(kind, a, b)?;
        if !(alpha.is_finite() && limit.is_finite() && limit > 0.0) {
            return Err(Error::InvalidArgument {
                op: kind,
                reason: format!("alpha {alpha} and limit {limit} (a positive limit)"),
            });
        }
        let id = self.unary_like(Op::SwigluOai { alpha, limit }, a)?;
        self.get_mut(id)?.src.push(b);
        Ok(id)
    }

    /// `silu(a) * b` (equal shapes).
    pub fn swiglu(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.expect_dtype(OpKind::Swiglu, b, &[DType::F32], "operands must be f32")?;
        self.expect_same_shape(OpKind::Swiglu, a, b)?;
        let id = self.unary_like(Op::Swiglu, a)?;
        self.get_mut(id)?.src.push(b);
        Ok(id)
    }

    /// `tanh(a)`.
    pub fn tanh(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(UnaryOp::Tanh), a)
    }

    /// `-a`.
    pub fn neg(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(UnaryOp::Neg), a)
    }

    /// `1 / (1 + exp(-a))` (ggml's `ggml_sigmoid`).
    pub fn sigmoid(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(UnaryOp::Sigmoid), a)
    }

    /// `exp(a)`.
    pub fn exp(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(UnaryOp::Exp), a)
    }

    /// `log(1 + exp(a))`, `a` itself above 20 (ggml's `ggml_softplus`).
    pub fn softplus(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(UnaryOp::Softplus), a)
    }

    /// `gelu(a) * b` (equal shapes; GELU's tanh approximation).
    pub fn geglu(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.expect_dtype(OpKind::Geglu, b, &[DType::F32], "operands must be f32")?;
        self.expect_same_shape(OpKind::Geglu, a, b)?;
        let id = self.unary_like(Op::Geglu, a)?;
        self.get_mut(id)?.src.push(b);
        Ok(id)
    }

    /// `a` tiled to shape `dims` (ggml's `ggml_repeat_4d`; see [`Op::Repeat`]): every dim of
    /// `dims` a multiple of `a`'s (an empty `a` only to an empty shape, as `ggml_can_repeat`
    /// requires), `a` f32, f16, bf16 or i32 (the types ggml-cpu repeats); the result has `a`'s
    /// dtype.
    pub fn repeat(&mut self, a: TensorId, dims: &[usize]) -> Result<TensorId> {
        let ne = shape4(dims, OpKind::Repeat)?;
        self.expect_dtype(
            OpKind::Repeat,
            a,
            &[DType::F32, DType::F16, DType::BF16, DType::I32],
            "operand must be f32, f16, bf16 or i32",
        )?;
        let t = self.get(a)?;
        let (dtype, ane) = (t.dtype, t.ne);
        let fits = if t.nelements() == 0 {
            ne.contains(&0)
        } else {
            (0..MAX_DIMS).all(|i| ne[i].is_multiple_of(ane[i]))
        };
        if !fits {
            return Err(Error::ShapeMismatch {
                op: OpKind::Repeat,
                lhs: ane,
                rhs: ne,
                reason: "each dim of the result must be a multiple of the operand's",
            });
        }
        self.node(dtype, ne, Op::Repeat, &[a])
    }

    /// `a` tiled to `b`'s shape (ggml's `ggml_repeat`; see [`Context::repeat`]).
    pub fn repeat_like(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ne = self.get(b)?.ne;
        self.repeat(a, &ne)
    }

    /// `a` and `b` joined along `dim` (other dims equal, same dtype).
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        if dim >= MAX_DIMS {
            return Err(Error::InvalidArgument {
                op: OpKind::Concat,
                reason: format!("dim {dim} out of range"),
            });
        }
        let (ta, tb) = (self.get(a)?, self.get(b)?);
        if ta.dtype != tb.dtype || ta.dtype.is_quantized() {
            return Err(Error::UnsupportedDType {
                op: OpKind::Concat,
                dtype: tb.dtype,
                reason: "operands must share one non-quantized dtype",
            });
        }
        if (0..MAX_DIMS).any(|i| i != dim && ta.ne[i] != tb.ne[i]) {
            return Err(Error::ShapeMismatch {
                op: OpKind::Concat,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "shapes must match outside the concatenated dim",
            });
        }
        let mut ne = ta.ne;
        ne[dim] += tb.ne[dim];
        let dtype = ta.dtype;
        self.node(dtype, ne, Op::Concat { dim }, &[a, b])
    }

    /// Attention in one op with ggml's semantics (`ggml_flash_attn_ext`, see
    /// [`Op::FlashAttnExt`]): `q` f32 `[dk, n_q, n_head, ne3]`; `k` `[dk, n_kv, n_head_kv, ne3]`
    /// and `v` `[dv, n_kv, n_head_kv, ne3]`, f16, f32, q8_0 or q4_0 with dense rows (whole
    /// blocks), `n_head` a multiple of
    /// their heads; `mask` f16 contiguous `[>= n_kv, >= n_q, m2, m3]` with `m2`, `m3` dividing
    /// `n_head`, `ne3`; `sinks` f32 `[n_head]`. The result is f32 `[dv, n_head, n_q, ne3]`.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        sinks: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        softcap: f32,
    ) -> Result<TensorId> {
        let kind = OpKind::FlashAttnExt;
        self.expect_dtype(kind, q, &[DType::F32], "q must be f32")?;
        let kv_types = crate::op::FLASH_ATTN_KV_TYPES;
        self.expect_dtype(kind, k, &kv_types, "k must be f32, f16, q8_0 or q4_0")?;
        self.expect_dtype(kind, v, &kv_types, "v must be f32, f16, q8_0 or q4_0")?;
        let (tq, tk, tv) = (self.get(q)?, self.get(k)?, self.get(v)?);
        for t in [tk, tv] {
            if !t.ne[0].is_multiple_of(t.dtype.block_size()) {
                return Err(Error::InvalidArgument {
                    op: kind,
                    reason: format!(
                        "rows of {} must be whole {} blocks",
                        t.display_name(),
                        t.dtype
                    ),
                });
            }
        }
        let mismatch = |lhs: &Tensor, rhs: &Tensor, reason| Error::ShapeMismatch {
            op: kind,
            lhs: lhs.ne,
            rhs: rhs.ne,
            reason,
        };
        if tk.ne[0] != tq.ne[0] || tk.ne[2] == 0 || !tq.ne[2].is_multiple_of(tk.ne[2]) {
            return Err(mismatch(
                tq,
                tk,
                "k must be [q.ne0, n_kv, a divisor of q's heads]",
            ));
        }
        if tv.ne[1] != tk.ne[1] || tv.ne[2] == 0 || !tq.ne[2].is_multiple_of(tv.ne[2]) {
            return Err(mismatch(
                tk,
                tv,
                "v must be [dv, k.ne1, a divisor of q's heads]",
            ));
        }
        if tk.ne[3] != tq.ne[3] || tv.ne[3] != tq.ne[3] {
            return Err(mismatch(tq, tk, "q, k and v must agree in dim 3"));
        }
        for t in [tq, tk, tv] {
            if !t.rows_contiguous() {
                return Err(Error::NotContiguous(t.display_name().to_string()));
            }
        }
        if let Some(m) = mask {
            self.expect_dtype(kind, m, &[DType::F16], "the mask must be f16")?;
            let tm = self.get(m)?;
            if !tm.is_contiguous() {
                return Err(Error::NotContiguous(tm.display_name().to_string()));
            }
            if tm.ne[0] < tk.ne[1]
                || tm.ne[1] < tq.ne[1]
                || tm.ne[2] == 0
                || tm.ne[3] == 0
                || !tq.ne[2].is_multiple_of(tm.ne[2])
                || !tq.ne[3].is_multiple_of(tm.ne[3])
            {
                return Err(mismatch(
                    tq,
                    tm,
                    "the mask must be [>= n_kv, >= n_q, m2 | n_head, m3 | ne3]",
                ));
            }
        } else if max_bias > 0.0 {
            return Err(Error::InvalidArgument {
                op: kind,
                reason: "ALiBi (max_bias > 0) needs a mask".into(),
            });
        }
        if let Some(s) = sinks {
            self.expect_dtype(kind, s, &[DType::F32], "sinks must be f32")?;
            let ts = self.get(s)?;
            if ts.ne != [tq.ne[2], 1, 1, 1] {
                return Err(mismatch(tq, ts, "sinks must be [n_head]"));
            }
        }
        let ne = [tv.ne[0], tq.ne[2], tq.ne[1], tq.ne[3]];
        let op = Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
            mask: mask.is_some(),
            sinks: sinks.is_some(),
        };
        let srcs: Vec<TensorId> = [Some(q), Some(k), Some(v), mask, sinks]
            .into_iter()
            .flatten()
            .collect();
        self.node(DType::F32, ne, op, &srcs)
    }

    /// Index of the largest element of each row of a matrix: i32 `[ne1]`.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        self.expect_dtype(OpKind::Argmax, a, &[DType::F32], "operand must be f32")?;
        let t = self.get(a)?;
        if t.ne[2] != 1 || t.ne[3] != 1 {
            return Err(Error::InvalidArgument {
                op: OpKind::Argmax,
                reason: format!("operand must be a matrix, got {:?}", t.ne),
            });
        }
        let n = t.ne[1];
        self.node(DType::I32, [n, 1, 1, 1], Op::Argmax, &[a])
    }

    /// `a` `[n, n_used, n_tokens]` plus, at slot `(i, t)`, row `ids[i, t]` of `b` `[n, n_rows]`
    /// (ggml's `ggml_add_id`: gpt-oss's per-expert biases); f32, `ids` I32 `[n_used,
    /// n_tokens]`.
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        let kind = OpKind::AddId;
        self.expect_dtype(kind, a, &[DType::F32], "src0 must be f32")?;
        self.expect_dtype(kind, b, &[DType::F32], "src1 must be f32")?;
        self.expect_dtype(kind, ids, &[DType::I32], "ids must be i32")?;
        let (ta, tb, ti) = (self.get(a)?, self.get(b)?, self.get(ids)?);
        let fits = ta.ne[0] == tb.ne[0]
            && tb.ne[2] == 1
            && tb.ne[3] == 1
            && ta.ne[3] == 1
            && ti.ne[0] == ta.ne[1]
            && ti.ne[1] == ta.ne[2]
            && ti.ne[2] == 1
            && ti.ne[3] == 1;
        if !fits {
            return Err(Error::ShapeMismatch {
                op: kind,
                lhs: ta.ne,
                rhs: tb.ne,
                reason: "need a [n, n_used, n_tokens], b [n, rows], ids [n_used, n_tokens]",
            });
        }
        let ne = ta.ne;
        self.node(DType::F32, ne, Op::AddId, &[a, b, ids])
    }

    /// The sum of each row of `a` (f32): `[1, ne1, ne2, ne3]` (ggml's `ggml_sum_rows`).
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        self.expect_dtype(OpKind::SumRows, a, &[DType::F32], "operand must be f32")?;
        let ne = self.get(a)?.ne;
        self.node(DType::F32, [1, ne[1], ne[2], ne[3]], Op::SumRows, &[a])
    }

    /// `a` (f32) limited to `[min, max]` elementwise (ggml's `ggml_clamp`).
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        self.expect_dtype(OpKind::Clamp, a, &[DType::F32], "operand must be f32")?;
        if min.is_nan() || max.is_nan() || min > max {
            return Err(Error::InvalidArgument {
                op: OpKind::Clamp,
                reason: format!("bounds [{min}, {max}]"),
            });
        }
        let ne = self.get(a)?.ne;
        self.node(DType::F32, ne, Op::Clamp { min, max }, &[a])
    }

    /// The indices that sort each row of `a` (f32), largest first if `descending`: i32 of
    /// `a`'s shape (ggml's `ggml_argsort`; ties as ggml-cpu leaves them, see [`Op::Argsort`]).
    pub fn argsort(&mut self, a: TensorId, descending: bool) -> Result<TensorId> {
        self.expect_dtype(OpKind::Argsort, a, &[DType::F32], "operand must be f32")?;
        let ne = self.get(a)?.ne;
        if i32::try_from(ne[0]).is_err() {
            return Err(Error::InvalidArgument {
                op: OpKind::Argsort,
                reason: format!("rows of {} elements have indices beyond i32", ne[0]),
            });
        }
        self.node(DType::I32, ne, Op::Argsort { descending }, &[a])
    }

    /// The indices of the `k` largest elements of each row of `a`, largest first: a view of
    /// the first `k` columns of [`Context::argsort`] (ggml's `ggml_argsort_top_k`, which
    /// llama.cpp's MoE routers use).
    pub fn argsort_top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        let ne = self.get(a)?.ne;
        if k == 0 || k > ne[0] {
            return Err(Error::InvalidArgument {
                op: OpKind::Argsort,
                reason: format!("top {k} of rows of {} elements", ne[0]),
            });
        }
        let sorted = self.argsort(a, true)?;
        let nb = self.get(sorted)?.nb;
        self.view(sorted, &[k, ne[1], ne[2], ne[3]], &[nb[1], nb[2], nb[3]], 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_divisor_dims_are_errors_not_divisions_by_zero() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[4, 2, 0, 1]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[4, 3, 2, 1]).unwrap();
        assert!(ctx.mul_mat(a, b).is_err());
        let x = ctx.new_tensor(DType::F32, &[4, 3, 2, 1]).unwrap();
        let m = ctx.new_tensor(DType::F32, &[4, 3, 0, 1]).unwrap();
        assert!(ctx.soft_max_ext(x, Some(m), 1.0, 0.0).is_err());
        let dst = ctx.new_tensor(DType::F32, &[4, 5, 2, 1]).unwrap();
        let idx = ctx.new_tensor(DType::I32, &[3, 0, 1]).unwrap();
        assert!(ctx.set_rows(dst, x, idx).is_err());
    }

    #[test]
    fn shapes_whose_element_count_overflows_are_errors() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
        let huge = [1 << 32, 1 << 32, 1 << 32, 1 << 32];
        assert!(ctx.cont_shape(a, &huge).is_err());
        assert!(ctx.reshape(a, &huge).is_err());
    }

    #[test]
    fn repeat_checks_shapes_and_dtypes_as_ggml_cpu() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[1, 8]).unwrap();
        // llama.cpp's per-expert scales: `ggml_repeat_4d(s, 1, n_expert, n_tokens, 1)`.
        let r = ctx.repeat(a, &[1, 8, 5, 1]).unwrap();
        assert_eq!((ctx[r].ne, ctx[r].dtype), ([1, 8, 5, 1], DType::F32));
        assert_eq!((ctx[r].op, ctx[r].src.clone()), (Op::Repeat, vec![a]));
        assert!(ctx[r].is_contiguous());
        let b = ctx.new_tensor(DType::F32, &[3, 16, 2, 2]).unwrap();
        let like = ctx.repeat_like(a, b).unwrap();
        assert_eq!(ctx[like].ne, [3, 16, 2, 2]);
        // Each dim a multiple of the operand's; an empty result is fine.
        for bad in [&[1, 12][..], &[2, 4], &[1, 8, 1, 1, 1], &[]] {
            assert!(ctx.repeat(a, bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            ctx.repeat(a, &[1, 12]),
            Err(Error::ShapeMismatch {
                op: OpKind::Repeat,
                ..
            })
        ));
        let none = ctx.repeat(a, &[0, 8, 3]).unwrap();
        assert_eq!(ctx[none].nelements(), 0);
        // An empty operand only repeats to an empty shape (`ggml_can_repeat`).
        let empty = ctx.new_tensor(DType::F32, &[4, 0]).unwrap();
        assert!(ctx.repeat(empty, &[4, 3]).is_err());
        assert!(ctx.repeat(empty, &[8, 0, 2]).is_ok());
        // The result keeps the operand's type; ggml-cpu repeats f32, f16, bf16 and i32 only.
        for dtype in [DType::F16, DType::BF16, DType::I32] {
            let x = ctx.new_tensor(dtype, &[4, 2]).unwrap();
            let r = ctx.repeat(x, &[8, 2, 3]).unwrap();
            assert_eq!(ctx[r].dtype, dtype);
        }
        for dtype in [DType::Q8_0, DType::I64] {
            let x = ctx.new_tensor(dtype, &[32, 2]).unwrap();
            assert!(matches!(
                ctx.repeat(x, &[64, 2]),
                Err(Error::UnsupportedDType {
                    op: OpKind::Repeat,
                    ..
                })
            ));
        }
        // Shapes whose element count overflows are errors, not panics.
        assert!(ctx.repeat(a, &[1 << 40, 8 << 40, 1 << 40]).is_err());
    }

    #[test]
    fn builders_validate_shapes() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[4, 3]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[4, 1]).unwrap();
        let c = ctx.new_tensor(DType::F32, &[3, 3]).unwrap();
        let sum = ctx.add(a, b).unwrap();
        assert_eq!(ctx[sum].ne, [4, 3, 1, 1]);
        assert!(matches!(ctx.add(a, c), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(
            ctx.mul_mat(a, c),
            Err(Error::ShapeMismatch { .. })
        ));
        let mm = ctx.mul_mat(a, a).unwrap();
        assert_eq!(ctx[mm].ne, [3, 3, 1, 1]);
        assert!(ctx.reshape(a, &[5, 2]).is_err());
        assert!(ctx.permute(a, [0, 0, 1, 2]).is_err());
        assert!(ctx.view(a, &[4, 4], &[16], 0).is_err());
        assert!(ctx.new_tensor(DType::F32, &[1, 2, 3, 4, 5]).is_err());
        let beyond = TensorId {
            index: 999,
            serial: 1,
        };
        assert!(matches!(ctx.get(beyond), Err(Error::InvalidTensor(999))));
    }

    #[test]
    fn ids_from_another_context_or_before_a_truncation_are_refused() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[4]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[4]).unwrap();

        // Same positions, other tensors: a foreign id is an error, not its neighbour's tensor.
        let mut other = Context::new();
        let x = other.new_tensor(DType::F32, &[8]).unwrap();
        assert_eq!(x.index(), a.index());
        assert!(!ctx.contains(x));
        assert!(matches!(ctx.get(x), Err(Error::InvalidTensor(0))));
        assert!(ctx.add(x, a).is_err());
        assert!(ctx.set_name(x, "x").is_err());

        // A clone keeps the ids it inherited and refuses the ones the original made later.
        let mut copy = ctx.clone();
        assert!(copy.get(a).is_ok() && copy.get(b).is_ok());
        let c_orig = ctx.add(a, b).unwrap();
        let c_copy = copy.add(a, b).unwrap();
        assert_eq!(c_orig.index(), c_copy.index());
        assert!(copy.get(c_orig).is_err());
        assert!(ctx.get(c_copy).is_err());

        // After a truncation, the dropped id stays invalid even when its position is reused.
        ctx.truncate(2);
        assert!(ctx.get(c_orig).is_err());
        let d = ctx.mul(a, b).unwrap();
        assert_eq!(d.index(), c_orig.index());
        assert!(ctx.get(c_orig).is_err());
        assert_eq!(ctx.get(d).unwrap().op.kind(), OpKind::Mul);
        assert_eq!(ctx.ids().collect::<Vec<_>>(), vec![a, b, d]);
    }

    #[test]
    fn rope_frequency_factors_are_validated() {
        use crate::op::RopeMode;
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[16, 2, 3]).unwrap();
        let pos = ctx.new_tensor(DType::I32, &[3]).unwrap();
        let p = RopeParams::new(RopeMode::Neox, 12, 10000.0);
        // ggml's rule: f32, at least n_dims / 2 values along dim 0; more are allowed.
        for n in [6, 9] {
            let ff = ctx.new_tensor(DType::F32, &[n]).unwrap();
            let r = ctx.rope_ext(a, pos, Some(ff), p).unwrap();
            assert_eq!(ctx[r].src, vec![a, pos, ff]);
            assert_eq!(ctx[r].ne, ctx[a].ne);
        }
        let r = ctx.rope(a, pos, p).unwrap();
        assert_eq!(ctx[r].src, vec![a, pos]);
        let short = ctx.new_tensor(DType::F32, &[5]).unwrap();
        assert!(matches!(
            ctx.rope_ext(a, pos, Some(short), p),
            Err(Error::ShapeMismatch { .. })
        ));
        let f16 = ctx.new_tensor(DType::F16, &[6]).unwrap();
        assert!(matches!(
            ctx.rope_ext(a, pos, Some(f16), p),
            Err(Error::UnsupportedDType { .. })
        ));
        // Long enough along dim 0, but not contiguous.
        let wide = ctx.new_tensor(DType::F32, &[12, 8]).unwrap();
        let t = ctx.transpose(wide).unwrap();
        assert!(matches!(
            ctx.rope_ext(a, pos, Some(t), p),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn views_point_at_their_root() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[8, 4]).unwrap();
        let v = ctx.view(a, &[4, 2], &[32], 32).unwrap();
        let vv = ctx.view(v, &[2], &[], 8).unwrap();
        assert_eq!(ctx[vv].view_src, Some(a));
        assert_eq!(ctx[vv].view_offset, 40);
        let t = ctx.transpose(a).unwrap();
        assert_eq!(ctx[t].ne, [4, 8, 1, 1]);
        assert_eq!(ctx[t].nb, [32, 4, 128, 128]);
        assert!(ctx[t].is_transposed());
        assert!(matches!(
            ctx.mul_mat(t, t),
            Err(Error::InvalidArgument { .. })
        ));
    }
}

#[cfg(test)]
mod epoch_tests {
    use super::*;

    #[test]
    fn metadata_changes_advance_the_epoch_and_clones_are_other_contexts() {
        let mut ctx = Context::new();
        let e0 = ctx.epoch();
        let a = ctx.new_tensor(DType::F32, &[4]).unwrap();
        let e1 = ctx.epoch();
        assert!(e1 > e0, "a new tensor");
        let b = ctx.scale(a, 2.0).unwrap();
        let e2 = ctx.epoch();
        assert!(e2 > e1, "an op builder");
        ctx.set_name(b, "b").unwrap();
        let e3 = ctx.epoch();
        assert!(e3 > e2, "a rename");
        ctx.get_mut(a).unwrap();
        let e4 = ctx.epoch();
        assert!(e4 > e3, "mutable access");
        ctx.truncate(1);
        assert!(ctx.epoch() > e4, "a truncation");
        let e5 = ctx.epoch();
        ctx.truncate(5);
        assert_eq!(
            ctx.epoch(),
            e5,
            "truncating to a larger length changes nothing"
        );
        let copy = ctx.clone();
        assert_ne!(copy.uid(), ctx.uid());
        assert_ne!(Context::new().uid(), Context::new().uid());
    }
}
