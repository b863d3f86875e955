/* cp-host-memory-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

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

G_END_DECLS
