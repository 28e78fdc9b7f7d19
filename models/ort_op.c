/* The helpers every operator stands on (ort_op.h). */
#include "ort_op.h"

#include <stdlib.h>

const OrtApi* uniun_ort_api;

OrtStatus* ort_status(int code, const char* msg) {
  return API_FN(SLOT_CreateStatus, CreateStatusFn)(code, msg);
}

/* ---- onnxruntime's callbacks, the same for every OpSpec --------------------------------- */

static const OpSpec* spec(const OrtCustomOp* op) { return (const OpSpec*)op; }

const char* ort_op_name(const OrtCustomOp* op) { return spec(op)->name; }
const char* ort_op_provider(const OrtCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
int ort_op_input_type(const OrtCustomOp* op, size_t i) { return spec(op)->input_types[i]; }
size_t ort_op_input_count(const OrtCustomOp* op) { return (size_t)spec(op)->inputs; }
int ort_op_output_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return TYPE_FLOAT; }
size_t ort_op_output_count(const OrtCustomOp* op) { return (size_t)spec(op)->outputs; }
int ort_op_memory_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
int ort_op_one(const OrtCustomOp* op) { (void)op; return 1; }

int ort_op_input_characteristic(const OrtCustomOp* op, size_t i) {
  return i + (size_t)spec(op)->optional >= (size_t)spec(op)->inputs ? ORT_OPTIONAL
                                                                     : ORT_REQUIRED;
}

int ort_op_output_characteristic(const OrtCustomOp* op, size_t i) {
  (void)op;
  (void)i;
  return ORT_REQUIRED;
}

OrtStatus* ort_op_create(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                         void** out) {
  (void)api;
  return spec(op)->create(info, out);
}

void ort_op_destroy(void* kernel) { free(kernel); }

/* ---- tensors ---------------------------------------------------------------------------- */

static OrtStatus* shape(const OrtValue* v, int64_t* dims, size_t* nd) {
  OrtTensorTypeAndShapeInfo* info;
  TRY(API_FN(SLOT_GetTensorTypeAndShape, GetTensorTypeAndShapeFn)(v, &info));
  size_t count = 0;
  OrtStatus* st = API_FN(SLOT_GetDimensionsCount, GetDimensionsCountFn)(info, &count);
  if (!st && count > 8)
    st = ort_status(ORT_INVALID_ARGUMENT, "uniun: a tensor with more than 8 dims");
  if (!st) st = API_FN(SLOT_GetDimensions, GetDimensionsFn)(info, dims, count);
  API_FN(SLOT_ReleaseTensorTypeAndShapeInfo, ReleaseTensorTypeAndShapeInfoFn)(info);
  *nd = count;
  return st;
}

static OrtStatus* data(const OrtValue* v, void** out) {
  return API_FN(SLOT_GetTensorMutableData, GetTensorMutableDataFn)((OrtValue*)v, out);
}

static OrtStatus* tensor(const OrtValue* v, Tensor* t) {
  TRY(shape(v, t->dims, &t->nd));
  return data(v, &t->data);
}

OrtStatus* ort_input(OrtKernelContext* ctx, size_t i, Tensor* t) {
  const OrtValue* v;
  TRY(API_FN(SLOT_KernelContext_GetInput, GetInputFn)(ctx, i, &v));
  return tensor(v, t);
}

OrtStatus* ort_optional_input(OrtKernelContext* ctx, size_t i, Tensor* t, int* present) {
  size_t count = 0;
  const OrtValue* v = NULL;
  *present = 0;
  TRY(API_FN(SLOT_KernelContext_GetInputCount, GetInputCountFn)(ctx, &count));
  if (i < count) TRY(API_FN(SLOT_KernelContext_GetInput, GetInputFn)(ctx, i, &v));
  if (!v) return NULL;
  *present = 1;
  return tensor(v, t);
}

OrtStatus* ort_output(OrtKernelContext* ctx, size_t i, const int64_t* dims, size_t nd,
                      void** out) {
  OrtValue* v;
  TRY(API_FN(SLOT_KernelContext_GetOutput, GetOutputFn)(ctx, i, dims, nd, &v));
  return data(v, out);
}

int64_t ort_elements(const int64_t* dims, size_t nd) {
  int64_t n = 1;
  for (size_t i = 0; i < nd; i++) n *= dims[i];
  return n;
}

OrtStatus* ort_scalar(OrtKernelContext* ctx, size_t i, const char* what, float* out) {
  Tensor t;
  TRY(ort_input(ctx, i, &t));
  if (ort_elements(t.dims, t.nd) != 1) return ort_status(ORT_INVALID_ARGUMENT, what);
  *out = *(const float*)t.data;
  return NULL;
}

/* ---- attributes ------------------------------------------------------------------------- */

OrtStatus* ort_attr_int(const OrtKernelInfo* info, const char* name, int64_t* out) {
  return API_FN(SLOT_KernelInfoGetAttribute_int64, GetIntFn)(info, name, out);
}

void ort_attr_int_or(const OrtKernelInfo* info, const char* name, int64_t fallback,
                     int64_t* out) {
  OrtStatus* absent = ort_attr_int(info, name, out);
  if (absent) {
    API_FN(SLOT_ReleaseStatus, ReleaseStatusFn)(absent);
    *out = fallback;
  }
}

OrtStatus* ort_attr_string(const OrtKernelInfo* info, const char* name, char* buf,
                           size_t size) {
  return API_FN(SLOT_KernelInfoGetAttribute_string, GetStringFn)(info, name, buf, &size);
}

/* ---- threads ---------------------------------------------------------------------------- */

OrtStatus* ort_parallel_for(OrtKernelContext* ctx, void (*fn)(void*, size_t), size_t tasks,
                            void* data) {
  return API_FN(SLOT_KernelContext_ParallelFor, ParallelForFn)(ctx, fn, tasks, 0, data);
}

/* One grow-only buffer per thread that runs sessions, shared by every operator: an
 * operator uses it only while its compute call runs on that thread (its ParallelFor
 * workers included), and one thread runs one operator at a time. Per-kernel buffers would
 * each be sized for a prefill pass (one per QMatMul node of the graph), and a fresh one
 * per call costs page faults. */
void* ort_scratch(size_t need) {
  static __thread void* buf;
  static __thread size_t size;
  if (need > size) {
    free(buf);
    buf = malloc(need);
    size = buf ? need : 0;
  }
  return buf;
}
