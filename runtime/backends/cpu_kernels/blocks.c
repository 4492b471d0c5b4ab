/* Packed weight matrices (blocks.h): the layout, the arena they live in, the activations' int8 rows
 * and the kernels, AVX-512 VNNI (256-bit forms) where the CPU has it, plain C elsewhere.
 *
 * At kernel creation the weights are copied once into our layout and ORT's initializer is not read
 * again: 8 rows interleaved per block, so one 256-bit VNNI dpbusd yields 8 rows' partial dots and the
 * float work (convert, scale, fma) is paid once per 8 blocks; the scales as fp16 where every one of
 * the node's is exactly an fp16 (a GGUF's are: 18 bytes a 4-bit block, the file's own size), else fp32.
 * The copies sit in a shared arena on transparent huge pages (the kernels' weights are 0.2-2 MB each,
 * below a huge page alone): a decode step streams them all, and the hardware prefetchers stop at
 * every 4 KiB page; each thread also prefetches a fixed distance ahead (measured: README.md, Performance,
 * "Against native llama.cpp on its own file").
 *
 * Arithmetic, as MatMulNBits at accuracy level 4 and llama.cpp's Q4_0 x Q8_0: each row of A is
 * quantized per block of 32 to int8 (d_a = max|a| / 127, round to nearest even); a block's dot is
 * d_w * d_a * (sum(q_w * q_a) - zero * sum(q_a)), the zero folded into the integer accumulator, so the
 * weights go in unsigned as dpbusd (u8 x s8) wants. Results agree with MatMulNBits to float rounding
 * (the summation order). AVX-512 VNNI (its 256-bit forms) where the CPU has it, chosen at run time;
 * plain C elsewhere (correct, slower than MLAS: the runtime only swaps the op in where VNNI is, or
 * where TRT_LLM_CPU_KERNELS=c asks for this path, which the tests use). Passes of several tokens take
 * up to 4 rows of A per weight load, and both groups of a unit per broadcast of A; a row's result has
 * the same bits whichever path or pass width computes it.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "blocks.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { PREFETCH = 8192 };                     /* bytes ahead of the weight stream (a sweep of 1-16 KiB) */
enum { ARENA_CHUNK = 64 << 20, HUGE_PAGE = 2 << 20 };

/* ---------------- the packed weights ----------------
 * Groups of 8 rows, pairs of groups (one work unit); within a pair, block by block, each group's
 * block: 8 scales (fp16 or fp32), then the 8 rows' payload (16 bytes a row at 4 bits, 32 at 8) in
 * chunks of 32 bytes where byte 4r + c of chunk t is row r's byte 4t + c. At 4 bits that byte holds
 * elements 4t + c (low nibble) and 16 + 4t + c (high), at 8 bits element 4t + c. So a pair is one
 * sequential stream (the prefetch runs straight ahead) and a chunk is one dpbusd. */
struct chunk { uint8_t *base; size_t size, used; int refs; };

/* ---------------- the arena: kernels' weights side by side on huge pages ---------------- */
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static chunk *current;

static chunk *chunk_new(size_t need) {
  size_t size = need > ARENA_CHUNK ? (need + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1) : ARENA_CHUNK;
  /* mmap is 4 KiB-aligned: map a huge page more and start at the first 2 MiB boundary */
  uint8_t *raw = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  uint8_t *base = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (base > raw) munmap(raw, (size_t)(base - raw));
  munmap(base + size, (size_t)(raw + HUGE_PAGE - base));
#ifdef MADV_HUGEPAGE
  madvise(base, size, MADV_HUGEPAGE);  /* THP "madvise" hosts; "always" ones need nothing, "never" ones ignore it */
#endif
  chunk *c = malloc(sizeof *c);
  if (!c) { munmap(base, size); return NULL; }
  c->base = base; c->size = size; c->used = 0; c->refs = 0;
  return c;
}

