/* test-layout.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "cp-test-util.h"

static const CpDType all_dtypes[] = {
  CP_DTYPE_BOOL, CP_DTYPE_UINT8, CP_DTYPE_INT32, CP_DTYPE_INT64,
  CP_DTYPE_FLOAT16, CP_DTYPE_BFLOAT16, CP_DTYPE_FLOAT32, CP_DTYPE_FLOAT64,
};

static CpLayout *
head_tail (gint64 seq_len,
           int    cp_size)
{
  g_autoptr(GError) error = NULL;
  CpLayout *layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, seq_len, cp_size, &error);

  g_assert_no_error (error);
  return layout;
}

static void
assert_int64_values (CpTensor     *tensor,
                     const gint64 *expected,
                     gsize         n)
{
  g_assert_cmpint (cp_tensor_get_dtype (tensor), ==, CP_DTYPE_INT64);
  g_assert_cmpmem (cp_tensor_get_data (tensor), cp_tensor_get_nbytes (tensor),
                   expected, n * sizeof (gint64));
}

static void
assert_indices (CpLayout     *layout,
                int           rank,
                const gint64 *expected,
                gsize         n)
{
  g_autoptr(CpTensor) indices = cp_layout_get_local_indices (layout, rank);

  g_assert_cmpint (cp_layout_get_local_len (layout, rank), ==, (gint64) n);
  assert_int64_values (indices, expected, n);
}

#define ASSERT_INDICES(layout, rank, ...)                                    \
  G_STMT_START {                                                            \
    const gint64 expected_[] = { __VA_ARGS__ };                             \
    assert_indices ((layout), (rank), expected_, G_N_ELEMENTS (expected_)); \
  } G_STMT_END

/* SEED-SEMANTICS E1. */
static void
test_head_tail_examples (void)
{
  g_autoptr(CpLayout) c1 = head_tail (4, 1);
  g_autoptr(CpLayout) c2 = head_tail (8, 2);
  g_autoptr(CpLayout) c3 = head_tail (12, 3);
  g_autoptr(CpLayout) c4 = head_tail (16, 4);
  g_autoptr(CpLayout) c8 = head_tail (32, 8);

  ASSERT_INDICES (c1, 0, 0, 1, 2, 3);
  ASSERT_INDICES (c2, 0, 0, 1, 6, 7);
  ASSERT_INDICES (c2, 1, 2, 3, 4, 5);
  ASSERT_INDICES (c3, 0, 0, 1, 10, 11);
  ASSERT_INDICES (c3, 1, 2, 3, 8, 9);
  ASSERT_INDICES (c3, 2, 4, 5, 6, 7);
  ASSERT_INDICES (c4, 0, 0, 1, 14, 15);
  ASSERT_INDICES (c4, 1, 2, 3, 12, 13);
  ASSERT_INDICES (c4, 2, 4, 5, 10, 11);
  ASSERT_INDICES (c4, 3, 6, 7, 8, 9);
  ASSERT_INDICES (c8, 0, 0, 1, 30, 31);
  ASSERT_INDICES (c8, 7, 14, 15, 16, 17);
  g_assert_cmpint (cp_layout_get_cp_size (c8), ==, 8);
  g_assert_cmpint (cp_layout_get_seq_len (c8), ==, 32);
  g_assert_cmpuint (cp_layout_get_n_documents (c8), ==, 1);
}

static void
test_contiguous_examples (void)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, 6, 3, NULL);

  ASSERT_INDICES (layout, 0, 0, 1);
  ASSERT_INDICES (layout, 2, 4, 5);
  g_assert_cmpint (cp_layout_get_balance (layout), ==, CP_LOAD_BALANCE_CONTIGUOUS);
}

