/* cp-transport-ucx.c: ranks that are processes, over UCX
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-dtype-private.h"
#include "cp-error.h"
#include "cp-fault-private.h"
#include "cp-memory-private.h"
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
 * and members; 0 is the connection check and the failure notices); then
 *   collectives:     sequence (32 bits) | phase (3) | sender's index (10)
 *   point-to-point:  kind (2) | user tag (33) | sender's index (10)
 *
 * The sequence numbers a communicator's collectives in its tags, from 1
 * as messages number them ("all_gather #4" has sequence 4).  It wraps
 * after 2^32 calls, and that aliases nothing: a rank cannot finish
 * a collective before every member has sent it everything, so the
 * messages in flight on a communicator belong to two consecutive calls
 * at most — and after a failure, which could leave older messages
 * behind, this rank receives nothing more (below).
 *
 * Failure: every wait is bounded by the caller's deadline.  A wait that
 * fails cancels its receives; whatever is still in flight after that (a
 * send, or a receive already being filled) means a peer may still touch
 * this rank's buffers, so the endpoints involved are closed by force.
 *
 * Any failure — a wait that times out or loses a peer, a message cut
 * short or malformed — breaks the transport (cp-transport-private.h).
 * The rank records it as the first failure and tells every other rank
 * with a notice on a tag of its own, sent without waiting for an answer;
 * a rank that gets a notice adopts the failure it names and passes the
 * notice on, in case the first rank could not reach everyone.  A broken
 * transport posts nothing more: every operation, on every communicator,
 * fails at once with "mesh broken: …", so messages that a failure left
 * in flight are never delivered.  Every rank listens for notices while
 * it waits for anything, and once more before a collective returns, so
 * that a rank that finished its part of the call a peer failed fails it
 * too.  The window that remains is the time a notice takes to arrive:
 * a rank that completes the call in it returns success (doc/mesh-ucx.md).
 * A notice about the next call of the same communicator spares the call
 * that is finishing: its sender finished that one, so every rank could. */

#define P2P_BIT (G_GUINT64_CONSTANT (1) << 63)
#define COMM_SHIFT 45
#define COMM_BITS 18
#define SEQUENCE_SHIFT 13
#define PHASE_SHIFT 10
#define SENDER_BITS 10
#define USER_TAG_BITS 33
#define DESCRIPTOR_MAX CP_UCX_DESCRIPTOR_MAX
/* After a failure, how long UCX gets to hand back the requests of the
 * endpoints closed by force. */
#define ABORT_GRACE_US (2 * G_TIME_SPAN_SECOND)
#define CLOSE_GRACE_US G_TIME_SPAN_SECOND
/* How long notices get to leave before the endpoints they travel on may
 * be closed by force. */
#define NOTICE_GRACE_US (100 * G_TIME_SPAN_MILLISECOND)
#define NOTICE_MAGIC 0x4e425043u  /* "CPBN" */

G_STATIC_ASSERT (CP_MESH_UCX_MAX_WORLD_SIZE <= 1 << SENDER_BITS);

enum { PHASE_DESCRIPTOR, PHASE_DATA, PHASE_GATHER, PHASE_NOTICE = 7 };
typedef enum { P2P_HEADER, P2P_DATA, P2P_ACK } P2pKind;

/* A failure notice: the first failure, and the collective it struck so
 * that the rank finishing the call before it can tell. */
typedef struct
{
  guint32 magic;
  guint32 code;            /* a CpMeshError */
  guint64 comm;            /* the communicator's key hash; 0: not a collective */
  guint64 call;            /* the collective's number on it */
  char text[488];          /* the first failure's message, NUL-terminated */
} Notice;

G_STATIC_ASSERT (sizeof (Notice) == 512);

typedef struct
{
  CpTransport parent;
  CpUcxWorker *worker;
  CpUcxEndpoint **peers;   /* one per world rank, this one's included */
  GPtrArray *comms;        /* UcxComm*, not owned; under the worker lock */

  /* Under the worker lock. */
  GError *broken;          /* the first failure */
  guint64 broken_comm;     /* where it struck, as a notice says */
  guint64 broken_call;
  gboolean listening;      /* notice_recv was posted */
  CpUcxOp notice_recv;
  Notice inbox;            /* what notice_recv receives */
  Notice outbox;           /* the notice this rank sends; outlives the worker */
} UcxTransport;

typedef struct
{
  CpComm parent;
  UcxTransport *transport;
  char *key;
  guint32 id;
  guint64 key_hash;        /* names it in notices */
  guint32 sequence;        /* of the last collective, in tags: its number, mod 2^32 */
  guint64 calls;           /* collectives started, as errors number them */
  guint operation;         /* the running collective, as fault injection counts */
} UcxComm;

/* The operation a wait belongs to: how its errors start, and how it is
 * named if it suffers the mesh's first failure. */
typedef struct
{
  const char *what;        /* "all_gather", "send" */
  char label[64];          /* "all_gather #12", "send to rank 1 with tag 5" */
  guint64 comm;            /* a collective's communicator key hash, else 0 */
  guint64 call;
} Operation;

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
  guint operation;         /* as fault injection counts */
  CpUcxOp ops[3];          /* indexed by P2pKind */
};

/* Where the bytes of @region are: UCX moves host memory by address. */
static guint8 *
address_of (const CpRegion *region)
{
  return _cp_region_get_address (region);
}

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
                guint32 sequence,
                guint   phase,
                int     sender)
{
  return ((guint64) comm_id << COMM_SHIFT) | ((guint64) sequence << SEQUENCE_SHIFT) |
         ((guint64) phase << PHASE_SHIFT) | (guint64) sender;
}

