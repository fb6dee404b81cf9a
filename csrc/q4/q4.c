/* vocabbridge._q4: a small-batch 4-bit matmul for CPU decoding whose every output row is computed
 * by the same instructions whatever the number of rows beside it.
 *
 * Why: a speculative verification runs k + 1 rows through the target where plain decoding runs
 * one. On a CPU that pays only if the extra rows cost little, and it is lossless only if each row's
 * result is bit for bit what the row alone gives. Per-row dot-product kernels (llama.cpp's) decode
 * every weight block again for every row; here each block is decoded once and applied to every row,
 * and each row keeps its own accumulators, reduced in one fixed order.
 *
 * Weights: Q4_K's values (llama.cpp's k-quant), repacked for 16 output columns side by side.
 * Super-blocks of 256 inputs, 8 sub-blocks of 32; per column and super-block an fp16 scale d and
 * min dmin, per sub-block 6-bit sc and m, per input a 4-bit q: w = d*sc*q - dmin*m. A GGUF's Q4_K
 * tensors repack exactly (pack_q4k); float weights are quantized as llama.cpp quantizes Q4_K
 * (pack_f32, make_qkx2_quants ported below).
 *
 * Activations: each row quantized on its own, per super-block of 256 to int8 (scale = max|x|/127,
 * round to nearest even), with the sums of each 32 quantized inputs (for the mins).
 *
 * One output element y[r][n], the same arithmetic on every path (scalar, AVX2, AVX-512 VNNI, AMX):
 *   for each super-block s, in order:
 *     isum = sum_j sc_j * sum_{i in j} q_i * xq_i          (int32, exact)
 *     msum = sum_j m_j * sum_{i in j} xq_i                 (int32, exact)
 *     acc  = fma(d * dx, (float)isum, acc)                 (d * dx rounded to float first)
 *     acc  = fma(-(dmin * dx), (float)msum, acc)
 *   y = acc (+ bias[n])
 * Integer sums are exact in any order, the float steps run in one order per element, so a row's
 * result does not depend on the other rows, on the thread that computes it, or on the vector unit.
 * That is what lets AMX's tile multiply (a whole sub-block's int32 dots for up to 16 rows in one
 * instruction) stand in for the VNNI dots where several rows share a block: its integers are the
 * same integers, and the float steps after them are the VNNI path's, instruction for instruction.
 *
 * Packed layout: column groups of 16 (N padded), super-blocks along K (K padded to 256, zeros);
 * block (g, s) at ((g * nsb) + s) * BLOCK bytes, BLOCK = 2368:
 *   [0, 32)      d    f16 [16]
 *   [32, 64)     dmin f16 [16]
 *   [64, 192)    sc   u8  [8 sub-blocks][16 columns]
 *   [192, 320)   m    u8  [4 pairs p][16 columns][2]   (m[2p][n], m[2p+1][n])
 *   [320, 2368)  q    [8 sub-blocks j][4 t][16 columns][4 bytes]: byte i holds q[32j + 8t + i]
 *                     in its low nibble and q[32j + 8t + 4 + i] in its high nibble
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define Q4_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif
/* AMX (Intel Sapphire Rapids and later): Linux only (the kernel must be asked for the tile state),
 * and a compiler that knows the amx-tile / amx-int8 targets. */
#if defined(Q4_X86) && defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define Q4_AMX 1
#endif
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define QK 256
#define NSUB 8
#define GROUP 16
#define BLOCK 2368
#define OFF_D 0
#define OFF_DMIN 32
#define OFF_SC 64
#define OFF_M 192
#define OFF_Q 320
#define ROW_CHUNK 32 /* rows per pass over the weights: their activations stay in L2 */
#ifndef AVX2_ROWS
#define AVX2_ROWS 8 /* rows the AVX2 block kernel takes in one pass (measured: 8 beats passes of 4 or 5) */
#endif
#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 0 /* software prefetch this many blocks ahead (0: none; 2-8 measured slower on Zen 2) */
#endif

#ifndef AMX_MIN_ROWS
#define AMX_MIN_ROWS 12 /* fewer rows take the VNNI kernel on an AMX unit (the same bits either way): the tiles' fixed
                          * cost per block (decoding to bytes, tile stores) pays from ~12 rows (measured on 2 Xeon cores) */
#endif

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AMX = 3 };
static const char *ISA_NAMES[] = {"scalar", "avx2", "avx512vnni", "amx"};
static int isa_best = ISA_SCALAR; /* what this CPU runs */
static int isa_used = ISA_SCALAR; /* what the kernels use (set_isa may lower it, for tests) */

/* ==== fp16 <-> fp32 (bit exact, no F16C needed) ============================================== */

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t f32_to_f16(float f) { /* round to nearest even, as F16C and ggml do */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7FFFFFFF;
    if (ax >= 0x7F800000) return (uint16_t)(sign | 0x7C00 | (ax > 0x7F800000 ? 0x200 : 0));
    if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* rounds past the largest half */
    if (ax < 0x38800000) {                                  /* subnormal half (or zero) */
        if (ax < 0x33000000) return (uint16_t)sign;
        uint32_t e = ax >> 23, man = (ax & 0x7FFFFF) | 0x800000;
        int shift = 126 - (int)e; /* 14 + (113 - e) */
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

/* ==== activations: per row, per super-block int8 ============================================= */

typedef struct {
    int8_t *xq;  /* [R][Kp] */
    int16_t *bs; /* [R][Kp/32] */
    float *dx;   /* [R][Kp/256] */
    int R, K, Kp;
} Act;

static void quantize_block_scalar(const float *x, int n, int8_t *q, int16_t *bs, float *dx) {
    float amax = 0.f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax; /* a NaN is skipped, as _mm256_max_ps(a, amax) skips it */
    }
    float id = amax > 0.f ? 127.f / amax : 0.f;
    *dx = amax / 127.f;
    for (int i = 0; i < QK; i++) {
        float v = i < n ? x[i] * id : 0.f;
        v = v > -127.f ? v : -127.f; /* NaN -> -127, as _mm256_max_ps(v, -127) */
        v = v < 127.f ? v : 127.f;
        q[i] = (int8_t)nearbyintf(v);
    }
    for (int j = 0; j < NSUB; j++) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += q[32 * j + i];
        bs[j] = (int16_t)s;
    }
}

#ifdef Q4_X86
__attribute__((target("avx2,fma"))) static void quantize_block_avx2(const float *x, int n, int8_t *q, int16_t *bs,
                                                                    float *dx) {
    if (n < QK) { /* a short last block: the scalar path (same results) */
        quantize_block_scalar(x, n, q, bs, dx);
        return;
    }
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < QK; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float amax = 0.f;
    for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;
    float id = amax > 0.f ? 127.f / amax : 0.f;
    *dx = amax / 127.f;
    const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    for (int i = 0; i < QK; i += 32) {
        __m256i v[4];
        for (int u = 0; u < 4; u++) {
            __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * u), vid);
            f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
            v[u] = _mm256_cvtps_epi32(f); /* round to nearest even (MXCSR default), as nearbyintf */
        }
        __m256i a = _mm256_packs_epi32(v[0], v[1]), b = _mm256_packs_epi32(v[2], v[3]);
        __m256i c = _mm256_packs_epi16(a, b);
        c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + i), c);
        /* the 32 values' sum: exact in int16 (|sum| <= 4064) */
        __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), c);
        __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        bs[i / 32] = (int16_t)_mm_cvtsi128_si32(t);
    }
}
#endif

