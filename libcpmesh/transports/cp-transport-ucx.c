/* cp-transport-ucx.c: ranks that are processes, over UCX
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-dtype-private.h"
#include "cp-error.h"
#include "cp-fault-private.h"
#include "cp-host-memory-private.h"
#include "cp-ucx-private.h"
#include "cp-ucx-wire-private.h"

/* Every rank has one UCP worker and one endpoint to every other rank, all
 * with peer failure handling.  Data moves as tagged messages, which with
 * failure handling on keep the shared-memory path (cp-ucx-worker.c asks
 * shared memory to check its peers) while RMA puts fall off it; the
 * measurements are in doc/mesh-ucx.md.
 *
 * A collective first exchanges every rank's descriptor, so that all ranks
 * reach the same verdict from the same inputs (the agreement contract of
 * cp-transport-private.h), then moves the data with direct sends between
 * every pair: on one host the copies of all pairs proceed at once.
 *
 * Tags keep operations apart.  Bit 63 tells point-to-point traffic from
 * collectives, bits 62–45 identify the communicator (a hash of its label
 * and members; 0 is the connection check); then
 *   collectives:     sequence (16 bits) | phase (3) | sender's index (26)
 *   point-to-point:  kind (2) | user tag (33) | sender's index (10)
 *
 * Failure: every wait is bounded by the caller's deadline.  A wait that
 * fails cancels its receives; whatever is still in flight after that (a
 * send, or a receive already being filled) means a peer may still touch
 * this rank's buffers, so the endpoints involved are closed by force and
 * the transport stays broken: later operations fail at once. */

#define P2P_BIT (G_GUINT64_CONSTANT (1) << 63)
#define COMM_SHIFT 45
#define COMM_BITS 18
#define USER_TAG_BITS 33
#define DESCRIPTOR_MAX CP_UCX_DESCRIPTOR_MAX
/* After a failure, how long UCX gets to hand back the requests of the
 * endpoints closed by force. */
#define ABORT_GRACE_US (2 * G_TIME_SPAN_SECOND)
#define CLOSE_GRACE_US G_TIME_SPAN_SECOND

enum { PHASE_DESCRIPTOR, PHASE_DATA, PHASE_GATHER };
typedef enum { P2P_HEADER, P2P_DATA, P2P_ACK } P2pKind;

typedef struct
{
  CpTransport parent;
  CpUcxWorker *worker;
  CpUcxEndpoint **peers;   /* one per world rank, this one's included */
  GPtrArray *comms;        /* UcxComm*, not owned; under the worker lock */
  GError *broken;          /* under the worker lock */
} UcxTransport;

typedef struct
{
  CpComm parent;
  UcxTransport *transport;
  char *key;
  guint32 id;
  guint16 sequence;
  guint operation;         /* the running collective, as fault injection counts */
} UcxComm;

/* Buffers of one message: @count chunks of @chunk bytes, @stride apart. */
typedef struct
{
  guint8 *base;
  gsize chunk;
  gsize stride;
  gsize count;
} Region;

struct _CpRequest
{
  gboolean is_send;
  int peer;
  guint64 tag;
  const CpMessage *sent;
  CpMessage *message;
  CpUcxWireMessage header;
  CpUcxWireAck ack;
  guint8 drain;
  CpUcxOp ops[3];          /* indexed by P2pKind */
};

static Region
contiguous (gconstpointer base,
            gsize         size)
{
  return (Region) { (guint8 *) base, size, size, 1 };
}

static int
world_rank (UcxComm *comm,
            int      index)
{
  return comm->parent.members[index];
}

static guint64
collective_tag (guint32 comm_id,
                guint   sequence,
                guint   phase,
                int     sender)
{
  return ((guint64) comm_id << COMM_SHIFT) | ((guint64) (sequence & 0xffff) << 29) |
         ((guint64) phase << 26) | (guint64) sender;
}

static guint64
p2p_tag (UcxComm *comm,
         P2pKind  kind,
         guint64  user_tag,
         int      sender)
{
  g_assert (user_tag < (G_GUINT64_CONSTANT (1) << USER_TAG_BITS));
  return P2P_BIT | ((guint64) comm->id << COMM_SHIFT) | ((guint64) kind << 43) |
         (user_tag << 10) | (guint64) sender;
}

/* ---- posting and waiting ---- */

static void
use_region (CpUcxOp             *op,
            const Region        *region,
            ucp_request_param_t *param,
            void               **buffer,
            size_t              *count)
{
  if (region->count <= 1 || region->chunk == 0)
    {
      *buffer = region->base;
      *count = region->chunk * MIN (region->count, 1);
      return;
    }
  op->iov = g_new (ucp_dt_iov_t, region->count);
  for (gsize i = 0; i < region->count; i++)
    op->iov[i] = (ucp_dt_iov_t) { region->base + i * region->stride, region->chunk };
  param->op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  param->datatype = ucp_dt_make_iov ();
  *buffer = op->iov;
  *count = region->count;
}

/* With the lock held. */
static void
post_send (UcxTransport *self,
           CpUcxOp      *op,
           int           peer,
           const Region *region,
           guint64       tag)
{
  ucp_request_param_t param = { 0 };
  CpUcxEndpoint *endpoint = self->peers[peer];
  void *buffer;
  size_t count;

  memset (op, 0, sizeof *op);
  op->peer = peer;
  use_region (op, region, &param, &buffer, &count);
  if (endpoint->ep == NULL)
    _cp_ucx_op_begin (op, UCS_STATUS_PTR (UCS_ERR_NOT_CONNECTED));
  else
    _cp_ucx_op_begin (op, ucp_tag_send_nbx (endpoint->ep, buffer, count, tag, &param));
}

