/* test-cuda-layout.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * CpLayout's shard and unshard on CUDA tensors, through the public API
 * and the memory interface, against the same calls on host tensors:
 * bit-exact.  Exits 77 (skipped) where no CUDA device is present.
 */

#include "config.h"

#include <libcpmesh.h>

#include "cp-test-gpu.h"


static CpTensor *
patterned (const gint64 *shape,
           guint         n_dims)
{
  CpTensor *t = cp_tensor_new (CP_DTYPE_FLOAT32, shape, n_dims, NULL);
  float *values = cp_tensor_get_data (t);

  for (gint64 i = 0; i < cp_tensor_get_numel (t); i++)
    values[i] = (float) (i * 3 % 1021);
  return t;
}

static CpTensor *
on (CpTensor     *tensor,
    CpDeviceKind  device)
{
  g_autoptr(GError) error = NULL;
  CpTensor *moved = cp_tensor_to_device (tensor, device, &error);

  g_assert_no_error (error);
  return moved;
}

/* Every rank's shard on CUDA equals the host's; the CUDA pieces unshard
 * to the original. */
static void
check_layout (CpLayout *layout,
              int       cp_size,
              CpTensor *host,
              int       seq_dim)
{
  g_autoptr(CpTensor) device = on (host, CP_DEVICE_KIND_CUDA);
  g_autoptr(GPtrArray) pieces = g_ptr_array_new_with_free_func (g_object_unref);
  g_autoptr(CpTensor) whole = NULL;
  g_autoptr(CpTensor) whole_host = NULL;
  g_autoptr(GError) error = NULL;

  for (int rank = 0; rank < cp_size; rank++)
    {
      g_autoptr(CpTensor) want = cp_layout_shard (layout, host, seq_dim, rank, &error);
      CpTensor *got;
      g_autoptr(CpTensor) got_host = NULL;

      g_assert_no_error (error);
      got = cp_layout_shard (layout, device, seq_dim, rank, &error);
      g_assert_no_error (error);
      g_assert_cmpint (cp_tensor_get_device (got), ==, CP_DEVICE_KIND_CUDA);
      got_host = on (got, CP_DEVICE_KIND_HOST);
      g_assert_true (cp_tensor_equal (got_host, want));
      g_ptr_array_add (pieces, got);
    }
  whole = cp_layout_unshard_pieces (layout, (CpTensor **) pieces->pdata, pieces->len, seq_dim, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (whole), ==, CP_DEVICE_KIND_CUDA);
  whole_host = on (whole, CP_DEVICE_KIND_HOST);
  g_assert_true (cp_tensor_equal (whole_host, host));
}

static void
test_balanced (void)
{
  const gint64 shapes[][3] = { { 48, 4, 6 }, { 4, 48, 6 }, { 4, 6, 48 } };

  for (int seq_dim = 0; seq_dim < 3; seq_dim++)
    for (int cp_size = 1; cp_size <= 4; cp_size++)
      for (int balance = CP_LOAD_BALANCE_HEAD_TAIL; balance <= CP_LOAD_BALANCE_CONTIGUOUS; balance++)
        {
          g_autoptr(GError) error = NULL;
          g_autoptr(CpLayout) layout = cp_layout_new (balance, 48, cp_size, &error);
          g_autoptr(CpTensor) host = patterned (shapes[seq_dim], 3);

          g_assert_no_error (error);
          check_layout (layout, cp_size, host, seq_dim);
        }
}

static void
test_documents (void)
{
  const gint64 bounds[] = { 0, 16, 16, 24, 48 };
  const gint64 shape[] = { 48, 2, 8 };

  for (int cp_size = 1; cp_size <= 4; cp_size *= 2)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpLayout) layout = cp_layout_new_thd (bounds, G_N_ELEMENTS (bounds), cp_size, &error);
      g_autoptr(CpTensor) host = patterned (shape, 3);

      g_assert_no_error (error);
      check_layout (layout, cp_size, host, 0);
    }
}

int
main (int   argc,
      char *argv[])
{
  cp_test_require_cuda_device ();
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Cuda/layout/balanced", test_balanced);
  g_test_add_func ("/Cp/Cuda/layout/documents", test_documents);

  return g_test_run ();
}
