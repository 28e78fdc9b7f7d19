/* llama.cpp's attention, bit for bit (ggml_ops.c says why and how): mul_mat(K, Q),
 * soft_max_ext, mul_mat(V, P) in llama.cpp's non-flash path, over an fp16 cache.
 *
 * Two orders, as llama.cpp's two x86 builds sum (isa.h's level picks, per call):
 * - AVX-512's (level ISA_AVX512): 16 lanes. ggml_vec_dot_f16 with 4 accumulators over
 *   64-value steps, tinyBLAS with one 16-lane accumulator, _mm512_reduce_add_ps, the
 *   softmax 16 at a time with the AVX-512 exp. Written with 16-wide registers where the
 *   head dim is at most 128, else with 8-wide ones (ggml's 16 lanes as two; same bits).
 * - AVX2's (below): 8 lanes. ggml_vec_dot_f16 with 4 accumulators over 32-value steps
 *   and GGML_F32x8_REDUCE's hadds, tinyBLAS with one 8-lane accumulator and its hsum, the
 *   softmax 8 at a time with the AVX2 exp.
 * llama.cpp pads its cache view to a multiple of 256 keys (llama_kv_cache::get_n_kv), so
 * neither dot product has a scalar tail over the keys; masked keys add exact zeros.
 */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ggml_ops.h"
#include "isa.h"

#ifdef UNIUN_X86
#include "ggml_vec.h"

/* ggml_vec_dot_f16 (one query: the decode path): four accumulators over 64-value steps,
 * then (acc0 + acc2) + (acc1 + acc3), reduce16, and a double-precision tail. */
VEC static float dot_one(const float* x, const float* y, int n) {
  __m256 acc[4][2];
  for (int a = 0; a < 4; a++) acc[a][0] = acc[a][1] = _mm256_setzero_ps();
  const int np = n & ~63;
  for (int i = 0; i < np; i += 64)
    for (int a = 0; a < 4; a++)
      for (int h = 0; h < 2; h++)
        acc[a][h] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16 * a + 8 * h),
                                    _mm256_loadu_ps(y + i + 16 * a + 8 * h), acc[a][h]);
  __m256 r[2];
  for (int h = 0; h < 2; h++)
    r[h] = _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[2][h]), _mm256_add_ps(acc[1][h], acc[3][h]));
  double sum = reduce16_avx(r[0], r[1]);
  for (int i = np; i < n; i++) sum += (double)(x[i] * y[i]);
  return (float)sum;
}

/* tinyBLAS (many queries, n % 16 == 0): one 16-lane accumulator, reduce16. */
VEC static float dot_many(const float* x, const float* y, int n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), hi);
  }
  return reduce16_avx(lo, hi);
}

/* The part of ggml_compute_forward_soft_max_f32 both builds share: the scores scaled,
 * keys from `visible` on (later positions) and those with open[k] == 0 masked (-inf);
 * returns the row's maximum. */
static float scale_and_mask(float* w, int keys, int visible, const int64_t* open, float scale) {
  float max = -INFINITY;
  for (int k = 0; k < keys; k++) {
    w[k] = (k < visible && (!open || open[k])) ? w[k] * scale : -INFINITY;
    max = w[k] > max ? w[k] : max;
  }
  return max;
}

/* ... and its end: each weight times (float)(1 / sum), the sum kept in double. */
static void normalise(float* w, int keys, double sum) {
  const float inv = (float)(1.0 / sum);
  for (int k = 0; k < keys; k++) w[k] *= inv;
}

/* Softmax of one score row over keys [0, keys): ggml_compute_forward_soft_max_f32 with
 * ggml_vec_soft_max_f32 (16 at a time, each 16's sum added in double). Keys from
 * `visible` on (later positions) are masked (-inf), and so are those with open[k] == 0.
 * keys is a multiple of 16. */
VEC static void softmax_row(float* w, int keys, int visible, const int64_t* open,
                            float scale) {
  const float max = scale_and_mask(w, keys, visible, open, scale);
  double sum = 0.0;
  const __m256 vmax = _mm256_set1_ps(max);
  for (int k = 0; k < keys; k += 16) {
    const __m256 lo = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(w + k), vmax));
    const __m256 hi = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(w + k + 8), vmax));
    _mm256_storeu_ps(w + k, lo);
    _mm256_storeu_ps(w + k + 8, hi);
    sum += (double)reduce16_avx(lo, hi);
  }
  normalise(w, keys, sum);
}

