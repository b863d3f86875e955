/* cp-cuda-kernels-private.h: the CUDA kernels' launchers
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * Plain C entry points (extern "C" on the nvcc side) to the kernels of
 * cp-index-kernels.cu, for the library's C code.  No GLib here: the
 * header is compiled by nvcc as well.  Every launcher only enqueues work
 * on @stream and returns the launch's status; the caller synchronises at
 * the API boundary and turns a failure into a GError
 * (cp-cuda-private.h).  Every pointer is a device address.
 */

#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/cp-index-math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor seen as [outer][sequence][inner] along its sequence
 * dimension: @outer is the product of the dimensions before it, @inner
 * the bytes of one position (the dimensions after it times the element
 * size).  The full tensor has @full_length positions, a rank's shard
 * @local_length. */
typedef struct
{
  void    *full;
  void    *local;
  int64_t  outer;
  int64_t  full_length;
  int64_t  local_length;
  int64_t  inner;
} CpCudaShardView;

/* The same two tensors by their pitches, for a memory-interface
 * copy_runs: position p of outer row o of the full tensor starts at byte
 * o·@full_pitch + (p − @first)·@inner of @full, and the shard's rows at
 * o·@local_pitch of @local; @inner bytes a position. */
typedef struct
{
  void    *full;
  int64_t  full_pitch;
  int64_t  first;
  void    *local;
  int64_t  local_pitch;
  int64_t  outer;
  int64_t  inner;
} CpCudaRunsCopy;

/* Copies the positions of @runs (in local order: the shard is their
 * concatenation) from the full tensor into the shard, or back when
 * @unshard, in one launch per CP_RUNS_PER_LAUNCH runs. */
cudaError_t _cp_cuda_copy_runs (const CpCudaRunsCopy  *copy,
                                const cp_index_run    *runs,
                                size_t                 n_runs,
                                bool                   unshard,
                                cudaStream_t           stream);

/* _cp_cuda_copy_runs for a whole tensor and its shard. */
cudaError_t _cp_cuda_gather_runs (const CpCudaShardView *view,
                                  const cp_index_run    *runs,
                                  size_t                 n_runs,
                                  bool                   unshard,
                                  cudaStream_t           stream);

/* Shard (or unshard) rank @rank's part of a sequence of documents with
 * boundaries @bounds[0..@n_documents] (host memory), split head-tail or
 * contiguously as cp-index-math.h says. */
cudaError_t _cp_cuda_shard (const CpCudaShardView *view,
                            bool                   head_tail,
                            int64_t                cp_size,
                            int64_t                rank,
                            const int64_t         *bounds,
                            size_t                 n_documents,
                            bool                   unshard,
                            cudaStream_t           stream);

/* Writes @pattern (@pattern_size bytes: 1, 2, 4, 8 or 16) @n times from
 * @dst on; @dst need not be aligned to @pattern_size. */
cudaError_t _cp_cuda_fill (void         *dst,
                           size_t        n,
                           const void   *pattern,
                           size_t        pattern_size,
                           cudaStream_t  stream);

/* Position ids of a rank's shard, [@rows][local length] int64: the
 * global position of every local position of @runs, or its position in
 * its document (documents @bounds[0..@n_documents], host memory) when
 * @per_document; cudaErrorInvalidValue, before any launch, when a run
 * reaches outside the documents. */
cudaError_t _cp_cuda_position_ids (int64_t            *out,
                                   int64_t             rows,
                                   const cp_index_run *runs,
                                   size_t              n_runs,
                                   const int64_t      *bounds,
                                   size_t              n_documents,
                                   bool                per_document,
                                   cudaStream_t        stream);

#ifdef __cplusplus
}
#endif
