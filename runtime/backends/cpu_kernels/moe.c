/* trt_llm.cpu::MixtureOfExperts: ONNX Runtime's float32 MoE (SwiGLU experts, gate and up rows interleaved)
 * as a kernel of our own, for the decode step at one token, which reads its k chosen experts' weights
 * once and is bound by memory (issue 44, benchmarks/moe_op.py, two layers at one token on a 2-core machine:
 * ONNX Runtime's MoE read them at 27 GB/s, this kernel at 32, the machine's read speed). rewrite.swap_moe
 * swaps it in for the node our lowering writes
 * (plugins/moe.lower_for_onnxruntime), so the engine on disk is unchanged and the stock op stays the
 * fallback:
 *   0 hidden         float [..., H]
 *   1 router_logits  float [T, E]        T = the hidden's rows
 *   2 gate_up        float [E, 2I, H]    constant: row 2i gate_i, row 2i + 1 up_i
 *   3 down           float [E, H, I]     constant
 * Attributes: k (experts per token), normalize (renormalise the top k's probabilities to sum to 1).
 * Output [..., H]: for each token, softmax(logits) over all E in float32, its k largest (ties: the lower
 * expert), renormalised where asked; the sum over them, in that order, of p_e down_e(silu(gate_e x) up_e x).
 *
 * The weights are read in place (ORT's initializers: an expert layer is hundreds of MB). Work units are
 * blocks of one chosen expert's rows, each row read once for every token routed to it (up to 4 at a
 * time in registers), a fixed distance prefetched ahead; the threads take the units of the gate/up
 * products, then those of the down products, then rows of the output to sum (KernelContext_ParallelFor).
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
enum { ROWS_PER_UNIT = 32, TOKENS_AT_ONCE = 4, PREFETCH_BYTES = 8192 };

typedef struct { int64_t k; int normalize; int avx512; } moe;

/* One call: the routes (token t's j-th expert and weight), grouped by expert as "slots". */
typedef struct {
  int64_t T, H, I, E, k;
  const float *x, *gate_up, *down;
  float *y;
  int avx512;
  int32_t *slot_expert;   /* [slots]: the distinct experts chosen, in order of first use */
  int32_t *slot_start;    /* [slots + 1]: its routes in route_token */
  int32_t *route_token;   /* [T k], by slot: the tokens routed to each */
  int32_t *route_at;      /* [T k]: token t's j-th route (at t k + j): its index in the by-slot order */
  float *weight;          /* [T k]: token t's j-th weight */
  float *act;             /* [T k, I]: each route's silu(gate) * up */
  float *part;            /* [T k, H]: each route's down product */
  int64_t up_per, down_per;  /* units a slot's gate/up and down products take: unit u is slot u / per's */
} call;

/* ---------------- dots: one row against n <= 4 vectors ---------------- */
static void dots_c(const float *w, const float *const *v, int n, int64_t len, float *out) {
  for (int t = 0; t < n; t++) {
    float s = 0.f;
    for (int64_t i = 0; i < len; i++) s += w[i] * v[t][i];
    out[t] = s;
  }
}

#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f,fma")))
/* len a multiple of 16; four chains a vector, the row loaded once for all n, each of its cache lines
 * prefetched PREFETCH_BYTES ahead (a C loop over 151 MB of rows, 2 threads here: 25.3 GB/s without, 27.1
 * with; a scratch measurement, not a benchmarks/ script) */
AVX512 static inline __attribute__((always_inline)) void dots_avx512_n(const float *w, const float *const *v,
                                                                       const int n, int64_t len, float *out) {
  __m512 a[TOKENS_AT_ONCE][4];
  for (int t = 0; t < n; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= len; i += 64) {
    for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(w + i + 16 * l) + PREFETCH_BYTES, _MM_HINT_T0);
    __m512 x[4];
    for (int l = 0; l < 4; l++) x[l] = _mm512_loadu_ps(w + i + 16 * l);
    for (int t = 0; t < n; t++)
      for (int l = 0; l < 4; l++) a[t][l] = _mm512_fmadd_ps(x[l], _mm512_loadu_ps(v[t] + i + 16 * l), a[t][l]);
  }
  for (int l = 0; i < len; i += 16, l++) {  /* (len - i: 16, 32 or 48 left) */
    const __m512 x = _mm512_loadu_ps(w + i);
    for (int t = 0; t < n; t++) a[t][l] = _mm512_fmadd_ps(x, _mm512_loadu_ps(v[t] + i), a[t][l]);
  }
  for (int t = 0; t < n; t++)
    out[t] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[t][0], a[t][1]), _mm512_add_ps(a[t][2], a[t][3])));
}

