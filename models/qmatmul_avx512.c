/* QMatMul's AVX-512 VNNI kernels: our order (four activation rows per pass over a group's
 * weights, the 16 rows' sums in one register) and llama.cpp's (16 rows at a time). */
#include "qmatmul.h"

#ifdef UNIUN_X86
#include <immintrin.h>

#define MT 4 /* activation rows per pass over a group's weights */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))

AVX512 static inline __m512 load_scales(int f32, const uint8_t* p) {
  return f32 ? _mm512_loadu_ps(p) : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}

/* One format's loop; always inlined with constant (bits, zp, f32, offset), so each format
 * gets its own code with the branches folded away. */
AVX512 static inline __attribute__((always_inline)) void groups_avx512_as(
    const Job* j, int g0, int g1, const int bits, const int zp, const int f32,
    const int offset, const int halves) {
  const int nb = j->k / QK;
  const size_t cb = bits == 4 ? 256 : 512, sb = GROUP * (f32 ? 4 : 2);
  const size_t bb = cb + sb * (offset || halves ? 2 : 1);
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int g = g0; g < g1; g++) {
    const int left = j->n - g * GROUP;
    const __mmask16 mask = left >= GROUP ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    const uint8_t* wg = j->w + (size_t)g * nb * bb;
    for (int m0 = 0; m0 < j->m; m0 += MT) {
      const int mt = j->m - m0 < MT ? j->m - m0 : MT;
      __m512 acc[MT];
      for (int t = 0; t < MT; t++)
        acc[t] = (j->r && t < mt)
                     ? _mm512_maskz_loadu_ps(mask, j->r + (size_t)(m0 + t) * j->n + g * GROUP)
                     : _mm512_setzero_ps();
      for (int b = 0; b < nb; b++) {
        const uint8_t* blk = wg + (size_t)b * bb;
        __m512i w[8];
        if (bits == 8) {
          for (int c = 0; c < 8; c++) w[c] = _mm512_loadu_si512(blk + 64 * c);
        } else {
          for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_loadu_si512(blk + 64 * c);
            w[2 * c] = _mm512_and_si512(v, low);
            w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          }
        }
        const __m512 dw = load_scales(f32, blk + cb);
        /* the offsets, or (halves) the second half's scales */
        const __m512 mw = offset || halves ? load_scales(f32, blk + cb + sb) : _mm512_setzero_ps();
        for (int t = 0; t < mt; t++) {
          const size_t xb = (size_t)(m0 + t) * nb + b;
          int32_t g4[8];
          memcpy(g4, j->xq + (size_t)(m0 + t) * j->k + b * QK, 32); /* 8 groups of 4 */
          /* Chunk c of 4-bit codes holds groups 2c (low nibbles) and 2c + 1 (high); of
           * 8-bit codes, group c. Either way w[i] pairs with activation group i. */
          const __m512 xd = _mm512_set1_ps(j->xd[xb]);
          if (halves) { /* Q6_K: a scale per 16, so a sum per half */
            __m512i lo = _mm512_set1_epi32(-zp * j->xsum16[2 * xb]);
            __m512i hi = _mm512_set1_epi32(-zp * j->xsum16[2 * xb + 1]);
            for (int i = 0; i < 4; i++) {
              lo = _mm512_dpbusd_epi32(lo, w[i], _mm512_set1_epi32(g4[i]));
              hi = _mm512_dpbusd_epi32(hi, w[4 + i], _mm512_set1_epi32(g4[4 + i]));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(dw, xd), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(mw, xd), acc[t]);
            continue;
          }
          __m512i isum = _mm512_setzero_si512();
          for (int i = 0; i < 8; i++)
            isum = _mm512_dpbusd_epi32(isum, w[i], _mm512_set1_epi32(g4[i]));
          if (zp) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(zp * j->xsum[xb]));
          const __m512 scale = _mm512_mul_ps(dw, xd);
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
          if (offset) {
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(qmm_offset_factor(j, xb)), acc[t]);
          }
        }
      }
      for (int t = 0; t < mt; t++)
        _mm512_mask_storeu_ps(j->y + (size_t)(m0 + t) * j->n + g * GROUP, mask, acc[t]);
    }
  }
}

