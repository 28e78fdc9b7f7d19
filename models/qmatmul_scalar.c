/* QMatMul's portable kernels: any CPU runs them, and every vector kernel gives their
 * results bit for bit (the integer sums are exact, and the float steps are the same fused
 * multiply-adds in the same order). */
#include <math.h>

#include "qmatmul.h"

/* Our order: per row, per block, the integer dot product, then acc += isum * d_w * d_x
 * (+ the offset term), one fused multiply-add each. */
void qmm_groups_scalar(const Job* j, int g0, int g1) {
  const Format* f = &qmm_formats[j->fmt];
  const int nb = j->k / QK;
  const size_t bb = qmm_block_bytes(j->fmt), cb = qmm_code_bytes(f), sb = qmm_scale_bytes(f);
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
              acc = fmaf((float)part, qmm_scale_at(f, blk + cb + h * sb, row) * j->xd[xb], acc);
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
          acc = fmaf((float)isum, qmm_scale_at(f, blk + cb, row) * j->xd[xb], acc);
          if (f->offset)
            acc = fmaf(qmm_scale_at(f, blk + cb + sb, row), qmm_offset_factor(j, xb), acc);
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
 * Formats: q4_1 and q8_0 (qmm_ggml_format). */
static float hsum8(const float a[8]) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

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

void qmm_groups_ggml_scalar(const Job* j, int g0, int g1) {
  const Format* f = &qmm_formats[j->fmt];
  const int nb = j->k / QK;
  const size_t bb = qmm_block_bytes(j->fmt), cb = qmm_code_bytes(f), sb = qmm_scale_bytes(f);
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
          const float d = qmm_scale_at(f, blk + cb, row) * j->xd[xb];
          for (int c = 0; c < 8; c++) acc[c] = fmaf(d, (float)lane[c], acc[c]);
          if (f->offset) summs = fmaf(qmm_scale_at(f, blk + cb + sb, row), j->xs[xb], summs);
        }
        float y = hsum8(acc) + summs;
        if (j->r) y = y + j->r[(size_t)mi * j->n + n];
        j->y[(size_t)mi * j->n + n] = y;
      }
    }
  }
}
