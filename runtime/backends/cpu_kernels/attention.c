/* trt_llm.cpu::CachedAttention: the cpu backend's attention (ONNX Runtime's GroupQueryAttention as
 * plugins/attention.py lowers our op to it) as a kernel of our own, so that a token's output has the
 * same bits whichever pass computes it: alone in a decode step, in a prompt-lookup or EAGLE
 * verification pass of several tokens, beside other rows of a batch. GroupQueryAttention does not give
 * that: its products are matrix products over the whole pass (measured: a token's output differs in
 * the last bits between a 1-token and a 5-token pass), which int8 activations then turn into another
 * token now and then. Here each (row, new token, query head) is computed alone over exactly the keys
 * it sees, in their order, whatever their slots.
 *
 * Inputs (rewrite.swap_attention takes them from the GroupQueryAttention node):
 *   0 qkv           float [B, S, (Hq + 2 Hkv) D]   packed projection: q heads, k heads, v heads
 *   1 past_key      float [B, Hkv, L, D]           the cache (past and present one buffer where the
 *   2 past_value    float [B, Hkv, L, D]            runtime binds them so: then written in place)
 *   3 seqlens_k     int32 [B]                      past + new - 1
 *   4 cos_cache     float [P, R/2]                 rotary rows (rotate-half over the first R dims)
 *   5 sin_cache     float [P, R/2]
 *   6 position_ids  int64 [B, S]                   each new token's rotary row
 *   7 query_lengths int32 [B]                      new tokens per row (right-padded; 0 = idle)
 *   8 attention_bias float [B, 1, S, L], optional  added to the scores; -inf hides a key (a tree)
 * Attributes: num_heads, kv_num_heads, scale (0: 1/sqrt(D)), local_window_size (W > 0: a token in slot
 * q sees slots q - W + 1 .. q), softcap (c > 0: c * tanh(score / c) after the scale), threads (the
 * session's intra-op threads, which rewrite.swap_attention writes as a session opens: how many units
 * to cut a call into; 0 or absent: 8).
 * Outputs: [B, S, Hq D] (zeros at padded tokens), present_key, present_value (the caches with the new
 * tokens' rotated keys and values at slots past .. past + new - 1).
 *
 * A token's scores are taken over its visible keys only, compacted in slot order, then softmax (exp
 * of score - max, summed in lanes of 16 from the first visible key) and the values' weighted sum in
 * that order: the same sequence of operations for the same keys, so the same bits. AVX-512 where the
 * CPU has it and D is a multiple of 16, plain C elsewhere (each self-consistent).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "blocks.h"
#include "onnxruntime_c_api.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static const OrtApi *api;

#define TRY(x) do { OrtStatus *s_ = (x); if (s_) return s_; } while (0)
enum { MAX_HEAD = 1024, BATCHES = 16, UNKNOWN_THREADS = 8, UNIT_SCORES = 512 << 10 };

typedef struct { int64_t Hq, Hkv, window, threads; float scale, softcap; int avx512; } attention;

typedef struct {
  const attention *a;
  int64_t B, S, D, L, P, half, bias_len;
  const float *qkv, *cos, *sin, *bias;
  const int64_t *pos;
  const int32_t *past, *count, *order;  /* order: the rows by new tokens, most first (units by rows) */
  float *keys, *values, *out;
  float scale;
  int avx512;
  int rows;  /* units are (row, query heads of one kv head, token group): the group's tokens under those
                heads at once (row_head_avx512); else (row, token, head) */
  int64_t groups, head_sets;  /* token groups a row, sets a kv head's query heads are cut into */
  size_t units, units_per_batch;
} call;

/* x[0:half] and x[half:2 half] turned by the row's angles (rotate-half), the rest copied */
static void rotate(const float *x, const float *c, const float *s, int64_t half, int64_t D, float *y) {
  for (int64_t i = 0; i < half; i++) {
    float x1 = x[i], x2 = x[half + i];
    y[i] = x1 * c[i] - x2 * s[i];
    y[half + i] = x2 * c[i] + x1 * s[i];
  }
  for (int64_t i = 2 * half; i < D; i++) y[i] = x[i];
}