/* With the lock held. */
static void
post_recv (UcxTransport *self,
           CpUcxOp      *op,
           int           peer,
           const Region *region,
           guint64       tag)
{
  /* UCX 1.13 reports what arrived only through a request, so a receive
   * that could complete at once must still hand one back. */
  ucp_request_param_t param = { .op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL };
  void *buffer;
  size_t count;

  memset (op, 0, sizeof *op);
  op->peer = peer;
  op->is_recv = TRUE;
  op->expected = region->chunk * region->count;
  use_region (op, region, &param, &buffer, &count);
  _cp_ucx_op_begin (op, ucp_tag_recv_nbx (self->worker->worker, buffer, count, tag,
                                          G_MAXUINT64, &param));
}

static void
lock (UcxTransport *self)
{
  _cp_mutex_lock (&self->worker->lock);
}

static void
unlock (UcxTransport *self)
{
  _cp_mutex_unlock (&self->worker->lock);
}

static char *
list_peers (CpUcxOp *ops,
            guint    n)
{
  GString *text = g_string_new (NULL);
  int last = -1;

  for (guint i = 0; i < n; i++)
    if (ops[i].request != NULL && ops[i].peer != last)
      {
        g_string_append_printf (text, "%s%d", text->len ? ", " : "", ops[i].peer);
        last = ops[i].peer;
      }
  return g_string_free (text, FALSE);
}

typedef struct
{
  guint pending;
  CpUcxOp *failed;
  CpUcxOp *lost;
} Survey;

/* With the lock held: one round of progress and what it left. */
static Survey
survey (UcxTransport *self,
        CpUcxOp      *ops,
        guint         n,
        guint        *idle)
{
  Survey s = { 0, NULL, NULL };

  if (ucp_worker_progress (self->worker->worker) > 0)
    *idle = 0;
  for (guint i = 0; i < n; i++)
    {
      if (!_cp_ucx_op_poll (&ops[i]))
        {
          s.pending++;
          if (s.lost == NULL && self->peers[ops[i].peer]->failure != UCS_OK)
            s.lost = &ops[i];
        }
      else if (s.failed == NULL && ops[i].status != UCS_OK &&
               !(ops[i].may_truncate && ops[i].status == UCS_ERR_MESSAGE_TRUNCATED))
        s.failed = &ops[i];
    }
  return s;
}

static void
set_failure (UcxTransport  *self,
             CpUcxOp       *op,
             const char    *what,
             GError       **error)
{
  ucs_status_t peer_failure = self->peers[op->peer]->failure;
  ucs_status_t status = peer_failure != UCS_OK ? peer_failure : op->status;
  int code = peer_failure != UCS_OK ? CP_MESH_ERROR_PEER_LOST : _cp_ucx_error_code (status);

  if (code == CP_MESH_ERROR_PEER_LOST)
    g_set_error (error, CP_MESH_ERROR, code, "%s: rank %d lost mesh rank %d: %s", what,
                 self->parent.rank, op->peer, ucs_status_string (status));
  else
    g_set_error (error, CP_MESH_ERROR, code, "%s: rank %d, exchanging with mesh rank %d: %s",
                 what, self->parent.rank, op->peer, ucs_status_string (status));
}

static void
set_timeout (UcxTransport  *self,
             CpUcxOp       *ops,
             guint          n,
             const char    *what,
             gint64         waited_us,
             GError       **error)
{
  g_autofree char *peers = list_peers (ops, n);

  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
               "%s: rank %d waited %" G_GINT64_FORMAT " ms for mesh ranks %s, which never "
               "answered", what, self->parent.rank, waited_us / 1000, peers);
}

/* After a failure: cancels the receives, then closes by force the
 * endpoints of whatever is still in flight, so that no peer can touch
 * this rank's buffers once the caller has the error. */
static void
abort_ops (UcxTransport *self,
           CpUcxOp      *ops,
           guint         n,
           const GError *error)
{
  g_autoptr(GPtrArray) doomed = g_ptr_array_new ();
  gint64 deadline = g_get_monotonic_time () + ABORT_GRACE_US;
  guint idle = 0;

  lock (self);
  for (guint i = 0; i < n; i++)
    if (ops[i].request != NULL && ops[i].is_recv)
      ucp_request_cancel (self->worker->worker, ops[i].request);
  survey (self, ops, n, &idle);
  for (guint i = 0; i < n; i++)
    if (ops[i].request != NULL && !g_ptr_array_find (doomed, self->peers[ops[i].peer], NULL))
      g_ptr_array_add (doomed, self->peers[ops[i].peer]);
  if (doomed->len > 0 && self->broken == NULL)
    self->broken = g_error_copy (error);
  unlock (self);

  if (doomed->len > 0)
    _cp_ucx_close_endpoints (self->worker, (CpUcxEndpoint **) doomed->pdata, doomed->len, FALSE,
                             g_get_monotonic_time ());
  for (Survey s = { 1, NULL, NULL }; s.pending > 0 && g_get_monotonic_time () < deadline;)
    {
      lock (self);
      s = survey (self, ops, n, &idle);
      unlock (self);
      _cp_ucx_idle (&idle);
    }
  lock (self);
  for (guint i = 0; i < n; i++)
    _cp_ucx_op_clear (&ops[i]);
  unlock (self);
}