AVX512 static void dots_avx512(const float *w, const float *const *v, int n, int64_t len, float *out) {
  switch (n) {
    case 1: dots_avx512_n(w, v, 1, len, out); break;
    case 2: dots_avx512_n(w, v, 2, len, out); break;
    case 3: dots_avx512_n(w, v, 3, len, out); break;
    default: dots_avx512_n(w, v, 4, len, out); break;
  }
}
#endif

static void dots(const call *c, const float *w, const float *const *v, int n, int64_t len, float *out) {
#if defined(__x86_64__)
  if (c->avx512) { dots_avx512(w, v, n, len, out); return; }
#endif
  dots_c(w, v, n, len, out);
}

/* ---------------- the three passes ---------------- */
static float silu(float g) { return g / (1.f + expf(-g)); }

/* gate/up unit u: ROWS_PER_UNIT / 2 (gate, up) pairs of one slot's expert, for every token routed to it */
static void up_unit(void *p, size_t u) {
  const call *c = (const call *)p;
  const int64_t s = (int64_t)u / c->up_per, first = (int64_t)u % c->up_per * (ROWS_PER_UNIT / 2);
  const int64_t e = c->slot_expert[s], start = c->slot_start[s], count = c->slot_start[s + 1] - start;
  const int64_t last = first + ROWS_PER_UNIT / 2 < c->I ? first + ROWS_PER_UNIT / 2 : c->I;
  for (int64_t r0 = 0; r0 < count; r0 += TOKENS_AT_ONCE) {
    const int n = count - r0 < TOKENS_AT_ONCE ? (int)(count - r0) : TOKENS_AT_ONCE;
    const float *v[TOKENS_AT_ONCE];
    for (int t = 0; t < n; t++) v[t] = c->x + c->route_token[start + r0 + t] * c->H;
    for (int64_t i = first; i < last; i++) {
      float g[TOKENS_AT_ONCE], up[TOKENS_AT_ONCE];
      const float *row = c->gate_up + (e * 2 * c->I + 2 * i) * c->H;
      dots(c, row, v, n, c->H, g);
      dots(c, row + c->H, v, n, c->H, up);
      for (int t = 0; t < n; t++) c->act[(start + r0 + t) * c->I + i] = silu(g[t]) * up[t];
    }
  }
}

/* down unit u: ROWS_PER_UNIT rows of one slot's expert's down product, for every token routed to it */
static void down_unit(void *p, size_t u) {
  const call *c = (const call *)p;
  const int64_t s = (int64_t)u / c->down_per, first = (int64_t)u % c->down_per * ROWS_PER_UNIT;
  const int64_t e = c->slot_expert[s], start = c->slot_start[s], count = c->slot_start[s + 1] - start;
  const int64_t last = first + ROWS_PER_UNIT < c->H ? first + ROWS_PER_UNIT : c->H;
  for (int64_t r0 = 0; r0 < count; r0 += TOKENS_AT_ONCE) {
    const int n = count - r0 < TOKENS_AT_ONCE ? (int)(count - r0) : TOKENS_AT_ONCE;
    const float *v[TOKENS_AT_ONCE];
    for (int t = 0; t < n; t++) v[t] = c->act + (start + r0 + t) * c->I;
    for (int64_t h = first; h < last; h++) {
      float out[TOKENS_AT_ONCE];
      dots(c, c->down + (e * c->H + h) * c->I, v, n, c->I, out);
      for (int t = 0; t < n; t++) c->part[(start + r0 + t) * c->H + h] = out[t];
    }
  }
}

/* token t's output: its routes' weighted down products, in its order of experts */
static void sum_token(void *p, size_t t) {
  const call *c = (const call *)p;
  float *y = c->y + (int64_t)t * c->H;
  for (int64_t h = 0; h < c->H; h++) y[h] = 0.f;
  for (int64_t j = 0; j < c->k; j++) {
    const float w = c->weight[t * c->k + j], *part = c->part + (int64_t)c->route_at[t * c->k + j] * c->H;
    for (int64_t h = 0; h < c->H; h++) y[h] += w * part[h];
  }
}