static uint8_t *arena_alloc(size_t n, chunk **home) {
  size_t need = (n + 63) & ~(size_t)63;
  pthread_mutex_lock(&arena_lock);
  if (!current || current->size - current->used < need) {
    chunk *c = chunk_new(need);
    if (!c) { pthread_mutex_unlock(&arena_lock); return NULL; }
    current = c;
  }
  uint8_t *p = current->base + current->used;
  current->used += need; current->refs++;
  *home = current;
  pthread_mutex_unlock(&arena_lock);
  return p;
}

static void arena_release(chunk *c) {
  pthread_mutex_lock(&arena_lock);
  if (--c->refs == 0) {  /* the last kernel on it: a session closed */
    if (c == current) current = NULL;
    munmap(c->base, c->size); free(c);
  }
  pthread_mutex_unlock(&arena_lock);
}

/* ---------------- scales ---------------- */
float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) bits = sign;
    else { float f = ldexpf((float)man, -24); memcpy(&bits, &f, 4); bits |= sign; }
  } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
  else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  float f; memcpy(&f, &bits, 4); return f;
}

/* f as an fp16 if it is one exactly (checked by converting back), else 0 */
static int exact_half(float f, uint16_t *h) {
  uint32_t bits; memcpy(&bits, &f, 4);
  uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
  float a = fabsf(f);
  if (a == 0.0f) { *h = sign; return 1; }
  if (!(a <= 65504.0f)) return 0;  /* too large, inf or nan */
  int e; frexpf(a, &e);            /* a = m * 2^e, m in [0.5, 1) */
  uint16_t out;
  if (e - 1 >= -14) {              /* a normal fp16: 10 bits of mantissa */
    uint32_t m = bits & 0x7fffff;
    out = (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(m >> 13));
  } else {                         /* subnormal: a multiple of 2^-24 */
    float k = ldexpf(a, 24);
    if (k != floorf(k) || k >= 1024.0f) return 0;
    out = (uint16_t)(sign | (uint16_t)k);
  }
  if (half_to_float(out) != f) return 0;
  *h = out; return 1;
}

/* ---------------- A's rows as int8 blocks ---------------- */

static void quantize_row_c(const float *a, int64_t K, int zero, q8_row *out) {
  for (int64_t b = 0; b < K / QK; b++) {
    const float *x = a + b * QK;
    float amax = 0.0f;
    for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < QK; i++) {
      int v = (int)lrintf(x[i] * id);  /* nearest, ties to even (the default rounding mode) */
      out->q[b * QK + i] = (int8_t)v; s += v;
    }
    out->d[b] = d; out->bias[b] = -zero * s;
  }
}

#if defined(__x86_64__)
/* The same arithmetic 16 lanes at a time: max, the same division and reciprocal, cvtps rounds to
 * nearest even as lrintf does (the default rounding mode): the same int8 values, bit for bit. */