AVX512 void qmm_groups_avx512(const Job* j, int g0, int g1) {
#define PATH_FN groups_avx512_as
  switch (j->fmt) { QMM_FORMATS(AS_CASE) }
#undef PATH_FN
}

/* qmm_groups_ggml_scalar's arithmetic, 16 rows at a time: one vpdpbusd per lane gives the 16
 * rows' integer sums of that lane, so each of the 8 lanes has its own accumulator (two
 * activation rows: 2 x 8, plus 2 offset sums, of the 32 registers). */
AVX512 static inline __attribute__((always_inline)) void ggml_rows_avx512(
    const Job* j, int g, int m0, const int rows, const int bits, const int offset) {
  const int nb = j->k / QK;
  const size_t cb = bits == 4 ? 256 : 512, sb = GROUP * 2;
  const size_t bb = cb + sb * (offset ? 2 : 1);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int left = j->n - g * GROUP;
  const __mmask16 mask = left >= GROUP ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
  const uint8_t* wg = j->w + (size_t)g * nb * bb;
  __m512 acc[2][8], summs[2];
  for (int t = 0; t < rows; t++) {
    summs[t] = _mm512_setzero_ps();
    for (int c = 0; c < 8; c++) acc[t][c] = _mm512_setzero_ps();
  }
  for (int b = 0; b < nb; b++) {
    const uint8_t* blk = wg + (size_t)b * bb;
    const __m512 dw = load_scales(0, blk + cb);
    const __m512 mw = offset ? load_scales(0, blk + cb + sb) : _mm512_setzero_ps();
    __m512 d[2];
    for (int t = 0; t < rows; t++) {
      const size_t xb = (size_t)(m0 + t) * nb + b;
      d[t] = _mm512_mul_ps(dw, _mm512_set1_ps(j->xd[xb]));
      if (offset) summs[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(j->xs[xb]), summs[t]);
    }
    /* lane by lane, so one lane's weights are live at a time (no spills) */
    for (int c = 0; c < 8; c++) {
      __m512i w;
      if (bits == 8) {
        w = _mm512_loadu_si512(blk + 64 * c);
      } else {
        const __m512i v = _mm512_loadu_si512(blk + 64 * (c / 2));
        w = _mm512_and_si512(c % 2 ? _mm512_srli_epi16(v, 4) : v, low);
      }
      for (int t = 0; t < rows; t++) {
        const size_t xb = (size_t)(m0 + t) * nb + b;
        int32_t x4;
        memcpy(&x4, j->xq + (size_t)(m0 + t) * j->k + b * QK + 4 * c, 4);
        /* 8-bit codes are q + 128: the lane starts at -128 * (its four x) */
        const __m512i lane = _mm512_dpbusd_epi32(
            bits == 8 ? _mm512_set1_epi32(j->xlane128[xb * 8 + c]) : _mm512_setzero_si512(), w,
            _mm512_set1_epi32(x4));
        acc[t][c] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(lane), acc[t][c]);
      }
    }
  }
  for (int t = 0; t < rows; t++) {
    const __m512* a = acc[t];
    __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                             _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
    y = _mm512_add_ps(y, summs[t]);
    const size_t at = (size_t)(m0 + t) * j->n + g * GROUP;
    if (j->r) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, j->r + at));
    _mm512_mask_storeu_ps(j->y + at, mask, y);
  }
}

/* Activation rows two at a time (they share each lane's unpacked weights), the constant
 * row count letting every accumulator live in a register. */
AVX512 static inline __attribute__((always_inline)) void groups_ggml_avx512_as(
    const Job* j, int g0, int g1, const int bits, const int offset) {
  for (int g = g0; g < g1; g++) {
    int m0 = 0;
    for (; m0 + 2 <= j->m; m0 += 2) ggml_rows_avx512(j, g, m0, 2, bits, offset);
    if (m0 < j->m) ggml_rows_avx512(j, g, m0, 1, bits, offset);
  }
}

AVX512 void qmm_groups_ggml_avx512(const Job* j, int g0, int g1) {
  if (j->fmt == FMT_Q4_1)
    groups_ggml_avx512_as(j, g0, g1, 4, 1);
  else
    groups_ggml_avx512_as(j, g0, g1, 8, 0);
}
#endif
