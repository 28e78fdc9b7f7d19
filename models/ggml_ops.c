/* llama.cpp's arithmetic, reproduced bit for bit: RMSNorm, RoPE and SwiGLU here, attention
 * in ggml_attention.c, as ggml's CPU backend computes them when built for AVX-512
 * (GGML_NATIVE on such a CPU) or for AVX2 without AVX-512 (most laptops): where the two
 * builds differ (exp, SwiGLU, the attention's sums), the level in force (isa.h) picks the
 * order: AVX-512's at ISA_AVX512, AVX2's below.
 *
 * Why: on a small quantised model, 8-bit activation quantisation turns a last-bit
 * difference into a flipped code, and greedy text drifts from llama.cpp's within a few
 * dozen tokens even when every op is "correct": llama.cpp's own text drifts that way when
 * only its flash-attention or batch setting changes
 * (docs/models.md). The only way to give a user llama.cpp's tokens for llama.cpp's file is
 * to do the same float operations in the same order. Each function names the ggml code it
 * follows (ggml-cpu/ops.cpp, vec.cpp, vec.h, llamafile/sgemm.cpp, llama.cpp's vendored
 * copy in llama-cpp-python 0.3.36; MIT licence, (c) the ggml authors).
 *
 * Order matters in three places, and is spelled out here rather than left to a compiler:
 * - sums: ggml's vector reductions (_mm512_reduce_add_ps, its 4-accumulator dot product,
 *   tinyBLAS's one accumulator per output) are written out lane by lane (reduce16_avx);
 * - fused multiply-adds: fmaf() exactly where ggml's build fuses, and nowhere else
 *   (these files are compiled with fp-contract off);
 * - fp16: K, V, the query and the softmax output are rounded to fp16 where ggml stores or
 *   converts them (its KV cache is fp16, and its fp16 matmul converts the other side).
 *
 * The vector loops use AVX2 + FMA (and AVX-512 registers where the CPU has them, for the
 * same results); uniun_ggml_supported() says whether this CPU has the former. Elsewhere (ARM)
 * the functions are stubs that are never called: the operators refuse to start there
 * (ggml_ort.c), and the converter does not build this graph.
 */
#pragma GCC optimize("fp-contract=off")

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ggml_ops.h"
#include "isa.h"

EXPORT int uniun_ggml_supported(void) { return uniun_isa_supports(ISA_AVX2); }

#ifdef UNIUN_X86
#include "ggml_vec.h"

/* ---- RMSNorm: ggml_compute_forward_rms_norm_f32, then ggml_mul by the weight ---------- */

VEC EXPORT void uniun_ggml_rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                                float eps) {
  for (int64_t r = 0; r < rows; r++) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) yr[i] = (xr[i] * scale) * w[i];
  }
}

/* ---- RoPE: ggml_rope_cache_init + rotate_pairs (no YaRN, no frequency factors) ---------- */

/* x, y: [tokens][heads][dim]. interleaved: ggml's NORMAL mode (pairs 2i, 2i+1: llama's
 * GGUF row order), else NEOX (pairs i, i + dim/2). A token's angles are made pair by pair
 * as ggml's cache makes them (theta *= theta_scale), each used for every head at once. */
VEC EXPORT void uniun_ggml_rope(const float* x, const int64_t* pos, float* y, int64_t tokens,
                                int heads, int dim, float base, int interleaved) {
  const float theta_scale = powf(base, -2.0f / dim);
  const int offset = interleaved ? 1 : dim / 2;
  for (int64_t t = 0; t < tokens; t++) {
    float theta = (float)pos[t];
    for (int i0 = 0; i0 < dim; i0 += 2) {
      const float c = cosf(theta), s = sinf(theta);
      theta *= theta_scale;
      const int ic = interleaved ? i0 : i0 / 2;
      for (int h = 0; h < heads; h++) {
        const float* src = x + (t * heads + h) * dim;
        float* dst = y + (t * heads + h) * dim;
        const float x0 = src[ic], x1 = src[ic + offset];
        dst[ic] = fmaf(x0, c, -(x1 * s));
        dst[ic + offset] = fmaf(x0, s, x1 * c);
      }
    }
  }
}

/* ---- SiLU: vec.h's ggml_v_silu, in both of llama.cpp's x86 flavours --------------------- */

/* ggml_vec_swiglu_f32: silu(g) * u, silu(x) = x / (1 + exp(-x)). n: any length (ggml's
 * scalar tail uses libm's expf; these too). llama.cpp built for AVX-512 takes 16 at a time
 * with its AVX-512 exp (ggml_vec.h's v_expf8 gives its lanes); built for AVX2, 8 at a time
 * with the AVX2 exp. */
VEC static void swiglu_vec(const float* g, const float* u, float* y, int64_t n, int avx512) {
  int64_t i = 0;
  const int64_t whole = n - n % (avx512 ? 16 : 8); /* ggml's vector loop's step */
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (; i + 8 <= whole; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 neg = _mm256_sub_ps(zero, x);
    const __m256 e = avx512 ? v_expf8(neg) : v_expf8_avx2(neg);
    const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; i++) y[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

/* The order of the level in force (isa.h): AVX-512's where it is AVX-512, else AVX2's. */
EXPORT void uniun_ggml_swiglu(const float* g, const float* u, float* y, int64_t n) {
  swiglu_vec(g, u, y, n, uniun_isa_level() >= ISA_AVX512);
}
EXPORT void uniun_ggml_round_half(const float* x, float* y, int64_t n) { round_half(x, y, n); }

#else /* not x86: stubs, never called (uniun_ggml_supported() is 0, the operators refuse) */

#pragma GCC diagnostic ignored "-Wunused-parameter"
EXPORT void uniun_ggml_rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                                float eps) {}
EXPORT void uniun_ggml_rope(const float* x, const int64_t* pos, float* y, int64_t tokens,
                            int heads, int dim, float base, int interleaved) {}
EXPORT void uniun_ggml_swiglu(const float* g, const float* u, float* y, int64_t n) {}
EXPORT void uniun_ggml_round_half(const float* x, float* y, int64_t n) {}

#endif
