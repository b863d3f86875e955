/* bench-cuda-layout.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * The layout kernels' bandwidth against cudaMemcpyAsync of the same
 * bytes, device to device, in the same run: one row per case, bytes read
 * plus written per second for both, and their ratio (the target is at
 * least 0.8).  A third column times the same move as the library makes
 * it, through the memory interface's copy_runs (device guard, launches,
 * one synchronisation a call), by the wall clock.  Exits 77 (skipped)
 * where no CUDA device is present.
 *
 * Usage: bench-cuda-layout [--quick]
 */

#include "config.h"

#include <string.h>

#include <cuda_runtime_api.h>

#include <libcpmesh.h>

#include "cp-memory-private.h"
#include "cp-tensor-private.h"
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
  gint64 n_documents; /* of equal length */
} Case;

/* [S, H·D] bfloat16 with H = 16, D = 128 (4096 bytes a position), and the
 * same split along the second dimension of [B, S, …]. */
static const Case cases[] = {
  { "shard head-tail C=8 dim 0 [32768, 16, 128] bf16", TRUE, 8, 1, 32768, 4096, FALSE, 1 },
  { "unshard head-tail C=8 dim 0 [32768, 16, 128] bf16", TRUE, 8, 1, 32768, 4096, TRUE, 1 },
  { "shard contiguous C=8 dim 0 [32768, 16, 128] bf16", FALSE, 8, 1, 32768, 4096, FALSE, 1 },
  { "shard head-tail C=4 dim 1 [4, 8192, 16, 128] bf16", TRUE, 4, 4, 8192, 4096, FALSE, 1 },
  { "shard head-tail C=8 dim 1 [16, 32768] int64 ids", TRUE, 8, 16, 32768, 8, FALSE, 1 },
  /* THD: 2048 documents of 16 tokens, 4096 runs a rank. */
  { "shard THD C=8 2048 docs [32768, 16, 128] bf16", TRUE, 8, 1, 32768, 4096, FALSE, 2048 },
};

/* Equal documents over the case's sequence. */
static gint64 *
case_bounds (const Case *c)
{
  gint64 *bounds = g_new (gint64, c->n_documents + 1);

  for (gint64 d = 0; d <= c->n_documents; d++)
    bounds[d] = d * (c->length / c->n_documents);
  return bounds;
}

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
  g_autofree gint64 *bounds = case_bounds (c);

  CHECK (_cp_cuda_shard (view, c->head_tail, c->cp_size, 0, bounds, (gsize) c->n_documents,
                         c->unshard, NULL));
}

/* Seconds per call of the memory interface's copy_runs between two CUDA
 * tensors, by the wall clock: each call waits for its bytes. */
static double
time_library (const Case *c,
              int         iterations)
{
  g_autofree gint64 *bounds = case_bounds (c);
  g_autofree cp_index_run *runs = g_new (cp_index_run, cp_index_max_runs (c->head_tail,
                                                                           (gsize) c->n_documents) + 1);
  gsize n_runs = cp_index_rank_runs (c->head_tail, c->cp_size, 0, bounds, (gsize) c->n_documents,
                                     runs);
  gint64 local_length = cp_index_runs_length (runs, n_runs);
  gint64 full_bytes = c->outer * c->length * c->inner;
  gint64 local_bytes = c->outer * local_length * c->inner;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) full = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_UINT8,
                                                       &full_bytes, 1, FALSE, &error);
  g_autoptr(CpTensor) local = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_UINT8,
                                                        &local_bytes, 1, FALSE, &error);
  gint64 started = 0;

  g_assert_no_error (error);
  for (int i = -1; i < iterations; i++)
    {
      if (i == 0)
        started = g_get_monotonic_time ();
      if (!_cp_memory_copy_runs (full, 0, (gsize) (c->length * c->inner), 0, local, 0,
                                 (gsize) (local_length * c->inner), runs, (guint) n_runs,
                                 (gsize) c->inner, (gsize) c->outer, !c->unshard, FALSE, &error))
        g_error ("copy_runs: %s", error->message);
    }
  return (g_get_monotonic_time () - started) / 1e6 / iterations;
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
  g_print ("%-52s %12s %12s %7s %13s\n", "case", "kernel GB/s", "memcpy GB/s", "ratio",
           "library GB/s");
  for (gsize i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      const Case *c = &cases[i];
      gint64 local_length = c->length / c->cp_size;
      CpCudaShardView view = { NULL, NULL, c->outer, c->length, local_length, c->inner };
      double moved = 2.0 * c->outer * local_length * c->inner;
      double kernel, copy, library;

      CHECK (cudaMalloc (&view.full, c->outer * c->length * c->inner));
      CHECK (cudaMalloc (&view.local, c->outer * local_length * c->inner));
      kernel = time_per_call (run_kernel, c, &view, iterations);
      copy = time_per_call (run_memcpy, c, &view, iterations);
      library = time_library (c, iterations);
      g_print ("%-52s %12.1f %12.1f %7.2f %13.1f\n", c->name, moved / kernel / 1e9,
               moved / copy / 1e9, copy / kernel, moved / library / 1e9);
      CHECK (cudaFree (view.full));
      CHECK (cudaFree (view.local));
    }
  return 0;
}