/* Every position on exactly one rank, head chunk then tail chunk. */
static void
test_exactly_once (void)
{
  static const int sizes[] = { 1, 2, 3, 4, 8 };

  for (guint s = 0; s < G_N_ELEMENTS (sizes); s++)
    for (gint64 k = 1; k <= 3; k++)
      {
        int cp = sizes[s];
        gint64 seq = 2 * cp * k;
        g_autoptr(CpLayout) layout = head_tail (seq, cp);
        g_autofree int *owner = g_new (int, seq);

        memset (owner, 0xff, seq * sizeof (int));
        for (int r = 0; r < cp; r++)
          {
            g_autoptr(CpTensor) indices = cp_layout_get_local_indices (layout, r);
            const gint64 *idx = cp_tensor_get_data (indices);

            g_assert_cmpint (cp_tensor_get_numel (indices), ==, 2 * k);
            for (gint64 i = 0; i < 2 * k; i++)
              {
                gint64 chunk = i < k ? r : 2 * cp - 1 - r;

                g_assert_cmpint (idx[i], ==, chunk * k + i % k);
                g_assert_cmpint (owner[idx[i]], ==, -1);
                owner[idx[i]] = r;
              }
          }
        for (gint64 p = 0; p < seq; p++)
          g_assert_cmpint (owner[p], >=, 0);
      }
}

/* SEED-SEMANTICS E5. */
static void
test_restore_indices (void)
{
  g_autoptr(CpLayout) layout = head_tail (8, 2);
  g_autoptr(CpTensor) restore = cp_layout_get_restore_indices (layout);

  CP_TEST_ASSERT_VALUES (restore, 0, 1, 4, 5, 6, 7, 2, 3);
}

static void
round_trip (CpDType dtype,
            int     seq_dim,
            int     cp)
{
  gint64 shape[4] = { 2, 3, 1, 5 };
  gint64 seq = 4 * cp;
  g_autoptr(CpLayout) layout = head_tail (seq, cp);
  g_autoptr(CpTensor) full = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(GError) error = NULL;
  CpTensor *pieces[8];

  shape[seq_dim] = seq;
  full = cp_test_tensor_pattern (dtype, shape, 4, (guint) seq_dim);
  for (int r = 0; r < cp; r++)
    {
      g_autoptr(CpTensor) indices = cp_layout_get_local_indices (layout, r);
      g_autoptr(CpTensor) into = NULL;
      gint64 local_shape[4];

      pieces[r] = cp_layout_shard (layout, full, seq_dim, r, &error);
      g_assert_no_error (error);
      g_assert_cmpint (cp_tensor_get_dim (pieces[r], seq_dim), ==, seq / cp);

      /* The piece holds exactly the rank's positions, element by element. */
      memcpy (local_shape, cp_tensor_get_shape (pieces[r], NULL), sizeof local_shape);
      for (gint64 flat = 0; flat < cp_tensor_get_numel (pieces[r]); flat++)
        {
          gint64 coord[4], rest = flat, src = 0;

          for (int d = 3; d >= 0; d--)
            {
              coord[d] = rest % local_shape[d];
              rest /= local_shape[d];
            }
          coord[seq_dim] = (gint64) cp_tensor_get_value (indices, coord[seq_dim]);
          for (int d = 0; d < 4; d++)
            src = src * shape[d] + coord[d];
          g_assert_cmpfloat (cp_tensor_get_value (pieces[r], flat), ==,
                             cp_tensor_get_value (full, src));
        }

      /* Outputs start as garbage, so a position the copy skips shows. */
      into = cp_test_on_device (cp_tensor_new_full (dtype, local_shape, 4, 77, NULL));
      g_assert_true (cp_layout_shard_into (layout, full, seq_dim, r, into, &error));
      g_assert_no_error (error);
      g_assert_true (cp_tensor_equal (into, pieces[r]));
    }
  back = cp_layout_unshard_pieces (layout, pieces, (guint) cp, seq_dim, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, full));
  g_clear_object (&back);
  back = cp_test_on_device (cp_tensor_new_full (dtype, shape, 4, 77, NULL));
  g_assert_true (cp_layout_unshard_pieces_into (layout, pieces, (guint) cp, seq_dim, back, &error));
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, full));
  for (int r = 0; r < cp; r++)
    g_object_unref (pieces[r]);
}

static void
test_round_trip_every_dtype_and_dim (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (all_dtypes); i++)
    for (int dim = 0; dim < 4; dim++)
      {
        round_trip (all_dtypes[i], dim, 2);
        round_trip (all_dtypes[i], dim, 3);
      }
  round_trip (CP_DTYPE_FLOAT32, 1, 1);
  round_trip (CP_DTYPE_FLOAT32, 3, 8);
}

