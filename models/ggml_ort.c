/* The ggml-arithmetic operators (models/ggml_ops.c) as onnxruntime custom operators, in the
 * "uniun" domain next to QMatMul:
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
 * Scalars arrive as one-element float inputs (initializers), not attributes: every
 * onnxruntime reads those the same way, and only int64 attributes are read here.
 */
#include <stdlib.h>
#include <string.h>

#include "ggml_ops.h"
#include "ort_abi.h"

#define TYPE_INT64 7
#define MAX_IN 7

typedef struct OpSpec {
  OrtCustomOp base; /* first: onnxruntime hands the callbacks &base */
  const char* name;
  int inputs, outputs;
  int input_types[MAX_IN];
  OrtStatus* (*create)(const OrtKernelInfo*, void**);
  OrtStatus* (*compute)(void*, OrtKernelContext*);
} OpSpec;

static const OpSpec* spec(const OrtCustomOp* op) { return (const OpSpec*)op; }
static const char* op_name(const OrtCustomOp* op) { return spec(op)->name; }
static const char* op_provider(const OrtCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int op_input_type(const OrtCustomOp* op, size_t i) { return spec(op)->input_types[i]; }
static size_t op_input_count(const OrtCustomOp* op) { return (size_t)spec(op)->inputs; }
static int op_output_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return TYPE_FLOAT; }
static size_t op_output_count(const OrtCustomOp* op) { return (size_t)spec(op)->outputs; }
static int op_required(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int op_memory_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int op_one(const OrtCustomOp* op) { (void)op; return 1; }
static OrtStatus* op_create(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                            void** out) {
  (void)api;
  return spec(op)->create(info, out);
}

/* Every kernel starts with its op's spec (op_compute finds the compute function there). */
typedef struct {
  const OpSpec* op;
  int64_t heads, kv_heads, interleaved;
} Kernel;

static void op_destroy(void* kernel) { free(kernel); }

static OrtStatus* op_compute(void* kernel, OrtKernelContext* ctx) {
  return ((const Kernel*)kernel)->op->compute(kernel, ctx);
}

#define OP(NAME, OUTPUTS, CREATE, COMPUTE, ...)                                              \
  {{OP_STRUCT_VERSION, NULL, op_name, op_provider, op_input_type, op_input_count,            \
    op_output_type, op_output_count, NULL, op_destroy, op_required, op_required,              \
    op_memory_type, op_one, op_one, op_one, op_one, op_create, op_compute, NULL},             \
   NAME, sizeof((int[]){__VA_ARGS__}) / sizeof(int), OUTPUTS, {__VA_ARGS__}, CREATE, COMPUTE}

/* One input or output: its shape and its data. */
typedef struct {
  int64_t dims[8];
  size_t nd;
  void* data;
} Tensor;

static OrtStatus* input(OrtKernelContext* ctx, size_t i, Tensor* t) {
  const OrtValue* v;
  TRY(API_FN(SLOT_KernelContext_GetInput, GetInputFn)(ctx, i, &v));
  TRY(tensor_shape(v, t->dims, &t->nd));
  return tensor_data(v, &t->data);
}

static OrtStatus* output(OrtKernelContext* ctx, size_t i, const int64_t* dims, size_t nd,
                         void** data) {
  OrtValue* v;
  TRY(API_FN(SLOT_KernelContext_GetOutput, GetOutputFn)(ctx, i, dims, nd, &v));
  return tensor_data(v, data);
}

static int64_t elements(const int64_t* dims, size_t nd) {
  int64_t n = 1;
  for (size_t i = 0; i < nd; i++) n *= dims[i];
  return n;
}

/* a one-element float input */
static OrtStatus* scalar(OrtKernelContext* ctx, size_t i, const char* what, float* out) {
  Tensor t;
  TRY(input(ctx, i, &t));
  if (elements(t.dims, t.nd) != 1) return status(ORT_INVALID_ARGUMENT, what);
  *out = *(const float*)t.data;
  return NULL;
}

static OrtStatus* attr(const OrtKernelInfo* info, const char* name, int64_t* out) {
  return API_FN(SLOT_KernelInfoGetAttribute_int64, GetIntFn)(info, name, out);
}

static OrtStatus* new_kernel(const OpSpec* op, Kernel** out) {
  *out = NULL;
  if (!uniun_ggml_supported())
    return status(ORT_FAIL, "uniun: the ggml operators need a CPU with AVX2, FMA and F16C; "
                            "convert the model again here (it then uses the usual graph)");
  *out = calloc(1, sizeof(Kernel));
  if (!*out) return status(ORT_FAIL, "uniun: out of memory");
  (*out)->op = op;
  return NULL;
}

/* ---- GgmlRmsNorm ----------------------------------------------------------------------- */

static const OpSpec rms_norm_op;

static OrtStatus* rms_norm_create(const OrtKernelInfo* info, void** out) {
  (void)info;
  return new_kernel(&rms_norm_op, (Kernel**)out);
}

static OrtStatus* rms_norm_compute(void* kernel, OrtKernelContext* ctx) {
  (void)kernel;
  Tensor x, w;
  float eps;
  void* y;
  TRY(input(ctx, 0, &x));
  TRY(input(ctx, 1, &w));
  TRY(scalar(ctx, 2, "uniun.GgmlRmsNorm: epsilon is not one float", &eps));
  if (x.nd < 1 || elements(w.dims, w.nd) != x.dims[x.nd - 1])
    return status(ORT_INVALID_ARGUMENT, "uniun.GgmlRmsNorm: W's size is not X's last axis");
  TRY(output(ctx, 0, x.dims, x.nd, &y));
  const int n = (int)x.dims[x.nd - 1];
  if (n > 0) uniun_ggml_rms_norm(x.data, w.data, y, elements(x.dims, x.nd) / n, n, eps);
  return NULL;
}

static const OpSpec rms_norm_op = OP("GgmlRmsNorm", 1, rms_norm_create, rms_norm_compute,
                                     TYPE_FLOAT, TYPE_FLOAT, TYPE_FLOAT);

/* ---- GgmlRope -------------------------------------------------------------------------- */

static const OpSpec rope_op;

static OrtStatus* rope_create(const OrtKernelInfo* info, void** out) {
  Kernel* k;
  TRY(new_kernel(&rope_op, &k));
  OrtStatus* st = attr(info, "num_heads", &k->heads);
  if (!st) st = attr(info, "interleaved", &k->interleaved);
  if (!st && k->heads <= 0) st = status(ORT_INVALID_ARGUMENT, "uniun.GgmlRope: num_heads <= 0");
  if (st) free(k);
  *out = st ? NULL : k;
  return st;
}

static OrtStatus* rope_compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel* kn = kernel;
  Tensor x, pos;
  float base;
  void* y;
  TRY(input(ctx, 0, &x));
  TRY(input(ctx, 1, &pos));
  TRY(scalar(ctx, 2, "uniun.GgmlRope: base is not one float", &base));
  if (x.nd != 3 || x.dims[2] % kn->heads || (x.dims[2] / kn->heads) % 2)
    return status(ORT_INVALID_ARGUMENT, "uniun.GgmlRope: X is not [b, s, heads * even dim]");
  if (pos.nd != 2 || pos.dims[0] != x.dims[0] || pos.dims[1] != x.dims[1])
    return status(ORT_INVALID_ARGUMENT, "uniun.GgmlRope: position_ids is not [b, s]");
  TRY(output(ctx, 0, x.dims, x.nd, &y));
  uniun_ggml_rope(x.data, pos.data, y, x.dims[0] * x.dims[1], (int)kn->heads,
                  (int)(x.dims[2] / kn->heads), base, (int)kn->interleaved);
  return NULL;
}

