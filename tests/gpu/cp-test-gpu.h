/* cp-test-gpu.h: what the GPU tests and benchmarks share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <stdlib.h>

#include <glib.h>

#include "kernels/cuda/cp-cuda-private.h"

/* Meson counts exit status 77 as a skipped test. */
#define CP_TEST_EXIT_SKIP 77

/* Exits with CP_TEST_EXIT_SKIP, saying why, unless a CUDA device is
 * present: GPU tests run only where there is one. */
static inline void
cp_test_require_cuda_device (void)
{
  g_autoptr(GError) error = NULL;

  if (_cp_cuda_device_count (&error) >= 1)
    return;
  g_print ("SKIP: %s\n", error->message);
  exit (CP_TEST_EXIT_SKIP);
}
