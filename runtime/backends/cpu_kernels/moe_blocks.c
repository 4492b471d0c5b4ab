/* trt_llm.cpu::MoEBlocks8: ONNX Runtime's QMoE (SwiGLU experts, 4 or 8 bits in blocks of 32 or a
 * multiple of it, accuracy level 4) as a kernel of our own: a sparse block at a few tokens reads only the
 * chosen experts' weights, so like a decode step it is bound by memory, and QMoE reached ~2.5 GB/s of a
 * ~30 GB/s machine at one token (issue 44 item 5; benchmarks/moe_op.py).
 *
 * The node takes QMoE's operands as plugins/moe.py's lowering gives them (rewrite.py swaps it in as a
 * session opens; QMoE stays the fallback):
 *   hidden          float32 [..., H]
 *   router_logits   float32 [T, E], T = the tokens of hidden
 *   gate_up         uint8 [E, 2I, H * bits / 8], constant: row 2i expert's gate_i, row 2i + 1 its up_i
 *   gate_up_scales  float32 [E, 2I, H / G], constant
 *   down            uint8 [E, H, I * bits / 8], constant
 *   down_scales     float32 [E, H, I / G], constant
 *   attributes k (experts a token takes), normalize (0 or 1), bits (4 or 8), block_size (G)
 *   Y               float32 [..., H]
 * Values unsigned with QMoE's implicit zero point (8 or 128), at 4 bits the even k in the low nibble:
 * MatMulNBits' layout, so every expert's two matrices are packed as MatMulBlocks8's are (blocks.c), a
 * scale of G inputs repeated over its G / 32 blocks of 32.
 *
 * Per call: routing as transformers' Qwen3MoeSparseMoeBlock and QMoE (softmax over the experts in fp32,
 * the top k, renormalised when normalize); the (token, expert) pairs sorted by expert, so each chosen
 * expert runs once over its tokens (4 at a time where it has several); the tokens quantized once for
 * every gate_up, the gated activations (silu(gate) * up) quantized once for the down projections; each
 * phase split over (expert, 16 output columns) units on the session's intra-op threads; the experts'
 * outputs summed per token by its routing weights, in the order the top k ranks them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "blocks.h"

typedef struct {
  int64_t E, H, I, top_k, normalize, bits;
  packed *gate_up, *down;  /* E each */
} moe_state;

typedef struct {
  const moe_state *s;
  int64_t T, S;              /* tokens; (token, expert) pairs = T * k */
  const float *x, *logits;
  int64_t *expert_of;        /* [T * k]: the token's j-th expert */
  float *weight_of;          /* [T * k]: its routing weight */
  int64_t *slot_of;          /* [T * k]: the pair's place in expert order */
  int64_t *start, *count;    /* [E]: each expert's first slot and its number of slots */
  int64_t *active, n_active; /* experts with tokens */
  q8_row *x_rows, *slot_rows, *act_rows;
  float *gate_up_out, *act, *down_out;
} moe_job;

/* ---------------- the phases, each a ParallelFor body ---------------- */
static void route(void *p, size_t t) {
  const moe_job *j = (const moe_job *)p;
  const int64_t E = j->s->E, k = j->s->top_k;
  const float *z = j->logits + (int64_t)t * E;
  float top = z[0], sum = 0.0f;
  for (int64_t e = 1; e < E; e++) top = fmaxf(top, z[e]);
  for (int64_t e = 0; e < E; e++) sum += expf(z[e] - top);
  float chosen = 0.0f;
  for (int64_t i = 0; i < k; i++) {  /* the i-th largest: ties to the lower index */
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++) {
      int taken = 0;
      for (int64_t q = 0; q < i; q++) taken |= j->expert_of[t * k + q] == e;
      if (!taken && (best < 0 || z[e] > z[best])) best = e;
    }
    j->expert_of[t * k + i] = best;
    j->weight_of[t * k + i] = expf(z[best] - top) / sum;
    chosen += j->weight_of[t * k + i];
  }
  if (j->s->normalize)
    for (int64_t i = 0; i < k; i++) j->weight_of[t * k + i] /= chosen;
  quantize_row(j->x + (int64_t)t * j->s->H, j->s->H, (int)j->s->bits, &j->x_rows[t], j->s->gate_up[0].vnni);
}

static void gate_up_unit(void *p, size_t i) {
  const moe_job *j = (const moe_job *)p;
  const size_t units = packed_units(&j->s->gate_up[0]);
  const int64_t e = j->active[i / units], width = 2 * j->s->I;
  packed_unit(&j->s->gate_up[e], i % units, &j->slot_rows[j->start[e]], j->count[e],
              j->gate_up_out + j->start[e] * width, width);
}

