/* trt_llm.cpu::MatMulBlocks8: ONNX Runtime's MatMulNBits (4 or 8 bits, blocks of 32, no zero points,
 * accuracy level 4) as a kernel of our own, for the decode step at one token, which reads every weight
 * once and is bound by memory (issue 44: MatMulNBits reached ~20 GB/s of a ~30 GB/s machine). Also the
 * library's entry point, RegisterCustomOps.
 *
 * The node takes MatMulNBits' own inputs and attributes, so the engine on disk is unchanged and the
 * stock op stays the fallback (runtime/backends/cpu_kernels/rewrite.py swaps the op type at load):
 *   A       float32 [..., K]
 *   B       uint8 [N, ceil(K/G), G * bits/8], constant: 4 bits, element 2j in byte j's low nibble, 2j+1
 *           in its high one; or 8 bits, one byte each; unsigned, zero point 8 or 128 (MatMulNBits' default)
 *   scales  float32 or float16 [N * ceil(K/G)], constant (fp16: a GGUF's, as the build stores them, read
 *           from the initializer rewrite.py gives in place of the Cast that widens it)
 *   offsets float32 [K/O, N], constant, optional (a Q4_1 file's block minimums: rewrite.fold_offsets
 *           folds our lowering's ReduceSum + MatMul + Add that add them into the node)
 *   attributes K (a multiple of 32), N (of 8), bits (4 or 8), block_size (G: 32 or a multiple of it),
 *           offsets_group (O, with offsets: a divisor of K)
 *   Y       float32 [..., N] = A @ W^T + sums(A) @ offsets, W[n, k] = (B[n, k] - zero) * scales[n, k/G],
 *           sums(A)[b] = the sum of A's O values of block b (in float, in order: a row's own bits)
 * The weights are packed once at kernel creation (blocks.c); A's rows are quantized on the session's
 * intra-op threads, then the output's units of 16 columns are computed on them (KernelContext_ParallelFor).
 * Only ONNX Runtime's C API is used; its header comes from Debian's libonnxruntime-dev (headers.py).
 */
#include <stdlib.h>
#include <string.h>
#include "blocks.h"
#include "onnxruntime_c_api.h"

static const OrtApi *api;

#define TRY(x) do { OrtStatus *s_ = (x); if (s_) return s_; } while (0)

/* the kernel: the packed matrix, and a Q4_1 file's offsets ([K/O, N]: copied) where the node has them */
typedef struct { packed k; float *offsets; int64_t og; } node;

typedef struct { const node *nd; const packed *k; q8_row *rows; float *sums; int64_t M; float *y; const float *a; } job;

static void quantize_rows(void *p, size_t i) {  /* unit i: up to 8 rows of A */
  const job *j = (const job *)p;
  const int64_t K = j->k->K, og = j->nd->og;
  for (int64_t m = (int64_t)i * 8; m < j->M && m < (int64_t)i * 8 + 8; m++) {
    quantize_row(j->a + m * K, K, (int)j->k->bits, &j->rows[m], j->k->vnni);
    for (int64_t b = 0; j->sums && b < K / og; b++) {
      float s = 0.f;
      for (int64_t e = 0; e < og; e++) s += j->a[m * K + b * og + e];
      j->sums[m * (K / og) + b] = s;
    }
  }
}

static void run_unit(void *p, size_t i) {
  const job *j = (const job *)p;
  const int64_t N = j->k->N;
  packed_unit(j->k, i, j->rows, j->M, j->y, N);
  if (!j->sums) return;
  const int64_t n0 = (int64_t)i * UNIT, width = n0 + UNIT <= N ? UNIT : N - n0, nbo = j->k->K / j->nd->og;
  for (int64_t m = 0; m < j->M; m++) {  /* + sums(A) @ offsets for the unit's columns, block by block */
    float extra[UNIT] = {0};
    for (int64_t b = 0; b < nbo; b++) {
      const float s = j->sums[m * nbo + b], *off = j->nd->offsets + b * N + n0;
      for (int64_t n = 0; n < width; n++) extra[n] += s * off[n];
    }
    for (int64_t n = 0; n < width; n++) j->y[m * N + n0 + n] += extra[n];
  }
}

static OrtStatus *fail(OrtErrorCode code, const char *msg) { return api->CreateStatus(code, msg); }

