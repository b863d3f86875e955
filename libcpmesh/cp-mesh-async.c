/* cp-mesh-async.c: the collectives of a mesh for main-loop programs
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-mesh.h"
#include "cp-task-private.h"

/* Each pair runs the blocking call on a worker (cp-task.c); the run
 * functions unpack the arguments the _async function packed, and calls
 * of one shape share one. */

/**
 * cp_mesh_barrier_async:
 * @self: a mesh
 * @cancellable: (nullable): cancels the barrier on every rank, which
 *   breaks the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.barrier] on a worker thread, so that main-loop
 * programs (gjs, GTK) do not block. The mesh belongs to the call until
 * @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_barrier_async (CpMesh              *self,
                       GCancellable        *cancellable,
                       GAsyncReadyCallback  callback,
                       gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));

  _cp_task_start (self, self, "barrier", cp_mesh_barrier_async, _cp_task_run_plain,
                  &(CpTaskArgs) { .blocking = G_CALLBACK (cp_mesh_barrier) },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_barrier_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.barrier_async].
 *
 * Returns: %TRUE when every rank reached the barrier; %FALSE with the
 *   errors of [method@Cp.Mesh.barrier], or %CP_MESH_ERROR_CANCELLED
 *
 * Since: 1.0
 */
gboolean
cp_mesh_barrier_finish (CpMesh        *self,
                        GAsyncResult  *result,
                        GError       **error)
{
  return _cp_task_finish (self, result, cp_mesh_barrier_async, error, 0);
}

/**
 * cp_mesh_all_gather_async:
 * @self: a mesh
 * @tensor: this rank's piece; every rank passes the same dtype and shape
 * @dim: the dimension to concatenate along; negative values count from
 *   the last
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.all_gather] on a worker thread. The mesh and
 * @tensor belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_all_gather_async (CpMesh              *self,
                          CpTensor            *tensor,
                          int                  dim,
                          GCancellable        *cancellable,
                          GAsyncReadyCallback  callback,
                          gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));

  _cp_task_start (self, self, "all_gather", cp_mesh_all_gather_async, _cp_task_run_tensor,
                  &(CpTaskArgs) { G_CALLBACK (cp_mesh_all_gather), { tensor }, { dim } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_all_gather_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.all_gather_async].
 *
 * Returns: (transfer full): the concatenation, or %NULL with the errors of
 *   [method@Cp.Mesh.all_gather], or %CP_MESH_ERROR_CANCELLED
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_all_gather_finish (CpMesh        *self,
                           GAsyncResult  *result,
                           GError       **error)
{
  return _cp_task_finish_object (self, result, cp_mesh_all_gather_async, error);
}

static gboolean
all_gather_into_run (gpointer     self,
                     CpTaskArgs  *args,
                     GError     **error)
{
  return cp_mesh_all_gather_into (self, args->objects[0], (int) args->values[0], args->objects[1],
                                  error);
}

/**
 * cp_mesh_all_gather_into_async:
 * @self: a mesh
 * @tensor: this rank's piece; every rank passes the same dtype and shape
 * @dim: the dimension to concatenate along
 * @out: the result: @tensor's shape with @dim multiplied by the world size
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.all_gather_into] on a worker thread. The mesh,
 * @tensor and @out belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_all_gather_into_async (CpMesh              *self,
                               CpTensor            *tensor,
                               int                  dim,
                               CpTensor            *out,
                               GCancellable        *cancellable,
                               GAsyncReadyCallback  callback,
                               gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));
  g_return_if_fail (CP_IS_TENSOR (out));

  _cp_task_start (self, self, "all_gather", cp_mesh_all_gather_into_async, all_gather_into_run,
                  &(CpTaskArgs) { .objects = { tensor, out }, .values = { dim } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_all_gather_into_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.all_gather_into_async].
 *
 * Returns: %TRUE when the output holds every rank's piece
 *
 * Since: 1.0
 */
gboolean
cp_mesh_all_gather_into_finish (CpMesh        *self,
                                GAsyncResult  *result,
                                GError       **error)
{
  return _cp_task_finish (self, result, cp_mesh_all_gather_into_async, error, 0);
}

