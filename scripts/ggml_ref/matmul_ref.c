// Reference MUL_MAT results from the real ggml CPU backend, for rgml-cpu's bit-exactness tests
// (crates/rgml-cpu/tests/ggml_matmul.rs). Build and run with gen_matmul.sh.
//
// For each weight type and row length K (768, 576 and 544 = 17 blocks, an odd count) it quantizes a deterministic random weight matrix
// W [K x N] with ggml_quantize_chunk, multiplies it with the first B columns of a deterministic
// random f32 matrix X [K x 19] for B in {1, 2, 5, 8, 19} (vec_dot, llamafile tinyBLAS and the
// tiled K-quant paths), on 1 and 2 threads, and writes
//   x_k{K}.bin:          u32 K, u32 cols, f32 X[cols][K]
//   {type}_k{K}.bin:     "RGMLMM1\0", u32 ggml type, u32 K, u32 N, u32 nbatch, u32 batch[nbatch],
//                        u32 w_bytes, W bytes, then per batch B, per threads T in {1, 2}:
//                        f32 out[B][N]
// Float weights (F32/F16/BF16, K = 576, 1536 and 544, 8 and 6 rows) use the same layout, named
// {type}_k{K}_m{rows}.bin; attention-shaped 3-D products are described at write_attn_case.
// Tensors live in a plain ggml context (no backend buffer), so src0->extra == NULL and no
// repacking is involved.

#include "ggml.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_ROWS 40
#define X_COLS 19
static const int BATCHES[] = {1, 2, 5, 8, 19};
#define NBATCH ((int) (sizeof(BATCHES) / sizeof(BATCHES[0])))

static uint64_t rng_state;

static float next_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float) ((rng_state >> 40) / (double) (1ull << 24));  // [0, 1)
}

// Roughly gaussian values with occasional outliers, so blocks get varied scales.
static float next_value(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        s += next_uniform();
    }
    float scale = next_uniform() < 0.05f ? 8.0f : 1.0f;
    return (s - 2.0f) * scale + 0.01f;
}

static void fill(float * v, size_t n, uint64_t seed) {
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = 0; i < n; i++) {
        v[i] = next_value();
    }
}

static int write_all(FILE * f, const void * p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_u32(FILE * f, uint32_t v) {
    return write_all(f, &v, 4);
}

static int write_x(const char * dir, int k, const float * x) {
    char path[1024];
    snprintf(path, sizeof path, "%s/x_k%d.bin", dir, k);
    FILE * f = fopen(path, "wb");
    if (!f) {
        return -1;
    }
    int rc = write_u32(f, (uint32_t) k) | write_u32(f, X_COLS) |
             write_all(f, x, sizeof(float) * (size_t) k * X_COLS);
    return fclose(f) | rc;
}

// out = ggml_mul_mat(w, xt) computed with n_threads threads (refused if ggml repacked w:
// the fixtures are the plain layout's arithmetic); frees ctx.
static int compute_and_free(struct ggml_context * ctx, struct ggml_tensor * w, struct ggml_tensor * xt,
                            int n_threads, float * out) {
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, xt);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = 0;
    if (w->extra != NULL || ggml_graph_compute_with_ctx(ctx, gf, n_threads) != GGML_STATUS_SUCCESS) {
        rc = -1;
    } else {
        memcpy(out, y->data, ggml_nbytes(y));
    }
    ggml_free(ctx);
    return rc;
}

// Attention-shaped products with grouped-query broadcast: W of `type` [k, m, ne02] against
// src1 [k, b, ne12] for b in ATT_BATCHES. `permuted`: src1 is a permuted view of a
// [k, ne12, b] tensor (llama.cpp's Q in K*Q), else contiguous (the softmaxed KQ in V*KQ).
static const int ATT_BATCHES[] = {1, 2, 5};
#define ATT_NBATCH ((int) (sizeof(ATT_BATCHES) / sizeof(ATT_BATCHES[0])))
#define ATT_COLS 5

