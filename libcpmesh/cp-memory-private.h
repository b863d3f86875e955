/* cp-memory-private.h: the one place tensor bytes are touched
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-features.h"
#include "cp-region-private.h"
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
 * The calls take regions (cp-region-private.h): storage, offset and
 * length, never a tensor, so that this interface sits below the tensors
 * and the transports alike and finds a copy's memory from the storage
 * itself; the tensor-level calls further down only name a tensor's region
 * (cp-tensor-memory.c).
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

/* One shard-style copy of whole runs of positions between a full tensor
 * and a shard, in device addresses: position p of row o of the full
 * tensor starts at @full + o·@full_pitch + (p − @first)·@step, and the
 * runs follow each other in the shard from @local + o·@local_pitch, over
 * @outer rows; gathered into the shard when @to_local, scattered back
 * otherwise. */
typedef struct
{
  guint8             *full;
  gsize               full_pitch;
  gint64              first;
  guint8             *local;
  gsize               local_pitch;
  const cp_index_run *runs;
  guint               n_runs;
  gsize               step;
  gsize               outer;
  gboolean            to_local;
  CpMemoryDirection   direction;
  gboolean            streaming;
} CpRunsCopy;

/* Every operation gets the index of the device (of its kind) that holds
 * the memory, as the allocation recorded it; host and test memory have
 * only device 0.  Copies, fills and copy_runs may return before their
 * bytes are in place: the _cp_memory_*() calls below wait with
 * synchronize before they return, once per call, so the layer above
 * always sees finished bytes.  A failure is a GError, never only a log
 * line: the call above reports it. */
