/* cp-mesh.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <gio/gio.h>

#include "cp-layout.h"
#include "cp-mesh-options.h"
#include "cp-tensor.h"
#include "cp-types.h"

G_BEGIN_DECLS

#define CP_TYPE_MESH (cp_mesh_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpMesh, cp_mesh, CP, MESH, GObject)

CP_AVAILABLE_IN_ALL
GList              *cp_mesh_new_local_group   (const char * const  *dim_names,
                                               const int           *dim_sizes,
                                               gsize                n_dims,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
CpMesh             *cp_mesh_new_from_env      (GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpMesh             *cp_mesh_new_ucx           (int                  rank,
                                               int                  world_size,
                                               const char          *address,
                                               guint                port,
                                               const char          *token,
                                               const char * const  *dim_names,
                                               const int           *dim_sizes,
                                               gsize                n_dims,
                                               guint                timeout_ms,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpMesh             *cp_mesh_new_with_options  (CpMeshOptions       *options,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
void                cp_mesh_connect_async     (const char * const  *environment,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
CpMesh             *cp_mesh_connect_finish    (GAsyncResult        *result,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
int                 cp_mesh_get_rank          (CpMesh              *self);
CP_AVAILABLE_IN_ALL
int                 cp_mesh_get_world_size    (CpMesh              *self);
CP_AVAILABLE_IN_ALL
const char         *cp_mesh_get_backend       (CpMesh              *self);
CP_AVAILABLE_IN_ALL
const char * const *cp_mesh_get_dim_names     (CpMesh              *self);
CP_AVAILABLE_IN_ALL
char              **cp_mesh_dup_dim_names     (CpMesh              *self) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
const int          *cp_mesh_get_dim_sizes     (CpMesh              *self,
                                               gsize               *n_dims);
CP_AVAILABLE_IN_ALL
int                 cp_mesh_get_dim_size      (CpMesh              *self,
                                               const char          *dim_name);
CP_AVAILABLE_IN_ALL
int                 cp_mesh_get_coordinate    (CpMesh              *self,
                                               const char          *dim_name);
CP_AVAILABLE_IN_ALL
int                 cp_mesh_get_local_rank    (CpMesh              *self);
CP_AVAILABLE_IN_ALL
guint               cp_mesh_get_timeout_ms    (CpMesh              *self);
CP_AVAILABLE_IN_ALL
void                cp_mesh_set_timeout_ms    (CpMesh              *self,
                                               guint                timeout_ms);
CP_AVAILABLE_IN_ALL
CpMesh             *cp_mesh_get_submesh       (CpMesh              *self,
                                               const char          *dim_name,
                                               GError             **error);

CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_all_gather        (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dim,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_all_gather_into   (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dim,
                                               CpTensor            *out,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_all_to_all        (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dim,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_all_to_all_into   (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dim,
                                               CpTensor            *out,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_all_reduce        (CpMesh              *self,
                                               CpTensor            *tensor,
                                               CpReduceOp           op,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_broadcast         (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  root,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_send              (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dst,
                                               guint                tag,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_recv              (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  src,
                                               guint                tag,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_send_recv         (CpMesh              *self,
                                               CpTensor            *send_tensor,
                                               int                  dst,
                                               CpTensor            *recv_tensor,
                                               int                  src,
                                               guint                tag,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_barrier           (CpMesh              *self,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
void                cp_mesh_barrier_async     (CpMesh              *self,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_barrier_finish    (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error);

CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_unshard           (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  seq_dim,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_unshard_layout    (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  seq_dim,
                                               CpLayout            *layout,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
void                cp_mesh_all_gather_async  (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dim,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_all_gather_finish (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
void                cp_mesh_all_gather_into_async (CpMesh          *self,
                                               CpTensor            *tensor,
                                               int                  dim,
                                               CpTensor            *out,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_all_gather_into_finish (CpMesh         *self,
                                               GAsyncResult        *result,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
void                cp_mesh_all_to_all_async  (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dim,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_all_to_all_finish (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
void                cp_mesh_all_reduce_async  (CpMesh              *self,
                                               CpTensor            *tensor,
                                               CpReduceOp           op,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_all_reduce_finish (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
void                cp_mesh_broadcast_async   (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  root,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_broadcast_finish  (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
void                cp_mesh_send_async        (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  dst,
                                               guint                tag,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_send_finish       (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
void                cp_mesh_recv_async        (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  src,
                                               guint                tag,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_recv_finish       (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
void                cp_mesh_send_recv_async   (CpMesh              *self,
                                               CpTensor            *send_tensor,
                                               int                  dst,
                                               CpTensor            *recv_tensor,
                                               int                  src,
                                               guint                tag,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
gboolean            cp_mesh_send_recv_finish  (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error);
CP_AVAILABLE_IN_ALL
void                cp_mesh_unshard_async     (CpMesh              *self,
                                               CpTensor            *tensor,
                                               int                  seq_dim,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_unshard_finish    (CpMesh              *self,
                                               GAsyncResult        *result,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;
CP_AVAILABLE_IN_ALL
void                cp_mesh_unshard_layout_async (CpMesh           *self,
                                               CpTensor            *tensor,
                                               int                  seq_dim,
                                               CpLayout            *layout,
                                               GCancellable        *cancellable,
                                               GAsyncReadyCallback  callback,
                                               gpointer             user_data);
CP_AVAILABLE_IN_ALL
CpTensor           *cp_mesh_unshard_layout_finish (CpMesh          *self,
                                               GAsyncResult        *result,
                                               GError             **error) G_GNUC_WARN_UNUSED_RESULT;

G_END_DECLS