/* SEED-SEMANTICS E4. */
static void
test_shard_backward (void)
{
  const gint64 shape[] = { 1, 8, 1 };
  const gint64 local_shape[] = { 1, 4, 1 };
  g_autoptr(CpLayout) layout = head_tail (8, 2);
  g_autoptr(CpTensor) embeds = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_FLOAT32, 0, 8, 1, NULL));
  g_autoptr(CpTensor) view = cp_tensor_new_from_storage (CP_DTYPE_FLOAT32, shape, 3,
                                                         cp_tensor_get_storage (embeds), 0, NULL);
  g_autoptr(CpTensor) r1 = cp_layout_shard (layout, view, 1, 1, NULL);
  g_autoptr(CpTensor) r0 = cp_layout_shard (layout, view, 1, 0, NULL);
  g_autoptr(CpTensor) ones = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT32, local_shape, 3,
                                                                    1.0, NULL));
  g_autoptr(CpTensor) grad = NULL;
  g_autoptr(GError) error = NULL;

  CP_TEST_ASSERT_VALUES (r1, 2, 3, 4, 5);
  CP_TEST_ASSERT_VALUES (r0, 0, 1, 6, 7);
  CP_TEST_ASSERT_VALUES (view, 0, 1, 2, 3, 4, 5, 6, 7); /* intact */
  grad = cp_layout_shard_backward (layout, ones, 1, 1, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (grad, 0, 0, 1, 1, 1, 1, 0, 0);

  g_clear_object (&grad);
  g_assert_null (cp_layout_shard_backward (layout, view, 1, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_shard_backward of a gradient of the wrong length");
}

static void
test_cost_and_imbalance (void)
{
  static const int sizes[] = { 1, 2, 3, 4, 8 };

  for (guint s = 0; s < G_N_ELEMENTS (sizes); s++)
    {
      int cp = sizes[s];
      gint64 seq = 64 * cp;
      g_autoptr(CpLayout) ht = head_tail (seq, cp);
      g_autoptr(CpLayout) contiguous = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, seq, cp, NULL);
      double total = 0;

      for (int r = 0; r < cp; r++)
        {
          g_assert_cmpfloat (cp_layout_get_cost (ht, r), ==, cp_layout_get_cost (ht, 0));
          total += cp_layout_get_cost (contiguous, r);
        }
      /* Every query-key pair of the causal triangle counted once. */
      g_assert_cmpfloat (total, ==, (double) seq * (seq + 1) / 2);
      g_assert_cmpfloat (cp_layout_get_imbalance (ht), ==, 1.0);
      /* The last chunk does the most: L·((C−1)·L + 1) + L·(L−1)/2, about
       * (2C−1)/C times the mean. */
      {
        double l = (double) seq / cp;
        double max = l * ((cp - 1) * l + 1) + l * (l - 1) / 2;

        g_assert_cmpfloat_with_epsilon (cp_layout_get_imbalance (contiguous),
                                        max / (total / cp), 1e-12);
        g_assert_cmpfloat (fabs (cp_layout_get_imbalance (contiguous) - (2.0 * cp - 1) / cp),
                           <, 0.02);
      }
    }
}

static void
test_fingerprint (void)
{
  g_autoptr(CpLayout) a = head_tail (16, 4);
  g_autoptr(CpLayout) b = head_tail (16, 4);
  g_autoptr(CpLayout) c = head_tail (16, 2);
  g_autoptr(CpLayout) d = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, 16, 4, NULL);
  const gint64 bounds[] = { 0, 16 };
  g_autoptr(CpLayout) thd = cp_layout_new_thd (bounds, 2, 4, NULL);

  /* The same on every host and every run. */
  g_assert_cmphex (cp_layout_fingerprint (a), ==, G_GUINT64_CONSTANT (0x60d6407a50e9d88e));
  g_assert_cmphex (cp_layout_fingerprint (a), ==, cp_layout_fingerprint (b));
  {
    g_autofree char *hex = cp_layout_dup_fingerprint_hex (a);

    g_assert_cmpstr (hex, ==, "60d6407a50e9d88e");
  }
  g_assert_cmphex (cp_layout_fingerprint (a), !=, cp_layout_fingerprint (c));
  g_assert_cmphex (cp_layout_fingerprint (a), !=, cp_layout_fingerprint (d));
  g_assert_true (cp_layout_equal (a, b));
  g_assert_false (cp_layout_equal (a, d));
  /* One document is the plain head-tail layout. */
  g_assert_true (cp_layout_equal (a, thd));
  g_assert_cmphex (cp_layout_fingerprint (a), ==, cp_layout_fingerprint (thd));
}

