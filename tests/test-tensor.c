/* test-tensor.c
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

static void
test_dtype_sizes (void)
{
  static const gsize sizes[] = { 1, 1, 4, 8, 2, 2, 4, 8 };

  for (guint i = 0; i < G_N_ELEMENTS (all_dtypes); i++)
    {
      CpDType back;

      g_assert_cmpuint (cp_dtype_get_size (all_dtypes[i]), ==, sizes[i]);
      g_assert_true (cp_dtype_from_name (cp_dtype_get_name (all_dtypes[i]), &back));
      g_assert_cmpint (back, ==, all_dtypes[i]);
    }
  g_assert_true (cp_dtype_is_floating (CP_DTYPE_BFLOAT16));
  g_assert_false (cp_dtype_is_floating (CP_DTYPE_INT64));
  g_assert_cmpstr (cp_dtype_get_name (CP_DTYPE_BFLOAT16), ==, "bfloat16");
}

static void
test_new_zeros (void)
{
  const gint64 shape[] = { 2, 3, 4 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) t = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, &error);
  const gint64 *got;
  guint n_dims;

  g_assert_no_error (error);
  got = cp_tensor_get_shape (t, &n_dims);
  g_assert_cmpuint (n_dims, ==, 3);
  g_assert_cmpmem (got, n_dims * sizeof (gint64), shape, sizeof shape);
  g_assert_cmpint (cp_tensor_get_numel (t), ==, 24);
  g_assert_cmpuint (cp_tensor_get_nbytes (t), ==, 96);
  g_assert_cmpint (cp_tensor_get_dim (t, -1), ==, 4);
  g_assert_cmpint (cp_tensor_get_device (t), ==, CP_DEVICE_KIND_HOST);
  g_assert_cmpuint (cp_tensor_get_data_address (t) % 64, ==, 0);
  for (gint64 i = 0; i < 24; i++)
    g_assert_cmpfloat (cp_tensor_get_value (t, i), ==, 0.0);
  g_assert_cmpint (cp_tensor_get_fd (t), ==, -1);
}

static void
test_new_large_aligned_and_zeroed (void)
{
  /* Large blocks come from the recycling cache: they must still be
   * zero-filled and aligned when reused. */
  const gint64 shape[] = { 1 << 20 };

  for (int round = 0; round < 3; round++)
    {
      g_autoptr(CpTensor) t = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL);
      float *data = cp_tensor_get_data (t);

      g_assert_cmpuint (cp_tensor_get_data_address (t) % 64, ==, 0);
      for (gint64 i = 0; i < shape[0]; i += 4099)
        g_assert_cmpfloat (data[i], ==, 0.0f);
      memset (data, 0x7f, cp_tensor_get_nbytes (t));
    }
}

