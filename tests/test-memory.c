/* test-memory.c: the memory interface, and test memory that only it can reach
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdlib.h>
#include <string.h>

#include "cp-memory-private.h"
#include "cp-storage-private.h"
#include "cp-tensor-private.h"
#include "cp-test-util.h"

#define ROWS 6
#define COLS 10

/* A float32 [ROWS, COLS] tensor on @device, element (r, c) = 100r + c + @seed. */
static CpTensor *
numbered_tensor (CpDeviceKind device,
                 double       seed)
{
  const gint64 shape[] = { ROWS, COLS };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 2, &error);
  CpTensor *tensor;

  g_assert_no_error (error);
  for (gint64 r = 0; r < ROWS; r++)
    for (gint64 c = 0; c < COLS; c++)
      cp_tensor_set_value (host, r * COLS + c, 100 * r + c + seed);
  tensor = cp_tensor_to_device (host, device, &error);
  g_assert_no_error (error);
  return tensor;
}

static CpTensor *
to_host (CpTensor *tensor)
{
  g_autoptr(GError) error = NULL;
  CpTensor *host = cp_tensor_to_device (tensor, CP_DEVICE_KIND_HOST, &error);

  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (host), ==, CP_DEVICE_KIND_HOST);
  return host;
}

static void
test_to_device_round_trip (void)
{
  g_autoptr(CpTensor) host = numbered_tensor (CP_DEVICE_KIND_HOST, 0);
  g_autoptr(CpTensor) test = NULL;
  g_autoptr(CpTensor) same = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(GError) error = NULL;

  g_test_summary ("Host to test memory and back keeps every byte; test memory reads and "
                  "writes single values through the memory interface");

  cp_tensor_set_requires_grad (host, TRUE);
  test = cp_tensor_to_device (host, CP_DEVICE_KIND_TEST, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (test), ==, CP_DEVICE_KIND_TEST);
  g_assert_true (cp_tensor_get_requires_grad (test));
  g_assert_cmpuint (cp_tensor_get_data_address (test), !=, cp_tensor_get_data_address (host));
  g_assert_cmpfloat (cp_tensor_get_value (test, 3 * COLS + 7), ==, 307);

  same = cp_tensor_to_device (test, CP_DEVICE_KIND_TEST, &error);
  g_assert_no_error (error);
  g_assert_true (same == test);

  cp_tensor_set_value (test, 0, -1);
  back = to_host (test);
  g_assert_cmpfloat (cp_tensor_get_value (back, 0), ==, -1);
  cp_tensor_set_value (back, 0, 0);
  g_assert_true (cp_tensor_equal (back, host));
}

static void
test_to_device_empty (void)
{
  const gint64 shape[] = { 0, 4 };
  g_autoptr(CpTensor) host = cp_tensor_new (CP_DTYPE_INT64, shape, 2, NULL);
  g_autoptr(CpTensor) test = cp_tensor_to_device (host, CP_DEVICE_KIND_TEST, NULL);
  g_autoptr(CpTensor) back = to_host (test);

  g_assert_cmpint (cp_tensor_get_numel (test), ==, 0);
  g_assert_true (cp_tensor_equal (back, host));
}

/* Tensors on test memory compare, copy and narrow like host ones. */
static void
test_tensor_operations (void)
{
  g_autoptr(CpTensor) host = numbered_tensor (CP_DEVICE_KIND_HOST, 0);
  g_autoptr(CpTensor) test = numbered_tensor (CP_DEVICE_KIND_TEST, 0);
  g_autoptr(CpTensor) other = numbered_tensor (CP_DEVICE_KIND_TEST, 1);
  g_autoptr(CpTensor) copy = NULL;
  g_autoptr(CpTensor) narrow = NULL;
  g_autoptr(CpTensor) narrow_host = NULL;
  g_autoptr(CpTensor) narrow_back = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_tensor_equal (test, test));
  g_assert_false (cp_tensor_equal (test, other));
  g_assert_false (cp_tensor_equal (test, host)); /* another device */

  copy = cp_tensor_copy (test, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (copy), ==, CP_DEVICE_KIND_TEST);
  g_assert_true (cp_tensor_equal (copy, test));

  narrow = cp_tensor_narrow (test, 1, 3, 4, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (narrow), ==, CP_DEVICE_KIND_TEST);
  narrow_host = cp_tensor_narrow (host, 1, 3, 4, &error);
  g_assert_no_error (error);
  narrow_back = to_host (narrow);
  g_assert_true (cp_tensor_equal (narrow_back, narrow_host));
}

