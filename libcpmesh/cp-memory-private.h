/* cp-memory-private.h: the one place tensor bytes are touched
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-features.h"
#include "cp-tensor.h"
#include "kernels/cp-index-math.h"

G_BEGIN_DECLS

/* Every kind of memory a tensor may live in brings a table of operations,
 * as a GstAllocator does for GStreamer: allocation, copies in and out of
 * it and within it, fills, and the address its kernels compute on.
 * Storage carries the table of its memory, and every layer above (layout,
 * batch, THD, context, mesh, attention) moves tensor bytes only through
 * the _cp_memory_*() calls below, never with memcpy on a tensor's
 * address: on a device that address is not host-dereferenceable.
 *
 * Addresses given to the operations are device addresses — what
 * cp_tensor_get_data_address() shows — and host addresses on the host
 * side of an upload or download. */

typedef enum
{
  CP_MEMORY_HOST_TO_DEVICE,
  CP_MEMORY_DEVICE_TO_HOST,
  CP_MEMORY_DEVICE_TO_DEVICE,
} CpMemoryDirection;

typedef struct
{
  CpDeviceKind kind;
  const char *name;

  /* Zero-filled when @zeroed; CP_TENSOR_ERROR_OUT_OF_MEMORY otherwise. */
  gpointer (*alloc)          (gsize              size,
                              gboolean           zeroed,
                              GError           **error);
  void     (*free)           (gpointer           address,
                              gsize              size);
  /* @height rows of @width bytes, each @dst_pitch / @src_pitch bytes after
   * the one before; @streaming asks for stores that bypass the cache
   * (see _cp_copy_wants_streaming). */
  void     (*copy_2d)        (gpointer           dst,
                              gsize              dst_pitch,
                              gconstpointer      src,
                              gsize              src_pitch,
                              gsize              width,
                              gsize              height,
                              CpMemoryDirection  direction,
                              gboolean           streaming);
  /* @count copies of the @pattern_size bytes at @pattern (host memory). */
  void     (*fill)           (gpointer           dst,
                              gconstpointer      pattern,
                              gsize              pattern_size,
                              gsize              count);
  /* Waits until every copy and fill issued so far is complete. */
  void     (*synchronize)    (void);
  /* The address this device's kernels use for the byte at @address;
   * NULL when they use @address itself (host memory, CUDA). */
  gpointer (*kernel_address) (gpointer           address);
} CpMemoryOps;

/* The operations of @kind, or NULL when this build cannot reach it. */
const CpMemoryOps *_cp_memory_ops_for_kind (CpDeviceKind kind);

extern const CpMemoryOps _cp_memory_host_ops;
extern const CpMemoryOps _cp_memory_test_ops;
#if CP_HAS_CUDA
extern const CpMemoryOps _cp_memory_cuda_ops;
#endif

/* Tensor-level moves.  Offsets and pitches are in bytes from the first
 * byte of the tensor they belong to; the tensors must be reachable
 * (_cp_tensor_require_device).  Regions must not overlap. */
void      _cp_memory_copy_2d        (CpTensor      *dst,
                                     gsize          dst_offset,
                                     gsize          dst_pitch,
                                     CpTensor      *src,
                                     gsize          src_offset,
                                     gsize          src_pitch,
                                     gsize          width,
                                     gsize          height,
                                     gboolean       streaming);
/* Copies @n_runs runs of positions between @full, where position p of
 * row o starts at byte @full_offset + o·@full_pitch + (p − @first)·@step,
 * and @local, where the runs follow each other from byte @local_offset +
 * o·@local_pitch, over @outer rows: gathering them into @local when
 * @to_local, scattering them back otherwise.  Each run is one 2-D copy;
 * the memory is resolved once for all of them, since runs can be short. */
void      _cp_memory_copy_runs      (CpTensor           *full,
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
                                     gboolean            streaming);
void      _cp_memory_copy           (CpTensor      *dst,
                                     gsize          dst_offset,
                                     CpTensor      *src,
                                     gsize          src_offset,
                                     gsize          n,
                                     gboolean       streaming);
/* Brings @n bytes of @src at @src_offset to @host, and back. */
void      _cp_memory_download       (gpointer       host,
                                     CpTensor      *src,
                                     gsize          src_offset,
                                     gsize          n);
void      _cp_memory_upload         (CpTensor      *dst,
                                     gsize          dst_offset,
                                     gconstpointer  host,
                                     gsize          n);
/* The same at a device address of memory @device, for buffers that are
 * no longer tensors (a collective's send and receive buffers). */
void      _cp_memory_download_address (CpDeviceKind  device,
                                       gpointer      host,
                                       gconstpointer address,
                                       gsize         n);
void      _cp_memory_upload_address   (CpDeviceKind  device,
                                       gpointer      address,
                                       gconstpointer host,
                                       gsize         n);
/* Sets @count elements of @dst from @offset on to @value, converted to
 * @dst's dtype as cp_tensor_new_full() does. */
void      _cp_memory_fill           (CpTensor      *dst,
                                     gsize          offset,
                                     gsize          count,
                                     double         value);
/* Whether the first @n bytes of @a and @b are the same. */
gboolean  _cp_memory_equal          (CpTensor      *a,
                                     CpTensor      *b,
                                     gsize          n);
void      _cp_memory_synchronize    (CpTensor      *tensor);
/* Where @tensor's first byte is for the kernels of its device. */
gpointer  _cp_memory_kernel_address (CpTensor      *tensor);

/* Host memory, which the transports also use directly for their own
 * buffers. */

/* Host allocations for tensor storage: 64-byte aligned, and large blocks
 * are recycled through a bounded cache, because copying into freshly
 * faulted pages runs at a tenth of the speed of copying into warm ones.
 * The cache holds at most CPMESH_HOST_CACHE_MB mebibytes (default a
 * quarter of physical memory, at least 1024; 0 turns it off). */
gpointer _cp_host_alloc       (gsize     size,
                               gboolean  zeroed,
                               GError  **error);
void     _cp_host_free        (gpointer  data,
                               gsize     size);

/* Bulk copies for shard, unshard and the in-process collectives.
 *
 * An operation whose destination is larger than a core's share of the
 * last-level cache copies with non-temporal (streaming) stores: its bytes
 * will not stay cached anyway, and a streaming store skips the read for
 * ownership an ordinary store pays per cache line, which is a third of
 * the memory traffic.  glibc's memcpy makes the same choice, but per
 * call, so an operation made of many mid-sized runs would never stream
 * and would run at about half the speed of one large memcpy of the same
 * bytes.  Callers therefore decide once per operation, from its total
 * size, and pass the decision to every copy. */

/* Whether an operation writing @total_bytes should stream. */
gboolean  _cp_copy_wants_streaming (gsize          total_bytes);

/* memcpy, with streaming stores when @streaming.  Regions must not
 * overlap.  Streaming stores are fenced before this returns, so the bytes
 * are visible to whichever thread synchronises with this one next. */
void      _cp_copy                 (gpointer       dst,
                                    gconstpointer  src,
                                    gsize          n,
                                    gboolean       streaming);

G_END_DECLS
