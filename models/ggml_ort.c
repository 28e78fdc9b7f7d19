/* The ggml-arithmetic operators (ggml_ops.c, ggml_attention.c) as onnxruntime custom
 * operators, in the "uniun" domain next to QMatMul:
 *
 *   GgmlRmsNorm(X, W, epsilon[1]) -> Y               RMSNorm of the last axis, times W
 *   GgmlRope(X, position_ids, base[1]) -> Y          X [b, s, heads * dim]; attrs num_heads,
 *                                                    interleaved (1: llama's GGUF row order)
 *   GgmlSwiGlu(G, U) -> Y                            silu(G) * U
 *   GgmlAttention(Q, K, V, past_key, past_value, attention_mask, scale[1])
 *       -> (Y, present_key, present_value)           attrs num_heads, kv_num_heads
 *
 * GgmlAttention keeps KV as float32 holding fp16 values (llama.cpp's cache is fp16), in
 * the decoder's BNSH layout. Like GroupQueryAttention it writes the new positions into
 * the past buffer when the session binds one buffer as both past and present (past longer
 * than attention_mask: its capacity), and concatenates otherwise.
 *
 * Rows of a batch may differ in length (models/batch.py): a row's keys end at its mask's
 * last open position, its s new positions are the last s of those, and trailing zeros are
 * padding up to the widest row. So each row is computed exactly as it would be alone
 * (the same keys at the same positions, the same one- or many-query path).
 *
 * Scalars arrive as one-element float inputs (initializers), not attributes: every
 * onnxruntime reads those the same way, and only int64 attributes are read here.
 */
#include <stdlib.h>
#include <string.h>

#include "ggml_ops.h"
#include "ort_op.h"

typedef struct {
  int64_t heads, kv_heads, interleaved;
} Kernel;

static OrtStatus* new_kernel(Kernel** out) {
  *out = NULL;
  if (!uniun_ggml_supported())
    return ort_status(ORT_FAIL, "uniun: the ggml operators need a CPU with AVX2, FMA and F16C; "
                                "convert the model again here (it then uses the usual graph)");
  *out = calloc(1, sizeof(Kernel));
  if (!*out) return ort_status(ORT_FAIL, "uniun: out of memory");
  return NULL;
}

/* ---- GgmlRmsNorm ----------------------------------------------------------------------- */

static OrtStatus* rms_norm_create(const OrtKernelInfo* info, void** out) {
  (void)info;
  return new_kernel((Kernel**)out);
}

static OrtStatus* rms_norm_compute(void* kernel, OrtKernelContext* ctx) {
  (void)kernel;
  Tensor x, w;
  float eps;
  void* y;
  TRY(ort_input(ctx, 0, &x));
  TRY(ort_input(ctx, 1, &w));
  TRY(ort_scalar(ctx, 2, "uniun.GgmlRmsNorm: epsilon is not one float", &eps));
  if (x.nd < 1 || ort_elements(w.dims, w.nd) != x.dims[x.nd - 1])
    return ort_status(ORT_INVALID_ARGUMENT, "uniun.GgmlRmsNorm: W's size is not X's last axis");
  TRY(ort_output(ctx, 0, x.dims, x.nd, &y));
  const int n = (int)x.dims[x.nd - 1];
  if (n > 0) uniun_ggml_rms_norm(x.data, w.data, y, ort_elements(x.dims, x.nd) / n, n, eps);
  return NULL;
}

const OpSpec op_ggml_rms_norm = OP("GgmlRmsNorm", 1, 0, rms_norm_create, rms_norm_compute,
                                   TYPE_FLOAT, TYPE_FLOAT, TYPE_FLOAT);

/* ---- GgmlRope -------------------------------------------------------------------------- */

static OrtStatus* rope_create(const OrtKernelInfo* info, void** out) {
  Kernel* k;
  TRY(new_kernel(&k));
  OrtStatus* st = ort_attr_int(info, "num_heads", &k->heads);
  if (!st) st = ort_attr_int(info, "interleaved", &k->interleaved);
  if (!st && k->heads <= 0) st = ort_status(ORT_INVALID_ARGUMENT, "uniun.GgmlRope: num_heads <= 0");
  if (st) free(k);
  *out = st ? NULL : k;
  return st;
}

static OrtStatus* rope_compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel* kn = kernel;
  Tensor x, pos;
  float base;
  void* y;
  TRY(ort_input(ctx, 0, &x));
  TRY(ort_input(ctx, 1, &pos));
  TRY(ort_scalar(ctx, 2, "uniun.GgmlRope: base is not one float", &base));
  if (x.nd != 3 || x.dims[2] % kn->heads || (x.dims[2] / kn->heads) % 2)
    return ort_status(ORT_INVALID_ARGUMENT, "uniun.GgmlRope: X is not [b, s, heads * even dim]");
  if (pos.nd != 2 || pos.dims[0] != x.dims[0] || pos.dims[1] != x.dims[1])
    return ort_status(ORT_INVALID_ARGUMENT, "uniun.GgmlRope: position_ids is not [b, s]");
  TRY(ort_output(ctx, 0, x.dims, x.nd, &y));
  uniun_ggml_rope(x.data, pos.data, y, x.dims[0] * x.dims[1], (int)kn->heads,
                  (int)(x.dims[2] / kn->heads), base, (int)kn->interleaved);
  return NULL;
}