/* One query head's attention over the cache; see uniun_ggml_attention. */
typedef struct {
  const float *q, *k, *v;    /* q: [tokens][heads][dim] fp16-exact; k, v: [kv_heads][stride][dim] */
  const int64_t* open;       /* [keys] key mask (1 = may look), or NULL */
  float* out;                /* [tokens][heads][dim] */
  int tokens, heads, kv_heads, dim, keys, stride, past;
  float scale;
} Attn;

/* out[d] = reduce16 over the 16 lanes (lane l: acc[l * dim + d]) for every d, 8 at once;
 * banks 4: each lane first (bank0 + bank2) + (bank1 + bank3), ggml_vec_dot_f16's order. */
VEC static void lanes_to_out(const float* acc, int banks, int dim, float* out) {
  const size_t bank = (size_t)16 * dim;
  for (int d = 0; d < dim; d += 8) {
    __m256 lane[16];
    for (int l = 0; l < 16; l++) {
      const float* s = acc + (size_t)l * dim + d;
      lane[l] = banks == 1 ? _mm256_loadu_ps(s)
                           : _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(s),
                                                         _mm256_loadu_ps(s + 2 * bank)),
                                           _mm256_add_ps(_mm256_loadu_ps(s + bank),
                                                         _mm256_loadu_ps(s + 3 * bank)));
    }
    __m256 t3[8], t6[4];
    for (int i = 0; i < 8; i++) t3[i] = _mm256_add_ps(lane[8 + i], lane[i]);
    for (int i = 0; i < 4; i++) t6[i] = _mm256_add_ps(t3[4 + i], t3[i]);
    _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_add_ps(t6[0], t6[2]),
                                            _mm256_add_ps(t6[1], t6[3])));
  }
}

/* P V on AVX2: for each output value d, a dot product over the keys with V's column d;
 * lane = key mod 16, bank = (key / 16) mod 4 (banks 4: ggml_vec_dot_f16; 1: tinyBLAS).
 * Each lane's accumulator stays in a register over its keys, 8 values of d at once. */
VEC static void weighted_sum(const float* vh, const float* p, int visible, int dim, int banks,
                             float* acc, float* out) {
  for (int bk = 0; bk < banks; bk++) {
    for (int d = 0; d < dim; d += 8) {
      for (int l0 = 0; l0 < 16; l0 += 8) {
        __m256 s[8];
        for (int l = 0; l < 8; l++) s[l] = _mm256_setzero_ps();
        /* keys of this bank and these lanes, in order: k = 16 * (banks * j + bk) + l */
        for (int base = 16 * bk; base < visible; base += 16 * banks)
          for (int l = 0; l < 8; l++) {
            const int k = base + l0 + l;
            if (k < visible)
              s[l] = _mm256_fmadd_ps(_mm256_loadu_ps(vh + (size_t)k * dim + d),
                                     _mm256_set1_ps(p[k]), s[l]);
          }
        float* dst = acc + ((size_t)bk * 16 + l0) * dim + d;
        for (int l = 0; l < 8; l++) _mm256_storeu_ps(dst + (size_t)l * dim, s[l]);
      }
    }
  }
  lanes_to_out(acc, banks, dim, out);
}

/* The same three dot products with 16-wide registers: half the instructions, identical
 * results (the lanes and their order are ggml's either way; _mm512_reduce_add_ps is the
 * reduce16 above). dim is a multiple of 16. */
#define V512 __attribute__((target("avx512f,avx512dq,avx2,fma,f16c")))

V512 static void scores_512(const float* kh, const float* q, int visible, int dim, int many,
                            float* scores) {
  for (int k = 0; k < visible; k++) {
    const float* x = kh + (size_t)k * dim;
    if (many) {
      __m512 acc = _mm512_setzero_ps();
      for (int i = 0; i < dim; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(q + i), acc);
      scores[k] = _mm512_reduce_add_ps(acc);
      continue;
    }
    __m512 acc[4];
    for (int a = 0; a < 4; a++) acc[a] = _mm512_setzero_ps();
    const int np = dim & ~63;
    for (int i = 0; i < np; i += 64)
      for (int a = 0; a < 4; a++)
        acc[a] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * a), _mm512_loadu_ps(q + i + 16 * a),
                                 acc[a]);
    double sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]),
                                                    _mm512_add_ps(acc[1], acc[3])));
    for (int i = np; i < dim; i++) sum += (double)(x[i] * q[i]);
    scores[k] = (float)sum;
  }
}