/* ---------------- one token's attention for one query head: plain C ---------------- */
static void head_c(const call *c, const float *q, const float *keys, const float *values, const int32_t *idx,
                   int64_t n, const float *bias, float *scores, float *y) {
  const int64_t D = c->D;
  float top = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    const float *k = keys + idx[i] * D;
    float dot = 0.f;
    for (int64_t d = 0; d < D; d++) dot += q[d] * k[d];
    float s = dot * c->scale;
    if (c->a->softcap > 0.f) s = c->a->softcap * tanhf(s / c->a->softcap);
    if (bias) s += bias[idx[i]];
    scores[i] = s;
    if (s > top) top = s;
  }
  float sum = 0.f;
  for (int64_t i = 0; i < n; i++) sum += scores[i] = expf(scores[i] - top);
  for (int64_t d = 0; d < D; d++) y[d] = 0.f;
  for (int64_t i = 0; i < n; i++) {
    const float *v = values + idx[i] * D;
    for (int64_t d = 0; d < D; d++) y[d] += scores[i] * v[d];
  }
  float inv = 1.f / sum;
  for (int64_t d = 0; d < D; d++) y[d] *= inv;
}

/* ---------------- the same with AVX-512 (D a multiple of 16) ---------------- */
#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f,fma")))

/* e^x for x <= 0 (a score less the row's maximum): Cephes' expf polynomial, 2^n by scalef */
AVX512 static inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, n);
}

/* Sixteen keys' dots with q at once: each key's 16-lane products summed over D, then the 16 vectors
 * reduced together (4 levels of shuffles): key j's lanes always by the same tree, (l, l+8), (l, l+4),
 * (l, l+2), (l, l+1), whichever keys share its group, so a key's score has the same bits in any pass.
 * Keys past n (a last group) are zeros and never stored. idx NULL: the keys are consecutive from `keys`. */
AVX512 static inline __attribute__((always_inline)) void dots16_body(const float *q, const float *keys, const int32_t *idx, int64_t count, int64_t D,
                                 float scale, float *scores) {
  __m512 v[16];
  for (int j = 0; j < 16; j++) {
    if (j >= count) { v[j] = _mm512_setzero_ps(); continue; }
    const float *k = keys + (idx ? idx[j] : j) * D;
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
    for (int64_t d = 16; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
    v[j] = acc;
  }
  __m512 u[8], w[4], z[2];
  for (int i = 0; i < 8; i++)  /* lanes l + l+8: keys 2i (lanes 0-7), 2i+1 (8-15) */
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; i++)  /* + l+4: keys 4i .. 4i+3, one a quarter */
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88), _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; i++)  /* + l+2: quarter c holds keys 8i+c and 8i+4+c, two lanes each */
    z[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0x44), _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0xEE));
  /* + l+1: quarter c holds keys c, 4+c, 8+c, 12+c; lane 4c + t is key c + 4t */
  __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  r = _mm512_mul_ps(_mm512_permutexvar_ps(order, r), _mm512_set1_ps(scale));
  _mm512_mask_storeu_ps(scores, count >= 16 ? 0xffff : (__mmask16)((1u << count) - 1), r);
}

AVX512 static void dots16_avx512(const float *q, const float *keys, const int32_t *idx, int64_t count, int64_t D,
                                 float scale, float *scores) {
  if (D == 64) dots16_body(q, keys, idx, count, 64, scale, scores);  /* (D a constant: q stays in registers) */
  else if (D == 128) dots16_body(q, keys, idx, count, 128, scale, scores);
  else dots16_body(q, keys, idx, count, D, scale, scores);
}

/* scores[0:n] := e^(score - max), in lanes of 16 from the first; returns 1 / their sum */
AVX512 static float softmax_avx512(float *scores, int64_t n) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
    top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, scores + i));
  }
  __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top)), sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 e = _mm512_maskz_mov_ps(m, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + i), shift)));
    _mm512_mask_storeu_ps(scores + i, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

AVX512 static void head_avx512(const call *c, const float *q, const float *keys, const float *values,
                               const int32_t *idx, int64_t n, const float *bias, float *scores, float *y) {
  const int64_t D = c->D;
  const float softcap = c->a->softcap;
  int64_t i = 0;
  for (i = 0; i < n; i += 16) dots16_avx512(q, keys, idx + i, n - i < 16 ? n - i : 16, D, c->scale, scores + i);
  for (i = 0; i < n; i++) {
    if (softcap > 0.f) scores[i] = softcap * tanhf(scores[i] / softcap);
    if (bias) scores[i] += bias[idx[i]];
  }
  const __m512 inv = _mm512_set1_ps(softmax_avx512(scores, n));
  for (int64_t d = 0; d < D; d += 64) {  /* up to 64 output dims in registers while the values stream */
    const int64_t w = D - d >= 64 ? 4 : (D - d) / 16;
    /* two sets (the compacted list's even and odd keys): half the chains' length, added at the end */
    __m512 even[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m512 odd[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (i = 0; i + 2 <= n; i += 2) {
      const __m512 p0 = _mm512_set1_ps(scores[i]), p1 = _mm512_set1_ps(scores[i + 1]);
      const float *v0 = values + idx[i] * D + d, *v1 = values + idx[i + 1] * D + d;
      for (int64_t j = 0; j < w; j++) {
        even[j] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * j), even[j]);
        odd[j] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v1 + 16 * j), odd[j]);
      }
    }
    if (i < n) {
      const __m512 p0 = _mm512_set1_ps(scores[i]);
      const float *v0 = values + idx[i] * D + d;
      for (int64_t j = 0; j < w; j++) even[j] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * j), even[j]);
    }
    for (int64_t j = 0; j < w; j++) _mm512_storeu_ps(y + d + 16 * j, _mm512_mul_ps(_mm512_add_ps(even[j], odd[j]), inv));
  }
}

