/* cp-cuda-runtime.c: probing the CUDA runtime and reporting its errors
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <cuda_runtime_api.h>

#include "cp-error.h"
#include "cp-features.h"
#include "cp-cuda-private.h"

gboolean
_cp_cuda_check (int          status,
                GQuark       domain,
                int          code,
                const char  *what,
                GError     **error)
{
  if (status == cudaSuccess)
    return TRUE;
  /* A failed call is also the runtime's "last error"; clear it so the
   * next, unrelated check does not see it again. */
  (void) cudaGetLastError ();
  g_set_error (error, domain, code, "%s failed: %s (%s)", what,
               cudaGetErrorString ((cudaError_t) status), cudaGetErrorName ((cudaError_t) status));
  return FALSE;
}

gboolean
_cp_cuda_status_is_unloading (int status)
{
  return status == cudaErrorCudartUnloading;
}

int
_cp_cuda_device_count (GError **error)
{
  int count = 0;

  if (!_cp_cuda_check (cudaGetDeviceCount (&count), CP_MESH_ERROR, CP_MESH_ERROR_NO_DEVICE,
                       "no CUDA device: cudaGetDeviceCount", error))
    return -1;
  if (count == 0)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_NO_DEVICE,
                   "no CUDA device: cudaGetDeviceCount found 0 devices");
      return -1;
    }
  return count;
}

gboolean
_cp_cuda_probe (CpCudaInfo  *info,
                GError     **error)
{
  info->runtime_version = 0;
  info->driver_version = 0;
  /* Neither needs a driver: with none, the driver version is 0. */
  (void) cudaRuntimeGetVersion (&info->runtime_version);
  (void) cudaDriverGetVersion (&info->driver_version);
  info->nccl_version = _cp_gpu_library_get (CP_GPU_LIBRARY_NCCL)->version_code;
  info->device_count = _cp_cuda_device_count (error);
  return info->device_count > 0;
}
