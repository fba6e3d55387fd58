// Reference NEG, SIGMOID, EXP, SOFTPLUS and SWIGLU_OAI results from the real ggml CPU backend,
// for rgml-cpu's bit-for-bit test (crates/rgml-cpu/tests/ggml_activations.rs). Build and run
// with gen_activations.sh.
//
// ggml-cpu computes these element by element with libm's expf/logf (no SIMD path), so any
// build on the same libm gives the same bits. The inputs span the ops' interesting ranges:
// softplus's cut-over at 20, sigmoid's and exp's saturation, SwiGLU-OAI's clamps at +-limit.
//
// activations.bin: "RGMLAC1\0", u32 n_cases, then per case:
//   u32 op (0 NEG, 1 SIGMOID, 2 EXP, 3 SOFTPLUS, 4 SWIGLU_OAI alpha 1.702 limit 7),
//   u32 n, f32 a[n], f32 b[n] (SWIGLU_OAI's up operand; zeros otherwise), f32 out[n]

#include "ggml.h"
#include "ggml-cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t) (rng_state >> 32);
}

static int write_all(FILE * f, const void * p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_u32(FILE * f, uint32_t v) {
    return write_all(f, &v, 4);
}

// Uniform in [-span, span], with exact boundary values sprinkled in.
static void fill(float * v, size_t n, uint64_t seed, float span) {
    static const float special[] = {0.0f, -0.0f, 20.0f, 20.000002f, 19.999998f, 7.0f, -7.0f,
                                    88.0f, -88.0f, 1e-8f, -1e-8f};
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = 0; i < n; i++) {
        const uint32_t r = next_u32();
        v[i] = ((float) (r >> 8) / (float) (1u << 24) * 2.0f - 1.0f) * span;
        if (i % 97 < sizeof special / sizeof special[0]) {
            v[i] = special[i % 97];
        }
    }
}

static int write_case(FILE * f, uint32_t op, int n, uint64_t seed, float span) {
    struct ggml_init_params ip = {.mem_size = (size_t) n * 16 + (1u << 20), .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    struct ggml_tensor * b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    fill(a->data, n, seed, span);
    if (op == 4) {
        fill(b->data, n, seed + 1000, span);
    } else {
        memset(b->data, 0, (size_t) n * 4);
    }
    struct ggml_tensor * y = NULL;
    switch (op) {
        case 0: y = ggml_neg(ctx, a); break;
        case 1: y = ggml_sigmoid(ctx, a); break;
        case 2: y = ggml_exp(ctx, a); break;
        case 3: y = ggml_softplus(ctx, a); break;
        default: y = ggml_swiglu_oai(ctx, a, b, 1.702f, 7.0f); break;
    }
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = ggml_graph_compute_with_ctx(ctx, gf, 2) == GGML_STATUS_SUCCESS ? 0 : -1;
    rc |= write_u32(f, op) | write_u32(f, (uint32_t) n);
    rc |= write_all(f, a->data, (size_t) n * 4) | write_all(f, b->data, (size_t) n * 4);
    rc |= write_all(f, y->data, (size_t) n * 4);
    ggml_free(ctx);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    char path[1024];
    snprintf(path, sizeof path, "%s/activations.bin", argv[1]);
    FILE * f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    const float spans[] = {3.0f, 30.0f};
    int rc = write_all(f, "RGMLAC1\0", 8) | write_u32(f, 10);
    for (uint32_t op = 0; op < 5; op++) {
        for (int s = 0; s < 2; s++) {
            rc |= write_case(f, op, 1031, 17 * op + s, spans[s]);
        }
    }
    rc |= fclose(f);
    if (rc) {
        fprintf(stderr, "failed to write %s\n", path);
        return 1;
    }
    return 0;
}
