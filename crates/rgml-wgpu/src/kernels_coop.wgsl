// Prompt matrix products on cooperative matrices (tensor cores): `mul_mm_coop`. Compiled only
// on adapters with wgpu's EXPERIMENTAL_COOPERATIVE_MATRIX offering square f16 products with f32
// sums (16x16x16 on NVIDIA, 8x8x8 on lavapipe) and one subgroup size (see `kernels.rs`). The
// module is this file after `enable f16; enable wgpu_cooperative_matrix;`, `common.wgsl` and
// `kernels_fast.wgsl` (the weight decoder `deq8`, `act8`, the row helpers) with the bindings
// A, B, C renamed AB, BB, CB (the matrix roles take those names), and with `COOP_MAT` (the
// fragment type, e.g. `COOP_MAT`), `FRAG` (its edge) and `SUBGROUP` (the subgroup size)
// filled in.

// Elements of k per step of `mul_mm_coop`.
const COOP_DEPTH: u32 = 64u;

// The tiles of one step of COOP_DEPTH elements of k, k-major in f16: weight row (activation
// column) r of element k at k * 64 + r.
var<workgroup> coop_a: array<f16, 4096>;
var<workgroup> coop_b: array<f16, 4096>;
// The 64 x 64 outputs, output (row m, column n) at n * 64 + m; zeroed first, it also gives the
// accumulators their zeros.
var<workgroup> coop_out: array<f32, 4096>;

fn to_f16(v: vec4<f32>) -> vec4<f16> {
    return vec4<f16>(clamp(v, vec4<f32>(-F16_MAX), vec4<f32>(F16_MAX)));
}

// Eight elements of a weight row and of an activation column, in f16.
struct Pair8 {
    xl: vec4<f16>,
    xh: vec4<f16>,
    yl: vec4<f16>,
    yh: vec4<f16>,
}

// Elements k0 + kg .. + 8 of weight row `row` and activation column `row` of tile `at`, in f16:
// the weights decoded here, the activations as `to_f16_fast` left them in binding B (`BB`; zeros
// beyond the matrices' edges and in padding workgroups).
fn coop_fetch(row: u32, kg: u32, k0: u32, at: TileAt) -> Pair8 {
    let k = k0 + kg;
    let n = p.a_ne.x;
    let x = tile_weights(row, k, at);
    var y = vec4<u32>(0u);
    if (at.live && at.n0 + row < p.d_ne.y && k < n) {
        let w = (((at.i3 * p.d_ne.z + at.i2) * p.d_ne.y + at.n0 + row) * n + k) / 2u;
        y = vec4<u32>(BB[w], BB[w + 1u], BB[w + 2u], BB[w + 3u]);
    }
    // Unpacked through f32 (naga's bitcast takes no u32 to vec2<f16>); exact both ways.
    let y0 = vec4<f16>(vec4<f32>(unpack2x16float(y.x), unpack2x16float(y.y)));
    let y1 = vec4<f16>(vec4<f32>(unpack2x16float(y.z), unpack2x16float(y.w)));
    return Pair8(to_f16(x.lo), to_f16(x.hi), y0, y1);
}

fn coop_store(v: Pair8, row: u32, kg: u32) {
    for (var e = 0u; e < 4u; e++) {
        coop_a[(kg + e) * 64u + row] = v.xl[e];
        coop_a[(kg + 4u + e) * 64u + row] = v.xh[e];
        coop_b[(kg + e) * 64u + row] = v.yl[e];
        coop_b[(kg + 4u + e) * 64u + row] = v.yh[e];
    }
}

// What one invocation stages per step: four groups of 8 of its row and column, 16 apart.
struct Staged {
    s0: Pair8,
    s1: Pair8,
    s2: Pair8,
    s3: Pair8,
}

fn coop_fetch_step(row: u32, half: u32, k0: u32, at: TileAt) -> Staged {
    return Staged(
        coop_fetch(row, half, k0, at),
        coop_fetch(row, half + 16u, k0, at),
        coop_fetch(row, half + 32u, k0, at),
        coop_fetch(row, half + 48u, k0, at));
}

// MUL_MAT with many activation columns on cooperative matrices, its activations converted to
// f16 first (`to_f16_fast`, bound as B; K a multiple of 8): a workgroup of 128 computes a
// 64 x 64 tile of outputs, each subgroup a square of 2 x 2 fragments (32 x 32 outputs in four
// subgroups of 32 with 16 x 16 fragments, 16 x 16 in sixteen subgroups of 8 with 8 x 8 ones)
// as four f32 accumulators. Each step over 64 elements of k stores the tile's 64 weight rows
// and 64 activation columns, decoded to f16 (four groups of 8 of each per invocation), in
// workgroup tiles, starts loading the next step's, then each subgroup multiplies its part.
// Workgroup w: `tile_of_workgroup(w)`, as `mul_mm_fast`.
@compute @workgroup_size(128)
fn mul_mm_coop(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let at = tile_of_workgroup(wid.x + wid.y * nwg.x);
    let sg = li / SUBGROUP;
    let side = 64u / (2u * FRAG);
    let wm = (sg % side) * 2u * FRAG;
    let wn = (sg / side) * 2u * FRAG;
    for (var i = li; i < 4096u; i += 128u) {
        coop_out[i] = 0.0;
    }
    workgroupBarrier();
    var c00 = coopLoad<COOP_MAT<f32, C>>(&coop_out[0], 64u);
    var c01 = c00;
    var c10 = c00;
    var c11 = c00;
    let row = li % 64u;
    let half = 8u * (li / 64u);
    // The next step's elements are loaded while this step multiplies (double buffering in
    // registers), so a step waits on memory only once.
    var next = coop_fetch_step(row, half, 0u, at);
    for (var k0 = 0u; k0 < p.a_ne.x; k0 += COOP_DEPTH) {
        coop_store(next.s0, row, half);
        coop_store(next.s1, row, half + 16u);
        coop_store(next.s2, row, half + 32u);
        coop_store(next.s3, row, half + 48u);
        workgroupBarrier();
        if (k0 + COOP_DEPTH < p.a_ne.x) {
            next = coop_fetch_step(row, half, k0 + COOP_DEPTH, at);
        }
        for (var kk = 0u; kk < COOP_DEPTH; kk += FRAG) {
            let a0 = coopLoad<COOP_MAT<f16, A>>(&coop_a[kk * 64u + wm], 64u);
            let a1 = coopLoad<COOP_MAT<f16, A>>(&coop_a[kk * 64u + wm + FRAG], 64u);
            let b0 = coopLoadT<COOP_MAT<f16, B>>(&coop_b[kk * 64u + wn], 64u);
            let b1 = coopLoadT<COOP_MAT<f16, B>>(&coop_b[kk * 64u + wn + FRAG], 64u);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    coopStore(c00, &coop_out[wn * 64u + wm], 64u);
    coopStore(c10, &coop_out[wn * 64u + wm + FRAG], 64u);
    coopStore(c01, &coop_out[(wn + FRAG) * 64u + wm], 64u);
    coopStore(c11, &coop_out[(wn + FRAG) * 64u + wm + FRAG], 64u);
    workgroupBarrier();
    if (!at.live) {
        return;
    }
    for (var i = li; i < 4096u; i += 128u) {
        tile_set(at, at.m0 + i % 64u, at.n0 + i / 64u, coop_out[i], p.d_ne.y);
    }
}
