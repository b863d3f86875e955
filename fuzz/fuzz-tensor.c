/* fuzz-tensor.c: tensors from arbitrary shapes and dtypes, then narrowed
 * and sharded with arbitrary arguments
 *
 * Input: byte 0 picks the dtype (one of the eight), byte 1 the number of
 * dimensions (0 to 9), then one little-endian 64-bit size per dimension,
 * then the narrow arguments (dimension, start, length), then a cp_size
 * (1 to 8) and a sequence dimension for sharding.
 *
 * Invariant: no crash, no sanitizer report, no critical.  A rejected call
 * sets a GError with a non-empty message.  Then:
 *   - cp_tensor_new accepts exactly the shapes with at most 8 dimensions,
 *     no negative size and an element count × element size that fits 64
 *     bits, and the tensor it returns has that shape and element count
 *     and holds zeros; cp_tensor_new_from_bytes rejects any byte count
 *     but the one the shape needs;
 *   - cp_tensor_narrow accepts exactly an existing dimension (negative
 *     counts from the end) and a range inside it, and the result holds the
 *     source's elements of that range;
 *   - sharding the source or the narrowed tensor with a head-tail layout
 *     and unsharding the pieces gives it back bit for bit, or the layout
 *     or shard is refused with a GError;
 *   - cp_tensor_copy and cp_tensor_new_from_bytes of the data are equal
 *     to the source.
 * Accepted shapes above 64 KiB are checked without being allocated.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "fuzz-common.h"

#define MAX_TEST_BYTES (1 << 16)

static const CpDType dtypes[] = {
  CP_DTYPE_BOOL, CP_DTYPE_UINT8, CP_DTYPE_INT32, CP_DTYPE_INT64,
  CP_DTYPE_FLOAT16, CP_DTYPE_BFLOAT16, CP_DTYPE_FLOAT32, CP_DTYPE_FLOAT64,
};

/* The documented rule: at most 8 dimensions, none negative, and an
 * element count × element size that fits in 64 bits.  Sets *numel. */
static gboolean
shape_is_valid (CpDType       dtype,
                const gint64 *shape,
                guint         n_dims,
                gint64       *numel)
{
  gint64 limit = G_MAXINT64 / (gint64) cp_dtype_get_size (dtype);

  *numel = 1;
  if (n_dims > 8)
    return FALSE;
  for (guint i = 0; i < n_dims; i++)
    {
      if (shape[i] < 0 || (shape[i] != 0 && *numel > limit / shape[i]))
        return FALSE;
      *numel *= shape[i];
    }
  return TRUE;
}

/* Element values that survive every dtype: 0 and 1 for booleans, small
 * integers for the rest. */
static void
fill_pattern (CpTensor *t)
{
  for (gint64 i = 0; i < cp_tensor_get_numel (t); i++)
    cp_tensor_set_value (t, i, cp_tensor_get_dtype (t) == CP_DTYPE_BOOL ? i % 2 : i % 97);
}

static void
check_bytes_must_match (CpDType       dtype,
                        const gint64 *shape,
                        guint         n_dims,
                        gint64        numel)
{
  g_autoptr(GBytes) bytes = g_bytes_new (NULL, 0);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) t = cp_tensor_new_from_bytes (dtype, shape, n_dims, bytes, &error);

  if (numel == 0)
    g_assert_no_error (error);
  else
    fuzz_assert_rejected (error);
}

/* Source linear index of view element @i of @view, which is @source
 * narrowed to [start, ...) along @dim. */
static gint64
source_index (CpTensor *source,
              CpTensor *view,
              guint     dim,
              gint64    start,
              gint64    i)
{
  guint n_dims;
  const gint64 *vshape = cp_tensor_get_shape (view, &n_dims);
  const gint64 *sshape = cp_tensor_get_shape (source, NULL);
  gint64 coords[8];
  gint64 index = 0;

  for (guint d = n_dims; d-- > 0;)
    {
      coords[d] = i % vshape[d];
      i /= vshape[d];
    }
  coords[dim] += start;
  for (guint d = 0; d < n_dims; d++)
    index = index * sshape[d] + coords[d];
  return index;
}

