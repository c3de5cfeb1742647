// Writes the test vectors of compute-core's `quant` module with ggml's own
// reference quantizers (quantize_row_*_ref, dequantize_row_*), linked from
// ggml's src/ggml-quants.c. See README.md in this folder for the build line.
//
//   make_vectors vectors OUTDIR   inputs.f32, cases.txt, <fmt>.blocks, <fmt>.deq.f32
//   make_vectors digests          FNV-1a digests over a large generated set (stdout)
//   make_vectors bench            single-thread quantize throughput of ggml's reference code
//
// Every output buffer is zero-filled before ggml writes it: quantize_row_q8_K_ref
// leaves the block sums of an all-zero block unwritten, so they read as 0 here.

#include "ggml-quants.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ggml-quants.c refers to these ggml.c functions from code this driver never
// calls (the importance-matrix quantizers, row validation); they abort if reached.
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort called from %s:%d (%s)\n", file, line, fmt);
    abort();
}
size_t ggml_type_size(enum ggml_type type) { (void) type; abort(); }
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void) type; (void) ne; abort(); }
const char * ggml_type_name(enum ggml_type type) { (void) type; abort(); }

#define ROW 512 // values per row of the committed vectors (two 256-value super-blocks)

// ---------------------------------------------------------------- formats

typedef void (*quantize_fn)(const float * x, void * y, int64_t k);
typedef void (*dequantize_fn)(const void * x, float * y, int64_t k);

struct format {
    const char * name;
    int values;  // per block
    int bytes;   // per block
    quantize_fn quantize;
    dequantize_fn dequantize;
};

static const struct format FORMATS[] = {
    { "q4_K", 256, sizeof(block_q4_K), (quantize_fn) quantize_row_q4_K_ref, (dequantize_fn) dequantize_row_q4_K },
    { "q5_K", 256, sizeof(block_q5_K), (quantize_fn) quantize_row_q5_K_ref, (dequantize_fn) dequantize_row_q5_K },
    { "q6_K", 256, sizeof(block_q6_K), (quantize_fn) quantize_row_q6_K_ref, (dequantize_fn) dequantize_row_q6_K },
    { "q8_0",  32, sizeof(block_q8_0), (quantize_fn) quantize_row_q8_0_ref, (dequantize_fn) dequantize_row_q8_0 },
    { "q8_K", 256, sizeof(block_q8_K), (quantize_fn) quantize_row_q8_K_ref, (dequantize_fn) dequantize_row_q8_K },
};
#define NFORMATS (sizeof(FORMATS) / sizeof(FORMATS[0]))

// ---------------------------------------------------------------- generators

static uint64_t sm_state;

static uint64_t sm_next(void) { // SplitMix64, as compute_core::rng::Rng
    sm_state += 0x9E3779B97F4A7C15ull;
    uint64_t z = sm_state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) on a 2^-24 grid: exact in f32.
static float unit24(void) { return (float) (sm_next() >> 40) * 0x1p-24f; }

// Roughly normal (sum of four uniforms, centred): only f32 adds, so a Rust
// port gives the same bits. The draws are sequenced statements: C leaves the
// order of operands within one expression unspecified.
static float approx_normal(void) {
    const float a = unit24();
    const float b = unit24();
    const float c = unit24();
    const float d = unit24();
    return ((a + b) + (c + d)) - 2.0f;
}

