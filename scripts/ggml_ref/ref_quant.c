/* Quantizes input.f32 with ggml's C reference quantizers (quantize_row_*_ref) and writes
 * <type>.bin for each type. Built and run by scripts/ggml_ref/gen.sh; see there. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "ggml-quants.h"
#include "ggml-common.h"
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void)t; (void)n; abort(); }
const char * ggml_type_name(enum ggml_type t) { (void)t; return "?"; }
size_t ggml_type_size(enum ggml_type t) { (void)t; abort(); }
typedef void (*qfn)(const float *, void *, int64_t);
static void run(const char *name, qfn f, size_t bs, size_t bb, const float *x, size_t n) {
    size_t nb = n / bs;
    void *out = calloc(nb, bb);
    f(x, out, n);
    char path[256]; snprintf(path, sizeof path, "%s.bin", name);
    FILE *fp = fopen(path, "wb"); fwrite(out, bb, nb, fp); fclose(fp);
    free(out);
}
int main(int argc, char **argv) {
    FILE *fp = fopen(argv[1], "rb"); fseek(fp, 0, SEEK_END); long len = ftell(fp); fseek(fp, 0, SEEK_SET);
    float *x = malloc(len); fread(x, 1, len, fp); fclose(fp);
    size_t n = len / 4;
    run("q4_0", (qfn)quantize_row_q4_0_ref, 32, sizeof(block_q4_0), x, n);
    run("q4_1", (qfn)quantize_row_q4_1_ref, 32, sizeof(block_q4_1), x, n);
    run("q5_0", (qfn)quantize_row_q5_0_ref, 32, sizeof(block_q5_0), x, n);
    run("q5_1", (qfn)quantize_row_q5_1_ref, 32, sizeof(block_q5_1), x, n);
    run("q8_0", (qfn)quantize_row_q8_0_ref, 32, sizeof(block_q8_0), x, n);
    run("q8_1", (qfn)quantize_row_q8_1_ref, 32, sizeof(block_q8_1), x, n);
    run("q4_K", (qfn)quantize_row_q4_K_ref, 256, sizeof(block_q4_K), x, n);
    run("q5_K", (qfn)quantize_row_q5_K_ref, 256, sizeof(block_q5_K), x, n);
    run("q6_K", (qfn)quantize_row_q6_K_ref, 256, sizeof(block_q6_K), x, n);
    run("q8_K", (qfn)quantize_row_q8_K_ref, 256, sizeof(block_q8_K), x, n);
    return 0;
}
