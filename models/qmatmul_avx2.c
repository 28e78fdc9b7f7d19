/* QMatMul's AVX2 kernels, for CPUs without AVX-512 VNNI: our order, and llama.cpp's
 * (Job.ggml: q4_1 and q8_0, the order of qmm_groups_ggml_scalar). */
#include "qmatmul.h"

#ifdef UNIUN_X86
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline __m256 load8_scales(int f32, const uint8_t* p) {
  return f32 ? _mm256_loadu_ps((const float*)p)
             : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}

/* The AVX2 path, for CPUs without AVX-512 VNNI: the same layout, each 64-byte chunk as
 * two 8-row halves. No vpdpbusd: vpmaddubsw (u8 x s8 pairs to int16) then vpmaddwd
 * (pairs to int32). 4-bit codes: a pair is at most 15 * 127 * 2, so a block's eight
 * products add up in int16 before the widening. 8-bit codes: the code minus 128 as a
 * signed byte, multiplied as |w| x sign(x, w) (at most 128 * 127 * 2 per pair), which
 * also applies the zero point. One activation row at a time: 16 ymm registers do not
 * hold a block's expanded weights for several. */
AVX2 static inline __attribute__((always_inline)) void groups_avx2_as(
    const Job* j, int g0, int g1, const int bits, const int zp, const int f32,
    const int offset, const int halves) {
  const int nb = j->k / QK;
  const size_t cb = bits == 4 ? 256 : 512, sb = GROUP * (f32 ? 4 : 2), hb = sb / 2;
  const size_t bb = cb + sb * (offset || halves ? 2 : 1);
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  for (int g = g0; g < g1; g++) {
    const int left = j->n - g * GROUP < GROUP ? j->n - g * GROUP : GROUP;
    const uint8_t* wg = j->w + (size_t)g * nb * bb;
    for (int mi = 0; mi < j->m; mi++) {
      float out[GROUP] = {0};
      if (j->r) memcpy(out, j->r + (size_t)mi * j->n + g * GROUP, (size_t)left * 4);
      __m256 acc0 = _mm256_loadu_ps(out), acc1 = _mm256_loadu_ps(out + 8);
      for (int b = 0; b < nb; b++) {
        const uint8_t* blk = wg + (size_t)b * bb;
        const size_t xb = (size_t)mi * nb + b;
        int32_t g4[8];
        memcpy(g4, j->xq + (size_t)mi * j->k + b * QK, 32);
        __m256i s[2][2]; /* [half of the block][rows 0-7, 8-15] */
        if (bits == 4) {
          __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
          for (int c = 0; c < 4; c++) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i*)(blk + 64 * c));
            const __m256i v1 = _mm256_loadu_si256((const __m256i*)(blk + 64 * c + 32));
            const __m256i xa = _mm256_set1_epi32(g4[2 * c]), xh = _mm256_set1_epi32(g4[2 * c + 1]);
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(_mm256_and_si256(v0, low), xa));
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(
                _mm256_and_si256(_mm256_srli_epi16(v0, 4), low), xh));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(_mm256_and_si256(v1, low), xa));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(
                _mm256_and_si256(_mm256_srli_epi16(v1, 4), low), xh));
          }
          const __m256i z = _mm256_set1_epi32(zp * j->xsum[xb]);
          s[0][0] = _mm256_sub_epi32(_mm256_madd_epi16(p0, ones), z);
          s[0][1] = _mm256_sub_epi32(_mm256_madd_epi16(p1, ones), z);
        } else {
          s[0][0] = s[0][1] = s[1][0] = s[1][1] = _mm256_setzero_si256();
          for (int c = 0; c < 8; c++) {
            const int h = halves && c >= 4;
            const __m256i xa = _mm256_set1_epi32(g4[c]);
            for (int r = 0; r < 2; r++) {
              const __m256i w = _mm256_xor_si256(
                  _mm256_loadu_si256((const __m256i*)(blk + 64 * c + 32 * r)), flip);
              const __m256i pr = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xa, w));
              s[h][r] = _mm256_add_epi32(s[h][r], _mm256_madd_epi16(pr, ones));
            }
          }
        }
        const __m256 xd = _mm256_set1_ps(j->xd[xb]);
        for (int h = 0; h < (halves ? 2 : 1); h++) {
          const uint8_t* sc = blk + cb + h * sb;
          acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h][0]),
                                 _mm256_mul_ps(load8_scales(f32, sc), xd), acc0);
          acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h][1]),
                                 _mm256_mul_ps(load8_scales(f32, sc + hb), xd), acc1);
        }
        if (offset) {
          const __m256 xo = _mm256_set1_ps(qmm_offset_factor(j, xb));
          acc0 = _mm256_fmadd_ps(load8_scales(f32, blk + cb + sb), xo, acc0);
          acc1 = _mm256_fmadd_ps(load8_scales(f32, blk + cb + sb + hb), xo, acc1);
        }
      }
      _mm256_storeu_ps(out, acc0);
      _mm256_storeu_ps(out + 8, acc1);
      memcpy(j->y + (size_t)mi * j->n + g * GROUP, out, (size_t)left * 4);
    }
  }
}