static const OpSpec rope_op = OP("GgmlRope", 1, rope_create, rope_compute, TYPE_FLOAT,
                                 TYPE_INT64, TYPE_FLOAT);

/* ---- GgmlSwiGlu ------------------------------------------------------------------------ */

static const OpSpec swiglu_op;

static OrtStatus* swiglu_create(const OrtKernelInfo* info, void** out) {
  (void)info;
  return new_kernel(&swiglu_op, (Kernel**)out);
}

static OrtStatus* swiglu_compute(void* kernel, OrtKernelContext* ctx) {
  (void)kernel;
  Tensor g, u;
  void* y;
  TRY(input(ctx, 0, &g));
  TRY(input(ctx, 1, &u));
  if (g.nd != u.nd || memcmp(g.dims, u.dims, g.nd * sizeof(int64_t)) != 0)
    return status(ORT_INVALID_ARGUMENT, "uniun.GgmlSwiGlu: G and U differ in shape");
  TRY(output(ctx, 0, g.dims, g.nd, &y));
  /* ggml runs its vector loop per row: the scalar tail is per row too */
  const int64_t row = g.nd ? g.dims[g.nd - 1] : 1;
  for (int64_t r = 0; row > 0 && r < elements(g.dims, g.nd) / row; r++)
    uniun_ggml_swiglu((const float*)g.data + r * row, (const float*)u.data + r * row,
                      (float*)y + r * row, row);
  return NULL;
}