static void activate(void *p, size_t slot) {  /* silu(gate) * up, then quantized for down */
  const moe_job *j = (const moe_job *)p;
  const int64_t I = j->s->I;
  const float *g = j->gate_up_out + (int64_t)slot * 2 * I;
  float *a = j->act + (int64_t)slot * I;
  for (int64_t i = 0; i < I; i++) a[i] = g[2 * i] / (1.0f + expf(-g[2 * i])) * g[2 * i + 1];
  quantize_row(a, I, (int)j->s->bits, &j->act_rows[slot], j->s->down[0].vnni);
}

static void down_unit(void *p, size_t i) {
  const moe_job *j = (const moe_job *)p;
  const size_t units = packed_units(&j->s->down[0]);
  const int64_t e = j->active[i / units], H = j->s->H;
  packed_unit(&j->s->down[e], i % units, &j->act_rows[j->start[e]], j->count[e], j->down_out + j->start[e] * H, H);
}

static OrtStatus *fail(OrtErrorCode code, const char *msg) { return api->CreateStatus(code, msg); }

static OrtStatus *for_each(OrtKernelContext *ctx, void (*fn)(void *, size_t), size_t n, moe_job *j) {
  if (n <= 1) {  /* not worth waking the threads */
    for (size_t i = 0; i < n; i++) fn(j, i);
    return NULL;
  }
  return api->KernelContext_ParallelFor(ctx, fn, n, 0, j);
}

static OrtStatus *run(const moe_state *s, OrtKernelContext *ctx, const float *x, const float *logits, int64_t T,
                      float *y) {
  const int64_t E = s->E, k = s->top_k, S = T * k, H = s->H, I = s->I;
  moe_job j = {s, T, S, x, logits};
  uint8_t *x_buf = NULL, *act_buf = NULL;
  j.expert_of = malloc(sizeof(int64_t) * (size_t)S); j.weight_of = malloc(sizeof(float) * (size_t)S);
  j.slot_of = malloc(sizeof(int64_t) * (size_t)S);
  j.start = calloc((size_t)E, sizeof(int64_t)); j.count = calloc((size_t)E, sizeof(int64_t));
  j.active = malloc(sizeof(int64_t) * (size_t)E);
  j.x_rows = q8_rows_new(T, H, &x_buf); j.act_rows = q8_rows_new(S, I, &act_buf);
  j.slot_rows = malloc(sizeof(q8_row) * (size_t)S);
  j.gate_up_out = malloc(sizeof(float) * (size_t)(S * 2 * I)); j.act = malloc(sizeof(float) * (size_t)(S * I));
  j.down_out = malloc(sizeof(float) * (size_t)(S * H));
  OrtStatus *st = NULL;
  if (!j.expert_of || !j.weight_of || !j.slot_of || !j.start || !j.count || !j.active || !j.x_rows || !j.act_rows ||
      !j.slot_rows || !j.gate_up_out || !j.act || !j.down_out)
    st = fail(ORT_FAIL, "MoEBlocks8: out of memory");
  if (!st) st = for_each(ctx, route, (size_t)T, &j);
  if (!st) {
    /* the pairs in expert order: each expert's tokens side by side */
    for (int64_t p = 0; p < S; p++) j.count[j.expert_of[p]]++;
    for (int64_t e = 0, next = 0; e < E; e++) {
      j.start[e] = next; next += j.count[e];
      if (j.count[e]) j.active[j.n_active++] = e;
    }
    int64_t *filled = calloc((size_t)E, sizeof(int64_t));
    if (!filled) st = fail(ORT_FAIL, "MoEBlocks8: out of memory");
    for (int64_t p = 0; !st && p < S; p++) {
      int64_t e = j.expert_of[p], slot = j.start[e] + filled[e]++;
      j.slot_of[p] = slot;
      j.slot_rows[slot] = j.x_rows[p / k];
    }
    free(filled);
  }
  if (!st) st = for_each(ctx, gate_up_unit, (size_t)j.n_active * packed_units(&s->gate_up[0]), &j);
  if (!st) st = for_each(ctx, activate, (size_t)S, &j);
  if (!st) st = for_each(ctx, down_unit, (size_t)j.n_active * packed_units(&s->down[0]), &j);
  if (!st)
    for (int64_t t = 0; t < T; t++) {
      float *out = y + t * H;
      for (int64_t h = 0; h < H; h++) out[h] = 0.0f;
      for (int64_t i = 0; i < k; i++) {
        const float w = j.weight_of[t * k + i], *d = j.down_out + j.slot_of[t * k + i] * H;
        for (int64_t h = 0; h < H; h++) out[h] += w * d[h];
      }
    }
  free(j.expert_of); free(j.weight_of); free(j.slot_of); free(j.start); free(j.count); free(j.active);
  free(j.x_rows); free(x_buf); free(j.act_rows); free(act_buf); free(j.slot_rows);
  free(j.gate_up_out); free(j.act); free(j.down_out);
  return st;
}

