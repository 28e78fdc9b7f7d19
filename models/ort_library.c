/* The library's entry point: onnxruntime calls RegisterCustomOps when a session's options
 * register the library (SessionOptions.register_custom_ops_library). It takes the API
 * table, checks it, and adds the "uniun" domain with every operator to the options. */
#include <string.h>

#include "ort_op.h"

static const OpSpec* const OPERATORS[] = {
    &op_qmatmul, &op_ggml_rms_norm, &op_ggml_rope, &op_ggml_swiglu, &op_ggml_attention,
};

static OrtCustomOpDomain* domain; /* made once, shared by every session of the process */

__attribute__((visibility("default")))
OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(ORT_API_VERSION_USED);
  if (!api) return NULL; /* too old: the session then refuses the graph, naming the op */
  uniun_ort_api = api;
  const char* build = API_FN(SLOT_GetBuildInfoString, GetBuildInfoStringFn)();
  if (!build || strncmp(build, "ORT Build Info", 14) != 0)
    return ort_status(ORT_FAIL,
                      "uniun: this onnxruntime's C API table is not the expected one");
  if (!domain) {
    TRY(API_FN(SLOT_CreateCustomOpDomain, CreateCustomOpDomainFn)("uniun", &domain));
    for (size_t i = 0; i < sizeof OPERATORS / sizeof OPERATORS[0]; i++)
      TRY(API_FN(SLOT_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &OPERATORS[i]->base));
  }
  return API_FN(SLOT_AddCustomOpDomain, AddCustomOpDomainFn)(options, domain);
}