static void
test_fill (gconstpointer data)
{
  CpDeviceKind device = GPOINTER_TO_INT (data);
  const gint64 shape[] = { 33 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) tensor = _cp_tensor_new_on_device (device, CP_DTYPE_BFLOAT16, shape, 1,
                                                         TRUE, &error);
  g_autoptr(CpTensor) host = NULL;

  g_test_summary ("A fill converts the value to the dtype once and repeats it over the range, "
                  "leaving the bytes around it alone");

  g_assert_no_error (error);
  g_assert_true (_cp_memory_fill (tensor, 2 * 2, 29, 1.5, &error));
  g_assert_true (_cp_memory_synchronize (tensor, &error));
  host = to_host (tensor);
  for (gint64 i = 0; i < 33; i++)
    g_assert_cmpfloat (cp_tensor_get_value (host, i), ==, i >= 2 && i < 31 ? 1.5 : 0);
}

typedef struct
{
  CpDeviceKind dst;
  CpDeviceKind src;
} Pair;

static const Pair pairs[] = {
  { CP_DEVICE_KIND_HOST, CP_DEVICE_KIND_HOST },
  { CP_DEVICE_KIND_TEST, CP_DEVICE_KIND_HOST },
  { CP_DEVICE_KIND_HOST, CP_DEVICE_KIND_TEST },
  { CP_DEVICE_KIND_TEST, CP_DEVICE_KIND_TEST },
};

/* Columns 2..6 of rows 1..4 of the source land at column 3 of rows 0..3
 * of the destination; every other destination byte stays as it was. */
static void
test_copy_2d (gconstpointer data)
{
  const Pair *pair = data;
  g_autoptr(CpTensor) src = numbered_tensor (pair->src, 0);
  g_autoptr(CpTensor) dst = numbered_tensor (pair->dst, 5000);
  g_autoptr(CpTensor) result = NULL;
  const gsize elsize = sizeof (float), pitch = COLS * elsize;
  g_autoptr(GError) error = NULL;

  g_test_summary ("A strided 2-D copy moves a block between host and test memory in every "
                  "direction and touches nothing outside it");

  g_assert_true (_cp_memory_copy_2d (dst, 0 * pitch + 3 * elsize, pitch, src,
                                     1 * pitch + 2 * elsize, pitch, 5 * elsize, 4, FALSE, &error));
  g_assert_no_error (error);
  result = to_host (dst);
  for (gint64 r = 0; r < ROWS; r++)
    for (gint64 c = 0; c < COLS; c++)
      {
        gboolean inside = r < 4 && c >= 3 && c < 8;
        double want = inside ? 100 * (r + 1) + (c - 1) : 100 * r + c + 5000;

        g_assert_cmpfloat (cp_tensor_get_value (result, r * COLS + c), ==, want);
      }
}

static void
test_download_upload (void)
{
  g_autoptr(CpTensor) test = numbered_tensor (CP_DEVICE_KIND_TEST, 0);
  float row[COLS];
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_memory_download (row, test, 2 * COLS * sizeof (float), sizeof row, &error));
  for (guint c = 0; c < COLS; c++)
    g_assert_cmpfloat (row[c], ==, 200 + c);
  row[0] = -7;
  g_assert_true (_cp_memory_upload (test, 5 * COLS * sizeof (float), row, sizeof row, &error));
  g_assert_no_error (error);
  g_assert_cmpfloat (cp_tensor_get_value (test, 5 * COLS), ==, -7);
  g_assert_cmpfloat (cp_tensor_get_value (test, 5 * COLS + 1), ==, 201);
}

/* How a 2-D copy is issued: one contiguous copy where the rows follow
 * each other, one 2-D copy where the memory's copy takes the pitches, one
 * copy a row where it does not (a repeated source row, pitch 0, or a
 * pitch above the limit). */