/* Waits until every op of @ops completed, or fails: a failed op, a lost
 * peer, @deadline or @cancellable.  The ops are cleared either way. */
static gboolean
wait_ops (UcxTransport  *self,
          CpUcxOp       *ops,
          guint          n,
          const char    *what,
          gint64         deadline,
          GCancellable  *cancellable,
          GError       **error)
{
  gint64 started = g_get_monotonic_time ();
  guint idle = 0;

  for (;;)
    {
      GError *failure = NULL;
      Survey s;

      lock (self);
      s = survey (self, ops, n, &idle);
      if (s.failed != NULL)
        set_failure (self, s.failed, what, &failure);
      else if (s.pending != 0 && s.lost != NULL)
        set_failure (self, s.lost, what, &failure);
      unlock (self);
      if (failure == NULL && s.pending == 0)
        break;
      if (failure == NULL && g_get_monotonic_time () >= deadline)
        set_timeout (self, ops, n, what, g_get_monotonic_time () - started, &failure);
      if (failure == NULL)
        g_cancellable_set_error_if_cancelled (cancellable, &failure);
      if (failure != NULL)
        {
          abort_ops (self, ops, n, failure);
          g_propagate_error (error, failure);
          return FALSE;
        }
      _cp_ucx_idle (&idle);
    }
  lock (self);
  for (guint i = 0; i < n; i++)
    _cp_ucx_op_clear (&ops[i]);
  unlock (self);
  return TRUE;
}

static gboolean
check_usable (UcxTransport  *self,
              const char    *what,
              GError       **error)
{
  gboolean usable;

  lock (self);
  usable = self->broken == NULL;
  if (!usable)
    g_set_error (error, self->broken->domain, self->broken->code,
                 "%s: the mesh failed earlier and cannot be used: %s", what, self->broken->message);
  unlock (self);
  return usable;
}

/* ---- injected faults (cp-fault-private.h; nothing in other builds) ---- */

/* The fault the armed one makes this rank suffer at @step of the running
 * collective: it dies or waits here; dropping and truncating are up to
 * post_send_as(). */
static CpFaultKind
suffer_fault (UcxComm     *comm,
              CpFaultStep  step)
{
  guint delay_ms = 0;
  CpFaultKind fault = _cp_fault_strike ("ucx", comm->transport->parent.rank, comm->operation,
                                        step, &delay_ms);

  if (fault == CP_FAULT_KILL)
    _cp_fault_kill_process ();
  if (fault == CP_FAULT_DELAY)
    g_usleep ((gulong) delay_ms * G_TIME_SPAN_MILLISECOND);
  return fault;
}

/* With the lock held: a send of this rank's, as @fault leaves it.  A
 * dropped message leaves @op complete without sending anything. */
static void
post_send_as (UcxTransport *self,
              CpUcxOp      *op,
              int           peer,
              const Region *region,
              guint64       tag,
              CpFaultKind   fault)
{
  Region cut = *region;

  if (fault == CP_FAULT_DROP)
    {
      memset (op, 0, sizeof *op);
      op->peer = peer;
      return;
    }
  if (fault == CP_FAULT_TRUNCATE && cut.count > 1)
    cut.count /= 2;
  else if (fault == CP_FAULT_TRUNCATE)
    cut.chunk /= 2;
  post_send (self, op, peer, &cut, tag);
}

/* ---- communicators ---- */

/* The same on every member: 18 bits of a SHA-256 of the key, never 0. */
static guint32
comm_id (const char *key)
{
  g_autoptr(GChecksum) checksum = g_checksum_new (G_CHECKSUM_SHA256);
  guint8 digest[32];
  gsize length = sizeof digest;
  guint32 id;

  g_checksum_update (checksum, (const guchar *) key, -1);
  g_checksum_get_digest (checksum, digest, &length);
  id = ((guint32) digest[0] << 16 | (guint32) digest[1] << 8 | digest[2]) & ((1u << COMM_BITS) - 1);
  return id != 0 ? id : 1;
}

static gboolean
check_id_free (UcxTransport  *self,
               UcxComm       *comm,
               GError       **error)
{
  for (guint i = 0; i < self->comms->len; i++)
    {
      UcxComm *other = g_ptr_array_index (self->comms, i);

      if (other->id == comm->id && !g_str_equal (other->key, comm->key))
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                       "communicators \"%s\" and \"%s\" hash to the same UCX tag space; "
                       "rename a mesh dimension", comm->key, other->key);
          return FALSE;
        }
    }
  return TRUE;
}

static CpComm *
ucx_comm_new (CpTransport  *transport,
              const char   *label,
              const int    *members,
              int           n_members,
              int           my_index,
              GError      **error)
{
  UcxTransport *self = (UcxTransport *) transport;
  UcxComm *comm = g_new0 (UcxComm, 1);
  gboolean ok;

  _cp_comm_init (&comm->parent, transport, members, n_members, my_index);
  comm->transport = self;
  comm->key = _cp_comm_key (label, members, n_members);
  comm->id = comm_id (comm->key);
  lock (self);
  ok = check_id_free (self, comm, error);
  if (ok)
    g_ptr_array_add (self->comms, comm);
  unlock (self);
  if (ok)
    return &comm->parent;
  g_free (comm->key);
  _cp_comm_clear (&comm->parent);
  g_free (comm);
  return NULL;
}