V512 static void weighted_sum_512(const float* vh, const float* p, int visible, int dim,
                                  int banks, float* acc, float* out) {
  /* one (bank, lane) at a time, its keys in order, all of d in registers (dim <= 128) */
  const int blocks = dim / 16;
  for (int bk = 0; bk < banks; bk++)
    for (int l = 0; l < 16; l++) {
      __m512 s[8];
      for (int i = 0; i < blocks; i++) s[i] = _mm512_setzero_ps();
      for (int k = 16 * bk + l; k < visible; k += 16 * banks) {
        const __m512 pk = _mm512_set1_ps(p[k]);
        const float* vk = vh + (size_t)k * dim;
        for (int i = 0; i < blocks; i++)
          s[i] = _mm512_fmadd_ps(_mm512_loadu_ps(vk + 16 * i), pk, s[i]);
      }
      float* dst = acc + ((size_t)bk * 16 + l) * dim;
      for (int i = 0; i < blocks; i++) _mm512_storeu_ps(dst + 16 * i, s[i]);
    }
  lanes_to_out(acc, banks, dim, out);
}

/* ---- llama.cpp built for AVX2 (no AVX-512): 8 lanes -------------------------------- */

/* ggml_vec_dot_f16 on AVX: four 8-lane accumulators over 32-value steps, then
 * (acc0 + acc2) + (acc1 + acc3), GGML_F32x8_REDUCE's hadds, and a double-precision tail. */
VEC static float dot_one_a2(const float* x, const float* y, int n) {
  __m256 acc[4];
  for (int a = 0; a < 4; a++) acc[a] = _mm256_setzero_ps();
  const int np = n & ~31;
  for (int i = 0; i < np; i += 32)
    for (int a = 0; a < 4; a++)
      acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * a), _mm256_loadu_ps(y + i + 8 * a),
                               acc[a]);
  double sum = hadd8_avx(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]),
                                       _mm256_add_ps(acc[1], acc[3])));
  for (int i = np; i < n; i++) sum += (double)(x[i] * y[i]);
  return (float)sum;
}

/* tinyBLAS<8, __m256> (many queries, n % 8 == 0): one 8-lane accumulator, its hsum. */
VEC static float dot_many_a2(const float* x, const float* y, int n) {
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
  return hsum8_avx(acc);
}

/* softmax_row's AVX2 twin: ggml_vec_soft_max_f32 8 at a time, each 8's sum (hsum8's
 * order) added in double. keys is a multiple of 8. */
VEC static void softmax_row_a2(float* w, int keys, int visible, const int64_t* open,
                               float scale) {
  const float max = scale_and_mask(w, keys, visible, open, scale);
  double sum = 0.0;
  const __m256 vmax = _mm256_set1_ps(max);
  for (int k = 0; k < keys; k += 8) {
    const __m256 e = v_expf8_avx2(_mm256_sub_ps(_mm256_loadu_ps(w + k), vmax));
    _mm256_storeu_ps(w + k, e);
    sum += (double)hsum8_avx(e);
  }
  normalise(w, keys, sum);
}

/* P V in the AVX2 order: for each output value d, a dot product over the keys with V's
 * column d; lane = key mod 8, bank = (key / 8) mod 4 (banks 4: ggml_vec_dot_f16, its
 * lanes then summed with hadds; 1: tinyBLAS, with hsum). 8 values of d at once. */
VEC static void weighted_sum_a2(const float* vh, const float* p, int visible, int dim,
                                int banks, float* acc, float* out) {
  const size_t bank = (size_t)8 * dim;
  for (int bk = 0; bk < banks; bk++)
    for (int d = 0; d < dim; d += 8) {
      __m256 s[8];
      for (int l = 0; l < 8; l++) s[l] = _mm256_setzero_ps();
      for (int base = 8 * bk; base < visible; base += 8 * banks)
        for (int l = 0; l < 8 && base + l < visible; l++) {
          const int k = base + l;
          s[l] = _mm256_fmadd_ps(_mm256_loadu_ps(vh + (size_t)k * dim + d), _mm256_set1_ps(p[k]),
                                 s[l]);
        }
      for (int l = 0; l < 8; l++) _mm256_storeu_ps(acc + bk * bank + (size_t)l * dim + d, s[l]);
    }
  for (int d = 0; d < dim; d += 8) {
    __m256 lane[8];
    for (int l = 0; l < 8; l++) {
      const float* a = acc + (size_t)l * dim + d;
      lane[l] = banks == 1 ? _mm256_loadu_ps(a)
                           : _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(a),
                                                         _mm256_loadu_ps(a + 2 * bank)),
                                           _mm256_add_ps(_mm256_loadu_ps(a + bank),
                                                         _mm256_loadu_ps(a + 3 * bank)));
    }
    __m256 t[4];
    for (int i = 0; i < 4; i++) t[i] = _mm256_add_ps(lane[i], lane[4 + i]);
    const __m256 y = banks == 1
                         ? _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]))
                         : _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]));
    _mm256_storeu_ps(out + d, y);
  }
}

