/* Benchmark program of the c-matmul cases: calls the `matmul` it is linked with (the candidate's, or
 * tests/naive.c) on fresh inputs and writes every result.
 *
 * usage: bench N REPS SEED
 *   N      matrix size (square, row-major doubles)
 *   REPS   calls, each on new inputs (inputs.h)
 *   SEED   the run's seed (test.sh draws one at random per run)
 *
 * Writes the REPS results c (N x N doubles each, native byte order) to stdout and exits 0; 64 on bad
 * usage, 71 when memory runs out or the output cannot be written.
 *
 * Nothing this program reports is trusted: candidate code is linked into it and could change any of
 * it. The CPU time is counted by the kernel and written by `vero-kit run --usage`, and the results are
 * checked afterwards by check.c, which never runs candidate code. */
#define _POSIX_C_SOURCE 199309L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "inputs.h"

void matmul(int n, const double *a, const double *b, double *c);

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s N REPS SEED\n", argv[0]);
        return 64;
    }
    int n = atoi(argv[1]);
    int reps = atoi(argv[2]);
    uint64_t seed = strtoull(argv[3], NULL, 10);
    if (n < 1 || n > 4096 || reps < 1) {
        fprintf(stderr, "bad N or REPS\n");
        return 64;
    }
    size_t count = (size_t)n * (size_t)n;
    double *a = malloc(count * sizeof *a);
    double *b = malloc(count * sizeof *b);
    double *c = malloc(count * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory\n");
        return 71;
    }
    for (int rep = 0; rep < reps; rep++) {
        fill_inputs(seed, n, rep, a, b);
        /* NaN everywhere: an element the candidate forgets to write fails the check. */
        for (size_t i = 0; i < count; i++) c[i] = NAN;
        matmul(n, a, b, c);
        if (fwrite(c, sizeof *c, count, stdout) != count) {
            fprintf(stderr, "cannot write the result\n");
            return 71;
        }
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "cannot write the result\n");
        return 71;
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