static void quantize_rows(const float *x, int R, int K, Act *a) {
    int nsb = a->Kp / QK;
    for (int r = 0; r < R; r++) {
        for (int s = 0; s < nsb; s++) {
            int n = K - s * QK < QK ? K - s * QK : QK;
            const float *xs = x + (size_t)r * K + (size_t)s * QK;
            int8_t *q = a->xq + (size_t)r * a->Kp + (size_t)s * QK;
            int16_t *bs = a->bs + (size_t)r * (a->Kp / 32) + (size_t)s * NSUB;
            float *dx = a->dx + (size_t)r * nsb + s;
#ifdef Q4_X86
            if (isa_used >= ISA_AVX2) {
                quantize_block_avx2(xs, n, q, bs, dx);
                continue;
            }
#endif
            quantize_block_scalar(xs, n, q, bs, dx);
        }
    }
}

/* ==== the block kernels: one (column group, super-block), rows r0..r0+nr-1 =================== */

typedef struct {
    const int8_t *x[16];  /* each row's quantized inputs of this super-block */
    const int16_t *b[16]; /* each row's 8 sub-block sums of this super-block */
    float dx[16];         /* each row's scale of this super-block */
    float *acc[16];       /* each row's 16 float accumulators of this column group */
} Rows;

/* Rows r_first … r_first + nr - 1 of the activations at super-block s, their accumulators at acc
 * (GROUP floats a row). */
static inline void rows_of(const Act *a, int s, int r_first, int nr, float *acc, Rows *rw) {
    const int nsb = a->Kp / QK;
    for (int i = 0; i < nr; i++) {
        const int r = r_first + i;
        rw->x[i] = a->xq + (size_t)r * a->Kp + (size_t)s * QK;
        rw->b[i] = a->bs + (size_t)r * (a->Kp / 32) + (size_t)s * NSUB;
        rw->dx[i] = a->dx[(size_t)r * nsb + s];
        rw->acc[i] = acc + (size_t)i * GROUP;
    }
}

static void block_scalar(const uint8_t *blk, int nr, const Rows *rw) {
    for (int c = 0; c < GROUP; c++) {
        uint16_t dh, mh;
        memcpy(&dh, blk + OFF_D + 2 * c, 2);
        memcpy(&mh, blk + OFF_DMIN + 2 * c, 2);
        float d = f16_to_f32(dh), dmin = f16_to_f32(mh);
        for (int r = 0; r < nr; r++) {
            int32_t isum = 0, msum = 0;
            for (int j = 0; j < NSUB; j++) {
                int32_t dot = 0;
                for (int t = 0; t < 4; t++) {
                    const uint8_t *qb = blk + OFF_Q + ((j * 4 + t) * GROUP + c) * 4;
                    for (int i = 0; i < 4; i++) {
                        dot += (qb[i] & 0xF) * rw->x[r][32 * j + 8 * t + i];
                        dot += (qb[i] >> 4) * rw->x[r][32 * j + 8 * t + 4 + i];
                    }
                }
                isum += blk[OFF_SC + j * GROUP + c] * dot;
                msum += blk[OFF_M + (j / 2) * 32 + c * 2 + (j & 1)] * rw->b[r][j];
            }
            float a = d * rw->dx[r], b = dmin * rw->dx[r];
            float acc = rw->acc[r][c];
            acc = fmaf(a, (float)isum, acc);
            acc = fmaf(-b, (float)msum, acc);
            rw->acc[r][c] = acc;
        }
    }
}

#ifdef Q4_X86
#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Half h (columns 8h..8h+7) of a block, nr <= 8 rows. For each sub-block the 8 products of a
 * 4-input group with 8 columns (vpmaddubsw: 16 int16 lanes, two per column) are added in int16
 * (at most 16 * 15 * 127 = 30480, exact), then scaled by sc and widened (vpmaddwd). vpmaddubsw and
 * vpmaddwd share one pipe on Zen 2 (one a cycle): 9 of them per row and 256 products bound the
 * kernel, so the shared work (decoding nibbles, loading scales) is done once for every row. */
AVX2_FN static inline __attribute__((always_inline)) void block_avx2_half(const uint8_t *blk, int h, const int nr,
                                                                          const Rows *rw) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i isum[8], s16[8];
    for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
    for (int j = 0; j < NSUB; j++) {
        for (int r = 0; r < nr; r++) s16[r] = _mm256_setzero_si256();
        for (int t = 0; t < 4; t++) {
            __m256i raw = _mm256_load_si256((const __m256i *)(blk + OFF_Q + (j * 4 + t) * 64 + h * 32));
            __m256i w0 = _mm256_and_si256(raw, m4);
            __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            for (int r = 0; r < nr; r++) {
                const int8_t *x = rw->x[r] + 32 * j + 8 * t;
                s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(w0, _mm256_set1_epi32(load_i32(x))));
                s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(w1, _mm256_set1_epi32(load_i32(x + 4))));
                __asm__("" : "+x"(s16[r])); /* keep the chain: reassociated, it spills */
            }
        }
        __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + OFF_SC + j * GROUP + h * 8)));
        sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
        for (int r = 0; r < nr; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16[r], sc));
    }
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + OFF_D + h * 16)));
    __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + OFF_DMIN + h * 16)));
    for (int r = 0; r < nr; r++) {
        __m256i msum = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i m16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + OFF_M + p * 32 + h * 16)));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m16, _mm256_set1_epi32(load_i32(rw->b[r] + 2 * p))));
        }
        __m256 dx = _mm256_set1_ps(rw->dx[r]);
        __m256 a = _mm256_mul_ps(d, dx), b = _mm256_mul_ps(dm, dx);
        __m256 acc = _mm256_loadu_ps(rw->acc[r] + 8 * h);
        acc = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(isum[r]), acc);
        acc = _mm256_fnmadd_ps(b, _mm256_cvtepi32_ps(msum), acc);
        _mm256_storeu_ps(rw->acc[r] + 8 * h, acc);
    }
}

AVX2_FN static void block_avx2(const uint8_t *blk, int nr, const Rows *rw) {
    for (int h = 0; h < 2; h++) {
        switch (nr) {
        case 1: block_avx2_half(blk, h, 1, rw); break;
        case 2: block_avx2_half(blk, h, 2, rw); break;
        case 3: block_avx2_half(blk, h, 3, rw); break;
        case 4: block_avx2_half(blk, h, 4, rw); break;
        case 5: block_avx2_half(blk, h, 5, rw); break;
        case 6: block_avx2_half(blk, h, 6, rw); break;
        case 7: block_avx2_half(blk, h, 7, rw); break;
        default: block_avx2_half(blk, h, 8, rw); break;
        }
    }
}

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* The end of a block for nr rows whose sub-block sums isum (sum_j sc_j * dot_j, int32, per column)
 * are done: the mins' sums, then the two float steps into each row's accumulators. Shared by the
 * VNNI and AMX kernels, so both run these instructions in this order. */