/* The values' weighted sum over slots j0 .. end0 for one token (p0: its scores from slot 0, acc0: its
 * sums, the odd slots' chain `apart` floats past the even ones') and, with acc1, over j0 .. end1 for the
 * next token (scores at p0 + stride), end1 >= end0: each value is loaded once for both. Up to 64 dims (w
 * of 16) in registers. Every token's chains take its slots in order, even slots in one, odd in the
 * other, as a token alone does: the same bits. */
AVX512 static inline __attribute__((always_inline)) void values_pair(
    const float *values, int64_t D, const float *p0, int64_t stride, float *acc0, float *acc1, int64_t apart,
    int64_t j0, int64_t end0, int64_t end1, const int64_t w) {
  const float *p1 = p0 + stride;
  __m512 e0[4], o0[4], e1[4], o1[4];
  for (int64_t k = 0; k < w; k++) {
    e0[k] = _mm512_loadu_ps(acc0 + 16 * k); o0[k] = _mm512_loadu_ps(acc0 + apart + 16 * k);
    if (acc1) { e1[k] = _mm512_loadu_ps(acc1 + 16 * k); o1[k] = _mm512_loadu_ps(acc1 + apart + 16 * k); }
  }
  int64_t j = j0;  /* (j0 a multiple of 32: even) */
  if (acc1)
    for (; j + 2 <= end0; j += 2) {
      const __m512 a0 = _mm512_set1_ps(p0[j]), a1 = _mm512_set1_ps(p0[j + 1]);
      const __m512 b0 = _mm512_set1_ps(p1[j]), b1 = _mm512_set1_ps(p1[j + 1]);
      const float *v0 = values + j * D, *v1 = v0 + D;
      __m512 x[4], y[4];
      for (int64_t k = 0; k < w; k++) {
        x[k] = _mm512_loadu_ps(v0 + 16 * k); y[k] = _mm512_loadu_ps(v1 + 16 * k);
        __asm__("" : "+v"(x[k]), "+v"(y[k]));  /* (each value loaded once for both tokens, not folded twice) */
      }
      for (int64_t k = 0; k < w; k++) {
        e0[k] = _mm512_fmadd_ps(a0, x[k], e0[k]); o0[k] = _mm512_fmadd_ps(a1, y[k], o0[k]);
        e1[k] = _mm512_fmadd_ps(b0, x[k], e1[k]); o1[k] = _mm512_fmadd_ps(b1, y[k], o1[k]);
      }
    }
  for (int64_t t = 0; t < (acc1 ? 2 : 1); t++) {  /* what is left: each token alone, from slot j */
    const float *p = t ? p1 : p0;
    __m512 *e = t ? e1 : e0, *o = t ? o1 : o0;
    for (int64_t i = j, end = t ? end1 : end0; i < end; i++) {
      const __m512 a = _mm512_set1_ps(p[i]);
      const float *v = values + i * D;
      if (i & 1)
        for (int64_t k = 0; k < w; k++) o[k] = _mm512_fmadd_ps(a, _mm512_loadu_ps(v + 16 * k), o[k]);
      else
        for (int64_t k = 0; k < w; k++) e[k] = _mm512_fmadd_ps(a, _mm512_loadu_ps(v + 16 * k), e[k]);
    }
  }
  for (int64_t k = 0; k < w; k++) {
    _mm512_storeu_ps(acc0 + 16 * k, e0[k]); _mm512_storeu_ps(acc0 + apart + 16 * k, o0[k]);
    if (acc1) { _mm512_storeu_ps(acc1 + 16 * k, e1[k]); _mm512_storeu_ps(acc1 + apart + 16 * k, o1[k]); }
  }
}

