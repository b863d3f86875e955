/* cp-tensor-memory.c: tensor byte moves, as moves of the tensors' regions
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-memory-private.h"
#include "cp-tensor-private.h"

/* The memory interface takes regions and knows nothing of tensors; the
 * layers above name a tensor, whose region these calls pass on.  The
 * region borrows the tensor's reference on its storage (the caller holds
 * the tensor for the length of the call), so it is never cleared. */
static CpRegion
region_of (CpTensor *tensor)
{
  return (CpRegion) {
    .storage = cp_tensor_get_storage (tensor),
    .offset = cp_tensor_get_storage_offset (tensor),
    .length = cp_tensor_get_nbytes (tensor),
    .device = cp_tensor_get_device (tensor),
  };
}

gboolean
_cp_memory_copy_2d (CpTensor *dst,
                    gsize     dst_offset,
                    gsize     dst_pitch,
                    CpTensor *src,
                    gsize     src_offset,
                    gsize     src_pitch,
                    gsize     width,
                    gsize     height,
                    gboolean  streaming,
                    GError  **error)
{
  CpRegion to = region_of (dst);
  CpRegion from = region_of (src);

  return _cp_memory_copy_2d_region (&to, dst_offset, dst_pitch, &from, src_offset, src_pitch,
                                    width, height, streaming, error);
}

gboolean
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
                      gboolean            streaming,
                      GError            **error)
{
  CpRegion full_region = region_of (full);
  CpRegion local_region = region_of (local);

  return _cp_memory_copy_runs_region (&full_region, full_offset, full_pitch, first, &local_region,
                                      local_offset, local_pitch, runs, n_runs, step, outer,
                                      to_local, streaming, error);
}

gboolean
_cp_memory_copy (CpTensor *dst,
                 gsize     dst_offset,
                 CpTensor *src,
                 gsize     src_offset,
                 gsize     n,
                 gboolean  streaming,
                 GError  **error)
{
  return _cp_memory_copy_2d (dst, dst_offset, n, src, src_offset, n, n, 1, streaming, error);
}

gboolean
_cp_memory_download (gpointer  host,
                     CpTensor *src,
                     gsize     src_offset,
                     gsize     n,
                     GError  **error)
{
  CpRegion from = region_of (src);

  return _cp_memory_download_region (host, &from, src_offset, n, error);
}

gboolean
_cp_memory_upload (CpTensor      *dst,
                   gsize          dst_offset,
                   gconstpointer  host,
                   gsize          n,
                   GError       **error)
{
  CpRegion to = region_of (dst);

  return _cp_memory_upload_region (&to, dst_offset, host, n, error);
}

gboolean
_cp_memory_fill (CpTensor *dst,
                 gsize     offset,
                 gsize     count,
                 double    value,
                 GError  **error)
{
  CpRegion to = region_of (dst);

  return _cp_memory_fill_region (&to, offset, cp_tensor_get_dtype (dst), count, value, error);
}

gboolean
_cp_memory_equal (CpTensor *a,
                  CpTensor *b,
                  gsize     n,
                  GError  **error)
{
  CpRegion region_a = region_of (a);
  CpRegion region_b = region_of (b);

  return _cp_memory_equal_region (&region_a, &region_b, n, error);
}

gboolean
_cp_memory_synchronize (CpTensor *tensor,
                        GError  **error)
{
  return _cp_memory_synchronize_storage (cp_tensor_get_storage (tensor), error);
}

/* Called for every operand of every kernel launch: storage and offset
 * straight, no region on the stack. */
gpointer
_cp_memory_kernel_address (CpTensor *tensor)
{
  return _cp_memory_kernel_address_at (cp_tensor_get_storage (tensor),
                                       cp_tensor_get_storage_offset (tensor));
}