__attribute__((target("avx512f,avx512bw"))) static void quantize_row_avx512(const float *a, int64_t K, int zero,
                                                                             q8_row *out) {
  for (int64_t b = 0; b < K / QK; b++) {
    __m512 x0 = _mm512_loadu_ps(a + b * QK), x1 = _mm512_loadu_ps(a + b * QK + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
    _mm_storeu_si128((__m128i *)(out->q + b * QK), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(out->q + b * QK + 16), _mm512_cvtsepi32_epi8(q1));
    out->d[b] = d; out->bias[b] = -zero * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }
}
#endif

void quantize_row(const float *a, int64_t K, int bits, q8_row *out, int vnni) {
  const int zero = bits == 4 ? 8 : 128;
#if defined(__x86_64__)
  if (vnni) { quantize_row_avx512(a, K, zero, out); return; }
#endif
  quantize_row_c(a, K, zero, out);
}

/* ---------------- plain C ---------------- */
static float scale_at(const uint8_t *blk, int r, int sb) {
  if (sb == 2) { uint16_t h; memcpy(&h, blk + 2 * r, 2); return half_to_float(h); }
  float f; memcpy(&f, blk + 4 * r, 4); return f;
}

/* One group (8 rows) over nb blocks; stride: bytes from one of its blocks to the next. */
static void group_c(const uint8_t *g, int64_t stride, const packed *k, const q8_row *a, float *y) {
  for (int r = 0; r < 8; r++) {
    float sum = 0.0f;
    for (int64_t b = 0; b < k->nb; b++) {
      const uint8_t *blk = g + b * stride, *pay = blk + 8 * k->sb;
      const int8_t *q = a->q + b * QK;
      int32_t acc = a->bias[b];
      if (k->bits == 4) {
        for (int t = 0; t < 4; t++)
          for (int c = 0; c < 4; c++) {
            uint8_t v = pay[32 * t + 4 * r + c];
            acc += (v & 0x0f) * q[4 * t + c] + (v >> 4) * q[16 + 4 * t + c];
          }
      } else {
        for (int t = 0; t < 8; t++)
          for (int c = 0; c < 4; c++) acc += pay[32 * t + 4 * r + c] * q[4 * t + c];
      }
      sum += scale_at(blk, r, k->sb) * a->d[b] * (float)acc;
    }
    y[r] = sum;
  }
}

/* ---------------- AVX-512 VNNI (256-bit EVEX forms) ---------------- */
#if defined(__x86_64__)
#define VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,f16c,fma")))

/* 8 rows' integer dots over one block (bias folded in); qa: the block's 32 int8 as 8 int32 */
VNNI static inline __m256i block4(const uint8_t *pay, const int32_t *qa, int32_t bias) {
  const __m256i lo = _mm256_set1_epi8(0x0f);
  __m256i c0 = _mm256_set1_epi32(bias), c1 = _mm256_setzero_si256();
  for (int t = 0; t < 4; t++) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(pay + 32 * t));
    c0 = _mm256_dpbusd_epi32(c0, _mm256_and_si256(v, lo), _mm256_set1_epi32(qa[t]));
    c1 = _mm256_dpbusd_epi32(c1, _mm256_and_si256(_mm256_srli_epi16(v, 4), lo), _mm256_set1_epi32(qa[4 + t]));
  }
  return _mm256_add_epi32(c0, c1);
}

VNNI static inline __m256i block8(const uint8_t *pay, const int32_t *qa, int32_t bias) {
  __m256i c0 = _mm256_set1_epi32(bias), c1 = _mm256_setzero_si256();
  for (int t = 0; t < 8; t += 2) {
    c0 = _mm256_dpbusd_epi32(c0, _mm256_loadu_si256((const __m256i *)(pay + 32 * t)), _mm256_set1_epi32(qa[t]));
    c1 = _mm256_dpbusd_epi32(c1, _mm256_loadu_si256((const __m256i *)(pay + 32 * t + 32)), _mm256_set1_epi32(qa[t + 1]));
  }
  return _mm256_add_epi32(c0, c1);
}

VNNI static inline __m256 scales8(const uint8_t *blk, int sb) {
  return sb == 2 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)) : _mm256_loadu_ps((const float *)blk);
}

/* One work unit: 1 or 2 groups of a pair (their blocks interleaved), one row of A. Specialised per
 * (bits, scale bytes) so the inner loop has no branches. */
VNNI static inline __attribute__((always_inline)) void unit_vnni_impl(
    const uint8_t *pair, int groups, const packed *k, const q8_row *a, float *y, const int bits, const int sb) {
  const int32_t *qa = (const int32_t *)a->q;
  const int64_t bs = 8 * sb + 8 * (bits == 4 ? 16 : 32);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  if (groups == 2) {
    for (int64_t b = 0; b < k->nb; b++) {
      const uint8_t *b0 = pair + b * 2 * bs, *b1 = b0 + bs;
      for (int64_t off = 0; off < 2 * bs; off += 64) _mm_prefetch((const char *)b0 + PREFETCH + off, _MM_HINT_T0);
      __m256i p0 = bits == 4 ? block4(b0 + 8 * sb, qa + b * 8, a->bias[b]) : block8(b0 + 8 * sb, qa + b * 8, a->bias[b]);
      __m256i p1 = bits == 4 ? block4(b1 + 8 * sb, qa + b * 8, a->bias[b]) : block8(b1 + 8 * sb, qa + b * 8, a->bias[b]);
      __m256 da = _mm256_set1_ps(a->d[b]);
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(scales8(b0, sb), da), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(scales8(b1, sb), da), acc1);
    }
    _mm256_storeu_ps(y, acc0);
    _mm256_storeu_ps(y + 8, acc1);
  } else {
    for (int64_t b = 0; b < k->nb; b++) {
      const uint8_t *b0 = pair + b * bs;
      __m256i p0 = bits == 4 ? block4(b0 + 8 * sb, qa + b * 8, a->bias[b]) : block8(b0 + 8 * sb, qa + b * 8, a->bias[b]);
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(scales8(b0, sb), _mm256_set1_ps(a->d[b])), acc0);
    }
    _mm256_storeu_ps(y, acc0);
  }
}