static void
test_plan_2d (void)
{
  const gsize max = CP_MEMORY_TEST_MAX_PITCH;

  g_test_summary ("The 2-D copy planner issues a copy a row where a device's 2-D copy would "
                  "refuse the pitches, and one copy otherwise");

  g_assert_cmpint (_cp_memory_plan_2d (0, 4, 64, 64, max), ==, CP_MEMORY_PLAN_NOTHING);
  g_assert_cmpint (_cp_memory_plan_2d (64, 0, 64, 64, max), ==, CP_MEMORY_PLAN_NOTHING);
  g_assert_cmpint (_cp_memory_plan_2d (64, 1, 0, 0, max), ==, CP_MEMORY_PLAN_ONE_ROW);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, 64, 64, max), ==, CP_MEMORY_PLAN_ONE_ROW);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, 128, 64, max), ==, CP_MEMORY_PLAN_2D);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, max, max, max), ==, CP_MEMORY_PLAN_2D);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, 128, 0, max), ==, CP_MEMORY_PLAN_ROWS);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, 0, 128, max), ==, CP_MEMORY_PLAN_ROWS);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, 128, 32, max), ==, CP_MEMORY_PLAN_ROWS);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, max + 1, 64, max), ==, CP_MEMORY_PLAN_ROWS);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, 64, max + 1, max), ==, CP_MEMORY_PLAN_ROWS);
  g_assert_cmpint (_cp_memory_plan_2d (64, 4, G_MAXSIZE, 64, 0), ==, CP_MEMORY_PLAN_2D);
}

/* Test memory's own 2-D copy refuses what cudaMemcpy2DAsync refuses. */
static void
test_pitch_rules (void)
{
  g_autoptr(CpTensor) test = numbered_tensor (CP_DEVICE_KIND_TEST, 0);
  guint8 *address = cp_tensor_get_data (test);
  g_autoptr(GError) error = NULL;

  g_test_summary ("Test memory's 2-D copy, like a CUDA device's, refuses a pitch below the "
                  "width or above its limit, with an error");

  g_assert_false (_cp_memory_test_ops.copy_2d (0, address, 40, address + 120, 0, 40, 2,
                                               CP_MEMORY_DEVICE_TO_DEVICE, FALSE, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpMemory",
                       "a 2-D copy with a source pitch of 0 in test memory");
  g_assert_nonnull (strstr (error->message, "source pitch 0"));
  g_clear_error (&error);
  g_assert_false (_cp_memory_test_ops.copy_2d (0, address, CP_MEMORY_TEST_MAX_PITCH + 1,
                                               address, 40, 40, 2, CP_MEMORY_DEVICE_TO_DEVICE,
                                               FALSE, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpMemory",
                       "a 2-D copy with a pitch above the limit in test memory");
  g_clear_error (&error);
  g_assert_true (_cp_memory_test_ops.copy_2d (0, address, 0, address + 120, 0, 40, 1,
                                              CP_MEMORY_DEVICE_TO_DEVICE, FALSE, &error));
  g_assert_no_error (error);
}

/* A source pitch of 0 repeats one row, as batch preparation expands
 * [1, S] position ids, in every memory. */
static void
test_repeated_row (gconstpointer data)
{
  CpDeviceKind device = GPOINTER_TO_INT (data);
  const gint64 shape[] = { 4, 12 };
  g_autoptr(CpTensor) row = numbered_tensor (device, 0);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) out = _cp_tensor_new_on_device (device, CP_DTYPE_FLOAT32, shape, 2, TRUE,
                                                      &error);
  g_autoptr(CpTensor) host = NULL;

  g_test_summary ("A 2-D copy whose source rows do not advance repeats the row in host and "
                  "test memory");

  g_assert_no_error (error);
  g_assert_true (_cp_memory_copy_2d (out, sizeof (float), 12 * sizeof (float), row,
                                     COLS * sizeof (float), 0, COLS * sizeof (float), 4, FALSE,
                                     &error));
  g_assert_no_error (error);
  host = to_host (out);
  for (gint64 r = 0; r < 4; r++)
    for (gint64 c = 0; c < 12; c++)
      g_assert_cmpfloat (cp_tensor_get_value (host, r * 12 + c), ==,
                         c >= 1 && c <= COLS ? 100 + c - 1 : 0);
}

/* Narrowing a [3, W] tensor whose rows are further apart than test
 * memory's 2-D copy takes: one copy a row. */
static void
test_wide_pitch (void)
{
  const gsize width = CP_MEMORY_TEST_MAX_PITCH + 64;
  const gint64 shape[] = { 3, (gint64) width };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = cp_tensor_new (CP_DTYPE_UINT8, shape, 2, &error);
  g_autoptr(CpTensor) test = NULL;
  g_autoptr(CpTensor) narrow = NULL;
  g_autoptr(CpTensor) back = NULL;

  g_test_summary ("A copy whose pitch is above the memory's limit still copies every row");

  g_assert_no_error (error);
  for (gint64 r = 0; r < 3; r++)
    for (gint64 c = 0; c < 16; c++)
      cp_tensor_set_value (host, r * (gint64) width + 100 + c, (double) (r * 16 + c + 1));
  test = cp_tensor_to_device (host, CP_DEVICE_KIND_TEST, &error);
  g_assert_no_error (error);
  narrow = cp_tensor_narrow (test, 1, 100, 16, &error);
  g_assert_no_error (error);
  back = to_host (narrow);
  for (gint64 i = 0; i < 3 * 16; i++)
    g_assert_cmpfloat (cp_tensor_get_value (back, i), ==, (double) (i + 1));
}

/* A layout copies runs through copy_runs between host and test memory
 * whose rows are further apart than test memory's 2-D copy takes. */
static void
test_wide_pitch_shard (void)
{
  const gint64 seq_len = (gint64) CP_MEMORY_TEST_MAX_PITCH / 2 + 8;
  const gint64 shape[] = { 2, seq_len, 4 };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = cp_tensor_new_arange (CP_DTYPE_INT32, 0, 2 * seq_len * 4, 1, &error);
  g_autoptr(CpTensor) full = NULL;
  g_autoptr(CpTensor) test = NULL;
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, seq_len, 2, &error);

  g_test_summary ("Sharding along a sequence whose rows are further apart than a device's "
                  "2-D copy takes gives the host's shard");

  g_assert_no_error (error);
  full = cp_tensor_new_from_storage (CP_DTYPE_INT32, shape, 3, cp_tensor_get_storage (host), 0,
                                     &error);
  g_assert_no_error (error);
  test = cp_tensor_to_device (full, CP_DEVICE_KIND_TEST, &error);
  g_assert_no_error (error);
  for (int rank = 0; rank < 2; rank++)
    {
      g_autoptr(CpTensor) want = cp_layout_shard (layout, full, 1, rank, &error);
      g_autoptr(CpTensor) got = cp_layout_shard (layout, test, 1, rank, &error);
      g_autoptr(CpTensor) got_host = NULL;

      g_assert_no_error (error);
      got_host = to_host (got);
      g_assert_true (cp_tensor_equal (got_host, want));
    }
}

