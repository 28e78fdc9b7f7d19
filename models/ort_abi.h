/* The part of onnxruntime's C API our custom operators use, declared by hand.
 *
 * Why by hand: the onnxruntime wheel ships no C headers, and its C API is a function
 * table (OrtApi) that only ever grows: a slot, once released, keeps its index. So the
 * few functions used are called by slot index (onnxruntime_c_api.h, struct OrtApi, in
 * order), and registration checks a known slot (GetBuildInfoString) before trusting the
 * table (ort_library.c). Types and slots only: calling them is ort_op.h's job.
 */
#ifndef UNIUN_ORT_ABI_H
#define UNIUN_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtApi OrtApi;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtShapeInferContext OrtShapeInferContext;

typedef struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

/* onnxruntime's OrtCustomOp as of API version 16 (we fill the v16 fields only). */
typedef struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const struct OrtCustomOp*, const OrtApi*, const OrtKernelInfo*);
  const char* (*GetName)(const struct OrtCustomOp*);
  const char* (*GetExecutionProviderType)(const struct OrtCustomOp*);
  int (*GetInputType)(const struct OrtCustomOp*, size_t);
  size_t (*GetInputTypeCount)(const struct OrtCustomOp*);
  int (*GetOutputType)(const struct OrtCustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const struct OrtCustomOp*);
  void (*KernelCompute)(void*, OrtKernelContext*);
  void (*KernelDestroy)(void*);
  int (*GetInputCharacteristic)(const struct OrtCustomOp*, size_t);
  int (*GetOutputCharacteristic)(const struct OrtCustomOp*, size_t);
  int (*GetInputMemoryType)(const struct OrtCustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const struct OrtCustomOp*);
  int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp*);
  int (*GetVariadicOutputMinArity)(const struct OrtCustomOp*);
  int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp*);
  OrtStatus* (*CreateKernelV2)(const struct OrtCustomOp*, const OrtApi*, const OrtKernelInfo*,
                               void**);
  OrtStatus* (*KernelComputeV2)(void*, OrtKernelContext*);
  OrtStatus* (*InferOutputShapeFn)(const struct OrtCustomOp*, OrtShapeInferContext*);
} OrtCustomOp;

#define ORT_API_VERSION_USED 17 /* onnxruntime 1.17+: KernelContext_ParallelFor */
#define OP_STRUCT_VERSION 16    /* CreateKernelV2 / KernelComputeV2 return a status */
#define TYPE_FLOAT 1            /* ONNXTensorElementDataType */
#define TYPE_UINT8 2
#define TYPE_INT64 7
#define ORT_FAIL 1              /* OrtErrorCode */
#define ORT_INVALID_ARGUMENT 2
#define ORT_REQUIRED 0          /* OrtCustomOpInputOutputCharacteristic */
#define ORT_OPTIONAL 1

/* Slots of the OrtApi function table (onnxruntime_c_api.h, struct OrtApi, in order), and
 * each one's type. */
enum {
  SLOT_CreateStatus = 0,
  SLOT_CreateCustomOpDomain = 26,
  SLOT_CustomOpDomain_Add = 27,
  SLOT_AddCustomOpDomain = 28,
  SLOT_GetTensorMutableData = 51,
  SLOT_GetDimensionsCount = 61,
  SLOT_GetDimensions = 62,
  SLOT_GetTensorTypeAndShape = 65,
  SLOT_KernelInfoGetAttribute_int64 = 86,
  SLOT_KernelInfoGetAttribute_string = 87,
  SLOT_KernelContext_GetInputCount = 88,
  SLOT_KernelContext_GetInput = 90,
  SLOT_KernelContext_GetOutput = 91,
  SLOT_ReleaseStatus = 93,
  SLOT_ReleaseTensorTypeAndShapeInfo = 99,
  SLOT_GetBuildInfoString = 254,
  SLOT_KernelContext_ParallelFor = 274,
};

typedef OrtStatus* (*CreateStatusFn)(int, const char*);
typedef OrtStatus* (*CreateCustomOpDomainFn)(const char*, OrtCustomOpDomain**);
typedef OrtStatus* (*CustomOpDomainAddFn)(OrtCustomOpDomain*, const OrtCustomOp*);
typedef OrtStatus* (*AddCustomOpDomainFn)(OrtSessionOptions*, OrtCustomOpDomain*);
typedef OrtStatus* (*GetTensorMutableDataFn)(OrtValue*, void**);
typedef OrtStatus* (*GetDimensionsCountFn)(const OrtTensorTypeAndShapeInfo*, size_t*);
typedef OrtStatus* (*GetDimensionsFn)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t);
typedef OrtStatus* (*GetTensorTypeAndShapeFn)(const OrtValue*, OrtTensorTypeAndShapeInfo**);
typedef OrtStatus* (*GetIntFn)(const OrtKernelInfo*, const char*, int64_t*);
typedef OrtStatus* (*GetStringFn)(const OrtKernelInfo*, const char*, char*, size_t*);
typedef OrtStatus* (*GetInputCountFn)(const OrtKernelContext*, size_t*);
typedef OrtStatus* (*GetInputFn)(const OrtKernelContext*, size_t, const OrtValue**);
typedef OrtStatus* (*GetOutputFn)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**);
typedef void (*ReleaseStatusFn)(OrtStatus*);
typedef void (*ReleaseTensorTypeAndShapeInfoFn)(OrtTensorTypeAndShapeInfo*);
typedef const char* (*GetBuildInfoStringFn)(void);
typedef OrtStatus* (*ParallelForFn)(const OrtKernelContext*, void (*)(void*, size_t), size_t,
                                    size_t, void*);

#endif