static OrtStatus *compute(void *kernel, OrtKernelContext *ctx) {
  const moe_state *s = (const moe_state *)kernel;
  const OrtValue *in_x, *in_logits; OrtValue *out; OrtTensorTypeAndShapeInfo *info;
  size_t rank, rank_logits; int64_t dims[16], dims_logits[16];
  TRY(api->KernelContext_GetInput(ctx, 0, &in_x));
  TRY(api->KernelContext_GetInput(ctx, 1, &in_logits));
  TRY(api->GetTensorTypeAndShape(in_x, &info));
  OrtStatus *st = api->GetDimensionsCount(info, &rank);
  if (!st && (rank < 1 || rank > 16)) st = fail(ORT_INVALID_ARGUMENT, "MoEBlocks8: hidden must have rank 1 to 16");
  if (!st) st = api->GetDimensions(info, dims, rank);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (st) return st;
  TRY(api->GetTensorTypeAndShape(in_logits, &info));
  st = api->GetDimensionsCount(info, &rank_logits);
  if (!st && (rank_logits < 1 || rank_logits > 16)) st = fail(ORT_INVALID_ARGUMENT, "MoEBlocks8: router_logits' rank");
  if (!st) st = api->GetDimensions(info, dims_logits, rank_logits);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (st) return st;
  int64_t T = 1, T_logits = 1;
  for (size_t d = 0; d + 1 < rank; d++) T *= dims[d];
  for (size_t d = 0; d + 1 < rank_logits; d++) T_logits *= dims_logits[d];
  if (dims[rank - 1] != s->H || dims_logits[rank_logits - 1] != s->E || T_logits != T)
    return fail(ORT_INVALID_ARGUMENT, "MoEBlocks8: hidden must be [..., H] and router_logits [T, E] for its T tokens");
  TRY(api->KernelContext_GetOutput(ctx, 0, dims, rank, &out));
  const float *x, *logits; float *y;
  TRY(api->GetTensorMutableData((OrtValue *)in_x, (void **)&x));
  TRY(api->GetTensorMutableData((OrtValue *)in_logits, (void **)&logits));
  TRY(api->GetTensorMutableData(out, (void **)&y));
  return T ? run(s, ctx, x, logits, T, y) : NULL;
}

/* ---------------- kernel creation: every expert's two matrices packed ---------------- */
static OrtStatus *input_dims(const OrtKernelInfo *info, size_t index, int64_t dims[3]) {
  static const char *message = "MoEBlocks8: gate_up, down and their scales must be rank-3 initializers";
  int is_const = 0; const OrtValue *v = NULL; OrtTensorTypeAndShapeInfo *ti; size_t rank = 0;
  TRY(api->KernelInfoGetConstantInput_tensor(info, index, &is_const, &v));
  if (!is_const || !v) return api->CreateStatus(ORT_INVALID_ARGUMENT, message);
  TRY(api->GetTensorTypeAndShape(v, &ti));
  OrtStatus *st = api->GetDimensionsCount(ti, &rank);
  if (!st && rank != 3) st = api->CreateStatus(ORT_INVALID_ARGUMENT, message);
  if (!st) st = api->GetDimensions(ti, dims, 3);
  api->ReleaseTensorTypeAndShapeInfo(ti);
  return st;
}

static void destroy(void *kernel) {
  moe_state *s = (moe_state *)kernel;
  for (int64_t e = 0; s->gate_up && e < s->E; e++) packed_free(&s->gate_up[e]);
  for (int64_t e = 0; s->down && e < s->E; e++) packed_free(&s->down[e]);
  free(s->gate_up); free(s->down); free(s);
}

