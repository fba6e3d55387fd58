// Prints the FNV-1a 64-bit hash of ggml-cpu's GELU table (`ggml_table_gelu_f16`: gelu of
// every f16 value, rounded to f16, as the native build computes it at `ggml_cpu_init`), its 65,536
// entries hashed as little-endian u16. rgml-cpu's `gelu_table_equals_ggml` checks its own table
// against this number.
//
// Build and run against a native llama.cpp build (scripts/llamacpp.sh):
//   bin=$(bash scripts/llamacpp.sh llama | tail -n 1)
//   cc -O2 scripts/ggml_ref/gelu_table.c -o /tmp/gelu_table -ldl && /tmp/gelu_table "$bin/libggml-cpu.so"
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s path/to/libggml-cpu.so\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    void (*init)(void) = (void (*)(void))dlsym(lib, "ggml_cpu_init");
    const uint16_t *table = (const uint16_t *)dlsym(lib, "ggml_table_gelu_f16");
    if (!init || !table) {
        fprintf(stderr, "missing ggml_cpu_init or ggml_table_gelu_f16\n");
        return 1;
    }
    init();
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t v = table[i];
        h = (h ^ (v & 0xff)) * 0x100000001b3ull;
        h = (h ^ (v >> 8)) * 0x100000001b3ull;
    }
    printf("%016llx\n", (unsigned long long)h);
    return 0;
}
