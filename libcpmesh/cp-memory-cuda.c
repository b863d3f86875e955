/* cp-memory-cuda.c: CUDA device memory behind the memory interface
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <cuda_runtime_api.h>

#include "cp-error.h"
#include "cp-memory-private.h"
#include "kernels/cuda/cp-cuda-kernels-private.h"
#include "kernels/cuda/cp-cuda-private.h"

/* Every operation runs on the calling thread's default stream and waits
 * for it before returning: the memory interface promises finished bytes
 * (the layer above may download them at once, or hand the tensor to a
 * rank on another thread), so this is the API boundary's synchronisation.
 * Allocations come from the stream-ordered pool (cudaMallocAsync), whose
 * freed blocks the next allocation reuses without a device-wide sync. */
#define STREAM cudaStreamPerThread

/* Copies and fills have no error to return: a failure there means a
 * device that worked a moment ago has failed, which no caller can mend. */
static void
report_failure (cudaError_t  status,
                const char  *what)
{
  g_autoptr(GError) error = NULL;

  if (!_cp_cuda_check (status, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, what, &error))
    g_critical ("%s", error->message);
}

static void
wait_for_stream (const char *what)
{
  report_failure (cudaStreamSynchronize (STREAM), what);
}

/* CP_TENSOR_ERROR_DEVICE with CUDA's text when there is no usable
 * device (no driver, none present). */
static gboolean
require_device (gsize    size,
                GError **error)
{
  int count = 0;
  cudaError_t status = cudaGetDeviceCount (&count);
  g_autofree char *what = g_strdup_printf ("allocating %" G_GSIZE_FORMAT " bytes of CUDA memory: "
                                           "cudaGetDeviceCount", size);

  if (!_cp_cuda_check (status, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, what, error))
    return FALSE;
  if (count == 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "allocating %" G_GSIZE_FORMAT " bytes of CUDA memory: no CUDA device", size);
      return FALSE;
    }
  return TRUE;
}

static gpointer
cuda_alloc (gsize      size,
            gboolean   zeroed,
            GError   **error)
{
  void *address = NULL;
  g_autofree char *what = NULL;
  cudaError_t status;

  if (!require_device (size, error))
    return NULL;
  status = cudaMallocAsync (&address, MAX (size, 1), STREAM);
  if (status == cudaSuccess && zeroed)
    status = cudaMemsetAsync (address, 0, size, STREAM);
  if (status == cudaSuccess)
    status = cudaStreamSynchronize (STREAM);
  if (status == cudaSuccess)
    return address;
  what = g_strdup_printf ("cudaMallocAsync of %" G_GSIZE_FORMAT " bytes", size);
  _cp_cuda_check (status, CP_TENSOR_ERROR,
                  status == cudaErrorMemoryAllocation ? CP_TENSOR_ERROR_OUT_OF_MEMORY
                                                      : CP_TENSOR_ERROR_DEVICE,
                  what, error);
  if (address != NULL)
    (void) cudaFreeAsync (address, STREAM);
  return NULL;
}

static void
cuda_free (gpointer address,
           gsize    size)
{
  report_failure (cudaFreeAsync (address, STREAM), "cudaFreeAsync");
}

static enum cudaMemcpyKind
copy_kind (CpMemoryDirection direction)
{
  switch (direction)
    {
    case CP_MEMORY_HOST_TO_DEVICE:
      return cudaMemcpyHostToDevice;
    case CP_MEMORY_DEVICE_TO_HOST:
      return cudaMemcpyDeviceToHost;
    case CP_MEMORY_DEVICE_TO_DEVICE:
    default:
      return cudaMemcpyDeviceToDevice;
    }
}

static void
cuda_copy_2d (gpointer           dst,
              gsize              dst_pitch,
              gconstpointer      src,
              gsize              src_pitch,
              gsize              width,
              gsize              height,
              CpMemoryDirection  direction,
              gboolean           streaming)
{
  /* One row: the pitches do not matter, and the 2-D call wants them at
   * least as wide as the row. */
  if (height == 1)
    dst_pitch = src_pitch = width;
  report_failure (cudaMemcpy2DAsync (dst, dst_pitch, src, src_pitch, width, height,
                                     copy_kind (direction), STREAM),
                  "cudaMemcpy2DAsync");
  wait_for_stream ("cudaMemcpy2DAsync");
}

static void
cuda_fill (gpointer       dst,
           gconstpointer  pattern,
           gsize          pattern_size,
           gsize          count)
{
  report_failure (_cp_cuda_fill (dst, count, pattern, pattern_size, STREAM), "the fill kernel");
  wait_for_stream ("the fill kernel");
}

static void
cuda_synchronize (void)
{
  wait_for_stream ("cudaStreamSynchronize");
}

const CpMemoryOps _cp_memory_cuda_ops = {
  .kind = CP_DEVICE_KIND_CUDA,
  .name = "cuda",
  .alloc = cuda_alloc,
  .free = cuda_free,
  .copy_2d = cuda_copy_2d,
  .fill = cuda_fill,
  .synchronize = cuda_synchronize,
};
