/* cp-memory.c: byte moves between regions, dispatched to the memory that holds them
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
region_ops (const CpRegion *region)
{
  const CpMemoryOps *ops = _cp_storage_get_memory (region->storage);

  /* Callers checked reachability with _cp_tensor_require_device(). */
  g_assert (ops != NULL);
  return ops;
}

static guint8 *
device_address (const CpRegion *region,
                gsize           offset)
{
  return (guint8 *) _cp_region_get_address (region) + offset;
}

/* Which memory's operations copy from @src to @dst, and in which
 * direction. */
static const CpMemoryOps *
copier (const CpRegion    *dst,
        const CpRegion    *src,
        CpMemoryDirection *direction)
{
  const CpMemoryOps *to = region_ops (dst);
  const CpMemoryOps *from = region_ops (src);

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

CpMemoryPlan
_cp_memory_plan_2d (gsize width,
                    gsize height,
                    gsize dst_pitch,
                    gsize src_pitch,
                    gsize max_pitch)
{
  if (width == 0 || height == 0)
    return CP_MEMORY_PLAN_NOTHING;
  if (height == 1 || (dst_pitch == width && src_pitch == width))
    return CP_MEMORY_PLAN_ONE_ROW;
  if (dst_pitch < width || src_pitch < width ||
      (max_pitch != 0 && (dst_pitch > max_pitch || src_pitch > max_pitch)))
    return CP_MEMORY_PLAN_ROWS;
  return CP_MEMORY_PLAN_2D;
}

/* Issues one 2-D copy on device @device_id of @ops as its copy_2d can
 * take it; does not wait. */
static gboolean
issue_2d (const CpMemoryOps *ops,
          int                device_id,
          guint8            *dst,
          gsize              dst_pitch,
          const guint8      *src,
          gsize              src_pitch,
          gsize              width,
          gsize              height,
          CpMemoryDirection  direction,
          gboolean           streaming,
          GError           **error)
{
  gsize max_pitch = ops->max_pitch != NULL ? ops->max_pitch (device_id) : 0;

  switch (_cp_memory_plan_2d (width, height, dst_pitch, src_pitch, max_pitch))
    {
    case CP_MEMORY_PLAN_NOTHING:
      return TRUE;
    case CP_MEMORY_PLAN_ONE_ROW:
      return ops->copy_2d (device_id, dst, width * height, src, width * height, width * height, 1,
                           direction, streaming, error);
    case CP_MEMORY_PLAN_2D:
      return ops->copy_2d (device_id, dst, dst_pitch, src, src_pitch, width, height, direction,
                           streaming, error);
    case CP_MEMORY_PLAN_ROWS:
    default:
      for (gsize row = 0; row < height; row++)
        if (!ops->copy_2d (device_id, dst + row * dst_pitch, width, src + row * src_pitch, width,
                           width, 1, direction, streaming, error))
          return FALSE;
      return TRUE;
    }
}

/* The device whose memory @region is: the one that runs a copy. */
static int
region_device_id (const CpRegion *region)
{
  return _cp_storage_get_device_id (region->storage);
}

/* Waits for what @ok says was issued; a failure already reported wins,
 * but the device is waited for either way, so no later call sees it. */
static gboolean
finish (const CpMemoryOps *ops,
        int                device_id,
        gboolean           ok,
        GError           **error)
{
  if (!ok)
    {
      (void) ops->synchronize (device_id, NULL);
      return FALSE;
    }
  return ops->synchronize (device_id, error);
}

/* The region of the pair whose device runs a copy between them. */
static const CpRegion *
runner (const CpRegion    *dst,
        const CpRegion    *src,
        CpMemoryDirection  direction)
{
  return direction == CP_MEMORY_DEVICE_TO_HOST ? src : dst;
}

gboolean
_cp_memory_copy_2d_region (const CpRegion *dst,
                           gsize           dst_offset,
                           gsize           dst_pitch,
                           const CpRegion *src,
                           gsize           src_offset,
                           gsize           src_pitch,
                           gsize           width,
                           gsize           height,
                           gboolean        streaming,
                           GError        **error)
{
  CpMemoryDirection direction;
  const CpMemoryOps *ops;
  int device_id;

  /* Empty tensors may have no address at all. */
  if (width == 0 || height == 0)
    return TRUE;
  ops = copier (dst, src, &direction);
  device_id = region_device_id (runner (dst, src, direction));
  return finish (ops, device_id,
                 issue_2d (ops, device_id, device_address (dst, dst_offset), dst_pitch,
                           device_address (src, src_offset), src_pitch, width, height, direction,
                           streaming, error),
                 error);
}

/* One 2-D copy a run, all issued before the one wait. */
static gboolean
issue_runs (const CpMemoryOps *ops,
            int                device_id,
            const CpRunsCopy  *copy,
            GError           **error)
{
  guint8 *local_cursor = copy->local;

  for (guint i = 0; i < copy->n_runs; i++)
    {
      guint8 *global = copy->full + (gsize) (copy->runs[i].start - copy->first) * copy->step;
      gsize bytes = (gsize) copy->runs[i].length * copy->step;
      gboolean ok;

      if (bytes == 0)
        continue;
      if (copy->to_local)
        ok = issue_2d (ops, device_id, local_cursor, copy->local_pitch, global, copy->full_pitch,
                       bytes, copy->outer, copy->direction, copy->streaming, error);
      else
        ok = issue_2d (ops, device_id, global, copy->full_pitch, local_cursor, copy->local_pitch,
                       bytes, copy->outer, copy->direction, copy->streaming, error);
      if (!ok)
        return FALSE;
      local_cursor += bytes;
    }
  return TRUE;
}

gboolean
_cp_memory_copy_runs_region (const CpRegion     *full,
                             gsize               full_offset,
                             gsize               full_pitch,
                             gint64              first,
                             const CpRegion     *local,
                             gsize               local_offset,
                             gsize               local_pitch,
                             const cp_index_run *runs,
                             guint               n_runs,
                             gsize               step,
                             gsize               outer,
                             gboolean            to_local,
                             gboolean            streaming,
                             GError            **error)
{
  CpRunsCopy copy = {
    .full = device_address (full, full_offset), .full_pitch = full_pitch, .first = first,
    .local = device_address (local, local_offset), .local_pitch = local_pitch,
    .runs = runs, .n_runs = n_runs, .step = step, .outer = outer, .to_local = to_local,
    .streaming = streaming,
  };
  const CpMemoryOps *ops;
  int device_id;

  if (outer == 0 || n_runs == 0 || step == 0)
    return TRUE;
  ops = to_local ? copier (local, full, &copy.direction) : copier (full, local, &copy.direction);
  device_id = region_device_id (to_local ? runner (local, full, copy.direction)
                                         : runner (full, local, copy.direction));
  if (ops->copy_runs != NULL && copy.direction == CP_MEMORY_DEVICE_TO_DEVICE)
    return finish (ops, device_id, ops->copy_runs (device_id, &copy, error), error);
  return finish (ops, device_id, issue_runs (ops, device_id, &copy, error), error);
}

/* A one-row copy between host memory and memory @ops on @device_id. */
static gboolean
move_bytes (const CpMemoryOps *ops,
            int                device_id,
            gpointer           dst,
            gconstpointer      src,
            gsize              n,
            CpMemoryDirection  direction,
            GError           **error)
{
  if (n == 0)
    return TRUE;
  return finish (ops, device_id,
                 ops->copy_2d (device_id, dst, n, src, n, n, 1, direction, FALSE, error), error);
}

gboolean
_cp_memory_download_region (gpointer        host,
                            const CpRegion *src,
                            gsize           src_offset,
                            gsize           n,
                            GError        **error)
{
  if (n == 0)
    return TRUE;
  return move_bytes (region_ops (src), region_device_id (src), host,
                     device_address (src, src_offset), n, CP_MEMORY_DEVICE_TO_HOST, error);
}

gboolean
_cp_memory_upload_region (const CpRegion *dst,
                          gsize           dst_offset,
                          gconstpointer   host,
                          gsize           n,
                          GError        **error)
{
  if (n == 0)
    return TRUE;
  return move_bytes (region_ops (dst), region_device_id (dst), device_address (dst, dst_offset),
                     host, n, CP_MEMORY_HOST_TO_DEVICE, error);
}

static int
device_of_address (const CpMemoryOps *ops,
                   gconstpointer      address)
{
  return ops->device_of != NULL ? ops->device_of (address) : 0;
}

gboolean
_cp_memory_copy_2d_address (gpointer      dst,
                            CpDeviceKind  dst_kind,
                            gsize         dst_pitch,
                            gconstpointer src,
                            CpDeviceKind  src_kind,
                            gsize         src_pitch,
                            gsize         width,
                            gsize         height,
                            gboolean      streaming,
                            GError      **error)
{
  const CpMemoryOps *ops;
  CpMemoryDirection direction;
  int device_id;

  if (width == 0 || height == 0)
    return TRUE;
  if (dst_kind == src_kind)
    ops = _cp_memory_ops_for_kind (dst_kind), direction = CP_MEMORY_DEVICE_TO_DEVICE;
  else if (src_kind == CP_DEVICE_KIND_HOST)
    ops = _cp_memory_ops_for_kind (dst_kind), direction = CP_MEMORY_HOST_TO_DEVICE;
  else
    {
      g_assert (dst_kind == CP_DEVICE_KIND_HOST);
      ops = _cp_memory_ops_for_kind (src_kind), direction = CP_MEMORY_DEVICE_TO_HOST;
    }
  g_assert (ops != NULL);
  device_id = device_of_address (ops, direction == CP_MEMORY_DEVICE_TO_HOST ? src : dst);
  return finish (ops, device_id,
                 issue_2d (ops, device_id, dst, dst_pitch, src, src_pitch, width, height,
                           direction, streaming, error),
                 error);
}

gboolean
_cp_memory_fill_region (const CpRegion *dst,
                        gsize           offset,
                        CpDType         dtype,
                        gsize           count,
                        double          value,
                        GError        **error)
{
  const CpMemoryOps *ops;
  guint64 pattern = 0;
  int device_id;

  if (count == 0)
    return TRUE;
  ops = region_ops (dst);
  device_id = region_device_id (dst);
  _cp_dtype_write (dtype, &pattern, 0, value);
  return finish (ops, device_id,
                 ops->fill (device_id, device_address (dst, offset), &pattern,
                            cp_dtype_get_size (dtype), count, error),
                 error);
}

/* Device bytes are compared on the host, after a download. */
gboolean
_cp_memory_equal_region (const CpRegion *a,
                         const CpRegion *b,
                         gsize           n,
                         GError        **error)
{
  g_autofree guint8 *bytes_a = NULL;
  g_autofree guint8 *bytes_b = NULL;

  if (n == 0)
    return TRUE;
  if (region_ops (a) == &_cp_memory_host_ops && region_ops (b) == &_cp_memory_host_ops)
    return memcmp (device_address (a, 0), device_address (b, 0), n) == 0;
  bytes_a = g_malloc (n);
  bytes_b = g_malloc (n);
  return _cp_memory_download_region (bytes_a, a, 0, n, error) &&
         _cp_memory_download_region (bytes_b, b, 0, n, error) &&
         memcmp (bytes_a, bytes_b, n) == 0;
}

gboolean
_cp_memory_synchronize_storage (CpStorage  *storage,
                                GError    **error)
{
  const CpMemoryOps *ops = _cp_storage_get_memory (storage);

  g_assert (ops != NULL);
  return ops->synchronize (_cp_storage_get_device_id (storage), error);
}

gpointer
_cp_memory_kernel_address_region (const CpRegion *region)
{
  return _cp_memory_kernel_address_at (region->storage, region->offset);
}

gpointer
_cp_memory_kernel_address_at (CpStorage *storage,
                              gsize      offset)
{
  guint8 *data = cp_storage_get_data (storage);
  guint8 *address = data != NULL ? data + offset : NULL;
  const CpMemoryOps *ops = _cp_storage_get_memory (storage);

  g_assert (ops != NULL);

  if (address == NULL || ops->kernel_address == NULL)
    return address;
  return ops->kernel_address (address);
}

gboolean
_cp_memory_check_import (CpDeviceKind  kind,
                         int           device_id,
                         guintptr      address,
                         gsize         size,
                         GError      **error)
{
  const CpMemoryOps *ops = _cp_memory_ops_for_kind (kind);

  if (ops == NULL || ops->check_import == NULL)
    return TRUE;
  return ops->check_import (device_id, GSIZE_TO_POINTER (address), size, error);
}
