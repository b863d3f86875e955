/* cp-storage-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-memory-private.h"
#include "cp-storage.h"

G_BEGIN_DECLS

/* Storage allocated by the memory of @device, which must be reachable
 * (_cp_memory_ops_for_kind); it may skip zero-filling, for outputs that
 * are about to be overwritten completely. */
CpStorage *_cp_storage_new_on_device (CpDeviceKind   device,
                                      gsize          size,
                                      gboolean       zeroed,
                                      GError       **error);

/* Memory another framework exported through DLPack: borrowed memory that
 * also says which device holds it, so that it can be exported again as it
 * came.  @release gives it back (calls the DLPack deleter). */
CpStorage *_cp_storage_new_dlpack    (CpDeviceKind   device,
                                      int            device_id,
                                      guintptr       address,
                                      gsize          size,
                                      CpReleaseFunc  release,
                                      gpointer       user_data);

/* Which device of its kind holds the bytes: 0 for host and test memory,
 * the device current at allocation for CUDA memory the library allocated
 * (the allocation records it), what DLPack said for imported memory. */
int        _cp_storage_get_device_id (CpStorage     *self);

/* A number no other storage of this process has had or will have,
 * never 0: what a peer that mapped or registered @self's bytes caches
 * them by, where an address could be reused once @self is freed. */
guint64    _cp_storage_get_id        (CpStorage     *self);

/* The operations of the memory holding @self's bytes, or NULL when this
 * build cannot reach it (a CUDA tensor imported through DLPack). */
const CpMemoryOps *_cp_storage_get_memory (CpStorage *self);

G_END_DECLS
