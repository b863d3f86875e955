/* test-index-math.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * kernels/cp-index-math.h with nothing but the C standard library: the
 * header must compile without GLib (a CUDA kernel includes it), so this
 * test includes it alone and checks it with assert().  The runs and costs
 * are compared with a computation that shares no code with the header:
 * the owner of every single position, worked out from its chunk index.
 */

#undef NDEBUG
#include <assert.h>
#include <stdint.h>

#include "kernels/cp-index-math.h"

#define MAX_DOCS 8
#define MAX_RUNS 64

/* The rank that holds position @p of document [@lo, @hi). */
static int64_t
owner_of (bool    head_tail,
          int64_t cp_size,
          int64_t lo,
          int64_t hi,
          int64_t p)
{
  int64_t n_chunks = (head_tail ? 2 : 1) * cp_size;
  int64_t chunk = (p - lo) / ((hi - lo) / n_chunks);

  return chunk < cp_size ? chunk : n_chunks - 1 - chunk;
}

/* A rank's head chunk comes before its tail chunk in the sequence, so its
 * local order is ascending global order: its runs are the maximal stretches
 * of consecutive positions it owns. */
static size_t
expected_runs (bool           head_tail,
               int64_t        cp_size,
               int64_t        rank,
               const int64_t *bounds,
               size_t         n_docs,
               cp_index_run  *out,
               double        *cost)
{
  size_t n = 0;

  *cost = 0.0;
  for (size_t d = 0; d < n_docs; d++)
    for (int64_t p = bounds[d]; p < bounds[d + 1]; p++)
      {
        if (owner_of (head_tail, cp_size, bounds[d], bounds[d + 1], p) != rank)
          continue;
        *cost += (double) (p - bounds[d] + 1);
        if (n > 0 && out[n - 1].start + out[n - 1].length == p)
          out[n - 1].length++;
        else
          out[n++] = (cp_index_run) { p, 1 };
      }
  return n;
}

static void
check_partition (bool           head_tail,
                 int64_t        cp_size,
                 const int64_t *bounds,
                 size_t         n_docs)
{
  int64_t total = 0;

  assert (cp_index_max_runs (head_tail, n_docs) <= MAX_RUNS);
  for (int64_t r = 0; r < cp_size; r++)
    {
      cp_index_run got[MAX_RUNS];
      cp_index_run want[MAX_RUNS];
      double want_cost;
      size_t n_got = cp_index_rank_runs (head_tail, cp_size, r, bounds, n_docs, got);
      size_t n_want = expected_runs (head_tail, cp_size, r, bounds, n_docs, want, &want_cost);

      assert (n_got == n_want);
      for (size_t i = 0; i < n_got; i++)
        {
          assert (got[i].start == want[i].start);
          assert (got[i].length == want[i].length);
        }
      assert (cp_index_rank_cost (bounds, n_docs, got, n_got) == want_cost);
      total += cp_index_runs_length (got, n_got);
    }
  assert (total == bounds[n_docs] - bounds[0]);
}

/* Documents given as lengths in units of 2·C, so that both partitions
 * divide them; a 0 is an empty document. */
static void
check_documents (int64_t        cp_size,
                 const int64_t *units,
                 size_t         n_docs)
{
  int64_t bounds[MAX_DOCS + 1] = { 0 };

  for (size_t d = 0; d < n_docs; d++)
    bounds[d + 1] = bounds[d] + units[d] * 2 * cp_size;
  check_partition (true, cp_size, bounds, n_docs);
  check_partition (false, cp_size, bounds, n_docs);
}

/* C = 2, S = 8: rank 0 holds [0, 1, 6, 7], rank 1 holds [2, 3, 4, 5]. */
static void
check_documented_example (void)
{
  const int64_t bounds[] = { 0, 8 };
  cp_index_run runs[2];
  int64_t positions[4];

  assert (cp_index_rank_runs (true, 2, 0, bounds, 1, runs) == 2);
  cp_index_runs_positions (runs, 2, positions);
  assert (positions[0] == 0 && positions[1] == 1 && positions[2] == 6 && positions[3] == 7);
  assert (cp_index_rank_runs (true, 2, 1, bounds, 1, runs) == 1);
  assert (runs[0].start == 2 && runs[0].length == 4);
}

/* C = 4, S = 16: rank 3's chunks stay apart even though they touch. */
static void
check_chunks_stay_apart (void)
{
  cp_index_run chunks[2];

  assert (cp_index_document_chunks (true, 4, 3, 0, 16, chunks) == 2);
  assert (chunks[0].start == 6 && chunks[0].length == 2);
  assert (chunks[1].start == 8 && chunks[1].length == 2);
  assert (cp_index_document_chunks (false, 4, 3, 0, 16, chunks) == 1);
  assert (chunks[0].start == 12 && chunks[0].length == 4);
}

static void
check_first_document_after (void)
{
  const int64_t bounds[] = { 0, 4, 4, 10 };

  assert (cp_index_first_document_after (bounds, 3, 0) == 0);
  assert (cp_index_first_document_after (bounds, 3, 3) == 0);
  assert (cp_index_first_document_after (bounds, 3, 4) == 2);
  assert (cp_index_first_document_after (bounds, 3, 9) == 2);
  assert (cp_index_first_document_after (bounds, 3, 10) == 3);
}

int
main (void)
{
  static const int64_t one[] = { 1 };
  static const int64_t three[] = { 3 };
  static const int64_t mixed[] = { 2, 0, 1, 3 };
  static const int64_t empties[] = { 0, 0, 2, 0, 1, 0 };

  check_documented_example ();
  check_chunks_stay_apart ();
  check_first_document_after ();
  for (int64_t cp_size = 1; cp_size <= 6; cp_size++)
    {
      check_documents (cp_size, one, 1);
      check_documents (cp_size, three, 1);
      check_documents (cp_size, mixed, 4);
      check_documents (cp_size, empties, 6);
    }
  return 0;
}