static void
test_new_bad_shapes (void)
{
  const gint64 negative[] = { 2, -1 };
  const gint64 nine[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
  const gint64 huge[] = { G_MAXINT64 / 2, 4 };
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_new (CP_DTYPE_INT32, negative, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_new with a dimension of negative size");
  g_assert_nonnull (strstr (error->message, "negative size -1"));
  g_clear_error (&error);

  g_assert_null (cp_tensor_new (CP_DTYPE_INT32, nine, 9, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_new with 9 dimensions (at most 8)");
  g_assert_nonnull (strstr (error->message, "at most 8 dimensions, 9"));
  g_clear_error (&error);

  g_assert_null (cp_tensor_new (CP_DTYPE_INT64, huge, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_new whose element count × size overflows 64 bits");
  g_assert_nonnull (strstr (error->message, "overflows"));
}

static void
test_new_scalar (void)
{
  g_autoptr(CpTensor) t = cp_tensor_new_full (CP_DTYPE_INT64, NULL, 0, 42, NULL);

  g_assert_cmpuint (cp_tensor_get_n_dims (t), ==, 0);
  g_assert_cmpint (cp_tensor_get_numel (t), ==, 1);
  CP_TEST_ASSERT_VALUES (t, 42);
}

static void
test_from_bytes_no_copy (void)
{
  static const gint32 values[] = { 1, 2, 3, 4, 5, 6 };
  const gint64 shape[] = { 2, 3 };
  const gint64 wrong[] = { 4, 2 };
  g_autoptr(GBytes) bytes = g_bytes_new_static (values, sizeof values);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) t = cp_tensor_new_from_bytes (CP_DTYPE_INT32, shape, 2, bytes, &error);

  g_assert_no_error (error);
  g_assert_true (cp_tensor_get_data (t) == (gpointer) values);
  g_assert_cmpint (cp_storage_get_kind (cp_tensor_get_storage (t)), ==, CP_STORAGE_KIND_BYTES);
  CP_TEST_ASSERT_VALUES (t, 1, 2, 3, 4, 5, 6);

  g_assert_null (cp_tensor_new_from_bytes (CP_DTYPE_INT32, wrong, 2, bytes, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_new_from_bytes with fewer bytes than the shape needs");
  g_assert_nonnull (strstr (error->message, "needs 32 bytes, but 24 were given"));
}

/* An empty GBytes has no data pointer; an empty tensor over it is valid
 * and compares equal to any other empty tensor of its shape. */
static void
test_from_empty_bytes (void)
{
  const gint64 shape[] = { 0, 3 };
  g_autoptr(GBytes) bytes = g_bytes_new (NULL, 0);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) t = cp_tensor_new_from_bytes (CP_DTYPE_FLOAT32, shape, 2, bytes, &error);
  g_autoptr(CpTensor) other = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 2, NULL);
  g_autoptr(CpTensor) copy = NULL;

  g_assert_no_error (error);
  g_assert_null (cp_tensor_get_data (t));
  g_assert_cmpint (cp_tensor_get_numel (t), ==, 0);
  g_assert_true (cp_tensor_equal (t, other));
  copy = cp_tensor_copy (t, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (copy, t));
}

static void
count_release (gpointer user_data)
{
  (*(int *) user_data)++;
}

static void
test_borrowed_release (void)
{
  double memory[4] = { 1.5, 2.5, 3.5, 4.5 };
  const gint64 shape[] = { 4 };
  int released = 0;
  g_autoptr(GError) error = NULL;
  CpTensor *t = cp_tensor_new_borrowed (CP_DTYPE_FLOAT64, shape, 1, (guintptr) memory,
                                        sizeof memory, count_release, &released, NULL, &error);
  CpTensor *view;

  g_assert_no_error (error);
  cp_tensor_set_value (t, 2, -1.0);
  g_assert_cmpfloat (memory[2], ==, -1.0);
  view = cp_tensor_narrow (t, 0, 1, 2, &error);
  g_assert_no_error (error);
  g_object_unref (t);
  g_assert_cmpint (released, ==, 0); /* the view still uses the memory */
  CP_TEST_ASSERT_VALUES (view, 2.5, -1.0);
  g_object_unref (view);
  g_assert_cmpint (released, ==, 1);
}

static void
test_borrowed_misaligned (void)
{
  guint64 memory[3] = { 0 };
  const gint64 shape[] = { 2 };
  int released = 0;
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_new_borrowed (CP_DTYPE_INT64, shape, 1, (guintptr) memory + 4, 16,
                                         count_release, &released, NULL, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_MISALIGNED, "CpTensor",
                       "cp_tensor_new_borrowed with an address not aligned to the element size");
  g_assert_cmpint (released, ==, 1);
}

static void
test_arange_and_full (void)
{
  g_autoptr(CpTensor) a = cp_tensor_new_arange (CP_DTYPE_INT64, 0, 6, 1, NULL);
  g_autoptr(CpTensor) b = cp_tensor_new_arange (CP_DTYPE_FLOAT32, 10, 0, -3, NULL);
  g_autoptr(CpTensor) empty = cp_tensor_new_arange (CP_DTYPE_INT32, 5, 5, 1, NULL);
  const gint64 shape[] = { 2, 2 };
  g_autoptr(CpTensor) full = cp_tensor_new_full (CP_DTYPE_BOOL, shape, 2, 1.0, NULL);
  g_autoptr(CpTensor) labels = cp_tensor_new_full (CP_DTYPE_INT64, shape, 2, -100, NULL);
  g_autoptr(GError) error = NULL;

  CP_TEST_ASSERT_VALUES (a, 0, 1, 2, 3, 4, 5);
  CP_TEST_ASSERT_VALUES (b, 10, 7, 4, 1);
  g_assert_cmpint (cp_tensor_get_numel (empty), ==, 0);
  CP_TEST_ASSERT_VALUES (full, 1, 1, 1, 1);
  CP_TEST_ASSERT_VALUES (labels, -100, -100, -100, -100);

  g_assert_null (cp_tensor_new_arange (CP_DTYPE_INT64, 0, 5, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpTensor",
                       "cp_tensor_new_arange with step 0");
  g_clear_error (&error);

  /* Extreme bounds neither overflow nor allocate the impossible. */
  g_assert_null (cp_tensor_new_arange (CP_DTYPE_INT64, G_MININT64, G_MAXINT64, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_new_arange over the whole int64 range");
  g_clear_error (&error);
  {
    g_autoptr(CpTensor) two = cp_tensor_new_arange (CP_DTYPE_INT64, G_MAXINT64 - 1, G_MININT64, G_MININT64, &error);

    g_assert_no_error (error);
    g_assert_cmpint (cp_tensor_get_numel (two), ==, 2);
  }
  /* int64 values past 2^53, which a double cannot tell apart. */
  {
    const gint64 big = G_GINT64_CONSTANT (1) << 60;
    g_autoptr(CpTensor) large = cp_tensor_new_arange (CP_DTYPE_INT64, big, big + 4, 1, &error);
    const gint64 *values = cp_tensor_get_data (large);

    g_assert_no_error (error);
    for (gint64 i = 0; i < 4; i++)
      g_assert_cmpint (values[i], ==, big + i);
  }
}

static void
test_half_conversions (void)
{
  /* Values on both sides of rounding points, subnormals, overflow. */
  static const struct { double in; double f16; double bf16; } cases[] = {
    { 1.0, 1.0, 1.0 },
    { 65504.0, 65504.0, 65536.0 },
    { 65520.0, INFINITY, 65536.0 },
    { 1.0 + 1.0 / 2048.0, 1.0, 1.0 },                 /* ties to even */
    { 1.0 + 3.0 / 2048.0, 1.0 + 2.0 / 1024.0, 1.0 },
    { 5.960464477539063e-08, 5.960464477539063e-08, 5.960464477539063e-08 },
    { -2.5, -2.5, -2.5 },
    { 3.14159, 3.140625, 3.140625 },
  };
  const gint64 shape[] = { 1 };

  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr(CpTensor) h = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_FLOAT16, shape, 1,
                                                                     cases[i].in, NULL));
      g_autoptr(CpTensor) b = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_BFLOAT16, shape, 1,
                                                                     cases[i].in, NULL));

      g_assert_cmpfloat (cp_tensor_get_value (h, 0), ==, cases[i].f16);
      g_assert_cmpfloat (cp_tensor_get_value (b, 0), ==, cases[i].bf16);
    }
}

static void
test_copy_and_equal (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (all_dtypes); i++)
    {
      const gint64 shape[] = { 3, 5 };
      g_autoptr(CpTensor) t = cp_test_tensor_pattern (all_dtypes[i], shape, 2, i);
      g_autoptr(CpTensor) c = cp_tensor_copy (t, NULL);

      g_assert_true (cp_tensor_equal (t, c));
      g_assert_true (cp_tensor_get_storage (t) != cp_tensor_get_storage (c));
      cp_tensor_set_value (c, 14, all_dtypes[i] == CP_DTYPE_BOOL ? 1 - cp_tensor_get_value (c, 14) : 250);
      g_assert_false (cp_tensor_equal (t, c));
    }
}

static void
test_equal_distinguishes_shape_and_dtype (void)
{
  const gint64 a_shape[] = { 2, 3 };
  const gint64 b_shape[] = { 3, 2 };
  g_autoptr(CpTensor) a = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, a_shape, 2, NULL));
  g_autoptr(CpTensor) b = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, b_shape, 2, NULL));
  g_autoptr(CpTensor) c = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, a_shape, 2, NULL));

  g_assert_false (cp_tensor_equal (a, b));
  g_assert_false (cp_tensor_equal (a, c));
}