/* A row's new tokens first, first + step, ... for query heads h0 .. h0 + nh - 1 (all of one kv head),
 * where every token sees slots 0 .. its own (no window, no bias): its list of keys is the slots
 * themselves, so the unit's queries (a token under a head, token-major) share each block of keys and
 * values while it is in L1: a verification pass of 9 tokens under 3 heads reads the kv head's cache
 * about once a unit, not 27 times, and a decode step once, not 3 times. Each query's arithmetic is
 * the same whatever the unit holds: dots16 per key, the softmax from slot 0, the values' two chains by
 * slot parity. work: n (3 D + past + count + 16) floats, n the unit's queries. */
AVX512 static void row_head_avx512(const call *c, int64_t b, int64_t h0, int64_t nh, int64_t first, int64_t step,
                                   const float *keys, const float *values, float *work) {
  const attention *a = c->a;
  const int64_t D = c->D, count = c->count[b], past = c->past[b], total = past + count, stride = total + 16;
  /* query i: token first + (i / nh) step under head h0 + i % nh */
  const int64_t n = (count - first + step - 1) / step * nh;
  float *qs = work, *even = qs + n * D, *odd = even + n * D, *sc = odd + n * D;
#define SEEN(i) (past + first + (i) / nh * step + 1)
  for (int64_t i = 0; i < n; i++) {
    const int64_t s = first + i / nh * step, position = c->pos[b * c->S + s];
    const float *x = c->qkv + ((b * c->S + s) * (a->Hq + 2 * a->Hkv) + h0 + i % nh) * D;
    rotate(x, c->cos + position * c->half, c->sin + position * c->half, c->half, D, qs + i * D);
  }
  for (int64_t j0 = 0; j0 < total; j0 += 16)  /* a block of keys, then every query that sees it */
    for (int64_t i = 0; i < n; i++) {
      const int64_t seen = SEEN(i) - j0;
      if (seen > 0) dots16_avx512(qs + i * D, keys + j0 * D, NULL, seen < 16 ? seen : 16, D, c->scale, sc + i * stride + j0);
    }
  for (int64_t i = 0; i < n; i++) {
    float *row = sc + i * stride;
    const int64_t seen = SEEN(i);
    if (a->softcap > 0.f)
      for (int64_t j = 0; j < seen; j++) row[j] = a->softcap * tanhf(row[j] / a->softcap);
    row[total] = softmax_avx512(row, seen);  /* (1 / the sum, kept past the row's scores) */
  }
  memset(even, 0, sizeof(float) * (size_t)(2 * n * D));
  for (int64_t j0 = 0; j0 < total; j0 += 32)  /* 32 values (8 KiB at D 64), then every query that sees them */
    for (int64_t i = 0; i < n; i += 2) {      /* two queries at a time (the second sees as many or more) */
      const int64_t two = i + 1 < n, seen0 = SEEN(i), seen1 = two ? SEEN(i + 1) : seen0;
      const int64_t end0 = seen0 < j0 + 32 ? seen0 : j0 + 32, end1 = seen1 < j0 + 32 ? seen1 : j0 + 32;
      for (int64_t d = 0; d < D; d += 64) {
        float *acc0 = even + i * D + d, *acc1 = two ? even + (i + 1) * D + d : NULL;
        if (D - d >= 64) values_pair(values + d, D, sc + i * stride, stride, acc0, acc1, odd - even, j0, end0, end1, 4);
        else values_pair(values + d, D, sc + i * stride, stride, acc0, acc1, odd - even, j0, end0, end1, (D - d) / 16);
      }
    }
#undef SEEN
  for (int64_t i = 0; i < n; i++) {
    float *y = c->out + ((b * c->S + first + i / nh * step) * a->Hq + h0 + i % nh) * D;
    const __m512 inv = _mm512_set1_ps(sc[i * stride + total]);
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(y + d, _mm512_mul_ps(_mm512_add_ps(_mm512_loadu_ps(even + i * D + d), _mm512_loadu_ps(odd + i * D + d)), inv));
  }
}
#endif