/**
 * cp_mesh_all_to_all_async:
 * @self: a mesh
 * @tensor: this rank's tensor; every rank passes the same dtype and shape
 * @dim: the dimension to split and concatenate along
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.all_to_all] on a worker thread. The mesh and
 * @tensor belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_all_to_all_async (CpMesh              *self,
                          CpTensor            *tensor,
                          int                  dim,
                          GCancellable        *cancellable,
                          GAsyncReadyCallback  callback,
                          gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));

  _cp_task_start (self, self, "all_to_all", cp_mesh_all_to_all_async, _cp_task_run_tensor,
                  &(CpTaskArgs) { G_CALLBACK (cp_mesh_all_to_all), { tensor }, { dim } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_all_to_all_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.all_to_all_async].
 *
 * Returns: (transfer full): the exchanged tensor, or %NULL with an error
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_all_to_all_finish (CpMesh        *self,
                           GAsyncResult  *result,
                           GError       **error)
{
  return _cp_task_finish_object (self, result, cp_mesh_all_to_all_async, error);
}

static gboolean
all_reduce_run (gpointer     self,
                CpTaskArgs  *args,
                GError     **error)
{
  return cp_mesh_all_reduce (self, args->objects[0], (CpReduceOp) args->values[0], error);
}

/**
 * cp_mesh_all_reduce_async:
 * @self: a mesh
 * @tensor: this rank's tensor, replaced in place by the result
 * @op: the reduction
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.all_reduce] on a worker thread. The mesh and
 * @tensor belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_all_reduce_async (CpMesh              *self,
                          CpTensor            *tensor,
                          CpReduceOp           op,
                          GCancellable        *cancellable,
                          GAsyncReadyCallback  callback,
                          gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));
  g_return_if_fail (op <= CP_REDUCE_OP_MIN);

  _cp_task_start (self, self, "all_reduce", cp_mesh_all_reduce_async, all_reduce_run,
                  &(CpTaskArgs) { .objects = { tensor }, .values = { op } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_all_reduce_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.all_reduce_async].
 *
 * Returns: %TRUE when the tensor holds the reduction
 *
 * Since: 1.0
 */
gboolean
cp_mesh_all_reduce_finish (CpMesh        *self,
                           GAsyncResult  *result,
                           GError       **error)
{
  return _cp_task_finish (self, result, cp_mesh_all_reduce_async, error, 0);
}

static gboolean
broadcast_run (gpointer     self,
               CpTaskArgs  *args,
               GError     **error)
{
  return cp_mesh_broadcast (self, args->objects[0], (int) args->values[0], error);
}

/**
 * cp_mesh_broadcast_async:
 * @self: a mesh
 * @tensor: the root's data; on every other rank, replaced in place by it
 * @root: the rank whose tensor is sent
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.broadcast] on a worker thread. The mesh and
 * @tensor belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_broadcast_async (CpMesh              *self,
                         CpTensor            *tensor,
                         int                  root,
                         GCancellable        *cancellable,
                         GAsyncReadyCallback  callback,
                         gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));

  _cp_task_start (self, self, "broadcast", cp_mesh_broadcast_async, broadcast_run,
                  &(CpTaskArgs) { .objects = { tensor }, .values = { root } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_broadcast_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.broadcast_async].
 *
 * Returns: %TRUE when the tensor holds the root's data
 *
 * Since: 1.0
 */
gboolean
cp_mesh_broadcast_finish (CpMesh        *self,
                          GAsyncResult  *result,
                          GError       **error)
{
  return _cp_task_finish (self, result, cp_mesh_broadcast_async, error, 0);
}

/* send and recv: (mesh, tensor, peer, tag). */
static gboolean
message_run (gpointer     self,
             CpTaskArgs  *args,
             GError     **error)
{
  gboolean (*blocking) (CpMesh *, CpTensor *, int, guint, GError **) = (gpointer) args->blocking;

  return blocking (self, args->objects[0], (int) args->values[0], (guint) args->values[1], error);
}

/**
 * cp_mesh_send_async:
 * @self: a mesh
 * @tensor: the data to send
 * @dst: the receiving rank, not this one
 * @tag: matches the send with the receive of the same tag
 * @cancellable: (nullable): cancels the send, which breaks the mesh on
 *   every rank ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.send] on a worker thread. The mesh and @tensor
 * belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_send_async (CpMesh              *self,
                    CpTensor            *tensor,
                    int                  dst,
                    guint                tag,
                    GCancellable        *cancellable,
                    GAsyncReadyCallback  callback,
                    gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));

  _cp_task_start (self, self, "send", cp_mesh_send_async, message_run,
                  &(CpTaskArgs) { G_CALLBACK (cp_mesh_send), { tensor }, { dst, tag } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_send_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.send_async].
 *
 * Returns: %TRUE once the receiver took the data
 *
 * Since: 1.0
 */
gboolean
cp_mesh_send_finish (CpMesh        *self,
                     GAsyncResult  *result,
                     GError       **error)
{
  return _cp_task_finish (self, result, cp_mesh_send_async, error, 0);
}

/**
 * cp_mesh_recv_async:
 * @self: a mesh
 * @tensor: where to receive; its dtype and shape must match what is sent
 * @src: the sending rank, not this one
 * @tag: the tag the sender used
 * @cancellable: (nullable): cancels the receive, which breaks the mesh on
 *   every rank ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.recv] on a worker thread. The mesh and @tensor
 * belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_recv_async (CpMesh              *self,
                    CpTensor            *tensor,
                    int                  src,
                    guint                tag,
                    GCancellable        *cancellable,
                    GAsyncReadyCallback  callback,
                    gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));

  _cp_task_start (self, self, "recv", cp_mesh_recv_async, message_run,
                  &(CpTaskArgs) { G_CALLBACK (cp_mesh_recv), { tensor }, { src, tag } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_recv_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.recv_async].
 *
 * Returns: %TRUE when the tensor holds what was sent
 *
 * Since: 1.0
 */
gboolean
cp_mesh_recv_finish (CpMesh        *self,
                     GAsyncResult  *result,
                     GError       **error)
{
  return _cp_task_finish (self, result, cp_mesh_recv_async, error, 0);
}

