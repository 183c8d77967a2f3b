/* The inputs of the c-matmul benchmark, shared by bench.c (the benchmark, linked with the candidate)
 * and check.c (the trusted checker, never linked with candidate code).
 *
 * Rep r of a run with seed S multiplies a and b filled from a xorshift64* stream seeded by (S, N, r):
 * every rep has new inputs, and the seed is drawn at random by test.sh for every run, so no result
 * can be computed before the run or carried from one rep or run to the next. */
#ifndef MATMUL_INPUTS_H
#define MATMUL_INPUTS_H

#include <stddef.h>
#include <stdint.h>

/* xorshift64*: the same sequence on every libc (rand() is not). Values in [-1, 1). */
static double next_value(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    uint64_t bits = (*state * 2685821657736338717ULL) >> 11;
    return (double)bits / 4503599627370496.0 - 1.0;
}

/* Fills the n x n matrices a and b of rep `rep` of a run seeded with `seed`. */
static void fill_inputs(uint64_t seed, int n, int rep, double *a, double *b) {
    uint64_t state = seed ^ 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n << 32) ^ (uint64_t)(rep + 1) * 0xD1B54A32D192ED03ULL;
    if (state == 0) {
        state = 1; /* xorshift's one fixed point */
    }
    size_t count = (size_t)n * (size_t)n;
    for (size_t i = 0; i < count; i++) a[i] = next_value(&state);
    for (size_t i = 0; i < count; i++) b[i] = next_value(&state);
}

#endif