static void
test_narrow_view (void)
{
  const gint64 shape[] = { 4, 3 };
  g_autoptr(CpTensor) t = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 0);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) rows = cp_tensor_narrow (t, 0, 1, 2, &error);

  g_assert_no_error (error);
  g_assert_true (cp_tensor_get_storage (rows) == cp_tensor_get_storage (t));
  g_assert_cmpuint (cp_tensor_get_storage_offset (rows), ==, 3 * 8);
  cp_tensor_set_value (rows, 0, -7);
  g_assert_cmpfloat (cp_tensor_get_value (t, 3), ==, -7);
}

static void
test_narrow_copy (void)
{
  const gint64 shape[] = { 2, 4 };
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_INT32, 0, 8, 1, NULL));
  g_autoptr(CpTensor) m = NULL;
  g_autoptr(CpTensor) cols = NULL;
  g_autoptr(GError) error = NULL;

  m = cp_tensor_new_from_storage (CP_DTYPE_INT32, shape, 2, cp_tensor_get_storage (t), 0, &error);
  g_assert_no_error (error);
  cols = cp_tensor_narrow (m, 1, 1, 2, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_get_storage (cols) != cp_tensor_get_storage (m));
  CP_TEST_ASSERT_VALUES (cols, 1, 2, 5, 6);

  g_assert_null (cp_tensor_narrow (m, 1, 3, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpTensor",
                       "cp_tensor_narrow past the end of the dimension");
  g_assert_nonnull (strstr (error->message, "[3, 5) is outside dimension 1 of size 4"));
  g_clear_error (&error);
  g_assert_null (cp_tensor_narrow (m, 2, 0, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_narrow of a dimension that does not exist");
}

/* A start and length whose sum overflows int64 are refused without
 * computing that sum. */
static void
test_narrow_extreme_range (void)
{
  const gint64 shape[] = { 4 };
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new (CP_DTYPE_INT32, shape, 1, NULL));
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_narrow (t, 0, G_MAXINT64, G_MAXINT64, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpTensor",
                       "cp_tensor_narrow with a start and length whose sum overflows int64");
  g_assert_nonnull (strstr (error->message, "start 9223372036854775807 with length 9223372036854775807"));
  g_clear_error (&error);
  g_assert_null (cp_tensor_narrow (t, 0, -1, G_MININT64, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpTensor",
                       "cp_tensor_narrow with a negative start or length");
}

static void
test_from_storage_out_of_range (void)
{
  const gint64 shape[] = { 8 };
  g_autoptr(CpStorage) storage = cp_storage_new (16, NULL);
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_new_from_storage (CP_DTYPE_INT32, shape, 1, storage, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpTensor",
                       "cp_tensor_new_from_storage larger than the storage");
  g_clear_error (&error);
  g_assert_null (cp_tensor_new_from_storage (CP_DTYPE_INT32, shape, 0, storage, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_MISALIGNED, "CpTensor",
                       "cp_tensor_new_from_storage at an offset not aligned to the element size");
}

static void
test_to_device (void)
{
  const gint64 shape[] = { 2 };
  g_autoptr(CpTensor) t = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL);
  g_autoptr(CpTensor) same = cp_tensor_to_device (t, CP_DEVICE_KIND_HOST, NULL);
  g_autoptr(GError) error = NULL;

  g_assert_true (same == t);
  if (CP_HAS_CUDA)
    return;
  g_assert_null (cp_tensor_to_device (t, CP_DEVICE_KIND_CUDA, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor",
                       "cp_tensor_to_device to CUDA in a build without CUDA");
}

static void
count_notify (GObject    *object,
              GParamSpec *pspec,
              gpointer    user_data)
{
  (*(int *) user_data)++;
}

static void
test_requires_grad (void)
{
  const gint64 shape[] = { 2 };
  g_autoptr(CpTensor) t = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 1, NULL);
  int notified = 0;
  gboolean flag;

  g_signal_connect (t, "notify::requires-grad", G_CALLBACK (count_notify), &notified);
  g_assert_false (cp_tensor_get_requires_grad (t));
  cp_tensor_set_requires_grad (t, TRUE);
  cp_tensor_set_requires_grad (t, TRUE);
  g_object_get (t, "requires-grad", &flag, NULL);
  g_assert_true (flag);
  g_assert_cmpint (notified, ==, 1);
}

static void
test_dup_bytes_is_view (void)
{
  g_autoptr(CpTensor) t = cp_tensor_new_arange (CP_DTYPE_INT32, 0, 4, 1, NULL);
  g_autoptr(GBytes) bytes = cp_tensor_dup_bytes (t);
  gsize size;

  g_assert_true (g_bytes_get_data (bytes, &size) == cp_tensor_get_data (t));
  g_assert_cmpuint (size, ==, 16);
  g_clear_object (&t);
  g_assert_cmpint (((const gint32 *) g_bytes_get_data (bytes, NULL))[3], ==, 3);
}

static void
test_describe (void)
{
  const gint64 shape[] = { 2, 8 };
  g_autoptr(CpTensor) t = cp_tensor_new (CP_DTYPE_INT64, shape, 2, NULL);
  g_autofree char *text = cp_tensor_describe (t);

  g_assert_cmpstr (text, ==, "int64[2, 8] on host");
}

static void
test_bad_index_is_critical (void)
{
  if (g_test_subprocess ())
    {
      g_autoptr(CpTensor) t = cp_tensor_new_arange (CP_DTYPE_INT32, 0, 4, 1, NULL);

      cp_tensor_get_value (t, 4);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_failed ();
  g_test_trap_assert_stderr ("*CRITICAL*index >= 0 && index < self->numel*");
}

/* A tensor over a GBytes (read-only memory; a static array here, which
 * the compiler may place in a read-only page) is refused by every
 * operation that would write it, with CP_TENSOR_ERROR_READ_ONLY naming
 * the operation and the tensor, on every rank of a collective, before
 * anything is written. */
static const float read_only_values[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };

static CpTensor *
read_only_tensor (const gint64 *shape,
                  guint         n_dims)
{
  gint64 numel = 1;
  g_autoptr(GBytes) bytes = NULL;
  g_autoptr(GError) error = NULL;
  CpTensor *tensor;

  for (guint i = 0; i < n_dims; i++)
    numel *= shape[i];
  g_assert_cmpint (numel, <=, G_N_ELEMENTS (read_only_values));
  bytes = g_bytes_new_static (read_only_values, (gsize) numel * sizeof (float));
  tensor = cp_tensor_new_from_bytes (CP_DTYPE_FLOAT32, shape, n_dims, bytes, &error);

  g_assert_no_error (error);
  g_assert_true (cp_storage_get_read_only (cp_tensor_get_storage (tensor)));
  return tensor;
}

static void
assert_read_only_error (GError     *error,
                        const char *needle,
                        const char *what)
{
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_READ_ONLY, "CpTensor", what);
  if (strstr (error->message, needle) == NULL || strstr (error->message, "read-only") == NULL)
    g_error ("\"%s\" does not contain \"%s\" and \"read-only\"", error->message, needle);
}

static void
assert_read_only_untouched (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (read_only_values); i++)
    g_assert_cmpfloat (read_only_values[i], ==, (float) (i + 1));
}

static void
read_only_collectives_rank (CpMesh   *mesh,
                            gpointer  user_data)
{
  const gint64 shape[] = { 8 };
  const gint64 gathered_shape[] = { 16 };
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) read_only = read_only_tensor (shape, 1);
  /* Host memory like the GBytes: one collective moves one kind. */
  g_autoptr(CpTensor) writable = cp_tensor_new_arange (CP_DTYPE_FLOAT32, 0, 8, 1, NULL);
  g_autoptr(CpTensor) gathered = read_only_tensor (shape, 1);
  g_autoptr(CpTensor) out = NULL;
  g_autoptr(GError) error = NULL;

  /* Every rank's tensor read-only, then only rank 1's: every rank fails. */
  g_assert_false (cp_mesh_all_reduce (mesh, read_only, CP_REDUCE_OP_SUM, &error));
  assert_read_only_error (error, "all_reduce: the tensor (float32[8] on host)",
                          "cp_mesh_all_reduce into a tensor over a GBytes (every rank fails)");
  g_clear_error (&error);
  g_assert_false (cp_mesh_all_reduce (mesh, rank == 1 ? read_only : writable, CP_REDUCE_OP_SUM,
                                      &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_READ_ONLY);
  g_clear_error (&error);
  CP_TEST_ASSERT_VALUES (writable, 0, 1, 2, 3, 4, 5, 6, 7);

  /* broadcast writes every rank's tensor but the root's. */
  g_assert_true (cp_mesh_broadcast (mesh, rank == 0 ? read_only : writable, 0, &error));
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (rank == 0 ? read_only : writable, 1, 2, 3, 4, 5, 6, 7, 8);
  g_assert_false (cp_mesh_broadcast (mesh, rank == 1 ? read_only : writable, 0, &error));
  assert_read_only_error (error, "broadcast: the tensor",
                          "cp_mesh_broadcast into a tensor over a GBytes on a rank other than the "
                          "root (every rank fails)");
  g_clear_error (&error);

  out = read_only_tensor (gathered_shape, 1);
  g_clear_object (&gathered);
  g_assert_false (cp_mesh_all_gather_into (mesh, writable, 0, out, &error));
  assert_read_only_error (error, "all_gather: the output",
                          "cp_mesh_all_gather_into an output over a GBytes (every rank fails)");
  g_clear_error (&error);

  g_assert_false (cp_mesh_send_recv (mesh, writable, 1 - rank, read_only, 1 - rank, 3, &error));
  assert_read_only_error (error, "send_recv: the receive tensor",
                          "cp_mesh_send_recv into a tensor over a GBytes");
  g_clear_error (&error);
  if (rank == 0)
    {
      g_assert_false (cp_mesh_recv (mesh, read_only, 1, 4, &error));
      assert_read_only_error (error, "recv: the tensor", "cp_mesh_recv into a tensor over a GBytes");
    }
  assert_read_only_untouched ();
}

static void
test_read_only_collectives (void)
{
  cp_test_run_group ("cp", 2, read_only_collectives_rank, NULL);
}

static void
test_read_only_layout_outputs (void)
{
  const gint64 full_shape[] = { 8 };
  const gint64 piece_shape[] = { 4 };
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 8, 2, NULL);
  g_autoptr(CpTensor) full = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_FLOAT32, 0, 8, 1, NULL));
  g_autoptr(CpTensor) read_only_piece = read_only_tensor (piece_shape, 1);
  g_autoptr(CpTensor) read_only_full = read_only_tensor (full_shape, 1);
  CpTensor *pieces[2];
  g_autoptr(GError) error = NULL;

  g_assert_false (cp_layout_shard_into (layout, full, 0, 1, read_only_piece, &error));
  assert_read_only_error (error, "shard: the output (float32[4] on host)",
                          "cp_layout_shard_into an output over a GBytes");
  g_clear_error (&error);
  for (int r = 0; r < 2; r++)
    pieces[r] = cp_layout_shard (layout, full, 0, r, NULL);
  g_assert_false (cp_layout_unshard_pieces_into (layout, pieces, 2, 0, read_only_full, &error));
  assert_read_only_error (error, "unshard_pieces: the output",
                          "cp_layout_unshard_pieces_into an output over a GBytes");
  for (int r = 0; r < 2; r++)
    g_object_unref (pieces[r]);
  assert_read_only_untouched ();
}

