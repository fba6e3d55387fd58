//! Whole client conversations, as the byte streams a client sends, that the server serves to
//! the end: the RPC fuzz target's seeds (`examples/rpc_fuzz_seeds.rs` writes them) and a test
//! of the server (`tests/server.rs`). Each starts with HELLO, allocates a buffer, fills it and
//! computes a graph of one family of ops (elementwise, matrix product, norm, rope, softmax with
//! a mask, GLU, views, rows) twice, then reads the result.

use rgml_rpc::ggml::{flag, glu, op, unary};
use rgml_rpc::wire::{set_tensor_header, write_request, Command, Request, RpcTensor, WireGraph};

/// Each seed's one buffer: its id (the server's first) and base address.
const BUFFER: u64 = 1;
const BASE: u64 = 1 << 40;

fn tensor(id: u64, dtype: u32, ne: [u32; 4], at: u64) -> RpcTensor {
    let esize = match dtype {
        1 => 2,
        _ => 4,
    };
    let mut nb = [esize, 0, 0, 0];
    for i in 1..4 {
        nb[i] = nb[i - 1] * ne[i - 1];
    }
    RpcTensor {
        id,
        dtype,
        buffer: BUFFER,
        ne,
        nb,
        data: BASE + at,
        ..RpcTensor::default()
    }
}

fn node(mut t: RpcTensor, op: u32, src: &[u64]) -> RpcTensor {
    t.op = op;
    t.src[..src.len()].copy_from_slice(src);
    t.flags = flag::COMPUTE;
    t
}

fn request(out: &mut Vec<u8>, req: &Request) {
    let _ = write_request(out, req.command(), &req.encode());
}