/* R rows of A (2-4) against a unit's groups at once (a prefill, or a verified chain), the registers
 * tiled R x groups: each block's weights are loaded and unpacked once for the R rows, and each of A's
 * broadcasts serves both groups, so the dpbusds are not waiting on loads (a pass of many tokens is
 * bound by them; at one token, memory is): benchmarks/matmul_op.py, README.md's "Passes of several
 * tokens".
 * Each (row, group)'s float sum goes block by block as unit_vnni's: the same bits. */
VNNI static inline __attribute__((always_inline)) void tile_vnni_impl(
    const uint8_t *pair, const packed *k, const q8_row *a, float *y, int64_t ldy,
    const int R, const int G, const int bits, const int sb) {
  const int64_t bs = 8 * sb + 8 * (bits == 4 ? 16 : 32);
  const __m256i lo = _mm256_set1_epi8(0x0f);
  __m256 acc[4][2];
  for (int r = 0; r < R; r++)
    for (int g = 0; g < G; g++) acc[r][g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k->nb; b++) {
    const uint8_t *blk = pair + b * G * bs;  /* group g's block at blk + g * bs */
    __m256i s[4][2];
    for (int r = 0; r < R; r++)
      for (int g = 0; g < G; g++) s[r][g] = _mm256_set1_epi32(a[r].bias[b]);
    if (bits == 4) {
      for (int t = 0; t < 4; t++) {  /* chunk t: elements 4t + c (low nibbles) and 16 + 4t + c (high) */
        __m256i low[2], high[2];
        for (int g = 0; g < G; g++) {
          const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + g * bs + 8 * sb + 32 * t));
          low[g] = _mm256_and_si256(v, lo); high[g] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo);
        }
        for (int r = 0; r < R; r++) {
          const int32_t *qa = (const int32_t *)a[r].q + b * 8;
          const __m256i x = _mm256_set1_epi32(qa[t]), z = _mm256_set1_epi32(qa[4 + t]);
          for (int g = 0; g < G; g++) s[r][g] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(s[r][g], low[g], x), high[g], z);
        }
      }
    } else {
      for (int t = 0; t < 8; t++) {
        __m256i w[2];
        for (int g = 0; g < G; g++) w[g] = _mm256_loadu_si256((const __m256i *)(blk + g * bs + 8 * sb + 32 * t));
        for (int r = 0; r < R; r++) {
          const __m256i x = _mm256_set1_epi32(((const int32_t *)a[r].q)[b * 8 + t]);
          for (int g = 0; g < G; g++) s[r][g] = _mm256_dpbusd_epi32(s[r][g], w[g], x);
        }
      }
    }
    for (int g = 0; g < G; g++) {
      const __m256 dw = scales8(blk + g * bs, sb);
      for (int r = 0; r < R; r++)
        acc[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][g]), _mm256_mul_ps(dw, _mm256_set1_ps(a[r].d[b])), acc[r][g]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int g = 0; g < G; g++) _mm256_storeu_ps(y + r * ldy + 8 * g, acc[r][g]);
}