AVX512_FN static inline __attribute__((always_inline)) void avx512_finish(const uint8_t *blk, const int nr, const Rows *rw,
                                                                          const __m512i *isum) {
    __m512i msum[16];
    for (int r = 0; r < nr; r++) msum[r] = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        __m512i m16 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + OFF_M + p * 32)));
        for (int r = 0; r < nr; r++)
            msum[r] = _mm512_add_epi32(msum[r], _mm512_madd_epi16(m16, _mm512_set1_epi32(load_i32(rw->b[r] + 2 * p))));
    }
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + OFF_D)));
    __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + OFF_DMIN)));
    for (int r = 0; r < nr; r++) {
        __m512 dx = _mm512_set1_ps(rw->dx[r]);
        __m512 a = _mm512_mul_ps(d, dx), b = _mm512_mul_ps(dm, dx);
        __m512 acc = _mm512_loadu_ps(rw->acc[r]);
        acc = _mm512_fmadd_ps(a, _mm512_cvtepi32_ps(isum[r]), acc);
        acc = _mm512_fnmadd_ps(b, _mm512_cvtepi32_ps(msum[r]), acc);
        _mm512_storeu_ps(rw->acc[r], acc);
    }
}

/* All 16 columns of a block, nr <= 8 rows: vpdpbusd sums each 4-input group into int32 per
 * column; each sub-block's sum is scaled by sc in int32 (the same integers as the AVX2 path). */
AVX512_FN static inline __attribute__((always_inline)) void block_avx512_rows(const uint8_t *blk, const int nr,
                                                                              const Rows *rw) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i isum[8], dot[8];
    for (int r = 0; r < nr; r++) isum[r] = _mm512_setzero_si512();
    for (int j = 0; j < NSUB; j++) {
        for (int r = 0; r < nr; r++) dot[r] = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            __m512i raw = _mm512_load_si512((const void *)(blk + OFF_Q + (j * 4 + t) * 64));
            __m512i w0 = _mm512_and_si512(raw, m4);
            __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
            for (int r = 0; r < nr; r++) {
                const int8_t *x = rw->x[r] + 32 * j + 8 * t;
                dot[r] = _mm512_dpbusd_epi32(dot[r], w0, _mm512_set1_epi32(load_i32(x)));
                dot[r] = _mm512_dpbusd_epi32(dot[r], w1, _mm512_set1_epi32(load_i32(x + 4)));
            }
        }
        __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + OFF_SC + j * GROUP)));
        for (int r = 0; r < nr; r++) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot[r], sc));
    }
    avx512_finish(blk, nr, rw, isum);
}

AVX512_FN static void block_avx512(const uint8_t *blk, int nr, const Rows *rw) {
    switch (nr) {
    case 1: block_avx512_rows(blk, 1, rw); break;
    case 2: block_avx512_rows(blk, 2, rw); break;
    case 3: block_avx512_rows(blk, 3, rw); break;
    case 4: block_avx512_rows(blk, 4, rw); break;
    case 5: block_avx512_rows(blk, 5, rw); break;
    case 6: block_avx512_rows(blk, 6, rw); break;
    case 7: block_avx512_rows(blk, 7, rw); break;
    default: block_avx512_rows(blk, 8, rw); break;
    }
}

#ifdef Q4_AMX
#define AMX_FN __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* AMX: tiles tmm0-3 hold the int32 dots of four sub-blocks (nr rows x 16 columns), tmm4/tmm5 the
 * rows' int8 inputs of a sub-block (nr x 32 bytes), tmm6/tmm7 its weights as bytes (8 rows of 4
 * inputs x 16 columns: the packed low and high nibbles, which are already in the tile's layout).
 * The configuration depends on nr; each thread keeps its own and releases it after a matmul. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

static __thread int amx_rows; /* the row count this thread's tiles are configured for; 0: none */

AMX_FN static void amx_configure(int nr) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 4; t++) c.rows[t] = (uint8_t)nr, c.colsb[t] = 64;
    for (int t = 4; t < 6; t++) c.rows[t] = (uint8_t)nr, c.colsb[t] = 32;
    for (int t = 6; t < 8; t++) c.rows[t] = 8, c.colsb[t] = 64;
    _tile_loadconfig(&c);
    amx_rows = nr;
}

AMX_FN static void amx_release(void) {
    if (amx_rows) _tile_release();
    amx_rows = 0;
}

/* A block's 4-bit weights as the bytes a tile takes: for each sub-block, 8 tile rows of 4 inputs x
 * 16 columns, which are the packed low and high nibbles as they lie (the VNNI kernel's w0, w1). */
AMX_FN static inline __attribute__((always_inline)) void amx_decode(const uint8_t *blk, uint8_t (*wb)[8 * 64]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < NSUB; j++)
        for (int t = 0; t < 4; t++) {
            __m512i raw = _mm512_load_si512((const void *)(blk + OFF_Q + (j * 4 + t) * 64));
            _mm512_store_si512((void *)(wb[j] + (2 * t) * 64), _mm512_and_si512(raw, m4));
            _mm512_store_si512((void *)(wb[j] + (2 * t + 1) * 64), _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
        }
}

/* Each sub-block's int32 dots for every row: one tile multiply (rows' inputs x the block's bytes). */
AMX_FN static inline __attribute__((always_inline)) void amx_dots(const int8_t *x, size_t st, uint8_t (*wb)[8 * 64],
                                                                   int32_t (*dots)[16][GROUP]) {
    for (int h = 0; h < NSUB; h += 4) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(4, x + 32 * (h + 0), st);
        _tile_loadd(6, wb[h + 0], 64);
        _tile_dpbsud(0, 4, 6);
        _tile_loadd(5, x + 32 * (h + 1), st);
        _tile_loadd(7, wb[h + 1], 64);
        _tile_dpbsud(1, 5, 7);
        _tile_loadd(4, x + 32 * (h + 2), st);
        _tile_loadd(6, wb[h + 2], 64);
        _tile_dpbsud(2, 4, 6);
        _tile_loadd(5, x + 32 * (h + 3), st);
        _tile_loadd(7, wb[h + 3], 64);
        _tile_dpbsud(3, 5, 7);
        _tile_stored(0, dots[h + 0], 64);
        _tile_stored(1, dots[h + 1], 64);
        _tile_stored(2, dots[h + 2], 64);
        _tile_stored(3, dots[h + 3], 64);
    }
}

/* Each row's dots scaled by sc and summed in int32 as the VNNI kernel sums them; then avx512_finish. */
AMX_FN static inline __attribute__((always_inline)) void amx_finish(const uint8_t *blk, int nr, const Rows *rw,
                                                                     int32_t (*dots)[16][GROUP]) {
    __m512i sc[NSUB], isum[16];
    for (int j = 0; j < NSUB; j++) sc[j] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + OFF_SC + j * GROUP)));
    for (int r = 0; r < nr; r++) {
        isum[r] = _mm512_setzero_si512();
        for (int j = 0; j < NSUB; j++)
            isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(_mm512_load_si512((const void *)dots[j][r]), sc[j]));
    }
    avx512_finish(blk, nr, rw, isum);
}

/* One column group, all its super-blocks in order, for nr <= 16 rows from r_first
 * (their accumulators at acc, GROUP floats a row). Software-pipelined: block s + 1 is decoded and
 * block s - 1's dots are summed around block s's tile multiplies, so no step waits on the stores
 * just made (a tile load does not take its bytes from stores still in flight). Each row's
 * accumulators still take the super-blocks in order, with the VNNI kernel's float steps. */