/* SEED-SEMANTICS E6: Transformer Engine's per-document partition. */
static void
test_thd_partition (void)
{
  const gint64 e6[] = { 0, 8, 12 };
  const gint64 small[] = { 0, 4, 8 };
  const gint64 c4[] = { 0, 8, 16 };
  g_autoptr(CpLayout) a = cp_layout_new_thd (e6, 3, 2, NULL);
  g_autoptr(CpLayout) b = cp_layout_new_thd (small, 3, 2, NULL);
  g_autoptr(CpLayout) c = cp_layout_new_thd (c4, 3, 4, NULL);
  g_autoptr(CpTensor) bounds = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_INT32, 0, 13, 4, NULL));
  g_autoptr(CpLayout) from_tensor = NULL;
  g_autoptr(GError) error = NULL;

  ASSERT_INDICES (a, 0, 0, 1, 6, 7, 8, 11);
  ASSERT_INDICES (a, 1, 2, 3, 4, 5, 9, 10);
  ASSERT_INDICES (b, 0, 0, 3, 4, 7);
  ASSERT_INDICES (b, 1, 1, 2, 5, 6);
  ASSERT_INDICES (c, 0, 0, 7, 8, 15);
  ASSERT_INDICES (c, 1, 1, 6, 9, 14);
  ASSERT_INDICES (c, 2, 2, 5, 10, 13);
  ASSERT_INDICES (c, 3, 3, 4, 11, 12);
  g_assert_cmpuint (cp_layout_get_n_documents (a), ==, 2);
  g_assert_cmpfloat (cp_layout_get_imbalance (a), ==, 1.0);

  from_tensor = cp_layout_new_thd_from_tensor (bounds, 2, &error); /* 0, 4, 8, 12 */
  g_assert_no_error (error);
  ASSERT_INDICES (from_tensor, 1, 1, 2, 5, 6, 9, 10);
}

static void
test_thd_single_rank_merges_runs (void)
{
  const gint64 bounds[] = { 0, 4, 4, 10 };
  g_autoptr(CpLayout) layout = cp_layout_new_thd (bounds, 4, 1, NULL);

  ASSERT_INDICES (layout, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
  /* Causal work restarts at each document: 10 + 21. */
  g_assert_cmpfloat (cp_layout_get_cost (layout, 0), ==, 31.0);
}

static void
assert_chunks (CpLayout     *layout,
               int           rank,
               const gint64 *expected,
               gsize         n_rows)
{
  g_autoptr(CpTensor) chunks = cp_layout_get_chunks (layout, rank);

  g_assert_cmpint (cp_tensor_get_n_dims (chunks), ==, 2);
  g_assert_cmpint (cp_tensor_get_dim (chunks, 0), ==, (gint64) n_rows);
  g_assert_cmpint (cp_tensor_get_dim (chunks, 1), ==, 2);
  assert_int64_values (chunks, expected, 2 * n_rows);
}

/* Rows of (start, length). */
#define ASSERT_CHUNKS(layout, rank, ...)                                              \
  G_STMT_START {                                                                     \
    const gint64 expected_[] = { __VA_ARGS__ };                                      \
    assert_chunks ((layout), (rank), expected_, G_N_ELEMENTS (expected_) / 2);       \
  } G_STMT_END

/* Chunks that touch stay apart, where the runs of the local indices
 * merge them: rank 3's head chunk 6–7 and tail chunk 8–9, and both
 * chunks of a single rank. */
static void
test_chunks_head_tail (void)
{
  g_autoptr(CpLayout) four = head_tail (16, 4);
  g_autoptr(CpLayout) one = head_tail (4, 1);

  ASSERT_CHUNKS (four, 0, 0, 2, 14, 2);
  ASSERT_CHUNKS (four, 1, 2, 2, 12, 2);
  ASSERT_CHUNKS (four, 2, 4, 2, 10, 2);
  ASSERT_CHUNKS (four, 3, 6, 2, 8, 2);
  ASSERT_INDICES (four, 3, 6, 7, 8, 9);
  ASSERT_CHUNKS (one, 0, 0, 2, 2, 2);
}

static void
test_chunks_contiguous (void)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, 12, 3, NULL);

  ASSERT_CHUNKS (layout, 0, 0, 4);
  ASSERT_CHUNKS (layout, 2, 8, 4);
}

