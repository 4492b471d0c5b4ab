/* trt_llm.cpu::SwiGLU: a gated MLP's activation, silu(gate) * up, as one node where ONNX Runtime runs three
 * (Split of the fused gate/up projection, QuickGelu with alpha 1, Mul). A decode step runs one a layer; its
 * work is a few thousand floats, so most of the three nodes' cost was dispatch, and Split copied both halves
 * (issue 44: the ~300 nodes a token).
 *
 *   X  float32 [..., 2 I]: the gate (first half of the last axis) then the up projection
 *   Y  float32 [..., I] = (g * logistic(g)) * u, each product rounded as ONNX Runtime's two nodes round it
 *
 * The same bits as ONNX Runtime's nodes, so an engine emits the tokens it did: logistic is MLAS' (the
 * rational approximation Eigen uses, p(x) / q(x) + 1/2 over x clamped to [-18, 18], clamped to [0, 1], with
 * fused multiply-adds; MlasComputeLogistic's AVX2/FMA3 kernel, which QuickGelu calls on x86-64), QuickGelu's
 * product x * logistic(x), then Mul's. tests/test_cpu_swiglu.py checks them bit for bit, NaN and the clamps
 * included, on both paths: AVX-512 (16 lanes of the same per-lane operations) and plain C (fmaf: the fused
 * multiply-add, correctly rounded, as the hardware's).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "blocks.h"
#include "onnxruntime_c_api.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static const OrtApi *api;

#define TRY(x) do { OrtStatus *s_ = (x); if (s_) return s_; } while (0)
enum { INLINE_FLOATS = 16384, BATCHES = 16 };  /* below INLINE_FLOATS outputs: not worth waking the threads */

/* MLAS' logistic constants (onnxruntime/core/mlas/lib/logistic.cpp) */
static const float LOWER = -18.0f, UPPER = 18.0f;
static const float A9 = 4.37031012579801e-11f, A7 = 1.15627324459942e-07f, A5 = 6.08574864600143e-05f,
                   A3 = 8.51377133304701e-03f, A1 = 2.48287947061529e-01f;
static const float B10 = 6.10247389755681e-13f, B8 = 5.76102136993427e-09f, B6 = 6.29106785017040e-06f,
                   B4 = 1.70198817374094e-03f, B2 = 1.16817656904453e-01f, B0 = 9.93151921023180e-01f;

typedef struct { int avx512; } kernel;
typedef struct { const float *x; float *y; int64_t rows, I, rows_per_batch; int avx512; } job;

/* max and min as the vector instructions take them: the second operand where either is NaN */
static inline float max_x86(float a, float b) { return a > b ? a : b; }
static inline float min_x86(float a, float b) { return a < b ? a : b; }

static void row_c(const float *x, float *y, int64_t I) {
  for (int64_t j = 0; j < I; j++) {
    const float g = x[j], c = min_x86(UPPER, max_x86(LOWER, g)), x2 = c * c;
    float p = fmaf(x2, A9, A7), q = fmaf(x2, B10, B8);
    p = fmaf(x2, p, A5); p = fmaf(x2, p, A3); p = fmaf(x2, p, A1);
    q = fmaf(x2, q, B6); q = fmaf(x2, q, B4); q = fmaf(x2, q, B2); q = fmaf(x2, q, B0);
    p = c * p;
    const float l = min_x86(1.0f, max_x86(0.0f, p / q + 0.5f)), silu = g * l;
    y[j] = silu * x[I + j];
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,fma"))) static void row_avx512(const float *x, float *y, int64_t I) {
  for (int64_t j = 0; j < I; j += 16) {
    const __mmask16 m = I - j >= 16 ? 0xffff : (__mmask16)((1u << (I - j)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, x + j);
    const __m512 c = _mm512_min_ps(_mm512_set1_ps(UPPER), _mm512_max_ps(_mm512_set1_ps(LOWER), g));
    const __m512 x2 = _mm512_mul_ps(c, c);
    __m512 p = _mm512_fmadd_ps(x2, _mm512_set1_ps(A9), _mm512_set1_ps(A7));
    __m512 q = _mm512_fmadd_ps(x2, _mm512_set1_ps(B10), _mm512_set1_ps(B8));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(A5));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(A3));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(A1));
    q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(B6));
    q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(B4));
    q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(B2));
    q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(B0));
    p = _mm512_mul_ps(c, p);
    __m512 l = _mm512_add_ps(_mm512_div_ps(p, q), _mm512_set1_ps(0.5f));
    l = _mm512_min_ps(_mm512_set1_ps(1.0f), _mm512_max_ps(_mm512_setzero_ps(), l));
    const __m512 silu = _mm512_mul_ps(g, l);
    _mm512_mask_storeu_ps(y + j, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, x + I + j)));
  }
}
#endif