/* ---------------- routing ---------------- */
/* token t's k experts (largest probability first; ties: the lower expert) and their weights */
static void route(const float *logits, int64_t E, int64_t k, int normalize, int32_t *chosen, float *weight,
                  float *probs) {
  float top = -INFINITY, sum = 0.f;
  for (int64_t e = 0; e < E; e++) top = logits[e] > top ? logits[e] : top;
  for (int64_t e = 0; e < E; e++) sum += probs[e] = expf(logits[e] - top);
  for (int64_t e = 0; e < E; e++) probs[e] /= sum;
  float kept = 0.f;
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++)
      if (probs[e] >= 0.f && (best < 0 || probs[e] > probs[best])) best = e;
    chosen[j] = (int32_t)best; weight[j] = probs[best]; kept += probs[best];
    probs[best] = -1.f;  /* (taken) */
  }
  if (normalize)
    for (int64_t j = 0; j < k; j++) weight[j] /= kept;
}

static OrtStatus *fail(const char *msg) { return api->CreateStatus(ORT_INVALID_ARGUMENT, msg); }

static OrtStatus *shape(const OrtValue *v, int64_t *dims, size_t *rank) {
  OrtTensorTypeAndShapeInfo *info;
  TRY(api->GetTensorTypeAndShape(v, &info));
  OrtStatus *st = api->GetDimensionsCount(info, rank);
  if (!st && (*rank < 1 || *rank > 8)) st = fail("MixtureOfExperts: an input's rank must be 1 to 8");
  if (!st) st = api->GetDimensions(info, dims, *rank);
  api->ReleaseTensorTypeAndShapeInfo(info);
  return st;
}