// out[h][t][i] = W[h / (ne12 / ne02)] row i . X[h][t], X as [ne12][ATT_COLS][k] (with
// ne02 = ne12 = 1 and not permuted: the plain product W x X[:, :b] of the other fixtures)
static int mul_mat_3d(enum ggml_type type, int k, int m, int ne02, int ne12, int permuted, const void * wbytes,
                      size_t wsize, const float * x, int b, int n_threads, float * out) {
    struct ggml_init_params ip = {
        .mem_size   = wsize + sizeof(float) * ((size_t) k + m) * b * ne12 + (8u << 20),
        .mem_buffer = NULL,
        .no_alloc   = false,
    };
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * w = ggml_new_tensor_3d(ctx, type, k, m, ne02);
    memcpy(w->data, wbytes, wsize);
    struct ggml_tensor * xt;
    if (permuted) {
        struct ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, ne12, b);
        for (int h = 0; h < ne12; h++) {
            for (int t = 0; t < b; t++) {
                memcpy((float *) q->data + ((size_t) t * ne12 + h) * k, x + ((size_t) h * ATT_COLS + t) * k,
                       sizeof(float) * k);
            }
        }
        xt = ggml_permute(ctx, q, 0, 2, 1, 3);
    } else {
        xt = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, b, ne12);
        for (int h = 0; h < ne12; h++) {
            memcpy((float *) xt->data + (size_t) h * b * k, x + (size_t) h * ATT_COLS * k, sizeof(float) * k * b);
        }
    }
    return compute_and_free(ctx, w, xt, n_threads, out);
}

// Quantized weights: {type}_k{K}.bin with N_ROWS rows; float weights (n_rows > 0):
// {type}_k{K}_m{n_rows}.bin.
static int write_case(const char * dir, enum ggml_type type, int k, int n_rows, const float * x) {
    const int named_rows = n_rows;
    n_rows = n_rows > 0 ? n_rows : N_ROWS;
    float * wsrc = malloc(sizeof(float) * (size_t) k * n_rows);
    size_t wsize = ggml_row_size(type, k) * n_rows;
    void * wbytes = malloc(wsize);
    float * out = malloc(sizeof(float) * n_rows * X_COLS);
    if (!wsrc || !wbytes || !out) {
        return -1;
    }
    fill(wsrc, (size_t) k * n_rows, 1000 + (uint64_t) type * 7 + (uint64_t) k + (uint64_t) named_rows * 131);
    ggml_quantize_chunk(type, wsrc, wbytes, 0, n_rows, k, NULL);

    char path[1024];
    if (named_rows > 0) {
        snprintf(path, sizeof path, "%s/%s_k%d_m%d.bin", dir, ggml_type_name(type), k, n_rows);
    } else {
        snprintf(path, sizeof path, "%s/%s_k%d.bin", dir, ggml_type_name(type), k);
    }
    FILE * f = fopen(path, "wb");
    int rc = f ? 0 : -1;
    if (f) {
        rc |= write_all(f, "RGMLMM1", 8) | write_u32(f, (uint32_t) type) | write_u32(f, (uint32_t) k) |
              write_u32(f, (uint32_t) n_rows) | write_u32(f, NBATCH);
        for (int i = 0; i < NBATCH; i++) {
            rc |= write_u32(f, (uint32_t) BATCHES[i]);
        }
        rc |= write_u32(f, (uint32_t) wsize) | write_all(f, wbytes, wsize);
        for (int i = 0; i < NBATCH && rc == 0; i++) {
            for (int t = 1; t <= 2 && rc == 0; t++) {
                rc |= mul_mat_3d(type, k, n_rows, 1, 1, 0, wbytes, wsize, x, BATCHES[i], t, out);
                rc |= write_all(f, out, sizeof(float) * n_rows * BATCHES[i]);
            }
        }
        rc |= fclose(f);
    }
    fprintf(stderr, "%s: %s\n", path, rc == 0 ? "ok" : "FAILED");
    free(wsrc);
    free(wbytes);
    free(out);
    return rc;
}

