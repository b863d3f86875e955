/* cp-storage-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-storage.h"

G_BEGIN_DECLS

/* Host storage that may skip zero-filling, for outputs that are about to be
 * overwritten completely. */
CpStorage *_cp_storage_new_host (gsize      size,
                                 gboolean   zeroed,
                                 GError   **error);

G_END_DECLS
