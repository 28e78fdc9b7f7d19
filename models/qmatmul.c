/*
 * uniun.QMatMul: Y = X @ W^T (+ R) for weights kept in GGUF's block formats, as an
 * onnxruntime custom operator.
 *
 * Why our own kernel (docs/models.md, "Weight format"): onnxruntime's MatMulNBits has no
 * exact form for a Q4_1 block (d * q + m needs a fractional zero point), so the graph ran
 * a symmetric 4-bit matmul plus a correction matmul over block sums, and MLAS keeps a
 * float32 scale and a float32 block sum per 32 weights: 133 MB read per SmolLM2 token
 * where llama.cpp reads 96. Here a block is what the GGUF file holds, d and m in fp16, and
 * one pass does the whole dot product the way llama.cpp does it: activations quantised to
 * 8 bits per 32 (ggml's Q8_0 rounding), integer dot products, a float scale per block.
 * Blocks fp16 cannot hold exactly (K-quants) keep float32 scales and offsets (the "f"
 * formats below).
 *
 * Layout (written by models/convert/qmatmul_pack.py): rows in groups of 16 (the last group
 * padded with zero rows), and for each group and each 32-wide block along K:
 *   4-bit codes: 256 bytes, 4 chunks of 64; in chunk c, byte 4r+i holds row r's element
 *                8c+i in its low nibble and element 8c+4+i in its high nibble;
 *   8-bit codes: 512 bytes, 8 chunks of 64; in chunk c, byte 4r+i holds row r's element
 *                4c+i (as an unsigned byte: Q8_0's q + 128);
 *   then the 16 rows' scales (fp16, or float32 for the "f" formats), then, for formats
 *   with an offset, the 16 rows' offsets in the same type (for "q8_0h", the 16 rows'
 *   scales of the block's second 16 elements).
 * So one 64-byte load holds four consecutive elements of 16 rows, which is the shape of
 * AVX-512 VNNI's vpdpbusd (16 lanes of 4 u8 x s8 products): the 16 outputs of a group
 * accumulate in one register, with no horizontal sums.
 *
 * A row's result does not depend on how many rows share the call (each row is quantised
 * and accumulated on its own, in the same order), so a position's logits are the same in
 * a one-token and a many-token pass.
 *
 * The onnxruntime C API is used through its stable function table (OrtApi: append-only,
 * slots never move); the few slots used are declared below by index, and registration
 * checks a known slot before trusting the table.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define QMM_X86 1
#endif

#define EXPORT __attribute__((visibility("default")))

/* ---- formats --------------------------------------------------------------------------- */

/* A block along K is 32 codes of 4 or 8 bits, a scale per row and, for some formats, an
 * offset per row: value = (code - zp) * scale + offset. The fp16 formats are GGUF's own
 * (Q4_0, Q4_1 with zp 0 and offset m, Q8_0; Q5_0 arrives as 8-bit codes q + 112); the
 * "f" formats keep float32 scales and offsets, for blocks fp16 cannot hold exactly (a
 * K-quant sub-block's d * sc, dmin * m; Q5_1). "q8_0h" is Q6_K's shape: 8-bit codes
 * (q + 96) with a float32 scale per 16 elements, two per block, the first half's 16 rows
 * then the second's.
 *
 * The list, once: name, code bits, zero point, float32 scales, offset, scale per 16. The
 * Format table, the format numbers (their order is the Python side's FORMATS) and the
 * vector paths' dispatch are all made from it. */
#define QMM_FORMATS(X)                 \
  X(Q4_0, "q4_0", 4, 8, 0, 0, 0)       \
  X(Q4_1, "q4_1", 4, 0, 0, 1, 0)       \
  X(Q8_0, "q8_0", 8, 128, 0, 0, 0)     \
  X(Q4_0F, "q4_0f", 4, 8, 1, 0, 0)     \
  X(Q4_1F, "q4_1f", 4, 8, 1, 1, 0)     \
  X(Q8_0F, "q8_0f", 8, 128, 1, 0, 0)   \
  X(Q8_1F, "q8_1f", 8, 128, 1, 1, 0)   \
  X(Q8_0H, "q8_0h", 8, 128, 1, 0, 1)