AVX2 void qmm_groups_avx2(const Job* j, int g0, int g1) {
#define PATH_FN groups_avx2_as
  switch (j->fmt) { QMM_FORMATS(AS_CASE) }
#undef PATH_FN
}
/* ---- llama.cpp's order (Job.ggml) ------------------------------------------------------ */

/* qmm_groups_ggml_scalar's arithmetic for one group, `rows` activation rows (1 to 4) per
 * pass over its weights: ggml's vec_dot_q4_1_q8_1 / vec_dot_q8_0_q8_0 keep 8 lane
 * accumulators per output, which for 16 outputs and several activation rows would not fit
 * in 16 ymm registers; so the loop turns inside out, with each row's order unchanged: for
 * each 8-output half and a few lanes c (elements 4c .. 4c + 3 of every block), one
 * register per activation row and lane runs over the blocks, its fused multiply-adds in
 * block order, exactly ggml's per lane. The 8 lanes are then added in hsum_float_8's
 * order and Q4_1's m * s terms, accumulated apart in block order, added last. The
 * weights a lane reads are loaded once for all the rows of the pass, and a row's result
 * never depends on which rows share its pass (tests/models/test_qmatmul.py). Lane integer
 * sums: vpmaddubsw then vpmaddwd, exact (4-bit codes: 15 * 127 * 2 per pair; 8-bit:
 * |w| * 127 * 2, the sign moved onto x). Per output it does 8 times the float work of
 * our order (a conversion and a fused multiply-add per lane and block, as ggml does). */