typedef struct
{
  CpDeviceKind kind;
  const char *name;

  /* Zero-filled when @zeroed; CP_TENSOR_ERROR_OUT_OF_MEMORY otherwise.
   * Writes the device the memory is on to @device_id. */
  gpointer (*alloc)          (gsize              size,
                              gboolean           zeroed,
                              int               *device_id,
                              GError           **error);
  void     (*free)           (int                device_id,
                              gpointer           address,
                              gsize              size);
  /* Which device holds @address: for buffers known only by their
   * address (a collective's).  NULL: device 0. */
  int      (*device_of)      (gconstpointer      address);
  /* Whether @size bytes at @address, which another framework says are on
   * device @device_id, are device memory there; NULL: nothing to check. */
  gboolean (*check_import)   (int                device_id,
                              gconstpointer      address,
                              gsize              size,
                              GError           **error);
  /* The widest pitch copy_2d takes for more than one row; 0: any.
   * _cp_memory_plan_2d decides, from it, how a 2-D copy is issued. */
  gsize    (*max_pitch)      (int                device_id);
  /* @height rows of @width bytes, each @dst_pitch / @src_pitch bytes after
   * the one before; when @height > 1 both pitches are at least @width
   * and at most max_pitch.  @streaming asks for stores that bypass the
   * cache (see _cp_copy_wants_streaming). */
  gboolean (*copy_2d)        (int                device_id,
                              gpointer           dst,
                              gsize              dst_pitch,
                              gconstpointer      src,
                              gsize              src_pitch,
                              gsize              width,
                              gsize              height,
                              CpMemoryDirection  direction,
                              gboolean           streaming,
                              GError           **error);
  /* All of @copy at once (a kernel); NULL: one copy_2d per run.  Only
   * for device-to-device copies. */
  gboolean (*copy_runs)      (int                device_id,
                              const CpRunsCopy  *copy,
                              GError           **error);
  /* @count copies of the @pattern_size bytes at @pattern (host memory);
   * @dst need not be aligned to @pattern_size. */
  gboolean (*fill)           (int                device_id,
                              gpointer           dst,
                              gconstpointer      pattern,
                              gsize              pattern_size,
                              gsize              count,
                              GError           **error);
  /* Waits until every copy and fill issued so far on @device_id is
   * complete, and reports what failed. */
  gboolean (*synchronize)    (int                device_id,
                              GError           **error);
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
/* The pool CUDA memory on @device_id comes from (a cudaMemPool_t), or
 * NULL before the first allocation there: for tests. */
gpointer _cp_memory_cuda_pool (int device_id);
#endif

/* The widest pitch test memory's 2-D copies take: test memory refuses
 * what a CUDA device refuses (a pitch below the width, or above its
 * cudaDevAttrMaxPitch), at a limit small enough for tests to reach. */
#define CP_MEMORY_TEST_MAX_PITCH ((gsize) 1 << 18)

/* How a 2-D copy is issued to memory whose copy_2d takes pitches up to
 * @max_pitch (0: any). */
typedef enum
{
  CP_MEMORY_PLAN_NOTHING,  /* no bytes */
  CP_MEMORY_PLAN_ONE_ROW,  /* one contiguous copy of width · height bytes */
  CP_MEMORY_PLAN_2D,       /* one 2-D copy */
  CP_MEMORY_PLAN_ROWS,     /* one copy per row: a pitch is below the width
                            * (a repeated source row) or above @max_pitch */
} CpMemoryPlan;

CpMemoryPlan _cp_memory_plan_2d (gsize width,
                                 gsize height,
                                 gsize dst_pitch,
                                 gsize src_pitch,
                                 gsize max_pitch);

/* Region-level moves.  Offsets and pitches are in bytes from the first
 * byte of the region they belong to; the memory must be reachable
 * (_cp_tensor_require_device, or _cp_memory_ops_for_kind for a transport's
 * own).  Regions must not overlap.  Each returns FALSE with an error
 * (CP_TENSOR_ERROR_DEVICE) when the memory failed; the bytes are complete
 * when it returns TRUE. */
gboolean  _cp_memory_copy_2d_region   (const CpRegion     *dst,
                                       gsize               dst_offset,
                                       gsize               dst_pitch,
                                       const CpRegion     *src,
                                       gsize               src_offset,
                                       gsize               src_pitch,
                                       gsize               width,
                                       gsize               height,
                                       gboolean            streaming,
                                       GError            **error);
/* Copies @n_runs runs of positions between @full, where position p of
 * row o starts at byte @full_offset + o·@full_pitch + (p − @first)·@step,
 * and @local, where the runs follow each other from byte @local_offset +
 * o·@local_pitch, over @outer rows: gathering them into @local when
 * @to_local, scattering them back otherwise.  Memory with a copy_runs
 * operation moves them all at once; other memory takes one 2-D copy a
 * run.  Either way there is one synchronisation. */
gboolean  _cp_memory_copy_runs_region (const CpRegion     *full,
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
                                       GError            **error);
/* Brings @n bytes of @src at @src_offset to @host, and back. */
gboolean  _cp_memory_download_region  (gpointer            host,
                                       const CpRegion     *src,
                                       gsize               src_offset,
                                       gsize               n,
                                       GError            **error);
gboolean  _cp_memory_upload_region    (const CpRegion     *dst,
                                       gsize               dst_offset,
                                       gconstpointer       host,
                                       gsize               n,
                                       GError            **error);
/* Sets @count elements of @dtype from byte @offset of @dst on to @value,
 * converted as cp_tensor_new_full() does. */
gboolean  _cp_memory_fill_region      (const CpRegion     *dst,
                                       gsize               offset,
                                       CpDType             dtype,
                                       gsize               count,
                                       double              value,
                                       GError            **error);
/* Whether the first @n bytes of @a and @b are the same; FALSE with
 * @error when they could not be read. */
gboolean  _cp_memory_equal_region     (const CpRegion     *a,
                                       const CpRegion     *b,
                                       gsize               n,
                                       GError            **error);
/* Waits for everything issued on the device that holds @storage. */
gboolean  _cp_memory_synchronize_storage (CpStorage       *storage,
                                          GError         **error);
/* Where @region's first byte, or byte @offset of @storage, is for the
 * kernels of its device. */
gpointer  _cp_memory_kernel_address_region (const CpRegion *region);
gpointer  _cp_memory_kernel_address_at     (CpStorage      *storage,
                                            gsize           offset);

/* A 2-D copy between addresses of memory @dst_kind and @src_kind, one of
 * them host memory or both the same kind: what the transports move. */
gboolean  _cp_memory_copy_2d_address  (gpointer      dst,
                                       CpDeviceKind  dst_kind,
                                       gsize         dst_pitch,
                                       gconstpointer src,
                                       CpDeviceKind  src_kind,
                                       gsize         src_pitch,
                                       gsize         width,
                                       gsize         height,
                                       gboolean      streaming,
                                       GError      **error);
/* Whether memory another framework exported through DLPack as @size
 * bytes at @address on device @device_id of @kind is there; TRUE for
 * memory this build cannot reach (nothing here reads it). */
gboolean  _cp_memory_check_import   (CpDeviceKind   kind,
                                     int            device_id,
                                     guintptr       address,
                                     gsize          size,
                                     GError       **error);

/* Tensor-level moves, for the layers above (cp-tensor-memory.c): each is
 * the region-level call on the tensors' regions
 * (_cp_tensor_get_region()), with offsets and pitches in bytes from the
 * first byte of the tensor they belong to. */
gboolean  _cp_memory_copy_2d        (CpTensor      *dst,
                                     gsize          dst_offset,
                                     gsize          dst_pitch,
                                     CpTensor      *src,
                                     gsize          src_offset,
                                     gsize          src_pitch,
                                     gsize          width,
                                     gsize          height,
                                     gboolean       streaming,
                                     GError       **error);
gboolean  _cp_memory_copy_runs      (CpTensor           *full,
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
                                     GError            **error);
gboolean  _cp_memory_copy           (CpTensor      *dst,
                                     gsize          dst_offset,
                                     CpTensor      *src,
                                     gsize          src_offset,
                                     gsize          n,
                                     gboolean       streaming,
                                     GError       **error);
gboolean  _cp_memory_download       (gpointer       host,
                                     CpTensor      *src,
                                     gsize          src_offset,
                                     gsize          n,
                                     GError       **error);
gboolean  _cp_memory_upload         (CpTensor      *dst,
                                     gsize          dst_offset,
                                     gconstpointer  host,
                                     gsize          n,
                                     GError       **error);
/* Sets @count elements of @dst from byte @offset on to @value,
 * converted to @dst's dtype. */
gboolean  _cp_memory_fill           (CpTensor      *dst,
                                     gsize          offset,
                                     gsize          count,
                                     double         value,
                                     GError       **error);
gboolean  _cp_memory_equal          (CpTensor      *a,
                                     CpTensor      *b,
                                     gsize          n,
                                     GError       **error);
gboolean  _cp_memory_synchronize    (CpTensor      *tensor,
                                     GError       **error);
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