static OrtStatus *run(const moe *m, OrtKernelContext *ctx, call *c) {
  const OrtValue *in[4];
  int64_t d[4][8];
  size_t r[4];
  for (size_t i = 0; i < 4; i++) {
    TRY(api->KernelContext_GetInput(ctx, i, &in[i]));
    if (!in[i]) return fail("MixtureOfExperts: an input is missing");
    TRY(shape(in[i], d[i], &r[i]));
  }
  int64_t T = 1;
  for (size_t i = 0; i + 1 < r[0]; i++) T *= d[0][i];
  const int64_t H = d[0][r[0] - 1], E = d[2][0], I = d[3][2];
  if (r[1] != 2 || d[1][0] != T || d[1][1] != E || r[2] != 3 || d[2][1] != 2 * I || d[2][2] != H || r[3] != 3 ||
      d[3][0] != E || d[3][1] != H || m->k > E || H % 16 || I % 16)
    return fail("MixtureOfExperts: needs hidden [..., H], router_logits [T, E], gate_up [E, 2I, H], down [E, H, I], "
                "k <= E, H and I multiples of 16");
  OrtValue *out;
  TRY(api->KernelContext_GetOutput(ctx, 0, d[0], r[0], &out));
  c->T = T; c->H = H; c->I = I; c->E = E; c->k = m->k; c->avx512 = m->avx512;
  TRY(api->GetTensorMutableData((OrtValue *)in[0], (void **)&c->x));
  TRY(api->GetTensorMutableData((OrtValue *)in[2], (void **)&c->gate_up));
  TRY(api->GetTensorMutableData((OrtValue *)in[3], (void **)&c->down));
  TRY(api->GetTensorMutableData(out, (void **)&c->y));
  const float *logits;
  TRY(api->GetTensorMutableData((OrtValue *)in[1], (void **)&logits));
  if (T == 0) return NULL;
  const int64_t routes = T * m->k;
  /* the call's scratch: integers (routes, slots) and floats (weights, activations, down products) */
  int32_t *ints = malloc(sizeof(int32_t) * (size_t)(3 * routes + 4 * E + 1));
  float *floats = malloc(sizeof(float) * (size_t)(routes * (1 + I + H) + E));
  if (!ints || !floats) { free(ints); free(floats); return api->CreateStatus(ORT_FAIL, "MixtureOfExperts: out of memory"); }
  int32_t *chosen = ints;                      /* [routes]: token t's j-th expert at t k + j */
  c->route_token = chosen + routes;            /* [routes], by slot */
  c->route_at = c->route_token + routes;       /* [routes] */
  int32_t *slot_of = c->route_at + routes;     /* [E]: an expert's slot, or -1 */
  c->slot_expert = slot_of + E;                /* [E] */
  c->slot_start = c->slot_expert + E;          /* [E + 1] */
  int32_t *next = c->slot_start + E + 1;       /* [E]: where each slot's next route goes */
  c->weight = floats; c->act = c->weight + routes; c->part = c->act + routes * I;
  float *probs = c->part + routes * H;         /* [E] */
  for (int64_t t = 0; t < T; t++) route(logits + t * E, E, m->k, m->normalize, chosen + t * m->k, c->weight + t * m->k, probs);
  /* slots: the chosen experts in order of first use; their routes grouped by slot, tokens in order */
  for (int64_t e = 0; e < E; e++) slot_of[e] = -1;
  int64_t slots = 0;
  for (int64_t i = 0; i < routes; i++)
    if (slot_of[chosen[i]] < 0) { slot_of[chosen[i]] = (int32_t)slots; c->slot_expert[slots++] = chosen[i]; }
  for (int64_t s = 0; s <= slots; s++) c->slot_start[s] = 0;
  for (int64_t i = 0; i < routes; i++) c->slot_start[slot_of[chosen[i]] + 1]++;
  for (int64_t s = 0; s < slots; s++) c->slot_start[s + 1] += c->slot_start[s];
  for (int64_t s = 0; s < slots; s++) next[s] = c->slot_start[s];
  for (int64_t i = 0; i < routes; i++) {
    const int32_t at = next[slot_of[chosen[i]]]++;
    c->route_token[at] = (int32_t)(i / m->k);
    c->route_at[i] = at;
  }
  /* units: per slot, its rows in blocks */
  c->up_per = (I + ROWS_PER_UNIT / 2 - 1) / (ROWS_PER_UNIT / 2);
  c->down_per = (H + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
  OrtStatus *st = api->KernelContext_ParallelFor(ctx, up_unit, (size_t)(slots * c->up_per), 0, c);
  if (!st) st = api->KernelContext_ParallelFor(ctx, down_unit, (size_t)(slots * c->down_per), 0, c);
  if (!st) {
    if (T == 1) sum_token(c, 0);
    else st = api->KernelContext_ParallelFor(ctx, sum_token, (size_t)T, 0, c);
  }
  free(ints); free(floats);
  return st;
}

static OrtStatus *compute(void *kernel, OrtKernelContext *ctx) {
  call c;
  memset(&c, 0, sizeof c);
  return run((const moe *)kernel, ctx, &c);
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *unused, const OrtKernelInfo *info, void **out) {
  int64_t k = 0, normalize = 0;
  OrtStatus *st = api->KernelInfoGetAttribute_int64(info, "k", &k);
  if (st) { api->ReleaseStatus(st); k = 0; }
  st = api->KernelInfoGetAttribute_int64(info, "normalize", &normalize);
  if (st) { api->ReleaseStatus(st); normalize = 0; }
  if (k <= 0) return fail("MixtureOfExperts: needs an attribute k >= 1");
  moe *m = calloc(1, sizeof *m);
  if (!m) return api->CreateStatus(ORT_FAIL, "MixtureOfExperts: out of memory");
  m->k = k; m->normalize = normalize != 0;
  m->avx512 = choose_avx512();
  *out = m;
  return NULL;
}

static void destroy(void *kernel) { free(kernel); }
static const char *op_name(const OrtCustomOp *op) { return "MixtureOfExperts"; }
static const char *provider(const OrtCustomOp *op) { return "CPUExecutionProvider"; }
static ONNXTensorElementDataType float_type(const OrtCustomOp *op, size_t i) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t four(const OrtCustomOp *op) { return 4; }
static size_t one(const OrtCustomOp *op) { return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) { return INPUT_OUTPUT_REQUIRED; }
static OrtMemType cpu_memory(const OrtCustomOp *op, size_t i) { return OrtMemTypeDefault; }

static OrtCustomOp mixture_of_experts = {
  .version = ORT_API_VERSION, .CreateKernelV2 = create_kernel, .GetName = op_name,
  .GetExecutionProviderType = provider, .GetInputType = float_type, .GetInputTypeCount = four,
  .GetOutputType = float_type, .GetOutputTypeCount = one, .KernelComputeV2 = compute, .KernelDestroy = destroy,
  .GetInputCharacteristic = required, .GetOutputCharacteristic = required, .GetInputMemoryType = cpu_memory,
};

HIDDEN OrtCustomOp *moe_op(const OrtApi *ort) {
  api = ort;
  return &mixture_of_experts;
}
