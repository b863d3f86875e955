/* test-cuda-memory.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * CUDA memory behind the memory interface.  Everywhere: with no usable
 * device (no driver, none present), moving a tensor to CUDA memory or
 * allocating there is CP_TENSOR_ERROR_DEVICE with CUDA's own text, never
 * a crash.  With a GPU: round trips, device-to-device and strided copies,
 * and fills, compared with the host.
 */

#include "config.h"

#include <string.h>

#include <cuda_runtime_api.h>

#include <libcpmesh.h>

#include "cp-memory-private.h"
#include "cp-tensor-private.h"
#include "kernels/cuda/cp-cuda-private.h"

/* The status cudaGetDeviceCount gives on this machine: cudaSuccess with
 * at least one device, or why not. */
static cudaError_t
device_status (void)
{
  int count = 0;
  cudaError_t status = cudaGetDeviceCount (&count);

  (void) cudaGetLastError ();
  if (status == cudaSuccess && count == 0)
    return cudaErrorNoDevice;
  return status;
}

static gboolean
skip_without_device (void)
{
  if (device_status () == cudaSuccess)
    return FALSE;
  g_test_skip ("no CUDA device");
  return TRUE;
}

static CpTensor *
patterned (CpDType dtype,
           gint64  rows,
           gint64  columns)
{
  const gint64 shape[] = { rows, columns };
  CpTensor *t = cp_tensor_new (dtype, shape, 2, NULL);
  guint8 *bytes = cp_tensor_get_data (t);

  for (gsize i = 0; i < cp_tensor_get_nbytes (t); i++)
    bytes[i] = (guint8) (i * 13 + 5);
  return t;
}

static void
test_no_device_to_device (void)
{
  cudaError_t status = device_status ();
  g_autoptr(CpTensor) t = patterned (CP_DTYPE_FLOAT32, 4, 4);
  g_autoptr(CpTensor) moved = NULL;
  g_autoptr(GError) error = NULL;

  if (status == cudaSuccess)
    {
      g_test_skip ("this machine has a CUDA device");
      return;
    }
  moved = cp_tensor_to_device (t, CP_DEVICE_KIND_CUDA, &error);
  g_assert_null (moved);
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
  g_assert_nonnull (strstr (error->message, "cudaGetDeviceCount"));
  if (status != cudaErrorNoDevice)
    g_assert_nonnull (strstr (error->message, cudaGetErrorString (status)));
}

static void
test_no_device_alloc (void)
{
  g_autoptr(GError) error = NULL;

  if (device_status () == cudaSuccess)
    {
      g_test_skip ("this machine has a CUDA device");
      return;
    }
  g_assert_null (_cp_memory_cuda_ops.alloc (64, TRUE, &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
  g_assert_nonnull (strstr (error->message, "64 bytes of CUDA memory"));
}

static void
test_round_trip (void)
{
  g_autoptr(CpTensor) host = patterned (CP_DTYPE_BFLOAT16, 37, 129);
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(CpTensor) copy = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(GError) error = NULL;

  if (skip_without_device ())
    return;
  device = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (device), ==, CP_DEVICE_KIND_CUDA);
  copy = cp_tensor_copy (device, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_tensor_get_device (copy), ==, CP_DEVICE_KIND_CUDA);
  back = cp_tensor_to_device (copy, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, host));
}

/* Columns 3 … 3 + 50 of every row, host → device → device → host. */
static void
test_copy_2d (void)
{
  g_autoptr(CpTensor) host = patterned (CP_DTYPE_UINT8, 20, 100);
  g_autoptr(CpTensor) a = NULL;
  g_autoptr(CpTensor) b = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(GError) error = NULL;
  const gint64 shape[] = { 20, 100 };
  const guint8 *want = cp_tensor_get_data (host);
  const guint8 *got;

  if (skip_without_device ())
    return;
  a = cp_tensor_to_device (host, CP_DEVICE_KIND_CUDA, &error);
  g_assert_no_error (error);
  b = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_UINT8, shape, 2, TRUE, &error);
  g_assert_no_error (error);
  _cp_memory_copy_2d (b, 3, 100, a, 3, 100, 50, 20, FALSE);
  _cp_memory_synchronize (b);
  back = cp_tensor_to_device (b, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  got = cp_tensor_get_data (back);
  for (gsize row = 0; row < 20; row++)
    for (gsize column = 0; column < 100; column++)
      g_assert_cmpuint (got[row * 100 + column], ==,
                        column >= 3 && column < 53 ? want[row * 100 + column] : 0);
}

static void
test_fill (void)
{
  const gint64 shape[] = { 1000 };
  g_autoptr(CpTensor) device = NULL;
  g_autoptr(CpTensor) back = NULL;
  g_autoptr(CpTensor) want = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, 2.5, NULL);
  g_autoptr(GError) error = NULL;

  if (skip_without_device ())
    return;
  device = _cp_tensor_new_on_device (CP_DEVICE_KIND_CUDA, CP_DTYPE_FLOAT32, shape, 1, FALSE, &error);
  g_assert_no_error (error);
  _cp_memory_fill (device, 0, 1000, 2.5);
  back = cp_tensor_to_device (device, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (back, want));
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Cuda/memory/no-device/to-device", test_no_device_to_device);
  g_test_add_func ("/Cp/Cuda/memory/no-device/alloc", test_no_device_alloc);
  g_test_add_func ("/Cp/Cuda/memory/round-trip", test_round_trip);
  g_test_add_func ("/Cp/Cuda/memory/copy-2d", test_copy_2d);
  g_test_add_func ("/Cp/Cuda/memory/fill", test_fill);

  return g_test_run ();
}
