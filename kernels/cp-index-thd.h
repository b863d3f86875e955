/* cp-index-thd.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * The THD partition as plain arithmetic on int64 token positions: how
 * documents are padded to a multiple of 2·C, which of a document's real
 * tokens a rank holds under the head-tail split, the local bounds that
 * follow, the reference's absorption of trailing padding, and the padding
 * mask of a rank's runs.
 *
 * Like cp-index-math.h (whose runs and function marker it uses), nothing
 * here uses GLib or allocates, so cp-batch-thd.c, its tests and a CUDA
 * kernel share one definition.
 */

#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cp-index-math.h"

/* @length rounded up to a multiple of @divisor (2·C for a document). */
CP_INDEX_FN int64_t
cp_index_thd_round_up (int64_t length,
                       int64_t divisor)
{
  return (length + divisor - 1) / divisor * divisor;
}

CP_INDEX_FN int64_t
cp_index_thd_clamp (int64_t value,
                    int64_t low,
                    int64_t high)
{
  return value < low ? low : value > high ? high : value;
}

/* How many of a document's @real tokens rank @rank holds when the
 * document, @padded tokens long (a multiple of 2·@cp_size), is split
 * head-tail: its chunk @rank and its chunk 2·C−1−@rank, of @padded / 2·C
 * tokens each, real tokens first. */
CP_INDEX_FN int64_t
cp_index_thd_local_real (int64_t real,
                         int64_t padded,
                         int64_t cp_size,
                         int64_t rank)
{
  int64_t n_chunks = 2 * cp_size;
  int64_t chunk = padded / n_chunks;

  return cp_index_thd_clamp (real - rank * chunk, 0, chunk) +
         cp_index_thd_clamp (real - (n_chunks - 1 - rank) * chunk, 0, chunk);
}

/* A rank holds 1/C of every padded document: a global padded bound
 * becomes @bound / @cp_size locally. */
CP_INDEX_FN int64_t
cp_index_thd_local_bound (int64_t bound,
                          int64_t cp_size)
{
  return bound / cp_size;
}

/* The reference's trailing-pad absorption, on the @n bounds of the real
 * lengths @cu and of the padded ones @cu_padded of a chunk of @n_tokens
 * tokens: when only the last document carries padding, it is absorbed
 * into that document's real length (both last bounds become @n_tokens).
 * Returns whether the padded bounds still differ from the real ones, that
 * is whether cu_seqlens_padded must be emitted. */
CP_INDEX_FN bool
cp_index_thd_absorb_trailing (int64_t *cu,
                              int64_t *cu_padded,
                              size_t   n,
                              size_t   n_padded,
                              int64_t  n_tokens)
{
  bool same_but_last = n > 1 && n == n_padded;

  for (size_t i = 0; same_but_last && i + 1 < n; i++)
    same_but_last = cu[i] == cu_padded[i];
  if (same_but_last && cu[n - 1] < n_tokens)
    {
      cu[n - 1] = n_tokens;
      cu_padded[n - 1] = n_tokens;
    }
  if (n != n_padded)
    return true;
  for (size_t i = 0; i < n; i++)
    if (cu[i] != cu_padded[i])
      return true;
  return false;
}

CP_INDEX_FN void
cp_index_thd_fill_mask (uint8_t *mask,
                        int64_t  n,
                        uint8_t  value)
{
  for (int64_t i = 0; i < n; i++)
    mask[i] = value;
}

/* Writes, for the positions of @runs in order, 1 where a position lies
 * between its document's real end and padded end and 0 elsewhere.  The
 * documents are [@cu_padded[d], @cu_padded[d + 1]) with @real[d] real
 * tokens, d < @n_documents; positions past the last document are padding
 * too (a packed batch may hold tokens after it).  Returns the end of what
 * was written. */
CP_INDEX_FN uint8_t *
cp_index_thd_padding_mask (const int64_t      *cu_padded,
                           const int64_t      *real,
                           size_t              n_documents,
                           const cp_index_run *runs,
                           size_t              n_runs,
                           uint8_t            *mask)
{
  size_t doc = 0;

  for (size_t i = 0; i < n_runs; i++)
    for (int64_t p = runs[i].start, end = runs[i].start + runs[i].length; p < end;)
      {
        int64_t stop, real_stop;

        while (doc < n_documents && cu_padded[doc + 1] <= p)
          doc++;
        if (doc == n_documents)
          {
            cp_index_thd_fill_mask (mask, end - p, 1);
            mask += end - p;
            break;
          }
        stop = end < cu_padded[doc + 1] ? end : cu_padded[doc + 1];
        real_stop = cp_index_thd_clamp (cu_padded[doc] + real[doc], p, stop);
        cp_index_thd_fill_mask (mask, real_stop - p, 0);
        cp_index_thd_fill_mask (mask + (real_stop - p), stop - real_stop, 1);
        mask += stop - p;
        p = stop;
      }
  return mask;
}