#define N_NEIGHBOURS 32

static CpTensor *
test_pages (gint64 n_pages)
{
  const gint64 shape[] = { n_pages * 1024 };
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = _cp_tensor_new_on_device (CP_DEVICE_KIND_TEST, CP_DTYPE_INT32, shape, 1,
                                               TRUE, &error);

  g_assert_no_error (error);
  return tensor;
}

/* Test memory maps often abut, so that one tensor's first byte is where
 * another's mapping ends: each tensor's kernels must still compute on its
 * own bytes.  A freed page-sized tensor leaves a hole that the writable
 * twin of a two-page tensor fills, while its other mapping lands just
 * before the page-sized tensor allocated after the freed one. */
static void
test_kernel_address_neighbours (void)
{
  g_autoptr(GPtrArray) kept = g_ptr_array_new_with_free_func (g_object_unref);

  for (guint i = 0; i < N_NEIGHBOURS; i++)
    {
      g_autoptr(CpTensor) first = test_pages (1);
      CpTensor *freed = test_pages (1);

      g_ptr_array_add (kept, test_pages (1));
      g_object_unref (freed);
      g_ptr_array_add (kept, test_pages (2));
    }
  for (guint i = 0; i < kept->len; i++)
    *(gint32 *) _cp_memory_kernel_address (kept->pdata[i]) = (gint32) i;
  for (guint i = 0; i < kept->len; i++)
    g_assert_cmpfloat (cp_tensor_get_value (kept->pdata[i], 0), ==, i);
}

static void
test_to_device_cuda (void)
{
  g_autoptr(CpTensor) host = numbered_tensor (CP_DEVICE_KIND_HOST, 0);
  g_autoptr(GError) error = NULL;

  if (CP_HAS_CUDA)
    {
      g_test_skip ("this build has CUDA");
      return;
    }
  g_assert_null (cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor",
                       "cp_tensor_to_device to CUDA in a build without CUDA");
  g_assert_nonnull (strstr (error->message, "float32[6, 10] on host"));
  g_assert_nonnull (strstr (error->message, "to cuda memory"));
  g_assert_nonnull (strstr (error->message, "host and test memory"));
}

