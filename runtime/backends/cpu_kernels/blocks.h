/* Packed weight matrices and their kernels (blocks.c), which our ONNX Runtime op (matmul_blocks.c) runs
 * on. A matrix W [N, K] of 4- or 8-bit unsigned values in blocks of 32 along K (zero point 8 or 128,
 * MatMulNBits' layout: at 4 bits element 2j in byte j's low nibble, 2j+1 in its high one), a float scale
 * per block, is copied once into our layout (blocks.c says which) and multiplied by rows of activations
 * quantized per block of 32 to int8, as MatMulNBits at accuracy level 4 and llama.cpp's Q8_0 do. */
#ifndef TRT_LLM_BLOCKS_H
#define TRT_LLM_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#define HIDDEN __attribute__((visibility("hidden")))

enum { QK = 32, UNIT = 16 };  /* block length; output columns per work unit (2 groups of 8 rows) */

typedef struct chunk chunk;

typedef struct {
  int64_t K, N, nb, bits;
  int sb;                /* bytes of a scale: 2 (fp16, where every one of the matrix's is one) or 4 */
  int vnni;              /* the VNNI path, else plain C */
  int64_t block_bytes;   /* one group's block: 8 * sb + 8 * payload */
  const uint8_t *w;      /* the packed weights, in the arena */
  chunk *home;
} packed;

/* A row of activations as int8 blocks. */
typedef struct {
  int8_t *q;      /* K values, 64-byte aligned */
  float *d;       /* nb scales */
  int32_t *bias;  /* nb: -zero * sum(q of the block), the weights' zero point folded in */
} q8_row;

/* W from `src` (N rows of `row_bytes`, each starting with its K/32 blocks of 16 or 32 bytes: MatMulNBits
 * pads a row to whole blocks of its own) and `scales` ([N * K/32], one per block of 32): 0, or -1 where
 * memory ran out. K a multiple of 32, N of 8. */
HIDDEN int packed_init(packed *k, int64_t K, int64_t N, int bits, const uint8_t *src, int64_t row_bytes,
                       const float *scales);
HIDDEN void packed_free(packed *k);
/* work units of 16 output columns */
HIDDEN size_t packed_units(const packed *k);
/* Unit `unit`'s columns of rows @ W^T for M rows: y[m * ldy + n] (y: row 0, column 0 of the output). */
HIDDEN void packed_unit(const packed *k, size_t unit, const q8_row *rows, int64_t M, float *y, int64_t ldy);

/* M rows of K activations, quantized for a matrix of `bits`: rows[m] (`buffer` holds them; free both) */
HIDDEN q8_row *q8_rows_new(int64_t M, int64_t K, uint8_t **buffer);
HIDDEN void quantize_row(const float *a, int64_t K, int bits, q8_row *out, int vnni);

/* an fp16 value (IEEE binary16 bits) as a float, exactly */
HIDDEN float half_to_float(uint16_t h);

/* TRT_LLM_CPU_KERNELS=c: every kernel (ours, attention.c's too) takes its plain C path (the tests run both) */
HIDDEN int plain_c_asked(void);
/* the float kernels' path (attention.c, moe.c), chosen when one is made: AVX-512 F with FMA where the CPU
 * has them, unless TRT_LLM_CPU_KERNELS=c */
HIDDEN int choose_avx512(void);

/* ORT keeps an initializer we packed from: hand back the file pages our read brought in */
HIDDEN void let_go(const void *p, size_t n);

#endif
