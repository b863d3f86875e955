/* test-run-batch.cu
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * The layout kernels' per-thread mapping (kernels/cuda/cp-run-batch-private.h)
 * run on the CPU: every launch the kernels make is replayed as a loop
 * over its element indices, with the same batching of runs and the same
 * access width, and the result is compared with shards cut directly from
 * the positions kernels/cp-index-math.h gives.  This checks the kernels'
 * index arithmetic on machines without a GPU; tests/gpu/test-cuda-kernels.c
 * checks the kernels themselves where there is one.
 */

#undef NDEBUG
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cp-run-batch-private.h"

#define MAX_DOCS 80

/* What _cp_cuda_copy_runs (the CUDA memory's copy_runs) launches, one
 * launch per batch of runs, thread after thread: position p of row o of
 * the full tensor at byte o·@full_pitch + (p − @full_first)·@inner of
 * @full, the shard's rows @local_pitch bytes apart. */
static void
replay_copy_runs (unsigned char      *full,
                  int64_t             full_pitch,
                  int64_t             full_first,
                  unsigned char      *local,
                  int64_t             local_pitch,
                  int64_t             outer,
                  int64_t             inner,
                  const cp_index_run *runs,
                  size_t              n_runs,
                  bool                unshard)
{
  size_t unit = cp_run_batch_unit (full, local, inner, full_pitch, local_pitch);
  int64_t units = inner / (int64_t) unit;
  CpRunBatch batch;
  int64_t first = 0;

  for (size_t next = 0; next < n_runs;)
    {
      next = cp_run_batch_take (&batch, runs, NULL, n_runs, next, first);
      for (int64_t i = 0; i < outer * batch.total * units; i++)
        {
          CpGatherIndex at = cp_run_batch_gather_index (batch, i, full_pitch / (int64_t) unit,
                                                        full_first, local_pitch / (int64_t) unit,
                                                        units);

          if (unshard)
            memcpy (full + at.full * unit, local + at.local * unit, unit);
          else
            memcpy (local + at.local * unit, full + at.full * unit, unit);
        }
      first += batch.total;
    }
}

/* _cp_cuda_gather_runs: a whole tensor and its shard. */
static void
replay_gather (unsigned char      *full,
               unsigned char      *local,
               int64_t             outer,
               int64_t             full_length,
               int64_t             local_length,
               int64_t             inner,
               const cp_index_run *runs,
               size_t              n_runs,
               bool                unshard)
{
  replay_copy_runs (full, full_length * inner, 0, local, local_length * inner, outer, inner, runs,
                    n_runs, unshard);
}

/* Shards every rank by replay and by direct copies of its positions, then
 * unshards every shard into a zeroed tensor, which must give the original
 * back.  @shift offsets both buffers to exercise narrower accesses. */
static void
check_layout (bool           head_tail,
              int64_t        cp_size,
              const int64_t *bounds,
              size_t         n_docs,
              int64_t        outer,
              int64_t        inner,
              size_t         shift)
{
  int64_t length = bounds[n_docs];
  size_t full_size = (size_t) (outer * length * inner);
  unsigned char *full_buffer = (unsigned char *) malloc (full_size + 16);
  unsigned char *rebuilt_buffer = (unsigned char *) calloc (full_size + 16, 1);
  unsigned char *full = full_buffer + shift;
  unsigned char *rebuilt = rebuilt_buffer + shift;

  for (size_t i = 0; i < full_size; i++)
    full[i] = (unsigned char) (i * 7 + i / 251);
  for (int64_t rank = 0; rank < cp_size; rank++)
    {
      cp_index_run *runs = (cp_index_run *) malloc ((cp_index_max_runs (head_tail, n_docs) + 1) * sizeof *runs);
      size_t n_runs = cp_index_rank_runs (head_tail, cp_size, rank, bounds, n_docs, runs);
      int64_t local_length = cp_index_runs_length (runs, n_runs);
      int64_t *positions = (int64_t *) malloc ((local_length + 1) * sizeof *positions);
      size_t local_size = (size_t) (outer * local_length * inner);
      unsigned char *local_buffer = (unsigned char *) malloc (local_size + 16);
      unsigned char *want = (unsigned char *) malloc (local_size + 1);
      unsigned char *local = local_buffer + shift;

      cp_index_runs_positions (runs, n_runs, positions);
      for (int64_t o = 0; o < outer; o++)
        for (int64_t l = 0; l < local_length; l++)
          memcpy (want + (o * local_length + l) * inner, full + (o * length + positions[l]) * inner, inner);
      replay_gather (full, local, outer, length, local_length, inner, runs, n_runs, false);
      assert (memcmp (local, want, local_size) == 0);
      replay_gather (rebuilt, local, outer, length, local_length, inner, runs, n_runs, true);
      free (runs);
      free (positions);
      free (local_buffer);
      free (want);
    }
  assert (memcmp (rebuilt, full, full_size) == 0);
  free (full_buffer);
  free (rebuilt_buffer);
}