/* A CUDA tensor imported through DLPack by a build without CUDA cannot be
 * read, so it cannot be moved either. */
static void
test_to_device_from_unreachable (void)
{
  const gint64 shape[] = { 4 };
  g_autoptr(CpStorage) storage = _cp_storage_new_dlpack (CP_DEVICE_KIND_CUDA, 0, 0x7f0000010000,
                                                         16, NULL, NULL);
  g_autoptr(CpTensor) cuda = cp_tensor_new_from_storage (CP_DTYPE_FLOAT32, shape, 1, storage, 0,
                                                         NULL);
  g_autoptr(GError) error = NULL;

  if (CP_HAS_CUDA)
    {
      g_test_skip ("this build has CUDA");
      return;
    }
  g_assert_null (cp_tensor_to_device (cuda, CP_DEVICE_KIND_TEST, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor",
                       "cp_tensor_to_device of CUDA memory in a build without CUDA");
  g_assert_nonnull (strstr (error->message, "float32[4] on cuda"));
  g_assert_nonnull (strstr (error->message, "host or test memory"));
}

/* Test memory has no DLPack device type: no framework may read it. */
static void
test_no_dlpack (void)
{
  g_autoptr(CpTensor) test = numbered_tensor (CP_DEVICE_KIND_TEST, 0);
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_to_dlpack (test, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor",
                       "cp_tensor_to_dlpack of a tensor in test memory");
  g_assert_cmpstr (error->message, ==, "a float32 tensor in test memory has no DLPack device type");
}

static void
test_require_device (void)
{
  g_autoptr(CpTensor) test = numbered_tensor (CP_DEVICE_KIND_TEST, 0);
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_tensor_require_device (test, "op", "'x'", CP_DEVICE_KINDS_REACHABLE, NULL));
  g_assert_false (_cp_tensor_require_device (test, "op", "'x'", CP_DEVICE_KINDS_HOST, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpTensor",
                       "an operation on host memory given a tensor in test memory");
  g_assert_cmpstr (error->message, ==,
                   "op: 'x' (float32[6, 10] on test) is in test memory, which this operation "
                   "cannot reach; it works on host memory");
}

/* A layout shards and restores tensors in test memory into test memory,
 * and reads THD bounds from it. */
static void
test_layout_on_test_memory (void)
{
  g_autoptr(CpTensor) host = numbered_tensor (CP_DEVICE_KIND_HOST, 0);
  g_autoptr(CpTensor) test = numbered_tensor (CP_DEVICE_KIND_TEST, 0);
  g_autoptr(CpLayout) thd = NULL;
  g_autoptr(CpLayout) thd_host = NULL;
  g_autoptr(GError) error = NULL;
  const gint64 bounds_shape[] = { 3 };
  g_autoptr(CpTensor) bounds = cp_tensor_new (CP_DTYPE_INT32, bounds_shape, 1, NULL);
  g_autoptr(CpTensor) test_bounds = NULL;
  CpTensor *pieces[2] = { NULL, NULL };
  g_autoptr(CpTensor) restored = NULL;
  g_autoptr(CpTensor) restored_host = NULL;
  g_autoptr(CpLayout) halves = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, COLS - 2, 2, NULL);
  g_autoptr(CpTensor) narrow = cp_tensor_narrow (test, 1, 0, COLS - 2, NULL);
  g_autoptr(CpTensor) narrow_host = cp_tensor_narrow (host, 1, 0, COLS - 2, NULL);

  for (int r = 0; r < 2; r++)
    {
      pieces[r] = cp_layout_shard (halves, narrow, 1, r, &error);
      g_assert_no_error (error);
      g_assert_cmpint (cp_tensor_get_device (pieces[r]), ==, CP_DEVICE_KIND_TEST);
    }
  restored = cp_layout_unshard_pieces (halves, pieces, 2, 1, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (restored), ==, CP_DEVICE_KIND_TEST);
  restored_host = to_host (restored);
  g_assert_true (cp_tensor_equal (restored_host, narrow_host));
  g_clear_object (&pieces[0]);
  g_clear_object (&pieces[1]);

  cp_tensor_set_value (bounds, 1, 4);
  cp_tensor_set_value (bounds, 2, 12);
  test_bounds = cp_tensor_to_device (bounds, CP_DEVICE_KIND_TEST, NULL);
  thd = cp_layout_new_thd_from_tensor (test_bounds, 2, &error);
  g_assert_no_error (error);
  thd_host = cp_layout_new_thd_from_tensor (bounds, 2, NULL);
  g_assert_true (cp_layout_equal (thd, thd_host));
}

