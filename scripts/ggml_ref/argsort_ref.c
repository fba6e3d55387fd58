// Reference ARGSORT results from the real ggml CPU backend, for rgml-cpu's test of its tie order
// (crates/rgml-cpu/tests/ggml_argsort.rs). Build and run with gen_argsort.sh.
//
// ggml-cpu sorts each row's indices with libstdc++'s std::sort, which is not stable: equal values
// come out in the order its introsort leaves them. The rows here are drawn from a few distinct
// values (many ties) and from all-distinct values, at lengths below, at and above std::sort's
// insertion-sort threshold of 16, in both orders. The order does not depend on the instruction
// set or the thread count (rows are split between threads whole).
//
// argsort.bin: "RGMLAS1\0", u32 n_cases, then per case:
//   u32 n (row length), u32 rows, u32 descending, f32 values[rows][n], i32 indices[rows][n]

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

// `levels` distinct values (0: every value distinct with high probability).
static void fill(float * v, size_t n, uint64_t seed, uint32_t levels) {
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = 0; i < n; i++) {
        const uint32_t r = next_u32();
        v[i] = levels ? (float) (r % levels) * 0.25f - 1.0f : (float) (r >> 8) / (float) (1u << 24) - 0.5f;
    }
}

static int write_case(FILE * f, int n, int rows, int descending, uint32_t levels, uint64_t seed) {
    const size_t count = (size_t) n * rows;
    struct ggml_init_params ip = {.mem_size = count * 8 + (1u << 20), .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context * ctx = ggml_init(ip);
    if (!ctx) {
        return -1;
    }
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
    fill(x->data, count, seed, levels);
    struct ggml_tensor * y = ggml_argsort(ctx, x, descending ? GGML_SORT_ORDER_DESC : GGML_SORT_ORDER_ASC);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    int rc = ggml_graph_compute_with_ctx(ctx, gf, 2) == GGML_STATUS_SUCCESS ? 0 : -1;
    rc |= write_u32(f, (uint32_t) n) | write_u32(f, (uint32_t) rows) | write_u32(f, (uint32_t) descending);
    rc |= write_all(f, x->data, count * 4) | write_all(f, y->data, count * 4);
    ggml_free(ctx);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    // n, rows, levels
    const int cases[][3] = {
        {3, 8, 2},   {8, 16, 3},   {16, 16, 2},  {17, 16, 3},  {31, 8, 4},   {32, 8, 2},
        {60, 8, 5},  {64, 8, 0},   {100, 8, 3},  {128, 16, 7}, {128, 4, 0},  {160, 4, 2},
        {257, 4, 9}, {1000, 2, 5}, {1000, 2, 0}, {4096, 1, 11},
    };
    const int n_cases = (int) (sizeof cases / sizeof cases[0]);
    char path[1024];
    snprintf(path, sizeof path, "%s/argsort.bin", argv[1]);
    FILE * f = fopen(path, "wb");
    if (!f) {
        return 1;
    }
    int rc = write_all(f, "RGMLAS1\0", 8) | write_u32(f, (uint32_t) (2 * n_cases));
    for (int i = 0; i < n_cases; i++) {
        for (int descending = 0; descending < 2; descending++) {
            rc |= write_case(f, cases[i][0], cases[i][1], descending, (uint32_t) cases[i][2], (uint64_t) (1000 + 2 * i + descending));
        }
    }
    rc |= fclose(f);
    return rc ? 1 : 0;
}
