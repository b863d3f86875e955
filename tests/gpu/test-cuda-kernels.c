/* test-cuda-kernels.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * The layout kernels of kernels/cuda/cp-index-kernels.cu on a GPU,
 * compared byte for byte with the same layouts worked out on the host
 * from kernels/cp-index-math.h.  Exits 77 (skipped) where no CUDA device
 * is present.
 */

#include "config.h"

#include <string.h>

#include <cuda_runtime_api.h>

#include <libcpmesh.h>

#include "kernels/cuda/cp-cuda-kernels-private.h"
#include "cp-test-gpu.h"

#define MAX_DOCS 80

#define CHECK_CUDA(call) g_assert_cmpstr (cudaGetErrorName (call), ==, "cudaSuccess")

static void *
device_copy_of (const void *host,
                gsize       size)
{
  void *device = NULL;

  CHECK_CUDA (cudaMalloc (&device, MAX (size, 1)));
  if (host != NULL)
    CHECK_CUDA (cudaMemcpy (device, host, size, cudaMemcpyHostToDevice));
  else
    CHECK_CUDA (cudaMemset (device, 0, MAX (size, 1)));
  return device;
}

static void *
host_copy_of (const void *device,
              gsize       size)
{
  void *host = g_malloc (MAX (size, 1));

  CHECK_CUDA (cudaDeviceSynchronize ());
  CHECK_CUDA (cudaMemcpy (host, device, size, cudaMemcpyDeviceToHost));
  return host;
}

/* The shard of rank @rank worked out on the host: for every outer index,
 * the rows of its runs in local order. */
static guint8 *
expected_shard (const guint8       *full,
                const CpCudaShardView *view,
                const cp_index_run *runs,
                gsize               n_runs)
{
  guint8 *local = g_malloc0 (MAX (view->outer * view->local_length * view->inner, 1));

  for (gint64 o = 0; o < view->outer; o++)
    {
      gint64 l = 0;

      for (gsize r = 0; r < n_runs; r++)
        {
          memcpy (local + (o * view->local_length + l) * view->inner,
                  full + (o * view->full_length + runs[r].start) * view->inner,
                  runs[r].length * view->inner);
          l += runs[r].length;
        }
    }
  return local;
}

/* Shards a patterned [outer, S, inner] tensor for every rank, compares
 * with the host, then unshards every shard into a zeroed tensor, which
 * must give the original back. */
static void
check_layout (gboolean       head_tail,
              gint64         cp_size,
              const gint64  *bounds,
              gsize          n_docs,
              gint64         outer,
              gint64         inner)
{
  gint64 length = bounds[n_docs];
  gsize full_size = outer * length * inner;
  g_autofree guint8 *full = g_malloc (MAX (full_size, 1));
  void *d_full;
  void *d_rebuilt = device_copy_of (NULL, full_size);
  g_autofree guint8 *rebuilt = NULL;

  for (gsize i = 0; i < full_size; i++)
    full[i] = (guint8) (i * 7 + i / 251);
  d_full = device_copy_of (full, full_size);

  for (gint64 rank = 0; rank < cp_size; rank++)
    {
      g_autofree cp_index_run *runs = g_new (cp_index_run, cp_index_max_runs (head_tail, n_docs) + 1);
      gsize n_runs = cp_index_rank_runs (head_tail, cp_size, rank, bounds, n_docs, runs);
      gint64 local_length = cp_index_runs_length (runs, n_runs);
      CpCudaShardView view = { d_full, NULL, outer, length, local_length, inner };
      g_autofree guint8 *want = expected_shard (full, &view, runs, n_runs);
      g_autofree guint8 *got = NULL;

      view.local = device_copy_of (NULL, outer * local_length * inner);
      CHECK_CUDA (_cp_cuda_shard (&view, head_tail, cp_size, rank, bounds, n_docs, FALSE, NULL));
      got = host_copy_of (view.local, outer * local_length * inner);
      g_assert_cmpmem (got, outer * local_length * inner, want, outer * local_length * inner);

      view.full = d_rebuilt;
      CHECK_CUDA (_cp_cuda_shard (&view, head_tail, cp_size, rank, bounds, n_docs, TRUE, NULL));
      CHECK_CUDA (cudaFree (view.local));
    }
  rebuilt = host_copy_of (d_rebuilt, full_size);
  g_assert_cmpmem (rebuilt, full_size, full, full_size);
  CHECK_CUDA (cudaFree (d_full));
  CHECK_CUDA (cudaFree (d_rebuilt));
}