/* one specialisation per (R, groups, bits, scale bytes): the loops above unrolled, nothing branching */
#define TILE_FOR(R)                                                                                         \
  VNNI static void tile##R##_vnni(const uint8_t *pair, int groups, const packed *k, const q8_row *a, float *y, \
                                  int64_t ldy) {                                                            \
    if (groups == 2) {                                                                                      \
      if (k->bits == 4 && k->sb == 2) tile_vnni_impl(pair, k, a, y, ldy, R, 2, 4, 2);                       \
      else if (k->bits == 4) tile_vnni_impl(pair, k, a, y, ldy, R, 2, 4, 4);                                \
      else if (k->sb == 2) tile_vnni_impl(pair, k, a, y, ldy, R, 2, 8, 2);                                  \
      else tile_vnni_impl(pair, k, a, y, ldy, R, 2, 8, 4);                                                  \
    } else {                                                                                                \
      if (k->bits == 4 && k->sb == 2) tile_vnni_impl(pair, k, a, y, ldy, R, 1, 4, 2);                       \
      else if (k->bits == 4) tile_vnni_impl(pair, k, a, y, ldy, R, 1, 4, 4);                                \
      else if (k->sb == 2) tile_vnni_impl(pair, k, a, y, ldy, R, 1, 8, 2);                                  \
      else tile_vnni_impl(pair, k, a, y, ldy, R, 1, 8, 4);                                                  \
    }                                                                                                       \
  }
TILE_FOR(2)
TILE_FOR(3)
TILE_FOR(4)

VNNI static void unit_vnni(const uint8_t *pair, int groups, const packed *k, const q8_row *a, float *y) {
  if (k->bits == 4 && k->sb == 2) unit_vnni_impl(pair, groups, k, a, y, 4, 2);
  else if (k->bits == 4) unit_vnni_impl(pair, groups, k, a, y, 4, 4);
  else if (k->sb == 2) unit_vnni_impl(pair, groups, k, a, y, 8, 2);
  else unit_vnni_impl(pair, groups, k, a, y, 8, 4);
}
#endif

