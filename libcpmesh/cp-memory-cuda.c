/* cp-memory-cuda.c: CUDA device memory behind the memory interface
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <cuda_runtime_api.h>

#include "cp-error.h"
#include "cp-memory-private.h"
#include "cp-sync-private.h"
#include "kernels/cuda/cp-cuda-kernels-private.h"
#include "kernels/cuda/cp-cuda-private.h"

/* Every operation runs on the calling thread's default stream of the
 * device that holds the memory, made current for the call and the
 * caller's current device restored after it: the library runs inside
 * programs (PyTorch) whose own current device it must not move.  Copies,
 * fills and gathers are only enqueued; the memory interface waits once
 * per call with cuda_synchronize, which also reports a kernel's or a
 * copy's asynchronous failure, so the layer above sees finished bytes or
 * an error. */
#define STREAM cudaStreamPerThread

/* Pools and pitch limits are kept per device, for this many. */
#define MAX_DEVICES 64

static gboolean
check (cudaError_t   status,
       const char   *what,
       GError      **error)
{
  return _cp_cuda_check (status, CP_TENSOR_ERROR,
                         status == cudaErrorMemoryAllocation ? CP_TENSOR_ERROR_OUT_OF_MEMORY
                                                             : CP_TENSOR_ERROR_DEVICE,
                         what, error);
}

/* Makes @device_id current, keeping the caller's current device in
 * @saved for leave_device. */
static gboolean
enter_device (int          device_id,
              int         *saved,
              const char  *what,
              GError     **error)
{
  g_autofree char *message = NULL;
  cudaError_t status = cudaGetDevice (saved);

  if (status == cudaSuccess && *saved != device_id)
    status = cudaSetDevice (device_id);
  if (status == cudaSuccess)
    return TRUE;
  message = g_strdup_printf ("%s on CUDA device %d: making the device current", what, device_id);
  *saved = -1;
  return check (status, message, error);
}

static void
leave_device (int device_id,
              int saved)
{
  if (saved >= 0 && saved != device_id)
    (void) cudaSetDevice (saved);
}

/* Restores the caller's device after @status came from a call made on
 * @device_id, and reports it. */
static gboolean
leave_device_with (int           device_id,
                   int           saved,
                   cudaError_t   status,
                   const char   *what,
                   GError      **error)
{
  g_autofree char *message = NULL;

  leave_device (device_id, saved);
  if (status == cudaSuccess)
    return TRUE;
  message = g_strdup_printf ("%s on CUDA device %d", what, device_id);
  return check (status, message, error);
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

/* Allocations come from a pool of the library's own on each device,
 * which keeps freed blocks for the next allocation up to a quarter of
 * the device's memory: the device's default pool has a release threshold
 * of 0, so every synchronisation (each call here ends with one) would
 * hand all freed memory back to the driver and the next allocation would
 * map it again.  A pool of its own leaves the default pool's threshold,
 * which PyTorch and others share, alone. */
static CpMutex pools_lock = CP_MUTEX_INIT;
static cudaMemPool_t pools[MAX_DEVICES];

static cudaError_t
create_pool (int            device_id,
             cudaMemPool_t *pool)
{
  struct cudaMemPoolProps props = { 0 };
  size_t free_bytes = 0, total_bytes = 0;
  guint64 threshold = G_MAXUINT64;
  cudaError_t status;

  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_id;
  status = cudaMemPoolCreate (pool, &props);
  if (status != cudaSuccess)
    return status;
  if (cudaMemGetInfo (&free_bytes, &total_bytes) == cudaSuccess && total_bytes > 0)
    threshold = total_bytes / 4;
  else
    (void) cudaGetLastError ();
  return cudaMemPoolSetAttribute (*pool, cudaMemPoolAttrReleaseThreshold, &threshold);
}

/* The pool of the current device @device_id. */
static gboolean
pool_of (int            device_id,
         cudaMemPool_t *pool,
         GError       **error)
{
  cudaError_t status = cudaSuccess;

  if (device_id < 0 || device_id >= MAX_DEVICES)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "CUDA device %d: libcpmesh allocates on devices 0 to %d", device_id,
                   MAX_DEVICES - 1);
      return FALSE;
    }
  _cp_mutex_lock (&pools_lock);
  if (pools[device_id] == NULL)
    status = create_pool (device_id, &pools[device_id]);
  if (status != cudaSuccess && pools[device_id] != NULL)
    {
      (void) cudaMemPoolDestroy (pools[device_id]);
      pools[device_id] = NULL;
    }
  *pool = pools[device_id];
  _cp_mutex_unlock (&pools_lock);
  return check (status, "creating a CUDA memory pool: cudaMemPoolCreate", error);
}

