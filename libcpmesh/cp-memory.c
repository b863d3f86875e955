/* cp-memory.c: tensor byte moves, dispatched to the memory that holds them
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-dtype-private.h"
#include "cp-memory-private.h"
#include "cp-storage-private.h"

const CpMemoryOps *
_cp_memory_ops_for_kind (CpDeviceKind kind)
{
  switch (kind)
    {
    case CP_DEVICE_KIND_HOST:
      return &_cp_memory_host_ops;
    case CP_DEVICE_KIND_TEST:
      return &_cp_memory_test_ops;
#if CP_HAS_CUDA
    case CP_DEVICE_KIND_CUDA:
      return &_cp_memory_cuda_ops;
#endif
    default:
      return NULL;
    }
}

static const CpMemoryOps *
tensor_ops (CpTensor *tensor)
{
  const CpMemoryOps *ops = _cp_storage_get_memory (cp_tensor_get_storage (tensor));

  /* Callers checked reachability with _cp_tensor_require_device(). */
  g_assert (ops != NULL);
  return ops;
}

static guint8 *
device_address (CpTensor *tensor,
                gsize     offset)
{
  return (guint8 *) cp_tensor_get_data (tensor) + offset;
}

/* Which memory's operations copy from @src to @dst, and in which
 * direction. */
static const CpMemoryOps *
copier (CpTensor          *dst,
        CpTensor          *src,
        CpMemoryDirection *direction)
{
  const CpMemoryOps *to = tensor_ops (dst);
  const CpMemoryOps *from = tensor_ops (src);

  if (to == from)
    {
      *direction = CP_MEMORY_DEVICE_TO_DEVICE;
      return to;
    }
  if (from == &_cp_memory_host_ops)
    {
      *direction = CP_MEMORY_HOST_TO_DEVICE;
      return to;
    }
  /* Two different devices: the next device brings a staged copy. */
  g_assert (to == &_cp_memory_host_ops);
  *direction = CP_MEMORY_DEVICE_TO_HOST;
  return from;
}

void
_cp_memory_copy_2d (CpTensor *dst,
                    gsize     dst_offset,
                    gsize     dst_pitch,
                    CpTensor *src,
                    gsize     src_offset,
                    gsize     src_pitch,
                    gsize     width,
                    gsize     height,
                    gboolean  streaming)
{
  CpMemoryDirection direction;
  const CpMemoryOps *ops;

  /* Empty tensors may have no address at all. */
  if (width == 0 || height == 0)
    return;
  ops = copier (dst, src, &direction);
  ops->copy_2d (device_address (dst, dst_offset), dst_pitch, device_address (src, src_offset),
                src_pitch, width, height, direction, streaming);
}

void
_cp_memory_copy_runs (CpTensor           *full,
                      gsize               full_offset,
                      gsize               full_pitch,
                      gint64              first,
                      CpTensor           *local,
                      gsize               local_offset,
                      gsize               local_pitch,
                      const cp_index_run *runs,
                      guint               n_runs,
                      gsize               step,
                      gsize               outer,
                      gboolean            to_local,
                      gboolean            streaming)
{
  CpMemoryDirection direction;
  const CpMemoryOps *ops;
  guint8 *full_base, *local_cursor;

  if (outer == 0 || n_runs == 0)
    return;
  ops = to_local ? copier (local, full, &direction) : copier (full, local, &direction);
  full_base = device_address (full, full_offset);
  local_cursor = device_address (local, local_offset);
  for (guint i = 0; i < n_runs; i++)
    {
      guint8 *global = full_base + (gsize) (runs[i].start - first) * step;
      gsize bytes = (gsize) runs[i].length * step;

      if (bytes == 0)
        continue;
      if (to_local)
        ops->copy_2d (local_cursor, local_pitch, global, full_pitch, bytes, outer, direction,
                      streaming);
      else
        ops->copy_2d (global, full_pitch, local_cursor, local_pitch, bytes, outer, direction,
                      streaming);
      local_cursor += bytes;
    }
}

void
_cp_memory_copy (CpTensor *dst,
                 gsize     dst_offset,
                 CpTensor *src,
                 gsize     src_offset,
                 gsize     n,
                 gboolean  streaming)
{
  _cp_memory_copy_2d (dst, dst_offset, n, src, src_offset, n, n, 1, streaming);
}

void
_cp_memory_download (gpointer  host,
                     CpTensor *src,
                     gsize     src_offset,
                     gsize     n)
{
  if (n > 0)
    tensor_ops (src)->copy_2d (host, n, device_address (src, src_offset), n, n, 1,
                               CP_MEMORY_DEVICE_TO_HOST, FALSE);
}

void
_cp_memory_upload (CpTensor      *dst,
                   gsize          dst_offset,
                   gconstpointer  host,
                   gsize          n)
{
  if (n > 0)
    tensor_ops (dst)->copy_2d (device_address (dst, dst_offset), n, host, n, n, 1,
                               CP_MEMORY_HOST_TO_DEVICE, FALSE);
}

void
_cp_memory_download_address (CpDeviceKind  device,
                             gpointer      host,
                             gconstpointer address,
                             gsize         n)
{
  if (n > 0)
    _cp_memory_ops_for_kind (device)->copy_2d (host, n, address, n, n, 1,
                                               CP_MEMORY_DEVICE_TO_HOST, FALSE);
}

void
_cp_memory_upload_address (CpDeviceKind  device,
                           gpointer      address,
                           gconstpointer host,
                           gsize         n)
{
  if (n > 0)
    _cp_memory_ops_for_kind (device)->copy_2d (address, n, host, n, n, 1,
                                               CP_MEMORY_HOST_TO_DEVICE, FALSE);
}

void
_cp_memory_fill (CpTensor *dst,
                 gsize     offset,
                 gsize     count,
                 double    value)
{
  CpDType dtype = cp_tensor_get_dtype (dst);
  guint64 pattern = 0;

  if (count == 0)
    return;
  _cp_dtype_write (dtype, &pattern, 0, value);
  tensor_ops (dst)->fill (device_address (dst, offset), &pattern, cp_dtype_get_size (dtype), count);
}

/* Device bytes are compared on the host, after a download. */
gboolean
_cp_memory_equal (CpTensor *a,
                  CpTensor *b,
                  gsize     n)
{
  g_autofree guint8 *bytes_a = NULL;
  g_autofree guint8 *bytes_b = NULL;

  if (n == 0)
    return TRUE;
  if (tensor_ops (a) == &_cp_memory_host_ops && tensor_ops (b) == &_cp_memory_host_ops)
    return memcmp (device_address (a, 0), device_address (b, 0), n) == 0;
  bytes_a = g_malloc (n);
  bytes_b = g_malloc (n);
  _cp_memory_download (bytes_a, a, 0, n);
  _cp_memory_download (bytes_b, b, 0, n);
  return memcmp (bytes_a, bytes_b, n) == 0;
}

void
_cp_memory_synchronize (CpTensor *tensor)
{
  tensor_ops (tensor)->synchronize ();
}

gpointer
_cp_memory_kernel_address (CpTensor *tensor)
{
  guint8 *address = cp_tensor_get_data (tensor);
  const CpMemoryOps *ops = tensor_ops (tensor);

  if (address == NULL || ops->kernel_address == NULL)
    return address;
  return ops->kernel_address (address);
}
