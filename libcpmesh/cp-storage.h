/* cp-storage.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-types.h"

G_BEGIN_DECLS

#define CP_TYPE_STORAGE (cp_storage_get_type ())

/**
 * CpStorageKind:
 * @CP_STORAGE_KIND_OWNED: 64-byte aligned memory the library allocated
 * @CP_STORAGE_KIND_BYTES: the contents of a #GBytes, not copied
 * @CP_STORAGE_KIND_BORROWED: foreign memory, released through a callback or
 *   kept alive by an owner object
 * @CP_STORAGE_KIND_FD: a mapping of a memfd or dma-buf that other processes
 *   can map too
 * @CP_STORAGE_KIND_DLPACK: memory another framework exported through DLPack,
 *   given back through its deleter (see [ctor@Cp.Tensor.new_from_dlpack])
 *
 * Where the bytes of a [struct@Cp.Storage] come from.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_STORAGE_KIND_OWNED,
  CP_STORAGE_KIND_BYTES,
  CP_STORAGE_KIND_BORROWED,
  CP_STORAGE_KIND_FD,
  CP_STORAGE_KIND_DLPACK,
} CpStorageKind;

/**
 * CpReleaseFunc:
 * @user_data: the data given with the memory
 *
 * Called once when borrowed memory is no longer used by any tensor.
 *
 * Since: 1.0
 */
typedef void (*CpReleaseFunc) (gpointer user_data);

typedef struct _CpStorage CpStorage;

CP_AVAILABLE_IN_ALL
GType          cp_storage_get_type         (void) G_GNUC_CONST;
CP_AVAILABLE_IN_ALL
CpStorage     *cp_storage_new              (gsize          size,
                                            GError       **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpStorage     *cp_storage_new_shared       (gsize          size,
                                            GError       **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpStorage     *cp_storage_new_from_bytes   (GBytes        *bytes) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpStorage     *cp_storage_new_borrowed     (guintptr       address,
                                            gsize          size,
                                            CpReleaseFunc  release,
                                            gpointer       user_data,
                                            GDestroyNotify destroy) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpStorage     *cp_storage_new_with_owner   (guintptr       address,
                                            gsize          size,
                                            GObject       *owner) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpStorage     *cp_storage_new_from_fd      (int            fd,
                                            goffset        offset,
                                            gsize          size,
                                            GError       **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpStorage     *cp_storage_ref              (CpStorage     *self);
CP_AVAILABLE_IN_ALL
void           cp_storage_unref            (CpStorage     *self);
CP_AVAILABLE_IN_ALL
gsize          cp_storage_get_size         (CpStorage     *self);
CP_AVAILABLE_IN_ALL
CpStorageKind  cp_storage_get_kind         (CpStorage     *self);
CP_AVAILABLE_IN_ALL
CpDeviceKind   cp_storage_get_device       (CpStorage     *self);
CP_AVAILABLE_IN_ALL
guintptr       cp_storage_get_data_address (CpStorage     *self);
CP_AVAILABLE_IN_ALL
gpointer       cp_storage_get_data         (CpStorage     *self);
CP_AVAILABLE_IN_ALL
int            cp_storage_get_fd           (CpStorage     *self);
CP_AVAILABLE_IN_ALL
gboolean       cp_storage_get_read_only    (CpStorage     *self);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (CpStorage, cp_storage_unref)

G_END_DECLS