static CpTensor *
check_narrow (CpTensor  *t,
              FuzzInput *in)
{
  int dim = fuzz_take_i32 (in);
  gint64 start = fuzz_take_i64 (in);
  gint64 length = fuzz_take_i64 (in);
  int n = (int) cp_tensor_get_n_dims (t);
  g_autoptr(GError) error = NULL;
  CpTensor *view = cp_tensor_narrow (t, dim, start, length, &error);
  gboolean dim_exists = dim >= -n && dim < n;
  guint d = (guint) (dim < 0 ? dim + n : dim);
  gboolean valid = dim_exists && start >= 0 && length >= 0 &&
                   start <= cp_tensor_get_dim (t, (int) d) - length;

  if (!valid)
    {
      g_assert_null (view);
      fuzz_assert_rejected (error);
      return NULL;
    }
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_dim (view, (int) d), ==, length);
  for (gint64 i = 0; i < cp_tensor_get_numel (view); i++)
    g_assert_cmpfloat (cp_tensor_get_value (view, i), ==,
                       cp_tensor_get_value (t, source_index (t, view, d, start, i)));
  return view;
}

static void
check_shard_round_trip (CpTensor *t,
                        int       cp_size,
                        int       seq_dim)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpLayout) layout = NULL;
  g_autoptr(CpTensor) back = NULL;
  CpTensor *pieces[8] = { NULL };
  int n = (int) cp_tensor_get_n_dims (t);

  if (seq_dim < -n || seq_dim >= n)
    {
      g_autoptr(CpLayout) any = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 0, cp_size, NULL);

      g_assert_null (cp_layout_shard (any, t, seq_dim, 0, &error));
      fuzz_assert_rejected (error);
      return;
    }
  layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, cp_tensor_get_dim (t, seq_dim), cp_size, &error);
  if (layout == NULL)
    {
      fuzz_assert_rejected (error);
      return;
    }
  for (int r = 0; r < cp_size; r++)
    {
      pieces[r] = cp_layout_shard (layout, t, seq_dim, r, &error);
      g_assert_no_error (error);
    }
  back = cp_layout_unshard_pieces (layout, pieces, (guint) cp_size, seq_dim, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, t));
  for (int r = 0; r < cp_size; r++)
    g_object_unref (pieces[r]);
}

static void
check_copies (CpTensor *t)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) copy = cp_tensor_copy (t, &error);
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(CpTensor) from_bytes = NULL;
  guint n_dims;
  const gint64 *shape = cp_tensor_get_shape (t, &n_dims);

  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (copy, t));
  bytes = g_bytes_new (cp_tensor_get_data (t), cp_tensor_get_nbytes (t));
  from_bytes = cp_tensor_new_from_bytes (cp_tensor_get_dtype (t), shape, n_dims, bytes, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (from_bytes, t));
}

static void
check_tensor (CpTensor  *t,
              FuzzInput *in)
{
  g_autoptr(CpTensor) view = NULL;
  int cp_size;
  int seq_dim;

  for (gint64 i = 0; i < cp_tensor_get_numel (t); i++)
    g_assert_cmpfloat (cp_tensor_get_value (t, i), ==, 0.0);
  fill_pattern (t);
  view = check_narrow (t, in);
  cp_size = 1 + fuzz_take_u8 (in) % 8;
  seq_dim = (gint8) fuzz_take_u8 (in);
  check_shard_round_trip (view != NULL ? view : t, cp_size, seq_dim);
  check_copies (view != NULL ? view : t);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data,
                        size_t         size)
{
  FuzzInput in = { data, size };
  CpDType dtype = dtypes[fuzz_take_u8 (&in) % G_N_ELEMENTS (dtypes)];
  guint n_dims = fuzz_take_u8 (&in) % 10;
  gint64 shape[9];
  gint64 numel;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) t = NULL;

  fuzz_init ();
  for (guint i = 0; i < n_dims; i++)
    shape[i] = fuzz_take_i64 (&in);
  if (!shape_is_valid (dtype, shape, n_dims, &numel))
    {
      g_assert_null (cp_tensor_new (dtype, shape, n_dims, &error));
      fuzz_assert_rejected (error);
      return 0;
    }
  check_bytes_must_match (dtype, shape, n_dims, numel);
  if (numel > MAX_TEST_BYTES / (gint64) cp_dtype_get_size (dtype))
    return 0;
  t = cp_tensor_new (dtype, shape, n_dims, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_numel (t), ==, numel);
  g_assert_cmpmem (cp_tensor_get_shape (t, NULL), n_dims * sizeof (gint64), shape, n_dims * sizeof (gint64));
  check_tensor (t, &in);
  return 0;
}