// A true normal draw for the committed vectors (these are stored, not regenerated).
static float gauss(void) {
    double u1 = ((double) (sm_next() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double) (sm_next() >> 11) / 9007199254740992.0;
    return (float) (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// ---------------------------------------------------------------- helpers

static void * xcalloc(size_t n) {
    void * p = calloc(n ? n : 1, 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}

static void write_file(const char * dir, const char * name, const void * data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
}

static uint64_t fnv1a(uint64_t h, const void * data, size_t n) {
    const unsigned char * p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001B3ull; }
    return h;
}
#define FNV_OFFSET 0xCBF29CE484222325ull

// ---------------------------------------------------------------- committed vectors

struct case_rows { const char * name; int rows; };

static int vectors(const char * outdir) {
    static const struct case_rows CASES[] = {
        { "normal", 2 }, { "normal_1e-3", 1 }, { "normal_1e3", 1 }, { "positive", 1 }, { "negative", 1 },
        { "constant", 1 }, { "zero", 1 }, { "outlier", 1 }, { "ties_q8", 1 }, { "ties_grid", 1 },
        { "tiny_1e-6", 1 }, { "mixed_scales", 1 },
    };
    const int ncases = sizeof(CASES) / sizeof(CASES[0]);
    int nrows = 0;
    for (int c = 0; c < ncases; c++) nrows += CASES[c].rows;
    const size_t n = (size_t) nrows * ROW;
    float * x = xcalloc(n * sizeof(float));

    sm_state = 20240531;
    float * p = x;
    for (int c = 0; c < ncases; c++) {
        const char * name = CASES[c].name;
        for (int r = 0; r < CASES[c].rows; r++, p += ROW) {
            for (int i = 0; i < ROW; i++) {
                float v;
                if (!strcmp(name, "normal")) v = gauss();
                else if (!strcmp(name, "normal_1e-3")) v = gauss() * 1e-3f;
                else if (!strcmp(name, "normal_1e3")) v = gauss() * 1e3f;
                else if (!strcmp(name, "positive")) v = 2.0f - 2.0f * unit24();       // (0, 2]
                else if (!strcmp(name, "negative")) v = -2.0f + 2.0f * unit24() - 0x1p-24f; // [-2, 0)
                else if (!strcmp(name, "constant")) v = i < 256 ? 0.7f : -3.25f;
                else if (!strcmp(name, "zero")) v = 0.0f;
                else if (!strcmp(name, "outlier")) v = i == 17 ? 80.0f : i == 300 ? -120.0f : gauss();
                else if (!strcmp(name, "ties_q8")) {
                    // Each 32-group opens with +-127, so q8_0's d is exactly 1 and q8_K's
                    // scale is exactly +-1: every other value k + 0.5 is a rounding tie.
                    int g = i / 32, k = i % 32;
                    v = k == 0 ? (g % 2 ? -127.0f : 127.0f) : (float) ((k * 7 + g * 3) % 120 - 60) + 0.5f;
                } else if (!strcmp(name, "ties_grid")) {
                    v = i < 256 ? (float) (i % 16) : (float) (i % 32 - 16) * 0.5f;
                } else if (!strcmp(name, "tiny_1e-6")) v = gauss() * 1e-6f; // f16 d/dmin subnormal or zero
                else { // mixed_scales: 16-value groups alternate 1e-3 and 1, so some sub-block scales round to 0
                    v = gauss() * ((i / 16) % 2 ? 1.0f : 1e-3f);
                }
                p[i] = v;
            }
        }
    }
    write_file(outdir, "inputs.f32", x, n * sizeof(float));

    char text[4096];
    int len = snprintf(text, sizeof text, "# row_len %d; name rows (in file order)\n", ROW);
    for (int c = 0; c < ncases; c++) len += snprintf(text + len, sizeof text - len, "%s %d\n", CASES[c].name, CASES[c].rows);
    write_file(outdir, "cases.txt", text, (size_t) len);

    for (size_t f = 0; f < NFORMATS; f++) {
        const struct format * fmt = &FORMATS[f];
        size_t nblocks = n / fmt->values;
        unsigned char * blocks = xcalloc(nblocks * fmt->bytes);
        float * deq = xcalloc(n * sizeof(float));
        for (int r = 0; r < nrows; r++) { // row by row, as a model file is written
            fmt->quantize(x + (size_t) r * ROW, blocks + (size_t) r * (ROW / fmt->values) * fmt->bytes, ROW);
        }
        fmt->dequantize(blocks, deq, (int64_t) n);
        char name[64];
        snprintf(name, sizeof name, "%s.blocks", fmt->name);
        write_file(outdir, name, blocks, nblocks * fmt->bytes);
        snprintf(name, sizeof name, "%s.deq.f32", fmt->name);
        write_file(outdir, name, deq, n * sizeof(float));
        free(blocks);
        free(deq);
    }
    free(x);
    return 0;
}

// ---------------------------------------------------------------- digests over a generated set

#define DIGEST_ROWS 2048

// Row r of the generated set; the Rust test builds the same rows.
static void digest_row(int r, float * row) {
    static const float SCALES[9] = { 1e-4f, 1e-3f, 1e-2f, 0.1f, 1.0f, 10.0f, 100.0f, 1e3f, 1e4f };
    const float scale = SCALES[(r / 8) % 9];
    const int kind = r % 8;
    for (int i = 0; i < ROW; i++) {
        float v;
        switch (kind) {
            case 3: v = fabsf(approx_normal()) * scale; break;
            case 4: v = -fabsf(approx_normal()) * scale; break;
            case 5: v = approx_normal() * scale + 3.0f * scale; break;
            case 6: v = approx_normal() * scale; if (i % 97 == 5) v = v * 50.0f; break;
            case 7: v = (float) ((int) (sm_next() >> 59) - 16) * 0.5f * scale; break;
            default: v = approx_normal() * scale; break;
        }
        row[i] = v;
    }
}

static int digests(void) {
    const size_t n = (size_t) DIGEST_ROWS * ROW;
    float * x = xcalloc(n * sizeof(float));
    sm_state = 0x5EED0F66A1ull;
    for (int r = 0; r < DIGEST_ROWS; r++) digest_row(r, x + (size_t) r * ROW);
    printf("# FNV-1a 64 over %d generated rows of %d values; inputs %016llx\n", DIGEST_ROWS, ROW,
           (unsigned long long) fnv1a(FNV_OFFSET, x, n * sizeof(float)));
    for (size_t f = 0; f < NFORMATS; f++) {
        const struct format * fmt = &FORMATS[f];
        size_t nblocks = n / fmt->values;
        unsigned char * blocks = xcalloc(nblocks * fmt->bytes);
        float * deq = xcalloc(n * sizeof(float));
        for (int r = 0; r < DIGEST_ROWS; r++) {
            fmt->quantize(x + (size_t) r * ROW, blocks + (size_t) r * (ROW / fmt->values) * fmt->bytes, ROW);
        }
        fmt->dequantize(blocks, deq, (int64_t) n);
        printf("%s %016llx %016llx\n", fmt->name, (unsigned long long) fnv1a(FNV_OFFSET, blocks, nblocks * fmt->bytes),
               (unsigned long long) fnv1a(FNV_OFFSET, deq, n * sizeof(float)));
        free(blocks);
        free(deq);
    }
    free(x);
    return 0;
}

// ---------------------------------------------------------------- timing

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

static int bench(void) {
    const size_t n = (size_t) 1 << 20; // 4 MiB of f32
    float * x = xcalloc(n * sizeof(float));
    sm_state = 7;
    for (size_t i = 0; i < n; i++) x[i] = approx_normal();
    for (size_t f = 0; f < NFORMATS; f++) {
        const struct format * fmt = &FORMATS[f];
        void * blocks = xcalloc(n / fmt->values * fmt->bytes);
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now_s();
            fmt->quantize(x, blocks, (int64_t) n);
            double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("%s quantize: %.1f MB/s of f32 input (best of 5, %zu values)\n", fmt->name,
               (double) (n * sizeof(float)) / best / 1e6, n);
        free(blocks);
    }
    free(x);
    return 0;
}

int main(int argc, char ** argv) {
    if (argc == 3 && !strcmp(argv[1], "vectors")) return vectors(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "digests")) return digests();
    if (argc == 2 && !strcmp(argv[1], "bench")) return bench();
    fprintf(stderr, "usage: %s vectors OUTDIR | digests | bench\n", argv[0]);
    return 2;
}