typedef struct {
  const char* name;
  int bits;    /* 4 or 8 */
  int zp;      /* subtracted from each code */
  int f32;     /* scales (and offsets) are float32, else fp16 */
  int offset;  /* a per-row offset follows the scales */
  int halves;  /* a scale per 16 elements (8-bit codes, no offset) */
} Format;

#define AS_ENUM(id, name, bits, zp, f32, offset, halves) FMT_##id,
#define AS_ROW(id, name, bits, zp, f32, offset, halves) {name, bits, zp, f32, offset, halves},
enum { QMM_FORMATS(AS_ENUM) N_FORMATS };
static const Format FORMATS[] = {QMM_FORMATS(AS_ROW)};

/* A case calling PATH_FN(j, g0, g1, <the format's constants>): each format gets its own
 * copy of the always-inlined loop, with its branches folded away. */
#define AS_CASE(id, name, bits, zp, f32, offset, halves) \
  case FMT_##id: PATH_FN(j, g0, g1, bits, zp, f32, offset, halves); break;

enum { PATH_SCALAR = 0, PATH_AVX512 = 1, PATH_AVX2 = 2 };

#define GROUP 16  /* rows per group */
#define QK 32     /* elements per block */

static int valid_format(int fmt) { return fmt >= 0 && fmt < N_FORMATS; }

static size_t code_bytes(const Format* f) { return f->bits == 4 ? 256 : 512; }
static size_t scale_bytes(const Format* f) { return GROUP * (f->f32 ? 4 : 2); }

static size_t block_bytes(int fmt) {
  if (!valid_format(fmt)) return 0;
  const Format* f = &FORMATS[fmt];
  return code_bytes(f) + scale_bytes(f) * (f->offset || f->halves ? 2 : 1);
}

static float half_to_float(uint16_t h) {
  _Float16 v;
  memcpy(&v, &h, 2);
  return (float)v;
}

static float round_to_half(float x) { return (float)(_Float16)x; }

/* ---- activations: 8 bits per 32, as ggml's quantize_row_q8_0 ---------------------------- */

/* One row of K floats -> q[K] int8, and per block: d (the scale, rounded to fp16 as ggml
 * stores it) and the integer sum of q, for zero points and offsets: per 32 (sum) and per
 * 16 (sum16, for the formats with a scale per 16). */
typedef struct {
  int8_t* q;
  float* d;
  int32_t* sum;
  int32_t* sum16;
  float* s;          /* ggml's Q8_1 s: fp16(unrounded d * sum), for ggml arithmetic */
  int32_t* lane128;  /* per 4 codes: -128 * their sum (8-bit weights in ggml order) */
} QuantRow;

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
    r.d[b] = round_to_half(d);
    r.sum16[2 * b] = half[0];
    r.sum16[2 * b + 1] = half[1];
    r.sum[b] = half[0] + half[1];
    r.s[b] = round_to_half(d * (float)r.sum[b]);
  }
}

#ifdef QMM_X86
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
    r.d[b] = round_to_half(d);
    r.sum16[2 * b] = _mm512_reduce_add_epi32(q0);
    r.sum16[2 * b + 1] = _mm512_reduce_add_epi32(q1);
    r.sum[b] = r.sum16[2 * b] + r.sum16[2 * b + 1];
    r.s[b] = round_to_half(d * (float)r.sum[b]);
  }
}
#endif

/* ---- the dot products ------------------------------------------------------------------- */

typedef struct {
  int fmt;
  const uint8_t* w;  /* packed weights, [groups][K/32][block_bytes] */
  int n, k;          /* output rows, inner size */
  int m;             /* activation rows */
  const int8_t* xq;  /* [m][k] */
  const float* xd;   /* [m][k/32] */
  const int32_t* xsum;   /* [m][k/32] */
  const int32_t* xsum16; /* [m][k/16] */
  const float* xs;   /* [m][k/32] ggml's Q8_1 s */
  const int32_t* xlane128; /* [m][k/4] */
  const float* r;    /* [m][n] residual, or NULL */
  float* y;          /* [m][n] */
  int ggml;          /* llama.cpp's accumulation order (q4_1, q8_0): see groups_ggml */
} Job;

static float scale_at(const Format* f, const uint8_t* p, int row) {
  if (f->f32) {
    float v;
    memcpy(&v, p + 4 * row, 4);
    return v;
  }
  uint16_t h;
  memcpy(&h, p + 2 * row, 2);
  return half_to_float(h);
}

