/* fuzz-layout.c: layouts from arbitrary lengths, bounds and cp sizes
 *
 * Input: byte 0 picks the constructor (cp_layout_new head-tail or
 * contiguous, cp_layout_new_thd), bytes 1-4 the cp_size (any int), then
 * little-endian 64-bit integers: the sequence length, or up to 64
 * cu_seqlens_padded bounds.
 *
 * Invariant: no crash, no sanitizer report, no critical.  A rejected
 * input sets a GError with a non-empty message.  An accepted layout:
 *   - keeps the arguments: balance, cp_size, length and document count;
 *   - gives every position of the sequence to exactly one rank, once, and
 *     the local lengths sum to the sequence length;
 *   - round-trips: unshard_pieces of every rank's shard is the input, bit
 *     for bit, and the restore indices undo the gathered local indices;
 *   - has finite, non-negative costs and a finite imbalance of at least 1;
 *   - is stable: the same arguments build an equal layout with the same
 *     fingerprint, and the hexadecimal form spells that fingerprint.
 * Position-level checks run on sequences of up to 4096 positions over up
 * to 256 ranks; larger accepted layouts get the checks that need no
 * per-position memory.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>

#include "fuzz-common.h"

#define MAX_BOUNDS 64
/* Position-level checks cost O(S) and O(cp) tensors per input; smaller
 * layouts exercise the same code and keep the fuzzer fast. */
#define MAX_CHECKED_LEN (1 << 12)
#define MAX_CHECKED_RANKS 256

typedef struct
{
  CpLoadBalance balance;
  gboolean thd;
  int cp_size;
  gint64 bounds[MAX_BOUNDS];
  gsize n_bounds;
} LayoutArgs;

static CpLayout *
build (const LayoutArgs  *args,
       GError           **error)
{
  if (args->thd)
    return cp_layout_new_thd (args->bounds, args->n_bounds, args->cp_size, error);
  return cp_layout_new (args->balance, args->bounds[1], args->cp_size, error);
}

static void
check_arguments_kept (CpLayout         *layout,
                      const LayoutArgs *args)
{
  g_assert_cmpint (cp_layout_get_cp_size (layout), ==, args->cp_size);
  g_assert_cmpint (cp_layout_get_balance (layout), ==, args->balance);
  g_assert_cmpint (cp_layout_get_seq_len (layout), ==, args->bounds[args->n_bounds - 1] - args->bounds[0]);
  g_assert_cmpuint (cp_layout_get_n_documents (layout), ==, args->n_bounds - 1);
}

static void
check_costs_and_lengths (CpLayout *layout)
{
  int cp = cp_layout_get_cp_size (layout);
  double imbalance = cp_layout_get_imbalance (layout);
  gint64 total = 0;

  for (int r = 0; r < cp; r++)
    {
      double cost = cp_layout_get_cost (layout, r);

      g_assert_true (isfinite (cost));
      g_assert_cmpfloat (cost, >=, 0.0);
      g_assert_cmpint (cp_layout_get_local_len (layout, r), >=, 0);
      total += cp_layout_get_local_len (layout, r);
    }
  g_assert_cmpint (total, ==, cp_layout_get_seq_len (layout));
  g_assert_true (isfinite (imbalance));
  g_assert_cmpfloat (imbalance, >=, 1.0 - 1e-9);
}

static void
check_stable (CpLayout         *layout,
              const LayoutArgs *args)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpLayout) again = build (args, &error);
  g_autofree char *hex = cp_layout_dup_fingerprint_hex (layout);
  g_autofree char *expected_hex = NULL;

  g_assert_no_error (error);
  g_assert_true (cp_layout_equal (layout, again));
  g_assert_cmpuint (cp_layout_fingerprint (layout), ==, cp_layout_fingerprint (again));
  expected_hex = g_strdup_printf ("%016" G_GINT64_MODIFIER "x", cp_layout_fingerprint (layout));
  g_assert_cmpstr (hex, ==, expected_hex);
}

/* Every position of [0, S) appears in exactly one rank's indices, once;
 * returns the indices gathered in rank order. */
