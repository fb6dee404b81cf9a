/* The vector unit's int8 dot-product peak on one core: how many vpdpbusd (16 int32 lanes, 64
 * products each; AVX-512 VNNI) and, for comparison, 256-bit vpdpbusd / vpmaddubsw a core retires
 * a second, over eight independent accumulator chains. The q4 kernel (csrc/q4/q4.c) spends 64
 * vpdpbusd per row per 256 x 16 weight block, so this peak bounds what each extra verification
 * row costs once the weights are in cache.
 *
 *     gcc -O2 -o /tmp/vnni_peak benchmarks/vnni_peak.c && /tmp/vnni_peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define CHAINS 8

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int zmm_dpbusd(long n) {
    __m512i a[CHAINS], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(1);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_epi32(i);
    for (long k = 0; k < n; k++) {
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
        __asm__ volatile("" : "+v"(w)); /* keeps the loop from being folded */
    }
    __m512i s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_epi32(s, a[i]);
    return _mm512_reduce_add_epi32(s);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static int ymm_dpbusd(long n) {
    __m256i a[CHAINS], w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(1);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_epi32(i);
    for (long k = 0; k < n; k++) {
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_dpbusd_epi32(a[i], w, x);
        __asm__ volatile("" : "+v"(w));
    }
    int o = 0;
    for (int i = 0; i < CHAINS; i++) o += _mm256_extract_epi32(a[i], 0);
    return o;
}

__attribute__((target("avx2"))) static int ymm_maddubs(long n) {
    __m256i a[CHAINS], w = _mm256_set1_epi8(3);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_epi32(i);
    for (long k = 0; k < n; k++) {
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_maddubs_epi16(w, a[i]);
        __asm__ volatile("" : "+v"(w));
    }
    int o = 0;
    for (int i = 0; i < CHAINS; i++) o += _mm256_extract_epi32(a[i], 0);
    return o;
}

int main(void) {
    const long n = 100000000;
    int sink = 0;
    double t;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni")) {
        t = now(), sink += zmm_dpbusd(n), t = now() - t;
        printf("vpdpbusd zmm  : %.2f G/s (%.1f G int8 products/s)\n", CHAINS * n / t / 1e9, 64 * CHAINS * n / t / 1e9);
        t = now(), sink += ymm_dpbusd(n), t = now() - t;
        printf("vpdpbusd ymm  : %.2f G/s\n", CHAINS * n / t / 1e9);
    } else {
        printf("no AVX-512 VNNI on this CPU\n");
    }
    if (__builtin_cpu_supports("avx2")) {
        t = now(), sink += ymm_maddubs(n), t = now() - t;
        printf("vpmaddubsw ymm: %.2f G/s\n", CHAINS * n / t / 1e9);
    }
    return sink == 42; /* uses the results */
}
