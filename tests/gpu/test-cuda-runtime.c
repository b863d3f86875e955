/* test-cuda-runtime.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * The CUDA probe on whatever machine runs it.  Without a driver (the CPU
 * machines), the runtime still loads: the driver version is 0, there are
 * no devices, and the error is CP_MESH_ERROR_NO_DEVICE with CUDA's own
 * text for the status cudaGetDeviceCount returned.  With a GPU, the
 * probe finds it.
 */

#include "config.h"

#include <cuda_runtime_api.h>

#include <libcpmesh.h>

#include "kernels/cuda/cp-cuda-kernels-private.h"
#include "kernels/cuda/cp-cuda-private.h"

static gboolean
machine_has_driver (void)
{
  int version = 0;

  return cudaDriverGetVersion (&version) == cudaSuccess && version > 0;
}

static void
test_probe_without_driver (void)
{
  CpCudaInfo info;
  g_autoptr(GError) error = NULL;
  int count = 0;
  cudaError_t status;

  if (machine_has_driver ())
    {
      g_test_skip ("this machine has a CUDA driver");
      return;
    }
  status = cudaGetDeviceCount (&count);
  (void) cudaGetLastError ();

  g_assert_false (_cp_cuda_probe (&info, &error));
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_NO_DEVICE);
  g_assert_cmpint (info.driver_version, ==, 0);
  g_assert_cmpint (info.device_count, ==, -1);
  g_assert_cmpint (info.runtime_version, >=, 13000);
  g_assert_cmpint (status, !=, cudaSuccess);
  g_assert_nonnull (strstr (error->message, "no CUDA device: cudaGetDeviceCount"));
  g_assert_nonnull (strstr (error->message, cudaGetErrorString (status)));
  g_assert_nonnull (strstr (error->message, cudaGetErrorName (status)));
#if CP_HAS_NCCL
  g_assert_cmpint (info.nccl_version, >=, 20000);
#endif
}

static void
test_probe_with_driver (void)
{
  CpCudaInfo info;
  g_autoptr(GError) error = NULL;

  if (!machine_has_driver ())
    {
      g_test_skip ("this machine has no CUDA driver");
      return;
    }
  if (!_cp_cuda_probe (&info, &error))
    {
      /* A driver without a device (or an unusable one) is still a clean
       * error. */
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_NO_DEVICE);
      g_assert_cmpint (info.device_count, ==, -1);
      return;
    }
  g_assert_no_error (error);
  g_assert_cmpint (info.device_count, >=, 1);
  g_assert_cmpint (info.driver_version, >=, 13000);
}

/* A failed status becomes the asked-for domain and code with CUDA's
 * name and text; success sets nothing. */
static void
test_check (void)
{
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_cuda_check (cudaSuccess, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "x", &error));
  g_assert_no_error (error);
  g_assert_false (_cp_cuda_check (cudaErrorMemoryAllocation, CP_TENSOR_ERROR,
                                  CP_TENSOR_ERROR_DEVICE, "cudaMallocAsync of 64 bytes", &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
  g_assert_nonnull (strstr (error->message, "cudaMallocAsync of 64 bytes failed: "));
  g_assert_nonnull (strstr (error->message, cudaGetErrorString (cudaErrorMemoryAllocation)));
  g_assert_nonnull (strstr (error->message, "(cudaErrorMemoryAllocation)"));
}

/* Position ids of runs that reach outside the documents are refused
 * before anything is launched (so this needs no device), never left
 * unwritten; a fill of a width no dtype has is refused as well. */
static void
test_launchers_refuse (void)
{
  const gint64 bounds[] = { 0, 8, 16 };
  const cp_index_run outside[] = { { 12, 8 } };
  const guint8 pattern[16] = { 0 };

  g_assert_cmpint (_cp_cuda_position_ids (NULL, 1, outside, 1, bounds, 2, true, NULL), ==,
                   cudaErrorInvalidValue);
  g_assert_cmpint (_cp_cuda_fill (NULL, 4, pattern, 3, NULL), ==, cudaErrorInvalidValue);
  g_assert_cmpint (_cp_cuda_fill (NULL, 0, pattern, 8, NULL), ==, cudaSuccess);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Cuda/probe/without-driver", test_probe_without_driver);
  g_test_add_func ("/Cp/Cuda/probe/with-driver", test_probe_with_driver);
  g_test_add_func ("/Cp/Cuda/check/error-text", test_check);
  g_test_add_func ("/Cp/Cuda/launchers/refuse", test_launchers_refuse);

  return g_test_run ();
}