/* One document split along the first, a middle and the last dimension,
 * with every access width. */
static void
check_any_dimension (void)
{
  const int64_t bounds[] = { 0, 48 };
  const int64_t sizes[] = { 1, 2, 4, 8, 16 };

  for (size_t e = 0; e < sizeof sizes / sizeof sizes[0]; e++)
    for (int64_t cp_size = 1; cp_size <= 4; cp_size++)
      for (int head_tail = 0; head_tail <= 1; head_tail++)
        for (size_t shift = 0; shift <= 2; shift += 2)
          {
            check_layout (head_tail, cp_size, bounds, 1, 1, 4 * 6 * sizes[e], shift);
            check_layout (head_tail, cp_size, bounds, 1, 4, 6 * sizes[e], shift);
            check_layout (head_tail, cp_size, bounds, 1, 4 * 6, sizes[e], shift);
          }
}

/* Packed documents, empty ones included, and more runs than one launch
 * carries (80 documents, 160 runs a rank). */
static void
check_documents (void)
{
  const int64_t units[] = { 2, 0, 1, 3 };
  int64_t bounds[MAX_DOCS + 1] = { 0 };

  for (int64_t cp_size = 1; cp_size <= 4; cp_size++)
    {
      for (size_t d = 0; d < 4; d++)
        bounds[d + 1] = bounds[d] + units[d] * 2 * cp_size;
      check_layout (true, cp_size, bounds, 4, 2, 24, 0);
      check_layout (false, cp_size, bounds, 4, 2, 24, 0);
    }
  for (size_t d = 0; d < MAX_DOCS; d++)
    bounds[d + 1] = bounds[d] + 2 * 3 * (1 + d % 3);
  check_layout (true, 3, bounds, MAX_DOCS, 3, 16, 0);
}

/* A chunk of a longer sequence (THD): the full tensor's rows are wider
 * than the chunk, its first position is global position @first, and the
 * shard is written at an offset into rows wider than it, as the memory
 * interface's copy_runs is called for each chunk. */
static void
check_copy_runs_offsets (int64_t inner,
                         int64_t outer)
{
  const int64_t first = 1000, length = 48, full_row = length + 7, cp_size = 3;
  const int64_t bounds[] = { first, first + 12, first + length };
  const int64_t local_offset = 2;
  size_t full_size = (size_t) (outer * full_row * inner);
  unsigned char *full = (unsigned char *) malloc (full_size);
  unsigned char *rebuilt = (unsigned char *) calloc (full_size, 1);

  for (size_t i = 0; i < full_size; i++)
    full[i] = (unsigned char) (i * 13 + 1);
  for (int64_t rank = 0; rank < cp_size; rank++)
    {
      cp_index_run runs[8];
      size_t n_runs = cp_index_rank_runs (true, cp_size, rank, bounds, 2, runs);
      int64_t local_length = cp_index_runs_length (runs, n_runs);
      int64_t local_row = local_length + 5;
      size_t local_size = (size_t) (outer * local_row * inner);
      unsigned char *local = (unsigned char *) calloc (local_size, 1);
      unsigned char *want = (unsigned char *) calloc (local_size, 1);
      int64_t positions[64];

      assert (local_length <= 64);
      cp_index_runs_positions (runs, n_runs, positions);
      for (int64_t o = 0; o < outer; o++)
        for (int64_t l = 0; l < local_length; l++)
          memcpy (want + (o * local_row + local_offset + l) * inner,
                  full + (o * full_row + positions[l] - first) * inner, (size_t) inner);
      replay_copy_runs (full, full_row * inner, first, local + local_offset * inner,
                        local_row * inner, outer, inner, runs, n_runs, false);
      assert (memcmp (local, want, local_size) == 0);
      replay_copy_runs (rebuilt, full_row * inner, first, local + local_offset * inner,
                        local_row * inner, outer, inner, runs, n_runs, true);
      free (local);
      free (want);
    }
  for (int64_t o = 0; o < outer; o++)
    assert (memcmp (rebuilt + o * full_row * inner, full + o * full_row * inner,
                    (size_t) (length * inner)) == 0);
  free (full);
  free (rebuilt);
}

static void
check_unit (void)
{
  alignas (16) static unsigned char buffer[64];

  assert (cp_run_batch_unit (buffer, buffer + 32, 4096, 0, 0) == 16);
  assert (cp_run_batch_unit (buffer, buffer + 8, 4096, 0, 0) == 8);
  assert (cp_run_batch_unit (buffer, buffer + 32, 6, 0, 0) == 2);
  assert (cp_run_batch_unit (buffer + 1, buffer, 16, 0, 0) == 1);
  /* The pitches count: rows 4 bytes apart take 4-byte accesses. */
  assert (cp_run_batch_unit (buffer, buffer + 32, 16, 4100, 4096) == 4);
  assert (cp_run_batch_unit (buffer, buffer + 32, 16, 4096, 4098) == 2);
}