/* unit u: row b, new token s, query head h; scratch: room for L slot indices and L + 16 scores */
static void run_unit(const call *c, size_t u, int32_t *idx, float *scores) {
  const attention *a = c->a;
  const int64_t D = c->D, h = (int64_t)u % a->Hq, s = ((int64_t)u / a->Hq) % c->S, b = (int64_t)u / (a->Hq * c->S);
  float *y = c->out + ((b * c->S + s) * a->Hq + h) * D;
  if (s >= c->count[b]) {
    memset(y, 0, sizeof(float) * (size_t)D);
    return;
  }
  float q[MAX_HEAD];
  const int64_t position = c->pos[b * c->S + s];
  rotate(c->qkv + ((b * c->S + s) * (a->Hq + 2 * a->Hkv) + h) * D, c->cos + position * c->half,
         c->sin + position * c->half, c->half, D, q);
  const int64_t kv = h / (a->Hq / a->Hkv), slot = c->past[b] + s;
  const int64_t first = a->window > 0 && slot - a->window + 1 > 0 ? slot - a->window + 1 : 0;
  const float *bias = c->bias ? c->bias + (b * c->S + s) * c->bias_len : NULL;
  int64_t n = 0;
  for (int64_t j = first; j <= slot; j++)
    if (!bias || bias[j] != -INFINITY) idx[n++] = (int32_t)j;
  if (n == 0) {  /* (a bias that hides every key: nothing to attend to) */
    memset(y, 0, sizeof(float) * (size_t)D);
    return;
  }
  const float *keys = c->keys + (b * a->Hkv + kv) * c->L * D, *values = c->values + (b * a->Hkv + kv) * c->L * D;
#if defined(__x86_64__)
  if (c->avx512) head_avx512(c, q, keys, values, idx, n, bias, scores, y);
  else
#endif
    head_c(c, q, keys, values, idx, n, bias, scores, y);
}

/* unit u of a call by rows: row b, a set of query heads of one kv head (c->head_sets sets of them), its
 * new tokens g, g + G, ... (G = c->groups: the tokens interleaved, so that each group sees about as
 * many keys under the causal mask) */
static void run_row_unit(const call *c, size_t u) {
  const attention *a = c->a;
  const int64_t D = c->D, G = c->groups, g = (int64_t)u % G, R = a->Hq / a->Hkv, nh = R / c->head_sets;
  const int64_t h0 = ((int64_t)u / (G * c->head_sets)) % a->Hkv * R + ((int64_t)u / G) % c->head_sets * nh;
  const int64_t b = c->order[(int64_t)u / (G * c->head_sets * a->Hkv)], count = c->count[b];
  for (int64_t h = h0; g == 0 && h < h0 + nh; h++)  /* (the padded tokens: zeros, by the first group's unit) */
    for (int64_t s = count; s < c->S; s++)
      memset(c->out + ((b * c->S + s) * a->Hq + h) * D, 0, sizeof(float) * (size_t)D);
  if (g >= count) return;
  const int64_t kv = h0 / R, total = c->past[b] + count, n = (count - g + G - 1) / G * nh;
  float *work = malloc(sizeof(float) * (size_t)(n * (3 * D + total + 16)));
  if (!work) {  /* (the output cannot say it: NaN rather than a quiet wrong answer) */
    for (int64_t s = g; s < count; s += G)
      for (int64_t h = h0; h < h0 + nh; h++)
        for (int64_t d = 0; d < D; d++) c->out[((b * c->S + s) * a->Hq + h) * D + d] = NAN;
    return;
  }
#if defined(__x86_64__)
  const size_t cache = (size_t)((b * a->Hkv + kv) * c->L * D);
  row_head_avx512(c, b, h0, nh, g, G, c->keys + cache, c->values + cache, work);
#endif
  free(work);
}

/* batch i of the units: units_per_batch of them on one thread, with one scratch */
static void run_batch(void *p, size_t i) {
  const call *c = (const call *)p;
  const size_t start = i * c->units_per_batch, end = start + c->units_per_batch < c->units ? start + c->units_per_batch : c->units;
  if (c->rows) {
    for (size_t u = start; u < end; u++) run_row_unit(c, u);
    return;
  }
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)c->L);
  float *scores = malloc(sizeof(float) * (size_t)(c->L + 16));
  for (size_t u = start; u < end; u++) {
    if (idx && scores) run_unit(c, u, idx, scores);
    else {  /* (the output cannot say it: NaN rather than a quiet wrong answer) */
      float *y = c->out + u * (size_t)c->D;
      for (int64_t d = 0; d < c->D; d++) y[d] = NAN;
    }
  }
  free(idx); free(scores);
}

static OrtStatus *fail(const char *msg) { return api->CreateStatus(ORT_INVALID_ARGUMENT, msg); }