const OpSpec op_ggml_rope = OP("GgmlRope", 1, 0, rope_create, rope_compute, TYPE_FLOAT,
                               TYPE_INT64, TYPE_FLOAT);

/* ---- GgmlSwiGlu ------------------------------------------------------------------------ */

static OrtStatus* swiglu_create(const OrtKernelInfo* info, void** out) {
  (void)info;
  return new_kernel((Kernel**)out);
}

static OrtStatus* swiglu_compute(void* kernel, OrtKernelContext* ctx) {
  (void)kernel;
  Tensor g, u;
  void* y;
  TRY(ort_input(ctx, 0, &g));
  TRY(ort_input(ctx, 1, &u));
  if (g.nd != u.nd || memcmp(g.dims, u.dims, g.nd * sizeof(int64_t)) != 0)
    return ort_status(ORT_INVALID_ARGUMENT, "uniun.GgmlSwiGlu: G and U differ in shape");
  TRY(ort_output(ctx, 0, g.dims, g.nd, &y));
  /* ggml runs its vector loop per row: the scalar tail is per row too */
  const int64_t row = g.nd ? g.dims[g.nd - 1] : 1;
  for (int64_t r = 0; row > 0 && r < ort_elements(g.dims, g.nd) / row; r++)
    uniun_ggml_swiglu((const float*)g.data + r * row, (const float*)u.data + r * row,
                      (float*)y + r * row, row);
  return NULL;
}

const OpSpec op_ggml_swiglu = OP("GgmlSwiGlu", 1, 0, swiglu_create, swiglu_compute, TYPE_FLOAT,
                                 TYPE_FLOAT);

/* ---- GgmlAttention --------------------------------------------------------------------- */

static OrtStatus* attention_create(const OrtKernelInfo* info, void** out) {
  Kernel* k;
  TRY(new_kernel(&k));
  OrtStatus* st = ort_attr_int(info, "num_heads", &k->heads);
  if (!st) st = ort_attr_int(info, "kv_num_heads", &k->kv_heads);
  if (!st && (k->heads <= 0 || k->kv_heads <= 0 || k->heads % k->kv_heads))
    st = ort_status(ORT_INVALID_ARGUMENT,
                    "uniun.GgmlAttention: num_heads must be a multiple of kv_num_heads > 0");
  if (st) free(k);
  *out = st ? NULL : k;
  return st;
}

typedef struct {
  const float *q, *k, *v; /* q: every row's queries, fp16-exact; k, v: present */
  const int64_t *mask, *keys; /* [b][total]; [b]: each row's keys (row_keys) */
  float* out;
  int tokens, heads, kv_heads, dim, total, stride;
  float scale;
  int rows; /* queries per task: a prefill's heads are split further, for 2+ threads */
  char* scratch;
  size_t scratch_each;
} HeadTasks;

#define ROWS_PER_TASK 16

/* Task i: batch row i / per_row, then a head and a block of queries of that row. A task
 * computes the same whatever the others are, so a row's result does not depend on the
 * batch it is in. */
static void head_task(void* data, size_t i) {
  const HeadTasks* t = data;
  const int blocks = (t->tokens + t->rows - 1) / t->rows;
  const size_t per_row = (size_t)t->heads * blocks;
  const size_t r = i / per_row;
  const int j = (int)(i % per_row);
  const int h = j / blocks, t0 = j % blocks * t->rows;
  const int t1 = t0 + t->rows < t->tokens ? t0 + t->rows : t->tokens;
  const size_t qrow = (size_t)t->tokens * t->heads * t->dim;
  const size_t kvrow = (size_t)t->kv_heads * t->stride * t->dim;
  const int keys = (int)t->keys[r];
  uniun_ggml_attention(t->q + r * qrow, t->k + r * kvrow, t->v + r * kvrow,
                       t->mask + r * t->total, t->out + r * qrow, t->tokens, t->heads,
                       t->kv_heads, t->dim, keys, t->stride, keys - t->tokens, t->scale, h,
                       h + 1, t0, t1, t->scratch + i * t->scratch_each);
}

/* one row's new [s, kv_heads * dim] -> positions past .. past + s - 1 of its present
 * [kv_heads, cap, dim], rounded to fp16 as llama.cpp's cache stores them */
static void store_new(const float* x, float* present, int64_t s, int64_t kvh, int64_t dim,
                      int64_t cap, int64_t past) {
  for (int64_t t = 0; t < s; t++)
    for (int64_t h = 0; h < kvh; h++)
      uniun_ggml_round_half(x + (t * kvh + h) * dim, present + (h * cap + past + t) * dim, dim);
}

/* A row's keys: up to its mask's last open position (trailing zeros pad a shorter row). */
static int64_t row_keys(const int64_t* mask, int64_t total) {
  while (total > 0 && mask[total - 1] == 0) total--;
  return total;
}

