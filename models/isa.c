/* Which instruction-set level the kernels run (isa.h). The CPU is asked once; the forced
 * level is one word read at the start of each kernel call, so forcing needs no lock. */
#include "isa.h"

#include <stdlib.h>
#include <string.h>

static int cpu_has(int level) {
  if (level == ISA_SCALAR) return 1;
#ifdef UNIUN_X86
  __builtin_cpu_init();
  const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c");
  if (level == ISA_AVX2) return avx2;
  if (level == ISA_AVX512)
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
#endif
  return 0;
}

EXPORT int uniun_isa_supports(int level) { return cpu_has(level); }

EXPORT int uniun_isa_best(void) {
  return cpu_has(ISA_AVX512) ? ISA_AVX512 : cpu_has(ISA_AVX2) ? ISA_AVX2 : ISA_SCALAR;
}

/* UNIUN_ISA's level where this CPU has it, else the best */
static int default_level(void) {
  static const char* const names[] = {"scalar", "avx2", "avx512"};
  const char* want = getenv("UNIUN_ISA");
  for (int level = 0; want && level <= ISA_AVX512; level++)
    if (!strcmp(want, names[level]) && cpu_has(level)) return level;
  return uniun_isa_best();
}

#define UNSET (-1)
static int forced = UNSET;   /* uniun_isa_force's level */
static int initial = UNSET;  /* default_level(), once asked */

EXPORT int uniun_isa_level(void) {
  const int level = __atomic_load_n(&forced, __ATOMIC_RELAXED);
  if (level != UNSET) return level;
  int found = __atomic_load_n(&initial, __ATOMIC_RELAXED);
  if (found == UNSET) { /* two threads may both look: they find the same */
    found = default_level();
    __atomic_store_n(&initial, found, __ATOMIC_RELAXED);
  }
  return found;
}

EXPORT int uniun_isa_force(int level) {
  if (level != UNSET && (level < ISA_SCALAR || level > ISA_AVX512 || !cpu_has(level)))
    return -1;
  __atomic_store_n(&forced, level, __ATOMIC_RELAXED);
  return 0;
}
