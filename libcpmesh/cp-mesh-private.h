/* cp-mesh-private.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cp-mesh.h"
#include "transports/cp-mesh-config-private.h"
#include "transports/cp-transport-private.h"

G_BEGIN_DECLS

/* A mesh over @transport: this rank is @my_index of the transport ranks
 * @members, arranged row-major over the named dimensions.  Backends call
 * this once they are connected. */
CpMesh   *_cp_mesh_new              (CpTransport         *transport,
                                     const char          *label,
                                     const int           *members,
                                     int                  n_members,
                                     int                  my_index,
                                     const char * const  *dim_names,
                                     const int           *dim_sizes,
                                     gsize                n_dims,
                                     GError             **error);

/* The host communicator: agreements, fingerprints and descriptor
 * exchanges run on it, whatever memory the data is in. */
CpComm   *_cp_mesh_get_comm         (CpMesh              *self);

typedef void (*CpMeshTransportFunc) (CpTransport *transport,
                                     gpointer     user_data);

/* Calls @func on the transport of every communicator of @self, the host
 * one first: what a cancellation wakes and breaks. */
void      _cp_mesh_foreach_transport (CpMesh              *self,
                                      CpMeshTransportFunc  func,
                                      gpointer             user_data);

/* Memory kinds a mesh can route, an upper bound on CpDeviceKind. */
#define CP_MESH_N_ROUTES 8

/* Adds a communicator over @transport, whose ranks are numbered as the
 * mesh's own transport's, and routes to it every memory kind @transport
 * moves: a device transport (NCCL for CUDA memory) beside the host one.
 * Submeshes made afterwards get one too. */
gboolean  _cp_mesh_add_transport    (CpMesh              *self,
                                     CpTransport         *transport,
                                     GError             **error);

void      _cp_mesh_set_local_rank   (CpMesh              *self,
                                     int                  local_rank);

/* Reports the peers the transport loses as CpMesh::rank-lost in
 * @context, and polls the transport there while the program is idle so
 * that losses are noticed between operations too. */
void      _cp_mesh_watch_peers      (CpMesh              *self,
                                     GMainContext        *context);

/* How often an idle mesh polls its transport for lost peers. */
#define CP_MESH_POLL_INTERVAL_MS 200

/* The absolute deadline of an operation that starts now. */
gint64    _cp_mesh_deadline         (CpMesh              *self);

/* The cancellable every wait of an operation that starts now gets: the
 * one of the asynchronous call running on this thread, or NULL. */
GCancellable *_cp_mesh_cancellable  (CpMesh              *self);

/* Tags of internal point-to-point traffic (attention rings) live above the
 * 32-bit range public send/recv use. */
#define CP_MESH_INTERNAL_TAG(n) ((G_GUINT64_CONSTANT (1) << 32) | (guint64) (n))

/* Describes @tensor as a message naming its bytes, whose region holds a
 * reference on its storage until _cp_message_clear(). */
void      _cp_message_from_tensor   (CpMessage           *message,
                                     CpTensor            *tensor);

/* One point-to-point transfer of a whole tensor, posted on the
 * communicator that moves its memory, as every call of the mesh routes
 * its operands (an attention ring's hand-overs).  Zero-filled: nothing
 * posted. */
typedef struct
{
  CpComm *comm;
  CpMessage message;
  CpRequest *request;
} CpMeshTransfer;

/* Posts the send of @tensor to communicator rank @peer (@send) or the
 * receive into it from @peer, with @tag; @tensor must be in memory a
 * communicator of @self moves (host memory always is).  The transfer
 * holds @tensor's storage until it has been waited for. */
void      _cp_mesh_transfer_post    (CpMesh              *self,
                                     CpMeshTransfer      *transfer,
                                     CpTensor            *tensor,
                                     gboolean             send,
                                     int                  peer,
                                     guint64              tag);

/* Completes @transfer, if posted, before @deadline (and the cancellable
 * of the call running on this thread), and leaves it unposted. */
gboolean  _cp_mesh_transfer_wait    (CpMesh              *self,
                                     CpMeshTransfer      *transfer,
                                     gint64               deadline,
                                     GError             **error);

/* Whether the ranks of @self can lend each other memory of kind @device
 * to read in place (_cp_comm_can_share() of the communicator that moves
 * it); the same answer on every rank. */
gboolean  _cp_mesh_can_share        (CpMesh              *self,
                                     CpDeviceKind         device);
/* Storage of @size bytes that the communicator moving @device memory can
 * lend, or NULL without an error when any memory will do. */
CpStorage *_cp_mesh_alloc_shared    (CpMesh              *self,
                                     CpDeviceKind         device,
                                     gsize                size,
                                     GError             **error);

/* Lends @tensor to every rank of @self for them to read where it lies,
 * on the communicator that moves its memory, and fills @loans
 * (_cp_comm_share()); _cp_mesh_unshare() ends every loan of that memory
 * kind.  Both are collectives of the mesh, under its deadline and the
 * cancellable of the call running on this thread. */
gboolean  _cp_mesh_share            (CpMesh              *self,
                                     CpTensor            *tensor,
                                     CpLoans             *loans,
                                     GError             **error);
gboolean  _cp_mesh_unshare          (CpMesh              *self,
                                     CpDeviceKind         device,
                                     GError             **error);

/* One small all-gather that makes every rank agree before any of them
 * changes anything.  Each rank contributes @n_values (at most 4) numbers
 * named by @names.  The call fails identically on every rank when a rank
 * passed an @invalid error of its own (taken), or with
 * CP_MESH_ERROR_INVALID_TOPOLOGY, naming the numbers of both ranks, when
 * any rank's numbers differ from rank 0's. */
gboolean  _cp_mesh_agree            (CpMesh              *self,
                                     const char          *what,
                                     const char * const  *names,
                                     const gint64        *values,
                                     guint                n_values,
                                     GError              *invalid,
                                     GError             **error);

G_END_DECLS
