/* A projection over a weight packed once into panels of 16 outputs, at a decode step's rows or a prompt's.
 *
 * perfsuite.engine.small_gemm compiles this file once per process with the system's C compiler and calls it
 * through ctypes, for float32 on the CPU. oneDNN's call through torch rebuilds its primitive every time, about
 * 13 us, 121 calls a SmolLM2 step; and at a few rows a product is bound by streaming the weight from memory.
 * Here the weight is packed once into [panels][in][16] (outputs past the last one zero). A block multiplies up to
 * BLOCK_ROWS rows by BLOCK_PANELS panels (48 outputs) with all its 24 vectors of sums in registers, so each weight
 * vector loaded feeds 8 rows and each input broadcast feeds 3 panels. The blocks of a group of panels follow each
 * other down the rows while its weight stays in cache; the groups are split between OpenMP threads.
 *
 * A row's sums are added over the inputs in order, whatever the other rows: like oneDNN's product, equal to
 * torch's up to float rounding.
 */
#include <stdint.h>
#include <string.h>

#define PANEL 16
#define BLOCK_PANELS 3
#define BLOCK_ROWS 8

typedef float panel_t __attribute__((vector_size(PANEL * sizeof(float))));

/* packed [ceil(n / PANEL)][k][PANEL] from weight [n][k]. */
void pack_panels(const float *weight, float *packed, int64_t n, int64_t k) {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = 0; j < PANEL; j++) {
                const int64_t output = p * PANEL + j;
                packed[(p * k + i) * PANEL + j] = output < n ? weight[output * k + i] : 0.0f;
            }
}

/* Writes one row's sums for P panels from output `first` on: the last panel may be cut at n; bias [n] or NULL. */
static void store_row(const panel_t *sums, int P, const float *bias, float *out_row, int64_t n, int64_t first) {
    for (int q = 0; q < P; q++) {
        const int64_t start = first + q * PANEL, width = n - start < PANEL ? n - start : PANEL;
        float row[PANEL];
        memcpy(row, &sums[q], sizeof row);
        if (bias != NULL)
            for (int64_t j = 0; j < width; j++) row[j] += bias[start + j];
        memcpy(out_row + start, row, width * sizeof(float));
    }
}

/* out [M][n] (the P panels' columns from `first`) = x [M][k] times the P panels at w, plus bias where given. */
#define DEFINE_BLOCK(P, M)                                                                                         \
    static void block_##P##_##M(const float *x, const float *w, const float *bias, float *out, int64_t n,        \
                                int64_t k, int64_t first) {                                                     \
        panel_t sums[M][P];                                                                                     \
        for (int m = 0; m < M; m++)                                                                             \
            for (int q = 0; q < P; q++) sums[m][q] = (panel_t){0};                                              \
        for (int64_t i = 0; i < k; i++) {                                                                       \
            panel_t column[P];                                                                                  \
            for (int q = 0; q < P; q++) memcpy(&column[q], w + (q * k + i) * PANEL, sizeof column[q]);          \
            for (int m = 0; m < M; m++) {                                                                       \
                const float input = x[m * k + i];                                                               \
                for (int q = 0; q < P; q++) sums[m][q] += input * column[q];                                    \
            }                                                                                                   \
        }                                                                                                       \
        for (int m = 0; m < M; m++) store_row(sums[m], P, bias, out + m * n, n, first);                         \
    }

#define DEFINE_BLOCKS(P)                                                                                           \
    DEFINE_BLOCK(P, 1)                                                                                             \
    DEFINE_BLOCK(P, 2)                                                                                             \
    DEFINE_BLOCK(P, 3)                                                                                             \
    DEFINE_BLOCK(P, 4)                                                                                             \
    DEFINE_BLOCK(P, 5)                                                                                             \
    DEFINE_BLOCK(P, 6)                                                                                             \
    DEFINE_BLOCK(P, 7)                                                                                             \
    DEFINE_BLOCK(P, 8)

DEFINE_BLOCKS(1)
DEFINE_BLOCKS(2)
DEFINE_BLOCKS(3)

typedef void (*block_f)(const float *, const float *, const float *, float *, int64_t, int64_t, int64_t);
#define ROW_BLOCKS(P) {NULL, block_##P##_1, block_##P##_2, block_##P##_3, block_##P##_4, block_##P##_5, block_##P##_6, \
                       block_##P##_7, block_##P##_8}
static const block_f BLOCKS[BLOCK_PANELS + 1][BLOCK_ROWS + 1] = {{NULL}, ROW_BLOCKS(1), ROW_BLOCKS(2), ROW_BLOCKS(3)};

/* out [m][n] = x [m][k] (contiguous) times the weight packed by pack_panels, plus bias [n] or NULL.
 * Returns 1, having written nothing, where m < 1; else 0. */
int small_gemm(const float *x, const float *packed, const float *bias, float *out, int64_t m, int64_t n, int64_t k,
               int num_threads) {
    if (m < 1) return 1;
    const int64_t panels = (n + PANEL - 1) / PANEL;
    const int64_t groups = (panels + BLOCK_PANELS - 1) / BLOCK_PANELS;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t first_panel = g * BLOCK_PANELS;
        const int width = panels - first_panel < BLOCK_PANELS ? (int)(panels - first_panel) : BLOCK_PANELS;
        const float *w = packed + first_panel * k * PANEL;
        for (int64_t r = 0; r < m; r += BLOCK_ROWS) {
            const int rows = m - r < BLOCK_ROWS ? (int)(m - r) : BLOCK_ROWS;
            BLOCKS[width][rows](x + r * k, w, bias, out + r * n, n, k, first_panel * PANEL);
        }
    }
    return 0;
}