/* Attention computes where q is, with a kernel for that memory (the CPU
 * kernel computes on host and test memory, none on CUDA memory in this
 * build), and its results are where q is; k must be there too. */
static void
attention_rank (CpMesh   *mesh,
                gpointer  unused)
{
  const gint64 shape[] = { 1, 2, 4, 8 };
  g_autoptr(CpTensor) host = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 4, NULL);
  g_autoptr(CpTensor) test = cp_tensor_to_device (host, CP_DEVICE_KIND_TEST, NULL);
  g_autoptr(CpStorage) storage = _cp_storage_new_dlpack (CP_DEVICE_KIND_CUDA, 0, 0x7f0000010000,
                                                         256, NULL, NULL);
  g_autoptr(CpTensor) cuda = cp_tensor_new_from_storage (CP_DTYPE_FLOAT32, shape, 4, storage, 0,
                                                         NULL);
  g_autoptr(CpAttention) attention = cp_attention_new (mesh, NULL, NULL);
  g_autoptr(CpTensor) out = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_attention_forward (attention, test, test, test, &out, NULL, &error));
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (out), ==, CP_DEVICE_KIND_TEST);
  g_clear_object (&out);
  if (!CP_HAS_CUDA)
    {
      g_assert_false (cp_attention_forward (attention, cuda, cuda, cuda, &out, NULL, &error));
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpAttention",
                           "forward with q in memory no attention kernel computes on");
      g_assert_nonnull (strstr (error->message, "q (float32[1, 2, 4, 8] on cuda)"));
      g_clear_error (&error);
    }
  g_assert_false (cp_attention_forward (attention, host, test, host, &out, NULL, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpAttention",
                       "forward with k in other memory than q");
  g_assert_nonnull (strstr (error->message, "works on host memory"));
  g_assert_null (out);
}

static void
test_attention_device (void)
{
  GList *meshes = cp_test_local_group ("cp", 1);

  cp_test_run_ranks (meshes, attention_rank, NULL);
  cp_test_free_group (meshes);
}

/* Messages in test memory cross through host copies: rank 0 sends its
 * tensor to rank 1, which receives it into a tensor in test memory. */
static void
message_rank (CpMesh   *mesh,
              gpointer  unused)
{
  g_autoptr(CpTensor) sent = numbered_tensor (CP_DEVICE_KIND_TEST, 0);
  g_autoptr(CpTensor) received = numbered_tensor (CP_DEVICE_KIND_TEST, 5000);
  g_autoptr(GError) error = NULL;

  if (cp_mesh_get_rank (mesh) == 0)
    g_assert_true (cp_mesh_send (mesh, sent, 1, 7, &error));
  else
    g_assert_true (cp_mesh_recv (mesh, received, 0, 7, &error));
  g_assert_no_error (error);
  if (cp_mesh_get_rank (mesh) == 1)
    g_assert_true (cp_tensor_equal (received, sent));
}

static void
test_messages (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  cp_test_run_ranks (meshes, message_rank, NULL);
  cp_test_free_group (meshes);
}

/* What a host shortcut looks like: generic code summing a tensor through
 * its address instead of through the memory interface. */
static double
sum_through_address (CpTensor *tensor)
{
  const volatile float *values = cp_tensor_get_data (tensor);
  double sum = 0;

  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    sum += values[i];
  return sum;
}