static void
ucx_comm_free (CpComm *parent)
{
  UcxComm *comm = (UcxComm *) parent;
  UcxTransport *self = comm->transport;

  lock (self);
  g_ptr_array_remove (self->comms, comm);
  unlock (self);
  g_free (comm->key);
  _cp_comm_clear (parent);
  g_free (comm);
}

/* ---- descriptors ---- */

static void
descriptors_free (CpCollective **descs,
                  int            n,
                  int            mine)
{
  for (int r = 0; r < n; r++)
    if (r != mine && descs[r] != NULL)
      {
        g_clear_error (&descs[r]->invalid);
        g_free (descs[r]);
      }
  g_free (descs);
}

/* Parses what every other member sent into @descs; @inbox holds one
 * DESCRIPTOR_MAX slot per member, @ops the receive of each before its
 * send. */
static gboolean
unpack_descriptors (UcxComm        *comm,
                    const guint8   *inbox,
                    const CpUcxOp  *ops,
                    CpCollective  **descs,
                    const char     *what,
                    GError        **error)
{
  for (int r = 0, i = 0; r < comm->parent.size; r++)
    {
      g_autoptr(GError) malformed = NULL;

      if (r == comm->parent.index)
        continue;
      descs[r] = g_new0 (CpCollective, 1);
      if (!_cp_ucx_unpack_descriptor (inbox + (gsize) r * DESCRIPTOR_MAX, ops[i].info.length,
                                      descs[r], &malformed))
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                       "%s: communicator rank %d sent a malformed descriptor: %s", what, r,
                       malformed->message);
          return FALSE;
        }
      i += 2;
    }
  return TRUE;
}

/* Sends this rank's descriptor to every other member and returns all of
 * them in communicator order. */
static CpCollective **
exchange_descriptors (UcxComm        *comm,
                      CpCollective   *coll,
                      guint           sequence,
                      gint64          deadline,
                      GError        **error)
{
  UcxTransport *self = comm->transport;
  int n = comm->parent.size, me = comm->parent.index;
  g_autoptr(GBytes) mine = _cp_ucx_pack_descriptor (coll);
  g_autofree guint8 *inbox = g_malloc ((gsize) n * DESCRIPTOR_MAX);
  g_autofree CpUcxOp *ops = g_new0 (CpUcxOp, 2 * (gsize) n);
  CpCollective **descs = g_new0 (CpCollective *, n);
  Region out = contiguous (g_bytes_get_data (mine, NULL), g_bytes_get_size (mine));
  const char *what = _cp_collective_name (coll->kind);
  CpFaultKind fault = suffer_fault (comm, CP_FAULT_STEP_DESCRIPTOR);
  guint n_ops = 0;

  lock (self);
  for (int r = 0; r < n; r++)
    if (r != me)
      {
        Region in = contiguous (inbox + (gsize) r * DESCRIPTOR_MAX, DESCRIPTOR_MAX);

        post_recv (self, &ops[n_ops], world_rank (comm, r), &in,
                   collective_tag (comm->id, sequence, PHASE_DESCRIPTOR, r));
        /* Descriptors differ in length; the parser checks them whole. */
        ops[n_ops++].expected = 0;
        post_send_as (self, &ops[n_ops++], world_rank (comm, r), &out,
                      collective_tag (comm->id, sequence, PHASE_DESCRIPTOR, me), fault);
      }
  unlock (self);
  descs[me] = coll;
  if (wait_ops (self, ops, n_ops, what, deadline, NULL, error) &&
      unpack_descriptors (comm, inbox, ops, descs, what, error))
    return descs;
  descriptors_free (descs, n, me);
  return NULL;
}

/* ---- collectives ---- */

/* The message a collective exchanges with member @r, in one direction.
 * Ranks agree on the geometry, so an empty region is skipped on both
 * sides of the pair. */
typedef Region (*RegionFunc) (CpCollective *coll,
                              int           n,
                              int           me,
                              int           r,
                              gpointer      user_data);

static gboolean
is_empty (const Region *region)
{
  return region->chunk * region->count == 0;
}

/* Posts, for every other member r, the receive of @recv_of (r) from r and
 * the send of @send_to (r) to r, then waits for all of them. */
static gboolean
exchange_regions (UcxComm       *comm,
                  CpCollective  *coll,
                  guint          sequence,
                  guint          phase,
                  RegionFunc     send_to,
                  RegionFunc     recv_of,
                  gpointer       user_data,
                  gint64         deadline,
                  GError       **error)
{
  UcxTransport *self = comm->transport;
  int n = comm->parent.size, me = comm->parent.index;
  g_autofree CpUcxOp *ops = g_new0 (CpUcxOp, 2 * (gsize) n);
  CpFaultKind fault = suffer_fault (comm, CP_FAULT_STEP_DATA);
  guint n_ops = 0;

  lock (self);
  for (int r = 0; r < n; r++)
    {
      Region in, out;

      if (r == me)
        continue;
      in = recv_of (coll, n, me, r, user_data);
      out = send_to (coll, n, me, r, user_data);
      if (!is_empty (&in))
        post_recv (self, &ops[n_ops++], world_rank (comm, r), &in,
                   collective_tag (comm->id, sequence, phase, r));
      if (!is_empty (&out))
        post_send_as (self, &ops[n_ops++], world_rank (comm, r), &out,
                      collective_tag (comm->id, sequence, phase, me), fault);
    }
  unlock (self);
  return wait_ops (self, ops, n_ops, _cp_collective_name (coll->kind), deadline, NULL, error);
}