AMX_FN static void group_amx(const uint8_t *blk0, int nsb, const Act *a, int r_first, int nr, float *acc) {
    if (amx_rows != nr) amx_configure(nr);
    uint8_t wb[2][NSUB][8 * 64] __attribute__((aligned(64)));
    int32_t dots[2][NSUB][16][GROUP] __attribute__((aligned(64)));
    Rows rw;
    amx_decode(blk0, wb[0]);
    for (int s = 0; s <= nsb; s++) {
        if (s + 1 < nsb) amx_decode(blk0 + (size_t)(s + 1) * BLOCK, wb[(s + 1) & 1]);
        if (s < nsb) amx_dots(a->xq + (size_t)r_first * a->Kp + (size_t)s * QK, (size_t)a->Kp, wb[s & 1], dots[s & 1]);
        if (s > 0) {
            rows_of(a, s - 1, r_first, nr, acc, &rw);
            amx_finish(blk0 + (size_t)(s - 1) * BLOCK, nr, &rw, dots[(s - 1) & 1]);
        }
    }
}

/* Linux hands out the tile state only to a process that asks (arch_prctl); 1 where it is granted. */
static int amx_permitted(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return 0; /* AMX-TILE, AMX-INT8 */
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#endif
#endif

/* ==== one thread's share: column groups [g0, g1) for every row =============================== */

typedef struct {
    const uint8_t *W;
    int N, K, Kp, ngroups;
    const Act *a;
    float *y; /* [R][N] */
    const float *bias;
    int isa;
} MatJob;

static void matmul_groups(const MatJob *jb, int g0, int g1) {
    const int nsb = jb->Kp / QK, R = jb->a->R;
    const int most = jb->isa == ISA_AVX2 ? AVX2_ROWS : 8; /* rows a block kernel takes at once */
#if PREFETCH_BLOCKS
    const uint8_t *end = jb->W + (size_t)g1 * nsb * BLOCK;
#endif
    float stack_acc[ROW_CHUNK * GROUP] __attribute__((aligned(64)));
    for (int c0 = 0; c0 < R; c0 += ROW_CHUNK) {
        const int rc = R - c0 < ROW_CHUNK ? R - c0 : ROW_CHUNK;
        for (int g = g0; g < g1; g++) {
            memset(stack_acc, 0, sizeof(float) * rc * GROUP);
            const uint8_t *blk = jb->W + (size_t)g * nsb * BLOCK;
            int whole = 0; /* the AMX path took the whole group */
#ifdef Q4_AMX
            if (jb->isa == ISA_AMX && rc >= AMX_MIN_ROWS) { /* the whole group at once, in passes of <= 16 rows */
                const int passes = (rc + 15) / 16;
                for (int p = 0, r0 = 0, nr = 0; p < passes; p++, r0 += nr) {
                    nr = (rc - r0) / (passes - p);
                    group_amx(blk, nsb, jb->a, c0 + r0, nr, stack_acc + (size_t)r0 * GROUP);
                }
                whole = 1;
            }
#endif
            for (int s = 0; s < nsb && !whole; s++, blk += BLOCK) {
#if defined(Q4_X86) && PREFETCH_BLOCKS
                const uint8_t *ahead = blk + PREFETCH_BLOCKS * BLOCK; /* this thread's stream, a few blocks on */
                if (ahead < end)
                    for (int l = 0; l < BLOCK; l += 64) _mm_prefetch((const char *)ahead + l, _MM_HINT_T0);
#endif
                /* the rows in passes of nearly equal size (5 = 3 + 2): a pass decodes the block again */
                const int passes = (rc + most - 1) / most;
                for (int p = 0, r0 = 0, nr = 0; p < passes; p++, r0 += nr) {
                    nr = (rc - r0) / (passes - p);
                    Rows rw;
                    rows_of(jb->a, s, c0 + r0, nr, stack_acc + (size_t)r0 * GROUP, &rw);
#ifdef Q4_X86
                    if (jb->isa >= ISA_AVX512) { /* AMX's fewer than AMX_MIN_ROWS rows too */
                        block_avx512(blk, nr, &rw);
                        continue;
                    }
                    if (jb->isa == ISA_AVX2) {
                        block_avx2(blk, nr, &rw);
                        continue;
                    }
#endif
                    block_scalar(blk, nr, &rw);
                }
            }
            const int n0 = g * GROUP, nc = jb->N - n0 < GROUP ? jb->N - n0 : GROUP;
            for (int i = 0; i < rc; i++) {
                float *out = jb->y + (size_t)(c0 + i) * jb->N + n0;
                const float *acc = stack_acc + (size_t)i * GROUP;
                for (int c = 0; c < nc; c++) out[c] = jb->bias ? acc[c] + jb->bias[n0 + c] : acc[c];
            }
        }
    }
#ifdef Q4_AMX
    if (jb->isa == ISA_AMX) amx_release();
#endif
}

/* ==== attention ===============================================================================
 * Causal attention for one sequence: R query rows, the last R positions of a cache of L keys. Each
 * (row, head) is computed on its own, in one fixed order, so its result does not depend on R, on
 * the keys past its own position, on the thread that computes it or on the vector unit:
 *   s_j = dot(q, k_j) * scale for the keys j <= the row's position; the dot in 8 lanes (lane l
 *         sums the products of inputs l, l + 8, … by fma, in order), the lanes added as
 *         ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7))
 *   e_j = expf(s_j - max_j s_j), z = e_0 + e_1 + … in order
 *   o = fma(e_j, v_j, o) over j in order, each output element on its own; then o / z
 * The vector path needs d % 8 == 0 (else every call takes the scalar one, the same arithmetic).
 * The torch version (invariant.invariant_attention) gets the same property from fixed shapes and
 * pays for it with padding copies and a dozen small ops a layer; here it is a loop over the keys. */
typedef struct {
    const float *q;    /* row r of head h at q + h * qh + r * qr */
    const float *k;    /* head g's key j at k + g * kvh + j * d (a cache with room past L: kvh > L * d) */
    const float *v;    /* as k */
    float *out;        /* [R][H][d] */
    int R, H, Hkv, d, L, isa;
    float scale;
    _Atomic int failed;
    size_t qh, qr, kvh; /* strides in floats */
} AttJob;

static float lanes_sum(const float a[8]) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

static void scores_scalar(const float *q, const float *k, int n, int d, float scale, float *s) {
    for (int j = 0; j < n; j++) {
        const float *kj = k + (size_t)j * d;
        float a[8] = {0};
        for (int i = 0; i < d; i++) a[i & 7] = fmaf(q[i], kj[i], a[i & 7]);
        s[j] = lanes_sum(a) * scale;
    }
}

static float softmax_exps(float *s, int n) { /* s_j -> e_j in place; returns z (shared by every path) */
    float m = s[0], z = 0.f;
    for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        z += s[j];
    }
    return z;
}

static void weigh_scalar(const float *e, const float *v, int n, int d, float z, float *o) {
    for (int i = 0; i < d; i++) o[i] = 0.f;
    for (int j = 0; j < n; j++) {
        const float *vj = v + (size_t)j * d;
        for (int i = 0; i < d; i++) o[i] = fmaf(e[j], vj[i], o[i]);
    }
    for (int i = 0; i < d; i++) o[i] = o[i] / z;
}