/* Views of a read-only tensor are read-only; copies are new memory, and
 * writable. */
static void
test_read_only_views (void)
{
  const gint64 shape[] = { 2, 4 };
  const gint64 flat[] = { 8 };
  g_autoptr(CpTensor) read_only = read_only_tensor (shape, 2);
  g_autoptr(CpTensor) row = cp_tensor_narrow (read_only, 0, 1, 1, NULL);
  g_autoptr(CpTensor) reshaped = cp_tensor_reshape (read_only, flat, 1, NULL);
  g_autoptr(CpTensor) copy = cp_tensor_copy (read_only, NULL);

  g_assert_true (cp_storage_get_read_only (cp_tensor_get_storage (row)));
  g_assert_true (cp_storage_get_read_only (cp_tensor_get_storage (reshaped)));
  g_assert_false (cp_storage_get_read_only (cp_tensor_get_storage (copy)));
  CP_TEST_ASSERT_VALUES (row, 5, 6, 7, 8);
  CP_TEST_ASSERT_VALUES (copy, 1, 2, 3, 4, 5, 6, 7, 8);
  /* A copy can be written. */
  cp_tensor_set_value (copy, 0, 10);
  CP_TEST_ASSERT_VALUES (copy, 10, 2, 3, 4, 5, 6, 7, 8);
  assert_read_only_untouched ();
}