static OrtStatus *dims_of(const OrtValue *v, int64_t *dims, size_t *rank, size_t most) {
  OrtTensorTypeAndShapeInfo *info;
  TRY(api->GetTensorTypeAndShape(v, &info));
  OrtStatus *st = api->GetDimensionsCount(info, rank);
  if (!st && *rank > most) st = fail("CachedAttention: an input has too many dimensions");
  if (!st) st = api->GetDimensions(info, dims, *rank);
  api->ReleaseTensorTypeAndShapeInfo(info);
  return st;
}

static OrtStatus *input(OrtKernelContext *ctx, size_t i, const OrtValue **v, int64_t *dims, size_t rank) {
  size_t got;
  TRY(api->KernelContext_GetInput(ctx, i, v));
  if (!*v) return fail("CachedAttention: a required input is missing");
  TRY(dims_of(*v, dims, &got, 4));
  if (got != rank) return fail("CachedAttention: an input's rank is not the op's (qkv 3, caches 4, lengths 1, "
                               "rotary tables 2, positions 2, bias 4)");
  return NULL;
}

static OrtStatus *compute(void *kernel, OrtKernelContext *ctx) {
  const attention *a = (const attention *)kernel;
  const OrtValue *v[9] = {0};
  int64_t qd[4], kd[4], vd[4], sd[4], cd[4], sn[4], pd[4], ld[4], bd[4];
  static const size_t ranks[8] = {3, 4, 4, 1, 2, 2, 2, 1};
  int64_t *dims[9] = {qd, kd, vd, sd, cd, sn, pd, ld, bd};
  for (size_t i = 0; i < 8; i++) TRY(input(ctx, i, &v[i], dims[i], ranks[i]));
  size_t count = 0;
  TRY(api->KernelContext_GetInputCount(ctx, &count));
  if (count > 8) {
    TRY(api->KernelContext_GetInput(ctx, 8, &v[8]));
    if (v[8]) {
      size_t rank;
      TRY(dims_of(v[8], bd, &rank, 4));
      if (rank != 4) return fail("CachedAttention: attention_bias must be [B, 1, S, L]");
    }
  }
  const int64_t B = qd[0], S = qd[1], heads = a->Hq + 2 * a->Hkv;
  if (qd[2] % heads) return fail("CachedAttention: qkv's last dimension must be (num_heads + 2 kv_num_heads) head_size");
  const int64_t D = qd[2] / heads, L = kd[2];
  if (D > MAX_HEAD) return fail("CachedAttention: head_size above 1024");
  for (int i = 1; i < 3; i++)
    if (dims[i][0] != B || dims[i][1] != a->Hkv || dims[i][2] != L || dims[i][3] != D)
      return fail("CachedAttention: past_key and past_value must be [B, kv_num_heads, L, head_size]");
  if (sd[0] != B || ld[0] != B || pd[0] != B || pd[1] != S)
    return fail("CachedAttention: seqlens_k and query_lengths must be [B], position_ids [B, S]");
  if (cd[0] != sn[0] || cd[1] != sn[1] || 2 * cd[1] > D)
    return fail("CachedAttention: cos_cache and sin_cache must be [P, R/2] with R <= head_size");
  if (v[8] && (bd[0] != B || bd[1] != 1 || bd[2] != S))
    return fail("CachedAttention: attention_bias must be [B, 1, S, L]");
  call c = {.a = a, .B = B, .S = S, .D = D, .L = L, .P = cd[0], .half = cd[1], .bias_len = v[8] ? bd[3] : 0,
            .scale = a->scale > 0.f ? a->scale : 1.f / sqrtf((float)D), .avx512 = a->avx512 && D % 16 == 0};
  const float *past_k, *past_v;
  const int32_t *seqlens, *lengths;
  TRY(api->GetTensorMutableData((OrtValue *)v[0], (void **)&c.qkv));
  TRY(api->GetTensorMutableData((OrtValue *)v[1], (void **)&past_k));
  TRY(api->GetTensorMutableData((OrtValue *)v[2], (void **)&past_v));
  TRY(api->GetTensorMutableData((OrtValue *)v[3], (void **)&seqlens));
  TRY(api->GetTensorMutableData((OrtValue *)v[4], (void **)&c.cos));
  TRY(api->GetTensorMutableData((OrtValue *)v[5], (void **)&c.sin));
  TRY(api->GetTensorMutableData((OrtValue *)v[6], (void **)&c.pos));
  TRY(api->GetTensorMutableData((OrtValue *)v[7], (void **)&lengths));
  if (v[8]) TRY(api->GetTensorMutableData((OrtValue *)v[8], (void **)&c.bias));
  OrtValue *out, *pk, *pv;
  int64_t od[3] = {B, S, a->Hq * D};
  TRY(api->KernelContext_GetOutput(ctx, 0, od, 3, &out));
  TRY(api->KernelContext_GetOutput(ctx, 1, kd, 4, &pk));
  TRY(api->KernelContext_GetOutput(ctx, 2, vd, 4, &pv));
  TRY(api->GetTensorMutableData(out, (void **)&c.out));
  TRY(api->GetTensorMutableData(pk, (void **)&c.keys));
  TRY(api->GetTensorMutableData(pv, (void **)&c.values));
  const size_t cache_bytes = sizeof(float) * (size_t)(B * a->Hkv * L * D);
  if (c.keys != past_k) memcpy(c.keys, past_k, cache_bytes);  /* (not bound in place: present = past first) */
  if (c.values != past_v) memcpy(c.values, past_v, cache_bytes);
  int32_t *past = malloc(sizeof(int32_t) * (size_t)(3 * B));
  if (!past) return api->CreateStatus(ORT_FAIL, "CachedAttention: out of memory");
  int32_t *counts = past + B, *order = past + 2 * B;
  OrtStatus *st = NULL;
  for (int64_t b = 0; b < B && !st; b++) {
    counts[b] = lengths[b] < 0 ? 0 : lengths[b] > S ? (int32_t)S : lengths[b];
    past[b] = seqlens[b] + 1 - counts[b];
    if (past[b] < 0 || past[b] + counts[b] > L) st = fail("CachedAttention: a row's tokens pass the cache's capacity");
    for (int64_t s = 0; s < counts[b] && !st; s++)
      if (c.pos[b * S + s] < 0 || c.pos[b * S + s] >= c.P) st = fail("CachedAttention: a position past the rotary table");
    if (c.bias && c.bias_len < past[b] + counts[b]) st = fail("CachedAttention: attention_bias shorter than a row's slots");
  }
  /* the rows with the most new tokens first: ONNX Runtime's threads take units in order, so the largest are
   * shared out first and the small ones even out the end (a static batch's verification pass has one row
   * of 9 tokens among rows of 1: last in order, its units were left to one thread at the end) */
  for (int64_t b = 0; b < B && !st; b++) {
    int64_t i = b;
    for (; i > 0 && counts[order[i - 1]] < counts[b]; i--) order[i] = order[i - 1];
    order[i] = (int32_t)b;
  }
  c.past = past; c.count = counts; c.order = order;
  /* the new tokens' keys (rotated) and values into their slots, before any token reads them */
  for (int64_t b = 0; b < B && !st; b++)
    for (int64_t s = 0; s < counts[b]; s++) {
      const float *row = c.qkv + (b * S + s) * heads * D;
      const int64_t position = c.pos[b * S + s];
      for (int64_t h = 0; h < a->Hkv; h++) {
        float *k = c.keys + ((b * a->Hkv + h) * L + past[b] + s) * D;
        float *val = c.values + ((b * a->Hkv + h) * L + past[b] + s) * D;
        rotate(row + (a->Hq + h) * D, c.cos + position * c.half, c.sin + position * c.half, c.half, D, k);
        memcpy(val, row + (a->Hq + a->Hkv + h) * D, sizeof(float) * (size_t)D);
      }
    }
  /* BATCHES tasks at most (ONNX Runtime runs each index given to ParallelFor as a task of its own) */
  /* a causal node without window or bias: by rows (each token's bits the same either way it is cut) */
  c.rows = c.avx512 && !c.bias && a->window <= 0;
  /* Units by rows: (row, a set of one kv head's query heads, token group). A unit reads its kv head's keys
   * and values once for all its queries, so the fewer and wider the units, the less of the cache is read
   * (a decode step at a long context is bound by that read: all of a kv head's query heads in one unit
   * took 1.2-1.4x less time at 100-1,500 cached tokens than a unit a head, on 2 threads). But the threads
   * need units to share: one a thread at least, two where the rows have several tokens (verification
   * passes, prefill: bound by arithmetic, where uneven shares cost more than reads), so the tokens are cut
   * into groups, then the heads into sets, until there are; and a unit's scores (a row of the slots it
   * sees a query) stay near L2: UNIT_SCORES. */
  int64_t longest = 0;
  for (int64_t b = 0; b < B && !st; b++) longest = past[b] + counts[b] > longest ? past[b] + counts[b] : longest;
  const int64_t R = a->Hq / a->Hkv, wanted = (S > 1 ? 2 : 1) * a->threads;
  c.groups = c.head_sets = 1;
  while (c.rows) {
    const int64_t queries = (S + c.groups - 1) / c.groups * (R / c.head_sets);
    const int64_t scores = queries * (longest + 16) * (int64_t)sizeof(float);
    if (B * a->Hkv * c.head_sets * c.groups >= wanted && scores <= UNIT_SCORES) break;
    if (c.groups < S) c.groups++;
    else if (c.head_sets < R) do c.head_sets++; while (R % c.head_sets);
    else break;
  }
  c.units = (size_t)(c.rows ? B * a->Hkv * c.head_sets * c.groups : B * S * a->Hq);
  if (!st && c.units <= 1) {  /* (no other thread to wake) */
    c.units_per_batch = c.units;
    run_batch(&c, 0);
  } else if (!st) {
    c.units_per_batch = (c.units + BATCHES - 1) / BATCHES;
    st = api->KernelContext_ParallelFor(ctx, run_batch, (c.units + c.units_per_batch - 1) / c.units_per_batch, 0, &c);
  }
  free(past);
  return st;
}

