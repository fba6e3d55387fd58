//! One tensor as the protocol describes it before it has storage or sources: what
//! GET_ALLOC_SIZE and INIT_TENSOR send (buffers) and what a graph's tensors start from
//! (graphs). A leaf both of those modules read, so neither imports the other for it.

use crate::ggml::{encode_flags, encode_op};
use crate::wire::{RpcTensor, MAX_NAME, MAX_SRC};
use rgml::{Error, Result, Tensor};

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