// attn_{name}.bin: "RGMLMM2\0", u32 type, u32 K, u32 M, u32 ne02, u32 ne12, u32 permuted,
// u32 nbatch, u32 batch[nbatch], u32 w_bytes, W bytes, u32 cols, f32 X[ne12][cols][K], then per
// batch B, per threads T in {1, 2}: f32 out[ne12][B][M]
static int write_attn_case(const char * dir, const char * name, enum ggml_type type, int k, int m, int permuted) {
    const int ne02 = 3, ne12 = 9;
    size_t wsize = ggml_row_size(type, k) * m * ne02;
    float * wsrc = malloc(sizeof(float) * (size_t) k * m * ne02);
    void * wbytes = malloc(wsize);
    float * x = malloc(sizeof(float) * (size_t) k * ATT_COLS * ne12);
    float * out = malloc(sizeof(float) * (size_t) m * ATT_COLS * ne12);
    if (!wsrc || !wbytes || !x || !out) {
        return -1;
    }
    fill(wsrc, (size_t) k * m * ne02, 5000 + (uint64_t) k * 3 + (uint64_t) m);
    fill(x, (size_t) k * ATT_COLS * ne12, 6000 + (uint64_t) k * 3 + (uint64_t) m);
    ggml_quantize_chunk(type, wsrc, wbytes, 0, (int64_t) m * ne02, k, NULL);

    char path[1024];
    snprintf(path, sizeof path, "%s/attn_%s.bin", dir, name);
    FILE * f = fopen(path, "wb");
    int rc = f ? 0 : -1;
    if (f) {
        rc |= write_all(f, "RGMLMM2", 8) | write_u32(f, (uint32_t) type) | write_u32(f, (uint32_t) k) |
              write_u32(f, (uint32_t) m) | write_u32(f, (uint32_t) ne02) | write_u32(f, (uint32_t) ne12) |
              write_u32(f, (uint32_t) permuted) | write_u32(f, ATT_NBATCH);
        for (int i = 0; i < ATT_NBATCH; i++) {
            rc |= write_u32(f, (uint32_t) ATT_BATCHES[i]);
        }
        rc |= write_u32(f, (uint32_t) wsize) | write_all(f, wbytes, wsize);
        rc |= write_u32(f, ATT_COLS) | write_all(f, x, sizeof(float) * (size_t) k * ATT_COLS * ne12);
        for (int i = 0; i < ATT_NBATCH && rc == 0; i++) {
            for (int t = 1; t <= 2 && rc == 0; t++) {
                const int b = ATT_BATCHES[i];
                rc |= mul_mat_3d(type, k, m, ne02, ne12, permuted, wbytes, wsize, x, b, t, out);
                rc |= write_all(f, out, sizeof(float) * (size_t) m * b * ne12);
            }
        }
        rc |= fclose(f);
    }
    fprintf(stderr, "%s: %s\n", path, rc == 0 ? "ok" : "FAILED");
    free(wsrc);
    free(wbytes);
    free(x);
    free(out);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    // MXFP4: `vec_dot` at every batch (neither tinyBLAS nor the tiled kernels take it).
    const enum ggml_type legacy[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                                     GGML_TYPE_IQ4_NL, GGML_TYPE_MXFP4};
    const enum ggml_type kquants[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                                      GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS};
    const enum ggml_type floats[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16};
    // Float weights: a row count tinyBLAS takes (m % 4 == 0) and one it declines.
    const int float_rows[] = {8, 6};
    // 544 = 17 blocks of 32: the odd last block `vec_dot` adds on its own (IQ4_NL's pairs).
    const int ks[] = {768, 576, 1536, 544};
    int rc = 0;
    for (int ki = 0; ki < 4; ki++) {
        const int k = ks[ki];
        float * x = malloc(sizeof(float) * (size_t) k * X_COLS);
        if (!x) {
            return 1;
        }
        fill(x, (size_t) k * X_COLS, 77 + (uint64_t) k);
        rc |= write_x(argv[1], k, x);
        for (size_t i = 0; k != 1536 && i < sizeof legacy / sizeof legacy[0]; i++) {
            rc |= write_case(argv[1], legacy[i], k, 0, x);
        }
        if (k == 768) {
            for (size_t i = 0; i < sizeof kquants / sizeof kquants[0]; i++) {
                rc |= write_case(argv[1], kquants[i], k, 0, x);
            }
        }
        for (size_t i = 0; k != 768 && i < sizeof floats / sizeof floats[0]; i++) {
            for (int r = 0; r < 2; r++) {
                rc |= write_case(argv[1], floats[i], k, float_rows[r], x);
            }
        }
        free(x);
    }
    // K*Q (K cache rows x permuted Q) with n_kv rows tinyBLAS takes and declines; V*KQ (the
    // transposed V cache) with n_kv a multiple of 8 and not.
    rc |= write_attn_case(argv[1], "kq_f16_m40", GGML_TYPE_F16, 64, 40, 1);
    rc |= write_attn_case(argv[1], "kq_f16_m37", GGML_TYPE_F16, 64, 37, 1);
    rc |= write_attn_case(argv[1], "kqv_f16_k128", GGML_TYPE_F16, 128, 64, 0);
    rc |= write_attn_case(argv[1], "kqv_f16_k37", GGML_TYPE_F16, 37, 64, 0);
    return rc == 0 ? 0 : 1;
}
