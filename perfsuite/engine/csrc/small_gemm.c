/* A projection of a few rows (a decode step's), over a weight packed once into panels of 16 outputs.
 *
 * perfsuite.engine.small_gemm compiles this file once per process with the system's C compiler and calls it
 * through ctypes, for float32 on the CPU. At a decode step's few rows a product is bound by streaming the weight
 * from memory; oneDNN's call through torch also rebuilds its primitive every time, about 15 us, 121 calls a SmolLM2
 * step. Here the weight is packed once into [panels][in][16] (outputs past the last one zero), each panel read
 * once, front to back, while every row's 16 sums stay in registers; the panels are split between OpenMP threads.
 *
 * A row's sums are added over the inputs in order, whatever the other rows: like oneDNN's product, equal to
 * torch's up to float rounding.
 */
#include <stdint.h>
#include <string.h>

#define PANEL 16
#define MAX_ROWS 8

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

/* out [M][n] (panel p's columns) = x [M][k] times the packed weight, plus bias [n] where given. */
#define DEFINE_PANEL(M)                                                                                            \
    static void panel_##M(const float *x, const float *packed, const float *bias, float *out, int64_t n,        \
                          int64_t k, int64_t p) {                                                               \
        panel_t sums[M];                                                                                        \
        for (int m = 0; m < M; m++) sums[m] = (panel_t){0};                                                     \
        const float *w = packed + p * k * PANEL;                                                                \
        for (int64_t i = 0; i < k; i++) {                                                                       \
            panel_t column;                                                                                     \
            memcpy(&column, w + i * PANEL, sizeof column);                                                      \
            for (int m = 0; m < M; m++) sums[m] += x[m * k + i] * column;                                       \
        }                                                                                                       \
        const int64_t first = p * PANEL, width = n - first < PANEL ? n - first : PANEL;                         \
        for (int m = 0; m < M; m++) {                                                                           \
            float row[PANEL];                                                                                   \
            memcpy(row, &sums[m], sizeof row);                                                                  \
            if (bias != NULL)                                                                                   \
                for (int64_t j = 0; j < width; j++) row[j] += bias[first + j];                                  \
            memcpy(out + m * n + first, row, width * sizeof(float));                                            \
        }                                                                                                       \
    }

DEFINE_PANEL(1)
DEFINE_PANEL(2)
DEFINE_PANEL(3)
DEFINE_PANEL(4)
DEFINE_PANEL(5)
DEFINE_PANEL(6)
DEFINE_PANEL(7)
DEFINE_PANEL(8)

typedef void (*panel_f)(const float *, const float *, const float *, float *, int64_t, int64_t, int64_t);
static const panel_f PANELS[MAX_ROWS + 1] = {NULL,    panel_1, panel_2, panel_3, panel_4,
                                            panel_5, panel_6, panel_7, panel_8};

/* out [m][n] = x [m][k] (contiguous) times the weight packed by pack_panels, plus bias [n] or NULL.
 * Returns 1, having written nothing, where m is not in 1..MAX_ROWS; else 0. */
int small_gemm(const float *x, const float *packed, const float *bias, float *out, int64_t m, int64_t n, int64_t k,
               int num_threads) {
    if (m < 1 || m > MAX_ROWS) return 1;
    const panel_f panel = PANELS[m];
    const int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t p = 0; p < panels; p++) panel(x, packed, bias, out, n, k, p);
    return 0;
}