/* Two rows per document, head then tail; an empty document gives rows
 * of length 0, so row 2·d + 1 is always document d's tail. */
static void
test_chunks_thd (void)
{
  const gint64 bounds[] = { 0, 8, 8, 20 };
  g_autoptr(CpLayout) layout = cp_layout_new_thd (bounds, G_N_ELEMENTS (bounds), 2, NULL);

  ASSERT_CHUNKS (layout, 0, 0, 2, 6, 2, 8, 0, 8, 0, 8, 3, 17, 3);
  ASSERT_CHUNKS (layout, 1, 2, 2, 4, 2, 8, 0, 8, 0, 11, 3, 14, 3);
}

/* Read in order, the chunks are exactly the local indices. */
static void
assert_chunks_spell_indices (CpLayout *layout)
{
  for (int r = 0; r < cp_layout_get_cp_size (layout); r++)
    {
      g_autoptr(CpTensor) chunks = cp_layout_get_chunks (layout, r);
      g_autoptr(CpTensor) indices = cp_layout_get_local_indices (layout, r);
      const gint64 *rows = cp_tensor_get_data (chunks);
      const gint64 *positions = cp_tensor_get_data (indices);
      gint64 next = 0;

      for (gint64 i = 0; i < cp_tensor_get_dim (chunks, 0); i++)
        for (gint64 p = 0; p < rows[2 * i + 1]; p++)
          {
            g_assert_cmpint (next, <, cp_layout_get_local_len (layout, r));
            g_assert_cmpint (positions[next++], ==, rows[2 * i] + p);
          }
      g_assert_cmpint (next, ==, cp_layout_get_local_len (layout, r));
    }
}

static void
test_chunks_spell_indices (void)
{
  const gint64 bounds[] = { 0, 24, 24, 72, 96, 240 };

  for (int cp_size = 1; cp_size <= 6; cp_size++)
    {
      g_autoptr(CpLayout) spread = head_tail (24 * cp_size, cp_size);
      g_autoptr(CpLayout) contiguous = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, 5 * cp_size,
                                                      cp_size, NULL);

      assert_chunks_spell_indices (spread);
      assert_chunks_spell_indices (contiguous);
    }
  for (int cp_size = 1; cp_size <= 4; cp_size *= 2)
    {
      g_autoptr(CpLayout) packed = cp_layout_new_thd (bounds, G_N_ELEMENTS (bounds), cp_size, NULL);

      g_assert_nonnull (packed);
      assert_chunks_spell_indices (packed);
    }
}

static void
test_chunks_bad_rank_is_critical (void)
{
  if (g_test_subprocess ())
    {
      g_autoptr(CpLayout) layout = head_tail (8, 2);
      g_autoptr(CpTensor) chunks = cp_layout_get_chunks (layout, 2);

      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_failed ();
  g_test_trap_assert_stderr ("*CRITICAL*rank*cp_size*");
}

/* get_local_len takes a rank of the layout's own mesh: one outside
 * [0, cp_size) is a programmer error, a critical naming the check, as
 * its documentation says. */
static void
test_local_len_bad_rank_is_critical (void)
{
  if (g_test_subprocess ())
    {
      g_autoptr(CpLayout) layout = head_tail (8, 2);

      g_assert_cmpint (cp_layout_get_local_len (layout, 1), ==, 4);
      g_assert_cmpint (cp_layout_get_local_len (layout, 2), ==, 0);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_failed ();
  g_test_trap_assert_stderr ("*CRITICAL*cp_layout_get_local_len*rank*cp_size*");
}

/* Shards @full along @dim for both ranks of @layout and gathers the
 * pieces back: the result must equal @full. */
static void
assert_two_rank_round_trip (CpLayout *layout,
                            CpTensor *full,
                            int       dim)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) back = NULL;
  CpTensor *pieces[2];

  for (int r = 0; r < 2; r++)
    {
      pieces[r] = cp_layout_shard (layout, full, dim, r, &error);
      g_assert_no_error (error);
      g_assert_cmpint (cp_tensor_get_dim (pieces[r], dim), ==, cp_layout_get_local_len (layout, r));
    }
  back = cp_layout_unshard_pieces (layout, pieces, 2, dim, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, full));
  g_object_unref (pieces[0]);
  g_object_unref (pieces[1]);
}

/* A sequence of length 0 is a valid layout with nothing on any rank: its
 * indices, shards and gathers are all empty. */
