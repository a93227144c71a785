/* A decoder layer's elementwise work, fused: the RMS norms (with the residual
 * add before them), the rotary embedding and the gated MLP's activation.
 *
 * perfsuite.engine.layer_ops compiles this file once per process with the
 * system's C compiler and calls it through ctypes, for float32 on the CPU.
 * Written with torch's operators, a layer's norms, rotary embedding, residual
 * adds and activation are about twenty calls, each a dispatch, an allocation
 * and a pass over memory; here they are four calls and one pass each.
 *
 * A row's result never depends on the other rows: rows are split between
 * OpenMP threads whole, and a row's sum of squares is accumulated in
 * LANES fixed lanes (element i in lane i % LANES) that are then added in a
 * fixed order, so neither the thread that takes a row nor the row's address
 * (its alignment) changes its bits. The batch-invariant mode relies on it.
 *
 * The arithmetic is Hugging Face's LlamaRMSNorm, rotary embedding and SiLU in
 * float32, in another order of summation (the norm's mean) and with glibc's
 * exp in the SiLU: equal to torch's up to float rounding.
 */
#include <math.h>
#include <stdint.h>

#ifdef PERFSUITE_LIBMVEC
/* glibc's vector exp (libmvec), so the SiLU's exponentials vectorise. */
#pragma omp declare simd notinbranch
float expf(float);
#endif

/* Below this many elements a call stays on the calling thread: waking a team costs more than the pass. */
#define PARALLEL_ELEMENTS (1 << 14)
#define LANES 16

static float sum_of_squares(const float *x, int64_t n) {
    float lanes[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) lanes[j] += x[i + j] * x[i + j];
    for (; i < n; i++) lanes[i % LANES] += x[i] * x[i];
    float sum = 0;
    for (int j = 0; j < LANES; j++) sum += lanes[j];
    return sum;
}

/* out = weight * (x / sqrt(mean(x^2) + eps)), as LlamaRMSNorm in float32. */
static void norm_row(const float *x, const float *weight, float *out, int64_t dim, float eps) {
    const float inverse = 1.0f / sqrtf(sum_of_squares(x, dim) / (float)dim + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; i++) out[i] = weight[i] * (x[i] * inverse);
}

/* out [rows, dim] = the norm of x [rows, dim], both contiguous. */
void rms_norm_f32(const float *x, const float *weight, float *out, int64_t rows, int64_t dim, float eps,
                  int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * dim >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * dim, weight, out + r * dim, dim, eps);
}

/* hidden += delta, in place, then out = the norm of the sum; all [rows, dim] contiguous. */
void add_rms_norm_f32(float *hidden, const float *delta, const float *weight, float *out, int64_t rows, int64_t dim,
                      float eps, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * dim >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        float *h = hidden + r * dim;
        const float *d = delta + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) h[i] = h[i] + d[i];
        norm_row(h, weight, out + r * dim, dim, eps);
    }
}

/* The rotary embedding of x, in place: each row's first `heads` heads of `head_dim` floats (contiguous; rows
 * `row_stride` floats apart) become x * cos + roll(x, head_dim / 2) * signed_sin at the row's position, whose
 * tables are [num_positions, head_dim] with the sine's first half negated (perfsuite.engine.layers.apply_rotary).
 * Returns 1, having changed nothing, where a position is outside the tables; else 0. */
int rotary_f32(float *x, int64_t row_stride, const float *cos_table, const float *signed_sin_table,
               const int64_t *positions, int64_t num_positions, int64_t rows, int64_t heads, int64_t head_dim,
               int num_threads) {
    const int64_t half = head_dim / 2;
    for (int64_t r = 0; r < rows; r++)
        if (positions[r] < 0 || positions[r] >= num_positions) return 1; /* nothing rotated */
#pragma omp parallel for num_threads(num_threads) if (rows * heads * head_dim >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_table + positions[r] * head_dim, *s = signed_sin_table + positions[r] * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + r * row_stride + h * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float first = v[i], second = v[i + half];
                v[i] = first * c[i] + second * s[i];
                v[i + half] = second * c[i + half] + first * s[i + half];
            }
        }
    }
    return 0;
}

/* out [rows, inner] = silu(gate) * up, where each row of gate_up [rows, 2 * inner] (contiguous) is gate then up. */
void silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t inner, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * inner >= PARALLEL_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * inner, *up = gate + inner;
        float *o = out + r * inner;
#pragma omp simd
        for (int64_t i = 0; i < inner; i++) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}