/* The x-side factor of a block's offset term, d * sum in float32. Not ggml's Q8_1 s,
 * which rounds it to fp16: a Q4_1 block's offset term nearly cancels its code term
 * (m ~ -8 d), so that rounding is amplified; SmolLM2's largest logit error against the
 * float32 reference went 0.87 -> 0.71, and its greedy agreement with llama.cpp 3/8 ->
 * 4/8 (docs/models.md). */
static float offset_factor(const Job* j, size_t xb) { return j->xd[xb] * (float)j->xsum[xb]; }

/* Rows of groups [g0, g1), scalar: the portable path, and the reference the vector path
 * must match in its integer part (the float accumulation order differs). */
static void groups_scalar(const Job* j, int g0, int g1) {
  const Format* f = &FORMATS[j->fmt];
  const int nb = j->k / QK;
  const size_t bb = block_bytes(j->fmt), cb = code_bytes(f), sb = scale_bytes(f);
  for (int g = g0; g < g1; g++) {
    for (int row = 0; row < GROUP; row++) {
      const int n = g * GROUP + row;
      if (n >= j->n) break;
      for (int mi = 0; mi < j->m; mi++) {
        const int8_t* xq = j->xq + (size_t)mi * j->k;
        float acc = j->r ? j->r[(size_t)mi * j->n + n] : 0.f;
        for (int b = 0; b < nb; b++) {
          const uint8_t* blk = j->w + ((size_t)g * nb + b) * bb;
          const size_t xb = (size_t)mi * nb + b;
          int32_t isum = 0;
          if (f->halves) { /* two sums, one per 16, each with its scale */
            for (int h = 0; h < 2; h++) {
              int32_t part = -f->zp * j->xsum16[2 * xb + h];
              for (int c = 4 * h; c < 4 * h + 4; c++)
                for (int i = 0; i < 4; i++)
                  part += (int32_t)blk[64 * c + 4 * row + i] * xq[b * QK + 4 * c + i];
              acc = fmaf((float)part, scale_at(f, blk + cb + h * sb, row) * j->xd[xb], acc);
            }
            continue;
          }
          if (f->bits == 8) {
            for (int c = 0; c < 8; c++)
              for (int i = 0; i < 4; i++)
                isum += (int32_t)blk[64 * c + 4 * row + i] * xq[b * QK + 4 * c + i];
          } else {
            for (int c = 0; c < 4; c++)
              for (int i = 0; i < 4; i++) {
                const uint8_t byte = blk[64 * c + 4 * row + i];
                isum += (int32_t)(byte & 15) * xq[b * QK + 8 * c + i];
                isum += (int32_t)(byte >> 4) * xq[b * QK + 8 * c + 4 + i];
              }
          }
          isum -= f->zp * j->xsum[xb];
          acc = fmaf((float)isum, scale_at(f, blk + cb, row) * j->xd[xb], acc);
          if (f->offset) acc = fmaf(scale_at(f, blk + cb + sb, row), offset_factor(j, xb), acc);
        }
        j->y[(size_t)mi * j->n + n] = acc;
      }
    }
  }
}

/* ---- llama.cpp's order (Job.ggml) ----------------------------------------------------- */

/* ggml's vec_dot_q4_1_q8_1 / vec_dot_q8_0_q8_0 as its x86 build runs them (the AVX2 code,
 * which AVX-512 CPUs also run): a block's 32 products are summed in 8 lanes of 4 (exact,
 * integers), each lane accumulates d_w * d_x * lane over the blocks with a fused
 * multiply-add, and the 8 lanes are added at the end in hsum_float_8's order; Q4_1's
 * offset terms m * s (s = fp16(d * sum), Q8_1's) accumulate apart, added last. With the
 * rest of llama.cpp's arithmetic (ggml_ops.c) this gives llama.cpp's logits bit for bit.
 * Formats: q4_1 and q8_0 (the ones ggml's x86 build does not repack). */
static float hsum8(const float a[8]) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static int ggml_format(int fmt) { return fmt == FMT_Q4_1 || fmt == FMT_Q8_0; }

