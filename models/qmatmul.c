/* Which QMatMul kernel a call runs, and the call itself for tests and benchmarks.
 *
 * A path is an isa.h level: the quantisation and the kernel of one call both run it, and
 * a path this CPU lacks is refused, never approximated. */
#include <stdlib.h>

#include "qmatmul.h"

int qmm_supports(int path) { return path >= ISA_SCALAR && uniun_isa_supports(path); }

int qmm_path(void) { return uniun_isa_level(); }

void qmm_run_groups(int path, const Job* j, int g0, int g1) {
  (void)path; /* without x86 variants, every path is the portable one */
  if (j->ggml) {
#ifdef UNIUN_X86
    if (path == ISA_AVX512) {
      qmm_groups_ggml_avx512(j, g0, g1);
      return;
    }
    if (path == ISA_AVX2) {
      qmm_groups_ggml_avx2(j, g0, g1);
      return;
    }
#endif
    qmm_groups_ggml_scalar(j, g0, g1);
    return;
  }
#ifdef UNIUN_X86
  if (path == ISA_AVX512) {
    qmm_groups_avx512(j, g0, g1);
    return;
  }
  if (path == ISA_AVX2) {
    qmm_groups_avx2(j, g0, g1);
    return;
  }
#endif
  qmm_groups_scalar(j, g0, g1);
}

/* For tests and benchmarks (ctypes): one call, single-threaded, on a chosen path (-1: the
 * level calls run now, uniun_isa_level()). Returns 0, or -1 for a bad argument or a path
 * this CPU lacks. */
EXPORT int uniun_qmatmul(int fmt, int path, const uint8_t* w, int n, int k, const float* x,
                         int m, const float* r, float* y, int ggml) {
  if (qmm_block_bytes(fmt) == 0 || n <= 0 || k <= 0 || k % QK || m < 0) return -1;
  if (ggml && !qmm_ggml_format(fmt)) return -1;
  if (path < 0) path = qmm_path();
  if (!qmm_supports(path)) return -1;
  if (m == 0) return 0;
  void* buf = malloc(qmm_scratch_bytes(m, k));
  if (!buf) return -1;
  QuantRow q = qmm_scratch_rows(buf, m, k);
  qmm_quantize(path, x, m, k, q);
  Job j = {fmt, w, n, k, m, q.q, q.d, q.sum, q.sum16, q.s, q.lane128, r, y, ggml};
  qmm_run_groups(path, &j, 0, (n + GROUP - 1) / GROUP);
  free(buf);
  return 0;
}

EXPORT size_t uniun_qmatmul_block_bytes(int fmt) { return qmm_block_bytes(fmt); }
