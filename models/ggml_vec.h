/* The vector pieces ggml_ops.c and ggml_attention.c share: fp16 rounding, ggml's exp and
 * its lane sums in both of its x86 flavours (llama.cpp built for AVX-512: 16 lanes,
 * scalef; built for AVX2 only: 8 lanes, its own exponent assembly), on AVX2 + FMA + F16C. Compiled, like those files, with floating-point
 * contraction off: a fused multiply-add is exactly where ggml has one. x86 only. */
#ifndef UNIUN_GGML_VEC_H
#define UNIUN_GGML_VEC_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

#define VEC __attribute__((target("avx2,fma,f16c")))

/* x rounded to fp16 (to nearest, ties to even: F16C's vcvtps2ph, as ggml converts), n
 * values; in place allowed. */
VEC static inline void round_half(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                            _MM_FROUND_TO_NEAREST_INT)));
  for (; i < n; i++) y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

/* ---- exp: vec.h's ggml_v_expf, AVX-512 flavour ------------------------------------------ */

/* One lane of ggml_v_expf (__m512): polynomial on the reduced argument, then scalef. */
VEC static inline float v_expf(float x) {
  const float r = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  if (fabsf(n) > 192.f) return n <= 0.f ? 0.f : INFINITY;
  const float u = b * b;
  const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                            fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                       u, fmaf(0x1.ffffecp-1f, b, 1.0f));
  return scalbnf(j, (int)n); /* scalef: j * 2^n, rounded once */
}

/* ggml_v_expf over 8 lanes; a lane outside scalef's plain range goes through v_expf. */
VEC static inline __m256 v_expf8(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                      _mm256_set1_ps(0x1.573e2ep-5f)),
                      u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                      _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
  /* 2^n is a normal float for n in [-125, 127], and j * 2^n then rounds as scalef does
   * (j in [0.7, 1.5]: the product stays normal down to n = -125). */
  const __m256 lo = _mm256_set1_ps(-125.f), hi = _mm256_set1_ps(127.f);
  const int inside = _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(n, lo, _CMP_GE_OQ),
                                                      _mm256_cmp_ps(n, hi, _CMP_LE_OQ)));
  if (inside == 0xFF) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(j, _mm256_castsi256_ps(e));
  }
  float xs[8], out[8];
  _mm256_storeu_ps(xs, x);
  for (int i = 0; i < 8; i++) out[i] = v_expf(xs[i]);
  return _mm256_loadu_ps(out);
}

/* _mm512_reduce_add_ps's order (GCC's avx512fintrin.h: halves, quarters, then pairs) over
 * the 16 lanes lo (0-7), hi (8-15): what ggml's 16-lane sums end with. */
VEC static inline float reduce16_avx(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
  return _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)));
}

/* ---- exp: vec.h's ggml_v_expf, AVX2 flavour (a llama.cpp built without AVX-512) -------- */

/* ggml_v_expf (__m256), transcribed: the same polynomial without its first constant term
 * (j excludes the 1, added back as k * j + k), 2^n assembled from z's bits, and two
 * fallbacks: |n| > 126 scales in two steps (s1, s2), |n| > 192 saturates (s1 * s1). */
VEC static inline __m256 v_expf8_avx2(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(
      _mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
  const __m256i c = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(126), _CMP_GT_OQ));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                      _mm256_set1_ps(0x1.573e2ep-5f)),
                      u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                      _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  if (!_mm256_movemask_ps(_mm256_castsi256_ps(c))) return _mm256_fmadd_ps(j, k, k);
  const __m256i g = _mm256_and_si256(
      _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
      _mm256_set1_epi32((int)0x82000000u));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256i d = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(192), _CMP_GT_OQ));
  return _mm256_or_ps(
      _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
      _mm256_andnot_ps(
          _mm256_castsi256_ps(d),
          _mm256_or_ps(
              _mm256_and_ps(_mm256_castsi256_ps(c), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
              _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}

/* The 8-lane sum llama.cpp's AVX2 code ends with (hsum_float_8, tinyBLAS's hsum, the
 * softmax's per-8 sum): halves, then pairs: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */
VEC static inline float hsum8_avx(__m256 x) {
  __m128 t = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* GGML_F32x8_REDUCE's last step (ggml_vec_dot_f16 on AVX): halves, then two hadds:
 * ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)). */
VEC static inline float hadd8_avx(__m256 x) {
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

#pragma GCC pop_options

#endif