/* the integer sums of the 8 lanes of one row's block: lane c is elements 4c .. 4c + 3 */
static void block_lanes(const Format* f, const uint8_t* blk, int row, const int8_t* x,
                        int32_t lane[8]) {
  for (int c = 0; c < 8; c++) {
    int32_t sum = 0;
    for (int i = 0; i < 4; i++) {
      const uint8_t byte = f->bits == 8 ? blk[64 * c + 4 * row + i]
                                        : blk[64 * (c / 2) + 4 * row + i];
      const int code = f->bits == 8 ? byte : (c % 2 ? byte >> 4 : byte & 15);
      sum += (code - f->zp) * x[4 * c + i];
    }
    lane[c] = sum;
  }
}

static void groups_ggml_scalar(const Job* j, int g0, int g1) {
  const Format* f = &FORMATS[j->fmt];
  const int nb = j->k / QK;
  const size_t bb = block_bytes(j->fmt), cb = code_bytes(f), sb = scale_bytes(f);
  for (int g = g0; g < g1; g++) {
    for (int row = 0; row < GROUP; row++) {
      const int n = g * GROUP + row;
      if (n >= j->n) break;
      for (int mi = 0; mi < j->m; mi++) {
        float acc[8] = {0}, summs = 0.f;
        for (int b = 0; b < nb; b++) {
          const uint8_t* blk = j->w + ((size_t)g * nb + b) * bb;
          const size_t xb = (size_t)mi * nb + b;
          int32_t lane[8];
          block_lanes(f, blk, row, j->xq + (size_t)mi * j->k + b * QK, lane);
          const float d = scale_at(f, blk + cb, row) * j->xd[xb];
          for (int c = 0; c < 8; c++) acc[c] = fmaf(d, (float)lane[c], acc[c]);
          if (f->offset) summs = fmaf(scale_at(f, blk + cb + sb, row), j->xs[xb], summs);
        }
        float y = hsum8(acc) + summs;
        if (j->r) y = y + j->r[(size_t)mi * j->n + n];
        j->y[(size_t)mi * j->n + n] = y;
      }
    }
  }
}

#ifdef QMM_X86
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
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(offset_factor(j, xb)), acc[t]);
          }
        }
      }
      for (int t = 0; t < mt; t++)
        _mm512_mask_storeu_ps(j->y + (size_t)(m0 + t) * j->n + g * GROUP, mask, acc[t]);
    }
  }
}

AVX512 static void groups_avx512(const Job* j, int g0, int g1) {
#define PATH_FN groups_avx512_as
  switch (j->fmt) { QMM_FORMATS(AS_CASE) }
#undef PATH_FN
}

/* groups_ggml_scalar's arithmetic, 16 rows at a time: one vpdpbusd per lane gives the 16
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

AVX512 static void groups_ggml_avx512(const Job* j, int g0, int g1) {
  if (j->fmt == FMT_Q4_1)
    groups_ggml_avx512_as(j, g0, g1, 4, 1);
  else
    groups_ggml_avx512_as(j, g0, g1, 8, 0);
}
#endif

#ifdef QMM_X86
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
          const __m256 xo = _mm256_set1_ps(offset_factor(j, xb));
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

AVX2 static void groups_avx2(const Job* j, int g0, int g1) {
#define PATH_FN groups_avx2_as
  switch (j->fmt) { QMM_FORMATS(AS_CASE) }
#undef PATH_FN
}
#endif

static int supports(int path) {
  if (path == PATH_SCALAR) return 1;
#ifdef QMM_X86
  __builtin_cpu_init();
  if (path == PATH_AVX512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("f16c");
  if (path == PATH_AVX2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
  return 0;
}

static int best_path(void) {
  return supports(PATH_AVX512) ? PATH_AVX512 : supports(PATH_AVX2) ? PATH_AVX2 : PATH_SCALAR;
}

/* The path a session's kernels run: the best this CPU has, or UNIUN_QMATMUL_PATH
 * (scalar, avx2, avx512) where this CPU has it: for measuring one path against another. */
static int session_path(void) {
  const char* want = getenv("UNIUN_QMATMUL_PATH");
  int path = !want ? -1 : !strcmp(want, "scalar") ? PATH_SCALAR : !strcmp(want, "avx2") ? PATH_AVX2
           : !strcmp(want, "avx512") ? PATH_AVX512 : -1;
  return path >= 0 && supports(path) ? path : best_path();
}

