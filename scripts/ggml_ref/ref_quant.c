/* Quantizes input.f32 with ggml's own C quantizers, as llama-quantize runs them without an
 * importance matrix, and writes the fixtures described in gen.sh (<type>.bin, <type>.deq.f32,
 * manifest.txt); given a second file (mxfp4_edges.f32), also MXFP4's bytes and dequantized
 * values of those edge blocks (mxfp4_edges.bin, mxfp4_edges.deq.f32). Built and run by
 * scripts/ggml_ref/gen.sh; see there.
 *
 * For each type with a `quantize_<type>` entry point it calls that with quant_weights == NULL,
 * treating the input as `nrow` rows of N_PER_ROW values (what llama-quantize does per tensor).
 * It also checks, and records in the manifest, whether that output equals the type's
 * `quantize_row_<type>_ref` over the whole input, so the fixtures say which algorithm the NULL
 * path takes. Q8_1 and Q8_K are activation types with only a `_ref` quantizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "ggml-quants.h"
#include "ggml-common.h"

/* ggml-quants.c needs these from ggml.c; only the row size is ever used on the paths called. */
void ggml_abort(const char * file, int line, const char * fmt, ...) { (void)fmt; fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
const char * ggml_type_name(enum ggml_type t) { (void)t; return "?"; }

struct qtype {
    const char * name;
    enum ggml_type type;
    int64_t blck;
    size_t bytes;
    size_t (*quantize)(const float *, void *, int64_t, int64_t, const float *); /* NULL: none */
    void (*ref)(const float *, void *, int64_t);                                /* NULL: none */
    /* Dequantized fixtures only for the types the gguf-py fixtures do not cover (the others
     * would add 70 KiB each for a codec already checked bit for bit there). NULL: none. */
    void (*dequant)(const void *, float *, int64_t);
};

#define Q(n, T, B) #n, GGML_TYPE_##T, B, sizeof(block_##n)
static const struct qtype TYPES[] = {
    { Q(q4_0, Q4_0, QK4_0), (void *)quantize_q4_0, (void *)quantize_row_q4_0_ref, NULL },
    { Q(q4_1, Q4_1, QK4_1), (void *)quantize_q4_1, (void *)quantize_row_q4_1_ref, NULL },
    { Q(q5_0, Q5_0, QK5_0), (void *)quantize_q5_0, (void *)quantize_row_q5_0_ref, NULL },
    { Q(q5_1, Q5_1, QK5_1), (void *)quantize_q5_1, (void *)quantize_row_q5_1_ref, NULL },
    { Q(q8_0, Q8_0, QK8_0), (void *)quantize_q8_0, (void *)quantize_row_q8_0_ref, NULL },
    { Q(q8_1, Q8_1, QK8_1), NULL, (void *)quantize_row_q8_1_ref, NULL },
    { Q(q2_K, Q2_K, QK_K), (void *)quantize_q2_K, (void *)quantize_row_q2_K_ref, (void *)dequantize_row_q2_K },
    { Q(q3_K, Q3_K, QK_K), (void *)quantize_q3_K, (void *)quantize_row_q3_K_ref, (void *)dequantize_row_q3_K },
    { Q(q4_K, Q4_K, QK_K), (void *)quantize_q4_K, (void *)quantize_row_q4_K_ref, NULL },
    { Q(q5_K, Q5_K, QK_K), (void *)quantize_q5_K, (void *)quantize_row_q5_K_ref, NULL },
    { Q(q6_K, Q6_K, QK_K), (void *)quantize_q6_K, (void *)quantize_row_q6_K_ref, NULL },
    { Q(q8_K, Q8_K, QK_K), NULL, (void *)quantize_row_q8_K_ref, NULL },
    { Q(iq4_nl, IQ4_NL, QK4_NL), (void *)quantize_iq4_nl, (void *)quantize_row_iq4_nl_ref, (void *)dequantize_row_iq4_nl },
    { Q(iq4_xs, IQ4_XS, QK_K), (void *)quantize_iq4_xs, (void *)quantize_row_iq4_xs_ref, (void *)dequantize_row_iq4_xs },
    { Q(mxfp4, MXFP4, QK_MXFP4), (void *)quantize_mxfp4, (void *)quantize_row_mxfp4_ref, (void *)dequantize_row_mxfp4 },
};
#define NTYPES (sizeof TYPES / sizeof TYPES[0])

/* Values per row handed to quantize_<type>: 5 super-blocks, so a row has several blocks. */
#define N_PER_ROW 1280

static const struct qtype * find(enum ggml_type t) {
    for (size_t i = 0; i < NTYPES; ++i) if (TYPES[i].type == t) return &TYPES[i];
    return NULL;
}
size_t ggml_type_size(enum ggml_type t) { const struct qtype * q = find(t); if (!q) abort(); return q->bytes; }
size_t ggml_row_size(enum ggml_type t, int64_t n) {
    const struct qtype * q = find(t);
    if (!q || n % q->blck) abort();
    return q->bytes * (size_t)(n / q->blck);
}

static void write_file(const char * name, const char * ext, const void * p, size_t len) {
    char path[256];
    snprintf(path, sizeof path, "%s%s", name, ext);
    FILE * fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, len, fp) != len || fclose(fp)) { perror(path); exit(1); }
}

