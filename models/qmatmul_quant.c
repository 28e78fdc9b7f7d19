/* QMatMul's activations, quantised to 8 bits per 32 as ggml's quantize_row_q8_0 does: scale
 * amax / 127 (kept rounded to fp16), codes x * 127 / amax rounded to nearest, ties to even.
 * Three variants (portable, AVX2, AVX-512), the same codes and sums from each. */
#include <math.h>

#include "qmatmul.h"

#ifdef UNIUN_X86
#include <immintrin.h>
#endif

/* One row of K floats -> r: codes, and per block d, the sums and ggml's s. */
static void quantize_row_scalar(const float* x, int K, QuantRow r) {
  for (int b = 0; b < K / QK; b++) {
    const float* xb = x + b * QK;
    float amax = 0.f;
    for (int i = 0; i < QK; i++) {
      float a = fabsf(xb[i]);
      amax = a > amax ? a : amax;
    }
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    int half[2] = {0, 0};
    for (int i = 0; i < QK; i++) {
      int v = (int)nearbyintf(xb[i] * id); /* nearest, ties to even: as cvtps2dq */
      r.q[b * QK + i] = (int8_t)v;
      half[i / 16] += v;
    }
    r.d[b] = qmm_round_to_half(d);
    r.sum16[2 * b] = half[0];
    r.sum16[2 * b + 1] = half[1];
    r.sum[b] = half[0] + half[1];
    r.s[b] = qmm_round_to_half(d * (float)r.sum[b]);
  }
}

#ifdef UNIUN_X86
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void quantize_row_avx512(const float* x, int K, QuantRow r) {
  for (int b = 0; b < K / QK; b++) {
    __m512 v0 = _mm512_loadu_ps(x + b * QK), v1 = _mm512_loadu_ps(x + b * QK + 16);
    __m512 a = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    const float amax = _mm512_reduce_max_ps(a);
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    const __m512 vid = _mm512_set1_ps(id);
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128((__m128i*)(r.q + b * QK), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(r.q + b * QK + 16), _mm512_cvtepi32_epi8(q1));
    r.d[b] = qmm_round_to_half(d);
    r.sum16[2 * b] = _mm512_reduce_add_epi32(q0);
    r.sum16[2 * b + 1] = _mm512_reduce_add_epi32(q1);
    r.sum[b] = r.sum16[2 * b] + r.sum16[2 * b + 1];
    r.s[b] = qmm_round_to_half(d * (float)r.sum[b]);
  }
}

__attribute__((target("avx2,fma,f16c")))
static void quantize_row_avx2(const float* x, int K, QuantRow r) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int b = 0; b < K / QK; b++) {
    __m256 v[4], a = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
      v[i] = _mm256_loadu_ps(x + b * QK + 8 * i);
      a = _mm256_max_ps(a, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    const __m256 vid = _mm256_set1_ps(id);
    int32_t q[QK];
    for (int i = 0; i < 4; i++)
      _mm256_storeu_si256((__m256i*)(q + 8 * i), _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid)));
    int half[2] = {0, 0};
    for (int i = 0; i < QK; i++) {
      r.q[b * QK + i] = (int8_t)q[i];
      half[i / 16] += q[i];
    }
    r.d[b] = qmm_round_to_half(d);
    r.sum16[2 * b] = half[0];
    r.sum16[2 * b + 1] = half[1];
    r.sum[b] = half[0] + half[1];
    r.s[b] = qmm_round_to_half(d * (float)r.sum[b]);
  }
}
#endif

static void quantize_row(int path, const float* x, int k, QuantRow r) {
#ifdef UNIUN_X86
  if (path == ISA_AVX512) {
    quantize_row_avx512(x, k, r);
    return;
  }
  if (path == ISA_AVX2) {
    quantize_row_avx2(x, k, r);
    return;
  }
#endif
  (void)path;
  quantize_row_scalar(x, k, r);
}

void qmm_quantize(int path, const float* x, int m, int k, QuantRow all) {
  const int nb = k / QK;
  for (int i = 0; i < m; i++) {
    QuantRow r = {all.q + (size_t)i * k, all.d + (size_t)i * nb, all.sum + (size_t)i * nb,
                  all.sum16 + (size_t)i * 2 * nb, all.s + (size_t)i * nb,
                  all.lane128 + (size_t)i * (k / 4)};
    quantize_row(path, x + (size_t)i * k, k, r);
    for (int g = 0; g < k / 4; g++)
      r.lane128[g] = -128 * (r.q[4 * g] + r.q[4 * g + 1] + r.q[4 * g + 2] + r.q[4 * g + 3]);
  }
}

/* Per row: k codes and k / 4 lane sums (times -128); per block: a float scale, three int32
 * sums (the block's and its halves') and the Q8_1 s. */
size_t qmm_scratch_bytes(int m, int k) {
  return (size_t)m * k * 2 + (size_t)m * (k / QK) * 20 + 64;
}

QuantRow qmm_scratch_rows(void* buf, int m, int k) {
  const size_t nb = (size_t)m * (k / QK);
  char* p = buf;
  QuantRow r;
  r.d = (float*)p;
  r.sum = (int32_t*)(p + nb * 4);
  r.sum16 = (int32_t*)(p + nb * 8);
  r.s = (float*)(p + nb * 16);
  r.lane128 = (int32_t*)(p + nb * 20);
  r.q = (int8_t*)(p + nb * 20 + (size_t)m * k);
  return r;
}
