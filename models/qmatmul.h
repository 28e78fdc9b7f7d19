/* uniun.QMatMul's shared declarations: Y = X @ W^T (+ R) for weights kept in GGUF's block
 * formats, as an onnxruntime custom operator (qmatmul_ort.c) and a plain call for tests
 * (qmatmul.c). The files, one job each:
 *   qmatmul_format.c   the formats: the table, block sizes, names;
 *   qmatmul_quant.c    the activations quantised to 8 bits per 32 (portable, AVX2, AVX-512);
 *   qmatmul_scalar.c   the portable kernels (our order and llama.cpp's);
 *   qmatmul_avx2.c     the AVX2 kernels (our order and llama.cpp's);
 *   qmatmul_avx512.c   the AVX-512 VNNI kernels (our order and llama.cpp's);
 *   qmatmul.c          which kernel a call runs (isa.h's level), and the call for tests;
 *   qmatmul_ort.c      the onnxruntime operator.
 *
 * Why our own kernel (docs/models.md, "Weight format"): onnxruntime's MatMulNBits has no
 * exact form for a Q4_1 block (d * q + m needs a fractional zero point), and MLAS keeps a
 * float32 scale and a float32 block sum per 32 weights where the GGUF block has two fp16
 * values. Here a block is what the GGUF file holds, d and m in fp16, and one pass
 * does the whole dot product the way llama.cpp does it: activations quantised to 8 bits
 * per 32 (ggml's Q8_0 rounding), integer dot products, a float scale per block. Blocks
 * fp16 cannot hold exactly (K-quants) keep float32 scales and offsets (the "f" formats).
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
 */
#ifndef UNIUN_QMATMUL_H
#define UNIUN_QMATMUL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "isa.h"

/* ---- formats ------------------------------------------------------------------------- */

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
 * vector kernels' dispatch are all made from it. */
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
enum { QMM_FORMATS(AS_ENUM) N_FORMATS };

/* A case calling PATH_FN(j, g0, g1, <the format's constants>): each format gets its own
 * copy of an always-inlined loop, with its branches folded away. */
#define AS_CASE(id, name, bits, zp, f32, offset, halves) \
  case FMT_##id: PATH_FN(j, g0, g1, bits, zp, f32, offset, halves); break;

#define GROUP 16  /* rows per group */
#define QK 32     /* elements per block */

extern const Format qmm_formats[N_FORMATS];

/* Bytes of one group's block of format `fmt`, or 0 for a format that does not exist. */
size_t qmm_block_bytes(int fmt);

/* The format called `name`, or -1. */
int qmm_format_named(const char* name);

/* Whether llama.cpp's summation order (Job.ggml) exists for `fmt`: q4_1 and q8_0, the
 * formats ggml's x86 build does not repack. */
int qmm_ggml_format(int fmt);

static inline size_t qmm_code_bytes(const Format* f) { return f->bits == 4 ? 256 : 512; }
static inline size_t qmm_scale_bytes(const Format* f) { return GROUP * (f->f32 ? 4 : 2); }

static inline float qmm_half_to_float(uint16_t h) {
  _Float16 v;
  memcpy(&v, &h, 2);
  return (float)v;
}

static inline float qmm_round_to_half(float x) { return (float)(_Float16)x; }

/* Row `row`'s scale (or offset) in the 16 that start at p. */
static inline float qmm_scale_at(const Format* f, const uint8_t* p, int row) {
  if (f->f32) {
    float v;
    memcpy(&v, p + 4 * row, 4);
    return v;
  }
  uint16_t h;
  memcpy(&h, p + 2 * row, 2);
  return qmm_half_to_float(h);
}

/* ---- activations: 8 bits per 32, as ggml's quantize_row_q8_0 (qmatmul_quant.c) --------- */

/* Per row, K codes, and per block: d (the scale, rounded to fp16 as ggml stores it) and
 * the integer sum of the codes, for zero points and offsets: per 32 (sum) and per 16
 * (sum16, for the formats with a scale per 16). */
typedef struct {
  int8_t* q;
  float* d;
  int32_t* sum;
  int32_t* sum16;
  float* s;          /* ggml's Q8_1 s: fp16(unrounded d * sum), for ggml arithmetic */
  int32_t* lane128;  /* per 4 codes: -128 * their sum (8-bit weights in ggml order) */
} QuantRow;

/* Bytes of scratch for m rows of k activations, and the rows laid out in it. */
size_t qmm_scratch_bytes(int m, int k);
QuantRow qmm_scratch_rows(void* buf, int m, int k);

/* x [m][k] -> `all` (laid out by qmm_scratch_rows), with the variant of `path` (an isa.h
 * level; every variant gives the same codes). */
void qmm_quantize(int path, const float* x, int m, int k, QuantRow all);

/* ---- the kernels: rows of 16-row groups [g0, g1) ------------------------------------- */

typedef struct {
  int fmt;
  const uint8_t* w;  /* packed weights, [groups][K/32][block bytes] */
  int n, k;          /* output rows, inner size */
  int m;             /* activation rows */
  const int8_t* xq;  /* [m][k] */
  const float* xd;   /* [m][k/32] */
  const int32_t* xsum;     /* [m][k/32] */
  const int32_t* xsum16;   /* [m][k/16] */
  const float* xs;         /* [m][k/32] ggml's Q8_1 s */
  const int32_t* xlane128; /* [m][k/4] */
  const float* r;    /* [m][n] residual, or NULL */
  float* y;          /* [m][n] */
  int ggml;          /* llama.cpp's accumulation order (q4_1, q8_0): qmatmul_scalar.c */
} Job;

/* The x-side factor of a block's offset term, d * sum in float32. Not ggml's Q8_1 s,
 * which rounds it to fp16: a Q4_1 block's offset term nearly cancels its code term
 * (m ~ -8 d), so that rounding is amplified into the logits (docs/models.md). */
static inline float qmm_offset_factor(const Job* j, size_t xb) {
  return j->xd[xb] * (float)j->xsum[xb];
}

void qmm_groups_scalar(const Job* j, int g0, int g1);
void qmm_groups_ggml_scalar(const Job* j, int g0, int g1);
#ifdef UNIUN_X86
void qmm_groups_avx2(const Job* j, int g0, int g1);
void qmm_groups_ggml_avx2(const Job* j, int g0, int g1);
void qmm_groups_avx512(const Job* j, int g0, int g1);
void qmm_groups_ggml_avx512(const Job* j, int g0, int g1);
#endif

/* ---- which kernel (qmatmul.c) ---------------------------------------------------------- */

/* Whether this CPU runs `path` (an isa.h level). */
int qmm_supports(int path);

/* The path a call runs now: uniun_isa_level(). */
int qmm_path(void);

/* Rows of groups [g0, g1) of `j`, on `path`'s kernel (for j->ggml: its own where there is
 * one, else the portable loop). */
void qmm_run_groups(int path, const Job* j, int g0, int g1);

#endif