static OrtStatus *compute(void *kernel, OrtKernelContext *ctx) {
  const node *nd = (const node *)kernel;
  const packed *k = &nd->k;
  const OrtValue *in_a; OrtValue *out; OrtTensorTypeAndShapeInfo *info;
  size_t rank; int64_t dims[16];
  TRY(api->KernelContext_GetInput(ctx, 0, &in_a));
  TRY(api->GetTensorTypeAndShape(in_a, &info));
  OrtStatus *st = api->GetDimensionsCount(info, &rank);
  if (!st && (rank < 1 || rank > 16)) st = fail(ORT_INVALID_ARGUMENT, "MatMulBlocks8: A must have rank 1 to 16");
  if (!st) st = api->GetDimensions(info, dims, rank);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (st) return st;
  if (dims[rank - 1] != k->K) return fail(ORT_INVALID_ARGUMENT, "MatMulBlocks8: A's last dimension must be the node's K");
  int64_t M = 1;
  for (size_t d = 0; d + 1 < rank; d++) M *= dims[d];
  dims[rank - 1] = k->N;
  TRY(api->KernelContext_GetOutput(ctx, 0, dims, rank, &out));
  const float *a; float *y;
  TRY(api->GetTensorMutableData((OrtValue *)in_a, (void **)&a));
  TRY(api->GetTensorMutableData(out, (void **)&y));
  if (M == 0) return NULL;
  uint8_t *buf;
  q8_row *rows = q8_rows_new(M, k->K, &buf);
  if (!rows) return fail(ORT_FAIL, "MatMulBlocks8: out of memory");
  float *sums = nd->offsets ? malloc(sizeof(float) * (size_t)(M * (k->K / nd->og))) : NULL;
  if (nd->offsets && !sums) { free(buf); free(rows); return fail(ORT_FAIL, "MatMulBlocks8: out of memory"); }
  job j = {nd, k, rows, sums, M, y, a};
  if (M <= 8) quantize_rows(&j, 0);  /* a decode step: not worth waking the threads */
  else st = api->KernelContext_ParallelFor(ctx, quantize_rows, (size_t)((M + 7) / 8), 0, &j);
  if (!st) st = api->KernelContext_ParallelFor(ctx, run_unit, packed_units(k), 0, &j);
  free(buf); free(rows); free(sums);
  return st;
}

/* a constant input's data, checked to hold `expect` elements; its element type into *type where asked */
static OrtStatus *constant_input(const OrtKernelInfo *info, size_t index, int64_t expect, const void **data,
                                 const char *message, ONNXTensorElementDataType *type) {
  int is_const = 0; const OrtValue *v = NULL;
  TRY(api->KernelInfoGetConstantInput_tensor(info, index, &is_const, &v));
  if (!is_const || !v) return api->CreateStatus(ORT_INVALID_ARGUMENT, message);
  OrtTensorTypeAndShapeInfo *ti; size_t count = 0;
  TRY(api->GetTensorTypeAndShape(v, &ti));
  OrtStatus *st = api->GetTensorShapeElementCount(ti, &count);
  if (!st && type) st = api->GetTensorElementType(ti, type);
  api->ReleaseTensorTypeAndShapeInfo(ti);
  if (st) return st;
  if ((int64_t)count != expect) return api->CreateStatus(ORT_INVALID_ARGUMENT, message);
  return api->GetTensorMutableData((OrtValue *)v, (void **)data);
}

static OrtStatus *int_attribute(const OrtKernelInfo *info, const char *name, int64_t *value, const char *message) {
  OrtStatus *st = api->KernelInfoGetAttribute_int64(info, name, value);
  if (st) { api->ReleaseStatus(st); return api->CreateStatus(ORT_INVALID_ARGUMENT, message); }
  return NULL;
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *a, const OrtKernelInfo *info, void **out) {
  static const char *needs =
      "MatMulBlocks8: needs attributes K (a multiple of 32), N (of 8), bits 4 or 8, block_size (a multiple of 32)";
  int64_t K, N, bits, G;
  TRY(int_attribute(info, "K", &K, needs)); TRY(int_attribute(info, "N", &N, needs));
  TRY(int_attribute(info, "bits", &bits, needs)); TRY(int_attribute(info, "block_size", &G, needs));
  if (G <= 0 || G % QK || (bits != 4 && bits != 8) || K <= 0 || K % QK || N <= 0 || N % 8)
    return a->CreateStatus(ORT_INVALID_ARGUMENT, needs);
  /* MatMulNBits' rows hold whole blocks of G: the last one padded where G does not divide K */
  const int64_t nb = K / QK, groups = (K + G - 1) / G, row_bytes = groups * G * bits / 8;
  static const char *shapes = "MatMulBlocks8: B must be an initializer [N, ceil(K/block_size), block_size*bits/8], scales [N*ceil(K/block_size)]";
  const void *src, *scales;
  ONNXTensorElementDataType scale_type;
  TRY(constant_input(info, 1, N * row_bytes, &src, shapes, NULL));
  TRY(constant_input(info, 2, N * groups, &scales, shapes, &scale_type));
  if (scale_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && scale_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16)
    return a->CreateStatus(ORT_INVALID_ARGUMENT, "MatMulBlocks8: scales must be float32 or float16");
  const int half_scales = scale_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  /* a Q4_1 file's offsets, where the node has them (rewrite.fold_offsets) */
  size_t inputs = 0;
  TRY(a->KernelInfo_GetInputCount(info, &inputs));
  int64_t og = 0;
  const void *offsets = NULL;
  if (inputs > 3) {
    static const char *needs_offsets = "MatMulBlocks8: offsets need an attribute offsets_group dividing K and an "
                                       "initializer [K/offsets_group, N]";
    TRY(int_attribute(info, "offsets_group", &og, needs_offsets));
    if (og <= 0 || K % og) return a->CreateStatus(ORT_INVALID_ARGUMENT, needs_offsets);
    TRY(constant_input(info, 3, K / og * N, &offsets, needs_offsets, NULL));
  }
  /* a scale of G inputs repeated over its G / 32 blocks (the activations round per 32: finer than per G);
   * fp16 scales widened (exactly) first */
  float *per_block = G == QK && !half_scales ? (float *)scales : malloc(sizeof(float) * (size_t)(N * nb));
  node *nd = calloc(1, sizeof *nd);
  packed *k = nd ? &nd->k : NULL;
  if (nd && offsets) {
    nd->og = og;
    nd->offsets = malloc(sizeof(float) * (size_t)(K / og * N));
    if (nd->offsets) memcpy(nd->offsets, offsets, sizeof(float) * (size_t)(K / og * N));
    else k = NULL;
  }
  if (per_block && per_block != scales)
    for (int64_t i = 0; i < N * nb; i++) {
      const int64_t at = (i / nb) * groups + (i % nb) * QK / G;
      per_block[i] = half_scales ? half_to_float(((const uint16_t *)scales)[at]) : ((const float *)scales)[at];
    }
  int failed = !per_block || !k || packed_init(k, K, N, (int)bits, (const uint8_t *)src, row_bytes, per_block);
  if (per_block != scales) free(per_block);
  if (failed) {
    if (nd) free(nd->offsets);
    free(nd);
    return a->CreateStatus(ORT_FAIL, "MatMulBlocks8: out of memory for the packed weights");
  }
  let_go(src, (size_t)(N * row_bytes));
  let_go(scales, (size_t)(N * groups) * (half_scales ? 2 : 4));
  if (offsets) let_go(offsets, sizeof(float) * (size_t)(K / og * N));
  *out = nd;
  return NULL;
}