static gint64 *
check_exactly_once (CpLayout *layout)
{
  gint64 seq_len = cp_layout_get_seq_len (layout);
  g_autofree guint8 *seen = g_malloc0 ((gsize) seq_len + 1);
  gint64 *gathered = g_new (gint64, seq_len + 1);
  gint64 n = 0;

  for (int r = 0; r < cp_layout_get_cp_size (layout); r++)
    {
      g_autoptr(CpTensor) indices = cp_layout_get_local_indices (layout, r);

      g_assert_cmpint (cp_tensor_get_numel (indices), ==, cp_layout_get_local_len (layout, r));
      for (gint64 i = 0; i < cp_tensor_get_numel (indices); i++)
        {
          gint64 p = (gint64) cp_tensor_get_value (indices, i);

          g_assert_cmpint (p, >=, 0);
          g_assert_cmpint (p, <, seq_len);
          g_assert_cmpuint (seen[p], ==, 0);
          seen[p] = 1;
          gathered[n++] = p;
        }
    }
  g_assert_cmpint (n, ==, seq_len);
  return gathered;
}

static void
check_restore (CpLayout     *layout,
               const gint64 *gathered)
{
  g_autoptr(CpTensor) restore = cp_layout_get_restore_indices (layout);
  gint64 seq_len = cp_layout_get_seq_len (layout);

  g_assert_cmpint (cp_tensor_get_numel (restore), ==, seq_len);
  for (gint64 p = 0; p < seq_len; p++)
    g_assert_cmpint (gathered[(gint64) cp_tensor_get_value (restore, p)], ==, p);
}

/* unshard_pieces (shard (x, r) for every r) == x, for a two-row tensor
 * sharded along dimension 1. */
static void
check_round_trip (CpLayout *layout)
{
  int cp = cp_layout_get_cp_size (layout);
  gint64 shape[] = { 2, cp_layout_get_seq_len (layout) };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) full = cp_tensor_new_arange (CP_DTYPE_INT64, 0, 2 * shape[1], 1, &error);
  g_autoptr(CpTensor) rows = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autofree CpTensor **pieces = g_new0 (CpTensor *, cp);

  g_assert_no_error (error);
  rows = cp_tensor_new_from_storage (CP_DTYPE_INT64, shape, 2, cp_tensor_get_storage (full), 0, &error);
  g_assert_no_error (error);
  for (int r = 0; r < cp; r++)
    {
      pieces[r] = cp_layout_shard (layout, rows, 1, r, &error);
      g_assert_no_error (error);
    }
  back = cp_layout_unshard_pieces (layout, pieces, (guint) cp, 1, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, rows));
  for (int r = 0; r < cp; r++)
    g_object_unref (pieces[r]);
}

static void
check_accepted (CpLayout         *layout,
                const LayoutArgs *args)
{
  check_arguments_kept (layout, args);
  check_costs_and_lengths (layout);
  check_stable (layout, args);
  if (cp_layout_get_seq_len (layout) <= MAX_CHECKED_LEN &&
      cp_layout_get_cp_size (layout) <= MAX_CHECKED_RANKS)
    {
      g_autofree gint64 *gathered = check_exactly_once (layout);

      check_restore (layout, gathered);
      check_round_trip (layout);
    }
}

static void
read_args (FuzzInput  *in,
           LayoutArgs *args)
{
  guint8 mode = fuzz_take_u8 (in);

  args->thd = mode % 3 == 2;
  args->balance = mode % 3 == 1 ? CP_LOAD_BALANCE_CONTIGUOUS : CP_LOAD_BALANCE_HEAD_TAIL;
  args->cp_size = fuzz_take_i32 (in);
  if (!args->thd)
    {
      args->bounds[0] = 0;
      args->bounds[1] = fuzz_take_i64 (in);
      args->n_bounds = 2;
      return;
    }
  for (args->n_bounds = 0; args->n_bounds < MAX_BOUNDS && in->size > 0; args->n_bounds++)
    args->bounds[args->n_bounds] = fuzz_take_i64 (in);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data,
                        size_t         size)
{
  FuzzInput in = { data, size };
  LayoutArgs args = { 0 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpLayout) layout = NULL;

  fuzz_init ();
  read_args (&in, &args);
  layout = build (&args, &error);
  if (layout == NULL)
    fuzz_assert_rejected (error);
  else
    check_accepted (layout, &args);
  return 0;
}