static void
test_empty_sequence (void)
{
  const gint64 shape[] = { 3, 0 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 0, 2, &error);
  g_autoptr(CpTensor) empty = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, shape, 2, NULL));
  g_autoptr(CpTensor) restore = NULL;

  g_assert_no_error (error);
  restore = cp_layout_get_restore_indices (layout);
  g_assert_cmpint (cp_tensor_get_numel (restore), ==, 0);
  for (int r = 0; r < 2; r++)
    {
      g_autoptr(CpTensor) indices = cp_layout_get_local_indices (layout, r);

      g_assert_cmpint (cp_tensor_get_numel (indices), ==, 0);
      g_assert_cmpfloat (cp_layout_get_cost (layout, r), ==, 0.0);
    }
  g_assert_cmpfloat (cp_layout_get_imbalance (layout), ==, 1.0);
  assert_two_rank_round_trip (layout, empty, 1);
}

/* An empty tensor whose other dimensions multiply to 2^40 shards,
 * unshards and narrows at once: there is nothing to copy. */
static void
test_empty_tensor_with_huge_rows (void)
{
  const gint64 shape[] = { G_GINT64_CONSTANT (1) << 40, 8, 0 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 8, 2, &error);
  g_autoptr(CpTensor) empty = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT64, shape, 3, NULL));
  g_autoptr(CpTensor) narrowed = NULL;

  g_assert_no_error (error);
  assert_two_rank_round_trip (layout, empty, 1);
  narrowed = cp_tensor_narrow (empty, 1, 2, 3, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_dim (narrowed, 1), ==, 3);
}

/* 200 000 documents of length 4 over 2 ranks: each rank holds positions
 * {0, 3} or {1, 2} of every document, a causal cost of 1 + 4 or 2 + 3.
 * Runs merge across document boundaries here, and the cost must still
 * count each document's part; building it must stay linear in the number
 * of documents. */
static void
test_thd_many_documents (void)
{
  const guint n_docs = 200000;
  g_autofree gint64 *bounds = g_new (gint64, n_docs + 1);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpLayout) layout = NULL;

  for (guint i = 0; i <= n_docs; i++)
    bounds[i] = 4 * (gint64) i;
  layout = cp_layout_new_thd (bounds, n_docs + 1, 2, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (cp_layout_get_n_documents (layout), ==, n_docs);
  g_assert_cmpfloat (cp_layout_get_cost (layout, 0), ==, 5.0 * n_docs);
  g_assert_cmpfloat (cp_layout_get_cost (layout, 1), ==, 5.0 * n_docs);
  g_assert_cmpint (cp_layout_get_local_len (layout, 0), ==, 2 * (gint64) n_docs);
}