#ifdef Q4_X86
AVX2_FN static void scores_avx2(const float *q, const float *k, int n, int d, float scale, float *s) {
    float a[8] __attribute__((aligned(32)));
    int j = 0;
    for (; j + 4 <= n; j += 4) { /* four keys side by side: four chains, each the one-key arithmetic */
        const float *k0 = k + (size_t)j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < d; i += 8) {
            const __m256 x = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + i), a1);
            a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + i), a2);
            a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + i), a3);
        }
        _mm256_store_ps(a, a0);
        s[j] = lanes_sum(a) * scale;
        _mm256_store_ps(a, a1);
        s[j + 1] = lanes_sum(a) * scale;
        _mm256_store_ps(a, a2);
        s[j + 2] = lanes_sum(a) * scale;
        _mm256_store_ps(a, a3);
        s[j + 3] = lanes_sum(a) * scale;
    }
    for (; j < n; j++) {
        const float *kj = k + (size_t)j * d;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kj + i), acc);
        _mm256_store_ps(a, acc);
        s[j] = lanes_sum(a) * scale;
    }
}

AVX2_FN static void weigh_avx2(const float *e, const float *v, int n, int d, float z, float *o) {
    for (int c = 0; c < d; c += 64) { /* up to 8 vectors of the output at a time, in registers */
        const int nv = (d - c) / 8 < 8 ? (d - c) / 8 : 8;
        __m256 acc[8];
        for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            const __m256 ej = _mm256_set1_ps(e[j]);
            const float *vj = v + (size_t)j * d + c;
            for (int t = 0; t < nv; t++) acc[t] = _mm256_fmadd_ps(ej, _mm256_loadu_ps(vj + 8 * t), acc[t]);
        }
        const __m256 zz = _mm256_set1_ps(z);
        for (int t = 0; t < nv; t++) _mm256_storeu_ps(o + c + 8 * t, _mm256_div_ps(acc[t], zz));
    }
}
#endif

static void attend_units(const AttJob *jb, int u0, int u1) {
    const int d = jb->d, groups = jb->H / jb->Hkv;
    float *s = malloc(sizeof(float) * (size_t)jb->L);
    if (!s) {
        atomic_store(&((AttJob *)jb)->failed, 1);
        return;
    }
#ifdef Q4_X86
    const int vec = jb->isa >= ISA_AVX2 && d % 8 == 0;
#endif
    for (int u = u0; u < u1; u++) {
        const int h = u / jb->R, r = u % jb->R, n = jb->L - jb->R + r + 1; /* this row sees keys 0 … its position */
        const float *q = jb->q + (size_t)h * jb->qh + (size_t)r * jb->qr;
        const size_t kv = (size_t)(h / groups) * jb->kvh;
        float *o = jb->out + ((size_t)r * jb->H + h) * d;
#ifdef Q4_X86
        if (vec) {
            scores_avx2(q, jb->k + kv, n, d, jb->scale, s);
            weigh_avx2(s, jb->v + kv, n, d, softmax_exps(s, n), o);
            continue;
        }
#endif
        scores_scalar(q, jb->k + kv, n, d, jb->scale, s);
        weigh_scalar(s, jb->v + kv, n, d, softmax_exps(s, n), o);
    }
    free(s);
}

/* ==== packing ================================================================================= */

static inline int nearest_int(float fval) { /* ggml's: round half to even for |fval| < 2^22 */
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

/* Put one column's super-block (Q4_K fields) into its packed block. */
static void put_column(uint8_t *blk, int c, uint16_t d, uint16_t dmin, const uint8_t *sc, const uint8_t *m,
                       const uint8_t *q /* [256] in 0..15 */) {
    memcpy(blk + OFF_D + 2 * c, &d, 2);
    memcpy(blk + OFF_DMIN + 2 * c, &dmin, 2);
    for (int j = 0; j < NSUB; j++) {
        blk[OFF_SC + j * GROUP + c] = sc[j];
        blk[OFF_M + (j / 2) * 32 + c * 2 + (j & 1)] = m[j];
        for (int t = 0; t < 4; t++) {
            uint8_t *qb = blk + OFF_Q + ((j * 4 + t) * GROUP + c) * 4;
            for (int i = 0; i < 4; i++) qb[i] = (uint8_t)(q[32 * j + 8 * t + i] | (q[32 * j + 8 * t + 4 + i] << 4));
        }
    }
}

static void get_column(const uint8_t *blk, int c, uint16_t *d, uint16_t *dmin, uint8_t *sc, uint8_t *m, uint8_t *q) {
    memcpy(d, blk + OFF_D + 2 * c, 2);
    memcpy(dmin, blk + OFF_DMIN + 2 * c, 2);
    for (int j = 0; j < NSUB; j++) {
        sc[j] = blk[OFF_SC + j * GROUP + c];
        m[j] = blk[OFF_M + (j / 2) * 32 + c * 2 + (j & 1)];
        for (int t = 0; t < 4; t++) {
            const uint8_t *qb = blk + OFF_Q + ((j * 4 + t) * GROUP + c) * 4;
            for (int i = 0; i < 4; i++) {
                q[32 * j + 8 * t + i] = qb[i] & 0xF;
                q[32 * j + 8 * t + 4 + i] = qb[i] >> 4;
            }
        }
    }
}

/* llama.cpp's make_qkx2_quants (ggml-quants.c, MIT licence): the scale and min of n values on
 * nmax+1 levels minimising the weighted squared error, searched over nstep+1 candidate scales. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * L[i] + min - x[i];
        best_error += weights[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += weights[i] * diff * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* llama.cpp's quantize_row_q4_K_ref for one super-block of 256 floats (zeros past n). */
static void quantize_q4k_block(const float *xin, int n, uint16_t *dh, uint16_t *dminh, uint8_t *sc, uint8_t *m,
                               uint8_t *L) {
    float x[QK], weights[32], mins[NSUB], scales[NSUB], max_scale = 0, max_min = 0;
    uint8_t Laux[32];
    for (int i = 0; i < QK; i++) x[i] = i < n ? xin[i] : 0.f;
    for (int j = 0; j < NSUB; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < NSUB; ++j) {
        int ls = nearest_int(inv_scale * scales[j]), lm = nearest_int(inv_min * mins[j]);
        sc[j] = (uint8_t)(ls > 63 ? 63 : ls < 0 ? 0 : ls);
        m[j] = (uint8_t)(lm > 63 ? 63 : lm < 0 ? 0 : lm);
    }
    *dh = f32_to_f16(max_scale / 63.f);
    *dminh = f32_to_f16(max_min / 63.f);
    for (int j = 0; j < NSUB; ++j) {
        const float d = f16_to_f32(*dh) * sc[j];
        if (!d) continue;
        const float dm = f16_to_f32(*dminh) * m[j];
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > 15 ? 15 : l);
        }
    }
}