/* The f32 values of a file; their count in *n. */
static float * read_f32(const char * path, int64_t * n) {
    FILE * fp = fopen(path, "rb");
    if (!fp) { perror(path); exit(1); }
    fseek(fp, 0, SEEK_END); long len = ftell(fp); fseek(fp, 0, SEEK_SET);
    float * x = malloc(len);
    if (fread(x, 1, len, fp) != (size_t)len) { perror(path); exit(1); }
    fclose(fp);
    *n = len / 4;
    return x;
}

/* MXFP4's edge blocks (exact powers of two, magnitudes just below them, ties, zero blocks,
 * exponents outside E8M0's range, non-finite values), as one row through quantize_mxfp4. */
static void write_mxfp4_edges(const char * path) {
    int64_t n;
    float * x = read_f32(path, &n);
    if (n % QK_MXFP4) { fprintf(stderr, "%s is not whole MXFP4 blocks\n", path); exit(1); }
    size_t bytes = (size_t)(n / QK_MXFP4) * sizeof(block_mxfp4);
    void * q = calloc(1, bytes);
    float * y = calloc(n, sizeof(float));
    if (quantize_mxfp4(x, q, 1, n, NULL) != bytes) { fprintf(stderr, "mxfp4 edges: size\n"); exit(1); }
    dequantize_row_mxfp4(q, y, n);
    write_file("mxfp4_edges", ".bin", q, bytes);
    write_file("mxfp4_edges", ".deq.f32", y, n * sizeof(float));
    printf("mxfp4   edges: %lld blocks\n", (long long)(n / QK_MXFP4));
    free(x); free(q); free(y);
}

int main(int argc, char ** argv) {
    if (argc != 2 && argc != 3) { fprintf(stderr, "usage: %s input.f32 [mxfp4_edges.f32]\n", argv[0]); return 1; }
    int64_t n;
    float * x = read_f32(argv[1], &n);
    if (n % N_PER_ROW) { fprintf(stderr, "input is not whole rows of %d\n", N_PER_ROW); return 1; }
    int64_t nrow = n / N_PER_ROW;

    FILE * man = fopen("manifest.txt", "w");
    fprintf(man, "# written by scripts/ggml_ref/ref_quant.c (run by gen.sh); one line per type:\n"
                 "# <type> <entry point that made <type>.bin> <rows> <values per row> <NULL path vs _ref> <dequant>\n");
    for (size_t i = 0; i < NTYPES; ++i) {
        const struct qtype * t = &TYPES[i];
        size_t bytes = (size_t)(n / t->blck) * t->bytes;
        void * out = calloc(1, bytes), * ref = calloc(1, bytes);
        t->ref(x, ref, n);
        const char * same = "-";
        if (t->quantize) {
            size_t got = t->quantize(x, out, nrow, N_PER_ROW, NULL);
            if (got != bytes) { fprintf(stderr, "%s: size %zu != %zu\n", t->name, got, bytes); return 1; }
            same = memcmp(out, ref, bytes) ? "differs_from_ref" : "equals_ref";
        } else {
            memcpy(out, ref, bytes);
        }
        write_file(t->name, ".bin", out, bytes);
        if (t->dequant) {
            float * y = calloc(n, sizeof(float));
            t->dequant(out, y, n);
            write_file(t->name, ".deq.f32", y, n * sizeof(float));
            free(y);
        }
        fprintf(man, "%s %s %lld %lld %s %s\n", t->name,
                t->quantize ? "quantize_NULL" : "quantize_row_ref",
                (long long)(t->quantize ? nrow : 1), (long long)(t->quantize ? N_PER_ROW : n),
                same, t->dequant ? "deq" : "-");
        printf("%-7s %s\n", t->name, t->quantize ? same : "(ref only)");
        free(out); free(ref);
    }
    fclose(man);
    free(x);
    if (argc == 3) write_mxfp4_edges(argv[2]);
    return 0;
}
