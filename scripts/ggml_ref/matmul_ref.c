// Reference MUL_MAT results from the real ggml CPU backend, for rgml-cpu's bit-exactness tests
// (crates/rgml-cpu/tests/ggml_matmul.rs). Build and run with gen_matmul.sh.
//
// For each weight type and row length K it quantizes a deterministic random weight matrix
// W [K x N] with ggml_quantize_chunk, multiplies it with the first B columns of a deterministic
// random f32 matrix X [K x 19] for B in {1, 2, 5, 8, 19} (vec_dot, llamafile tinyBLAS and the
// tiled K-quant paths), on 1 and 2 threads, and writes
//   x_k{K}.bin:          u32 K, u32 cols, f32 X[cols][K]
//   {type}_k{K}.bin:     "RGMLMM1\0", u32 ggml type, u32 K, u32 N, u32 nbatch, u32 batch[nbatch],
//                        u32 w_bytes, W bytes, then per batch B, per threads T in {1, 2}:
//                        f32 out[B][N]
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

// out = W x X[:, :b] with n_threads threads
static int mul_mat(enum ggml_type type, int k, const void * wbytes, size_t wsize, const float * x, int b,
                   int n_threads, float * out) {
    struct ggml_init_params ip = {
        .mem_size   = wsize + sizeof(float) * (size_t) k * b + sizeof(float) * N_ROWS * b + (8u << 20),
        .mem_buffer = NULL,
        .no_alloc   = false,
    };
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * w = ggml_new_tensor_2d(ctx, type, k, N_ROWS);
    struct ggml_tensor * xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, b);
    memcpy(w->data, wbytes, wsize);
    memcpy(xt->data, x, sizeof(float) * (size_t) k * b);
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, xt);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = 0;
    if (w->extra != NULL || ggml_graph_compute_with_ctx(ctx, gf, n_threads) != GGML_STATUS_SUCCESS) {
        rc = -1;
    } else {
        memcpy(out, y->data, sizeof(float) * N_ROWS * b);
    }
    ggml_free(ctx);
    return rc;
}

static int write_case(const char * dir, enum ggml_type type, int k, const float * x) {
    float * wsrc = malloc(sizeof(float) * (size_t) k * N_ROWS);
    size_t wsize = ggml_row_size(type, k) * N_ROWS;
    void * wbytes = malloc(wsize);
    float * out = malloc(sizeof(float) * N_ROWS * X_COLS);
    if (!wsrc || !wbytes || !out) {
        return -1;
    }
    fill(wsrc, (size_t) k * N_ROWS, 1000 + (uint64_t) type * 7 + (uint64_t) k);
    ggml_quantize_chunk(type, wsrc, wbytes, 0, N_ROWS, k, NULL);

    char path[1024];
    snprintf(path, sizeof path, "%s/%s_k%d.bin", dir, ggml_type_name(type), k);
    FILE * f = fopen(path, "wb");
    int rc = f ? 0 : -1;
    if (f) {
        rc |= write_all(f, "RGMLMM1", 8) | write_u32(f, (uint32_t) type) | write_u32(f, (uint32_t) k) |
              write_u32(f, N_ROWS) | write_u32(f, NBATCH);
        for (int i = 0; i < NBATCH; i++) {
            rc |= write_u32(f, (uint32_t) BATCHES[i]);
        }
        rc |= write_u32(f, (uint32_t) wsize) | write_all(f, wbytes, wsize);
        for (int i = 0; i < NBATCH && rc == 0; i++) {
            for (int t = 1; t <= 2 && rc == 0; t++) {
                rc |= mul_mat(type, k, wbytes, wsize, x, BATCHES[i], t, out);
                rc |= write_all(f, out, sizeof(float) * N_ROWS * BATCHES[i]);
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

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    const enum ggml_type legacy[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                                     GGML_TYPE_IQ4_NL};
    const enum ggml_type kquants[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                                      GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS};
    const int ks[] = {768, 576};
    int rc = 0;
    for (int ki = 0; ki < 2; ki++) {
        const int k = ks[ki];
        float * x = malloc(sizeof(float) * (size_t) k * X_COLS);
        if (!x) {
            return 1;
        }
        fill(x, (size_t) k * X_COLS, 77 + (uint64_t) k);
        rc |= write_x(argv[1], k, x);
        for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
            rc |= write_case(argv[1], legacy[i], k, x);
        }
        if (k % 256 == 0) {
            for (size_t i = 0; i < sizeof kquants / sizeof kquants[0]; i++) {
                rc |= write_case(argv[1], kquants[i], k, x);
            }
        }
        free(x);
    }
    return rc == 0 ? 0 : 1;
}