/* One document, shared along the first, a middle and the last dimension
 * of [4, 48, 6] tensors of 1-, 2-, 4- and 8-byte elements (so every
 * access width the kernel picks is used), both partitions, C = 1 … 4. */
static void
test_shard_any_dimension (void)
{
  const gint64 bounds[] = { 0, 48 };
  const gint64 element_sizes[] = { 1, 2, 4, 8 };

  for (gsize e = 0; e < G_N_ELEMENTS (element_sizes); e++)
    for (gint64 cp_size = 1; cp_size <= 4; cp_size++)
      for (int head_tail = 0; head_tail <= 1; head_tail++)
        {
          gint64 size = element_sizes[e];

          check_layout (head_tail, cp_size, bounds, 1, 1, 4 * 6 * size);   /* dim 0 of [48, 4, 6] */
          check_layout (head_tail, cp_size, bounds, 1, 4, 6 * size);       /* dim 1 of [4, 48, 6] */
          check_layout (head_tail, cp_size, bounds, 1, 4 * 6, size);       /* dim 2 of [4, 6, 48] */
        }
}

/* Packed documents (THD), empty ones included, and more runs than one
 * launch carries. */
static void
test_shard_documents (void)
{
  const gint64 units[] = { 2, 0, 1, 3 };
  gint64 bounds[MAX_DOCS + 1] = { 0 };

  for (gint64 cp_size = 1; cp_size <= 4; cp_size++)
    {
      for (gsize d = 0; d < G_N_ELEMENTS (units); d++)
        bounds[d + 1] = bounds[d] + units[d] * 2 * cp_size;
      check_layout (TRUE, cp_size, bounds, G_N_ELEMENTS (units), 2, 24);
      check_layout (FALSE, cp_size, bounds, G_N_ELEMENTS (units), 2, 24);
    }
  for (gsize d = 0; d < MAX_DOCS; d++)
    bounds[d + 1] = bounds[d] + 2 * 3 * (1 + d % 3);
  check_layout (TRUE, 3, bounds, MAX_DOCS, 3, 16);
}

