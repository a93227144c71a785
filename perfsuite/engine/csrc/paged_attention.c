/* Decode attention over a paged KV pool, reading each row's blocks in place.
 *
 * perfsuite.engine.paged_attention compiles this file once per process with
 * the system's C compiler and calls it through ctypes. One query token per
 * row (a decode step); the pool is one layer's, [num_blocks, block_size,
 * kv_heads, head_dim] contiguous; row r's key l is in block
 * block_tables[r][l / block_size] at offset l % block_size. The torch path it
 * replaces gathers every row's blocks into a new tensor first, then attends
 * (PagedKVCache.keys_of_rows); here nothing is copied.
 *
 * Each row is one task of an OpenMP loop. The library links libgomp.so.1 by
 * its soname, so in a process where torch has loaded its own libgomp it runs
 * on torch's threads, not a second pool.
 *
 * Scores are kept per row ([heads, keys]), softmax'd with the row maximum
 * subtracted, and the values summed with them: the same arithmetic as
 * attention's math kernel, in another order of summation.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef PERFSUITE_LIBMVEC
/* glibc's vector exp (libmvec), so the softmax's exponentials vectorise. */
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
double exp(double);
#endif

enum { OK = 0, BAD_LENGTH = 1, BAD_BLOCK = 2, NO_MEMORY = 3, BAD_OFFSET = 4 };