#ifdef QMM_X86
AVX2 static void quantize_row_avx2(const float* x, int K, QuantRow r) {
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
    r.d[b] = round_to_half(d);
    r.sum16[2 * b] = half[0];
    r.sum16[2 * b + 1] = half[1];
    r.sum[b] = half[0] + half[1];
    r.s[b] = round_to_half(d * (float)r.sum[b]);
  }
}
#endif

static void quantize_row(int path, const float* x, int k, QuantRow r) {
#ifdef QMM_X86
  if (path == PATH_AVX512) {
    quantize_row_avx512(x, k, r);
    return;
  }
  if (path == PATH_AVX2) {
    quantize_row_avx2(x, k, r);
    return;
  }
#endif
  quantize_row_scalar(x, k, r);
}

static void quantize(int path, const float* x, int m, int k, QuantRow all) {
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

static void run_groups(int path, const Job* j, int g0, int g1) {
  if (j->ggml) {
#ifdef QMM_X86
    if (path == PATH_AVX512) {
      groups_ggml_avx512(j, g0, g1);
      return;
    }
#endif
    groups_ggml_scalar(j, g0, g1);
    return;
  }
#ifdef QMM_X86
  if (path == PATH_AVX512) {
    groups_avx512(j, g0, g1);
    return;
  }
  if (path == PATH_AVX2) {
    groups_avx2(j, g0, g1);
    return;
  }
#endif
  groups_scalar(j, g0, g1);
}

/* Scratch for the quantised activations: per row, k codes, k / 4 lane sums (times -128)
 * and, per block, a float scale, three int32 sums (the block's and its halves') and the
 * Q8_1 s. */
static size_t scratch_bytes(int m, int k) {
  return (size_t)m * k * 2 + (size_t)m * (k / QK) * 20 + 64;
}

static QuantRow scratch_rows(void* buf, int m, int k) {
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

/* For tests and benchmarks (ctypes): one call, single-threaded, on a chosen path (-1: the
 * best this CPU has). Returns 0, or -1 for a bad argument or a path this CPU lacks. */
EXPORT int uniun_qmatmul(int fmt, int path, const uint8_t* w, int n, int k, const float* x,
                         int m, const float* r, float* y, int ggml) {
  if (block_bytes(fmt) == 0 || n <= 0 || k <= 0 || k % QK || m < 0) return -1;
  if (ggml && !ggml_format(fmt)) return -1;
  if (path < 0) path = best_path();
  if (!supports(path)) return -1;
  if (m == 0) return 0;
  void* buf = malloc(scratch_bytes(m, k));
  if (!buf) return -1;
  QuantRow q = scratch_rows(buf, m, k);
  quantize(path, x, m, k, q);
  Job j = {fmt, w, n, k, m, q.q, q.d, q.sum, q.sum16, q.s, q.lane128, r, y, ggml};
  run_groups(path, &j, 0, (n + GROUP - 1) / GROUP);
  free(buf);
  return 0;
}

/* The path this CPU runs: 0 scalar, 1 AVX-512 VNNI, 2 AVX2. */
EXPORT int uniun_qmatmul_best_path(void) { return best_path(); }

/* Whether this CPU runs path 0 scalar, 1 AVX-512 VNNI, 2 AVX2. */
EXPORT int uniun_qmatmul_supports(int path) { return supports(path); }

EXPORT size_t uniun_qmatmul_block_bytes(int fmt) { return block_bytes(fmt); }

/* ---- onnxruntime ------------------------------------------------------------------------ */

#include "ort_abi.h"

const OrtApi* uniun_ort_api;

/* One grow-only buffer per thread that runs sessions, shared by every operator: an
 * operator uses it only while its compute call runs on that thread (its ParallelFor
 * workers included), and one thread runs one operator at a time. Per-kernel buffers cost
 * 40 MB of RSS for SmolLM2 (150 kernels, each sized for a prefill pass), and a fresh one
 * per call cost page faults. */
void* uniun_thread_scratch(size_t need) {
  static __thread void* buf;
  static __thread size_t size;
  if (need > size) {
    free(buf);
    buf = malloc(need);
    size = buf ? need : 0;
  }
  return buf;
}

typedef struct {
  int fmt, n, k, path, ggml;
} Kernel;

typedef struct {
  const Job* job;
  int path, per_task, groups;
} Tasks;

static void run_task(void* data, size_t index) {
  const Tasks* t = data;
  const int g0 = (int)index * t->per_task;
  const int g1 = g0 + t->per_task < t->groups ? g0 + t->per_task : t->groups;
  if (g0 < g1) run_groups(t->path, t->job, g0, g1);
}

#define TASKS 8 /* work items per call, shared out by onnxruntime's intra-op pool */

static OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  Kernel* kn = kernel;
  const OrtValue *xv = NULL, *wv = NULL, *rv = NULL;
  size_t inputs = 0;
  typedef OrtStatus* (*GetInput)(const OrtKernelContext*, size_t, const OrtValue**);
  TRY(API_FN(SLOT_KernelContext_GetInputCount, OrtStatus* (*)(const OrtKernelContext*,
                                                               size_t*))(ctx, &inputs));
  TRY(API_FN(SLOT_KernelContext_GetInput, GetInput)(ctx, 0, &xv));
  TRY(API_FN(SLOT_KernelContext_GetInput, GetInput)(ctx, 1, &wv));
  if (inputs > 2) TRY(API_FN(SLOT_KernelContext_GetInput, GetInput)(ctx, 2, &rv));

  int64_t dims[8], wdims[8], rdims[8];
  size_t nd = 0, wnd = 0, rnd = 0;
  TRY(tensor_shape(xv, dims, &nd));
  if (nd < 1 || dims[nd - 1] != kn->k)
    return status(ORT_INVALID_ARGUMENT, "uniun.QMatMul: X's last dimension is not K");
  TRY(tensor_shape(wv, wdims, &wnd));
  const int groups = (kn->n + GROUP - 1) / GROUP;
  int64_t wbytes = 1;
  for (size_t i = 0; i < wnd; i++) wbytes *= wdims[i];
  if (wbytes != (int64_t)groups * (kn->k / QK) * (int64_t)block_bytes(kn->fmt))
    return status(ORT_INVALID_ARGUMENT, "uniun.QMatMul: W's size does not match N, K, format");
  int64_t m = 1;
  for (size_t i = 0; i + 1 < nd; i++) m *= dims[i];
  dims[nd - 1] = kn->n;
  if (rv) {
    TRY(tensor_shape(rv, rdims, &rnd));
    if (rnd != nd || memcmp(rdims, dims, nd * sizeof(int64_t)) != 0)
      return status(ORT_INVALID_ARGUMENT, "uniun.QMatMul: R's shape is not Y's");
  }
  OrtValue* yv = NULL;
  TRY(API_FN(SLOT_KernelContext_GetOutput, OrtStatus* (*)(OrtKernelContext*, size_t,
                                                           const int64_t*, size_t, OrtValue**))(
      ctx, 0, dims, nd, &yv));
  if (m == 0) return NULL;
  void *x, *w, *y, *r = NULL;
  TRY(tensor_data(xv, &x));
  TRY(tensor_data(wv, &w));
  TRY(tensor_data(yv, &y));
  if (rv) TRY(tensor_data(rv, &r));

  void* scratch = uniun_thread_scratch(scratch_bytes((int)m, kn->k));
  if (!scratch) return status(ORT_FAIL, "uniun.QMatMul: out of memory");
  QuantRow q = scratch_rows(scratch, (int)m, kn->k);
  quantize(kn->path, x, (int)m, kn->k, q);
  Job job = {kn->fmt, w, kn->n, kn->k, (int)m, q.q, q.d, q.sum, q.sum16, q.s, q.lane128, r, y, kn->ggml};
  const int tasks = groups < TASKS ? groups : TASKS;
  Tasks t = {&job, kn->path, (groups + tasks - 1) / tasks, groups};
  return API_FN(SLOT_KernelContext_ParallelFor,
                OrtStatus* (*)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t,
                               void*))(ctx, run_task, (size_t)tasks, 0, &t);
}

static OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi* api,
                                const OrtKernelInfo* info, void** out) {
  (void)op;
  (void)api;
  int64_t n = 0, k = 0;
  char fmt[16] = {0};
  size_t fmt_size = sizeof fmt;
  typedef OrtStatus* (*GetInt)(const OrtKernelInfo*, const char*, int64_t*);
  TRY(API_FN(SLOT_KernelInfoGetAttribute_int64, GetInt)(info, "N", &n));
  TRY(API_FN(SLOT_KernelInfoGetAttribute_int64, GetInt)(info, "K", &k));
  TRY(API_FN(SLOT_KernelInfoGetAttribute_string, OrtStatus* (*)(const OrtKernelInfo*,
                                                                 const char*, char*, size_t*))(
      info, "format", fmt, &fmt_size));
  int f = -1;
  for (int i = 0; i < N_FORMATS; i++)
    if (!strcmp(fmt, FORMATS[i].name)) f = i;
  if (f < 0)
    return status(ORT_INVALID_ARGUMENT,
                  "uniun.QMatMul: format is not q4_0, q4_1, q8_0, q4_0f, q4_1f, q8_0f, q8_1f "
                  "or q8_0h");
  if (n <= 0 || k <= 0 || k % QK || n > (1 << 30) || k > (1 << 20))
    return status(ORT_INVALID_ARGUMENT, "uniun.QMatMul: bad N or K (K must be a multiple of 32)");
  int64_t ggml = 0; /* optional: llama.cpp's summation order */
  OrtStatus* absent = API_FN(SLOT_KernelInfoGetAttribute_int64, GetInt)(info, "ggml", &ggml);
  if (absent) {
    API_FN(SLOT_ReleaseStatus, void (*)(OrtStatus*))(absent);
    ggml = 0;
  }
  if (ggml && !ggml_format(f))
    return status(ORT_INVALID_ARGUMENT, "uniun.QMatMul: ggml=1 takes formats q4_1 and q8_0");
  Kernel* kn = calloc(1, sizeof *kn);
  if (!kn) return status(ORT_FAIL, "uniun.QMatMul: out of memory");
  kn->ggml = ggml != 0;
  kn->fmt = f;
  kn->n = (int)n;
  kn->k = (int)k;
  kn->path = session_path();
  *out = kn;
  return NULL;
}