static void
test_fill (void)
{
  const gsize sizes[] = { 1, 2, 4, 8, 16 };
  const guint8 pattern[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
  const gsize n = 1000;

  for (gsize s = 0; s < G_N_ELEMENTS (sizes); s++)
    {
      void *d = device_copy_of (NULL, n * sizes[s]);
      g_autofree guint8 *got = NULL;

      CHECK_CUDA (_cp_cuda_fill (d, n, pattern, sizes[s], NULL));
      got = host_copy_of (d, n * sizes[s]);
      for (gsize i = 0; i < n; i++)
        g_assert_cmpmem (got + i * sizes[s], sizes[s], pattern, sizes[s]);
      CHECK_CUDA (cudaFree (d));
    }
  g_assert_cmpint (_cp_cuda_fill (NULL, 1, pattern, 3, NULL), ==, cudaErrorInvalidValue);
}

/* Global positions, and positions within each document (C = 1 merges
 * consecutive documents into one run, which the kernel splits again). */
static void
test_position_ids (void)
{
  const gint64 bounds[] = { 0, 8, 8, 20, 24 };
  const gsize n_docs = 4;
  const gint64 rows = 3;

  for (gint64 cp_size = 1; cp_size <= 2; cp_size++)
    for (gint64 rank = 0; rank < cp_size; rank++)
      for (int per_document = 0; per_document <= 1; per_document++)
        {
          cp_index_run runs[8];
          gsize n_runs = cp_index_rank_runs (TRUE, cp_size, rank, bounds, n_docs, runs);
          gint64 local_length = cp_index_runs_length (runs, n_runs);
          g_autofree gint64 *want = g_new (gint64, rows * local_length);
          g_autofree gint64 *got = NULL;
          void *d = device_copy_of (NULL, rows * local_length * sizeof (gint64));

          cp_index_runs_positions (runs, n_runs, want);
          for (gint64 l = 0; l < local_length; l++)
            if (per_document)
              want[l] -= bounds[cp_index_first_document_after (bounds, n_docs, want[l])];
          for (gint64 row = 1; row < rows; row++)
            memcpy (want + row * local_length, want, local_length * sizeof (gint64));
          CHECK_CUDA (_cp_cuda_position_ids (d, rows, runs, n_runs, bounds, n_docs, per_document, NULL));
          got = host_copy_of (d, rows * local_length * sizeof (gint64));
          g_assert_cmpmem (got, rows * local_length * sizeof (gint64), want, rows * local_length * sizeof (gint64));
          CHECK_CUDA (cudaFree (d));
        }
}

/* copy_runs as the memory interface calls it for a THD chunk: the full
 * tensor's rows wider than the chunk, whose first position is global
 * position 1000, and the shard written at an offset into wider rows. */
static void
test_copy_runs_offsets (void)
{
  const gint64 first = 1000, length = 48, full_row = length + 7, cp_size = 3;
  const gint64 bounds[] = { first, first + 12, first + length };
  const gint64 local_offset = 2;

  for (gint64 inner = 1; inner <= 4096; inner *= 8)
    for (gint64 outer = 1; outer <= 3; outer += 2)
      for (gint64 rank = 0; rank < cp_size; rank++)
        {
          gsize full_size = (gsize) (outer * full_row * inner);
          g_autofree guint8 *full = g_malloc (full_size);
          cp_index_run runs[8];
          gsize n_runs = cp_index_rank_runs (TRUE, cp_size, rank, bounds, 2, runs);
          gint64 local_length = cp_index_runs_length (runs, n_runs);
          gint64 local_row = local_length + 5;
          gsize local_size = (gsize) (outer * local_row * inner);
          g_autofree guint8 *want = g_malloc0 (local_size);
          g_autofree guint8 *got = NULL;
          gint64 positions[64];
          void *d_full, *d_local;
          CpCudaRunsCopy copy;

          for (gsize i = 0; i < full_size; i++)
            full[i] = (guint8) (i * 13 + 1);
          cp_index_runs_positions (runs, n_runs, positions);
          for (gint64 o = 0; o < outer; o++)
            for (gint64 l = 0; l < local_length; l++)
              memcpy (want + (o * local_row + local_offset + l) * inner,
                      full + (o * full_row + positions[l] - first) * inner, (gsize) inner);
          d_full = device_copy_of (full, full_size);
          d_local = device_copy_of (NULL, local_size);
          copy = (CpCudaRunsCopy) { d_full, full_row * inner, first,
                                    (guint8 *) d_local + local_offset * inner, local_row * inner,
                                    outer, inner };
          CHECK_CUDA (_cp_cuda_copy_runs (&copy, runs, n_runs, FALSE, NULL));
          got = host_copy_of (d_local, local_size);
          g_assert_cmpmem (got, local_size, want, local_size);
          CHECK_CUDA (cudaFree (d_full));
          CHECK_CUDA (cudaFree (d_local));
        }
}

int
main (int   argc,
      char *argv[])
{
  cp_test_require_cuda_device ();
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Cuda/kernels/shard/any-dimension", test_shard_any_dimension);
  g_test_add_func ("/Cp/Cuda/kernels/shard/documents", test_shard_documents);
  g_test_add_func ("/Cp/Cuda/kernels/fill", test_fill);
  g_test_add_func ("/Cp/Cuda/kernels/position-ids", test_position_ids);
  g_test_add_func ("/Cp/Cuda/kernels/copy-runs/offsets", test_copy_runs_offsets);

  return g_test_run ();
}