static void
copy_region (const Region *dst,
             const Region *src)
{
  for (gsize i = 0; i < dst->count; i++)
    memcpy (dst->base + i * dst->stride, src->base + i * src->stride, dst->chunk);
}

static Region
no_region (void)
{
  return (Region) { NULL, 0, 0, 0 };
}

/* Piece r of a [outer][n][block] buffer: @outer chunks, n blocks apart. */
static Region
piece_of (gconstpointer       buffer,
          const CpCollective *coll,
          int                 n,
          int                 r)
{
  return (Region) { (guint8 *) buffer + (gsize) r * coll->block, coll->block,
                    (gsize) n * coll->block, coll->outer };
}

/* All-gather: send is [outer][block] and goes whole to every member. */
static Region
gather_send (CpCollective *coll,
             int           n,
             int           me,
             int           r,
             gpointer      user_data)
{
  return contiguous (coll->send, coll->outer * coll->block);
}

/* All-to-all: send is [outer][n][block]; piece r goes to r. */
static Region
scatter_piece (CpCollective *coll,
               int           n,
               int           me,
               int           r,
               gpointer      user_data)
{
  return piece_of (coll->send, coll, n, r);
}

/* Both: recv is [outer][n][block], and piece r of it comes from r. */
static Region
gathered_piece (CpCollective *coll,
                int           n,
                int           me,
                int           r,
                gpointer      user_data)
{
  return piece_of (coll->recv, coll, n, r);
}

/* Copies this member's own piece of recv from @own, then exchanges the
 * others'. */
static gboolean
run_pieces (UcxComm       *comm,
            CpCollective  *coll,
            guint          sequence,
            const Region  *own,
            RegionFunc     send_to,
            gint64         deadline,
            GError       **error)
{
  Region slot = piece_of (coll->recv, coll, comm->parent.size, comm->parent.index);

  copy_region (&slot, own);
  return exchange_regions (comm, coll, sequence, PHASE_DATA, send_to, gathered_piece, NULL,
                           deadline, error);
}

/* What all-reduce and broadcast receive into before they write the
 * caller's tensor.  Allocated before the descriptors go out: a rank that
 * cannot allocate fails the collective on every rank, through its
 * descriptor, before any data moves. */
typedef struct
{
  guint8 *inbox;    /* broadcast: the root's data; all-reduce: [n][mine], the copies of this member's slice */
  gsize inbox_size;
  guint8 *result;   /* all-reduce: [count], the reduced tensor */
  gsize result_size;
} Scratch;

/* Broadcast: the root sends its buffer to every member, which receives it
 * into scratch and copies it over its tensor only once it is complete. */
static Region
broadcast_send (CpCollective *coll,
                int           n,
                int           me,
                int           r,
                gpointer      user_data)
{
  if (me != coll->root)
    return no_region ();
  return contiguous (coll->recv, coll->count * cp_dtype_get_size (coll->dtype));
}

static Region
broadcast_recv (CpCollective *coll,
                int           n,
                int           me,
                int           r,
                gpointer      user_data)
{
  if (r != coll->root)
    return no_region ();
  return contiguous (user_data, coll->count * cp_dtype_get_size (coll->dtype));
}

static gboolean
run_broadcast (UcxComm       *comm,
               CpCollective  *coll,
               guint          sequence,
               Scratch       *scratch,
               gint64         deadline,
               GError       **error)
{
  gsize size = coll->count * cp_dtype_get_size (coll->dtype);
  gboolean ok;

  ok = exchange_regions (comm, coll, sequence, PHASE_DATA, broadcast_send, broadcast_recv,
                         scratch->inbox, deadline, error);
  if (ok && comm->parent.index != coll->root)
    memcpy (coll->recv, scratch->inbox, size);
  return ok;
}

/* All-reduce: member r owns elements [count·r/n, count·(r+1)/n).  Each
 * member receives every other member's copy of its own slice, reduces
 * them in rank order with the function the in-process backend uses, then
 * every member gathers the reduced slices.  Same order, same bits. */
typedef struct
{
  gsize elsize;
  gsize mine;       /* elements of this member's slice */
  guint8 *inbox;    /* [n][mine]: the copies of this member's slice */
  guint8 *result;   /* [count]: the reduced tensor */
} ReducePlan;

static gsize
slice_length (CpCollective *coll,
              int           n,
              int           r)
{
  return _cp_collective_slice_start (coll, n, r + 1) - _cp_collective_slice_start (coll, n, r);
}

static Region
reduce_send (CpCollective *coll,
             int           n,
             int           me,
             int           r,
             gpointer      user_data)
{
  ReducePlan *plan = user_data;

  return contiguous ((guint8 *) coll->recv + _cp_collective_slice_start (coll, n, r) * plan->elsize,
                     slice_length (coll, n, r) * plan->elsize);
}

static Region
reduce_recv (CpCollective *coll,
             int           n,
             int           me,
             int           r,
             gpointer      user_data)
{
  ReducePlan *plan = user_data;

  return contiguous (plan->inbox + (gsize) r * plan->mine * plan->elsize, plan->mine * plan->elsize);
}

static Region
reduced_send (CpCollective *coll,
              int           n,
              int           me,
              int           r,
              gpointer      user_data)
{
  ReducePlan *plan = user_data;

  return contiguous (plan->result + _cp_collective_slice_start (coll, n, me) * plan->elsize,
                     plan->mine * plan->elsize);
}