static void run_batch(void *p, size_t i) {
  const job *b = (const job *)p;
  for (int64_t r = (int64_t)i * b->rows_per_batch; r < b->rows && r < ((int64_t)i + 1) * b->rows_per_batch; r++) {
#if defined(__x86_64__)
    if (b->avx512) { row_avx512(b->x + r * 2 * b->I, b->y + r * b->I, b->I); continue; }
#endif
    row_c(b->x + r * 2 * b->I, b->y + r * b->I, b->I);
  }
}

static OrtStatus *compute(void *state, OrtKernelContext *ctx) {
  const OrtValue *in;
  TRY(api->KernelContext_GetInput(ctx, 0, &in));
  OrtTensorTypeAndShapeInfo *info;
  TRY(api->GetTensorTypeAndShape(in, &info));
  int64_t dims[8];
  size_t rank;
  OrtStatus *st = api->GetDimensionsCount(info, &rank);
  if (!st && (rank < 1 || rank > 8)) st = api->CreateStatus(ORT_INVALID_ARGUMENT, "SwiGLU: X must have rank 1 to 8");
  if (!st) st = api->GetDimensions(info, dims, rank);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (st) return st;
  if (dims[rank - 1] % 2) return api->CreateStatus(ORT_INVALID_ARGUMENT, "SwiGLU: X's last dimension must be even");
  job b = {.I = dims[rank - 1] / 2, .rows = 1, .avx512 = ((const kernel *)state)->avx512};
  for (size_t d = 0; d + 1 < rank; d++) b.rows *= dims[d];
  dims[rank - 1] = b.I;
  OrtValue *out;
  TRY(api->KernelContext_GetOutput(ctx, 0, dims, rank, &out));
  TRY(api->GetTensorMutableData((OrtValue *)in, (void **)&b.x));
  TRY(api->GetTensorMutableData(out, (void **)&b.y));
  if (b.rows * b.I < INLINE_FLOATS) {
    b.rows_per_batch = b.rows;
    if (b.rows) run_batch(&b, 0);
    return NULL;
  }
  b.rows_per_batch = (b.rows + BATCHES - 1) / BATCHES;
  return api->KernelContext_ParallelFor(ctx, run_batch, (size_t)((b.rows + b.rows_per_batch - 1) / b.rows_per_batch), 0, &b);
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *unused, const OrtKernelInfo *info, void **out) {
  kernel *k = malloc(sizeof *k);
  if (!k) return api->CreateStatus(ORT_FAIL, "SwiGLU: out of memory");
  k->avx512 = choose_avx512();
  *out = k;
  return NULL;
}

static void destroy(void *state) { free(state); }
static const char *op_name(const OrtCustomOp *op) { return "SwiGLU"; }
static const char *provider(const OrtCustomOp *op) { return "CPUExecutionProvider"; }
static ONNXTensorElementDataType float_type(const OrtCustomOp *op, size_t i) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t one(const OrtCustomOp *op) { return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) { return INPUT_OUTPUT_REQUIRED; }
static OrtMemType cpu_memory(const OrtCustomOp *op, size_t i) { return OrtMemTypeDefault; }

static OrtCustomOp swiglu = {
  .version = ORT_API_VERSION, .CreateKernelV2 = create_kernel, .GetName = op_name,
  .GetExecutionProviderType = provider, .GetInputType = float_type, .GetInputTypeCount = one,
  .GetOutputType = float_type, .GetOutputTypeCount = one, .KernelComputeV2 = compute, .KernelDestroy = destroy,
  .GetInputCharacteristic = required, .GetOutputCharacteristic = required, .GetInputMemoryType = cpu_memory,
};

HIDDEN OrtCustomOp *swiglu_op(const OrtApi *ort) {
  api = ort;
  return &swiglu;
}
