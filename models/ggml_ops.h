/* llama.cpp's arithmetic for RMSNorm, RoPE, SwiGLU (ggml_ops.c) and attention
 * (ggml_attention.c). Plain functions, for the onnxruntime operators of ggml_ort.c and for
 * tests through ctypes. */
#ifndef UNIUN_GGML_OPS_H
#define UNIUN_GGML_OPS_H

#include <stddef.h>
#include <stdint.h>

int uniun_ggml_supported(void);
void uniun_ggml_rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                         float eps);
void uniun_ggml_rope(const float* x, const int64_t* pos, float* y, int64_t tokens, int heads,
                     int dim, float base, int interleaved);
void uniun_ggml_swiglu(const float* g, const float* u, float* y, int64_t n);
size_t uniun_ggml_attention_scratch(int keys, int dim);
void uniun_ggml_attention(const float* q, const float* k, const float* v, const int64_t* open,
                          float* out, int tokens, int heads, int kv_heads, int dim, int keys,
                          int stride, int past, float scale, int h0, int h1, int t0, int t1,
                          void* scratch);
void uniun_ggml_round_half(const float* x, float* y, int64_t n);

#endif