static void destroy_kernel(void* kernel) {
  Kernel* kn = kernel;
  free(kn);
}

static const char* op_name(const OrtCustomOp* op) { (void)op; return "QMatMul"; }
static const char* op_provider(const OrtCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int op_input_type(const OrtCustomOp* op, size_t i) { (void)op; return i == 1 ? TYPE_UINT8 : TYPE_FLOAT; }
static size_t op_input_count(const OrtCustomOp* op) { (void)op; return 3; }
static int op_output_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return TYPE_FLOAT; }
static size_t op_output_count(const OrtCustomOp* op) { (void)op; return 1; }
static int op_input_characteristic(const OrtCustomOp* op, size_t i) { (void)op; return i == 2 ? 1 : 0; }
static int op_output_characteristic(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int op_memory_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int op_one(const OrtCustomOp* op) { (void)op; return 1; }

static const OrtCustomOp qmatmul_op = {
    OP_STRUCT_VERSION, NULL, op_name, op_provider, op_input_type, op_input_count,
    op_output_type, op_output_count, NULL, destroy_kernel, op_input_characteristic,
    op_output_characteristic, op_memory_type, op_one, op_one, op_one, op_one, create_kernel,
    compute, NULL};

static OrtCustomOpDomain* g_domain;

/* onnxruntime calls this when a session's options register the library. */
EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(ORT_API_VERSION_USED);
  if (!api) return NULL; /* too old: the session then refuses the graph, naming the op */
  uniun_ort_api = api;
  const char* build = API_FN(SLOT_GetBuildInfoString, const char* (*)(void))();
  if (!build || strncmp(build, "ORT Build Info", 14) != 0)
    return status(ORT_FAIL, "uniun.QMatMul: this onnxruntime's C API table is not the expected one");
  if (!g_domain) {
    TRY(API_FN(SLOT_CreateCustomOpDomain, OrtStatus* (*)(const char*, OrtCustomOpDomain**))(
        "uniun", &g_domain));
    TRY(API_FN(SLOT_CustomOpDomain_Add, OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*))(
        g_domain, &qmatmul_op));
    size_t count = 0;
    const OrtCustomOp* const* ggml_ops = uniun_ggml_ort_ops(&count);
    for (size_t i = 0; i < count; i++)
      TRY(API_FN(SLOT_CustomOpDomain_Add,
                 OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*))(g_domain, ggml_ops[i]));
  }
  return API_FN(SLOT_AddCustomOpDomain, OrtStatus* (*)(OrtSessionOptions*, OrtCustomOpDomain*))(
      options, g_domain);
}
