/* cp-tensor.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-storage.h"
#include "cp-types.h"

G_BEGIN_DECLS

#define CP_TYPE_TENSOR (cp_tensor_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpTensor, cp_tensor, CP, TENSOR, GObject)

CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new                 (CpDType         dtype,
                                             const gint64   *shape,
                                             guint           n_dims,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_from_bytes      (CpDType         dtype,
                                             const gint64   *shape,
                                             guint           n_dims,
                                             GBytes         *bytes,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_borrowed        (CpDType         dtype,
                                             const gint64   *shape,
                                             guint           n_dims,
                                             guintptr        address,
                                             gsize           size,
                                             CpReleaseFunc   release,
                                             gpointer        user_data,
                                             GDestroyNotify  destroy,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_from_storage    (CpDType         dtype,
                                             const gint64   *shape,
                                             guint           n_dims,
                                             CpStorage      *storage,
                                             gsize           offset,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_shared          (CpDType         dtype,
                                             const gint64   *shape,
                                             guint           n_dims,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_from_fd         (CpDType         dtype,
                                             const gint64   *shape,
                                             guint           n_dims,
                                             int             fd,
                                             goffset         offset,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_arange          (CpDType         dtype,
                                             gint64          start,
                                             gint64          end,
                                             gint64          step,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_full            (CpDType         dtype,
                                             const gint64   *shape,
                                             guint           n_dims,
                                             double          value,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
CpDType       cp_tensor_get_dtype           (CpTensor       *self);
CP_AVAILABLE_IN_ALL
const gint64 *cp_tensor_get_shape           (CpTensor       *self,
                                             guint          *n_dims);
CP_AVAILABLE_IN_ALL
guint         cp_tensor_get_n_dims          (CpTensor       *self);
CP_AVAILABLE_IN_ALL
gint64        cp_tensor_get_dim             (CpTensor       *self,
                                             int             dim);
CP_AVAILABLE_IN_ALL
gint64        cp_tensor_get_numel           (CpTensor       *self);
CP_AVAILABLE_IN_ALL
gsize         cp_tensor_get_nbytes          (CpTensor       *self);
CP_AVAILABLE_IN_ALL
CpDeviceKind  cp_tensor_get_device          (CpTensor       *self);
CP_AVAILABLE_IN_ALL
CpStorage    *cp_tensor_get_storage         (CpTensor       *self);
CP_AVAILABLE_IN_ALL
gsize         cp_tensor_get_storage_offset  (CpTensor       *self);
CP_AVAILABLE_IN_ALL
guintptr      cp_tensor_get_data_address    (CpTensor       *self);
CP_AVAILABLE_IN_ALL
gpointer      cp_tensor_get_data            (CpTensor       *self);
CP_AVAILABLE_IN_ALL
int           cp_tensor_get_fd              (CpTensor       *self);
CP_AVAILABLE_IN_ALL
GBytes       *cp_tensor_dup_bytes           (CpTensor       *self) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean      cp_tensor_get_requires_grad   (CpTensor       *self);
CP_AVAILABLE_IN_ALL
void          cp_tensor_set_requires_grad   (CpTensor       *self,
                                             gboolean        requires_grad);
CP_AVAILABLE_IN_ALL
char         *cp_tensor_describe            (CpTensor       *self) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
double        cp_tensor_get_value           (CpTensor       *self,
                                             gint64          index);
CP_AVAILABLE_IN_ALL
void          cp_tensor_set_value           (CpTensor       *self,
                                             gint64          index,
                                             double          value);

CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_copy                (CpTensor       *self,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean      cp_tensor_equal               (CpTensor       *self,
                                             CpTensor       *other);
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_narrow              (CpTensor       *self,
                                             int             dim,
                                             gint64          start,
                                             gint64          length,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_reshape             (CpTensor       *self,
                                             const gint64   *new_shape,
                                             guint           n_dims,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_to_device           (CpTensor       *self,
                                             CpDeviceKind    device,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;

/* DLPack exchange (cp-tensor-dlpack.c); the pointers are DLManagedTensor *. */
CP_AVAILABLE_IN_ALL
CpTensor     *cp_tensor_new_from_dlpack     (gpointer        dlpack,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gpointer      cp_tensor_to_dlpack           (CpTensor       *self,
                                             GError        **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean      cp_tensor_get_dlpack_device   (CpTensor       *self,
                                             int            *device_type,
                                             int            *device_id,
                                             GError        **error);
CP_AVAILABLE_IN_ALL
gboolean      cp_tensor_prepare_dlpack_stream (CpTensor     *self,
                                               gint64        stream,
                                               GError      **error);

G_END_DECLS
