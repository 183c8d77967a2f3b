/* Checker of the c-matmul cases: never linked with candidate code (test.sh builds and runs it as root).
 *
 * usage: check N REPS SEED FILE
 *
 * FILE must hold exactly what `bench N REPS SEED` writes when its matmul is right: for every rep, the
 * product of that rep's inputs (inputs.h), each element within 1e-9 * n of this file's own naive
 * multiply (reordered sums differ by rounding only: |error| <= n * eps * sum|a_ik * b_kj| <= n * n *
 * eps, since every input is in [-1, 1)); an element left unwritten is NaN and fails. Exits 0 when it
 * does, 2 when it does not (message on stderr), 64 on bad usage, 71 when memory or the file fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inputs.h"

/* The naive product, in the i-k-j order (each c_ij is summed over k in increasing order, as the
 * naive triple loop does; this order only reads rows, so it is fast enough to check every rep). */
static void reference_product(int n, const double *a, const double *b, double *c) {
    size_t count = (size_t)n * (size_t)n;
    memset(c, 0, count * sizeof *c);
    for (int i = 0; i < n; i++) {
        double *row = c + (size_t)i * n;
        for (int k = 0; k < n; k++) {
            double aik = a[(size_t)i * n + k];
            const double *brow = b + (size_t)k * n;
            for (int j = 0; j < n; j++) {
                row[j] += aik * brow[j];
            }
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s N REPS SEED FILE\n", argv[0]);
        return 64;
    }
    int n = atoi(argv[1]);
    int reps = atoi(argv[2]);
    uint64_t seed = strtoull(argv[3], NULL, 10);
    if (n < 1 || n > 4096 || reps < 1) {
        fprintf(stderr, "bad N or REPS\n");
        return 64;
    }
    FILE *file = fopen(argv[4], "rb");
    if (file == NULL) {
        fprintf(stderr, "cannot open %s\n", argv[4]);
        return 71;
    }
    size_t count = (size_t)n * (size_t)n;
    double *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    double *got = malloc(count * sizeof *got), *expected = malloc(count * sizeof *expected);
    if (!a || !b || !got || !expected) {
        fprintf(stderr, "out of memory\n");
        return 71;
    }
    double tolerance = 1e-9 * n;
    for (int rep = 0; rep < reps; rep++) {
        if (fread(got, sizeof *got, count, file) != count) {
            fprintf(stderr, "wrong result: rep %d is missing or short\n", rep);
            return 2;
        }
        fill_inputs(seed, n, rep, a, b);
        reference_product(n, a, b, expected);
        for (size_t i = 0; i < count; i++) {
            double error = fabs(got[i] - expected[i]);
            if (!(error <= tolerance)) {
                fprintf(stderr, "wrong result in rep %d at (%zu, %zu): got %.17g, expected %.17g\n", rep,
                        i / (size_t)n, i % (size_t)n, got[i], expected[i]);
                return 2;
            }
        }
    }
    if (fgetc(file) != EOF) {
        fprintf(stderr, "wrong result: more output than %d rep(s)\n", reps);
        return 2;
    }
    fclose(file);
    free(a);
    free(b);
    free(got);
    free(expected);
    return 0;
}