/* wide: AVX-512's order in 16-wide registers; order512: AVX-512's order (else AVX2's) */
VEC static void attention_head(const Attn* a, int h, int t0, int t1, float* scores,
                               float* acc, int wide, int order512) {
  const int kvh = h / (a->heads / a->kv_heads);
  const int many = a->tokens > 1;
  const int dim = a->dim;
  const float* kh = a->k + (size_t)kvh * a->stride * dim;
  const float* vh = a->v + (size_t)kvh * a->stride * dim;
  const int banks = many ? 1 : 4;
  for (int t = t0; t < t1; t++) {
    const float* q = a->q + ((size_t)t * a->heads + h) * dim;
    float* out = a->out + ((size_t)t * a->heads + h) * dim;
    /* keys after the query's position are masked: their scores and weights are not needed
     * (a weight of 0 adds nothing to ggml's sums either) */
    const int visible = a->past + t + 1 < a->keys ? a->past + t + 1 : a->keys;
    const int keys16 = (visible + 15) & ~15;
    if (!order512) {
      for (int k = 0; k < visible; k++)
        scores[k] = many ? dot_many_a2(kh + (size_t)k * dim, q, dim)
                         : dot_one_a2(kh + (size_t)k * dim, q, dim);
      for (int k = visible; k < keys16; k++) scores[k] = 0.f;
      softmax_row_a2(scores, keys16, visible, a->open, a->scale);
      round_half(scores, scores, visible); /* as ggml's P V converts them */
      weighted_sum_a2(vh, scores, visible, dim, banks, acc, out);
      continue;
    }
    if (wide) {
      scores_512(kh, q, visible, dim, many, scores);
    } else
      for (int k = 0; k < visible; k++)
        scores[k] = many ? dot_many(kh + (size_t)k * dim, q, dim)
                         : dot_one(kh + (size_t)k * dim, q, dim);
    for (int k = visible; k < keys16; k++) scores[k] = 0.f;
    softmax_row(scores, keys16, visible, a->open, a->scale);
    round_half(scores, scores, visible); /* as ggml's P V converts them */
    if (wide) {
      weighted_sum_512(vh, scores, visible, dim, banks, acc, out);
      continue;
    }
    weighted_sum(vh, scores, visible, dim, banks, acc, out);
  }
}

EXPORT size_t uniun_ggml_attention_scratch(int keys, int dim) {
  return sizeof(float) * ((size_t)((keys + 15) & ~15) + (size_t)4 * 16 * dim);
}

/* Attention of queries [t0, t1) of `tokens` (positions past .. past + tokens - 1) over
 * `keys` cached keys, heads [h0, h1). q, k and v hold fp16 values (uniun.GgmlAttention
 * rounds them: the cache as llama.cpp stores it, the query as its fp16 matmul converts it).
 * dim is a multiple of 16. */
EXPORT void uniun_ggml_attention(const float* q, const float* k, const float* v,
                                 const int64_t* open, float* out, int tokens, int heads,
                                 int kv_heads, int dim, int keys, int stride, int past,
                                 float scale, int h0, int h1, int t0, int t1, void* scratch) {
  Attn a = {q, k, v, open, out, tokens, heads, kv_heads, dim, keys, stride, past, scale};
  float* scores = scratch;
  float* acc = scores + ((keys + 15) & ~15);
  const int order512 = uniun_isa_level() >= ISA_AVX512;
  const int wide = order512 && dim <= 128; /* registers: <= 8 x 16 */
  for (int h = h0; h < h1; h++) attention_head(&a, h, t0, t1, scores, acc, wide, order512);
}

#else /* not x86: stubs, never called (uniun_ggml_supported() is 0, the operators refuse) */

#pragma GCC diagnostic ignored "-Wunused-parameter"
EXPORT size_t uniun_ggml_attention_scratch(int keys, int dim) { return 0; }
EXPORT void uniun_ggml_attention(const float* q, const float* k, const float* v,
                                 const int64_t* open, float* out, int tokens, int heads,
                                 int kv_heads, int dim, int keys, int stride, int past,
                                 float scale, int h0, int h1, int t0, int t1, void* scratch) {}

#endif
