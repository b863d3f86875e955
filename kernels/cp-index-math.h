/* cp-index-math.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * Which sequence positions each rank of a context-parallel group holds, as
 * plain arithmetic on int64 positions: the head-tail and contiguous
 * partitions of one or more documents, the runs they give, and the causal
 * attention work of those runs.
 *
 * Nothing here uses GLib or allocates: the header needs only the C
 * standard headers below, so the library's layout code, its tests and a
 * CUDA kernel (where each function is also a device function) all share
 * one definition of the partition.
 */

#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define CP_INDEX_FN static inline __host__ __device__
#else
#define CP_INDEX_FN static inline
#endif

/* A run of consecutive global positions a rank holds. */
typedef struct
{
  int64_t start;
  int64_t length;
} cp_index_run;

/* How many chunks a rank takes from every document: chunk r of C
 * (contiguous), or chunks r and 2·C−1−r of 2·C (head-tail). */
CP_INDEX_FN int
cp_index_chunks_per_document (bool head_tail)
{
  return head_tail ? 2 : 1;
}

/* The most runs a rank can hold over @n_documents documents: what a
 * buffer for cp_index_rank_runs() must have room for. */
CP_INDEX_FN size_t
cp_index_max_runs (bool   head_tail,
                   size_t n_documents)
{
  return (size_t) cp_index_chunks_per_document (head_tail) * n_documents;
}

/* The chunks rank @rank takes from document [@lo, @hi), in local order;
 * returns how many were written.  The document length must be a multiple
 * of the number of chunks.  This is the partition; everything else is
 * derived from it. */
CP_INDEX_FN int
cp_index_document_chunks (bool          head_tail,
                          int64_t       cp_size,
                          int64_t       rank,
                          int64_t       lo,
                          int64_t       hi,
                          cp_index_run  chunks[2])
{
  int n = cp_index_chunks_per_document (head_tail);
  int64_t n_chunks = n * cp_size;
  int64_t length = (hi - lo) / n_chunks;

  chunks[0].start = lo + rank * length;
  chunks[0].length = length;
  if (head_tail)
    {
      chunks[1].start = lo + (n_chunks - 1 - rank) * length;
      chunks[1].length = length;
    }
  return n;
}

/* Appends @run to the @n_runs runs of @runs, merging it with the last one
 * when they touch (C = 1: head and tail chunks are adjacent, and so are
 * consecutive documents); returns the new count.  Empty runs are
 * dropped. */
CP_INDEX_FN size_t
cp_index_append_run (cp_index_run *runs,
                     size_t        n_runs,
                     cp_index_run  run)
{
  if (run.length == 0)
    return n_runs;
  if (n_runs > 0 && runs[n_runs - 1].start + runs[n_runs - 1].length == run.start)
    {
      runs[n_runs - 1].length += run.length;
      return n_runs;
    }
  runs[n_runs] = run;
  return n_runs + 1;
}

/* Writes the runs of rank @rank over the documents whose boundaries are
 * @bounds[0..@n_documents] into @out, in local order (its local sequence
 * is their concatenation); @out has room for cp_index_max_runs().
 * Returns how many runs were written. */
CP_INDEX_FN size_t
cp_index_rank_runs (bool           head_tail,
                    int64_t        cp_size,
                    int64_t        rank,
                    const int64_t *bounds,
                    size_t         n_documents,
                    cp_index_run  *out)
{
  size_t n_runs = 0;

  for (size_t d = 0; d < n_documents; d++)
    {
      cp_index_run chunks[2];
      int n = cp_index_document_chunks (head_tail, cp_size, rank, bounds[d], bounds[d + 1], chunks);

      for (int i = 0; i < n; i++)
        n_runs = cp_index_append_run (out, n_runs, chunks[i]);
    }
  return n_runs;
}

/* The number of positions in @runs. */
CP_INDEX_FN int64_t
cp_index_runs_length (const cp_index_run *runs,
                      size_t              n_runs)
{
  int64_t total = 0;

  for (size_t i = 0; i < n_runs; i++)
    total += runs[i].length;
  return total;
}

/* Writes the global positions of @runs, in order, into @out. */
CP_INDEX_FN void
cp_index_runs_positions (const cp_index_run *runs,
                         size_t              n_runs,
                         int64_t            *out)
{
  for (size_t i = 0; i < n_runs; i++)
    for (int64_t p = 0; p < runs[i].length; p++)
      *out++ = runs[i].start + p;
}

/* Causal attention work of positions [@start, @start + @length) of a
 * document starting at @doc_start: position p attends to p − doc_start + 1
 * keys. */
CP_INDEX_FN double
cp_index_causal_cost (int64_t doc_start,
                      int64_t start,
                      int64_t length)
{
  double first = (double) (start - doc_start + 1);

  return (double) length * first + (double) length * (double) (length - 1) / 2.0;
}

/* The first document that ends after @position: bounds are sorted, so a
 * run's documents are found by bisection, not by a scan of them all. */
CP_INDEX_FN size_t
cp_index_first_document_after (const int64_t *bounds,
                               size_t         n_documents,
                               int64_t        position)
{
  size_t lo = 0;
  size_t hi = n_documents;

  while (lo < hi)
    {
      size_t mid = lo + (hi - lo) / 2;

      if (bounds[mid + 1] > position)
        hi = mid;
      else
        lo = mid + 1;
    }
  return lo;
}

/* The causal work of @run.  A run can be merged across a document
 * boundary (C = 1, consecutive documents), so it walks the documents the
 * run overlaps. */
CP_INDEX_FN double
cp_index_run_cost (const int64_t *bounds,
                   size_t         n_documents,
                   cp_index_run   run)
{
  double total = 0.0;
  int64_t end = run.start + run.length;

  for (size_t d = cp_index_first_document_after (bounds, n_documents, run.start);
       d < n_documents && bounds[d] < end; d++)
    {
      int64_t lo = run.start > bounds[d] ? run.start : bounds[d];
      int64_t hi = end < bounds[d + 1] ? end : bounds[d + 1];

      if (hi > lo)
        total += cp_index_causal_cost (bounds[d], lo, hi - lo);
    }
  return total;
}

/* The causal work of a rank holding @runs: the number of (query, key)
 * pairs its positions attend to. */
CP_INDEX_FN double
cp_index_rank_cost (const int64_t      *bounds,
                    size_t              n_documents,
                    const cp_index_run *runs,
                    size_t              n_runs)
{
  double total = 0.0;

  for (size_t i = 0; i < n_runs; i++)
    total += cp_index_run_cost (bounds, n_documents, runs[i]);
  return total;
}