static void
test_set_value_read_only_is_critical (void)
{
  if (g_test_subprocess ())
    {
      const gint64 shape[] = { 8 };
      g_autoptr(CpTensor) t = read_only_tensor (shape, 1);

      cp_tensor_set_value (t, 0, 9);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_failed ();
  g_test_trap_assert_stderr ("*CRITICAL*!cp_storage_get_read_only (self->storage)*");
}

/* Operations that write into an output the caller gives must write all
 * of it: the outputs start as garbage, so a position they skip shows. */
static void
garbage_outputs_rank (CpMesh   *mesh,
                      gpointer  user_data)
{
  const gint64 shape[] = { 2, 3 };
  const gint64 gathered_shape[] = { 4, 3 };
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpTensor) mine = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_INT32, 6 * rank,
                                                                      6 * rank + 6, 1, NULL));
  g_autoptr(CpTensor) piece = cp_tensor_reshape (mine, shape, 2, NULL);
  g_autoptr(CpTensor) gathered = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT32, gathered_shape,
                                                                        2, -77, NULL));
  g_autoptr(CpTensor) received = cp_test_on_device (cp_tensor_new_full (CP_DTYPE_INT32, shape, 2,
                                                                        -77, NULL));
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_mesh_all_gather_into (mesh, piece, 0, gathered, &error));
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (gathered, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
  g_assert_true (cp_mesh_send_recv (mesh, piece, 1 - rank, received, 1 - rank, 5, &error));
  g_assert_no_error (error);
  if (rank == 0)
    CP_TEST_ASSERT_VALUES (received, 6, 7, 8, 9, 10, 11);
  else
    CP_TEST_ASSERT_VALUES (received, 0, 1, 2, 3, 4, 5);
}

