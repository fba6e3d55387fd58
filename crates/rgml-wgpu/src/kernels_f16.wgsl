// Kernels writing f16 results into D at any 2-byte-aligned byte: D is bound as atomic words and
// each value replaces its half of a word with atomicAnd / atomicOr, so invocations writing the
// two halves of one word never lose each other's value. Prefixed with `common.wgsl`; strides and
// offsets of D are in bytes.

@group(0) @binding(4) var<storage, read_write> D: array<atomic<u32>>;

// Store `v` as the f16 at (2-aligned) byte `b` of D.
fn d_store_f16(b: u32, v: f32) {
    let w = b >> 2u;
    let sh = (b & 2u) * 8u;
    let bits = f16_bits(v);
    atomicAnd(&D[w], ~(0xffffu << sh));
    atomicOr(&D[w], bits << sh);
}

// CPY / CONT / DUP to f16: element i of A (in A's shape, type misc.z: f32 or f16) to element i of
// D (in D's shape).
@compute @workgroup_size(64)
fn cpy_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let v = a_elem(p.misc.z, p.off.x + at(unravel(i, p.a_ne), p.a_nb), 0u, 0u);
    d_store_f16(p.off.w + at(unravel(i, p.d_ne), p.d_nb), v);
}

// SET_ROWS to f16: row i1 of B (f32) to row C[i1, i2 % k2, i3 % k3] of D. Indices out of range
// write nothing.
@compute @workgroup_size(64)
fn set_rows_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_index(gid, nwg);
    if (i >= p.misc.x) {
        return;
    }
    let idx = unravel(i, p.b_ne);
    let row = set_rows_index(idx);
    if (row < 0 || u32(row) >= p.d_ne.y) {
        return;
    }
    let d = p.off.w + at(vec4<u32>(idx.x, u32(row), idx.z, idx.w), p.d_nb);
    d_store_f16(d, bf(p.off.y + at(idx, p.b_nb)));
}