static guint64
notice_tag (int sender)
{
  return collective_tag (0, 0, PHASE_NOTICE, sender);
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

/* ---- failure notices ---- */

/* With the lock held: the first failure, unless it spares @op, a
 * collective that a notice about the next call of its communicator
 * finds finishing. */
static const GError *
broken_for (UcxTransport    *self,
            const Operation *op)
{
  if (self->broken == NULL)
    return NULL;
  if (op != NULL && op->comm != 0 && self->broken_comm == op->comm &&
      self->broken_call == op->call + 1)
    return NULL;
  return self->broken;
}

static gboolean
all_complete (void   **requests,
              guint    n)
{
  for (guint i = 0; i < n; i++)
    if (ucp_request_check_status (requests[i]) == UCS_INPROGRESS)
      return FALSE;
  return TRUE;
}

/* With the lock held: sends the outbox to every other rank and gives the
 * sends a moment to leave, since endpoints may be closed by force next;
 * whatever has not left by then goes on by itself. */
static void
tell_peers (UcxTransport *self)
{
  ucp_request_param_t param = { 0 };
  g_autoptr(GPtrArray) sending = g_ptr_array_new_with_free_func (ucp_request_free);
  gint64 deadline = g_get_monotonic_time () + NOTICE_GRACE_US;
  guint idle = 0;

  for (int r = 0; r < self->parent.world_size; r++)
    {
      CpUcxEndpoint *endpoint = self->peers[r];
      ucs_status_ptr_t request;

      if (endpoint == NULL || endpoint->ep == NULL || endpoint->failure != UCS_OK)
        continue;
      request = ucp_tag_send_nbx (endpoint->ep, &self->outbox, sizeof self->outbox,
                                  notice_tag (self->parent.rank), &param);
      if (UCS_PTR_IS_PTR (request))
        g_ptr_array_add (sending, request);
    }
  while (!all_complete (sending->pdata, sending->len) && g_get_monotonic_time () < deadline)
    {
      if (ucp_worker_progress (self->worker->worker) > 0)
        idle = 0;
      _cp_ucx_idle (&idle);
    }
}

static void
fill_outbox (UcxTransport *self)
{
  int code = self->broken->domain == CP_MESH_ERROR ? self->broken->code : CP_MESH_ERROR_FAILED;

  memset (&self->outbox, 0, sizeof self->outbox);
  self->outbox.magic = GUINT32_TO_LE (NOTICE_MAGIC);
  self->outbox.code = GUINT32_TO_LE ((guint32) code);
  self->outbox.comm = GUINT64_TO_LE (self->broken_comm);
  self->outbox.call = GUINT64_TO_LE (self->broken_call);
  g_strlcpy (self->outbox.text, self->broken->message, sizeof self->outbox.text);
}

/* With the lock held: makes @first, which struck @comm's call @call, the
 * first failure unless there is one, and passes it on to every peer. */
static void
set_broken (UcxTransport *self,
            GError       *first,
            guint64       comm,
            guint64       call)
{
  if (self->broken != NULL)
    {
      g_error_free (first);
      return;
    }
  self->broken = first;
  self->broken_comm = comm;
  self->broken_call = call;
  fill_outbox (self);
  tell_peers (self);
}

/* With the lock held: @failure, which this rank suffered in @op, breaks
 * the mesh. */
static void
break_mesh (UcxTransport    *self,
            const Operation *op,
            const GError    *failure)
{
  if (self->broken == NULL)
    set_broken (self, _cp_transport_describe_failure (self->parent.rank, op->label, failure),
                op->comm, op->call);
}

/* Whatever a peer sent, a CpMeshError code and a message in UTF-8
 * without control characters. */
static GError *
read_failure (const Notice *notice)
{
  guint32 code = GUINT32_FROM_LE (notice->code);
  g_autofree char *text = _cp_mesh_escape_text (notice->text, strnlen (notice->text, sizeof notice->text));

  if (code > CP_MESH_ERROR_CANCELLED)
    code = CP_MESH_ERROR_FAILED;
  return g_error_new_literal (CP_MESH_ERROR, (int) code, text);
}

/* With the lock held: listens for the first notice, once. */
static void
listen_for_notices (UcxTransport *self)
{
  ucp_request_param_t param = { .op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL };
  guint64 sender_mask = (G_GUINT64_CONSTANT (1) << SENDER_BITS) - 1;

  if (self->listening)
    return;
  memset (&self->notice_recv, 0, sizeof self->notice_recv);
  self->notice_recv.is_recv = TRUE;
  self->notice_recv.expected = sizeof self->inbox;
  self->notice_recv.peer = -1;
  _cp_ucx_op_begin (&self->notice_recv,
                    ucp_tag_recv_nbx (self->worker->worker, &self->inbox, sizeof self->inbox,
                                      notice_tag (0), ~sender_mask, &param));
  self->listening = TRUE;
}

/* With the lock held: progress until nothing more happens.  UCX takes in
 * a few of the messages waiting in shared memory per round; a notice
 * that arrived behind others counts only once they are all in. */
static void
drain (UcxTransport *self)
{
  for (guint i = 0; i < 1024 && ucp_worker_progress (self->worker->worker) > 0; i++)
    ;
}

/* With the lock held, after progress: adopts the failure a notice that
 * arrived names.  One is enough, but the rank listens on: every other
 * rank that fails sends one too, and a notice nobody receives stays
 * queued in UCX until the worker goes. */
static void
read_notices (UcxTransport *self)
{
  listen_for_notices (self);
  if (!_cp_ucx_op_poll (&self->notice_recv) || self->notice_recv.status == UCS_ERR_CANCELED)
    return;
  if (self->notice_recv.status == UCS_OK && GUINT32_FROM_LE (self->inbox.magic) == NOTICE_MAGIC)
    set_broken (self, read_failure (&self->inbox), GUINT64_FROM_LE (self->inbox.comm),
                GUINT64_FROM_LE (self->inbox.call));
  self->listening = FALSE;
  listen_for_notices (self);
}

/* Before the worker goes: a receive still posted would write into it. */
static void
stop_listening (UcxTransport *self)
{
  lock (self);
  if (self->notice_recv.request != NULL)
    {
      ucp_request_cancel (self->worker->worker, self->notice_recv.request);
      ucp_worker_progress (self->worker->worker);
      _cp_ucx_op_poll (&self->notice_recv);
    }
  _cp_ucx_op_clear (&self->notice_recv);
  unlock (self);
}

/* ---- waiting ---- */

typedef struct
{
  guint pending;
  CpUcxOp *failed;
  CpUcxOp *lost;
  const GError *broken;
} Survey;

/* With the lock held: one round of progress and what it left, for @op
 * (NULL: none).  A @thorough survey first takes in everything that has
 * arrived, as one must before it calls anything late. */
static Survey
survey (UcxTransport    *self,
        CpUcxOp         *ops,
        guint            n,
        const Operation *op,
        gboolean         thorough,
        guint           *idle)
{
  Survey s = { 0, NULL, NULL, NULL };

  if (ucp_worker_progress (self->worker->worker) > 0)
    *idle = 0;
  if (thorough)
    drain (self);
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
  /* Done: but a notice may wait behind the last message. */
  if (s.pending == 0 && !thorough)
    drain (self);
  read_notices (self);
  s.broken = broken_for (self, op);
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

static void
set_cancelled (UcxTransport  *self,
               CpUcxOp       *ops,
               guint          n,
               const char    *what,
               GError       **error)
{
  g_autofree char *peers = list_peers (ops, n);

  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED,
               "%s: rank %d was cancelled while it waited for mesh ranks %s", what,
               self->parent.rank, peers);
}

/* After a failure: cancels the receives, then closes by force the
 * endpoints of whatever is still in flight, so that no peer can touch
 * this rank's buffers once the caller has the error. */
static void
abort_ops (UcxTransport *self,
           CpUcxOp      *ops,
           guint         n)
{
  g_autoptr(GPtrArray) doomed = g_ptr_array_new ();
  gint64 deadline = g_get_monotonic_time () + ABORT_GRACE_US;
  guint idle = 0;

  lock (self);
  for (guint i = 0; i < n; i++)
    if (ops[i].request != NULL && ops[i].is_recv)
      ucp_request_cancel (self->worker->worker, ops[i].request);
  survey (self, ops, n, NULL, FALSE, &idle);
  for (guint i = 0; i < n; i++)
    if (ops[i].request != NULL && !g_ptr_array_find (doomed, self->peers[ops[i].peer], NULL))
      g_ptr_array_add (doomed, self->peers[ops[i].peer]);
  unlock (self);

  if (doomed->len > 0)
    _cp_ucx_close_endpoints (self->worker, (CpUcxEndpoint **) doomed->pdata, doomed->len, FALSE,
                             g_get_monotonic_time ());
  for (Survey s = { 1, NULL, NULL, NULL }; s.pending > 0 && g_get_monotonic_time () < deadline;)
    {
      lock (self);
      s = survey (self, ops, n, NULL, FALSE, &idle);
      unlock (self);
      _cp_ucx_idle (&idle);
    }
  lock (self);
  for (guint i = 0; i < n; i++)
    _cp_ucx_op_clear (&ops[i]);
  unlock (self);
}

/* With the lock held: what keeps @op from completing, if anything — the
 * mesh's first failure, or a failure of one of @ops — as the error @op
 * fails with.  Sets @own when the failure is this rank's. */
static GError *
find_failure (UcxTransport    *self,
              const Survey    *s,
              const Operation *op,
              gboolean        *own)
{
  GError *failure = NULL;

  *own = s->broken == NULL;
  if (s->broken != NULL)
    _cp_transport_set_broken_error (&failure, op->what, s->broken);
  else if (s->failed != NULL)
    set_failure (self, s->failed, op->what, &failure);
  else if (s->pending != 0 && s->lost != NULL)
    set_failure (self, s->lost, op->what, &failure);
  return failure;
}

/* Waits until every op of @ops completed, or fails: the mesh broke, an op
 * failed, a peer was lost, @deadline passed, or @joining (a join's,
 * G_IO_ERROR_CANCELLED) or @cancellable (the call's the wait runs for,
 * CP_MESH_ERROR_CANCELLED) was cancelled, which it sees within a round of
 * progress.  The ops are cleared either way.  Before it reports success
 * it looks for notices once more, so that a rank that finished its part
 * of a call a peer failed fails too. */
static gboolean
wait_for (UcxTransport     *self,
          CpUcxOp          *ops,
          guint             n,
          const Operation  *op,
          gint64            deadline,
          GCancellable     *joining,
          GCancellable     *cancellable,
          GError          **error)
{
  gint64 started = g_get_monotonic_time ();
  guint idle = 0;

  for (;;)
    {
      /* Only a thorough round of progress that starts after the deadline
       * may call it a timeout: what arrived meanwhile — while this
       * process was stopped, say — counts first. */
      gboolean late = g_get_monotonic_time () >= deadline;
      GError *failure;
      gboolean own;
      Survey s;

      lock (self);
      s = survey (self, ops, n, op, late, &idle);
      failure = find_failure (self, &s, op, &own);
      unlock (self);
      if (failure == NULL && s.pending == 0)
        break;
      if (failure == NULL && late)
        set_timeout (self, ops, n, op->what, g_get_monotonic_time () - started, &failure);
      if (failure == NULL)
        g_cancellable_set_error_if_cancelled (joining, &failure);
      if (failure == NULL && g_cancellable_is_cancelled (cancellable))
        set_cancelled (self, ops, n, op->what, &failure);
      if (failure != NULL)
        {
          lock (self);
          if (own)
            break_mesh (self, op, failure);
          unlock (self);
          abort_ops (self, ops, n);
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

/* For the connection check, which belongs to no operation of the mesh. */
static gboolean
wait_ops (UcxTransport  *self,
          CpUcxOp       *ops,
          guint          n,
          const char    *what,
          gint64         deadline,
          GCancellable  *cancellable,
          GError       **error)
{
  Operation op = { what, "", 0, 0 };

  g_strlcpy (op.label, what, sizeof op.label);
  return wait_for (self, ops, n, &op, deadline, cancellable, NULL, error);
}

/* With the lock held: whether @op may post anything; else @error says
 * why not. */
static gboolean
may_post (UcxTransport     *self,
          const Operation  *op,
          GError          **error)
{
  const GError *broken = broken_for (self, op);

  if (broken != NULL)
    _cp_transport_set_broken_error (error, op->what, broken);
  return broken == NULL;
}

/* Fails @op at once when the mesh broke, after looking for notices that
 * arrived while this rank was away. */
static gboolean
check_usable (UcxTransport     *self,
              const Operation  *op,
              GError          **error)
{
  gboolean usable;

  lock (self);
  drain (self);
  read_notices (self);
  usable = may_post (self, op, error);
  unlock (self);
  return usable;
}

/* ---- injected faults (cp-fault-private.h; nothing in other builds) ---- */

/* The fault the armed one makes this rank suffer at @step of its
 * @operation: it dies or waits here; dropping and truncating are up to
 * post_send_as(). */
static CpFaultKind
suffer_fault (UcxTransport *self,
              guint         operation,
              CpFaultStep   step)
{
  guint delay_ms = 0;
  CpFaultKind fault = _cp_fault_strike ("ucx", self->parent.rank, operation, step, &delay_ms);

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

/* The same on every member, from a SHA-256 of the key: its tag space, 18
 * bits, and the name notices give it, 64; neither is ever 0. */
static void
hash_key (UcxComm *comm)
{
  g_autoptr(GChecksum) checksum = g_checksum_new (G_CHECKSUM_SHA256);
  guint8 digest[32];
  gsize length = sizeof digest;
  guint64 hash = 0;

  g_checksum_update (checksum, (const guchar *) comm->key, -1);
  g_checksum_get_digest (checksum, digest, &length);
  comm->id = ((guint32) digest[0] << 16 | (guint32) digest[1] << 8 | digest[2]) & ((1u << COMM_BITS) - 1);
  comm->id = MAX (comm->id, 1);
  for (guint i = 8; i < 16; i++)
    hash = hash << 8 | digest[i];
  comm->key_hash = MAX (hash, 1);
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
  hash_key (comm);
  comm->sequence = _cp_fault_get_sequence_origin ();
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

/* A collective under way on this rank. */
typedef struct
{
  UcxComm *comm;
  CpCollective *coll;
  guint32 sequence;
  Operation op;
  GCancellable *cancellable; /* the call's the collective runs for */
} Call;

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
 * send.  A malformed descriptor breaks the mesh. */
static gboolean
unpack_descriptors (Call           *call,
                    const guint8   *inbox,
                    const CpUcxOp  *ops,
                    CpCollective  **descs,
                    GError        **error)
{
  UcxComm *comm = call->comm;

  for (int r = 0, i = 0; r < comm->parent.size; r++)
    {
      g_autoptr(GError) malformed = NULL;
      GError *failure = NULL;

      if (r == comm->parent.index)
        continue;
      descs[r] = g_new0 (CpCollective, 1);
      if (!_cp_ucx_unpack_descriptor (inbox + (gsize) r * DESCRIPTOR_MAX, ops[i].info.length,
                                      descs[r], &malformed))
        {
          g_set_error (&failure, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                       "%s: communicator rank %d sent a malformed descriptor: %s", call->op.what, r,
                       malformed->message);
          lock (comm->transport);
          break_mesh (comm->transport, &call->op, failure);
          unlock (comm->transport);
          g_propagate_error (error, failure);
          return FALSE;
        }
      i += 2;
    }
  return TRUE;
}

/* Sends this rank's descriptor to every other member and returns all of
 * them in communicator order. */
static CpCollective **
exchange_descriptors (Call     *call,
                      gint64    deadline,
                      GError  **error)
{
  UcxComm *comm = call->comm;
  UcxTransport *self = comm->transport;
  int n = comm->parent.size, me = comm->parent.index;
  g_autoptr(GBytes) mine = _cp_ucx_pack_descriptor (call->coll);
  g_autofree guint8 *inbox = g_malloc ((gsize) n * DESCRIPTOR_MAX);
  g_autofree CpUcxOp *ops = g_new0 (CpUcxOp, 2 * (gsize) n);
  CpCollective **descs = g_new0 (CpCollective *, n);
  Region out = contiguous (g_bytes_get_data (mine, NULL), g_bytes_get_size (mine));
  CpFaultKind fault = suffer_fault (self, comm->operation, CP_FAULT_STEP_DESCRIPTOR);
  guint n_ops = 0;
  gboolean ok;

  lock (self);
  ok = may_post (self, &call->op, error);
  for (int r = 0; ok && r < n; r++)
    if (r != me)
      {
        Region in = contiguous (inbox + (gsize) r * DESCRIPTOR_MAX, DESCRIPTOR_MAX);

        post_recv (self, &ops[n_ops], world_rank (comm, r), &in,
                   collective_tag (comm->id, call->sequence, PHASE_DESCRIPTOR, r));
        /* Descriptors differ in length; the parser checks them whole. */
        ops[n_ops++].expected = 0;
        post_send_as (self, &ops[n_ops++], world_rank (comm, r), &out,
                      collective_tag (comm->id, call->sequence, PHASE_DESCRIPTOR, me), fault);
      }
  unlock (self);
  descs[me] = call->coll;
  if (ok && wait_for (self, ops, n_ops, &call->op, deadline, NULL, call->cancellable, error) &&
      unpack_descriptors (call, inbox, ops, descs, error))
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
exchange_regions (Call        *call,
                  guint        phase,
                  RegionFunc   send_to,
                  RegionFunc   recv_of,
                  gpointer     user_data,
                  gint64       deadline,
                  GError     **error)
{
  UcxComm *comm = call->comm;
  CpCollective *coll = call->coll;
  UcxTransport *self = comm->transport;
  int n = comm->parent.size, me = comm->parent.index;
  g_autofree CpUcxOp *ops = g_new0 (CpUcxOp, 2 * (gsize) n);
  CpFaultKind fault = suffer_fault (self, comm->operation,
                                    phase == PHASE_GATHER ? CP_FAULT_STEP_RESULT : CP_FAULT_STEP_DATA);
  guint n_ops = 0;
  gboolean ok;

  lock (self);
  ok = may_post (self, &call->op, error);
  for (int r = 0; ok && r < n; r++)
    {
      Region in, out;

      if (r == me)
        continue;
      in = recv_of (coll, n, me, r, user_data);
      out = send_to (coll, n, me, r, user_data);
      if (!is_empty (&in))
        post_recv (self, &ops[n_ops++], world_rank (comm, r), &in,
                   collective_tag (comm->id, call->sequence, phase, r));
      if (!is_empty (&out))
        post_send_as (self, &ops[n_ops++], world_rank (comm, r), &out,
                      collective_tag (comm->id, call->sequence, phase, me), fault);
    }
  unlock (self);
  return ok && wait_for (self, ops, n_ops, &call->op, deadline, NULL, call->cancellable, error);
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
  return contiguous (address_of (&coll->send), coll->outer * coll->block);
}

/* All-to-all: send is [outer][n][block]; piece r goes to r. */
static Region
scatter_piece (CpCollective *coll,
               int           n,
               int           me,
               int           r,
               gpointer      user_data)
{
  return piece_of (address_of (&coll->send), coll, n, r);
}

/* Both: recv is [outer][n][block], and piece r of it comes from r. */
static Region
gathered_piece (CpCollective *coll,
                int           n,
                int           me,
                int           r,
                gpointer      user_data)
{
  return piece_of (address_of (&coll->recv), coll, n, r);
}

/* Copies this member's own piece of recv from @own, then exchanges the
 * others'. */
static gboolean
run_pieces (Call          *call,
            const Region  *own,
            RegionFunc     send_to,
            gint64         deadline,
            GError       **error)
{
  Region slot = piece_of (address_of (&call->coll->recv), call->coll, call->comm->parent.size,
                          call->comm->parent.index);

  copy_region (&slot, own);
  return exchange_regions (call, PHASE_DATA, send_to, gathered_piece, NULL, deadline, error);
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
  return contiguous (address_of (&coll->recv), coll->count * cp_dtype_get_size (coll->dtype));
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
run_broadcast (Call          *call,
               Scratch       *scratch,
               gint64         deadline,
               GError       **error)
{
  CpCollective *coll = call->coll;
  gsize size = coll->count * cp_dtype_get_size (coll->dtype);
  gboolean ok;

  ok = exchange_regions (call, PHASE_DATA, broadcast_send, broadcast_recv, scratch->inbox, deadline,
                         error);
  if (ok && call->comm->parent.index != coll->root)
    memcpy (address_of (&coll->recv), scratch->inbox, size);
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

  return contiguous (address_of (&coll->recv) + _cp_collective_slice_start (coll, n, r) * plan->elsize,
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
    srcs[r] = r == me ? address_of (&coll->recv) + start * plan->elsize
                      : plan->inbox + (gsize) r * plan->mine * plan->elsize;
  _cp_reduce_many (coll->dtype, coll->op, plan->result + start * plan->elsize, srcs, n, 0, plan->mine);
}

static gboolean
run_all_reduce (Call          *call,
                Scratch       *scratch,
                gint64         deadline,
                GError       **error)
{
  CpCollective *coll = call->coll;
  int n = call->comm->parent.size, me = call->comm->parent.index;
  ReducePlan plan = { cp_dtype_get_size (coll->dtype), slice_length (coll, n, me), scratch->inbox,
                      scratch->result };

  if (!exchange_regions (call, PHASE_DATA, reduce_send, reduce_recv, &plan, deadline, error))
    return FALSE;
  reduce_own_slice (coll, n, me, &plan);
  if (!exchange_regions (call, PHASE_GATHER, reduced_send, reduced_recv, &plan, deadline, error))
    return FALSE;
  memcpy (address_of (&coll->recv), plan.result, coll->count * plan.elsize);
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
run_data_phase (Call          *call,
                Scratch       *scratch,
                gint64         deadline,
                GError       **error)
{
  CpCollective *coll = call->coll;
  Region own;

  switch (coll->kind)
    {
    case CP_COLL_BARRIER:
      return TRUE;
    case CP_COLL_ALL_GATHER:
      own = (Region) { address_of (&coll->send), coll->block, coll->block, coll->outer };
      return run_pieces (call, &own, gather_send, deadline, error);
    case CP_COLL_ALL_TO_ALL:
      own = piece_of (address_of (&coll->send), coll, call->comm->parent.size, call->comm->parent.index);
      return run_pieces (call, &own, scatter_piece, deadline, error);
    case CP_COLL_ALL_REDUCE:
      return run_all_reduce (call, scratch, deadline, error);
    case CP_COLL_BROADCAST:
      return run_broadcast (call, scratch, deadline, error);
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
                GCancellable  *cancellable,
                GError       **error)
{
  UcxComm *comm = (UcxComm *) parent;
  /* The Nth collective is "#N" in messages and N in its tags. */
  Call call = { comm, coll, ++comm->sequence, .cancellable = cancellable };
  Scratch scratch = { NULL, 0, NULL, 0 };
  CpCollective **descs;
  gboolean ok;

  call.op.what = _cp_collective_name (coll->kind);
  call.op.comm = comm->key_hash;
  call.op.call = ++comm->calls;
  _cp_collective_label (call.op.label, sizeof call.op.label, coll->kind, call.op.call);
  comm->operation = _cp_fault_begin_operation ("ucx", parent->transport->rank);
  if (!check_usable (comm->transport, &call.op, error))
    return FALSE;
  alloc_scratch (comm, coll, &scratch);
  descs = exchange_descriptors (&call, deadline, error);
  ok = descs != NULL &&
       _cp_collective_check_agreement ((const CpCollective * const *) descs, parent->size,
                                       parent->transport->rank, error);
  if (descs != NULL)
    descriptors_free (descs, parent->size, parent->index);
  ok = ok && run_data_phase (&call, &scratch, deadline, error);
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

static void
name_message (Operation       *op,
              const CpRequest *request)
{
  op->what = request->is_send ? "send" : "recv";
  op->comm = 0;
  op->call = 0;
  _cp_message_label (op->label, sizeof op->label, request->is_send, request->peer, request->tag);
}

/* With the lock held: whether @request may post anything, on a mesh
 * that did not break, as far as the notices that arrived tell. */
static gboolean
request_may_post (UcxTransport    *self,
                  const CpRequest *request)
{
  Operation op;

  drain (self);
  read_notices (self);
  name_message (&op, request);
  return may_post (self, &op, NULL);
}

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
  Region data = contiguous (address_of (&message->data), message->nbytes);
  Region ack = contiguous (&request->ack, sizeof request->ack);
  CpFaultKind fault;

  request->is_send = TRUE;
  request->peer = peer;
  request->tag = tag;
  request->sent = message;
  request->operation = _cp_fault_begin_operation ("ucx", self->parent.rank);
  _cp_ucx_wire_from_message (&request->header, message);
  fault = suffer_fault (self, request->operation, CP_FAULT_STEP_DESCRIPTOR);
  lock (self);
  if (request_may_post (self, request))
    {
      post_send_as (self, &request->ops[P2P_HEADER], to, &header, p2p_tag (comm, P2P_HEADER, tag, me),
                    fault);
      post_recv (self, &request->ops[P2P_ACK], to, &ack, p2p_tag (comm, P2P_ACK, tag, peer));
    }
  unlock (self);
  fault = suffer_fault (self, request->operation, CP_FAULT_STEP_DATA);
  lock (self);
  if (request_may_post (self, request))
    post_send_as (self, &request->ops[P2P_DATA], to, &data, p2p_tag (comm, P2P_DATA, tag, me), fault);
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
  request->operation = _cp_fault_begin_operation ("ucx", self->parent.rank);
  suffer_fault (self, request->operation, CP_FAULT_STEP_DESCRIPTOR);
  lock (self);
  if (request_may_post (self, request))
    post_recv (self, &request->ops[P2P_HEADER], world_rank (comm, peer), &header,
               p2p_tag (comm, P2P_HEADER, tag, peer));
  unlock (self);
  return request;
}

static gboolean
wait_send (UcxComm          *comm,
           CpRequest        *request,
           const Operation  *op,
           gint64            deadline,
           GCancellable     *cancellable,
           GError          **error)
{
  CpMessage expected;

  if (!wait_for (comm->transport, request->ops, G_N_ELEMENTS (request->ops), op, deadline, NULL,
                 cancellable, error))
    return FALSE;
  if (request->ack.accepted)
    return TRUE;
  _cp_ucx_message_from_wire (&expected, &request->ack.expected);
  _cp_message_set_mismatch (error, request->sent, comm->parent.index, request->tag, request->peer,
                            &expected);
  return FALSE;
}

static gboolean
wait_recv (UcxComm          *comm,
           CpRequest        *request,
           const Operation  *op,
           gint64            deadline,
           GCancellable     *cancellable,
           GError          **error)
{
  UcxTransport *self = comm->transport;
  int me = comm->parent.index, from = world_rank (comm, request->peer);
  CpMessage sent;
  gboolean accepted;
  Region data, ack = contiguous (&request->ack, sizeof request->ack);
  CpFaultKind fault;

  if (!wait_for (self, &request->ops[P2P_HEADER], 1, op, deadline, NULL, cancellable, error))
    return FALSE;
  _cp_ucx_message_from_wire (&sent, &request->header);
  accepted = _cp_message_matches (&sent, request->message);
  request->ack.accepted = accepted;
  _cp_ucx_wire_from_message (&request->ack.expected, request->message);
  data = accepted ? contiguous (address_of (&request->message->data), request->message->nbytes)
                  : contiguous (&request->drain, 0);
  fault = suffer_fault (self, request->operation, CP_FAULT_STEP_DATA);
  lock (self);
  if (may_post (self, op, NULL))
    {
      post_recv (self, &request->ops[P2P_DATA], from, &data,
                 p2p_tag (comm, P2P_DATA, request->tag, request->peer));
      post_send_as (self, &request->ops[P2P_ACK], from, &ack, p2p_tag (comm, P2P_ACK, request->tag, me),
                    fault);
    }
  unlock (self);
  request->ops[P2P_DATA].may_truncate = !accepted;
  if (!wait_for (self, &request->ops[P2P_DATA], 2, op, deadline, NULL, cancellable, error))
    return FALSE;
  if (accepted)
    return TRUE;
  _cp_message_set_mismatch (error, &sent, request->peer, request->tag, me, request->message);
  return FALSE;
}

static gboolean
ucx_wait (CpComm        *parent,
          CpRequest     *request,
          gint64         deadline,
          GCancellable  *cancellable,
          GError       **error)
{
  UcxComm *comm = (UcxComm *) parent;
  GError *unusable = NULL;
  Operation op;
  gboolean ok;

  name_message (&op, request);
  ok = check_usable (comm->transport, &op, &unusable);
  if (ok && request->is_send)
    ok = wait_send (comm, request, &op, deadline, cancellable, error);
  else if (ok)
    ok = wait_recv (comm, request, &op, deadline, cancellable, error);
  else
    {
      /* A send still in flight may be read by its peer: abort_ops closes
       * the endpoint by force before the buffers go. */
      abort_ops (comm->transport, request->ops, G_N_ELEMENTS (request->ops));
      g_propagate_error (error, unusable);
    }
  g_free (request);
  return ok;
}

/* ---- the transport ---- */

/* Receives @message into nothing, until @deadline at most: UCX drops
 * the bytes of a short message, and answers a long one's sender (which
 * sent only its announcement) that it is done, so that its request
 * completes too. */
static void
drop_message (UcxTransport      *self,
              ucp_tag_message_h  message,
              gint64             deadline)
{
  ucp_request_param_t param = { 0 };
  CpUcxOp op = { .is_recv = TRUE, .peer = -1 };
  guint idle = 0;

  _cp_ucx_op_begin (&op, ucp_tag_msg_recv_nbx (self->worker->worker, NULL, 0, message, &param));
  while (!_cp_ucx_op_poll (&op) && g_get_monotonic_time () < deadline)
    if (ucp_worker_progress (self->worker->worker) == 0)
      _cp_ucx_idle (&idle);
  _cp_ucx_op_clear (&op);
}

/* With the lock held, before the worker goes: receives into nothing
 * every tagged message still queued — what a failure left in flight
 * (the mesh posts nothing more once broken), or a notice that came as
 * the rank left.  UCX would warn of each one left unmatched when the
 * worker is destroyed, on standard output, amid the program's own
 * output; and the sender of a long one would wait for an answer until
 * its own teardown. */
static void
discard_unexpected (UcxTransport *self,
                    gint64        deadline)
{
  for (;;)
    {
      ucp_tag_recv_info_t info;
      ucp_tag_message_h message;

      drain (self);
      message = ucp_tag_probe_nb (self->worker->worker, 0, 0, 1, &info);
      if (message == NULL)
        return;
      drop_message (self, message, deadline);
    }
}

static void
ucx_transport_free (CpTransport *transport)
{
  UcxTransport *self = (UcxTransport *) transport;
  gboolean graceful;

  /* Leftovers first, while their senders' endpoints are open to hear
   * that they are done with; then, still listening for notices while the
   * endpoints close (one may be on its way), whatever came meanwhile. */
  lock (self);
  graceful = self->broken == NULL;
  discard_unexpected (self, g_get_monotonic_time () + NOTICE_GRACE_US);
  unlock (self);
  _cp_ucx_close_endpoints (self->worker, self->peers, (guint) transport->world_size, graceful,
                           g_get_monotonic_time () + CLOSE_GRACE_US);
  stop_listening (self);
  lock (self);
  discard_unexpected (self, g_get_monotonic_time () + NOTICE_GRACE_US);
  unlock (self);
  _cp_ucx_worker_free (self->worker);
  g_free (self->peers);
  g_ptr_array_unref (self->comms);
  g_clear_error (&self->broken);
  _cp_transport_clear (transport);
  g_free (self);
}

/* From the main context while no operation runs: lets UCX notice lost
 * peers (and report them), and this rank hear that the mesh broke,
 * without waiting for the next operation. */
static void
ucx_poll (CpTransport *transport)
{
  UcxTransport *self = (UcxTransport *) transport;

  if (!_cp_mutex_trylock (&self->worker->lock))
    return;
  /* UCX 1.13 looks at the keepalive clock once in 32 rounds of progress. */
  for (guint i = 0; i < 32; i++)
    ucp_worker_progress (self->worker->worker);
  read_notices (self);
  _cp_mutex_unlock (&self->worker->lock);
}

static void
ucx_fail (CpTransport  *transport,
          const char   *operation,
          const GError *failure)
{
  UcxTransport *self = (UcxTransport *) transport;

  lock (self);
  drain (self);
  read_notices (self);
  if (self->broken == NULL)
    set_broken (self, _cp_transport_describe_failure (transport->rank, operation, failure), 0, 0);
  unlock (self);
}

static const CpTransportOps ucx_ops = {
  .name = "ucx",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST),
  .transport_free = ucx_transport_free,
  .comm_new = ucx_comm_new,
  .comm_free = ucx_comm_free,
  .collective = ucx_collective,
  .isend = ucx_isend,
  .irecv = ucx_irecv,
  .wait = ucx_wait,
  .poll = ucx_poll,
  .fail = ucx_fail,
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

/* Every peer's address is checked against the layout of UCX 1.13
 * (cp-ucx-address.c); a UCX whose own addresses do not follow it cannot
 * tell good addresses from bad, and is refused at once. */
static gboolean
check_own_address (GBytes  *address,
                   GError **error)
{
  g_autoptr(GError) parse_error = NULL;
  g_autoptr(GArray) entries = _cp_ucx_address_parse (g_bytes_get_data (address, NULL),
                                                     g_bytes_get_size (address), &parse_error);
  unsigned major = 0, minor = 0, release = 0;

  if (entries != NULL)
    return TRUE;
  ucp_get_version (&major, &minor, &release);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
               "UCX %u.%u.%u packs worker addresses this library cannot check before UCX reads a "
               "peer's (it knows the layout of UCX 1.13): its own is %s", major, minor, release,
               parse_error->message);
  return FALSE;
}

/* The worker, confined to what reaches the other ranks, and its address. */
static CpUcxWorker *
start_worker (const CpMeshConfig      *config,
              const CpBootstrapRoute  *route,
              GBytes                 **address,
              GError                 **error)
{
  CpUcxWorker *worker = _cp_ucx_worker_new (keepalive_interval_ms (config->timeout_ms), route, error);

  if (worker != NULL &&
      ((*address = _cp_ucx_worker_dup_address (worker, error)) == NULL || !check_own_address (*address, error)))
    {
      g_clear_pointer (address, g_bytes_unref);
      g_clear_pointer (&worker, _cp_ucx_worker_free);
    }
  return worker;
}

/* What this rank's offer started, for finish or abandon. */
typedef struct
{
  CpUcxWorker *worker;
  GBytes *address;
} UcxOffer;

static void
ucx_abandon (gpointer state)
{
  UcxOffer *offer = state;

  _cp_ucx_worker_free (offer->worker);
  g_bytes_unref (offer->address);
  g_free (offer);
}

static gboolean
ucx_probe (const CpMeshConfig  *config,
           GError             **error)
{
  return _cp_ucx_worker_probe (error);
}

/* The worker, confined to what reaches the other ranks: its address is
 * this rank's blob. */
static GBytes *
ucx_offer (const CpMeshConfig      *config,
           const CpBootstrapRoute  *route,
           gpointer                *state,
           GError                 **error)
{
  UcxOffer *offer = g_new0 (UcxOffer, 1);

  offer->worker = start_worker (config, route, &offer->address, error);
  if (offer->worker == NULL)
    {
      g_free (offer);
      return NULL;
    }
  *state = offer;
  return g_bytes_ref (offer->address);
}

/* The bootstrap's check of every other rank's worker address. */
static gboolean
ucx_check (GBytes    *address,
           gpointer   state,
           GError   **error)
{
  UcxOffer *offer = state;

  return _cp_ucx_address_check (address, offer->address, error);
}

/* Ranks meet through the transport-neutral bootstrap (cp-bootstrap.c),
 * which hands every rank the worker addresses of all: UCX never listens
 * for strangers, and nothing reaches it before the token was proved. */
static CpTransport *
ucx_finish (const CpMeshConfig  *config,
            gpointer             state,
            GBytes * const      *addresses,
            gint64               deadline,
            GCancellable        *cancellable,
            GError             **error)
{
  UcxOffer *offer = state;
  UcxTransport *self = transport_new (config, g_steal_pointer (&offer->worker));

  ucx_abandon (offer);
  if (connect_peers (self, addresses, error) && check_connections (self, deadline, cancellable, error))
    return &self->parent;
  _cp_transport_unref (&self->parent);
  return NULL;
}

/* Spans hosts: the default chain's backend for ranks that do not share
 * one. */
const CpTransportBackend _cp_transport_ucx_backend = {
  .name = "ucx",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST),
  .priority = 50,
  .summary = "processes, on one host or several",
  .probe = ucx_probe,
  .offer = ucx_offer,
  .check = ucx_check,
  .finish = ucx_finish,
  .abandon = ucx_abandon,
};
