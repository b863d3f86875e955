/* cp-run-batch-private.h: what one layout-kernel thread does
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * A rank's runs travel to the device in batches inside the launch
 * parameters; each thread of a layout kernel maps its element index to a
 * source and a destination through the functions below.  They are
 * __host__ __device__ so that a CPU test (tests/gpu/test-run-batch.cu)
 * runs the very mapping the kernels run, element by element, on machines
 * without a GPU.  CUDA C++ only.
 */

#pragma once

#ifndef __CUDACC__
#error "cp-run-batch-private.h is CUDA C++"
#endif

#include <stdint.h>
#include <string.h>

#include "kernels/cp-index-math.h"

#define CP_RUNS_PER_LAUNCH 64

/* Consecutive runs of the local sequence: run r covers local positions
 * [first + end[r − 1], first + end[r]) and starts at global position
 * start[r]; base[r] is subtracted for position ids. */
struct CpRunBatch
{
  int n;
  int64_t first;
  int64_t total;
  int64_t end[CP_RUNS_PER_LAUNCH];
  int64_t start[CP_RUNS_PER_LAUNCH];
  int64_t base[CP_RUNS_PER_LAUNCH];
};

/* Where one element goes: index into the full tensor and into the shard,
 * in units of the access width. */
struct CpGatherIndex
{
  int64_t full;
  int64_t local;
};

/* Fills @batch with up to CP_RUNS_PER_LAUNCH runs from @runs[@next] on,
 * the first at local position @first; returns the index of the first run
 * left over. */
static inline size_t
cp_run_batch_take (CpRunBatch         *batch,
                   const cp_index_run *runs,
                   const int64_t      *bases,
                   size_t              n_runs,
                   size_t              next,
                   int64_t             first)
{
  memset (batch, 0, sizeof *batch);
  batch->first = first;
  while (next < n_runs && batch->n < CP_RUNS_PER_LAUNCH)
    {
      batch->total += runs[next].length;
      batch->end[batch->n] = batch->total;
      batch->start[batch->n] = runs[next].start;
      batch->base[batch->n] = bases != NULL ? bases[next] : 0;
      batch->n++;
      next++;
    }
  return next;
}

/* The widest access (16, 8, 4, 2 or 1 bytes) that divides the bytes of a
 * position, both pitches and both base addresses, so every access is
 * aligned. */
static inline size_t
cp_run_batch_unit (const void *full,
                   const void *local,
                   int64_t     inner,
                   int64_t     full_pitch,
                   int64_t     local_pitch)
{
  uintptr_t bits = (uintptr_t) full | (uintptr_t) local | (uintptr_t) inner |
                   (uintptr_t) full_pitch | (uintptr_t) local_pitch;
  size_t unit = 16;

  while (unit > 1 && (bits & (unit - 1)) != 0)
    unit /= 2;
  return unit;
}

/* The widest store a fill of @pattern_size-byte elements from @dst can
 * make: the pattern's own width when @dst is aligned to it, else single
 * bytes (a view may start anywhere its element type allows, and a
 * foreign address anywhere at all). */
static inline size_t
cp_fill_unit (const void *dst,
              size_t      pattern_size)
{
  return ((uintptr_t) dst % pattern_size) == 0 ? pattern_size : 1;
}

/* Splits @runs where documents end, so that each piece has one document
 * start to subtract; returns the number of pieces written to @pieces and
 * their document starts to @bases (room for @n_runs + @n_documents), or
 * SIZE_MAX when a run reaches outside [@bounds[0], @bounds[@n_documents]):
 * such positions belong to no document, and leaving them out would leave
 * their ids unwritten. */
static inline size_t
cp_run_batch_split_at_documents (const cp_index_run *runs,
                                 size_t              n_runs,
                                 const int64_t      *bounds,
                                 size_t              n_documents,
                                 cp_index_run       *pieces,
                                 int64_t            *bases)
{
  size_t n = 0;

  for (size_t i = 0; i < n_runs; i++)
    {
      int64_t end = runs[i].start + runs[i].length;

      if (runs[i].length == 0)
        continue;
      if (n_documents == 0 || runs[i].start < bounds[0] || end > bounds[n_documents])
        return SIZE_MAX;
      for (size_t d = cp_index_first_document_after (bounds, n_documents, runs[i].start);
           d < n_documents && bounds[d] < end; d++)
        {
          int64_t lo = runs[i].start > bounds[d] ? runs[i].start : bounds[d];
          int64_t hi = end < bounds[d + 1] ? end : bounds[d + 1];

          if (hi <= lo)
            continue;
          pieces[n] = (cp_index_run) { lo, hi - lo };
          bases[n++] = bounds[d];
        }
    }
  return n;
}

/* The run holding batch-local position @l: bisection over the ends. */
__host__ __device__ static inline int
cp_run_batch_run_of (const CpRunBatch &batch,
                     int64_t           l)
{
  int lo = 0;
  int hi = batch.n - 1;

  while (lo < hi)
    {
      int mid = (lo + hi) / 2;

      if (batch.end[mid] > l)
        hi = mid;
      else
        lo = mid + 1;
    }
  return lo;
}

__host__ __device__ static inline int64_t
cp_run_batch_global_of (const CpRunBatch &batch,
                        int               r,
                        int64_t           l)
{
  return batch.start[r] + l - (r == 0 ? 0 : batch.end[r - 1]);
}

/* Element @i of a gather over [@outer][batch positions][@inner units],
 * between a full tensor whose outer rows are @full_pitch units apart and
 * whose first position is global position @full_first, and a shard
 * whose rows are @local_pitch units apart. */
__host__ __device__ static inline CpGatherIndex
cp_run_batch_gather_index (const CpRunBatch &batch,
                           int64_t           i,
                           int64_t           full_pitch,
                           int64_t           full_first,
                           int64_t           local_pitch,
                           int64_t           inner)
{
  int64_t per_outer = batch.total * inner;
  int64_t o = i / per_outer;
  int64_t rest = i - o * per_outer;
  int64_t l = rest / inner;
  int64_t k = rest - l * inner;
  int64_t g = cp_run_batch_global_of (batch, cp_run_batch_run_of (batch, l), l);
  CpGatherIndex index;

  index.local = o * local_pitch + (batch.first + l) * inner + k;
  index.full = o * full_pitch + (g - full_first) * inner + k;
  return index;
}

/* Element @i of the position ids of [rows][batch positions]: writes the
 * index into the [rows][@local_length] output to @at and returns the
 * position. */
__host__ __device__ static inline int64_t
cp_run_batch_position (const CpRunBatch &batch,
                       int64_t           i,
                       int64_t           local_length,
                       int64_t          *at)
{
  int64_t row = i / batch.total;
  int64_t l = i - row * batch.total;
  int r = cp_run_batch_run_of (batch, l);

  *at = row * local_length + batch.first + l;
  return cp_run_batch_global_of (batch, r, l) - batch.base[r];
}
