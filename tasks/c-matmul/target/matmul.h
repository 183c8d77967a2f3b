#ifndef MATMUL_H
#define MATMUL_H

/* c = a * b for square n x n matrices of doubles, stored row-major (element (i, j) at [i * n + j]).
 * Every element of c is written; a, b and c do not overlap. */
void matmul(int n, const double *a, const double *b, double *c);

#endif