static int cpu_has_vnni(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

int plain_c_asked(void) {
  const char *env = getenv("TRT_LLM_CPU_KERNELS");
  return env && strcmp(env, "c") == 0;
}

/* The path a kernel takes, chosen when it is made: VNNI where the CPU has it, unless
 * TRT_LLM_CPU_KERNELS=c asks for the plain C one (the tests run both in one process). */
static int choose_vnni(void) { return cpu_has_vnni() && !plain_c_asked(); }

int choose_avx512(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") && !plain_c_asked();
#else
  return 0;
#endif
}

/* ---------------- the matrices ---------------- */
size_t packed_units(const packed *k) { return (size_t)((k->N + UNIT - 1) / UNIT); }

void packed_unit(const packed *k, size_t unit, const q8_row *rows, int64_t M, float *y, int64_t ldy) {
  int64_t n0 = (int64_t)unit * UNIT;
  int groups = n0 + UNIT <= k->N ? 2 : 1;
  const uint8_t *pair = k->w + unit * 2 * (size_t)(k->nb * k->block_bytes);
  y += n0;
  int64_t m = 0;
#if defined(__x86_64__)
  if (k->vnni && M > 1) {  /* tiles of 4 rows, what is left in tiles of 3 and 2 (5 = 3 + 2: no row alone) */
    for (; M - m >= 4 && M - m != 5; m += 4) tile4_vnni(pair, groups, k, &rows[m], y + m * ldy, ldy);
    if (M - m == 5 || M - m == 3) tile3_vnni(pair, groups, k, &rows[m], y + m * ldy, ldy), m += 3;
    if (M - m == 2) tile2_vnni(pair, groups, k, &rows[m], y + m * ldy, ldy), m += 2;
  }
#endif
  for (; m < M; m++) {
#if defined(__x86_64__)
    if (k->vnni) { unit_vnni(pair, groups, k, &rows[m], y + m * ldy); continue; }
#endif
    for (int g = 0; g < groups; g++) group_c(pair + g * k->block_bytes, groups * k->block_bytes, k, &rows[m], y + m * ldy + 8 * g);
  }
}

q8_row *q8_rows_new(int64_t M, int64_t K, uint8_t **buffer) {
  /* one allocation: per row K int8, then nb scales and nb biases; each row 64-byte aligned */
  const int64_t nb = K / QK;
  size_t per_row = ((size_t)K + (size_t)nb * 8 + 63) & ~(size_t)63;
  uint8_t *buf = aligned_alloc(64, per_row * (size_t)(M > 0 ? M : 1));
  q8_row *rows = malloc(sizeof(q8_row) * (size_t)(M > 0 ? M : 1));
  if (!buf || !rows) { free(buf); free(rows); return NULL; }
  for (int64_t m = 0; m < M; m++) {
    uint8_t *base = buf + per_row * (size_t)m;
    rows[m].q = (int8_t *)base; rows[m].d = (float *)(base + K); rows[m].bias = (int32_t *)(base + K + nb * 4);
  }
  *buffer = buf;
  return rows;
}

static void pack(packed *k, const uint8_t *src, int64_t row_bytes, const float *scales, uint8_t *dst) {
  const int64_t payload = k->bits == 4 ? 16 : 32, pair_bytes = 2 * k->nb * k->block_bytes;
  for (int64_t n = 0; n < k->N; n++) {
    int64_t g = n / 8, r = n % 8, pair = g / 2, in_pair = g % 2;
    int groups = pair * UNIT + UNIT <= k->N ? 2 : 1;
    for (int64_t b = 0; b < k->nb; b++) {
      uint8_t *blk = dst + pair * pair_bytes + (b * groups + in_pair) * k->block_bytes;
      float s = scales[n * k->nb + b];
      if (k->sb == 2) { uint16_t h; exact_half(s, &h); memcpy(blk + 2 * r, &h, 2); }
      else memcpy(blk + 4 * r, &s, 4);
      const uint8_t *row = src + n * row_bytes + b * payload;  /* MatMulNBits' block */
      uint8_t *pay = blk + 8 * k->sb;
      if (k->bits == 4) {
        uint8_t q[QK];
        for (int j = 0; j < 16; j++) { q[2 * j] = row[j] & 0x0f; q[2 * j + 1] = row[j] >> 4; }
        for (int t = 0; t < 4; t++)
          for (int c = 0; c < 4; c++) pay[32 * t + 4 * r + c] = (uint8_t)(q[4 * t + c] | (q[16 + 4 * t + c] << 4));
      } else {
        for (int t = 0; t < 8; t++)
          for (int c = 0; c < 4; c++) pay[32 * t + 4 * r + c] = row[4 * t + c];
      }
    }
  }
}

/* ORT keeps the initializer we packed from, but never reads it again: where it is a mapping of the
 * engine's weight file (ORT maps page-aligned external data), the pages our read brought in would
 * stay in the process's memory beside our copy. MADV_PAGEOUT hands them back; it is only a hint
 * (anonymous memory with no swap stays as it is), so whatever the initializer is, it keeps its bytes. */
void let_go(const void *p, size_t n) {
#ifdef MADV_PAGEOUT
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + n) & ~(page - 1);
  if (end > start) madvise((void *)start, end - start, MADV_PAGEOUT);
#endif
}

int packed_init(packed *k, int64_t K, int64_t N, int bits, const uint8_t *src, int64_t row_bytes, const float *scales) {
  const int64_t nb = K / QK, blocks = N * nb, payload = bits == 4 ? 16 : 32;
  k->K = K; k->N = N; k->nb = nb; k->bits = bits; k->sb = 2; k->vnni = choose_vnni();
  for (int64_t i = 0; i < blocks && k->sb == 2; i++) {
    uint16_t h;
    if (!exact_half(scales[i], &h)) k->sb = 4;
  }
  k->block_bytes = 8 * k->sb + 8 * payload;
  uint8_t *w = arena_alloc((size_t)(N / 8) * (size_t)(nb * k->block_bytes), &k->home);
  if (!w) return -1;
  pack(k, src, row_bytes, scales, w);
  k->w = w;
  return 0;
}

void packed_free(packed *k) {
  if (k->home) arena_release(k->home);
  k->home = NULL;
}