static const OpSpec swiglu_op = OP("GgmlSwiGlu", 1, swiglu_create, swiglu_compute, TYPE_FLOAT,
                                   TYPE_FLOAT);

/* ---- GgmlAttention --------------------------------------------------------------------- */

static const OpSpec attention_op;

static OrtStatus* attention_create(const OrtKernelInfo* info, void** out) {
  Kernel* k;
  TRY(new_kernel(&attention_op, &k));
  OrtStatus* st = attr(info, "num_heads", &k->heads);
  if (!st) st = attr(info, "kv_num_heads", &k->kv_heads);
  if (!st && (k->heads <= 0 || k->kv_heads <= 0 || k->heads % k->kv_heads))
    st = status(ORT_INVALID_ARGUMENT,
                "uniun.GgmlAttention: num_heads must be a multiple of kv_num_heads > 0");
  if (st) free(k);
  *out = st ? NULL : k;
  return st;
}

typedef struct {
  const float *q, *k, *v;
  const int64_t* open;
  float* out;
  int tokens, heads, kv_heads, dim, keys, stride, past;
  float scale;
  int rows; /* queries per task: a prefill's heads are split further, for 2+ threads */
  char* scratch;
  size_t scratch_each;
} HeadTasks;

#define ROWS_PER_TASK 16

static void head_task(void* data, size_t i) {
  const HeadTasks* t = data;
  const int blocks = (t->tokens + t->rows - 1) / t->rows;
  const int h = (int)i / blocks, t0 = (int)i % blocks * t->rows;
  const int t1 = t0 + t->rows < t->tokens ? t0 + t->rows : t->tokens;
  uniun_ggml_attention(t->q, t->k, t->v, t->open, t->out, t->tokens, t->heads, t->kv_heads,
                       t->dim, t->keys, t->stride, t->past, t->scale, h, h + 1, t0, t1,
                       t->scratch + i * t->scratch_each);
}

/* new [b, s, kv_heads * dim] -> rows past .. past + s - 1 of present [b, kv_heads, cap, dim],
 * rounded to fp16 as llama.cpp's cache stores them */
static void store_new(const float* x, float* present, int64_t b, int64_t s, int64_t kvh,
                      int64_t dim, int64_t cap, int64_t past) {
  for (int64_t i = 0; i < b; i++)
    for (int64_t t = 0; t < s; t++)
      for (int64_t h = 0; h < kvh; h++)
        uniun_ggml_round_half(x + ((i * s + t) * kvh + h) * dim,
                              present + ((i * kvh + h) * cap + past + t) * dim, dim);
}

