/* cp-region-private.h: the memory a transport moves, named by its storage
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-storage.h"

G_BEGIN_DECLS

/* @length bytes of @storage from byte @offset on, in memory of kind
 * @device (the storage's).  Collectives and messages hand transports
 * regions rather than addresses, so that a backend can reach what is
 * behind the bytes — share the memfd of shared storage, register the
 * storage once and find it again by its id (_cp_storage_get_id), or fall
 * back to copying from the address the memory interface gives
 * (_cp_region_get_address).
 *
 * A region holds a reference on its storage from _cp_region_init*() to
 * _cp_region_clear(), so memory a collective or a posted message names
 * stays alive until it is done, even when the tensor it came from is
 * dropped or a context swaps that tensor's storage meanwhile.  A region
 * copied by value borrows the original's reference: only one of them is
 * cleared.  A zero-filled region ({ 0 }, CP_REGION_NONE) names nothing. */
typedef struct
{
  CpStorage *storage;
  gsize offset;
  gsize length;
  CpDeviceKind device;
} CpRegion;

#define CP_REGION_NONE ((CpRegion) { NULL, 0, 0, CP_DEVICE_KIND_HOST })

/* Names @length bytes of @storage from @offset on, which must lie inside
 * it, and takes a reference on @storage. */
void          _cp_region_init         (CpRegion       *region,
                                       CpStorage      *storage,
                                       gsize           offset,
                                       gsize           length);

/* Names @length bytes of host memory at @address that the caller owns and
 * keeps valid until the region is cleared: the library's own small
 * buffers (descriptor tables, staging copies), which no peer shares. */
void          _cp_region_init_host    (CpRegion       *region,
                                       gpointer        address,
                                       gsize           length);

/* Drops the region's reference and leaves it naming nothing. */
void          _cp_region_clear        (CpRegion       *region);

/* Whether @region names memory at all. */
static inline gboolean
_cp_region_is_set (const CpRegion *region)
{
  return region->storage != NULL;
}

/* The address of the region's first byte as the memory interface gives
 * it — a device address for device memory (cp-memory-private.h) — or
 * NULL when it names nothing or its storage has no bytes. */
gpointer      _cp_region_get_address  (const CpRegion *region);

/* _cp_storage_get_id() of the region's storage; 0 when it names nothing. */
guint64       _cp_region_get_storage_id (const CpRegion *region);

G_END_DECLS