static OrtStatus* attention_compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel* kn = kernel;
  Tensor qt, kt, vt, pkt, pvt, mt;
  float scale;
  TRY(ort_input(ctx, 0, &qt));
  TRY(ort_input(ctx, 1, &kt));
  TRY(ort_input(ctx, 2, &vt));
  TRY(ort_input(ctx, 3, &pkt));
  TRY(ort_input(ctx, 4, &pvt));
  TRY(ort_input(ctx, 5, &mt));
  TRY(ort_scalar(ctx, 6, "uniun.GgmlAttention: scale is not one float", &scale));
  const int64_t heads = kn->heads, kvh = kn->kv_heads;
  const int64_t *qd = qt.dims, *kd = kt.dims, *pd = pkt.dims, *md = mt.dims;
  if (qt.nd != 3 || qd[2] % heads)
    return ort_status(ORT_INVALID_ARGUMENT, "uniun.GgmlAttention: Q is not [b, s, heads * dim]");
  const int64_t b = qd[0], s = qd[1], dim = qd[2] / heads;
  if (dim % 16)
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.GgmlAttention: head dim is not a multiple of 16");
  if (kt.nd != 3 || vt.nd != 3 || kd[0] != b || kd[1] != s || kd[2] != kvh * dim ||
      memcmp(kd, vt.dims, sizeof kd[0] * 3) != 0)
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.GgmlAttention: K and V are not [b, s, kv_heads * dim]");
  if (pkt.nd != 4 || pvt.nd != 4 || pd[0] != b || pd[1] != kvh || pd[3] != dim ||
      memcmp(pd, pvt.dims, sizeof pd[0] * 4) != 0)
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.GgmlAttention: past key and value are not [b, kv_heads, n, dim]");
  if (mt.nd != 2 || md[0] != b || md[1] < s)
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.GgmlAttention: attention_mask is not [b, past + s]");
  const int64_t total = md[1], past = total - s, cap = pd[2];
  if (cap < past)
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.GgmlAttention: past holds fewer positions than attention_mask says");
  const int64_t* mask = mt.data;
  for (int64_t i = 0; i < b; i++)
    if (row_keys(mask + i * total, total) < s)
      return ort_status(ORT_INVALID_ARGUMENT,
                        "uniun.GgmlAttention: a row of attention_mask opens fewer positions "
                        "than the pass feeds");

  /* in place (a preallocated buffer: capacity >= total) or concatenated */
  const int64_t out_cap = cap >= total ? cap : total;
  const int64_t present_dims[4] = {b, kvh, out_cap, dim};
  void *y, *ok, *ov;
  TRY(ort_output(ctx, 0, qd, 3, &y));
  TRY(ort_output(ctx, 1, present_dims, 4, &ok));
  TRY(ort_output(ctx, 2, present_dims, 4, &ov));
  if (b == 0 || s == 0) return NULL;
  const void* pasts[2] = {pkt.data, pvt.data};
  void* presents[2] = {ok, ov};
  for (int i = 0; i < 2; i++)
    if (presents[i] != pasts[i] && past > 0)
      for (int64_t r = 0; r < b * kvh; r++)
        memcpy((float*)presents[i] + r * out_cap * dim, (const float*)pasts[i] + r * cap * dim,
               sizeof(float) * past * dim);
  const size_t each = uniun_ggml_attention_scratch((int)total, (int)dim);
  const size_t qbytes = sizeof(float) * b * s * heads * dim, kbytes = sizeof(int64_t) * b;
  const int rows = s < ROWS_PER_TASK ? (int)s : ROWS_PER_TASK;
  const size_t tasks = (size_t)b * heads * (size_t)((s + rows - 1) / rows);
  char* scratch = ort_scratch(qbytes + kbytes + each * tasks);
  if (!scratch) return ort_status(ORT_FAIL, "uniun.GgmlAttention: out of memory");
  int64_t* keys = (int64_t*)(scratch + qbytes);
  for (int64_t i = 0; i < b; i++) {
    keys[i] = row_keys(mask + i * total, total);
    const int64_t row_past = keys[i] - s;
    store_new((const float*)kt.data + i * s * kvh * dim, (float*)ok + i * kvh * out_cap * dim,
              s, kvh, dim, out_cap, row_past);
    store_new((const float*)vt.data + i * s * kvh * dim, (float*)ov + i * kvh * out_cap * dim,
              s, kvh, dim, out_cap, row_past);
  }
  uniun_ggml_round_half(qt.data, (float*)scratch, b * s * heads * dim);
  HeadTasks t = {(const float*)scratch, ok, ov, mask, keys, y, (int)s, (int)heads, (int)kvh,
                 (int)dim, (int)total, (int)out_cap, scale, rows, scratch + qbytes + kbytes,
                 each};
  return ort_parallel_for(ctx, head_task, tasks, &t);
}

const OpSpec op_ggml_attention =
    OP("GgmlAttention", 3, 0, attention_create, attention_compute, TYPE_FLOAT, TYPE_FLOAT,
       TYPE_FLOAT, TYPE_FLOAT, TYPE_FLOAT, TYPE_INT64, TYPE_FLOAT);