/* A GGUF block_q4_K (144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles). */
static void unpack_q4k(const uint8_t *b, uint16_t *d, uint16_t *dmin, uint8_t *sc, uint8_t *m, uint8_t *q) {
    memcpy(d, b, 2);
    memcpy(dmin, b + 2, 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < NSUB; j++) { /* ggml's get_scale_min_k4 */
        if (j < 4) {
            sc[j] = s[j] & 63;
            m[j] = s[j + 4] & 63;
        } else {
            sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    for (int c = 0; c < 4; c++) /* 64 inputs per 32 bytes: low nibbles first, then high */
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = qs[32 * c + l] & 0xF;
            q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
}

typedef struct {
    int kind; /* 0: floats, 1: GGUF Q4_K rows */
    const void *src;
    const int64_t *perm; /* packed column n <- source row perm[n] (NULL: n) */
    int N, K, Kp;
    uint8_t *out;
} PackJob;

static void pack_groups(const PackJob *pj, int g0, int g1) {
    const int nsb = pj->Kp / QK;
    uint8_t sc[NSUB], m[NSUB], q[QK];
    uint16_t d, dmin;
    for (int g = g0; g < g1; g++) {
        for (int s = 0; s < nsb; s++) {
            uint8_t *blk = pj->out + ((size_t)g * nsb + s) * BLOCK;
            memset(blk, 0, BLOCK);
            for (int c = 0; c < GROUP; c++) {
                const int n = g * GROUP + c;
                if (n >= pj->N) break; /* padding columns: all zero (d = 0) */
                const int64_t row = pj->perm ? pj->perm[n] : n;
                if (pj->kind == 0) {
                    const float *x = (const float *)pj->src + (size_t)row * pj->K + (size_t)s * QK;
                    const int cnt = pj->K - s * QK < QK ? pj->K - s * QK : QK;
                    quantize_q4k_block(x, cnt, &d, &dmin, sc, m, q);
                } else {
                    const uint8_t *b = (const uint8_t *)pj->src + ((size_t)row * (pj->K / QK) + s) * 144;
                    unpack_q4k(b, &d, &dmin, sc, m, q);
                }
                put_column(blk, c, d, dmin, sc, m, q);
            }
        }
    }
}

static struct {
    pthread_mutex_t lock; /* one matmul at a time: the activation buffers are shared */
    int8_t *xq;
    int16_t *bs;
    float *dx;
    size_t cap; /* rows * Kp the buffers hold */
} scratch = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ==== a small thread pool: workers spin briefly, then sleep on a futex ======================== */

#define MAX_THREADS 64
enum { JOB_MATMUL = 0, JOB_PACK = 1, JOB_ATTEND = 2 };

static struct {
    pthread_mutex_t call; /* one caller at a time */
    pthread_t th[MAX_THREADS];
    int nworkers; /* threads beside the caller */
    int nthreads; /* wanted in all (the caller included) */
    _Atomic unsigned gen, pending, waiting, sleepers, stop;
    unsigned start_gen; /* gen when the workers were started: what they wait to see change */
    int kind, parts, units;
    const void *job;
} pool = {.call = PTHREAD_MUTEX_INITIALIZER, .nthreads = 1};

static long spin_ns = 50000; /* how long a waiting thread spins before it sleeps */

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#ifdef Q4_X86
    _mm_pause();
#endif
}

static void futex_wait(_Atomic unsigned *addr, unsigned val) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr;
    (void)val;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
#endif
}

static void futex_wake(_Atomic unsigned *addr) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

/* Wait until *addr != val: spin for spin_ns, then sleep. */
static unsigned wait_change(_Atomic unsigned *addr, unsigned val, _Atomic unsigned *sleepers) {
    unsigned v;
    long t0 = 0;
    for (int i = 0;; i++) {
        if ((v = atomic_load(addr)) != val) return v;
        if ((i & 63) == 63) {
            long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > spin_ns) break;
        }
        cpu_relax();
    }
    atomic_fetch_add(sleepers, 1);
    while ((v = atomic_load(addr)) == val) futex_wait(addr, val);
    atomic_fetch_sub(sleepers, 1);
    return v;
}

static void run_part(int part) {
    /* units (column groups, or attention's (head, row) pairs) split into contiguous ranges, one per part */
    const int u0 = (int)((long)pool.units * part / pool.parts), u1 = (int)((long)pool.units * (part + 1) / pool.parts);
    if (u0 >= u1) return;
    if (pool.kind == JOB_MATMUL) matmul_groups((const MatJob *)pool.job, u0, u1);
    else if (pool.kind == JOB_ATTEND) attend_units((const AttJob *)pool.job, u0, u1);
    else pack_groups((const PackJob *)pool.job, u0, u1);
}

static void *worker_main(void *arg) {
    const int part = (int)(intptr_t)arg;
    unsigned seen = pool.start_gen; /* not a fresh load: the first job may be posted before this thread runs */
    for (;;) {
        seen = wait_change(&pool.gen, seen, &pool.sleepers);
        if (atomic_load(&pool.stop)) return NULL;
        if (part < pool.parts) run_part(part);
        if (atomic_fetch_sub(&pool.pending, 1) == 1 && atomic_load(&pool.waiting)) futex_wake(&pool.pending);
    }
}

static void pool_stop(void) {
    if (!pool.nworkers) return;
    atomic_store(&pool.stop, 1);
    atomic_fetch_add(&pool.gen, 1);
    futex_wake(&pool.gen);
    for (int i = 0; i < pool.nworkers; i++) pthread_join(pool.th[i], NULL);
    pool.nworkers = 0;
    atomic_store(&pool.stop, 0);
}

static int pool_start(void) {
    int want = pool.nthreads - 1;
    pool.start_gen = atomic_load(&pool.gen);
    for (int i = 0; i < want; i++) {
        if (pthread_create(&pool.th[i], NULL, worker_main, (void *)(intptr_t)(i + 1)) != 0) {
            pool.nworkers = i;
            return -1;
        }
        pool.nworkers = i + 1;
    }
    return 0;
}

static void after_fork_child(void) { /* the workers do not exist in a forked child: start anew */
    pthread_mutex_init(&pool.call, NULL);
    pthread_mutex_init(&scratch.lock, NULL);
    pool.nworkers = 0;
    atomic_store(&pool.pending, 0);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.waiting, 0);
}

/* Run a job over `units` column groups on every thread; the caller runs part 0. */
static void pool_run(int kind, const void *job, int units) {
    pthread_mutex_lock(&pool.call);
    if (pool.nworkers != pool.nthreads - 1) {
        pool_stop();
        pool_start();
    }
    pool.kind = kind;
    pool.job = job;
    pool.units = units;
    pool.parts = pool.nworkers + 1 < units ? pool.nworkers + 1 : (units > 0 ? units : 1);
    if (pool.nworkers == 0 || pool.parts == 1) {
        pool.parts = 1;
        run_part(0);
        pthread_mutex_unlock(&pool.call);
        return;
    }
    atomic_store(&pool.pending, (unsigned)pool.nworkers);
    atomic_fetch_add(&pool.gen, 1);
    if (atomic_load(&pool.sleepers)) futex_wake(&pool.gen);
    run_part(0);
    unsigned p;
    long t0 = now_ns();
    for (int i = 0; (p = atomic_load(&pool.pending)) != 0; i++) {
        if ((i & 63) == 63 && now_ns() - t0 > spin_ns) break;
        cpu_relax();
    }
    if (p) {
        atomic_store(&pool.waiting, 1);
        while ((p = atomic_load(&pool.pending)) != 0) futex_wait(&pool.pending, p);
        atomic_store(&pool.waiting, 0);
    }
    pthread_mutex_unlock(&pool.call);
}

/* ==== the lean forward's small ops (engine/lean.py) ============================================
 * Plain C, no vector-unit dispatch: one instruction sequence for every row on every CPU, each row
 * computed from its own values only (the compiler may vectorize a loop, but every sum is eight
 * fixed chains added as lanes_sum adds them, and -ffp-contract=off keeps products rounded on their
 * own), so a row's result is the same bits whatever rows sit beside it or how long the cache is.
 * They replace a dozen small torch ops a layer (~6 ms of the 1.5B's one-row forward). */

