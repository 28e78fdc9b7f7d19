/* uniun.QMatMul as an onnxruntime operator (qmatmul.h):
 *
 *   QMatMul(X [..., K], W (uint8 blocks), R [..., N] optional) -> Y [..., N]
 *       attrs N, K, format (a qmatmul_format.c name), ggml (optional, 1: llama.cpp's order)
 *
 * W's blocks are read where onnxruntime keeps them (a mapped file: nothing is prepacked).
 * A call quantises X once, in this thread's scratch, then cuts the 16-row groups into up
 * to TASKS ranges for the session's intra-op pool.
 */
#include <stdlib.h>

#include "ort_op.h"
#include "qmatmul.h"

typedef struct {
  int fmt, n, k, ggml;
} Kernel;

typedef struct {
  const Job* job;
  int path, per_task, groups;
} Tasks;

#define TASKS 8 /* work items per call, shared out by onnxruntime's intra-op pool */

static void run_task(void* data, size_t index) {
  const Tasks* t = data;
  const int g0 = (int)index * t->per_task;
  const int g1 = g0 + t->per_task < t->groups ? g0 + t->per_task : t->groups;
  if (g0 < g1) qmm_run_groups(t->path, t->job, g0, g1);
}

static OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  const Kernel* kn = kernel;
  Tensor x, w, r;
  int has_r;
  TRY(ort_input(ctx, 0, &x));
  TRY(ort_input(ctx, 1, &w));
  TRY(ort_optional_input(ctx, 2, &r, &has_r));
  if (x.nd < 1 || x.dims[x.nd - 1] != kn->k)
    return ort_status(ORT_INVALID_ARGUMENT, "uniun.QMatMul: X's last dimension is not K");
  const int groups = (kn->n + GROUP - 1) / GROUP;
  if (ort_elements(w.dims, w.nd) !=
      (int64_t)groups * (kn->k / QK) * (int64_t)qmm_block_bytes(kn->fmt))
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.QMatMul: W's size does not match N, K, format");
  int64_t dims[8];
  memcpy(dims, x.dims, sizeof dims);
  dims[x.nd - 1] = kn->n;
  if (has_r && (r.nd != x.nd || memcmp(r.dims, dims, x.nd * sizeof(int64_t)) != 0))
    return ort_status(ORT_INVALID_ARGUMENT, "uniun.QMatMul: R's shape is not Y's");
  void* y;
  TRY(ort_output(ctx, 0, dims, x.nd, &y));
  const int64_t m = ort_elements(x.dims, x.nd - 1);
  if (m == 0) return NULL;

  void* scratch = ort_scratch(qmm_scratch_bytes((int)m, kn->k));
  if (!scratch) return ort_status(ORT_FAIL, "uniun.QMatMul: out of memory");
  const int path = qmm_path();
  QuantRow q = qmm_scratch_rows(scratch, (int)m, kn->k);
  qmm_quantize(path, x.data, (int)m, kn->k, q);
  Job job = {kn->fmt, w.data, kn->n, kn->k, (int)m, q.q, q.d, q.sum, q.sum16, q.s,
             q.lane128, has_r ? r.data : NULL, y, kn->ggml};
  const int tasks = groups < TASKS ? groups : TASKS;
  Tasks t = {&job, path, (groups + tasks - 1) / tasks, groups};
  return ort_parallel_for(ctx, run_task, (size_t)tasks, &t);
}

static OrtStatus* create(const OrtKernelInfo* info, void** out) {
  int64_t n = 0, k = 0, ggml = 0;
  char name[16] = {0};
  TRY(ort_attr_int(info, "N", &n));
  TRY(ort_attr_int(info, "K", &k));
  TRY(ort_attr_string(info, "format", name, sizeof name));
  const int fmt = qmm_format_named(name);
  if (fmt < 0)
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.QMatMul: format is not q4_0, q4_1, q8_0, q4_0f, q4_1f, q8_0f, "
                      "q8_1f or q8_0h");
  if (n <= 0 || k <= 0 || k % QK || n > (1 << 30) || k > (1 << 20))
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.QMatMul: bad N or K (K must be a multiple of 32)");
  ort_attr_int_or(info, "ggml", 0, &ggml);
  if (ggml && !qmm_ggml_format(fmt))
    return ort_status(ORT_INVALID_ARGUMENT,
                      "uniun.QMatMul: ggml=1 takes formats q4_1 and q8_0");
  Kernel* kn = calloc(1, sizeof *kn);
  if (!kn) return ort_status(ORT_FAIL, "uniun.QMatMul: out of memory");
  *kn = (Kernel){fmt, (int)n, (int)k, ggml != 0};
  *out = kn;
  return NULL;
}

const OpSpec op_qmatmul = OP("QMatMul", 1, 1, create, compute, TYPE_FLOAT, TYPE_UINT8,
                             TYPE_FLOAT);