static void
test_garbage_outputs (void)
{
  cp_test_run_group ("cp", 2, garbage_outputs_rank, NULL);
}

/* reshape is a view: the same storage and offset, another shape of the
 * same element count, one dimension inferred from -1. */
static void
test_reshape_view (void)
{
  const gint64 shape[] = { 2, 3, 4 };
  const gint64 six_by_any[] = { 6, -1 };
  const gint64 flat[] = { -1 };
  const gint64 scalar_shape[] = { 1 };
  g_autoptr(CpTensor) t = cp_test_on_device (cp_tensor_new_arange (CP_DTYPE_INT32, 0, 24, 1, NULL));
  g_autoptr(CpTensor) base = NULL;
  g_autoptr(CpTensor) view = NULL;
  g_autoptr(CpTensor) tail = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(CpTensor) scalar = NULL;
  g_autoptr(GError) error = NULL;

  base = cp_tensor_reshape (t, shape, 3, &error);
  g_assert_no_error (error);
  cp_tensor_set_requires_grad (base, TRUE);
  view = cp_tensor_reshape (base, six_by_any, 2, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_SHAPE (view, 6, 4);
  g_assert_true (cp_tensor_get_storage (view) == cp_tensor_get_storage (t));
  g_assert_cmpuint (cp_tensor_get_storage_offset (view), ==, 0);
  g_assert_true (cp_tensor_get_requires_grad (view));
  g_assert_cmpfloat (cp_tensor_get_value (view, 23), ==, 23);

  /* A view of a narrowed view keeps its offset; writes show in both. */
  tail = cp_tensor_narrow (t, 0, 20, 4, &error);
  g_assert_no_error (error);
  back = cp_tensor_reshape (tail, (const gint64[]) { 2, 2 }, 2, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (cp_tensor_get_storage_offset (back), ==, 20 * sizeof (gint32));
  CP_TEST_ASSERT_VALUES (back, 20, 21, 22, 23);
  cp_tensor_set_value (back, 3, -7);
  g_assert_cmpfloat (cp_tensor_get_value (view, 23), ==, -7);
  g_clear_object (&view);
  view = cp_tensor_reshape (base, flat, 1, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_SHAPE (view, 24);

  /* A 0-d tensor and [1] reshape into each other. */
  scalar = cp_tensor_reshape (back, scalar_shape, 1, &error);
  g_assert_null (scalar);
  g_clear_error (&error);
  g_clear_object (&view);
  view = cp_tensor_new_full (CP_DTYPE_FLOAT32, NULL, 0, 3.5, NULL);
  scalar = cp_tensor_reshape (view, scalar_shape, 1, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_SHAPE (scalar, 1);
  CP_TEST_ASSERT_VALUES (scalar, 3.5);
}

static void
test_reshape_errors (void)
{
  const gint64 shape[] = { 2, 3, 4 };
  const gint64 five_by_five[] = { 5, 5 };
  const gint64 two_inferred[] = { -1, 2, -1 };
  const gint64 negative[] = { 4, -3 };
  const gint64 seven_by_any[] = { 7, -1 };
  const gint64 nine[] = { 1, 1, 1, 1, 1, 1, 1, 1, 24 };
  const gint64 empty[] = { 0, 5 };
  const gint64 zero_by_any[] = { 0, -1 };
  g_autoptr(CpTensor) t = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, NULL);
  g_autoptr(CpTensor) none = cp_tensor_new (CP_DTYPE_FLOAT32, empty, 2, NULL);
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_reshape (t, five_by_five, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_reshape to a shape of another element count");
  cp_test_assert_message (error, "reshape: a tensor of shape [2, 3, 4] (24 elements) cannot be "
                                 "reshaped to [5, 5]");
  g_clear_error (&error);
  g_assert_null (cp_tensor_reshape (t, two_inferred, 3, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_reshape with two dimensions of -1");
  cp_test_assert_message (error, "shape [-1, 2, -1] has -1 in dimensions 0 and 2");
  g_clear_error (&error);
  g_assert_null (cp_tensor_reshape (t, negative, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_reshape with a negative size other than -1");
  cp_test_assert_message (error, "dimension 1 of shape [4, -3] has negative size -3");
  g_clear_error (&error);
  g_assert_null (cp_tensor_reshape (t, seven_by_any, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_reshape whose -1 cannot be inferred (24 elements, [7, -1])");
  cp_test_assert_message (error, "cannot be reshaped to [7, -1]: no size of the -1 dimension");
  g_clear_error (&error);
  g_assert_null (cp_tensor_reshape (t, nine, 9, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_reshape to 9 dimensions (at most 8)");
  g_clear_error (&error);
  g_assert_null (cp_tensor_reshape (none, zero_by_any, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE, "CpTensor",
                       "cp_tensor_reshape of an empty tensor to [0, -1] (any size fits)");
  cp_test_assert_message (error, "the -1 dimension could be any size next to a 0");
}

/* Any number of threads may read one tensor at once, since reading
 * changes nothing in it: the four ranks of a group shard it, copy it,
 * narrow it (to a view and to a copy), take its bytes, gather it over the
 * mesh, unshard it and rebuild it from shared pieces, over and over, and
 * every result is exact against values computed here.  Run under
 * ThreadSanitizer in the multi-rank suite. */
#define READ_C 4
#define READ_S 16

typedef struct
{
  CpTensor *shared;             /* [2, READ_S, 3], element (b, s, h) = 1000b + 10s + h */
  CpLayout *layout;
  CpTensor *pieces[READ_C];     /* every rank's piece, read by every rank */
} ReadCase;

static double
read_value (gint64 b,
            gint64 s,
            gint64 h)
{
  return (double) (1000 * b + 10 * s + h);
}

/* Where the head-tail layout of @length positions over READ_C ranks puts
 * the @j-th position of rank @rank: chunk rank, then chunk 2·C−1−rank. */
static gint64
head_tail_position (gint64 length,
                    int    rank,
                    gint64 j)
{
  gint64 k = length / (2 * READ_C);

  return j < k ? rank * k + j : (2 * READ_C - 1 - rank) * k + (j - k);
}

/* Asserts that @tensor [B, n, 3] holds read_value (b, @position (s), h). */
static void
assert_read_values (CpTensor *tensor,
                    gint64    n,
                    gint64  (*position) (gint64 s, gpointer data),
                    gpointer  data)
{
  gint64 rows = cp_tensor_get_dim (tensor, 0);

  g_assert_cmpint (cp_tensor_get_dim (tensor, 1), ==, n);
  for (gint64 b = 0; b < rows; b++)
    for (gint64 s = 0; s < n; s++)
      for (gint64 h = 0; h < 3; h++)
        g_assert_cmpfloat (cp_tensor_get_value (tensor, (b * n + s) * 3 + h), ==,
                           read_value (b % 2, position (s, data), h));
}

static gint64
piece_position (gint64   s,
                gpointer data)
{
  return head_tail_position (READ_S, GPOINTER_TO_INT (data), s);
}

static gint64
offset_position (gint64   s,
                 gpointer data)
{
  return s + GPOINTER_TO_INT (data);
}

/* Every rank's piece is the whole shared tensor: position p of the
 * unsharded sequence is position j of a piece. */
static gint64
unsharded_position (gint64   p,
                    gpointer data)
{
  gint64 k = READ_C * READ_S / (2 * READ_C);

  return p / k < READ_C ? p % k : k + p % k;
}

static void
reader_rank (CpMesh   *mesh,
             gpointer  user_data)
{
  const ReadCase *c = user_data;
  int rank = cp_mesh_get_rank (mesh);

  for (int i = 0; i < 50; i++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) piece = cp_layout_shard (c->layout, c->shared, 1, rank, &error);
      g_autoptr(CpTensor) copy = cp_tensor_copy (c->shared, &error);
      g_autoptr(CpTensor) view = cp_tensor_narrow (c->shared, 0, 1, 1, &error);
      g_autoptr(CpTensor) cut = cp_tensor_narrow (c->shared, 1, 3, 5, &error);
      g_autoptr(CpTensor) on_host = cp_tensor_to_device (c->shared, CP_DEVICE_KIND_HOST, &error);
      g_autoptr(GBytes) bytes = cp_tensor_dup_bytes (on_host);
      g_autoptr(CpTensor) gathered = cp_mesh_all_gather (mesh, c->shared, 0, &error);
      g_autoptr(CpTensor) unsharded = cp_mesh_unshard (mesh, c->shared, 1, &error);
      g_autoptr(CpTensor) rebuilt = cp_layout_unshard_pieces (c->layout, (CpTensor **) c->pieces,
                                                              READ_C, 1, &error);

      g_assert_no_error (error);
      assert_read_values (piece, READ_S / READ_C, piece_position, GINT_TO_POINTER (rank));
      g_assert_true (cp_tensor_equal (copy, c->shared));
      g_assert_true (cp_tensor_get_storage (view) == cp_tensor_get_storage (c->shared));
      g_assert_cmpfloat (cp_tensor_get_value (view, 0), ==, read_value (1, 0, 0));
      assert_read_values (cut, 5, offset_position, GINT_TO_POINTER (3));
      g_assert_cmpmem (g_bytes_get_data (bytes, NULL), g_bytes_get_size (bytes),
                       cp_tensor_get_data (on_host), cp_tensor_get_nbytes (on_host));
      assert_read_values (on_host, READ_S, offset_position, GINT_TO_POINTER (0));
      CP_TEST_ASSERT_SHAPE (gathered, 2 * READ_C, READ_S, 3);
      assert_read_values (gathered, READ_S, offset_position, GINT_TO_POINTER (0));
      assert_read_values (unsharded, READ_C * READ_S, unsharded_position, NULL);
      g_assert_true (cp_tensor_equal (rebuilt, c->shared));
    }
}

static void
test_concurrent_reads (void)
{
  const gint64 shape[] = { 2, READ_S, 3 };
  g_autoptr(CpTensor) values = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, NULL);
  g_autoptr(CpTensor) shared = NULL;
  g_autoptr(CpTensor) before = NULL;
  ReadCase c = { NULL, cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, READ_S, READ_C, NULL) };

  for (gint64 i = 0; i < 2 * READ_S * 3; i++)
    cp_tensor_set_value (values, i, read_value (i / (READ_S * 3), i / 3 % READ_S, i % 3));
  shared = c.shared = cp_test_on_device (g_steal_pointer (&values));
  before = cp_tensor_copy (shared, NULL);
  for (int r = 0; r < READ_C; r++)
    c.pieces[r] = cp_layout_shard (c.layout, shared, 1, r, NULL);
  cp_test_run_group ("cp", READ_C, reader_rank, &c);
  g_assert_true (cp_tensor_equal (shared, before));
  for (int r = 0; r < READ_C; r++)
    g_object_unref (c.pieces[r]);
  cp_layout_unref (c.layout);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Tensor/dtype/sizes", test_dtype_sizes);
  g_test_add_func ("/Cp/Tensor/new/zeros", test_new_zeros);
  g_test_add_func ("/Cp/Tensor/new/large-aligned-zeroed", test_new_large_aligned_and_zeroed);
  g_test_add_func ("/Cp/Tensor/new/bad-shapes", test_new_bad_shapes);
  g_test_add_func ("/Cp/Tensor/new/scalar", test_new_scalar);
  g_test_add_func ("/Cp/Tensor/from-bytes/no-copy", test_from_bytes_no_copy);
  g_test_add_func ("/Cp/Tensor/borrowed/release", test_borrowed_release);
  g_test_add_func ("/Cp/Tensor/borrowed/misaligned", test_borrowed_misaligned);
  g_test_add_func ("/Cp/Tensor/arange-full/values", test_arange_and_full);
  g_test_add_func ("/Cp/Tensor/dtype/half-conversions", test_half_conversions);
  g_test_add_func ("/Cp/Tensor/copy/equal", test_copy_and_equal);
  g_test_add_func ("/Cp/Tensor/equal/shape-dtype", test_equal_distinguishes_shape_and_dtype);
  g_test_add_func ("/Cp/Tensor/narrow/view", test_narrow_view);
  g_test_add_func ("/Cp/Tensor/narrow/copy", test_narrow_copy);
  g_test_add_func ("/Cp/Tensor/narrow/extreme-range", test_narrow_extreme_range);
  g_test_add_func ("/Cp/Tensor/from-bytes/empty", test_from_empty_bytes);
  g_test_add_func ("/Cp/Tensor/from-storage/out-of-range", test_from_storage_out_of_range);
  g_test_add_func ("/Cp/Tensor/to-device/host", test_to_device);
  g_test_add_func ("/Cp/Tensor/requires-grad/notify", test_requires_grad);
  g_test_add_func ("/Cp/Tensor/dup-bytes/view", test_dup_bytes_is_view);
  g_test_add_func ("/Cp/Tensor/describe/text", test_describe);
  cp_test_add_func_in_process ("/Cp/Tensor/value/bad-index", test_bad_index_is_critical);
  g_test_add_func ("/Cp/Tensor/threads/concurrent-reads", test_concurrent_reads);
  g_test_add_func ("/Cp/Tensor/read-only/collectives", test_read_only_collectives);
  g_test_add_func ("/Cp/Tensor/read-only/layout-outputs", test_read_only_layout_outputs);
  g_test_add_func ("/Cp/Tensor/read-only/views", test_read_only_views);
  cp_test_add_func_in_process ("/Cp/Tensor/read-only/set-value", test_set_value_read_only_is_critical);
  g_test_add_func ("/Cp/Tensor/reshape/view", test_reshape_view);
  g_test_add_func ("/Cp/Tensor/outputs/garbage-first", test_garbage_outputs);
  g_test_add_func ("/Cp/Tensor/reshape/errors", test_reshape_errors);

  return g_test_run ();
}