/// HELLO, one 64 KiB buffer, every leaf filled with varied bytes, the graph computed twice,
/// the last node read.
fn conversation(leaves: &[RpcTensor], nodes: &[RpcTensor]) -> Vec<u8> {
    let mut out = Vec::new();
    request(&mut out, &Request::Hello { caps: [0; 24] });
    request(&mut out, &Request::DeviceCount);
    request(
        &mut out,
        &Request::AllocBuffer {
            device: 0,
            size: 1 << 16,
        },
    );
    request(&mut out, &Request::BufferGetBase { buffer: BUFFER });
    for (k, leaf) in leaves.iter().enumerate() {
        let count = leaf.ne.iter().product::<u32>() as usize;
        let data: Vec<u8> = if leaf.dtype == 26 {
            // Indices and positions: small and in range of every source here.
            (0..count as i32)
                .flat_map(|i| (i % 2).to_le_bytes())
                .collect()
        } else {
            let n = count * leaf.nb[0] as usize;
            (0..n).map(|i| ((i * 29 + k * 7) % 61) as u8).collect()
        };
        let header = set_tensor_header(leaf, 0, 0);
        let _ = write_request(&mut out, Command::SetTensor, &[header, data].concat());
    }
    let mut tensors = leaves.to_vec();
    tensors.extend_from_slice(nodes);
    let graph = WireGraph {
        device: 0,
        nodes: nodes.iter().map(|t| t.id).collect(),
        tensors,
    };
    let mut payload = Vec::new();
    graph.encode(&mut payload);
    let _ = write_request(&mut out, Command::GraphCompute, &payload);
    request(&mut out, &Request::GraphRecompute { device: 0 });
    if let Some(last) = nodes.last() {
        request(
            &mut out,
            &Request::GetTensor {
                tensor: Box::new(last.clone()),
                offset: 0,
                size: 16,
            },
        );
    }
    request(&mut out, &Request::FreeBuffer { buffer: BUFFER });
    out
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let a = tensor(1, 0, [16, 4, 1, 1], 0);
    let b = tensor(2, 0, [16, 4, 1, 1], 4096);
    let row = tensor(3, 0, [16, 1, 1, 1], 8192);
    let pos = tensor(4, 26, [4, 1, 1, 1], 12288);
    let mask = tensor(5, 1, [4, 4, 1, 1], 16384);
    let idx = tensor(6, 26, [2, 1, 1, 1], 20480);
    let out = |id, ne, at| tensor(id, 0, ne, at);
    let mut scale = node(out(10, [16, 4, 1, 1], 32768), op::SCALE, &[1]);
    scale.op_params[0] = 0.5f32.to_bits() as i32;
    let mut rms = node(out(10, [16, 4, 1, 1], 32768), op::RMS_NORM, &[1]);
    rms.op_params[0] = 1e-5f32.to_bits() as i32;
    let mut rope_in = tensor(1, 0, [8, 2, 4, 1], 0);
    rope_in.id = 1;
    let mut rope = node(out(10, [8, 2, 4, 1], 32768), op::ROPE, &[1, 4]);
    rope.op_params[1] = 8;
    rope.op_params[5] = 10000f32.to_bits() as i32;
    rope.op_params[6] = 1f32.to_bits() as i32;
    rope.op_params[8] = 1f32.to_bits() as i32;
    rope.op_params[9] = 32f32.to_bits() as i32;
    rope.op_params[10] = 1f32.to_bits() as i32;
    let sm_in = tensor(1, 0, [4, 4, 1, 1], 0);
    let mut softmax = node(out(10, [4, 4, 1, 1], 32768), op::SOFT_MAX, &[1, 5]);
    softmax.op_params[0] = 0.125f32.to_bits() as i32;
    let mut swiglu = node(out(10, [16, 4, 1, 1], 32768), op::GLU, &[1, 2]);
    swiglu.op_params[0] = glu::SWIGLU;
    let mut silu = node(out(10, [16, 4, 1, 1], 32768), op::UNARY, &[1]);
    silu.op_params[0] = unary::SILU;
    let mut view = node(out(10, [16, 2, 1, 1], 64), op::VIEW, &[1]);
    view.view_src = 1;
    view.view_offs = 64;
    view.op_params[0] = 64;
    let mut transpose = node(tensor(11, 0, [4, 16, 1, 1], 0), op::TRANSPOSE, &[1]);
    transpose.nb = [64, 4, 256, 256];
    transpose.view_src = 1;
    let cont = node(out(12, [4, 16, 1, 1], 32768), op::CONT, &[11]);
    let mut get_rows = node(out(10, [16, 2, 1, 1], 32768), op::GET_ROWS, &[1, 6]);
    get_rows.flags |= flag::OUTPUT;
    let rows_src = tensor(2, 0, [16, 2, 1, 1], 4096);
    let mut set_rows = node(tensor(10, 0, [16, 4, 1, 1], 0), op::SET_ROWS, &[2, 6, 1]);
    set_rows.view_src = 1;
    vec![
        (
            "add",
            conversation(
                &[a.clone(), b.clone()],
                &[node(out(10, [16, 4, 1, 1], 32768), op::ADD, &[1, 2])],
            ),
        ),
        (
            "mul_broadcast",
            conversation(
                &[a.clone(), row.clone()],
                &[node(out(10, [16, 4, 1, 1], 32768), op::MUL, &[1, 3])],
            ),
        ),
        (
            "mul_mat",
            conversation(
                &[a.clone(), b.clone()],
                &[node(out(10, [4, 4, 1, 1], 32768), op::MUL_MAT, &[1, 2])],
            ),
        ),
        ("scale", conversation(std::slice::from_ref(&a), &[scale])),
        ("rms_norm", conversation(std::slice::from_ref(&a), &[rms])),
        ("rope", conversation(&[rope_in, pos], &[rope])),
        ("soft_max", conversation(&[sm_in, mask], &[softmax])),
        ("swiglu", conversation(&[a.clone(), b.clone()], &[swiglu])),
        ("silu", conversation(std::slice::from_ref(&a), &[silu])),
        ("view", conversation(std::slice::from_ref(&a), &[view])),
        (
            "transpose_cont",
            conversation(std::slice::from_ref(&a), &[transpose, cont]),
        ),
        (
            "get_rows",
            conversation(&[a.clone(), idx.clone()], &[get_rows]),
        ),
        ("set_rows", conversation(&[a, rows_src, idx], &[set_rows])),
    ]
}
