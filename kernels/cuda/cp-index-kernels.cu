/* cp-index-kernels.cu: layout kernels on CUDA memory
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * Shard and unshard (gather and scatter of a rank's runs along the
 * sequence dimension), fill, and position ids.  Which positions a rank
 * holds comes from kernels/cp-index-math.h, the header the CPU layout
 * code uses, so the partition is one definition on both devices; the
 * CPU tests check that header, compiled as C and as C++.
 *
 * Runs travel to the device inside the launch parameters, up to
 * CP_RUNS_PER_LAUNCH at a time (cp-run-batch-private.h, which also holds
 * what each thread computes, so a CPU test runs it): no device allocation and no extra copy per
 * call.  A layout with more runs (THD with many documents) takes one
 * launch per batch of runs.  The memory interface's copy_runs for CUDA
 * memory (libcpmesh/cp-memory-cuda.c) is _cp_cuda_copy_runs: every shard,
 * unshard and THD chunk copy of a CUDA tensor runs here.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cp-cuda-kernels-private.h"
#include "cp-run-batch-private.h"

#define THREADS_PER_BLOCK 256
#define MAX_BLOCKS 65536

/* Pitches and @inner are in units of the access width, @full_first is
 * the global position at @full. */
template <typename Unit>
__global__ static void
gather_runs_kernel (Unit                               *full,
                    Unit                               *local,
                    int64_t                             outer,
                    int64_t                             full_pitch,
                    int64_t                             full_first,
                    int64_t                             local_pitch,
                    int64_t                             inner,
                    const __grid_constant__ CpRunBatch  batch,
                    bool                                unshard)
{
  int64_t n = outer * batch.total * inner;

  for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n;
       i += (int64_t) gridDim.x * blockDim.x)
    {
      CpGatherIndex at = cp_run_batch_gather_index (batch, i, full_pitch, full_first, local_pitch,
                                                    inner);

      if (unshard)
        full[at.full] = local[at.local];
      else
        local[at.local] = full[at.full];
    }
}

/* A pattern of up to 16 bytes written byte by byte from a destination
 * not aligned to it. */
__global__ static void
fill_bytes_kernel (uint8_t  *dst,
                   size_t    n,
                   uint4     pattern,
                   unsigned  pattern_size)
{
  const uint8_t *bytes = (const uint8_t *) &pattern;

  for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
       i += (size_t) gridDim.x * blockDim.x)
    dst[i] = bytes[i % pattern_size];
}

template <typename Unit>
__global__ static void
fill_kernel (Unit    *dst,
             size_t   n,
             Unit     value)
{
  for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
       i += (size_t) gridDim.x * blockDim.x)
    dst[i] = value;
}

__global__ static void
position_ids_kernel (int64_t                            *out,
                     int64_t                             rows,
                     int64_t                             local_length,
                     const __grid_constant__ CpRunBatch  batch)
{
  int64_t n = rows * batch.total;

  for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n;
       i += (int64_t) gridDim.x * blockDim.x)
    {
      int64_t at;
      int64_t position = cp_run_batch_position (batch, i, local_length, &at);

      out[at] = position;
    }
}