#define DEFINE_PAGED_DECODE_ATTENTION(T, SUFFIX, EXP, HD)                                                          \
    static int attention_##SUFFIX##_##HD(                                                                       \
        const T *q, int64_t q_row_stride, const T *k_pool, const T *v_pool, const int64_t *block_tables,         \
        const int64_t *lengths, T *out, int64_t rows, int64_t num_heads, int64_t num_kv_heads, int64_t any_hd,   \
        int64_t block_size, int64_t table_width, int64_t num_blocks, T scale, int num_threads) {                 \
        const int64_t head_dim = HD ? HD : any_hd;                                                              \
        const int64_t group = num_heads / num_kv_heads;                                                         \
        const int64_t token_stride = num_kv_heads * head_dim;                                                   \
        const int64_t block_stride = block_size * token_stride;                                                 \
        int status = OK;                                                                                        \
        _Pragma("omp parallel for schedule(static, 1) num_threads(num_threads) reduction(max : status)")        \
        for (int64_t r = 0; r < rows; r++) {                                                                    \
            const int64_t len = lengths[r];                                                                     \
            const int64_t *table = block_tables + r * table_width;                                              \
            if (len < 1 || len > table_width * block_size) {                                                    \
                status = BAD_LENGTH > status ? BAD_LENGTH : status;                                             \
                continue;                                                                                       \
            }                                                                                                   \
            int row_ok = 1;                                                                                     \
            for (int64_t b = 0; b * block_size < len; b++)                                                      \
                if (table[b] < 0 || table[b] >= num_blocks) row_ok = 0;                                         \
            if (!row_ok) {                                                                                      \
                status = BAD_BLOCK > status ? BAD_BLOCK : status;                                               \
                continue;                                                                                       \
            }                                                                                                   \
            T *scores = malloc(sizeof(T) * num_heads * len); /* [heads, keys] */                                \
            if (scores == NULL) {                                                                               \
                status = NO_MEMORY;                                                                             \
                continue;                                                                                       \
            }                                                                                                   \
            const T *q_row = q + r * q_row_stride;                                                              \
            T *out_row = out + r * num_heads * head_dim;                                                        \
            for (int64_t b = 0, first = 0; first < len; b++, first += block_size) { /* no division per key */   \
                const T *key = k_pool + table[b] * block_stride;                                                \
                const int64_t last = first + block_size < len ? first + block_size : len;                       \
                for (int64_t l = first; l < last; l++, key += token_stride) {                                   \
                    for (int64_t h = 0; h < num_heads; h++) {                                                   \
                        const T *qh = q_row + h * head_dim, *kh = key + (h / group) * head_dim;                 \
                        T dot = 0;                                                                              \
                        _Pragma("omp simd reduction(+ : dot)")                                                  \
                        for (int64_t i = 0; i < head_dim; i++) dot += qh[i] * kh[i];                            \
                        scores[h * len + l] = dot * scale;                                                      \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
            for (int64_t h = 0; h < num_heads; h++) {                                                           \
                T *row = scores + h * len, top = row[0], sum = 0;                                               \
                for (int64_t l = 1; l < len; l++) top = row[l] > top ? row[l] : top;                            \
                _Pragma("omp simd reduction(+ : sum)")                                                          \
                for (int64_t l = 0; l < len; l++) {                                                             \
                    row[l] = EXP(row[l] - top);                                                                 \
                    sum += row[l];                                                                              \
                }                                                                                               \
                const T inverse = 1 / sum;                                                                      \
                for (int64_t l = 0; l < len; l++) row[l] *= inverse;                                            \
            }                                                                                                   \
            memset(out_row, 0, sizeof(T) * num_heads * head_dim);                                               \
            for (int64_t b = 0, first = 0; first < len; b++, first += block_size) {                             \
                const T *value = v_pool + table[b] * block_stride;                                              \
                const int64_t last = first + block_size < len ? first + block_size : len;                       \
                for (int64_t l = first; l < last; l++, value += token_stride) {                                 \
                    for (int64_t h = 0; h < num_heads; h++) {                                                   \
                        const T p = scores[h * len + l], *vh = value + (h / group) * head_dim;                  \
                        T *oh = out_row + h * head_dim;                                                         \
                        _Pragma("omp simd")                                                                     \
                        for (int64_t i = 0; i < head_dim; i++) oh[i] += p * vh[i];                              \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
            free(scores);                                                                                       \
        }                                                                                                       \
        return status;                                                                                          \
    }

/* A kernel for each head_dim most models have (64, 128), where the compiler knows the dot products' length and
 * unrolls them whole: on the 2-vCPU AMD EPYC VM a SmolLM2 decode's attention call took 23-27% less time than with
 * the one for any head_dim (HD 0), which the others take; a whole decode step, 1-3% less
 * (bench/paged_attention.py --against-generic). */
typedef int (*kernel_f32)(const float *, int64_t, const float *, const float *, const int64_t *, const int64_t *,
                          float *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, int);
typedef int (*kernel_f64)(const double *, int64_t, const double *, const double *, const int64_t *, const int64_t *,
                          double *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, int);

#ifdef PERFSUITE_GENERIC_HEAD_DIM
#define PICK(SUFFIX, head_dim) attention_##SUFFIX##_0
#else
#define PICK(SUFFIX, head_dim) \
    ((head_dim) == 64 ? attention_##SUFFIX##_64 : (head_dim) == 128 ? attention_##SUFFIX##_128 : attention_##SUFFIX##_0)
#endif

#define DEFINE_DISPATCH(T, SUFFIX, KERNEL)                                                                         \
    int paged_decode_attention_##SUFFIX(                                                                        \
        const T *q, int64_t q_row_stride, const T *k_pool, const T *v_pool, const int64_t *block_tables,         \
        const int64_t *lengths, T *out, int64_t rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, \
        int64_t block_size, int64_t table_width, int64_t num_blocks, T scale, int num_threads) {                 \
        const KERNEL kernel = PICK(SUFFIX, head_dim);                                                           \
        return kernel(q, q_row_stride, k_pool, v_pool, block_tables, lengths, out, rows, num_heads, num_kv_heads, \
                      head_dim, block_size, table_width, num_blocks, scale, num_threads);                      \
    }

DEFINE_PAGED_DECODE_ATTENTION(float, float32, expf, 0)
DEFINE_PAGED_DECODE_ATTENTION(float, float32, expf, 64)
DEFINE_PAGED_DECODE_ATTENTION(float, float32, expf, 128)
DEFINE_PAGED_DECODE_ATTENTION(double, float64, exp, 0)
DEFINE_PAGED_DECODE_ATTENTION(double, float64, exp, 64)
DEFINE_PAGED_DECODE_ATTENTION(double, float64, exp, 128)
DEFINE_DISPATCH(float, float32, kernel_f32)
DEFINE_DISPATCH(double, float64, kernel_f64)

/* A step's new keys and values into one layer's cache, before the layer attends: two copies where torch's indexed
 * stores were two dispatches of about 10 us each, every layer. Token t's KV head h (head_dim elements of
 * element_size bytes, at k + t * k_row_stride + h * head_dim elements, v likewise) goes offsets[t] + h * head_stride
 * elements into k_cache (v_cache), each of cache_size elements. A paged pool [cells, kv_heads, head_dim]: offset
 * cell * kv_heads * head_dim, head_stride head_dim; a slot cache [slots, kv_heads, max_seq_len, head_dim]:
 * (slot * kv_heads * max_seq_len + position) * head_dim, head_stride max_seq_len * head_dim. Every offset is checked
 * first: BAD_OFFSET, with nothing written, where a head would land outside the cache. */
int store_keys_and_values(char *k_cache, char *v_cache, int64_t cache_size, const char *k, const char *v,
                          int64_t k_row_stride, int64_t v_row_stride, const int64_t *offsets, int64_t tokens,
                          int64_t kv_heads, int64_t head_dim, int64_t head_stride, int64_t element_size) {
    const int64_t last_head = (kv_heads - 1) * head_stride + head_dim;
    for (int64_t t = 0; t < tokens; t++)
        if (offsets[t] < 0 || offsets[t] > cache_size - last_head) return BAD_OFFSET;
    const size_t head_bytes = (size_t)(head_dim * element_size);
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < kv_heads; h++) {
            const int64_t to = (offsets[t] + h * head_stride) * element_size;
            memcpy(k_cache + to, k + (t * k_row_stride + h * head_dim) * element_size, head_bytes);
            memcpy(v_cache + to, v + (t * v_row_stride + h * head_dim) * element_size, head_bytes);
        }
    return OK;
}
