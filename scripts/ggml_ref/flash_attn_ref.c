// Reference FLASH_ATTN_EXT results from the real ggml CPU backend, for rgml-cpu's bit-exactness
// test (crates/rgml-cpu/tests/ggml_flash_attn.rs). Build and run with gen_flash_attn.sh.
//
// Each case is one ggml_flash_attn_ext (precision F32, as llama.cpp sets it) on deterministic
// random data, chosen so that each of ggml-cpu's three kernels runs: fewer than 64 queries (the
// one-row kernel), 64 or more (the tiled kernel, with a partial last tile of cells and whole
// tiles masked), and one query over 512 cells or more (the cells split between the threads,
// whose partial sums are merged: its rounding depends on the thread count). K and V are F16,
// F32, Q8_0 or Q4_0; masks hold -inf (causal, and padding cells as llama.cpp's cache has them);
// some cases add soft-capping, ALiBi and sinks. Every case runs on 1, 2 and 3 threads.
//
// The inputs are not stored: the test makes them again from the seed (the generator below is
// plain f32 arithmetic, with no fused operations on the baseline x86-64 this compiles for; F16
// rows and Q8_0/Q4_0 blocks as ggml-base stores them), and checks them against their hash.
//
// fa.bin: "RGMLFA2\0", u32 n_cases, then per case:
//   u32 k_type, u32 v_type (ggml type ids), u32 dk, dv, n_q, n_kv, n_head, n_head_kv,
//   u32 first_pos, u32 used (0: no mask), u32 has_sinks, f32 scale, max_bias, softcap, u32 seed,
//   u64 FNV-1a of the input bytes (q f32 [n_head][n_q][dk], K rows [n_head_kv][n_kv], V rows,
//   the f16 mask [n_q][n_kv] if any, the f32 sinks [n_head] if any, in that order),
//   u32 n_runs, per run: u32 threads, u32 same (1: the previous run's output, not repeated),
//   f32 out[n_q][n_head][dv] unless same

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

static void fill(float * v, size_t n, uint64_t seed, float scale) {
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = 0; i < n; i++) {
        v[i] = next_value() * scale;
    }
}

static int write_all(FILE * f, const void * p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_u32(FILE * f, uint32_t v) {
    return write_all(f, &v, 4);
}

static int write_f32(FILE * f, float v) {
    return write_all(f, &v, 4);
}

static uint64_t fnv1a(uint64_t h, const void * p, size_t n) {
    const unsigned char * b = p;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 0x100000001b3ull;
    }
    return h;
}

struct fa_case {
    enum ggml_type k_type, v_type;
    int dk, dv, n_q, n_kv, n_head, n_head_kv;
    // Cells a query may see: query i sees cells [0, first_pos + i] of the first `used` cells
    // (causal); the rest are -inf, as unused cache cells are. `used` 0: no mask.
    int first_pos, used;
    int sinks;
    float scale, max_bias, softcap;
};

// K or V rows of `type` from f32 values: the bytes ggml would store.
static void * to_type(enum ggml_type type, const float * src, int64_t n_per_row, int64_t rows, size_t * bytes) {
    *bytes = ggml_row_size(type, n_per_row) * rows;
    void * out = malloc(*bytes);
    if (!out) {
        return NULL;
    }
    if (type == GGML_TYPE_F32) {
        memcpy(out, src, *bytes);
    } else if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(src, out, n_per_row * rows);
    } else {
        ggml_quantize_chunk(type, src, out, 0, rows, n_per_row, NULL);
    }
    return out;
}

