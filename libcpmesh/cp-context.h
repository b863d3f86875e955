/* cp-context.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-layout.h"
#include "cp-mesh.h"
#include "cp-tensor.h"
#include "cp-types.h"

G_BEGIN_DECLS

#define CP_TYPE_CONTEXT (cp_context_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpContext, cp_context, CP, CONTEXT, GObject)

/**
 * CpContextFunc:
 * @context: the entered context
 * @user_data: the data given to [method@Cp.Context.run]
 *
 * The work [method@Cp.Context.run] does while @context is entered.
 *
 * Since: 1.0
 */
typedef void (*CpContextFunc) (CpContext *context,
                               gpointer   user_data);

CP_AVAILABLE_IN_ALL
CpContext      *cp_context_new                  (CpMesh          *mesh,
                                                 CpRotateMethod   rotate_method) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
CpMesh         *cp_context_get_mesh             (CpContext       *self);
CP_AVAILABLE_IN_ALL
CpRotateMethod  cp_context_get_rotate_method    (CpContext       *self);
CP_AVAILABLE_IN_ALL
int             cp_context_get_cp_size          (CpContext       *self);
CP_AVAILABLE_IN_ALL
int             cp_context_get_cp_rank          (CpContext       *self);
CP_AVAILABLE_IN_ALL
gboolean        cp_context_is_entered           (CpContext       *self);
CP_AVAILABLE_IN_ALL
CpLayout       *cp_context_get_layout           (CpContext       *self);

CP_AVAILABLE_IN_ALL
gboolean        cp_context_register_buffer      (CpContext       *self,
                                                 CpTensor        *tensor,
                                                 int              seq_dim,
                                                 gboolean         restore,
                                                 GError         **error);
CP_AVAILABLE_IN_ALL
guint           cp_context_get_n_buffers        (CpContext       *self);
CP_AVAILABLE_IN_ALL
CpTensor       *cp_context_get_buffer           (CpContext       *self,
                                                 guint            index);
CP_AVAILABLE_IN_ALL
int             cp_context_get_buffer_seq_dim   (CpContext       *self,
                                                 guint            index);
CP_AVAILABLE_IN_ALL
gboolean        cp_context_get_buffer_restores  (CpContext       *self,
                                                 guint            index);
CP_AVAILABLE_IN_ALL
const char     *cp_context_get_buffer_name      (CpContext       *self,
                                                 guint            index);

CP_AVAILABLE_IN_ALL
gboolean        cp_context_enter                (CpContext       *self,
                                                 GError         **error);
CP_AVAILABLE_IN_ALL
gboolean        cp_context_exit                 (CpContext       *self,
                                                 GError         **error);
CP_AVAILABLE_IN_ALL
gboolean        cp_context_run                  (CpContext       *self,
                                                 CpContextFunc    func,
                                                 gpointer         user_data,
                                                 GError         **error);
CP_AVAILABLE_IN_ALL
CpTensor       *cp_context_unshard              (CpContext       *self,
                                                 CpTensor        *tensor,
                                                 int              seq_dim,
                                                 GError         **error) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
void            cp_context_enter_async          (CpContext           *self,
                                                 GCancellable        *cancellable,
                                                 GAsyncReadyCallback  callback,
                                                 gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean        cp_context_enter_finish         (CpContext           *self,
                                                 GAsyncResult        *result,
                                                 GError             **error);
CP_AVAILABLE_IN_ALL
void            cp_context_exit_async           (CpContext           *self,
                                                 GCancellable        *cancellable,
                                                 GAsyncReadyCallback  callback,
                                                 gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean        cp_context_exit_finish          (CpContext           *self,
                                                 GAsyncResult        *result,
                                                 GError             **error);
CP_AVAILABLE_IN_ALL
void            cp_context_unshard_async        (CpContext           *self,
                                                 CpTensor            *tensor,
                                                 int                  seq_dim,
                                                 GCancellable        *cancellable,
                                                 GAsyncReadyCallback  callback,
                                                 gpointer             user_data);
CP_AVAILABLE_IN_ALL
CpTensor       *cp_context_unshard_finish       (CpContext           *self,
                                                 GAsyncResult        *result,
                                                 GError             **error) G_GNUC_WARN_UNUSED_RESULT;

G_END_DECLS