gpointer
_cp_memory_cuda_pool (int device_id)
{
  gpointer pool = NULL;

  if (device_id < 0 || device_id >= MAX_DEVICES)
    return NULL;
  _cp_mutex_lock (&pools_lock);
  pool = pools[device_id];
  _cp_mutex_unlock (&pools_lock);
  return pool;
}

/* On the device current now, which the storage records. */
static gpointer
cuda_alloc (gsize      size,
            gboolean   zeroed,
            int       *device_id,
            GError   **error)
{
  void *address = NULL;
  g_autofree char *what = NULL;
  cudaMemPool_t pool;
  cudaError_t status;

  if (!require_device (size, error))
    return NULL;
  if (!check (cudaGetDevice (device_id), "allocating CUDA memory: cudaGetDevice", error) ||
      !pool_of (*device_id, &pool, error))
    return NULL;
  status = cudaMallocFromPoolAsync (&address, MAX (size, 1), pool, STREAM);
  if (status == cudaSuccess && zeroed)
    status = cudaMemsetAsync (address, 0, size, STREAM);
  if (status == cudaSuccess)
    status = cudaStreamSynchronize (STREAM);
  if (status == cudaSuccess)
    return address;
  what = g_strdup_printf ("cudaMallocFromPoolAsync of %" G_GSIZE_FORMAT " bytes on CUDA device %d",
                          size, *device_id);
  check (status, what, error);
  if (address != NULL)
    (void) cudaFreeAsync (address, STREAM);
  return NULL;
}

/* A free has no caller to tell: a failure is logged, except at exit,
 * when the runtime is already unloading and every call says so. */
static void
cuda_free (int      device_id,
           gpointer address,
           gsize    size)
{
  g_autoptr(GError) error = NULL;
  int saved = -1;
  cudaError_t status = cudaGetDevice (&saved);

  if (status == cudaSuccess && saved != device_id)
    status = cudaSetDevice (device_id);
  if (status == cudaSuccess)
    status = cudaFreeAsync (address, STREAM);
  leave_device (device_id, saved);
  if (status == cudaSuccess || _cp_cuda_status_is_unloading (status))
    {
      (void) cudaGetLastError ();
      return;
    }
  check (status, "cudaFreeAsync", &error);
  g_warning ("freeing %" G_GSIZE_FORMAT " bytes of CUDA memory on device %d: %s", size,
             device_id, error->message);
}

static int
cuda_device_of (gconstpointer address)
{
  struct cudaPointerAttributes attributes = { 0 };
  int current = 0;

  if (cudaPointerGetAttributes (&attributes, address) == cudaSuccess && attributes.device >= 0)
    return attributes.device;
  (void) cudaGetLastError ();
  if (cudaGetDevice (&current) != cudaSuccess)
    (void) cudaGetLastError ();
  return current;
}

static const char *
memory_type_name (enum cudaMemoryType type)
{
  switch (type)
    {
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
    case cudaMemoryTypeUnregistered:
    default: return "memory CUDA does not know (ordinary host memory?)";
    }
}

/* What the runtime knows of the byte at @address, which DLPack says is
 * on @device_id. */
static gboolean
check_pointer (int            device_id,
               gconstpointer  address,
               const char    *which,
               GError       **error)
{
  struct cudaPointerAttributes attributes = { 0 };
  g_autofree char *what = g_strdup_printf ("a DLPack tensor on CUDA device %d: "
                                           "cudaPointerGetAttributes of its %s byte %p",
                                           device_id, which, address);

  if (!_cp_cuda_check (cudaPointerGetAttributes (&attributes, address), CP_TENSOR_ERROR,
                       CP_TENSOR_ERROR_DEVICE, what, error))
    return FALSE;
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "a DLPack tensor on CUDA device %d: its %s byte %p is %s, not device memory",
                   device_id, which, address, memory_type_name (attributes.type));
      return FALSE;
    }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device_id)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "a DLPack tensor says CUDA device %d, but its %s byte %p is on CUDA device %d",
                   device_id, which, address, attributes.device);
      return FALSE;
    }
  return TRUE;
}