/* x += add (if given), then out = w * (x * (1 / sqrt(mean(x^2) + eps))): a residual add and RMSNorm. */
static void rms_norm_row(float *x, const float *add, const float *w, float eps, int D, float *out) {
    float a[8] = {0};
    if (add)
        for (int i = 0; i < D; i++) x[i] = x[i] + add[i];
    for (int i = 0; i < D; i++) a[i & 7] += x[i] * x[i];
    const float r = 1.0f / sqrtf(lanes_sum(a) / (float)D + eps);
    for (int i = 0; i < D; i++) out[i] = w[i] * (x[i] * r);
}

/* x·cos + rotate_half(x)·sin in place (transformers' apply_rotary_pos_emb, product by product:
 * (-x2)·s added is x·c − x2·s exactly); tmp: d floats. */
static void rope_head(float *x, const float *c, const float *s, int d, float *tmp) {
    const int h = d / 2;
    for (int i = 0; i < h; i++) tmp[i] = x[i] * c[i] - x[i + h] * s[i];
    for (int i = h; i < d; i++) tmp[i] = x[i] * c[i] + x[i - h] * s[i];
    memcpy(x, tmp, sizeof(float) * (size_t)d);
}

/* ==== Python bindings ========================================================================= */

static int dims(Py_ssize_t N, Py_ssize_t K) {
    if (N <= 0 || K <= 0 || N > (1 << 28) || K > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "bad matrix size %zd x %zd", N, K);
        return -1;
    }
    return 0;
}

static size_t packed_bytes(Py_ssize_t N, Py_ssize_t K) {
    size_t groups = (size_t)(N + GROUP - 1) / GROUP, nsb = (size_t)(K + QK - 1) / QK;
    return groups * nsb * BLOCK;
}

static PyObject *py_packed_size(PyObject *self, PyObject *args) {
    Py_ssize_t N, K;
    if (!PyArg_ParseTuple(args, "nn", &N, &K) || dims(N, K)) return NULL;
    return PyLong_FromSize_t(packed_bytes(N, K));
}