static void destroy(void *kernel) {
  node *nd = (node *)kernel;
  packed_free(&nd->k);
  free(nd->offsets);
  free(nd);
}

static const char *op_name(const OrtCustomOp *op) { return "MatMulBlocks8"; }
static const char *provider(const OrtCustomOp *op) { return "CPUExecutionProvider"; }
static ONNXTensorElementDataType in_type(const OrtCustomOp *op, size_t i) {
  return i == 1   ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8
         : i == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED /* float or float16: create_kernel checks */
                  : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static ONNXTensorElementDataType out_type(const OrtCustomOp *op, size_t i) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t four(const OrtCustomOp *op) { return 4; }
static size_t one(const OrtCustomOp *op) { return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) { return INPUT_OUTPUT_REQUIRED; }
static OrtCustomOpInputOutputCharacteristic in_kind(const OrtCustomOp *op, size_t i) {
  return i == 3 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
static OrtMemType cpu_memory(const OrtCustomOp *op, size_t i) { return OrtMemTypeDefault; }

static OrtCustomOp matmul_blocks8 = {
  .version = ORT_API_VERSION, .CreateKernelV2 = create_kernel, .GetName = op_name,
  .GetExecutionProviderType = provider, .GetInputType = in_type, .GetInputTypeCount = four,
  .GetOutputType = out_type, .GetOutputTypeCount = one, .KernelComputeV2 = compute, .KernelDestroy = destroy,
  .GetInputCharacteristic = in_kind, .GetOutputCharacteristic = required, .GetInputMemoryType = cpu_memory,
};

HIDDEN OrtCustomOp *attention_op(const OrtApi *ort);  /* attention.c's CachedAttention */
HIDDEN OrtCustomOp *moe_op(const OrtApi *ort);        /* moe.c's MixtureOfExperts */
HIDDEN OrtCustomOp *swiglu_op(const OrtApi *ort);     /* swiglu.c's SwiGLU */

/* Every session of the process registers these same ops (static, never rewritten: ORT reads its
 * functions at each run). */
__attribute__((visibility("default"))) OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options,
                                                                                 const OrtApiBase *base) {
  api = base->GetApi(ORT_API_VERSION);
  if (!api) return NULL;  /* an ONNX Runtime older than the header: nothing registered, the op then unknown */
  OrtCustomOpDomain *domain;
  TRY(api->CreateCustomOpDomain("trt_llm.cpu", &domain));
  TRY(api->CustomOpDomain_Add(domain, &matmul_blocks8));
  TRY(api->CustomOpDomain_Add(domain, attention_op(api)));
  TRY(api->CustomOpDomain_Add(domain, moe_op(api)));
  TRY(api->CustomOpDomain_Add(domain, swiglu_op(api)));
  return api->AddCustomOpDomain(options, domain);
}