static Region
reduced_recv (CpCollective *coll,
              int           n,
              int           me,
              int           r,
              gpointer      user_data)
{
  ReducePlan *plan = user_data;

  return contiguous (plan->result + _cp_collective_slice_start (coll, n, r) * plan->elsize,
                     slice_length (coll, n, r) * plan->elsize);
}

static void
reduce_own_slice (CpCollective *coll,
                  int           n,
                  int           me,
                  ReducePlan   *plan)
{
  g_autofree gconstpointer *srcs = g_new (gconstpointer, n);
  gsize start = _cp_collective_slice_start (coll, n, me);

  for (int r = 0; r < n; r++)
    srcs[r] = r == me ? (guint8 *) coll->recv + start * plan->elsize
                      : plan->inbox + (gsize) r * plan->mine * plan->elsize;
  _cp_reduce_many (coll->dtype, coll->op, plan->result + start * plan->elsize, srcs, n, 0, plan->mine);
}

static gboolean
run_all_reduce (UcxComm       *comm,
                CpCollective  *coll,
                guint          sequence,
                Scratch       *scratch,
                gint64         deadline,
                GError       **error)
{
  int n = comm->parent.size, me = comm->parent.index;
  ReducePlan plan = { cp_dtype_get_size (coll->dtype), slice_length (coll, n, me), scratch->inbox,
                      scratch->result };

  if (!exchange_regions (comm, coll, sequence, PHASE_DATA, reduce_send, reduce_recv, &plan, deadline,
                         error))
    return FALSE;
  reduce_own_slice (coll, n, me, &plan);
  if (!exchange_regions (comm, coll, sequence, PHASE_GATHER, reduced_send, reduced_recv, &plan,
                         deadline, error))
    return FALSE;
  memcpy (coll->recv, plan.result, coll->count * plan.elsize);
  return TRUE;
}

static gboolean
alloc_scratch (UcxComm       *comm,
               CpCollective  *coll,
               Scratch       *scratch)
{
  int n = comm->parent.size, me = comm->parent.index;
  gsize elsize = cp_dtype_get_size (coll->dtype);

  if (coll->invalid != NULL)
    return FALSE;
  if (coll->kind == CP_COLL_BROADCAST && me != coll->root)
    scratch->inbox_size = MAX (coll->count * elsize, 1);
  else if (coll->kind == CP_COLL_ALL_REDUCE)
    {
      scratch->inbox_size = MAX ((gsize) n * slice_length (coll, n, me) * elsize, 1);
      scratch->result_size = MAX (coll->count * elsize, 1);
    }
  if (scratch->inbox_size > 0)
    scratch->inbox = _cp_host_alloc (scratch->inbox_size, FALSE, &coll->invalid);
  if (scratch->result_size > 0 && coll->invalid == NULL)
    scratch->result = _cp_host_alloc (scratch->result_size, FALSE, &coll->invalid);
  return coll->invalid == NULL;
}

static void
free_scratch (Scratch *scratch)
{
  if (scratch->inbox != NULL)
    _cp_host_free (scratch->inbox, scratch->inbox_size);
  if (scratch->result != NULL)
    _cp_host_free (scratch->result, scratch->result_size);
}

static gboolean
run_data_phase (UcxComm       *comm,
                CpCollective  *coll,
                guint          sequence,
                Scratch       *scratch,
                gint64         deadline,
                GError       **error)
{
  Region own;

  switch (coll->kind)
    {
    case CP_COLL_BARRIER:
      return TRUE;
    case CP_COLL_ALL_GATHER:
      own = (Region) { (guint8 *) coll->send, coll->block, coll->block, coll->outer };
      return run_pieces (comm, coll, sequence, &own, gather_send, deadline, error);
    case CP_COLL_ALL_TO_ALL:
      own = piece_of (coll->send, coll, comm->parent.size, comm->parent.index);
      return run_pieces (comm, coll, sequence, &own, scatter_piece, deadline, error);
    case CP_COLL_ALL_REDUCE:
      return run_all_reduce (comm, coll, sequence, scratch, deadline, error);
    case CP_COLL_BROADCAST:
      return run_broadcast (comm, coll, sequence, scratch, deadline, error);
    default:
      g_assert_not_reached ();
    }
}

/* The descriptor exchange is itself a barrier: nobody gets past it before
 * every member has arrived. */
static gboolean
ucx_collective (CpComm        *parent,
                CpCollective  *coll,
                gint64         deadline,
                GError       **error)
{
  UcxComm *comm = (UcxComm *) parent;
  guint sequence = comm->sequence++;
  Scratch scratch = { NULL, 0, NULL, 0 };
  CpCollective **descs;
  gboolean ok;

  comm->operation = _cp_fault_begin_operation ("ucx", parent->transport->rank);
  if (!check_usable (comm->transport, _cp_collective_name (coll->kind), error))
    return FALSE;
  alloc_scratch (comm, coll, &scratch);
  descs = exchange_descriptors (comm, coll, sequence, deadline, error);
  ok = descs != NULL &&
       _cp_collective_check_agreement ((const CpCollective * const *) descs, parent->size, error);
  if (descs != NULL)
    descriptors_free (descs, parent->size, parent->index);
  ok = ok && run_data_phase (comm, coll, sequence, &scratch, deadline, error);
  free_scratch (&scratch);
  return ok;
}

/* ---- point-to-point ----
 *
 * A send is three messages: a header with the dtype and shape, the data,
 * and an acknowledgement back from the receiver.  The receiver checks the
 * header before it lets the data in, so a mismatch leaves its tensor
 * untouched and fails on both sides with the same message, and a send
 * returns only once the receiver has taken the data. */

