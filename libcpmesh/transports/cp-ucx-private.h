/* cp-ucx-private.h: what the files of the UCX backend share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gio/gio.h>
#include <ucp/api/ucp.h>

#include "cp-bootstrap-private.h"
#include "cp-mesh-config-private.h"
#include "cp-sync-private.h"
#include "cp-transport-private.h"
#include "cp-ucx-wire-private.h"

G_BEGIN_DECLS

typedef struct _CpUcxWorker CpUcxWorker;
typedef struct _CpUcxEndpoint CpUcxEndpoint;

/* Called, with the worker lock held, when UCX reports that the peer of
 * @endpoint failed. */
typedef void (*CpUcxFailedFunc) (CpUcxEndpoint *endpoint,
                                 gpointer       user_data);

/* One UCP context and worker.  UCX runs it in serialized mode: every call
 * into it holds @lock, so a mesh's operations and the main-context poll
 * that notices lost peers never enter UCX at the same time. */
struct _CpUcxWorker
{
  ucp_context_h context;
  ucp_worker_h worker;
  CpMutex lock;
  GPtrArray *endpoints; /* CpUcxEndpoint*, owned: UCX may call back into them until the worker goes */
  GArray *retained;     /* what abandoned sends may still read: freed with the worker */
};

/* An endpoint and what its error callback learnt.  Endpoints belong to
 * their worker and are freed with it, so a late callback never sees
 * freed memory. */
struct _CpUcxEndpoint
{
  ucp_ep_h ep;            /* NULL once closed */
  ucs_status_t failure;   /* UCS_OK until the peer fails */
  int peer;               /* a world rank, or -1 */
  CpUcxFailedFunc failed_func;
  gpointer failed_data;
};

/* An operation in flight: UCX's request, and its outcome once done. */
typedef struct
{
  void *request;               /* NULL once complete */
  ucs_status_t status;         /* UCS_INPROGRESS until complete */
  gboolean is_recv;
  gboolean may_truncate;       /* a receive into too small a buffer is fine */
  ucp_tag_recv_info_t info;    /* tag receives: what arrived */
  gsize expected;              /* receives: the bytes due, or 0 for any length */
  ucp_dt_iov_t *iov;           /* owned; strided buffers */
  int peer;                    /* the world rank it involves */
} CpUcxOp;

/* Whether UCX can start in this process as this library runs it: not in
 * unified mode, and with a configuration (UCX_*) it accepts; FALSE with
 * CP_MESH_ERROR_UNSUPPORTED saying why. */
gboolean       _cp_ucx_worker_probe        (GError         **error);
/* Keeps UCX to the transports that reach the ranks along @route (see
 * cp-ucx-worker.c), unless the user chose them. */
CpUcxWorker   *_cp_ucx_worker_new          (guint            keepalive_ms,
                                            const CpBootstrapRoute *route,
                                            GError         **error);
void           _cp_ucx_worker_free         (CpUcxWorker     *self);
GBytes        *_cp_ucx_worker_dup_address  (CpUcxWorker     *self,
                                            GError         **error);
/* Keeps @data until the worker is gone, then frees it with @destroy. */
void           _cp_ucx_worker_retain       (CpUcxWorker     *self,
                                            gpointer         data,
                                            GDestroyNotify   destroy);
/* One locked round of progress; returns the number of events. */
unsigned       _cp_ucx_worker_progress     (CpUcxWorker     *self);
/* Backs off a polling loop that found nothing to do, so that ranks
 * sharing a core leave it to the one doing work. */
void           _cp_ucx_idle                (guint           *idle_rounds);

/* Endpoints, all with peer error handling.  Call with the lock held. */
CpUcxEndpoint *_cp_ucx_connect_address     (CpUcxWorker     *self,
                                            GBytes          *address,
                                            int              peer,
                                            GError         **error);
/* Closes @endpoints (NULL entries skipped).  When @graceful, first waits
 * until @deadline at most for what was sent to arrive. */
void           _cp_ucx_close_endpoints     (CpUcxWorker     *self,
                                            CpUcxEndpoint  **endpoints,
                                            guint            n,
                                            gboolean         graceful,
                                            gint64           deadline);

/* Records what a non-blocking call returned.  Call with the lock held. */
void           _cp_ucx_op_begin            (CpUcxOp         *op,
                                            ucs_status_ptr_t ptr);
/* TRUE once @op is complete; with the lock held.  A receive that got
 * other than its expected bytes completes with UCS_ERR_MESSAGE_TRUNCATED. */
gboolean       _cp_ucx_op_poll             (CpUcxOp         *op);
void           _cp_ucx_op_clear            (CpUcxOp         *op);

/* Maps a UCX status to a CpMeshError code. */
int            _cp_ucx_error_code          (ucs_status_t     status);

G_END_DECLS
