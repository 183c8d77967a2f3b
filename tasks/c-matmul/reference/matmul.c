#include <stddef.h>
#include <string.h>

#include "matmul.h"

/* Cache- and register-blocked multiply for `gcc -O2`.
 *
 * - Blocking over k keeps a BLOCK_K x n slab of b hot in cache while every row block of a uses it.
 * - The micro-kernel holds a 4 x 2 tile of c in registers across the whole k block: each load of
 *   two elements of b feeds four rows (8 multiply-adds per 2 loads, against 1 per 2 in the naive
 *   loop), and c is read and written once per k block instead of once per multiply-add.
 * - Two-double vectors (GCC's vector extension; SSE2 on x86-64, NEON on arm64) do the arithmetic:
 *   -O2 only vectorizes loops it can prove need no peeling, which rules out these loops.
 * - `restrict` tells the compiler a, b and c never alias, so tiles can stay in registers.
 * Remainder rows (n % 4) and the last column (odd n) take plain scalar loops.
 */

typedef double pair __attribute__((vector_size(2 * sizeof(double))));

enum { BLOCK_K = 128 };

static inline int min_int(int x, int y) { return x < y ? x : y; }

/* Element-wise loads and stores: they compile to one unaligned vector move each, and unlike memcpy
 * through the vector's address they let GCC 14 keep the accumulators in registers. */
static inline pair load_pair(const double *p) { return (pair){p[0], p[1]}; }

static inline void store_pair(double *p, pair v) {
    p[0] = v[0];
    p[1] = v[1];
}

/* c[i..i+3][j..j+1] += a[i..i+3][k0..k1) * b[k0..k1)[j..j+1] */
static void kernel_4x2(int n, int i, int j, int k0, int k1, const double *restrict a,
                       const double *restrict b, double *restrict c) {
    double *c0 = c + (size_t)i * n + j;
    pair s0 = load_pair(c0), s1 = load_pair(c0 + n), s2 = load_pair(c0 + 2 * (size_t)n),
         s3 = load_pair(c0 + 3 * (size_t)n);
    for (int k = k0; k < k1; k++) {
        pair bv = load_pair(b + (size_t)k * n + j);
        const double *ak = a + (size_t)i * n + k;
        s0 += ak[0] * bv;
        s1 += ak[n] * bv;
        s2 += ak[2 * (size_t)n] * bv;
        s3 += ak[3 * (size_t)n] * bv;
    }
    store_pair(c0, s0);
    store_pair(c0 + n, s1);
    store_pair(c0 + 2 * (size_t)n, s2);
    store_pair(c0 + 3 * (size_t)n, s3);
}

/* c[i][j] += a[i][k0..k1) . b[k0..k1)[j], one element */
static void scalar_element(int n, int i, int j, int k0, int k1, const double *restrict a,
                           const double *restrict b, double *restrict c) {
    double sum = c[(size_t)i * n + j];
    for (int k = k0; k < k1; k++) {
        sum += a[(size_t)i * n + k] * b[(size_t)k * n + j];
    }
    c[(size_t)i * n + j] = sum;
}

void matmul(int n, const double *restrict a, const double *restrict b, double *restrict c) {
    memset(c, 0, (size_t)n * (size_t)n * sizeof *c);
    int rows4 = n - n % 4;
    int cols2 = n - n % 2;
    for (int k0 = 0; k0 < n; k0 += BLOCK_K) {
        int k1 = min_int(k0 + BLOCK_K, n);
        for (int i = 0; i < rows4; i += 4) {
            for (int j = 0; j < cols2; j += 2) {
                kernel_4x2(n, i, j, k0, k1, a, b, c);
            }
            for (int j = cols2; j < n; j++) {
                for (int r = 0; r < 4; r++) {
                    scalar_element(n, i + r, j, k0, k1, a, b, c);
                }
            }
        }
        for (int i = rows4; i < n; i++) {
            for (int j = 0; j < n; j++) {
                scalar_element(n, i, j, k0, k1, a, b, c);
            }
        }
    }
}