/* an optional attribute: its value, else `fallback` */
static int64_t int_or(const OrtKernelInfo *info, const char *name, int64_t fallback) {
  int64_t value;
  OrtStatus *st = api->KernelInfoGetAttribute_int64(info, name, &value);
  if (st) { api->ReleaseStatus(st); return fallback; }
  return value;
}

static float float_or(const OrtKernelInfo *info, const char *name, float fallback) {
  float value;
  OrtStatus *st = api->KernelInfoGetAttribute_float(info, name, &value);
  if (st) { api->ReleaseStatus(st); return fallback; }
  return value;
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *unused, const OrtKernelInfo *info, void **out) {
  const int64_t hq = int_or(info, "num_heads", 0), hkv = int_or(info, "kv_num_heads", 0);
  const int64_t window = int_or(info, "local_window_size", -1);
  const float scale = float_or(info, "scale", 0.f), softcap = float_or(info, "softcap", 0.f);
  const int64_t threads = int_or(info, "threads", 0);
  if (hq <= 0 || hkv <= 0 || hq % hkv)
    return fail("CachedAttention: needs attributes num_heads and kv_num_heads (a divisor of it)");
  attention *a = calloc(1, sizeof *a);
  if (!a) return api->CreateStatus(ORT_FAIL, "CachedAttention: out of memory");
  *a = (attention){.Hq = hq, .Hkv = hkv, .window = window, .threads = threads > 0 ? threads : UNKNOWN_THREADS,
                   .scale = scale, .softcap = softcap, .avx512 = choose_avx512()};
  *out = a;
  return NULL;
}

