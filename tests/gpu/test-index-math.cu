/* test-index-math.cu
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * tests/test-index-math.c once more, compiled by nvcc as CUDA C++: there
 * kernels/cp-index-math.h's functions are __host__ __device__, as the
 * layout kernels (kernels/cuda/cp-index-kernels.cu) include them, and the
 * same checks must hold.  Runs on the CPU; no GPU needed.
 */

#ifndef __CUDACC__
#error "this test must be compiled by nvcc"
#endif

#include "../test-index-math.c"