AVX2 static inline __attribute__((always_inline)) void ggml_rows_avx2(
    const Job* j, int g, int m0, const int rows, const int bits, const int offset,
    const uint8_t* next) {
  /* lanes per pass: enough independent fused multiply-add chains to hide their latency
   * (a lane's chain runs through every block), at most 8 accumulators */
  const int L = rows <= 2 ? 4 : 2;
  const int nb = j->k / QK;
  const size_t cb = bits == 4 ? 256 : 512, sb = GROUP * 2;
  const size_t bb = cb + sb * (offset ? 2 : 1);
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  const int left = j->n - g * GROUP < GROUP ? j->n - g * GROUP : GROUP;
  const uint8_t* wg = j->w + (size_t)g * nb * bb;
  /* A lane's pass reads 32 or 64 bytes of each block: over a whole group's blocks that
   * stride leaves the hardware prefetcher behind, so the blocks go in runs of CHUNK
   * (about 2-4 KB, in L1 after the run's first pass), the accumulators parked in L1
   * between runs; the next run's bytes are asked for while this one's are used. */
  enum { CHUNK = 6 };
  __m256 park[4][2][8]; /* [row][half][lane] */
  for (int t = 0; t < rows; t++)
    for (int h = 0; h < 2; h++)
      for (int c = 0; c < 8; c++) park[t][h][c] = _mm256_setzero_ps();
  for (int b0 = 0; b0 < nb; b0 += CHUNK) {
    const int b1 = b0 + CHUNK < nb ? b0 + CHUNK : nb;
    const uint8_t* ahead = b1 < nb ? wg + (size_t)b1 * bb : next;
    const size_t ahead_bytes = b1 < nb ? (size_t)((b1 + CHUNK < nb ? b1 + CHUNK : nb) - b1) * bb
                                       : (next ? (size_t)(CHUNK < nb ? CHUNK : nb) * bb : 0);
    for (size_t at = 0; at < ahead_bytes; at += 64)
      _mm_prefetch((const char*)ahead + at, _MM_HINT_T0);
    for (int h = 0; h < 2 && 8 * h < left; h++)
      for (int c0 = 0; c0 < 8; c0 += L) {
        __m256 acc[4][4];
        for (int t = 0; t < rows; t++)
          for (int l = 0; l < L; l++) acc[t][l] = park[t][h][c0 + l];
        for (int b = b0; b < b1; b++) {
          const uint8_t* blk = wg + (size_t)b * bb;
          const __m256 dw =
              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(blk + cb + 16 * h)));
          __m256 d[4];
          for (int t = 0; t < rows; t++)
            d[t] = _mm256_mul_ps(dw, _mm256_set1_ps(j->xd[(size_t)(m0 + t) * nb + b]));
          for (int l = 0; l < L; l++) {
            const int c = c0 + l;
            __m256i w = _mm256_loadu_si256(
                (const __m256i*)(blk + 64 * (size_t)(bits == 8 ? c : c / 2) + 32 * (size_t)h));
            __m256i aw = w;
            if (bits == 4) {
              w = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(w, 4) : w, low);
            } else {
              w = _mm256_xor_si256(w, flip); /* the signed code */
              aw = _mm256_abs_epi8(w);
            }
            for (int t = 0; t < rows; t++) {
              int32_t x4;
              memcpy(&x4, j->xq + (size_t)(m0 + t) * j->k + b * QK + 4 * c, 4);
              const __m256i xv = _mm256_set1_epi32(x4);
              const __m256i pairs = bits == 4
                                        ? _mm256_maddubs_epi16(w, xv)
                                        : _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w));
              const __m256 lane = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
              acc[t][l] = _mm256_fmadd_ps(d[t], lane, acc[t][l]);
            }
          }
        }
        for (int t = 0; t < rows; t++)
          for (int l = 0; l < L; l++) park[t][h][c0 + l] = acc[t][l];
      }
  }
  for (int h = 0; h < 2 && 8 * h < left; h++) {
    for (int t = 0; t < rows; t++) {
      const __m256* a = park[t][h];
      __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                               _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
      if (offset) {
        __m256 summs = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
          const __m256 mw = _mm256_cvtph_ps(
              _mm_loadu_si128((const __m128i*)(wg + (size_t)b * bb + cb + sb + 16 * h)));
          summs = _mm256_fmadd_ps(mw, _mm256_set1_ps(j->xs[(size_t)(m0 + t) * nb + b]), summs);
        }
        y = _mm256_add_ps(y, summs);
      }
      const int cols = left - 8 * h < 8 ? left - 8 * h : 8;
      const size_t out = (size_t)(m0 + t) * j->n + g * GROUP + 8 * h;
      float v[8] = {0};
      if (j->r) {
        memcpy(v, j->r + out, (size_t)cols * 4);
        y = _mm256_add_ps(y, _mm256_loadu_ps(v));
      }
      _mm256_storeu_ps(v, y);
      memcpy(j->y + out, v, (size_t)cols * 4);
    }
  }
}

/* Activation rows four at a time (the tail in a pass of its own size, each count its own
 * inlined copy so that the accumulators stay in registers). */
AVX2 static inline __attribute__((always_inline)) void groups_ggml_avx2_as(
    const Job* j, int g0, int g1, const int bits, const int offset) {
  const size_t bb = (bits == 4 ? 256 : 512) + GROUP * 2 * (offset ? 2 : 1);
  for (int g = g0; g < g1; g++) {
    /* the next group's weights, fetched during this group's first pass */
    const uint8_t* next = g + 1 < g1 ? j->w + (size_t)(g + 1) * (j->k / QK) * bb : NULL;
    int m0 = 0;
    for (; m0 + 4 <= j->m; m0 += 4, next = NULL) ggml_rows_avx2(j, g, m0, 4, bits, offset, next);
    switch (j->m - m0) {
      case 3: ggml_rows_avx2(j, g, m0, 3, bits, offset, next); break;
      case 2: ggml_rows_avx2(j, g, m0, 2, bits, offset, next); break;
      case 1: ggml_rows_avx2(j, g, m0, 1, bits, offset, next); break;
      default: break;
    }
  }
}

AVX2 void qmm_groups_ggml_avx2(const Job* j, int g0, int g1) {
  if (j->fmt == FMT_Q4_1)
    groups_ggml_avx2_as(j, g0, g1, 4, 1);
  else
    groups_ggml_avx2_as(j, g0, g1, 8, 0);
}
#endif