static unsigned int
blocks_for (int64_t n)
{
  int64_t blocks = (n + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;

  return (unsigned int) (blocks < 1 ? 1 : blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks);
}

template <typename Unit>
static cudaError_t
launch_gather (const CpCudaRunsCopy *copy,
               const CpRunBatch     &batch,
               bool                  unshard,
               cudaStream_t          stream)
{
  int64_t unit = (int64_t) sizeof (Unit);
  int64_t inner = copy->inner / unit;

  gather_runs_kernel<Unit><<<blocks_for (copy->outer * batch.total * inner), THREADS_PER_BLOCK, 0, stream>>> (
    (Unit *) copy->full, (Unit *) copy->local, copy->outer, copy->full_pitch / unit,
    copy->first, copy->local_pitch / unit, inner, batch, unshard);
  return cudaGetLastError ();
}

static cudaError_t
launch_gather_batch (const CpCudaRunsCopy *copy,
                     const CpRunBatch     &batch,
                     bool                  unshard,
                     cudaStream_t          stream)
{
  switch (cp_run_batch_unit (copy->full, copy->local, copy->inner, copy->full_pitch,
                             copy->local_pitch))
    {
    case 16: return launch_gather<uint4> (copy, batch, unshard, stream);
    case 8: return launch_gather<uint2> (copy, batch, unshard, stream);
    case 4: return launch_gather<uint32_t> (copy, batch, unshard, stream);
    case 2: return launch_gather<uint16_t> (copy, batch, unshard, stream);
    default: return launch_gather<uint8_t> (copy, batch, unshard, stream);
    }
}

extern "C" cudaError_t
_cp_cuda_copy_runs (const CpCudaRunsCopy *copy,
                    const cp_index_run   *runs,
                    size_t                n_runs,
                    bool                  unshard,
                    cudaStream_t          stream)
{
  CpRunBatch batch;
  int64_t first = 0;

  if (copy->outer == 0 || copy->inner == 0)
    return cudaSuccess;
  for (size_t next = 0; next < n_runs;)
    {
      cudaError_t status;

      next = cp_run_batch_take (&batch, runs, NULL, n_runs, next, first);
      if (batch.total == 0)
        continue;
      status = launch_gather_batch (copy, batch, unshard, stream);
      if (status != cudaSuccess)
        return status;
      first += batch.total;
    }
  return cudaSuccess;
}

extern "C" cudaError_t
_cp_cuda_gather_runs (const CpCudaShardView *view,
                      const cp_index_run    *runs,
                      size_t                 n_runs,
                      bool                   unshard,
                      cudaStream_t           stream)
{
  CpCudaRunsCopy copy = {
    view->full, view->full_length * view->inner, 0,
    view->local, view->local_length * view->inner, view->outer, view->inner,
  };

  return _cp_cuda_copy_runs (&copy, runs, n_runs, unshard, stream);
}

extern "C" cudaError_t
_cp_cuda_shard (const CpCudaShardView *view,
                bool                   head_tail,
                int64_t                cp_size,
                int64_t                rank,
                const int64_t         *bounds,
                size_t                 n_documents,
                bool                   unshard,
                cudaStream_t           stream)
{
  cp_index_run *runs = (cp_index_run *) malloc (cp_index_max_runs (head_tail, n_documents) * sizeof *runs + 1);
  size_t n_runs;
  cudaError_t status;

  if (runs == NULL)
    return cudaErrorMemoryAllocation;
  n_runs = cp_index_rank_runs (head_tail, cp_size, rank, bounds, n_documents, runs);
  status = _cp_cuda_gather_runs (view, runs, n_runs, unshard, stream);
  free (runs);
  return status;
}

template <typename Unit>
static cudaError_t
launch_fill (void         *dst,
             size_t        n,
             const void   *pattern,
             cudaStream_t  stream)
{
  Unit value;

  memcpy (&value, pattern, sizeof value);
  fill_kernel<Unit><<<blocks_for ((int64_t) n), THREADS_PER_BLOCK, 0, stream>>> ((Unit *) dst, n, value);
  return cudaGetLastError ();
}

extern "C" cudaError_t
_cp_cuda_fill (void         *dst,
               size_t        n,
               const void   *pattern,
               size_t        pattern_size,
               cudaStream_t  stream)
{
  if (pattern_size != 1 && pattern_size != 2 && pattern_size != 4 && pattern_size != 8 &&
      pattern_size != 16)
    return cudaErrorInvalidValue;
  if (n == 0)
    return cudaSuccess;
  if (cp_fill_unit (dst, pattern_size) != pattern_size)
    {
      uint4 bytes;

      memcpy (&bytes, pattern, pattern_size);
      fill_bytes_kernel<<<blocks_for ((int64_t) (n * pattern_size)), THREADS_PER_BLOCK, 0, stream>>> (
        (uint8_t *) dst, n * pattern_size, bytes, (unsigned) pattern_size);
      return cudaGetLastError ();
    }
  switch (pattern_size)
    {
    case 16: return launch_fill<uint4> (dst, n, pattern, stream);
    case 8: return launch_fill<uint64_t> (dst, n, pattern, stream);
    case 4: return launch_fill<uint32_t> (dst, n, pattern, stream);
    case 2: return launch_fill<uint16_t> (dst, n, pattern, stream);
    default: return launch_fill<uint8_t> (dst, n, pattern, stream);
    }
}

extern "C" cudaError_t
_cp_cuda_position_ids (int64_t            *out,
                       int64_t             rows,
                       const cp_index_run *runs,
                       size_t              n_runs,
                       const int64_t      *bounds,
                       size_t              n_documents,
                       bool                per_document,
                       cudaStream_t        stream)
{
  size_t room = n_runs + n_documents + 1;
  cp_index_run *pieces = (cp_index_run *) malloc (room * sizeof *pieces);
  int64_t *bases = (int64_t *) malloc (room * sizeof *bases);
  int64_t local_length = cp_index_runs_length (runs, n_runs);
  size_t n_pieces;
  cudaError_t status = cudaSuccess;
  CpRunBatch batch;
  int64_t first = 0;

  if (pieces == NULL || bases == NULL)
    {
      free (pieces);
      free (bases);
      return cudaErrorMemoryAllocation;
    }
  if (per_document)
    {
      n_pieces = cp_run_batch_split_at_documents (runs, n_runs, bounds, n_documents, pieces, bases);
      if (n_pieces == SIZE_MAX)
        status = cudaErrorInvalidValue;
    }
  else
    {
      memcpy (pieces, runs, n_runs * sizeof *runs);
      memset (bases, 0, n_runs * sizeof *bases);
      n_pieces = n_runs;
    }
  for (size_t next = 0; status == cudaSuccess && next < n_pieces;)
    {
      next = cp_run_batch_take (&batch, pieces, bases, n_pieces, next, first);
      if (batch.total == 0 || rows == 0)
        continue;
      position_ids_kernel<<<blocks_for (rows * batch.total), THREADS_PER_BLOCK, 0, stream>>> (
        out, rows, local_length, batch);
      status = cudaGetLastError ();
      first += batch.total;
    }
  free (pieces);
  free (bases);
  return status;
}