static CpRequest *
ucx_isend (CpComm          *parent,
           int              peer,
           guint64          tag,
           const CpMessage *message)
{
  UcxComm *comm = (UcxComm *) parent;
  UcxTransport *self = comm->transport;
  CpRequest *request = g_new0 (CpRequest, 1);
  int me = parent->index, to = world_rank (comm, peer);
  Region header = contiguous (&request->header, sizeof request->header);
  Region data = contiguous (message->data, message->nbytes);
  Region ack = contiguous (&request->ack, sizeof request->ack);

  request->is_send = TRUE;
  request->peer = peer;
  request->tag = tag;
  request->sent = message;
  _cp_ucx_wire_from_message (&request->header, message);
  lock (self);
  post_send (self, &request->ops[P2P_HEADER], to, &header, p2p_tag (comm, P2P_HEADER, tag, me));
  post_send (self, &request->ops[P2P_DATA], to, &data, p2p_tag (comm, P2P_DATA, tag, me));
  post_recv (self, &request->ops[P2P_ACK], to, &ack, p2p_tag (comm, P2P_ACK, tag, peer));
  unlock (self);
  /* A receiver that refuses the data drains it into nothing. */
  request->ops[P2P_DATA].may_truncate = TRUE;
  return request;
}

static CpRequest *
ucx_irecv (CpComm    *parent,
           int        peer,
           guint64    tag,
           CpMessage *message)
{
  UcxComm *comm = (UcxComm *) parent;
  UcxTransport *self = comm->transport;
  CpRequest *request = g_new0 (CpRequest, 1);
  Region header = contiguous (&request->header, sizeof request->header);

  request->peer = peer;
  request->tag = tag;
  request->message = message;
  lock (self);
  post_recv (self, &request->ops[P2P_HEADER], world_rank (comm, peer), &header,
             p2p_tag (comm, P2P_HEADER, tag, peer));
  unlock (self);
  return request;
}

static gboolean
wait_send (UcxComm    *comm,
           CpRequest  *request,
           gint64      deadline,
           GError    **error)
{
  CpMessage expected;

  if (!wait_ops (comm->transport, request->ops, G_N_ELEMENTS (request->ops), "send", deadline,
                 NULL, error))
    return FALSE;
  if (request->ack.accepted)
    return TRUE;
  _cp_ucx_message_from_wire (&expected, &request->ack.expected);
  _cp_message_set_mismatch (error, request->sent, comm->parent.index, request->tag, request->peer,
                            &expected);
  return FALSE;
}

static gboolean
wait_recv (UcxComm    *comm,
           CpRequest  *request,
           gint64      deadline,
           GError    **error)
{
  UcxTransport *self = comm->transport;
  int me = comm->parent.index, from = world_rank (comm, request->peer);
  CpMessage sent;
  gboolean accepted;
  Region data, ack = contiguous (&request->ack, sizeof request->ack);

  if (!wait_ops (self, &request->ops[P2P_HEADER], 1, "recv", deadline, NULL, error))
    return FALSE;
  _cp_ucx_message_from_wire (&sent, &request->header);
  accepted = _cp_message_matches (&sent, request->message);
  request->ack.accepted = accepted;
  _cp_ucx_wire_from_message (&request->ack.expected, request->message);
  data = accepted ? contiguous (request->message->data, request->message->nbytes)
                  : contiguous (&request->drain, 0);
  lock (self);
  post_recv (self, &request->ops[P2P_DATA], from, &data, p2p_tag (comm, P2P_DATA, request->tag, request->peer));
  post_send (self, &request->ops[P2P_ACK], from, &ack, p2p_tag (comm, P2P_ACK, request->tag, me));
  unlock (self);
  request->ops[P2P_DATA].may_truncate = !accepted;
  if (!wait_ops (self, &request->ops[P2P_DATA], 2, "recv", deadline, NULL, error))
    return FALSE;
  if (accepted)
    return TRUE;
  _cp_message_set_mismatch (error, &sent, request->peer, request->tag, me, request->message);
  return FALSE;
}

static gboolean
ucx_wait (CpComm     *parent,
          CpRequest  *request,
          gint64      deadline,
          GError    **error)
{
  UcxComm *comm = (UcxComm *) parent;
  GError *unusable = NULL;
  gboolean ok = check_usable (comm->transport, request->is_send ? "send" : "recv", &unusable);

  if (ok && request->is_send)
    ok = wait_send (comm, request, deadline, error);
  else if (ok)
    ok = wait_recv (comm, request, deadline, error);
  else
    {
      /* A send still in flight may be read by its peer: abort_ops closes
       * the endpoint by force before the buffers go. */
      abort_ops (comm->transport, request->ops, G_N_ELEMENTS (request->ops), unusable);
      g_propagate_error (error, unusable);
    }
  g_free (request);
  return ok;
}

/* ---- the transport ---- */

static void
ucx_transport_free (CpTransport *transport)
{
  UcxTransport *self = (UcxTransport *) transport;
  gboolean graceful;

  lock (self);
  graceful = self->broken == NULL;
  unlock (self);
  _cp_ucx_close_endpoints (self->worker, self->peers, (guint) transport->world_size, graceful,
                           g_get_monotonic_time () + CLOSE_GRACE_US);
  _cp_ucx_worker_free (self->worker);
  g_free (self->peers);
  g_ptr_array_unref (self->comms);
  g_clear_error (&self->broken);
  _cp_transport_clear (transport);
  g_free (self);
}

