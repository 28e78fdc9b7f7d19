/* Per-token helpers of the sampler: penalties on repeated tokens and the top-k search of
 * the log-probabilities (models/penalties.py, models/logprobs.py call them through ctypes;
 * both have a numpy fallback that gives the same numbers, for a build without the library).
 *
 * Why C for a few hundred operations per token: in the runner they run right after a
 * forward pass that streamed the model's weights through every cache, and each distinct
 * numpy call then first pays to fetch its own code back, more than its arithmetic costs;
 * one small loop here replaces a dozen of them. Float arithmetic is float32, one rounding
 * per operation, no contraction into fused multiply-adds: the penalties must round as
 * llama.cpp's C does (and as the numpy fallback does). */

#include <stdint.h>

#define UNIUN_API __attribute__((visibility("default")))

/* x[id] for each of the ids in the repetition window: divided by rp if positive, else
 * multiplied by it; then for each generated id, x[id] -= counts * freq + pres. The ids of
 * each list are distinct (the penalties' counters); ids outside [0, n) are skipped. */
UNIUN_API __attribute__((optimize("fp-contract=off"))) void uniun_penalize(
        float *x, int64_t n, const int64_t *window, int64_t n_window, float rp,
        const int64_t *generated, const float *counts, int64_t n_generated, float freq,
        float pres) {
    for (int64_t r = 0; r < n_window; r++) {
        int64_t id = window[r];
        if (id < 0 || id >= n) continue;
        float v = x[id];
        x[id] = v <= 0.0f ? v * rp : v / rp;
    }
    for (int64_t g = 0; g < n_generated; g++) {
        int64_t id = generated[g];
        if (id < 0 || id >= n) continue;
        float cost = counts[g] * freq;
        cost = cost + 1.0f * pres;
        x[id] = x[id] - cost;
    }
}

/* The k largest values of x[n] (1 <= k <= 64): their ids into ids[], values into vals[],
 * largest first, equal values by lowest id. Returns how many were found (n when n < k).
 * Blocks of TOPK_BLOCK values are taken in order; a block whose maximum (a loop the
 * compiler turns into vector max instructions) does not beat the short list's last entry
 * is skipped whole, so once the list is full almost every value costs one vector lane. */
#define TOPK_BLOCK 64

static float block_max(const float *x, int64_t len) {
    float m = x[0];
    for (int64_t j = 1; j < len; j++) m = x[j] > m ? x[j] : m;
    return m;
}

UNIUN_API int uniun_top_k(const float *x, int64_t n, int k, int64_t *ids, float *vals) {
    int count = 0;
    if (k < 1 || k > 64) return -1;
    for (int64_t b = 0; b < n; b += TOPK_BLOCK) {
        int64_t end = b + TOPK_BLOCK < n ? b + TOPK_BLOCK : n;
        if (count == k && !(block_max(x + b, end - b) > vals[k - 1])) continue;
        for (int64_t i = b; i < end; i++) {
            float v = x[i];
            if (count == k && !(v > vals[k - 1])) continue;
            int j = count < k ? count++ : k - 1;
            while (j > 0 && v > vals[j - 1]) {
                vals[j] = vals[j - 1];
                ids[j] = ids[j - 1];
                j--;
            }
            vals[j] = v;
            ids[j] = i;
        }
    }
    return count;
}