static void
test_host_shortcut_crashes (void)
{
  g_test_summary ("Code that dereferences the address of a tensor in test memory dies at the "
                  "first byte, while the same code on host memory works: this is how the test "
                  "device catches host shortcuts above the memory interface");

  if (g_test_subprocess ())
    {
      g_autoptr(CpTensor) host = numbered_tensor (CP_DEVICE_KIND_HOST, 0);
      g_autoptr(CpTensor) test = numbered_tensor (CP_DEVICE_KIND_TEST, 0);

      g_assert_cmpfloat (sum_through_address (host), >, 0);
      g_printerr ("host shortcut on host memory: fine\n");
      sum_through_address (test);
      g_printerr ("host shortcut on test memory: not caught\n");
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_failed ();
  g_test_trap_assert_stderr ("*host shortcut on host memory: fine*");
  g_test_trap_assert_stderr_unmatched ("*not caught*");
}

/* Ids are what a peer caches mappings by: each storage keeps its own for
 * its lifetime, and no later storage gets one again, even at the address
 * of one freed before it. */
#define ID_THREADS 4
#define IDS_PER_THREAD 2000

static gpointer
make_ids (gpointer ids)
{
  for (int i = 0; i < IDS_PER_THREAD; i++)
    {
      g_autoptr(CpStorage) storage = cp_storage_new_borrowed (0x1000, 16, NULL, NULL, NULL);

      ((guint64 *) ids)[i] = _cp_storage_get_id (storage);
    }
  return NULL;
}

static gint
compare_ids (gconstpointer a,
             gconstpointer b)
{
  guint64 x = *(const guint64 *) a, y = *(const guint64 *) b;

  return x < y ? -1 : x > y;
}

static void
test_storage_id (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpStorage) kept = cp_storage_new (64, &error);
  guint64 id = _cp_storage_get_id (kept);
  g_autofree guint64 *ids = g_new0 (guint64, ID_THREADS * IDS_PER_THREAD);
  GThread *threads[ID_THREADS];

  g_assert_no_error (error);
  g_assert_cmpuint (id, !=, 0);
  for (int t = 0; t < ID_THREADS; t++)
    threads[t] = g_thread_new ("ids", make_ids, ids + t * IDS_PER_THREAD);
  for (int t = 0; t < ID_THREADS; t++)
    g_thread_join (threads[t]);
  qsort (ids, ID_THREADS * IDS_PER_THREAD, sizeof (guint64), compare_ids);
  for (int i = 0; i < ID_THREADS * IDS_PER_THREAD; i++)
    {
      g_assert_cmpuint (ids[i], !=, 0);
      g_assert_cmpuint (ids[i], !=, id);
      if (i > 0)
        g_assert_cmpuint (ids[i], >, ids[i - 1]);
    }
  /* Stable: the same storage answers the same, after all the others. */
  g_assert_cmpuint (_cp_storage_get_id (kept), ==, id);
}

static void
note_released (gpointer released)
{
  *(gboolean *) released = TRUE;
}

/* A region names a tensor's bytes through its storage and keeps that
 * storage, not the tensor, alive until it is cleared. */
static void
test_region_keeps_storage (void)
{
  static float values[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  const gint64 shape[] = { 6 };
  gboolean released = FALSE;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) whole = cp_tensor_new_borrowed (CP_DTYPE_FLOAT32, (const gint64[]) { 8 }, 1,
                                                      GPOINTER_TO_SIZE (values), sizeof values,
                                                      note_released, &released, NULL, &error);
  CpTensor *view;
  CpRegion region = CP_REGION_NONE;
  guint64 id;

  g_assert_no_error (error);
  g_assert_false (_cp_region_is_set (&region));
  g_assert_null (_cp_region_get_address (&region));
  g_assert_cmpuint (_cp_region_get_storage_id (&region), ==, 0);
  view = cp_tensor_narrow (whole, 0, 2, 6, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_dim (view, 0), ==, shape[0]);
  id = _cp_storage_get_id (cp_tensor_get_storage (whole));
  _cp_tensor_get_region (view, &region);
  g_assert_true (_cp_region_is_set (&region));
  g_assert_true (region.storage == cp_tensor_get_storage (whole));
  g_assert_cmpuint (region.offset, ==, 2 * sizeof (float));
  g_assert_cmpuint (region.length, ==, 6 * sizeof (float));
  g_assert_cmpint (region.device, ==, CP_DEVICE_KIND_HOST);
  g_assert_true (_cp_region_get_address (&region) == &values[2]);
  g_assert_cmpuint (_cp_region_get_storage_id (&region), ==, id);

  g_object_unref (view);
  g_clear_object (&whole);
  g_assert_false (released);
  g_assert_cmpfloat (((float *) _cp_region_get_address (&region))[0], ==, 2.0f);
  _cp_region_clear (&region);
  g_assert_true (released);
  g_assert_false (_cp_region_is_set (&region));
}

/* The region-level calls take storage and offsets, no tensor: a copy
 * between two regions of test memory and host memory lands where the
 * offsets say. */
