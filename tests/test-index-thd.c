/* test-index-thd.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * kernels/cp-index-thd.h with nothing but the C standard library, as
 * test-index-math.c does for cp-index-math.h: the header must compile
 * without GLib.  The THD arithmetic is compared with a position-by-position
 * computation that shares no code with it: which rank owns each token of a
 * document, and whether that token is real.
 */

#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cp-index-thd.h"

#define MAX_DOCS 6
#define MAX_TOKENS 512

static void
test_round_up (void)
{
  assert (cp_index_thd_round_up (0, 4) == 0);
  assert (cp_index_thd_round_up (1, 4) == 4);
  assert (cp_index_thd_round_up (4, 4) == 4);
  assert (cp_index_thd_round_up (9, 8) == 16);
  assert (cp_index_thd_local_bound (48, 3) == 16);
}

/* The rank holding token @t of a document of @padded tokens split
 * head-tail into 2·@cp_size chunks. */
static int64_t
owner_of (int64_t t,
          int64_t padded,
          int64_t cp_size)
{
  int64_t chunk = t / (padded / (2 * cp_size));

  return chunk < cp_size ? chunk : 2 * cp_size - 1 - chunk;
}

static void
test_local_real (void)
{
  for (int64_t cp_size = 1; cp_size <= 4; cp_size++)
    for (int64_t padded = 0; padded <= 48; padded += 2 * cp_size)
      for (int64_t real = 0; real <= padded; real++)
        {
          int64_t sum = 0;

          for (int64_t rank = 0; rank < cp_size; rank++)
            {
              int64_t expected = 0;

              for (int64_t t = 0; t < real; t++)
                expected += owner_of (t, padded, cp_size) == rank;
              assert (cp_index_thd_local_real (real, padded, cp_size, rank) == expected);
              sum += expected;
            }
          assert (sum == real);
        }
}

static void
test_absorb_trailing (void)
{
  /* Only the last document is padded: absorbed, nothing to emit. */
  int64_t cu[] = { 0, 3, 5 }, cu_padded[] = { 0, 3, 8 };
  /* An earlier document is padded: kept as it is. */
  int64_t cu2[] = { 0, 3, 5 }, cu2_padded[] = { 0, 4, 8 };

  assert (!cp_index_thd_absorb_trailing (cu, cu_padded, 3, 3, 8));
  assert (cu[2] == 8 && cu_padded[2] == 8);
  assert (cp_index_thd_absorb_trailing (cu2, cu2_padded, 3, 3, 8));
  assert (cu2[2] == 5 && cu2_padded[2] == 8);
}

/* The mask of every rank's runs, against the documents' real ends. */
static void
test_padding_mask (void)
{
  srand (7);
  for (int round = 0; round < 200; round++)
    {
      int64_t cp_size = 1 + rand () % 4;
      size_t n_docs = 1 + (size_t) (rand () % MAX_DOCS);
      int64_t bounds[MAX_DOCS + 1] = { 0 }, real[MAX_DOCS];

      for (size_t d = 0; d < n_docs; d++)
        {
          int64_t padded = 2 * cp_size * (1 + rand () % 8);

          real[d] = rand () % (padded + 1);
          bounds[d + 1] = bounds[d] + padded;
        }
      for (int64_t rank = 0; rank < cp_size; rank++)
        {
          cp_index_run runs[2 * MAX_DOCS];
          size_t n_runs = cp_index_rank_runs (true, cp_size, rank, bounds, n_docs, runs);
          uint8_t mask[MAX_TOKENS];
          uint8_t *end = cp_index_thd_padding_mask (bounds, real, n_docs, runs, n_runs, mask);
          size_t k = 0;

          for (size_t i = 0; i < n_runs; i++)
            for (int64_t p = runs[i].start; p < runs[i].start + runs[i].length; p++, k++)
              {
                size_t d = 0;

                while (bounds[d + 1] <= p)
                  d++;
                assert (mask[k] == (p - bounds[d] >= real[d]));
              }
          assert (end == mask + k);
        }
    }
}

/* Positions past the last document are padding. */
static void
test_padding_past_documents (void)
{
  int64_t bounds[] = { 0, 4 }, real[] = { 3 };
  cp_index_run whole = { 0, 6 };
  uint8_t mask[6];

  cp_index_thd_padding_mask (bounds, real, 1, &whole, 1, mask);
  assert (mask[0] == 0 && mask[2] == 0 && mask[3] == 1 && mask[4] == 1 && mask[5] == 1);
}

int
main (void)
{
  test_round_up ();
  test_local_real ();
  test_absorb_trailing ();
  test_padding_mask ();
  test_padding_past_documents ();
  return 0;
}
