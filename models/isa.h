/* The instruction-set levels the library's kernels come in, and which one a call runs.
 *
 * Levels are ordered, each a set of x86-64 features that includes the one below:
 *   ISA_SCALAR  portable C, any CPU;
 *   ISA_AVX2    AVX2, FMA and F16C (x86-64-v3);
 *   ISA_AVX512  those plus AVX-512 F, BW, VL, DQ and VNNI.
 * Every kernel runs its best variant at or below uniun_isa_level(): the best level this
 * CPU has, unless a lower one is forced (UNIUN_ISA=scalar|avx2|avx512 in the environment,
 * read once; uniun_isa_force() at run time). Forcing is how one AVX-512 machine runs, and
 * the tests compare, every variant of every kernel. A kernel without a variant at the
 * forced level runs the next one down (QMatMul's llama.cpp order at ISA_AVX2: its portable
 * loop); the ggml operators have no portable variant and keep their AVX2 one.
 */
#ifndef UNIUN_ISA_H
#define UNIUN_ISA_H

#define EXPORT __attribute__((visibility("default")))

/* The x86-64 variants are compiled in on x86-64 unless UNIUN_PORTABLE_ONLY is defined: the
 * tests build the library that way too, to check it as a CPU without x86 gets it. */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(UNIUN_PORTABLE_ONLY)
#define UNIUN_X86 1
#endif

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* Whether this CPU has `level` (0, 1 or 2). */
int uniun_isa_supports(int level);

/* The highest level this CPU has. */
int uniun_isa_best(void);

/* The level kernel calls run now: the forced one, else UNIUN_ISA's, else the best. */
int uniun_isa_level(void);

/* Force `level` for the calls that start from now on, in every thread; -1 lifts it (back to
 * UNIUN_ISA's or the best). Returns 0, or -1 (nothing changed) for a level this CPU lacks. */
int uniun_isa_force(int level);

#endif