static OrtStatus* attention_compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel* kn = kernel;
  Tensor qt, kt, vt, pkt, pvt, mt;
  float scale;
  TRY(input(ctx, 0, &qt));
  TRY(input(ctx, 1, &kt));
  TRY(input(ctx, 2, &vt));
  TRY(input(ctx, 3, &pkt));
  TRY(input(ctx, 4, &pvt));
  TRY(input(ctx, 5, &mt));
  TRY(scalar(ctx, 6, "uniun.GgmlAttention: scale is not one float", &scale));
  const int64_t heads = kn->heads, kvh = kn->kv_heads;
  const int64_t *qd = qt.dims, *kd = kt.dims, *pd = pkt.dims, *md = mt.dims;
  if (qt.nd != 3 || qd[2] % heads)
    return status(ORT_INVALID_ARGUMENT, "uniun.GgmlAttention: Q is not [b, s, heads * dim]");
  const int64_t b = qd[0], s = qd[1], dim = qd[2] / heads;
  if (dim % 16)
    return status(ORT_INVALID_ARGUMENT, "uniun.GgmlAttention: head dim is not a multiple of 16");
  if (kt.nd != 3 || vt.nd != 3 || kd[0] != b || kd[1] != s || kd[2] != kvh * dim ||
      memcmp(kd, vt.dims, sizeof kd[0] * 3) != 0)
    return status(ORT_INVALID_ARGUMENT,
                  "uniun.GgmlAttention: K and V are not [b, s, kv_heads * dim]");
  if (pkt.nd != 4 || pvt.nd != 4 || pd[0] != b || pd[1] != kvh || pd[3] != dim ||
      memcmp(pd, pvt.dims, sizeof pd[0] * 4) != 0)
    return status(ORT_INVALID_ARGUMENT,
                  "uniun.GgmlAttention: past key and value are not [b, kv_heads, n, dim]");
  if (mt.nd != 2 || md[0] != b || md[1] < s)
    return status(ORT_INVALID_ARGUMENT,
                  "uniun.GgmlAttention: attention_mask is not [b, past + s]");
  const int64_t total = md[1], past = total - s, cap = pd[2];
  if (cap < past)
    return status(ORT_INVALID_ARGUMENT,
                  "uniun.GgmlAttention: past holds fewer positions than attention_mask says");
  /* in place (a preallocated buffer: capacity >= total) or concatenated */
  const int64_t out_cap = cap >= total ? cap : total;
  const int64_t present_dims[4] = {b, kvh, out_cap, dim};
  void *y, *ok, *ov;
  TRY(output(ctx, 0, qd, 3, &y));
  TRY(output(ctx, 1, present_dims, 4, &ok));
  TRY(output(ctx, 2, present_dims, 4, &ov));
  if (b == 0 || s == 0) return NULL;
  const void* pasts[2] = {pkt.data, pvt.data};
  void* presents[2] = {ok, ov};
  for (int i = 0; i < 2; i++)
    if (presents[i] != pasts[i] && past > 0)
      for (int64_t r = 0; r < b * kvh; r++)
        memcpy((float*)presents[i] + r * out_cap * dim, (const float*)pasts[i] + r * cap * dim,
               sizeof(float) * past * dim);
  store_new(kt.data, ok, b, s, kvh, dim, out_cap, past);
  store_new(vt.data, ov, b, s, kvh, dim, out_cap, past);

  const size_t each = uniun_ggml_attention_scratch((int)total, (int)dim);
  const size_t qbytes = sizeof(float) * s * heads * dim;
  const int rows = s < ROWS_PER_TASK ? (int)s : ROWS_PER_TASK;
  const size_t tasks = (size_t)heads * (size_t)((s + rows - 1) / rows);
  char* scratch = uniun_thread_scratch(qbytes + each * tasks);
  if (!scratch) return status(ORT_FAIL, "uniun.GgmlAttention: out of memory");
  OrtStatus* st = NULL;
  for (int64_t i = 0; i < b && !st; i++) {
    float* q16 = (float*)scratch;
    uniun_ggml_round_half((const float*)qt.data + i * s * heads * dim, q16, s * heads * dim);
    HeadTasks t = {q16, (const float*)ok + i * kvh * out_cap * dim,
                   (const float*)ov + i * kvh * out_cap * dim, (const int64_t*)mt.data + i * total,
                   (float*)y + i * s * heads * dim, (int)s, (int)heads, (int)kvh, (int)dim,
                   (int)total, (int)out_cap, (int)past, scale, rows, scratch + qbytes, each};
    st = API_FN(SLOT_KernelContext_ParallelFor, ParallelForFn)(ctx, head_task, tasks, 0, &t);
  }
  return st;
}

static const OpSpec attention_op =
    OP("GgmlAttention", 3, attention_create, attention_compute, TYPE_FLOAT, TYPE_FLOAT,
       TYPE_FLOAT, TYPE_FLOAT, TYPE_FLOAT, TYPE_INT64, TYPE_FLOAT);

const OrtCustomOp* const* uniun_ggml_ort_ops(size_t* count) {
  static const OrtCustomOp* const ops[] = {&rms_norm_op.base, &rope_op.base, &swiglu_op.base,
                                           &attention_op.base};
  *count = sizeof ops / sizeof ops[0];
  return ops;
}