static void
test_region_copy (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpStorage) device = _cp_storage_new_on_device (CP_DEVICE_KIND_TEST, 64, TRUE, &error);
  guint8 host[64], back[16];
  CpRegion on_device = CP_REGION_NONE, on_host = CP_REGION_NONE;

  g_assert_no_error (error);
  for (int i = 0; i < 64; i++)
    host[i] = (guint8) i;
  _cp_region_init (&on_device, device, 16, 32);
  _cp_region_init_host (&on_host, host, sizeof host);
  g_assert_cmpint (on_device.device, ==, CP_DEVICE_KIND_TEST);
  g_assert_true (_cp_memory_copy_2d_region (&on_device, 4, 8, &on_host, 10, 20, 4, 2, FALSE, &error));
  g_assert_no_error (error);
  g_assert_true (_cp_memory_download_region (back, &on_device, 0, sizeof back, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (back, 4, ((guint8[]) { 0, 0, 0, 0 }), 4);
  g_assert_cmpmem (back + 4, 4, ((guint8[]) { 10, 11, 12, 13 }), 4);
  g_assert_cmpmem (back + 12, 4, ((guint8[]) { 30, 31, 32, 33 }), 4);
  g_assert_true (_cp_memory_fill_region (&on_device, 0, CP_DTYPE_UINT8, 2, 9.0, &error));
  g_assert_true (_cp_memory_download_region (back, &on_device, 0, 2, &error));
  g_assert_no_error (error);
  g_assert_cmpmem (back, 2, ((guint8[]) { 9, 9 }), 2);
  _cp_region_clear (&on_device);
  _cp_region_clear (&on_host);
}

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Memory/to-device/round-trip", test_to_device_round_trip);
  g_test_add_func ("/Cp/Memory/to-device/empty", test_to_device_empty);
  g_test_add_func ("/Cp/Memory/to-device/cuda", test_to_device_cuda);
  g_test_add_func ("/Cp/Memory/to-device/unreachable", test_to_device_from_unreachable);
  g_test_add_func ("/Cp/Memory/tensor/operations", test_tensor_operations);
  g_test_add_data_func ("/Cp/Memory/fill/host", GINT_TO_POINTER (CP_DEVICE_KIND_HOST), test_fill);
  g_test_add_data_func ("/Cp/Memory/fill/test", GINT_TO_POINTER (CP_DEVICE_KIND_TEST), test_fill);
  g_test_add_data_func ("/Cp/Memory/copy-2d/host-to-host", &pairs[0], test_copy_2d);
  g_test_add_data_func ("/Cp/Memory/copy-2d/host-to-test", &pairs[1], test_copy_2d);
  g_test_add_data_func ("/Cp/Memory/copy-2d/test-to-host", &pairs[2], test_copy_2d);
  g_test_add_data_func ("/Cp/Memory/copy-2d/test-to-test", &pairs[3], test_copy_2d);
  g_test_add_func ("/Cp/Memory/transfer/download-upload", test_download_upload);
  g_test_add_func ("/Cp/Memory/copy-2d/plan", test_plan_2d);
  g_test_add_func ("/Cp/Memory/copy-2d/test-pitch-rules", test_pitch_rules);
  g_test_add_data_func ("/Cp/Memory/copy-2d/repeated-row/host",
                        GINT_TO_POINTER (CP_DEVICE_KIND_HOST), test_repeated_row);
  g_test_add_data_func ("/Cp/Memory/copy-2d/repeated-row/test",
                        GINT_TO_POINTER (CP_DEVICE_KIND_TEST), test_repeated_row);
  g_test_add_func ("/Cp/Memory/copy-2d/wide-pitch", test_wide_pitch);
  g_test_add_func ("/Cp/Memory/layout/wide-pitch", test_wide_pitch_shard);
  g_test_add_func ("/Cp/Memory/kernel-address/neighbours", test_kernel_address_neighbours);
  g_test_add_func ("/Cp/Memory/require-device/message", test_require_device);
  g_test_add_func ("/Cp/Memory/to-device/no-dlpack", test_no_dlpack);
  g_test_add_func ("/Cp/Memory/layout/test-memory", test_layout_on_test_memory);
  g_test_add_func ("/Cp/Memory/attention/device", test_attention_device);
  g_test_add_func ("/Cp/Memory/mesh/messages", test_messages);
  g_test_add_func ("/Cp/Storage/id/stable-unique", test_storage_id);
  g_test_add_func ("/Cp/Region/lifetime/keeps-storage", test_region_keeps_storage);
  g_test_add_func ("/Cp/Region/copy/offsets", test_region_copy);
  cp_test_add_func_in_process ("/Cp/Memory/test-device/host-shortcut-crashes",
                               test_host_shortcut_crashes);

  return g_test_run ();
}
