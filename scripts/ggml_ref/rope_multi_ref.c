// Reference multi-section ROPE results (ggml_rope_multi, text modes MROPE and IMROPE) from the
// real ggml CPU backend, for rgml-cpu's bit-exactness test (crates/rgml-cpu/tests/
// ggml_rope_multi.rs). Build and run with gen_rope_multi.sh --isa avx2|native.
//
// Each case runs ggml_rope_multi on a deterministic random f32 tensor [ne0, ne1, ne2] with four
// positions per token (ggml's layout: pos[i], pos[i + ne2], pos[i + 2 ne2], pos[i + 3 ne2]; small,
// large, negative, and all four different), in MROPE (8) and IMROPE (40) mode, with Qwen2-VL's,
// Qwen3-VL's and Qwen3.5's sections and sections that wrap around the rotated pairs or give the
// fourth position pairs; with and without frequency factors and YaRN, whole and partial
// rotation; on 2 threads.
//
// The rows are not stored: the test makes them again from the seed (the generator of
// flash_attn_ref.c) and checks them against their hash. Positions and factors are stored.
//
// rope_multi.bin: "RGMLRM1\0", u32 n_cases, then per case:
//   u32 mode, u32 ne0, ne1, ne2, u32 n_dims, u32 n_ctx_orig, u32 n_ff (0: no factors),
//   i32 sections[4], f32 freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow,
//   u32 seed, u64 FNV-1a of x (f32 [ne2][ne1][ne0]), i32 pos[4 ne2], f32 ff[n_ff],
//   f32 out[ne2][ne1][ne0]

#include "ggml.h"
#include "ggml-cpu.h"

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

struct rope_case {
    int   ne0, ne1, ne2;
    int   n_dims;
    int   sections[4];
    int   n_ctx_orig;
    int   n_ff;
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
};

static int run_case(FILE * f, const struct rope_case * c, int mode, uint32_t seed) {
    const size_t n = (size_t) c->ne0 * c->ne1 * c->ne2;
    struct ggml_init_params ip = {
        .mem_size   = sizeof(float) * (3 * n + 4 * c->ne2 + c->n_ff) + (4u << 20),
        .mem_buffer = NULL,
        .no_alloc   = false,
    };
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c->ne0, c->ne1, c->ne2);
    struct ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4 * c->ne2);
    struct ggml_tensor * ff  = c->n_ff > 0 ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c->n_ff) : NULL;

    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    float * xd = (float *) x->data;
    for (size_t i = 0; i < n; i++) {
        xd[i] = next_value();
    }
    const uint64_t hash = fnv1a(0xcbf29ce484222325ull, xd, n * sizeof(float));
    int32_t * pd = (int32_t *) pos->data;
    for (int i = 0; i < 4 * c->ne2; i++) {
        const int tok = i % c->ne2;
        const float u = next_uniform();
        switch (tok) {
            case 0: pd[i] = i / c->ne2; break;                                  // 0, 1, 2, 3
            case 1: pd[i] = 100000 + (int32_t) (u * 900000.0f); break;          // large
            case 2: pd[i] = -1 - (int32_t) (u * 1000.0f); break;                // negative
            default: pd[i] = (int32_t) (u * 4096.0f); break;
        }
    }
    if (ff) {
        float * fd = (float *) ff->data;
        for (int i = 0; i < c->n_ff; i++) {
            fd[i] = 1.0f + 7.0f * next_uniform();
        }
    }

    int sections[4];
    memcpy(sections, c->sections, sizeof sections);
    struct ggml_tensor * y = ggml_rope_multi(ctx, x, pos, ff, c->n_dims, sections, mode, c->n_ctx_orig, c->freq_base,
                                             c->freq_scale, c->ext_factor, c->attn_factor, c->beta_fast, c->beta_slow);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = ggml_graph_compute_with_ctx(ctx, gf, 2) == GGML_STATUS_SUCCESS ? 0 : -1;
    if (rc == 0) {
        rc |= write_u32(f, (uint32_t) mode) | write_u32(f, (uint32_t) c->ne0) | write_u32(f, (uint32_t) c->ne1) |
              write_u32(f, (uint32_t) c->ne2) | write_u32(f, (uint32_t) c->n_dims) |
              write_u32(f, (uint32_t) c->n_ctx_orig) | write_u32(f, (uint32_t) c->n_ff);
        rc |= write_all(f, c->sections, sizeof(c->sections));
        rc |= write_f32(f, c->freq_base) | write_f32(f, c->freq_scale) | write_f32(f, c->ext_factor) |
              write_f32(f, c->attn_factor) | write_f32(f, c->beta_fast) | write_f32(f, c->beta_slow);
        rc |= write_u32(f, seed) | write_all(f, &hash, 8);
        rc |= write_all(f, pos->data, sizeof(int32_t) * 4 * c->ne2);
        if (ff) {
            rc |= write_all(f, ff->data, sizeof(float) * c->n_ff);
        }
        rc |= write_all(f, y->data, sizeof(float) * n);
    }
    ggml_free(ctx);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    const struct rope_case base[] = {
        // Qwen3.5: a quarter of 256 dims rotate, θ base 10^7.
        {256, 2, 5, 64, {11, 11, 10, 0}, 0, 0, 10000000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        // Qwen3-VL's text (sectors past 3 sections[1] take the fourth position).
        {128, 2, 5, 128, {24, 20, 20, 0}, 0, 0, 5000000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        // Qwen2-VL.
        {128, 2, 5, 128, {16, 24, 24, 0}, 0, 0, 1000000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        // Sections that wrap around the pairs, the fourth one used.
        {64, 3, 5, 64, {3, 2, 2, 1}, 0, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        // Frequency factors (more than n_dims / 2), partial rotation.
        {64, 2, 5, 48, {8, 8, 8, 0}, 0, 30, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        // YaRN, with and without factors.
        {64, 2, 5, 64, {12, 10, 10, 0}, 4096, 0, 10000.0f, 0.25f, 1.0f, 1.0f, 32.0f, 1.0f},
        {18, 3, 5, 14, {3, 2, 2, 0}, 512, 9, 10000.0f, 0.5f, 1.0f, 0.8f, 32.0f, 1.0f},
    };
    const int nbase = (int) (sizeof(base) / sizeof(base[0]));
    const int modes[] = {GGML_ROPE_TYPE_MROPE, GGML_ROPE_TYPE_IMROPE};

    char path[1024];
    snprintf(path, sizeof path, "%s/rope_multi.bin", argv[1]);
    FILE * f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    int rc = write_all(f, "RGMLRM1\0", 8) | write_u32(f, (uint32_t) (2 * nbase));
    for (int m = 0; m < 2 && rc == 0; m++) {
        for (int i = 0; i < nbase && rc == 0; i++) {
            rc |= run_case(f, &base[i], modes[m], 300 + (uint32_t) (m * nbase + i));
        }
    }
    rc |= fclose(f);
    fprintf(stderr, "%s: %s\n", path, rc == 0 ? "ok" : "FAILED");
    return rc == 0 ? 0 : 1;
}