/* expert e's matrix (N x K, G inputs a scale) packed, its scales repeated for every block of 32 */
static int pack_expert(packed *k, int64_t N, int64_t K, int64_t G, int bits, const uint8_t *src, const float *scales,
                       float *scratch) {
  const int64_t nb = K / QK, groups = K / G;
  for (int64_t n = 0; n < N; n++)
    for (int64_t b = 0; b < nb; b++) scratch[n * nb + b] = scales[n * groups + b * QK / G];
  return packed_init(k, K, N, bits, src, scratch);
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *a, const OrtKernelInfo *info, void **out) {
  static const char *needs = "MoEBlocks8: needs attributes k, normalize, bits 4 or 8 and block_size (a multiple of 32)";
  int64_t top_k, normalize, bits, G, gu[3], gus[3], dn[3], dns[3];
  TRY(int_attribute(info, "k", &top_k, needs)); TRY(int_attribute(info, "normalize", &normalize, needs));
  TRY(int_attribute(info, "bits", &bits, needs)); TRY(int_attribute(info, "block_size", &G, needs));
  if ((bits != 4 && bits != 8) || G <= 0 || G % QK) return a->CreateStatus(ORT_INVALID_ARGUMENT, needs);
  TRY(input_dims(info, 2, gu)); TRY(input_dims(info, 3, gus)); TRY(input_dims(info, 4, dn)); TRY(input_dims(info, 5, dns));
  const int64_t E = gu[0], H = gu[2] * 8 / bits, I = gu[1] / 2;
  if (E <= 0 || top_k <= 0 || top_k > E || gu[1] % 16 || H % G || I % G || H % 8 || gus[0] != E || gus[1] != 2 * I ||
      gus[2] != H / G || dn[0] != E || dn[1] != H || dn[2] != I * bits / 8 || dns[0] != E || dns[1] != H || dns[2] != I / G)
    return a->CreateStatus(ORT_INVALID_ARGUMENT,
                           "MoEBlocks8: gate_up [E, 2I, H*bits/8], its scales [E, 2I, H/G], down [E, H, I*bits/8], its "
                           "scales [E, H, I/G]: 1 <= k <= E, I a multiple of 8 and of G, H of 8 and of G");
  const void *w1, *s1, *w2, *s2;
  static const char *shapes = "MoEBlocks8: the experts' weights must be initializers";
  TRY(constant_input(info, 2, E * gu[1] * gu[2], &w1, shapes)); TRY(constant_input(info, 3, E * gus[1] * gus[2], &s1, shapes));
  TRY(constant_input(info, 4, E * dn[1] * dn[2], &w2, shapes)); TRY(constant_input(info, 5, E * dns[1] * dns[2], &s2, shapes));
  moe_state *s = calloc(1, sizeof *s);
  float *scratch = malloc(sizeof(float) * (size_t)(2 * I * (H / QK) > H * (I / QK) ? 2 * I * (H / QK) : H * (I / QK)));
  if (s) { s->gate_up = calloc((size_t)E, sizeof(packed)); s->down = calloc((size_t)E, sizeof(packed)); s->E = E; }
  int failed = !s || !scratch || !s->gate_up || !s->down;
  for (int64_t e = 0; !failed && e < E; e++) {
    failed = pack_expert(&s->gate_up[e], 2 * I, H, G, (int)bits, (const uint8_t *)w1 + e * gu[1] * gu[2],
                         (const float *)s1 + e * gus[1] * gus[2], scratch) ||
             pack_expert(&s->down[e], H, I, G, (int)bits, (const uint8_t *)w2 + e * dn[1] * dn[2],
                         (const float *)s2 + e * dns[1] * dns[2], scratch);
  }
  free(scratch);
  if (failed) {
    if (s) destroy(s);
    return a->CreateStatus(ORT_FAIL, "MoEBlocks8: out of memory for the packed experts");
  }
  s->H = H; s->I = I; s->top_k = top_k; s->normalize = normalize; s->bits = bits;
  let_go(w1, (size_t)(E * gu[1] * gu[2])); let_go(s1, (size_t)(E * gus[1] * gus[2]) * 4);
  let_go(w2, (size_t)(E * dn[1] * dn[2])); let_go(s2, (size_t)(E * dns[1] * dns[2]) * 4);
  *out = s;
  return NULL;
}

static const char *op_name(const OrtCustomOp *op) { return "MoEBlocks8"; }
static const char *provider(const OrtCustomOp *op) { return "CPUExecutionProvider"; }
static ONNXTensorElementDataType in_type(const OrtCustomOp *op, size_t i) {
  return i == 2 || i == 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static ONNXTensorElementDataType out_type(const OrtCustomOp *op, size_t i) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t six(const OrtCustomOp *op) { return 6; }
static size_t one(const OrtCustomOp *op) { return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) { return INPUT_OUTPUT_REQUIRED; }
static OrtMemType cpu_memory(const OrtCustomOp *op, size_t i) { return OrtMemTypeDefault; }

static OrtCustomOp moe_blocks8 = {
  .version = ORT_API_VERSION, .CreateKernelV2 = create_kernel, .GetName = op_name,
  .GetExecutionProviderType = provider, .GetInputType = in_type, .GetInputTypeCount = six,
  .GetOutputType = out_type, .GetOutputTypeCount = one, .KernelComputeV2 = compute, .KernelDestroy = destroy,
  .GetInputCharacteristic = required, .GetOutputCharacteristic = required, .GetInputMemoryType = cpu_memory,
};

const OrtCustomOp *moe_blocks_op(void) { return &moe_blocks8; }