static PyObject *py_pack(PyObject *self, PyObject *args, int kind) {
    unsigned long long src, perm, out;
    Py_ssize_t N, K;
    if (!PyArg_ParseTuple(args, "KnnKK", &src, &N, &K, &perm, &out) || dims(N, K)) return NULL;
    if (kind == 1 && K % QK) {
        PyErr_Format(PyExc_ValueError, "Q4_K rows hold a multiple of %d inputs, not %zd", QK, K);
        return NULL;
    }
    if ((out & 63) != 0) {
        PyErr_SetString(PyExc_ValueError, "the packed buffer must be 64-byte aligned");
        return NULL;
    }
    PackJob pj = {kind, (const void *)(uintptr_t)src, (const int64_t *)(uintptr_t)perm, (int)N, (int)K,
                  (int)((K + QK - 1) / QK * QK), (uint8_t *)(uintptr_t)out};
    Py_BEGIN_ALLOW_THREADS pool_run(JOB_PACK, &pj, (int)((N + GROUP - 1) / GROUP));
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *py_pack_f32(PyObject *self, PyObject *args) { return py_pack(self, args, 0); }
static PyObject *py_pack_q4k(PyObject *self, PyObject *args) { return py_pack(self, args, 1); }

/* dequantize(packed, N, K, out): out[n][k] = (d*sc)*q - dmin*m in float (as gguf-py computes Q4_K) */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    unsigned long long src, out;
    Py_ssize_t N, K;
    if (!PyArg_ParseTuple(args, "KnnK", &src, &N, &K, &out) || dims(N, K)) return NULL;
    const uint8_t *W = (const uint8_t *)(uintptr_t)src;
    float *y = (float *)(uintptr_t)out;
    const int nsb = (int)((K + QK - 1) / QK);
    Py_BEGIN_ALLOW_THREADS for (Py_ssize_t n = 0; n < N; n++) {
        uint8_t sc[NSUB], m[NSUB], q[QK];
        uint16_t d, dmin;
        for (int s = 0; s < nsb; s++) {
            get_column(W + ((size_t)(n / GROUP) * nsb + s) * BLOCK, (int)(n % GROUP), &d, &dmin, sc, m, q);
            const float df = f16_to_f32(d), mf = f16_to_f32(dmin);
            for (int i = 0; i < QK && s * QK + i < K; i++) {
                const float a = df * sc[i / 32], b = mf * m[i / 32];
                y[(size_t)n * K + s * QK + i] = a * q[i] - b;
            }
        }
    }
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static int scratch_reserve(size_t need) {
    if (need <= scratch.cap) return 0;
    free(scratch.xq);
    free(scratch.bs);
    free(scratch.dx);
    scratch.xq = aligned_alloc(64, (need + 63) / 64 * 64);
    scratch.bs = malloc(need / 32 * sizeof(int16_t));
    scratch.dx = malloc(need / QK * sizeof(float));
    scratch.cap = scratch.xq && scratch.bs && scratch.dx ? need : 0;
    return scratch.cap ? 0 : -1;
}

/* matmul(packed, N, K, x, R, y, bias): y[R][N] = x[R][K] @ W.T (+ bias), each row on its own. */
static PyObject *py_matmul(PyObject *self, PyObject *args) {
    unsigned long long w, x, y, bias;
    Py_ssize_t N, K, R;
    if (!PyArg_ParseTuple(args, "KnnKnKK", &w, &N, &K, &x, &R, &y, &bias) || dims(N, K)) return NULL;
    if (R <= 0 || R > (1 << 20)) {
        PyErr_Format(PyExc_ValueError, "bad row count %zd", R);
        return NULL;
    }
    if ((w & 63) != 0) {
        PyErr_SetString(PyExc_ValueError, "the packed weights must be 64-byte aligned");
        return NULL;
    }
    const int Kp = (int)((K + QK - 1) / QK * QK);
    int failed;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&scratch.lock);
    failed = scratch_reserve((size_t)R * Kp);
    if (!failed) {
        Act a = {scratch.xq, scratch.bs, scratch.dx, (int)R, (int)K, Kp};
        quantize_rows((const float *)(uintptr_t)x, (int)R, (int)K, &a);
        MatJob jb = {(const uint8_t *)(uintptr_t)w, (int)N, (int)K, Kp, (int)((N + GROUP - 1) / GROUP), &a,
                     (float *)(uintptr_t)y, (const float *)(uintptr_t)bias, isa_used};
        pool_run(JOB_MATMUL, &jb, jb.ngroups);
    }
    pthread_mutex_unlock(&scratch.lock);
    Py_END_ALLOW_THREADS if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* attend(q, k, v, out, R, H, Hkv, d, L, scale[, room, q_row]): causal attention of the last R of
 * L positions, out [R][H][d], all float32. k and v [Hkv][room][d] (room >= L, default L: a cache with
 * space for more keys is read in place); q [H][R][d], or where q_row > 0 row r's heads side by side
 * at q + r * q_row (a fused q/k/v matmul's output as it is, no copy). Only the addresses change with
 * them: the arithmetic is the same. */
static PyObject *py_attend(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, out;
    int R, H, Hkv, d, L, room = 0, q_row = 0;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKKiiiiif|ii", &q, &k, &v, &out, &R, &H, &Hkv, &d, &L, &scale, &room, &q_row))
        return NULL;
    if (!room) room = L;
    if (R < 1 || L < R || room < L || q_row < 0 || (q_row && q_row < H * d) || H < 1 || Hkv < 1 || H % Hkv || d < 1) {
        PyErr_Format(PyExc_ValueError, "bad attention shape: R=%d L=%d room=%d H=%d Hkv=%d d=%d", R, L, room, H, Hkv, d);
        return NULL;
    }
    AttJob jb = {(const float *)(uintptr_t)q, (const float *)(uintptr_t)k, (const float *)(uintptr_t)v, (float *)(uintptr_t)out,
                 R, H, Hkv, d, L, isa_used, scale, 0,
                 q_row ? (size_t)d : (size_t)R * d, q_row ? (size_t)q_row : (size_t)d, (size_t)room * d};
    Py_BEGIN_ALLOW_THREADS pool_run(JOB_ATTEND, &jb, H * R);
    Py_END_ALLOW_THREADS if (atomic_load(&jb.failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* rms_norm(x, add, w, out, R, D, eps): per row x += add (add 0: none; x is written), then out =
 * RMSNorm(x) * w; all [R][D] float32 except w [D]. */
static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, add, w, out;
    int R, D;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKKiif", &x, &add, &w, &out, &R, &D, &eps)) return NULL;
    if (R < 0 || D < 1) return PyErr_Format(PyExc_ValueError, "bad rms_norm shape: R=%d D=%d", R, D);
    for (int r = 0; r < R; r++)
        rms_norm_row((float *)(uintptr_t)x + (size_t)r * D, add ? (const float *)(uintptr_t)add + (size_t)r * D : NULL,
                     (const float *)(uintptr_t)w, eps, D, (float *)(uintptr_t)out + (size_t)r * D);
    Py_RETURN_NONE;
}

/* rope_kv(qkv, R, H, Hkv, d, cos, sin, k, v, room, L0): R fused q/k/v rows [R][(H + 2 Hkv) d]: RoPE
 * on the H q heads and Hkv k heads in place (cos, sin [R][d]), then row r's k and v heads copied into
 * the caches k, v [Hkv][room][d] at position L0 + r. */
static PyObject *py_rope_kv(PyObject *self, PyObject *args) {
    unsigned long long qkv, cs, sn, k, v;
    int R, H, Hkv, d, room, L0;
    if (!PyArg_ParseTuple(args, "KiiiiKKKKii", &qkv, &R, &H, &Hkv, &d, &cs, &sn, &k, &v, &room, &L0)) return NULL;
    if (R < 0 || H < 1 || Hkv < 1 || d < 2 || d % 2 || L0 < 0 || L0 + R > room)
        return PyErr_Format(PyExc_ValueError, "bad rope_kv shape: R=%d H=%d Hkv=%d d=%d room=%d L0=%d", R, H, Hkv, d, room, L0);
    float *tmp = malloc(sizeof(float) * (size_t)d);
    if (!tmp) return PyErr_NoMemory();
    const size_t width = (size_t)(H + 2 * Hkv) * d;
    for (int r = 0; r < R; r++) {
        float *row = (float *)(uintptr_t)qkv + r * width;
        const float *c = (const float *)(uintptr_t)cs + (size_t)r * d, *sr = (const float *)(uintptr_t)sn + (size_t)r * d;
        for (int h = 0; h < H + Hkv; h++) rope_head(row + (size_t)h * d, c, sr, d, tmp);
        for (int g = 0; g < Hkv; g++) {
            const size_t at = ((size_t)g * room + L0 + r) * d;
            memcpy((float *)(uintptr_t)k + at, row + (size_t)(H + g) * d, sizeof(float) * (size_t)d);
            memcpy((float *)(uintptr_t)v + at, row + (size_t)(H + Hkv + g) * d, sizeof(float) * (size_t)d);
        }
    }
    free(tmp);
    Py_RETURN_NONE;
}

static PyObject *py_set_threads(PyObject *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    if (n < 1 || n > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1..%d, not %d", MAX_THREADS, n);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&pool.call);
    pool.nthreads = n;
    pool_stop();
    pthread_mutex_unlock(&pool.call);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *py_get_threads(PyObject *self, PyObject *args) { return PyLong_FromLong(pool.nthreads); }

static PyObject *py_set_spin_us(PyObject *self, PyObject *args) {
    long us;
    if (!PyArg_ParseTuple(args, "l", &us)) return NULL;
    spin_ns = us < 0 ? 0 : us * 1000;
    Py_RETURN_NONE;
}

static PyObject *py_isa(PyObject *self, PyObject *args) { return PyUnicode_FromString(ISA_NAMES[isa_used]); }

static PyObject *py_supported(PyObject *self, PyObject *args) {
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i <= isa_best; i++) {
        PyObject *s = PyUnicode_FromString(ISA_NAMES[i]);
        if (!s || PyList_Append(out, s)) {
            Py_XDECREF(s);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(s);
    }
    return out;
}

static PyObject *py_set_isa(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int i = 0; i <= isa_best; i++)
        if (!strcmp(name, ISA_NAMES[i])) {
            pthread_mutex_lock(&pool.call);
            isa_used = i;
            pthread_mutex_unlock(&pool.call);
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "vector unit %s is not available on this CPU (best: %s)", name, ISA_NAMES[isa_best]);
    return NULL;
}

static PyMethodDef methods[] = {
    {"packed_size", py_packed_size, METH_VARARGS, "packed_size(N, K) -> bytes of an N x K matrix packed"},
    {"pack_f32", py_pack_f32, METH_VARARGS, "pack_f32(src, N, K, perm, out): quantize float rows [N][K] (Q4_K, as llama.cpp)"},
    {"pack_q4k", py_pack_q4k, METH_VARARGS, "pack_q4k(src, N, K, perm, out): repack GGUF Q4_K rows [N][K/256][144 bytes]"},
    {"dequantize", py_dequantize, METH_VARARGS, "dequantize(packed, N, K, out): the float weights [N][K]"},
    {"matmul", py_matmul, METH_VARARGS, "matmul(packed, N, K, x, R, y, bias): y[R][N] = x[R][K] W^T (+ bias)"},
    {"attend", py_attend, METH_VARARGS, "attend(q, k, v, out, R, H, Hkv, d, L, scale[, room, q_row]): causal attention, each row on its own"},
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, add, w, out, R, D, eps): x += add, then out = RMSNorm(x) * w, row by row"},
    {"rope_kv", py_rope_kv, METH_VARARGS, "rope_kv(qkv, R, H, Hkv, d, cos, sin, k, v, room, L0): RoPE on fused q/k rows, k and v into a cache"},
    {"set_threads", py_set_threads, METH_VARARGS, "set_threads(n): threads splitting the columns, the caller included"},
    {"threads", py_get_threads, METH_NOARGS, "threads() -> the thread count"},
    {"set_spin_us", py_set_spin_us, METH_VARARGS, "set_spin_us(us): how long a waiting thread spins before it sleeps"},
    {"isa", py_isa, METH_NOARGS, "isa() -> the vector unit the kernels use"},
    {"supported", py_supported, METH_NOARGS, "supported() -> the vector units this CPU runs, slowest first"},
    {"set_isa", py_set_isa, METH_VARARGS, "set_isa(name): use this vector unit (tests compare them)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_q4", "vocabbridge's row-invariant 4-bit CPU matmul", -1, methods};

PyMODINIT_FUNC PyInit__q4(void) {
#ifdef Q4_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        isa_best = ISA_AVX2;
    if (isa_best == ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        isa_best = ISA_AVX512;
#endif
#ifdef Q4_AMX
    if (isa_best == ISA_AVX512 && amx_permitted()) isa_best = ISA_AMX;
#endif
    isa_used = isa_best;
    pthread_atfork(NULL, NULL, after_fork_child);
    return PyModule_Create(&module);
}
