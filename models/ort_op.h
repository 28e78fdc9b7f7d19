/* What every onnxruntime operator of the library stands on: the API handle and its
 * statuses, an operator's description (OpSpec), its tensors (Tensor: shape and data, one
 * call per input or output), its attributes, and the per-thread scratch. The operators
 * (qmatmul_ort.c, ggml_ort.c) are written on these alone; ort_library.c registers them.
 */
#ifndef UNIUN_ORT_OP_H
#define UNIUN_ORT_OP_H

#include "ort_abi.h"

/* set once, by RegisterCustomOps (ort_library.c), before any operator runs */
extern const OrtApi* uniun_ort_api;

#define API_FN(slot, type) ((type)((void* const*)uniun_ort_api)[slot])

OrtStatus* ort_status(int code, const char* msg);

#define TRY(call)                   \
  do {                              \
    OrtStatus* st_ = (call);        \
    if (st_) return st_;            \
  } while (0)

/* ---- an operator ------------------------------------------------------------------------ */

#define MAX_IN 7

/* One operator: onnxruntime's callbacks (base, all filled by OP below) and what they read.
 * Inputs are `inputs` tensors of input_types, the last `optional` of which a graph may leave
 * out; outputs are `outputs` float tensors. create reads a node's attributes into a kernel
 * (freed with free()); the kernel's compute runs the node. */
typedef struct OpSpec {
  OrtCustomOp base; /* first: onnxruntime hands the callbacks &base */
  const char* name;
  int inputs, optional, outputs;
  int input_types[MAX_IN];
  OrtStatus* (*create)(const OrtKernelInfo* info, void** kernel);
} OpSpec;

const char* ort_op_name(const OrtCustomOp* op);
const char* ort_op_provider(const OrtCustomOp* op);
int ort_op_input_type(const OrtCustomOp* op, size_t i);
size_t ort_op_input_count(const OrtCustomOp* op);
int ort_op_output_type(const OrtCustomOp* op, size_t i);
size_t ort_op_output_count(const OrtCustomOp* op);
int ort_op_input_characteristic(const OrtCustomOp* op, size_t i);
int ort_op_output_characteristic(const OrtCustomOp* op, size_t i);
int ort_op_memory_type(const OrtCustomOp* op, size_t i);
int ort_op_one(const OrtCustomOp* op);
OrtStatus* ort_op_create(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                         void** out);
void ort_op_destroy(void* kernel);

/* OP("Name", outputs, optional inputs, create, compute, input types...) */
#define OP(NAME, OUTPUTS, OPTIONAL, CREATE, COMPUTE, ...)                                     \
  {{OP_STRUCT_VERSION, NULL, ort_op_name, ort_op_provider, ort_op_input_type,                  \
    ort_op_input_count, ort_op_output_type, ort_op_output_count, NULL, ort_op_destroy,          \
    ort_op_input_characteristic, ort_op_output_characteristic, ort_op_memory_type, ort_op_one,  \
    ort_op_one, ort_op_one, ort_op_one, ort_op_create, COMPUTE, NULL},                          \
   NAME, sizeof((int[]){__VA_ARGS__}) / sizeof(int), OPTIONAL, OUTPUTS, {__VA_ARGS__}, CREATE}

/* The operators, each defined in its own file, all registered by ort_library.c. */
extern const OpSpec op_qmatmul;                        /* qmatmul_ort.c */
extern const OpSpec op_ggml_rms_norm, op_ggml_rope,    /* ggml_ort.c */
    op_ggml_swiglu, op_ggml_attention;

/* ---- its tensors and attributes --------------------------------------------------------- */

/* One input or output: its shape and its data. */
typedef struct {
  int64_t dims[8];
  size_t nd;
  void* data;
} Tensor;

OrtStatus* ort_input(OrtKernelContext* ctx, size_t i, Tensor* t);

/* An optional input: *present is 0 (and t untouched) where the node leaves it out. */
OrtStatus* ort_optional_input(OrtKernelContext* ctx, size_t i, Tensor* t, int* present);

OrtStatus* ort_output(OrtKernelContext* ctx, size_t i, const int64_t* dims, size_t nd,
                      void** data);

/* A one-element float input; `what` is the error when it is not one. */
OrtStatus* ort_scalar(OrtKernelContext* ctx, size_t i, const char* what, float* out);

int64_t ort_elements(const int64_t* dims, size_t nd);

OrtStatus* ort_attr_int(const OrtKernelInfo* info, const char* name, int64_t* out);

/* An optional int attribute: `fallback` where the node has none. */
void ort_attr_int_or(const OrtKernelInfo* info, const char* name, int64_t fallback,
                     int64_t* out);

/* A string attribute into buf (size bytes, its terminating zero included). */
OrtStatus* ort_attr_string(const OrtKernelInfo* info, const char* name, char* buf,
                           size_t size);

/* fn(data, 0 .. tasks - 1) on the session's intra-op threads, this one included. */
OrtStatus* ort_parallel_for(OrtKernelContext* ctx, void (*fn)(void*, size_t), size_t tasks,
                            void* data);

/* This thread's scratch buffer, at least `need` bytes, or NULL (out of memory). */
void* ort_scratch(size_t need);

#endif