/* From the main context while no operation runs: lets UCX notice lost
 * peers (and report them) without waiting for the next operation. */
static void
ucx_poll (CpTransport *transport)
{
  UcxTransport *self = (UcxTransport *) transport;

  if (!_cp_mutex_trylock (&self->worker->lock))
    return;
  /* UCX 1.13 looks at the keepalive clock once in 32 rounds of progress. */
  for (guint i = 0; i < 32; i++)
    ucp_worker_progress (self->worker->worker);
  _cp_mutex_unlock (&self->worker->lock);
}

static const CpTransportOps ucx_ops = {
  .name = "ucx",
  .transport_free = ucx_transport_free,
  .comm_new = ucx_comm_new,
  .comm_free = ucx_comm_free,
  .collective = ucx_collective,
  .isend = ucx_isend,
  .irecv = ucx_irecv,
  .wait = ucx_wait,
  .poll = ucx_poll,
};

/* With the lock held, from inside progress. */
static void
on_peer_failed (CpUcxEndpoint *endpoint,
                gpointer       user_data)
{
  UcxTransport *self = user_data;
  g_autofree char *reason = g_strdup_printf ("the connection to rank %d failed: %s",
                                             endpoint->peer, ucs_status_string (endpoint->failure));

  _cp_transport_report_peer_lost (&self->parent, endpoint->peer, reason);
}

static gboolean
connect_peers (UcxTransport     *self,
               GBytes * const   *addresses,
               GError          **error)
{
  gboolean ok = TRUE;

  /* This rank too: send_recv may name it (a ring of one rank), and a
   * message to itself goes through UCX like any other. */
  lock (self);
  for (int r = 0; ok && r < self->parent.world_size; r++)
    {
      self->peers[r] = _cp_ucx_connect_address (self->worker, addresses[r], r, error);
      ok = self->peers[r] != NULL;
      if (ok)
        {
          self->peers[r]->failed_func = on_peer_failed;
          self->peers[r]->failed_data = self;
        }
    }
  unlock (self);
  return ok;
}

/* Every rank sends an empty message to every other and waits for theirs:
 * the endpoints work both ways before anyone gets the mesh. */
static gboolean
check_connections (UcxTransport  *self,
                   gint64         deadline,
                   GCancellable  *cancellable,
                   GError       **error)
{
  int n = self->parent.world_size, me = self->parent.rank;
  g_autofree CpUcxOp *ops = g_new0 (CpUcxOp, 2 * (gsize) n);
  guint8 empty = 0;
  Region none = contiguous (&empty, 0);
  guint n_ops = 0;

  lock (self);
  for (int r = 0; r < n; r++)
    if (r != me)
      {
        post_recv (self, &ops[n_ops++], r, &none, collective_tag (0, 0, 0, r));
        post_send (self, &ops[n_ops++], r, &none, collective_tag (0, 0, 0, me));
      }
  unlock (self);
  return wait_ops (self, ops, n_ops, "connect", deadline, cancellable, error);
}

static UcxTransport *
transport_new (const CpMeshConfig *config,
               CpUcxWorker        *worker)
{
  UcxTransport *self = g_new0 (UcxTransport, 1);

  _cp_transport_init (&self->parent, &ucx_ops, config->rank, config->world_size);
  self->worker = worker;
  self->peers = g_new0 (CpUcxEndpoint *, config->world_size);
  self->comms = g_ptr_array_new ();
  return self;
}

/* UCX checks on its peers this often; a lost peer is noticed within a
 * fraction of the timeout. */
static guint
keepalive_interval_ms (guint timeout_ms)
{
  return CLAMP (timeout_ms / 8, 100, 5000);
}

/* The worker, confined to what reaches the other ranks, and its address. */
static CpUcxWorker *
start_worker (const CpMeshConfig      *config,
              const CpBootstrapRoute  *route,
              GBytes                 **address,
              GError                 **error)
{
  CpUcxWorker *worker = _cp_ucx_worker_new (keepalive_interval_ms (config->timeout_ms), route, error);

  if (worker != NULL && (*address = _cp_ucx_worker_dup_address (worker, error)) == NULL)
    g_clear_pointer (&worker, _cp_ucx_worker_free);
  return worker;
}

/* Ranks meet through the transport-neutral bootstrap (cp-bootstrap.c),
 * which hands every rank the worker addresses of all: UCX never listens
 * for strangers, and nothing reaches it before the token was proved. */
CpTransport *
_cp_transport_ucx_connect (const CpMeshConfig  *config,
                           GCancellable        *cancellable,
                           GError             **error)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) config->timeout_ms * G_TIME_SPAN_MILLISECOND;
  CpBootstrapRoute route;
  CpUcxWorker *worker = NULL;
  g_autoptr(GBytes) address = NULL;
  g_autoptr(GPtrArray) addresses = NULL;
  UcxTransport *self;

  if (_cp_bootstrap_find_route (config, &route, error))
    worker = start_worker (config, &route, &address, error);
  if (worker != NULL)
    addresses = _cp_bootstrap_exchange (config, &route, "ucx", address, deadline, cancellable, error);
  _cp_bootstrap_route_clear (&route);
  if (addresses == NULL)
    {
      _cp_ucx_worker_free (worker);
      return NULL;
    }
  self = transport_new (config, worker);
  if (connect_peers (self, (GBytes * const *) addresses->pdata, error) &&
      check_connections (self, deadline, cancellable, error))
    return &self->parent;
  _cp_transport_unref (&self->parent);
  return NULL;
}