static void destroy(void *kernel) { free(kernel); }
static const char *op_name(const OrtCustomOp *op) { return "CachedAttention"; }
static const char *provider(const OrtCustomOp *op) { return "CPUExecutionProvider"; }
static ONNXTensorElementDataType in_type(const OrtCustomOp *op, size_t i) {
  return i == 3 || i == 7 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
         : i == 6         ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
                          : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static ONNXTensorElementDataType out_type(const OrtCustomOp *op, size_t i) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t nine(const OrtCustomOp *op) { return 9; }
static size_t three(const OrtCustomOp *op) { return 3; }
static OrtCustomOpInputOutputCharacteristic in_kind(const OrtCustomOp *op, size_t i) {
  return i == 8 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) { return INPUT_OUTPUT_REQUIRED; }
static OrtMemType cpu_memory(const OrtCustomOp *op, size_t i) { return OrtMemTypeDefault; }

static OrtCustomOp cached_attention = {
  .version = ORT_API_VERSION, .CreateKernelV2 = create_kernel, .GetName = op_name,
  .GetExecutionProviderType = provider, .GetInputType = in_type, .GetInputTypeCount = nine,
  .GetOutputType = out_type, .GetOutputTypeCount = three, .KernelComputeV2 = compute, .KernelDestroy = destroy,
  .GetInputCharacteristic = in_kind, .GetOutputCharacteristic = required, .GetInputMemoryType = cpu_memory,
};

HIDDEN OrtCustomOp *attention_op(const OrtApi *ort) {
  api = ort;
  return &cached_attention;
}
