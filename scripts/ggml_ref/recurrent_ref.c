// Reference SSM_CONV and GATED_DELTA_NET results from the real ggml CPU backend, for rgml-cpu's
// bit-exactness test (crates/rgml-cpu/tests/ggml_recurrent.rs). Build and run with
// gen_recurrent.sh --isa avx2|native.
//
// Each case is one ggml_ssm_conv or ggml_gated_delta_net on deterministic random data, run on
// 2 threads: SSM_CONV with kernels of 1 to 24 taps (GCC vectorizes its sum in 16-, 8- and
// 4-lane pieces with an FMA tail, which the tap count decides); GATED_DELTA_NET with the
// scalar gate (Qwen3.5) and the vector gate (Kimi's KDA), rows of 128 values (Qwen3.5's) and
// of sizes that leave ggml_vec_dot_f32 leftovers, q and k heads and sequences broadcast, one
// and several state snapshots (more than there are tokens too: ggml leaves those slots
// unwritten, and the result is filled with a NaN pattern first, so the fixture shows them).
//
// The inputs are not stored: the test makes them again from the seed (the generator is that of
// flash_attn_ref.c, plain f32 arithmetic with no fused operations on the baseline x86-64 this
// compiles for) and checks them against their hash.
//
// recurrent.bin: "RGMLRC1\0", u32 n_cases, then per case:
//   u32 kind (0 SSM_CONV, 1 GATED_DELTA_NET), u32 seed, then
//   SSM_CONV: u32 d_conv, d_inner, n_t, n_s, u64 FNV-1a of the inputs (sx f32
//     [n_s][d_inner][d_conv - 1 + n_t], c f32 [d_inner][d_conv]), f32 out[n_s][n_t][d_inner];
//   GATED_DELTA_NET: u32 s_v, h, h_k, n_tokens, n_seqs, b_k, g0 (1 or s_v), snapshots,
//     u64 FNV-1a of the inputs (q, k f32 [b_k][n_tokens][h_k][s_v], v [n_seqs][n_tokens][h][s_v],
//     g [n_seqs][n_tokens][h][g0], beta [n_seqs][n_tokens][h], state [n_seqs][h][s_v][s_v]),
//     f32 out[n_tokens·n_seqs + snapshots·s_v·n_seqs][s_v·h]

#include "ggml.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static float next_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 40) / (double) (1ull << 24));  // [0, 1)
}

// Roughly gaussian values with occasional outliers.
static float next_value(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        s += next_uniform();
    }
    float scale = next_uniform() < 0.05f ? 4.0f : 1.0f;
    return (s - 2.0f) * scale + 0.01f;
}

static void fill(struct ggml_tensor * t, uint64_t seed, float scale) {
    float * v = (float *) t->data;
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    for (int64_t i = 0; i < ggml_nelements(t); i++) {
        v[i] = next_value() * scale;
    }
}

static int write_all(FILE * f, const void * p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_u32(FILE * f, uint32_t v) {
    return write_all(f, &v, 4);
}

static uint64_t fnv1a(uint64_t h, const struct ggml_tensor * t) {
    const unsigned char * b = t->data;
    for (size_t i = 0; i < ggml_nbytes(t); i++) {
        h = (h ^ b[i]) * 0x100000001b3ull;
    }
    return h;
}

static struct ggml_context * new_ctx(size_t floats) {
    struct ggml_init_params ip = {.mem_size = floats * 4 + (4u << 20), .mem_buffer = NULL, .no_alloc = false};
    return ggml_init(ip);
}

// Computes y (2 threads) and appends the input hash and y to f.
static int finish(FILE * f, struct ggml_context * ctx, struct ggml_tensor * y, uint64_t hash) {
    // What ggml leaves unwritten stays this NaN.
    const uint32_t nan_bits = 0x7fc0dead;
    for (int64_t i = 0; i < ggml_nelements(y); i++) {
        memcpy((float *) y->data + i, &nan_bits, 4);
    }
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = ggml_graph_compute_with_ctx(ctx, gf, 2) == GGML_STATUS_SUCCESS ? 0 : -1;
    rc |= write_all(f, &hash, 8) | write_all(f, y->data, ggml_nbytes(y));
    return rc;
}

static int ssm_conv_case(FILE * f, int d_conv, int d_inner, int n_t, int n_s, uint32_t seed) {
    struct ggml_context * ctx = new_ctx((size_t) (d_conv + n_t) * d_inner * n_s * 3 + (size_t) d_conv * d_inner);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * sx = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d_conv - 1 + n_t, d_inner, n_s);
    struct ggml_tensor * c  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d_conv, d_inner);
    fill(sx, seed, 1.0f);
    fill(c, seed + 1, 0.5f);
    uint64_t hash = fnv1a(fnv1a(0xcbf29ce484222325ull, sx), c);
    struct ggml_tensor * y = ggml_ssm_conv(ctx, sx, c);
    int rc = write_u32(f, 0) | write_u32(f, seed);
    rc |= write_u32(f, d_conv) | write_u32(f, d_inner) | write_u32(f, n_t) | write_u32(f, n_s);
    rc |= finish(f, ctx, y, hash);
    ggml_free(ctx);
    return rc;
}