static gboolean
cuda_check_import (int            device_id,
                   gconstpointer  address,
                   gsize          size,
                   GError       **error)
{
  int count = 0;
  g_autofree char *what = g_strdup_printf ("a DLPack tensor on CUDA device %d: cudaGetDeviceCount",
                                           device_id);

  if (!_cp_cuda_check (cudaGetDeviceCount (&count), CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, what,
                       error))
    return FALSE;
  if (device_id < 0 || device_id >= count)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
                   "a DLPack tensor on CUDA device %d: this machine has CUDA devices 0 to %d",
                   device_id, count - 1);
      return FALSE;
    }
  if (size == 0)
    return TRUE;
  return check_pointer (device_id, address, "first", error) &&
         check_pointer (device_id, (const guint8 *) address + size - 1, "last", error);
}

/* cudaDevAttrMaxPitch of each device, asked once. */
static gint max_pitches[MAX_DEVICES];

static gsize
cuda_max_pitch (int device_id)
{
  int pitch;

  if (device_id < 0 || device_id >= MAX_DEVICES)
    return G_MAXINT;
  pitch = g_atomic_int_get (&max_pitches[device_id]);
  if (pitch > 0)
    return (gsize) pitch;
  if (cudaDeviceGetAttribute (&pitch, cudaDevAttrMaxPitch, device_id) != cudaSuccess || pitch <= 0)
    {
      (void) cudaGetLastError ();
      return G_MAXINT;
    }
  g_atomic_int_set (&max_pitches[device_id], pitch);
  return (gsize) pitch;
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
      /* The pointers tell, also between two devices. */
      return cudaMemcpyDefault;
    }
}

static cudaError_t
enqueue_copy (gpointer           dst,
              gsize              dst_pitch,
              gconstpointer      src,
              gsize              src_pitch,
              gsize              width,
              gsize              height,
              CpMemoryDirection  direction)
{
  if (height == 1)
    return cudaMemcpyAsync (dst, src, width, copy_kind (direction), STREAM);
  return cudaMemcpy2DAsync (dst, dst_pitch, src, src_pitch, width, height, copy_kind (direction),
                            STREAM);
}

static gboolean
cuda_copy_2d (int                device_id,
              gpointer           dst,
              gsize              dst_pitch,
              gconstpointer      src,
              gsize              src_pitch,
              gsize              width,
              gsize              height,
              CpMemoryDirection  direction,
              gboolean           streaming,
              GError           **error)
{
  const char *what = height == 1 ? "cudaMemcpyAsync" : "cudaMemcpy2DAsync";
  int saved;

  if (!enter_device (device_id, &saved, what, error))
    return FALSE;
  return leave_device_with (device_id, saved,
                            enqueue_copy (dst, dst_pitch, src, src_pitch, width, height, direction),
                            what, error);
}

/* Every run in one gather launch (or one per CP_RUNS_PER_LAUNCH runs). */
static gboolean
cuda_copy_runs (int                device_id,
                const CpRunsCopy  *copy,
                GError           **error)
{
  CpCudaRunsCopy runs = {
    .full = copy->full, .full_pitch = (int64_t) copy->full_pitch, .first = copy->first,
    .local = copy->local, .local_pitch = (int64_t) copy->local_pitch,
    .outer = (int64_t) copy->outer, .inner = (int64_t) copy->step,
  };
  int saved;

  if (!enter_device (device_id, &saved, "the gather kernel", error))
    return FALSE;
  return leave_device_with (device_id, saved,
                            _cp_cuda_copy_runs (&runs, copy->runs, copy->n_runs, !copy->to_local,
                                                STREAM),
                            "the gather kernel", error);
}

static gboolean
cuda_fill (int            device_id,
           gpointer       dst,
           gconstpointer  pattern,
           gsize          pattern_size,
           gsize          count,
           GError       **error)
{
  int saved;

  if (!enter_device (device_id, &saved, "the fill kernel", error))
    return FALSE;
  return leave_device_with (device_id, saved, _cp_cuda_fill (dst, count, pattern, pattern_size,
                                                             STREAM),
                            "the fill kernel", error);
}

static gboolean
cuda_synchronize (int      device_id,
                  GError **error)
{
  int saved;

  if (!enter_device (device_id, &saved, "cudaStreamSynchronize", error))
    return FALSE;
  return leave_device_with (device_id, saved, cudaStreamSynchronize (STREAM),
                            "cudaStreamSynchronize", error);
}

const CpMemoryOps _cp_memory_cuda_ops = {
  .kind = CP_DEVICE_KIND_CUDA,
  .name = "cuda",
  .alloc = cuda_alloc,
  .free = cuda_free,
  .device_of = cuda_device_of,
  .check_import = cuda_check_import,
  .max_pitch = cuda_max_pitch,
  .copy_2d = cuda_copy_2d,
  .copy_runs = cuda_copy_runs,
  .fill = cuda_fill,
  .synchronize = cuda_synchronize,
};
