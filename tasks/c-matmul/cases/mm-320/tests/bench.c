/* Benchmark harness of the c-matmul cases: times the `matmul` it is linked with and checks it.
 *
 * usage: bench N REPS CHECK
 *   N      matrix size (square, row-major doubles)
 *   REPS   timed calls; the best (smallest) time is reported
 *   CHECK  1: compare the first call's result with this file's own naive multiply, 0: skip
 *
 * Prints `best_sec=<seconds>` (CPU time of the whole process, CLOCK_PROCESS_CPUTIME_ID) and
 * `best_wall_sec=<seconds>` (wall time, for information) and exits 0; exits 2 when the result is
 * wrong (message on stderr), 64 on bad usage, 71 when memory runs out. Inputs are a fixed
 * pseudo-random function of N, so every build sees the same matrices.
 */
#define _POSIX_C_SOURCE 199309L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void matmul(int n, const double *a, const double *b, double *c);

/* CPU time, not wall time, is what the speed-up compares: other load on a shared machine stretches
 * wall time by a varying factor but barely changes the CPU time a multiply needs. It counts every
 * thread of the process, so threads cannot hide work (test.sh also forbids new threads and
 * processes). */
static double clock_sec(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* xorshift64*: the same sequence on every libc (rand() is not). Values in [-1, 1). */
static double next_value(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    uint64_t bits = (*state * 2685821657736338717ULL) >> 11;
    return (double)bits / 4503599627370496.0 - 1.0;
}

/* Kept private to the harness so that a candidate cannot replace the reference it is checked against. */
static void harness_naive_matmul(int n, const double *a, const double *b, double *c) {
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            double sum = 0.0;
            for (int k = 0; k < n; k++) {
                sum += a[(size_t)i * n + k] * b[(size_t)k * n + j];
            }
            c[(size_t)i * n + j] = sum;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s N REPS CHECK\n", argv[0]);
        return 64;
    }
    int n = atoi(argv[1]);
    int reps = atoi(argv[2]);
    int check = atoi(argv[3]);
    if (n < 1 || n > 4096 || reps < 1) {
        fprintf(stderr, "bad N or REPS\n");
        return 64;
    }
    size_t count = (size_t)n * (size_t)n;
    double *a = malloc(count * sizeof *a);
    double *b = malloc(count * sizeof *b);
    double *c = malloc(count * sizeof *c);
    double *expected = check ? malloc(count * sizeof *expected) : NULL;
    if (!a || !b || !c || (check && !expected)) {
        fprintf(stderr, "out of memory\n");
        return 71;
    }
    uint64_t state = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (size_t i = 0; i < count; i++) a[i] = next_value(&state);
    for (size_t i = 0; i < count; i++) b[i] = next_value(&state);

    double best_sec = INFINITY, best_wall_sec = INFINITY;
    for (int rep = 0; rep < reps; rep++) {
        /* NaN everywhere: an element the candidate forgets to write fails the check. */
        for (size_t i = 0; i < count; i++) c[i] = NAN;
        double start = clock_sec(CLOCK_PROCESS_CPUTIME_ID);
        double start_wall = clock_sec(CLOCK_MONOTONIC);
        matmul(n, a, b, c);
        double wall = clock_sec(CLOCK_MONOTONIC) - start_wall;
        double cpu = clock_sec(CLOCK_PROCESS_CPUTIME_ID) - start;
        if (cpu < best_sec) best_sec = cpu;
        if (wall < best_wall_sec) best_wall_sec = wall;
        if (check && rep == 0) {
            harness_naive_matmul(n, a, b, expected);
            /* Reordered sums differ by rounding only: |error| <= n * eps * sum|a_ik * b_kj| <= n * n * eps. */
            double tolerance = 1e-9 * n;
            for (size_t i = 0; i < count; i++) {
                double error = fabs(c[i] - expected[i]);
                if (!(error <= tolerance)) {
                    fprintf(stderr, "wrong result at (%zu, %zu): got %.17g, expected %.17g\n",
                            i / (size_t)n, i % (size_t)n, c[i], expected[i]);
                    return 2;
                }
            }
        }
    }
    printf("best_sec=%.9f\nbest_wall_sec=%.9f\n", best_sec, best_wall_sec);
    free(a);
    free(b);
    free(c);
    free(expected);
    return 0;
}