static int run(const struct fa_case * c, const float * q, const void * kb, size_t k_bytes, const void * vb,
               size_t v_bytes, const uint16_t * mask, const float * sinks, int n_threads, float * out) {
    size_t mem = (size_t) sizeof(float) * c->dk * c->n_q * c->n_head * 2 + k_bytes + v_bytes +
                 sizeof(uint16_t) * c->n_kv * c->n_q + sizeof(float) * (c->n_head + (size_t) c->dv * c->n_head * c->n_q) +
                 (16u << 20);
    struct ggml_init_params ip = {.mem_size = mem, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * tq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c->dk, c->n_q, c->n_head, 1);
    memcpy(tq->data, q, ggml_nbytes(tq));
    struct ggml_tensor * tk = ggml_new_tensor_4d(ctx, c->k_type, c->dk, c->n_kv, c->n_head_kv, 1);
    memcpy(tk->data, kb, k_bytes);
    struct ggml_tensor * tv = ggml_new_tensor_4d(ctx, c->v_type, c->dv, c->n_kv, c->n_head_kv, 1);
    memcpy(tv->data, vb, v_bytes);
    struct ggml_tensor * tm = NULL;
    if (mask) {
        tm = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c->n_kv, c->n_q, 1, 1);
        memcpy(tm->data, mask, ggml_nbytes(tm));
    }
    struct ggml_tensor * y = ggml_flash_attn_ext(ctx, tq, tk, tv, tm, c->scale, c->max_bias, c->softcap);
    if (sinks) {
        struct ggml_tensor * ts = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c->n_head);
        memcpy(ts->data, sinks, ggml_nbytes(ts));
        ggml_flash_attn_ext_add_sinks(y, ts);
    }
    ggml_prec_set_acc(y, GGML_PREC_F32);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = ggml_graph_compute_with_ctx(ctx, gf, n_threads) == GGML_STATUS_SUCCESS ? 0 : -1;
    if (rc == 0) {
        memcpy(out, y->data, ggml_nbytes(y));
    }
    ggml_free(ctx);
    return rc;
}