static void
test_errors (void)
{
  const gint64 bad_doc[] = { 0, 8, 14 };
  const gint64 decreasing[] = { 0, 8, 4 };
  const gint64 offset[] = { 4, 8 };
  const gint64 plunging[] = { 0, G_GINT64_CONSTANT (1) << 62, G_MININT64 };
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 6, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_new head-tail with a length not a multiple of 2·cp_size");
  g_assert_nonnull (strstr (error->message, "sequence length 6 is not a non-negative multiple of 4"));
  g_clear_error (&error);

  g_assert_null (cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, 10, 4, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_new contiguous with a length not a multiple of cp_size");
  g_assert_nonnull (strstr (error->message, "10"));
  g_clear_error (&error);

  g_assert_null (cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 8, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpLayout",
                       "cp_layout_new with cp_size 0");
  g_clear_error (&error);

  g_assert_null (cp_layout_new_thd (bad_doc, 3, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_new_thd with a document not a multiple of 2·cp_size");
  g_assert_nonnull (strstr (error->message, "document 1 has padded length 6, not a multiple of 4"));
  g_clear_error (&error);

  /* The length of this pair overflows int64: it must never be computed. */
  g_assert_null (cp_layout_new_thd (plunging, 3, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_new_thd with bounds that fall by more than 2^63");
  g_assert_nonnull (strstr (error->message, "decreases at entry 2"));
  g_clear_error (&error);

  g_assert_null (cp_layout_new_thd (decreasing, 3, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_new_thd with decreasing bounds");
  g_assert_nonnull (strstr (error->message, "decreases"));
  g_clear_error (&error);

  g_assert_null (cp_layout_new_thd (offset, 2, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_new_thd with bounds that do not start at 0");
  g_clear_error (&error);

  g_assert_null (cp_layout_new_thd (offset, 1, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_new_thd with a single bound");
}

static void
test_shard_errors (void)
{
  const gint64 shape[] = { 2, 10 };
  const gint64 local[] = { 2, 4 };
  const gint64 wrong_local[] = { 2, 5 };
  g_autoptr(CpLayout) layout = head_tail (8, 2);
  g_autoptr(CpTensor) bad = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT64, shape, 2, NULL));
  g_autoptr(CpTensor) good = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_INT64, 0, 8, 1, NULL));
  g_autoptr(CpTensor) piece = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT64, local, 2, NULL));
  g_autoptr(CpTensor) wrong = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT64, wrong_local, 2, NULL));
  g_autoptr(CpTensor) out = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, local, 1, NULL));
  CpTensor *pieces[2] = { piece, wrong };
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_layout_shard (layout, bad, 1, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_shard of a tensor whose sequence length differs from the layout");
  cp_test_assert_message (error, "dimension 1 of int64[2, 10] on host has length 10, the layout needs 8");
  g_clear_error (&error);

  g_assert_null (cp_layout_shard (layout, good, 0, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpLayout",
                       "cp_layout_shard for a rank outside [0, cp_size)");
  g_clear_error (&error);

  g_assert_null (cp_layout_shard (layout, good, 3, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_shard along a dimension that does not exist");
  g_clear_error (&error);

  g_assert_false (cp_layout_shard_into (layout, good, 0, 0, out, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_shard_into an output of the wrong shape or dtype");
  g_assert_nonnull (strstr (error->message, "must be int64[4]"));
  g_clear_error (&error);

  g_assert_null (cp_layout_unshard_pieces (layout, pieces, 2, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_unshard_pieces with a piece of the wrong shape");
  g_assert_nonnull (strstr (error->message, "piece 1"));
  g_clear_error (&error);

  g_assert_null (cp_layout_unshard_pieces (layout, pieces, 1, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpLayout",
                       "cp_layout_unshard_pieces with fewer pieces than cp_size");
  g_assert_nonnull (strstr (error->message, "1 pieces were given for cp_size 2"));
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Layout/head-tail/examples", test_head_tail_examples);
  g_test_add_func ("/Cp/Layout/contiguous/examples", test_contiguous_examples);
  g_test_add_func ("/Cp/Layout/head-tail/exactly-once", test_exactly_once);
  g_test_add_func ("/Cp/Layout/restore/indices", test_restore_indices);
  g_test_add_func ("/Cp/Layout/shard/round-trip", test_round_trip_every_dtype_and_dim);
  g_test_add_func ("/Cp/Layout/shard/backward", test_shard_backward);
  g_test_add_func ("/Cp/Layout/cost/imbalance", test_cost_and_imbalance);
  g_test_add_func ("/Cp/Layout/fingerprint/stable", test_fingerprint);
  g_test_add_func ("/Cp/Layout/chunks/head-tail", test_chunks_head_tail);
  g_test_add_func ("/Cp/Layout/chunks/contiguous", test_chunks_contiguous);
  g_test_add_func ("/Cp/Layout/chunks/thd", test_chunks_thd);
  g_test_add_func ("/Cp/Layout/chunks/spell-indices", test_chunks_spell_indices);
  cp_test_add_func_in_process ("/Cp/Layout/chunks/bad-rank", test_chunks_bad_rank_is_critical);
  cp_test_add_func_in_process ("/Cp/Layout/local-len/bad-rank", test_local_len_bad_rank_is_critical);
  g_test_add_func ("/Cp/Layout/thd/partition", test_thd_partition);
  g_test_add_func ("/Cp/Layout/thd/single-rank", test_thd_single_rank_merges_runs);
  g_test_add_func ("/Cp/Layout/thd/many-documents", test_thd_many_documents);
  g_test_add_func ("/Cp/Layout/empty/sequence", test_empty_sequence);
  g_test_add_func ("/Cp/Layout/empty/huge-rows", test_empty_tensor_with_huge_rows);
  g_test_add_func ("/Cp/Layout/errors/construction", test_errors);
  g_test_add_func ("/Cp/Layout/errors/shard", test_shard_errors);

  return g_test_run ();
}
