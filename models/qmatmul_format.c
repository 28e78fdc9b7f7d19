/* QMatMul's formats: the table made from QMM_FORMATS (qmatmul.h), block sizes and names. */
#include "qmatmul.h"

#define AS_ROW(id, name, bits, zp, f32, offset, halves) {name, bits, zp, f32, offset, halves},
const Format qmm_formats[N_FORMATS] = {QMM_FORMATS(AS_ROW)};

size_t qmm_block_bytes(int fmt) {
  if (fmt < 0 || fmt >= N_FORMATS) return 0;
  const Format* f = &qmm_formats[fmt];
  return qmm_code_bytes(f) + qmm_scale_bytes(f) * (f->offset || f->halves ? 2 : 1);
}

int qmm_format_named(const char* name) {
  for (int i = 0; i < N_FORMATS; i++)
    if (!strcmp(name, qmm_formats[i].name)) return i;
  return -1;
}

int qmm_ggml_format(int fmt) { return fmt == FMT_Q4_1 || fmt == FMT_Q8_0; }
