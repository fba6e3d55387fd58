// Kernels that sum in f64 as ggml-cpu does (compiled only where the adapter offers
// `SHADER_F64`; elsewhere `kernels.wgsl`'s f32 versions run). Prefixed with `common.wgsl`.

@group(0) @binding(4) var<storage, read_write> D: array<u32>;

fn dset(i: u32, v: f32) { D[i] = bitcast<u32>(v); }

// RMS_NORM as ggml-cpu: a sequential f64 sum of the f32 squares, the mean rounded to f32, then
// x * (1 / sqrt(mean + eps)) with correctly rounded sqrt and division.
@compute @workgroup_size(64)
fn rms_norm_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    var sum = 0.0lf;
    for (var k = 0u; k < p.a_ne.x; k++) {
        let x = af(a0 + k * p.a_nb.x);
        sum += f64(x * x);
    }
    let mean = f32(sum / f64(p.a_ne.x));
    let s = div_rn(1.0, sqrt_rn(mean + p.f.x));
    for (var k = 0u; k < p.a_ne.x; k++) {
        dset(d0 + k * p.d_nb.x, af(a0 + k * p.a_nb.x) * s);
    }
}

// SOFT_MAX as ggml-cpu's AVX-512 build (see `soft_max` in kernels.wgsl for the parameters):
// w = x * scale + slope * mask, then exp(w - max) in groups of 16 through `v_expf16`, each
// group's `hsum16` added to an f64 sum, the tail through exp; the result times f32(1 / sum).
@compute @workgroup_size(64)
fn soft_max_f64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = thread_index(gid, nwg);
    if (r >= p.misc.x) {
        return;
    }
    let row = unravel_row(r, p.a_ne);
    let a0 = p.off.x + at(row, p.a_nb);
    let d0 = p.off.w + at(row, p.d_nb);
    let c0 = soft_max_mask_row(row);
    let slope = alibi_slope(row.z);
    let n = p.a_ne.x;
    var m = bitcast<f32>(0xff800000u);
    for (var k = 0u; k < n; k++) {
        let w = soft_max_input(a0, c0, k, slope);
        dset(d0 + k * p.d_nb.x, w);
        m = max(m, w);
    }
    if (m == bitcast<f32>(0xff800000u)) {
        for (var k = 0u; k < n; k++) {
            dset(d0 + k * p.d_nb.x, 0.0);
        }
        return;
    }
    var sum = 0.0lf;
    let full = n - n % 16u;
    var v: array<f32, 16>;
    for (var k0 = 0u; k0 < full; k0 += 16u) {
        for (var l = 0u; l < 16u; l++) {
            let at_k = d0 + (k0 + l) * p.d_nb.x;
            v[l] = v_expf16(bitcast<f32>(D[at_k]) - m);
            dset(at_k, v[l]);
        }
        sum += f64(hsum16(v));
    }
    for (var k = full; k < n; k++) {
        let at_k = d0 + k * p.d_nb.x;
        let e = exp(bitcast<f32>(D[at_k]) - m);
        sum += f64(e);
        dset(at_k, e);
    }
    var inv = 0.0;
    if (sum > 0.0lf) {
        inv = f32(1.0lf / sum);
    }
    for (var k = 0u; k < n; k++) {
        let at_k = d0 + k * p.d_nb.x;
        dset(at_k, bitcast<f32>(D[at_k]) * inv);
    }
}