static gboolean
send_recv_run (gpointer     self,
               CpTaskArgs  *args,
               GError     **error)
{
  return cp_mesh_send_recv (self, args->objects[0], (int) args->values[0], args->objects[1],
                            (int) args->values[1], (guint) args->values[2], error);
}

/**
 * cp_mesh_send_recv_async:
 * @self: a mesh
 * @send_tensor: the data to send to @dst
 * @dst: the rank to send to
 * @recv_tensor: where to receive from @src; not @send_tensor
 * @src: the rank to receive from
 * @tag: the tag of both messages
 * @cancellable: (nullable): cancels the exchange, which breaks the mesh
 *   on every rank ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.send_recv] on a worker thread. The mesh and both
 * tensors belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_send_recv_async (CpMesh              *self,
                         CpTensor            *send_tensor,
                         int                  dst,
                         CpTensor            *recv_tensor,
                         int                  src,
                         guint                tag,
                         GCancellable        *cancellable,
                         GAsyncReadyCallback  callback,
                         gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (send_tensor));
  g_return_if_fail (CP_IS_TENSOR (recv_tensor));
  g_return_if_fail (send_tensor != recv_tensor);

  _cp_task_start (self, self, "send_recv", cp_mesh_send_recv_async, send_recv_run,
                  &(CpTaskArgs) { .objects = { send_tensor, recv_tensor }, .values = { dst, src, tag } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_send_recv_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.send_recv_async].
 *
 * Returns: %TRUE when both messages went through
 *
 * Since: 1.0
 */
gboolean
cp_mesh_send_recv_finish (CpMesh        *self,
                          GAsyncResult  *result,
                          GError       **error)
{
  return _cp_task_finish (self, result, cp_mesh_send_recv_async, error, 0);
}

/**
 * cp_mesh_unshard_async:
 * @self: the context-parallel mesh
 * @tensor: this rank's head-tail piece
 * @seq_dim: its sequence dimension; negative values count from the last
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.unshard] on a worker thread. The mesh and @tensor
 * belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_unshard_async (CpMesh              *self,
                       CpTensor            *tensor,
                       int                  seq_dim,
                       GCancellable        *cancellable,
                       GAsyncReadyCallback  callback,
                       gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));

  _cp_task_start (self, self, "unshard", cp_mesh_unshard_async, _cp_task_run_tensor,
                  &(CpTaskArgs) { G_CALLBACK (cp_mesh_unshard), { tensor }, { seq_dim } },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_unshard_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.unshard_async].
 *
 * Returns: (transfer full): the full tensor, or %NULL with an error
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_unshard_finish (CpMesh        *self,
                        GAsyncResult  *result,
                        GError       **error)
{
  return _cp_task_finish_object (self, result, cp_mesh_unshard_async, error);
}

static gboolean
unshard_layout_run (gpointer     self,
                    CpTaskArgs  *args,
                    GError     **error)
{
  args->results[0] = cp_mesh_unshard_layout (self, args->objects[0], (int) args->values[0],
                                             args->layout, error);
  return args->results[0] != NULL;
}

/**
 * cp_mesh_unshard_layout_async:
 * @self: the context-parallel mesh
 * @tensor: this rank's piece of @layout
 * @seq_dim: its sequence dimension; negative values count from the last
 * @layout: the layout the pieces follow, over the mesh's world size
 * @cancellable: (nullable): cancels the call on every rank, which breaks
 *   the mesh ([Threading](threading.html))
 * @callback: called in the thread-default main context of the caller
 *   when done
 * @user_data: data for @callback
 *
 * Runs [method@Cp.Mesh.unshard_layout] on a worker thread. The mesh and
 * @tensor belong to the call until @callback runs.
 *
 * Since: 1.0
 */
void
cp_mesh_unshard_layout_async (CpMesh              *self,
                              CpTensor            *tensor,
                              int                  seq_dim,
                              CpLayout            *layout,
                              GCancellable        *cancellable,
                              GAsyncReadyCallback  callback,
                              gpointer             user_data)
{
  g_return_if_fail (CP_IS_MESH (self));
  g_return_if_fail (CP_IS_TENSOR (tensor));
  g_return_if_fail (layout != NULL);

  _cp_task_start (self, self, "unshard", cp_mesh_unshard_layout_async, unshard_layout_run,
                  &(CpTaskArgs) { .objects = { tensor }, .values = { seq_dim }, .layout = layout },
                  cancellable, callback, user_data);
}

/**
 * cp_mesh_unshard_layout_finish:
 * @self: a mesh
 * @result: the result given to the callback
 * @error: return location for a #GError
 *
 * Completes [method@Cp.Mesh.unshard_layout_async].
 *
 * Returns: (transfer full): the full tensor, or %NULL with an error
 *
 * Since: 1.0
 */
CpTensor *
cp_mesh_unshard_layout_finish (CpMesh        *self,
                               GAsyncResult  *result,
                               GError       **error)
{
  return _cp_task_finish_object (self, result, cp_mesh_unshard_layout_async, error);
}