/* A fill stores whole elements only where the destination is aligned to
 * them, single bytes elsewhere. */
static void
check_fill_unit (void)
{
  alignas (16) static unsigned char buffer[64];

  assert (cp_fill_unit (buffer, 8) == 8);
  assert (cp_fill_unit (buffer + 8, 8) == 8);
  assert (cp_fill_unit (buffer + 4, 8) == 1);
  assert (cp_fill_unit (buffer + 2, 4) == 1);
  assert (cp_fill_unit (buffer + 2, 2) == 2);
  assert (cp_fill_unit (buffer + 8, 16) == 1);
  assert (cp_fill_unit (buffer + 3, 1) == 1);
}

/* Runs that reach outside the documents cannot be split into pieces
 * with a document each: refused, never dropped. */
static void
check_split_outside (void)
{
  const int64_t bounds[] = { 4, 10, 20 };
  cp_index_run pieces[8];
  int64_t bases[8];
  const cp_index_run inside[] = { { 4, 8 }, { 18, 2 } };
  const cp_index_run before[] = { { 2, 4 } };
  const cp_index_run after[] = { { 16, 6 } };

  assert (cp_run_batch_split_at_documents (inside, 2, bounds, 2, pieces, bases) == 3);
  assert (pieces[0].start == 4 && pieces[0].length == 6 && bases[0] == 4);
  assert (pieces[1].start == 10 && pieces[1].length == 2 && bases[1] == 10);
  assert (pieces[2].start == 18 && pieces[2].length == 2 && bases[2] == 10);
  assert (cp_run_batch_split_at_documents (before, 1, bounds, 2, pieces, bases) == SIZE_MAX);
  assert (cp_run_batch_split_at_documents (after, 1, bounds, 2, pieces, bases) == SIZE_MAX);
  assert (cp_run_batch_split_at_documents (inside, 2, bounds, 0, pieces, bases) == SIZE_MAX);
}

/* The position ids launches, replayed: global, and within documents (at
 * C = 1 consecutive documents merge into one run, which is split again). */
static void
check_position_ids (void)
{
  const int64_t bounds[] = { 0, 8, 8, 20, 24 };
  const size_t n_docs = 4;
  const int64_t rows = 3;

  for (int64_t cp_size = 1; cp_size <= 2; cp_size++)
    for (int64_t rank = 0; rank < cp_size; rank++)
      for (int per_document = 0; per_document <= 1; per_document++)
        {
          cp_index_run runs[8], pieces[16];
          int64_t bases[16], positions[24], got[3 * 24];
          size_t n_runs = cp_index_rank_runs (true, cp_size, rank, bounds, n_docs, runs);
          int64_t local_length = cp_index_runs_length (runs, n_runs);
          size_t n_pieces = n_runs;
          CpRunBatch batch;
          int64_t first = 0;

          if (per_document)
            {
              n_pieces = cp_run_batch_split_at_documents (runs, n_runs, bounds, n_docs, pieces,
                                                          bases);
              assert (n_pieces != SIZE_MAX);
            }
          else
            memcpy (pieces, runs, n_runs * sizeof *runs);
          for (size_t next = 0; next < n_pieces;)
            {
              next = cp_run_batch_take (&batch, pieces, per_document ? bases : NULL, n_pieces, next, first);
              for (int64_t i = 0; i < rows * batch.total; i++)
                {
                  int64_t at;
                  int64_t position = cp_run_batch_position (batch, i, local_length, &at);

                  got[at] = position;
                }
              first += batch.total;
            }
          cp_index_runs_positions (runs, n_runs, positions);
          for (int64_t row = 0; row < rows; row++)
            for (int64_t l = 0; l < local_length; l++)
              {
                int64_t want = positions[l];

                for (size_t d = 0; per_document && d < n_docs; d++)
                  if (bounds[d] <= positions[l] && positions[l] < bounds[d + 1])
                    want = positions[l] - bounds[d];
                assert (got[row * local_length + l] == want);
              }
        }
}

int
main (void)
{
  check_unit ();
  check_fill_unit ();
  check_split_outside ();
  for (int64_t inner = 1; inner <= 16; inner *= 2)
    {
      check_copy_runs_offsets (inner, 1);
      check_copy_runs_offsets (inner, 3);
    }
  check_copy_runs_offsets (6, 2);
  check_any_dimension ();
  check_documents ();
  check_position_ids ();
  return 0;
}
