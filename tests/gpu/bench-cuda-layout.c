/* bench-cuda-layout.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * The layout kernels' bandwidth against cudaMemcpyAsync of the same
 * bytes, device to device, in the same run: one row per case, bytes read
 * plus written per second for both, and their ratio (the target is at
 * least 0.8).  Exits 77 (skipped) where no CUDA device is present.
 *
 * Usage: bench-cuda-layout [--quick]
 */

#include "config.h"

#include <string.h>

#include <cuda_runtime_api.h>

#include <libcpmesh.h>

#include "kernels/cuda/cp-cuda-kernels-private.h"
#include "cp-test-gpu.h"


typedef struct
{
  const char *name;
  gboolean head_tail;
  gint64 cp_size;
  gint64 outer;
  gint64 length;
  gint64 inner;     /* bytes per position */
  gboolean unshard;
} Case;

/* [S, H·D] bfloat16 with H = 16, D = 128 (4096 bytes a position), and the
 * same split along the second dimension of [B, S, …]. */
static const Case cases[] = {
  { "shard head-tail C=8 dim 0 [32768, 16, 128] bf16", TRUE, 8, 1, 32768, 4096, FALSE },
  { "unshard head-tail C=8 dim 0 [32768, 16, 128] bf16", TRUE, 8, 1, 32768, 4096, TRUE },
  { "shard contiguous C=8 dim 0 [32768, 16, 128] bf16", FALSE, 8, 1, 32768, 4096, FALSE },
  { "shard head-tail C=4 dim 1 [4, 8192, 16, 128] bf16", TRUE, 4, 4, 8192, 4096, FALSE },
  { "shard head-tail C=8 dim 1 [16, 32768] int64 ids", TRUE, 8, 16, 32768, 8, FALSE },
};

#define CHECK(call)                                                     \
  G_STMT_START {                                                        \
    cudaError_t status_ = (call);                                       \
    if (status_ != cudaSuccess)                                         \
      g_error ("%s: %s", #call, cudaGetErrorString (status_));          \
  } G_STMT_END

/* Seconds per call of @run, averaged over @iterations after a warm-up. */
static double
time_per_call (void      (*run) (const Case *, const CpCudaShardView *),
               const Case            *c,
               const CpCudaShardView *view,
               int                    iterations)
{
  cudaEvent_t start, stop;
  float ms = 0.0f;

  CHECK (cudaEventCreate (&start));
  CHECK (cudaEventCreate (&stop));
  run (c, view);
  CHECK (cudaEventRecord (start, NULL));
  for (int i = 0; i < iterations; i++)
    run (c, view);
  CHECK (cudaEventRecord (stop, NULL));
  CHECK (cudaEventSynchronize (stop));
  CHECK (cudaEventElapsedTime (&ms, start, stop));
  CHECK (cudaEventDestroy (start));
  CHECK (cudaEventDestroy (stop));
  return ms / 1e3 / iterations;
}

static void
run_kernel (const Case            *c,
            const CpCudaShardView *view)
{
  const gint64 bounds[] = { 0, c->length };

  CHECK (_cp_cuda_shard (view, c->head_tail, c->cp_size, 0, bounds, 1, c->unshard, NULL));
}

static void
run_memcpy (const Case            *c,
            const CpCudaShardView *view)
{
  gsize bytes = view->outer * view->local_length * view->inner;

  if (c->unshard)
    CHECK (cudaMemcpyAsync (view->full, view->local, bytes, cudaMemcpyDeviceToDevice, NULL));
  else
    CHECK (cudaMemcpyAsync (view->local, view->full, bytes, cudaMemcpyDeviceToDevice, NULL));
}

int
main (int   argc,
      char *argv[])
{
  gboolean quick = argc > 1 && strcmp (argv[1], "--quick") == 0;
  int iterations = quick ? 3 : 50;
  struct cudaDeviceProp prop;

  cp_test_require_cuda_device ();
  CHECK (cudaGetDeviceProperties (&prop, 0));
  g_print ("device: %s\n", prop.name);
  g_print ("%-52s %12s %12s %7s\n", "case", "kernel GB/s", "memcpy GB/s", "ratio");
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      const Case *c = &cases[i];
      gint64 local_length = c->length / c->cp_size;
      CpCudaShardView view = { NULL, NULL, c->outer, c->length, local_length, c->inner };
      double moved = 2.0 * c->outer * local_length * c->inner;
      double kernel, copy;

      CHECK (cudaMalloc (&view.full, c->outer * c->length * c->inner));
      CHECK (cudaMalloc (&view.local, c->outer * local_length * c->inner));
      kernel = time_per_call (run_kernel, c, &view, iterations);
      copy = time_per_call (run_memcpy, c, &view, iterations);
      g_print ("%-52s %12.1f %12.1f %7.2f\n", c->name, moved / kernel / 1e9, moved / copy / 1e9,
               copy / kernel);
      CHECK (cudaFree (view.full));
      CHECK (cudaFree (view.local));
    }
  return 0;
}
