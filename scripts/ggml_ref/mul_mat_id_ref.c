// Reference MUL_MAT_ID results from the real ggml CPU backend, for rgml-cpu's bit-exactness test
// (crates/rgml-cpu/tests/ggml_mul_mat_id.rs). Build and run with gen_mul_mat_id.sh.
//
// Per weight type: 4 experts of 16 rows by K = 256 (ggml_quantize_chunk's bytes; BF16 rounded
// to nearest even as ggml_fp32_to_bf16_row_ref does), 20 tokens
// with 2 experts each, routed so that experts get 12, 3, 8 and 17 rows: ggml-cpu takes its
// tiled K-quant kernel for an expert from 8 routed rows and vec_dot below, per expert. One case
// broadcasts src1 to both slots (n_b = 1, as llama.cpp's gate and up products), one has a row
// per slot (n_b = 2, the down product). Each runs on 1 and 2 threads; the fixture keeps the
// first result and the test checks that the second equals it.
//
// The inputs are not stored: the test makes them again from the seed (the weights from `seed`,
// src1 from `seed + 1`, with flash_attn_ref.c's generator; the weights as ggml-base stores
// them; the ids by the rule in write_case) and checks them against their hash.
//
// mul_mat_id.bin: "RGMLMI1\0", u32 n_cases, then per case:
//   u32 ggml type, K, N, n_expert, n_used, n_b, tokens, u32 seed,
//   u64 FNV-1a of W bytes, f32 b[tokens][n_b][K] and i32 ids[tokens][n_used], in that order,
//   f32 out[tokens][n_used][N]

#include "ggml.h"
#include "ggml-cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 256
#define N 16
#define N_EXPERT 4
#define N_USED 2
#define TOKENS 20

static uint64_t rng_state;

static float next_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 40) / (double) (1ull << 24));  // [0, 1)
}

static float next_value(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        s += next_uniform();
    }
    float scale = next_uniform() < 0.05f ? 4.0f : 1.0f;
    return (s - 2.0f) * scale + 0.01f;
}

static void fill(float * v, size_t n, uint64_t seed) {
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = 0; i < n; i++) {
        v[i] = next_value();
    }
}

static uint64_t fnv1a(uint64_t h, const void * p, size_t n) {
    const unsigned char * c = p;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ c[i]) * 0x100000001b3ull;
    }
    return h;
}

static int write_all(FILE * f, const void * p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_u32(FILE * f, uint32_t v) {
    return write_all(f, &v, 4);
}

static int run(enum ggml_type type, const void * w, size_t w_bytes, const float * b, int n_b, const int32_t * ids,
               int threads, float * out) {
    struct ggml_init_params ip = {.mem_size = w_bytes + (8u << 20), .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * tw = ggml_new_tensor_3d(ctx, type, K, N, N_EXPERT);
    memcpy(tw->data, w, w_bytes);
    struct ggml_tensor * tb = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, n_b, TOKENS);
    memcpy(tb->data, b, ggml_nbytes(tb));
    struct ggml_tensor * ti = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, N_USED, TOKENS);
    memcpy(ti->data, ids, ggml_nbytes(ti));
    struct ggml_tensor * y = ggml_mul_mat_id(ctx, tw, tb, ti);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = ggml_graph_compute_with_ctx(ctx, gf, threads) == GGML_STATUS_SUCCESS ? 0 : -1;
    if (rc == 0) {
        memcpy(out, y->data, ggml_nbytes(y));
    }
    ggml_free(ctx);
    return rc;
}

static int write_case(FILE * f, enum ggml_type type, int n_b, uint64_t seed) {
    const size_t nw = (size_t) K * N * N_EXPERT;
    float * wf = malloc(sizeof(float) * nw);
    float * b = malloc(sizeof(float) * K * n_b * TOKENS);
    float * out1 = malloc(sizeof(float) * N * N_USED * TOKENS);
    float * out2 = malloc(sizeof(float) * N * N_USED * TOKENS);
    int32_t ids[TOKENS * N_USED];
    fill(wf, nw, seed);
    fill(b, (size_t) K * n_b * TOKENS, seed + 1);
    // experts 0, 1, 2, 3 get 12, 3, 8 and 17 rows
    for (int t = 0; t < TOKENS; t++) {
        ids[t * N_USED + 0] = t < 12 ? 0 : 2;
        ids[t * N_USED + 1] = t % 7 == 0 ? 1 : 3;
    }
    const size_t w_bytes = ggml_row_size(type, K) * N * N_EXPERT;
    void * w = malloc(w_bytes);
    if (type == GGML_TYPE_F32) {
        memcpy(w, wf, w_bytes);
    } else if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(wf, w, (int64_t) nw);
    } else {
        ggml_quantize_chunk(type, wf, w, 0, (int64_t) N * N_EXPERT, K, NULL);
    }
    int rc = run(type, w, w_bytes, b, n_b, ids, 1, out1) | run(type, w, w_bytes, b, n_b, ids, 2, out2);
    if (rc == 0 && memcmp(out1, out2, sizeof(float) * N * N_USED * TOKENS) != 0) {
        fprintf(stderr, "type %d: 1 and 2 threads differ\n", (int) type);
        rc = -1;
    }
    rc |= write_u32(f, (uint32_t) type) | write_u32(f, K) | write_u32(f, N) | write_u32(f, N_EXPERT) |
          write_u32(f, N_USED) | write_u32(f, (uint32_t) n_b) | write_u32(f, TOKENS) | write_u32(f, (uint32_t) seed);
    uint64_t h = fnv1a(0xcbf29ce484222325ull, w, w_bytes);
    h = fnv1a(h, b, sizeof(float) * K * n_b * TOKENS);
    h = fnv1a(h, ids, sizeof ids);
    rc |= write_all(f, &h, 8);
    rc |= write_all(f, out1, sizeof(float) * N * N_USED * TOKENS);
    free(wf);
    free(b);
    free(out1);
    free(out2);
    free(w);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    // MXFP4 and BF16 after the others (the seeds follow the order; types are added at the
    // end): `vec_dot` for every expert.
    const enum ggml_type types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_Q4_0,   GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                                    GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4, GGML_TYPE_BF16};
    const int n_types = (int) (sizeof types / sizeof types[0]);
    char path[1024];
    snprintf(path, sizeof path, "%s/mul_mat_id.bin", argv[1]);
    FILE * f = fopen(path, "wb");
    if (!f) {
        return 1;
    }
    int rc = write_all(f, "RGMLMI1\0", 8) | write_u32(f, (uint32_t) (2 * n_types));
    for (int i = 0; i < n_types; i++) {
        for (int n_b = 1; n_b <= N_USED; n_b++) {
            rc |= write_case(f, types[i], n_b, (uint64_t) (100 + 7 * i + n_b));
        }
    }
    rc |= fclose(f);
    return rc ? 1 : 0;
}