struct gdn_case {
    int s_v, h, h_k, n_tokens, n_seqs, b_k, g0, snapshots;
};

static int gdn_case(FILE * f, const struct gdn_case * c, uint32_t seed) {
    const size_t state = (size_t) c->s_v * c->s_v * c->h * c->n_seqs;
    const size_t tokens = (size_t) c->s_v * c->h * c->n_tokens * c->n_seqs;
    struct ggml_context * ctx = new_ctx(state * (2 + c->snapshots) + tokens * 8);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * q     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->s_v, c->h_k, c->n_tokens, c->b_k);
    struct ggml_tensor * k     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->s_v, c->h_k, c->n_tokens, c->b_k);
    struct ggml_tensor * v     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->s_v, c->h, c->n_tokens, c->n_seqs);
    struct ggml_tensor * g     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->g0, c->h, c->n_tokens, c->n_seqs);
    struct ggml_tensor * beta  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, c->h, c->n_tokens, c->n_seqs);
    struct ggml_tensor * s     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->s_v, c->s_v, c->h, c->n_seqs);
    // Keys of about unit length keep the delta rule stable over the tokens.
    const float k_scale = 0.5f / sqrtf((float) c->s_v);
    fill(q, seed, 0.5f);
    fill(k, seed + 1, k_scale);
    fill(v, seed + 2, 1.0f);
    fill(g, seed + 3, 0.2f);
    fill(beta, seed + 4, 0.25f);
    fill(s, seed + 5, 0.5f);
    uint64_t hash = 0xcbf29ce484222325ull;
    struct ggml_tensor * inputs[] = {q, k, v, g, beta, s};
    for (int i = 0; i < 6; i++) {
        hash = fnv1a(hash, inputs[i]);
    }
    struct ggml_tensor * y = ggml_gated_delta_net(ctx, q, k, v, g, beta, s, c->snapshots);
    int rc = write_u32(f, 1) | write_u32(f, seed);
    const int dims[] = {c->s_v, c->h, c->h_k, c->n_tokens, c->n_seqs, c->b_k, c->g0, c->snapshots};
    for (int i = 0; i < 8; i++) {
        rc |= write_u32(f, (uint32_t) dims[i]);
    }
    rc |= finish(f, ctx, y, hash);
    ggml_free(ctx);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    // d_conv, d_inner, n_t, n_s
    const int convs[][4] = {
        {4, 67, 5, 2}, {3, 33, 1, 3}, {1, 7, 3, 1}, {7, 20, 4, 1}, {8, 16, 3, 2},
        {12, 10, 2, 1}, {13, 9, 6, 1}, {15, 6, 2, 1}, {20, 8, 3, 1}, {24, 5, 2, 2},
    };
    // s_v, h, h_k, n_tokens, n_seqs, b_k, g0, snapshots
    const struct gdn_case nets[] = {
        {128, 1, 1, 3, 1, 1, 1, 1},   // Qwen3.5's rows, scalar gate
        {64, 2, 1, 2, 2, 1, 1, 1},    // q/k heads and sequences broadcast
        {48, 2, 2, 3, 1, 1, 48, 1},   // vector gate (KDA), vec_dot leftovers on AVX-512
        {32, 2, 1, 5, 2, 2, 1, 3},    // three snapshots of five tokens
        {20, 2, 1, 2, 2, 2, 20, 4},   // more snapshots than tokens, vector gate
        {16, 3, 3, 1, 1, 1, 1, 1},    // one token (generation)
        {37, 2, 1, 4, 1, 1, 1, 2},    // odd rows: leftovers on both builds
    };
    const int n_conv = (int) (sizeof(convs) / sizeof(convs[0]));
    const int n_net = (int) (sizeof(nets) / sizeof(nets[0]));

    char path[1024];
    snprintf(path, sizeof path, "%s/recurrent.bin", argv[1]);
    FILE * f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    int rc = write_all(f, "RGMLRC1\0", 8) | write_u32(f, (uint32_t) (n_conv + n_net));
    for (int i = 0; i < n_conv && rc == 0; i++) {
        rc |= ssm_conv_case(f, convs[i][0], convs[i][1], convs[i][2], convs[i][3], 100 + 10 * i);
    }
    for (int i = 0; i < n_net && rc == 0; i++) {
        rc |= gdn_case(f, &nets[i], 500 + 10 * i);
    }
    rc |= fclose(f);
    fprintf(stderr, "%s: %s\n", path, rc == 0 ? "ok" : "FAILED");
    return rc == 0 ? 0 : 1;
}
