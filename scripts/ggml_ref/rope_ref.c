// Reference ROPE results from the real ggml CPU backend, for rgml-cpu's bit-exactness test
// (crates/rgml-cpu/tests/ggml_rope.rs). Build and run with gen_rope.sh.
//
// Each case runs ggml_rope_ext on a deterministic random f32 tensor [ne0, ne1, ne2] at
// deterministic positions (small, large, past 2^24 and negative), with or without frequency
// factors (deterministic random values in [1, 8), as Llama 3's `rope_freqs.weight`), in normal
// and NeoX mode, with and without YaRN, on 2 threads, and writes one file OUT_DIR/rope.bin:
//   "RGMLRP1\0", u32 ncases, then per case:
//     u32 mode (ggml's: 0 normal, 2 NeoX), u32 ne0, u32 ne1, u32 ne2, u32 n_dims,
//     u32 n_ctx_orig, u32 n_ff (0: no factors),
//     f32 freq_base, f32 freq_scale, f32 ext_factor, f32 attn_factor, f32 beta_fast,
//     f32 beta_slow,
//     f32 x[ne2][ne1][ne0], i32 pos[ne2], f32 ff[n_ff], f32 out[ne2][ne1][ne0]
// Tensors live in a plain ggml context (no backend buffer).

#include "ggml.h"
#include "ggml-cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static void seed(uint64_t s) {
    rng_state = s * 0x9E3779B97F4A7C15ull | 1;
}

static uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float next_uniform(void) {
    return (float) ((next_u64() >> 40) / (double) (1ull << 24));  // [0, 1)
}

struct rope_case {
    int   mode;
    int   ne0, ne1, ne2;
    int   n_dims;
    int   n_ctx_orig;
    int   n_ff;
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
};

static int write_all(FILE * f, const void * p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_u32(FILE * f, uint32_t v) {
    return write_all(f, &v, 4);
}

static int write_f32(FILE * f, float v) {
    return write_all(f, &v, 4);
}

// Runs one case and appends it to f.
static int run_case(FILE * f, const struct rope_case * c, uint64_t case_seed) {
    const size_t n = (size_t) c->ne0 * c->ne1 * c->ne2;
    struct ggml_init_params ip = {
        .mem_size   = sizeof(float) * (3 * n + c->ne2 + c->n_ff) + (4u << 20),
        .mem_buffer = NULL,
        .no_alloc   = false,
    };
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * x   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c->ne0, c->ne1, c->ne2);
    struct ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c->ne2);
    struct ggml_tensor * ff  = c->n_ff > 0 ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c->n_ff) : NULL;

    seed(case_seed);
    float * xd = (float *) x->data;
    for (size_t i = 0; i < n; i++) {
        xd[i] = 4.0f * next_uniform() - 2.0f;
    }
    int32_t * pd = (int32_t *) pos->data;
    for (int i = 0; i < c->ne2; i++) {
        switch (i) {
            case 0: pd[i] = 0; break;
            case 1: pd[i] = 1; break;
            case 2: pd[i] = 100000 + (int32_t) (next_u64() % 1000000); break;   // large
            case 3: pd[i] = (1 << 24) + (int32_t) (next_u64() % (1u << 30)); break;  // past 2^24
            case 4: pd[i] = -1 - (int32_t) (next_u64() % 100000); break;         // negative
            default: pd[i] = (int32_t) (next_u64() % 131072); break;
        }
    }
    if (ff) {
        float * fd = (float *) ff->data;
        for (int i = 0; i < c->n_ff; i++) {
            fd[i] = 1.0f + 7.0f * next_uniform();
        }
    }

    struct ggml_tensor * y = ggml_rope_ext(ctx, x, pos, ff, c->n_dims, c->mode, c->n_ctx_orig, c->freq_base,
                                           c->freq_scale, c->ext_factor, c->attn_factor, c->beta_fast, c->beta_slow);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = ggml_graph_compute_with_ctx(ctx, gf, 2) == GGML_STATUS_SUCCESS ? 0 : -1;
    if (rc == 0) {
        rc |= write_u32(f, (uint32_t) c->mode) | write_u32(f, (uint32_t) c->ne0) | write_u32(f, (uint32_t) c->ne1) |
              write_u32(f, (uint32_t) c->ne2) | write_u32(f, (uint32_t) c->n_dims) |
              write_u32(f, (uint32_t) c->n_ctx_orig) | write_u32(f, (uint32_t) c->n_ff);
        rc |= write_f32(f, c->freq_base) | write_f32(f, c->freq_scale) | write_f32(f, c->ext_factor) |
              write_f32(f, c->attn_factor) | write_f32(f, c->beta_fast) | write_f32(f, c->beta_slow);
        rc |= write_all(f, x->data, sizeof(float) * n) | write_all(f, pos->data, sizeof(int32_t) * c->ne2);
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
    // mode is filled in below (both layouts for every row).
    const struct rope_case base[] = {
        // Llama 3 8B and 3.2 1B: θ base 500000, a factor per pair.
        {0, 128, 2, 7, 128, 0, 64, 500000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        {0, 64, 2, 7, 64, 0, 32, 500000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        // Part of each row rotates; more factors than pairs (ggml reads the first n_dims/2).
        {0, 80, 2, 7, 64, 0, 35, 10000.0f, 0.5f, 0.0f, 1.0f, 32.0f, 1.0f},
        // YaRN with factors.
        {0, 64, 2, 7, 64, 4096, 32, 10000.0f, 0.25f, 1.0f, 1.0f, 32.0f, 1.0f},
        {0, 96, 2, 7, 96, 8192, 48, 500000.0f, 1.0f, 0.5f, 0.8f, 32.0f, 1.0f},
        // Odd sizes, and odd pair counts (how many pairs GCC's vectorized loop leaves over
        // depends on them in normal mode).
        {0, 18, 3, 7, 14, 512, 9, 10000.0f, 1.0f, 1.0f, 1.0f, 32.0f, 1.0f},
        {0, 10, 3, 7, 10, 0, 5, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        {0, 6, 3, 7, 2, 0, 1, 100.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        // No factors: plain and YaRN.
        {0, 64, 2, 7, 64, 0, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f},
        {0, 64, 2, 7, 64, 4096, 0, 10000.0f, 0.25f, 1.0f, 1.1f, 32.0f, 1.0f},
    };
    const int nbase = (int) (sizeof(base) / sizeof(base[0]));
    const int modes[] = {GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX};

    char path[1024];
    snprintf(path, sizeof path, "%s/rope.bin", argv[1]);
    FILE * f = fopen(path, "wb");
    if (!f) {
        return 1;
    }
    int rc = write_all(f, "RGMLRP1", 8) | write_u32(f, (uint32_t) (2 * nbase));
    for (int m = 0; m < 2 && rc == 0; m++) {
        for (int i = 0; i < nbase && rc == 0; i++) {
            struct rope_case c = base[i];
            c.mode = modes[m];
            rc |= run_case(f, &c, 100 + (uint64_t) (m * nbase + i));
        }
    }
    rc |= fclose(f);
    fprintf(stderr, "%s: %s\n", path, rc == 0 ? "ok" : "FAILED");
    return rc == 0 ? 0 : 1;
}