static int write_case(FILE * f, const struct fa_case * c, uint64_t seed) {
    const size_t nq = (size_t) c->dk * c->n_q * c->n_head;
    const size_t nk = (size_t) c->dk * c->n_kv * c->n_head_kv;
    const size_t nv = (size_t) c->dv * c->n_kv * c->n_head_kv;
    const size_t nout = (size_t) c->dv * c->n_head * c->n_q;
    float * q = malloc(sizeof(float) * nq);
    float * kf = malloc(sizeof(float) * nk);
    float * vf = malloc(sizeof(float) * nv);
    float * out = malloc(sizeof(float) * nout);
    uint16_t * mask = c->used ? malloc(sizeof(uint16_t) * c->n_kv * c->n_q) : NULL;
    float * sinks = c->sinks ? malloc(sizeof(float) * c->n_head) : NULL;
    if (!q || !kf || !vf || !out || (c->used && !mask) || (c->sinks && !sinks)) {
        return -1;
    }
    fill(q, nq, seed, 0.5f);
    fill(kf, nk, seed + 1, 1.0f);
    fill(vf, nv, seed + 2, 1.0f);
    if (sinks) {
        fill(sinks, c->n_head, seed + 3, 2.0f);
    }
    for (int i = 0; mask && i < c->n_q; i++) {
        for (int j = 0; j < c->n_kv; j++) {
            const int visible = j < c->used && j <= c->first_pos + i;
            mask[(size_t) i * c->n_kv + j] = ggml_fp32_to_fp16(visible ? 0.0f : -INFINITY);
        }
    }
    size_t k_bytes = 0, v_bytes = 0;
    void * kb = to_type(c->k_type, kf, c->dk, (int64_t) c->n_kv * c->n_head_kv, &k_bytes);
    void * vb = to_type(c->v_type, vf, c->dv, (int64_t) c->n_kv * c->n_head_kv, &v_bytes);
    if (!kb || !vb) {
        return -1;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, q, sizeof(float) * nq);
    h = fnv1a(h, kb, k_bytes);
    h = fnv1a(h, vb, v_bytes);
    if (mask) {
        h = fnv1a(h, mask, sizeof(uint16_t) * c->n_kv * c->n_q);
    }
    if (sinks) {
        h = fnv1a(h, sinks, sizeof(float) * c->n_head);
    }
    int rc = write_u32(f, c->k_type) | write_u32(f, c->v_type) | write_u32(f, c->dk) | write_u32(f, c->dv) |
             write_u32(f, c->n_q) | write_u32(f, c->n_kv) | write_u32(f, c->n_head) | write_u32(f, c->n_head_kv) |
             write_u32(f, c->first_pos) | write_u32(f, c->used) | write_u32(f, c->sinks) |
             write_f32(f, c->scale) | write_f32(f, c->max_bias) | write_f32(f, c->softcap) |
             write_u32(f, (uint32_t) seed) | write_all(f, &h, 8);
    const int threads[] = {1, 2, 3};
    float * prev = malloc(sizeof(float) * nout);
    if (!prev) {
        return -1;
    }
    rc |= write_u32(f, 3);
    for (int t = 0; t < 3; t++) {
        rc |= run(c, q, kb, k_bytes, vb, v_bytes, mask, sinks, threads[t], out);
        const int same = t > 0 && memcmp(prev, out, sizeof(float) * nout) == 0;
        rc |= write_u32(f, (uint32_t) threads[t]) | write_u32(f, (uint32_t) same);
        if (!same) {
            rc |= write_all(f, out, sizeof(float) * nout);
        }
        memcpy(prev, out, sizeof(float) * nout);
    }
    free(prev);
    free(q);
    free(kf);
    free(vf);
    free(out);
    free(mask);
    free(sinks);
    free(kb);
    free(vb);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    const enum ggml_type F16 = GGML_TYPE_F16, F32 = GGML_TYPE_F32, Q8 = GGML_TYPE_Q8_0, Q4 = GGML_TYPE_Q4_0;
    // k, v, dk, dv, n_q, n_kv, heads, kv heads, first_pos, used, sinks, scale, max_bias, softcap
    const struct fa_case cases[] = {
        // one-row kernel: a short prompt after 40 cached cells, grouped heads
        {F16, F16, 64, 64, 5, 256, 8, 2, 40, 45, 0, 0.125f, 0.0f, 0.0f},
        // tiled kernel: 70 queries (a second, partial tile of queries), 200 cells (a partial
        // last tile of cells), the first query seeing 3 cells (whole tiles masked for it)
        {F16, F16, 64, 64, 70, 200, 4, 2, 2, 72, 0, 0.125f, 0.0f, 0.0f},
        // tiled, F32 K and V, head size 128, no grouping
        {F32, F32, 128, 128, 64, 128, 2, 2, 60, 124, 0, 0.088388f, 0.0f, 0.0f},
        // split cells: one query over 768 cells (600 used)
        {F16, F16, 64, 64, 1, 768, 8, 2, 599, 600, 0, 0.125f, 0.0f, 0.0f},
        // split cells, F32, 512 cells all used, with sinks
        {F32, F32, 64, 64, 1, 512, 4, 1, 511, 512, 1, 0.125f, 0.0f, 0.0f},
        // one query below the split threshold (256 cells)
        {F16, F16, 64, 64, 1, 256, 8, 2, 130, 131, 0, 0.125f, 0.0f, 0.0f},
        // soft-capping, ALiBi and sinks on both kernels; head size 256 (Gemma's)
        {F16, F16, 256, 256, 3, 128, 4, 1, 80, 83, 1, 0.0625f, 8.0f, 30.0f},
        {F16, F16, 256, 256, 66, 128, 2, 1, 20, 86, 1, 0.0625f, 8.0f, 30.0f},
        // no mask
        {F16, F16, 64, 64, 2, 96, 4, 4, 0, 0, 0, 0.125f, 0.0f, 0.0f},
        // gpt-oss's shape: 38 queries (the one-row kernel) over 256 cells, 8 heads on 2, sinks
        {F16, F16, 64, 64, 38, 256, 8, 2, 0, 38, 1, 0.125f, 0.0f, 0.0f},
        // quantized caches (the one-row kernel takes them at any size)
        {Q8, Q8, 64, 64, 4, 256, 8, 2, 50, 54, 0, 0.125f, 0.0f, 0.0f},
        {Q4, Q4, 64, 64, 4, 256, 8, 2, 50, 54, 0, 0.125f, 0.0f, 0.0f},
        {Q8, F16, 64, 64, 70, 256, 4, 2, 10, 80, 0, 0.125f, 0.0f, 0.0f},
        {F16, Q4, 64, 64, 1, 768, 4, 2, 700, 701, 0, 0.125f, 0.0f, 0.0f},
        {Q8, Q8, 64, 64, 1, 1024, 4, 2, 900, 901, 1, 0.125f, 0.0f, 0.0f},
    };
    const int n_cases = (int) (sizeof cases / sizeof cases[0]);
    char path[1024];
    snprintf(path, sizeof path, "%s/fa.bin", argv[1]);
    FILE * f = fopen(path, "wb");
    if (!f) {
        return 1;
    }
    int rc = write_all(f, "RGMLFA2\0", 8) | write_u32(f, (uint32_t) n_cases);
    for (int i = 0; i < n_cases; i++) {
        rc |= write_case(f, &cases[i], 1000 + (uint64_t) i);
    }
    rc |= fclose(f);
    return rc == 0 ? 0 : 1;
}
