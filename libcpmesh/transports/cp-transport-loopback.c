/* cp-transport-loopback.c: a backend for tests only, over socketpairs
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib-unix.h>

#include "cp-error.h"
#include "cp-mesh-config-private.h"
#include "cp-transport-private.h"

/* The ranks are threads of one process, like the local backend's, but
 * every byte crosses a socketpair, as it would a network: the backend
 * exists to prove that a transport is a source file plus one line of the
 * backend table, and to run the mesh over something that is neither
 * shared memory nor UCX.  It is built only into the test variant of the
 * library.
 *
 * Ranks meet in a process-wide table keyed by the config's port: the
 * first to arrive makes a socketpair for every pair of ranks, each takes
 * its ends, and the last one in removes the entry.  Every message is a
 * header (communicator, tag, length, the description of a point-to-point
 * message) and a payload; a rank reads whatever arrives from any peer
 * into a queue and matches receives against it by communicator and tag,
 * so messages of different communicators never mix.  A collective sends
 * this rank's descriptor to every peer, checks that all agree, then
 * moves its bytes as point-to-point messages.
 *
 * Kept simple on purpose: a failure fails only the rank that sees it (no
 * shared first failure), and a receive that does not match what was sent
 * fails on the receiving side only. */

#define LOOPBACK_COLLECTIVE_TAG (G_GUINT64_CONSTANT (1) << 63)
#define LOOPBACK_MAX_MESSAGE_TEXT 512

typedef struct
{
  guint32 comm;
  guint64 tag;
  guint64 nbytes;
  CpMessage message;    /* dtype and shape; its region names nothing here */
} Header;

/* A descriptor as it crosses the wire: the error of a rank with bad
 * arguments travels as its domain, code and text. */
typedef struct
{
  CpCollective coll;
  gboolean invalid;
  int code;
  char domain[64];
  char text[LOOPBACK_MAX_MESSAGE_TEXT];
} WireDescriptor;

typedef struct
{
  Header header;
  guint8 *payload;
} Arrival;

typedef struct
{
  int fd;
  /* Reading: the header, then its payload. */
  Header head;
  gsize head_done;
  Arrival *reading;
  gsize payload_done;
  GQueue arrived;     /* Arrival*, oldest first */
  GQueue sending;     /* CpRequest*, oldest first */
} Peer;

struct _CpRequest
{
  gboolean is_send;
  int peer;           /* world rank */
  Header header;
  const guint8 *send_data;
  gsize sent;
  CpMessage *expected;
  guint8 *recv_data;  /* where a receive's bytes go */
  gboolean done;
  GError *error;
};

typedef struct
{
  CpTransport parent;
  Peer *peers;        /* per world rank; fd -1 for this rank */
  gint sends;         /* point-to-point sends posted, for tests */
} LoopbackTransport;

typedef struct
{
  CpComm parent;
  guint32 id;
  guint64 calls;
} LoopbackComm;

/* ---- meeting ---- */

typedef struct
{
  int world_size;
  int joined;
  int *fds;           /* [i * world_size + j]: rank i's end towards j */
} Hub;

/* pthread locks, not GLib's: ThreadSanitizer sees through these. */
static CpMutex hubs_lock = CP_MUTEX_INIT;
static CpCond hubs_cond;
static pthread_once_t hubs_cond_once = PTHREAD_ONCE_INIT;

static void
init_hubs_cond (void)
{
  _cp_cond_init (&hubs_cond);
}
static GHashTable *hubs;  /* port → Hub* */

static Hub *
hub_new (int world_size)
{
  Hub *hub = g_new0 (Hub, 1);

  hub->world_size = world_size;
  hub->fds = g_new (int, (gsize) world_size * world_size);
  for (int i = 0; i < world_size; i++)
    for (int j = i; j < world_size; j++)
      {
        int pair[2] = { -1, -1 };

        if (i != j && socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
          g_error ("loopback: socketpair: %s", g_strerror (errno));
        hub->fds[i * world_size + j] = pair[0];
        hub->fds[j * world_size + i] = pair[1];
      }
  return hub;
}

static void
hub_free (Hub *hub)
{
  g_free (hub->fds);
  g_free (hub);
}

/* With the table locked: a rank that gave up closes its ends, so that
 * the ranks that came see it gone, and leaves none for a latecomer. */
static void
leave_hub (Hub  *hub,
           int   rank,
           Peer *peers)
{
  for (int j = 0; j < hub->world_size; j++)
    {
      if (peers[j].fd >= 0)
        close (peers[j].fd);
      peers[j].fd = -1;
      hub->fds[rank * hub->world_size + j] = -1;
    }
  hub->joined--;
}

/* Takes this rank's ends of the socketpairs once every rank has come. */
static gboolean
meet (const CpMeshConfig  *config,
      Peer                *peers,
      GError             **error)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) config->timeout_ms * G_TIME_SPAN_MILLISECOND;
  gpointer key = GUINT_TO_POINTER (config->port);
  Hub *hub;
  gboolean ok = TRUE;

  pthread_once (&hubs_cond_once, init_hubs_cond);
  _cp_mutex_lock (&hubs_lock);
  if (hubs == NULL)
    hubs = g_hash_table_new (NULL, NULL);
  hub = g_hash_table_lookup (hubs, key);
  if (hub == NULL)
    g_hash_table_insert (hubs, key, hub = hub_new (config->world_size));
  for (int j = 0; j < config->world_size; j++)
    peers[j].fd = hub->fds[config->rank * hub->world_size + j];
  if (++hub->joined == hub->world_size)
    {
      g_hash_table_remove (hubs, key);
      hub_free (hub);
      _cp_cond_broadcast (&hubs_cond);
    }
  else
    while (ok && g_hash_table_lookup (hubs, key) == hub)
      ok = _cp_cond_wait_until (&hubs_cond, &hubs_lock, deadline);
  if (!ok)
    leave_hub (hub, config->rank, peers);
  _cp_mutex_unlock (&hubs_lock);
  if (!ok)
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                 "rank %d of %d: not every loopback rank came within %u ms", config->rank,
                 config->world_size, config->timeout_ms);
  return ok;
}

/* ---- moving bytes ---- */

static void
request_finish (CpRequest *request,
                GError    *error)
{
  request->done = TRUE;
  request->error = error;
}

/* Completes the receive @request with @arrival, which it matched. */
static void
deliver (CpRequest *request,
         Arrival   *arrival,
         int        me)
{
  GError *error = NULL;

  if (!_cp_message_matches (&arrival->header.message, request->expected))
    _cp_message_set_mismatch (&error, &arrival->header.message, request->peer,
                              request->header.tag, me, request->expected);
  else
    memcpy (request->recv_data, arrival->payload, arrival->header.nbytes);
  request_finish (request, error);
  g_free (arrival->payload);
  g_free (arrival);
}

static gboolean
try_match (LoopbackTransport *self,
           CpRequest         *request)
{
  GQueue *arrived = &self->peers[request->peer].arrived;

  for (GList *l = arrived->head; l != NULL; l = l->next)
    {
      Arrival *arrival = l->data;

      if (arrival->header.comm == request->header.comm && arrival->header.tag == request->header.tag)
        {
          g_queue_delete_link (arrived, l);
          deliver (request, arrival, self->parent.rank);
          return TRUE;
        }
    }
  return FALSE;
}

static gboolean
peer_lost (GError     **error,
           int          rank,
           const char  *why)
{
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, "loopback: rank %d %s", rank, why);
  return FALSE;
}

/* Reads what @peer has sent, as far as it goes without blocking. */
static gboolean
read_from (Peer     *peer,
           int       rank,
           GError  **error)
{
  for (;;)
    {
      gboolean in_head = peer->reading == NULL;
      guint8 *into = in_head ? (guint8 *) &peer->head + peer->head_done
                             : peer->reading->payload + peer->payload_done;
      gsize want = in_head ? sizeof peer->head - peer->head_done
                           : peer->reading->header.nbytes - peer->payload_done;
      gssize got = want > 0 ? read (peer->fd, into, want) : 0;

      if (want > 0 && got == 0)
        return peer_lost (error, rank, "closed its end");
      if (got < 0)
        return errno == EAGAIN || errno == EINTR ? TRUE : peer_lost (error, rank, g_strerror (errno));
      if (in_head && (peer->head_done += got) == sizeof peer->head)
        {
          peer->reading = g_new0 (Arrival, 1);
          peer->reading->header = peer->head;
          peer->reading->payload = g_malloc (MAX (peer->head.nbytes, 1));
          peer->head_done = 0;
          peer->payload_done = 0;
        }
      else if (!in_head)
        peer->payload_done += got;
      if (peer->reading != NULL && peer->payload_done == peer->reading->header.nbytes)
        {
          g_queue_push_tail (&peer->arrived, g_steal_pointer (&peer->reading));
          continue;
        }
    }
}

/* Writes the oldest sends to @peer, as far as it goes without blocking. */
static gboolean
write_to (Peer     *peer,
          int       rank,
          GError  **error)
{
  CpRequest *request;

  while ((request = g_queue_peek_head (&peer->sending)) != NULL)
    {
      gsize total = sizeof request->header + request->header.nbytes;
      gboolean in_head = request->sent < sizeof request->header;
      const guint8 *from = in_head ? (const guint8 *) &request->header + request->sent
                                   : request->send_data + (request->sent - sizeof request->header);
      gsize want = in_head ? sizeof request->header - request->sent : total - request->sent;
      gssize put = write (peer->fd, from, want);

      if (put < 0)
        return errno == EAGAIN || errno == EINTR ? TRUE : peer_lost (error, rank, g_strerror (errno));
      if ((request->sent += put) == total)
        {
          g_queue_pop_head (&peer->sending);
          request_finish (request, NULL);
        }
    }
  return TRUE;
}

/* Waits at most until @deadline for any socket to be ready, then moves
 * what it can. */
static gboolean
progress (LoopbackTransport  *self,
          gint64              deadline,
          GError            **error)
{
  int n = self->parent.world_size;
  g_autofree GPollFD *fds = g_new0 (GPollFD, n);
  gint64 left = deadline - g_get_monotonic_time ();

  for (int r = 0; r < n; r++)
    {
      fds[r].fd = self->peers[r].fd;
      fds[r].events = G_IO_IN | (self->peers[r].sending.length > 0 ? G_IO_OUT : 0);
    }
  /* Short rounds, so that a cancellation is seen soon. */
  g_poll (fds, n, (int) CLAMP (left / 1000, 0, 50));
  for (int r = 0; r < n; r++)
    {
      if (fds[r].fd < 0)
        continue;
      if ((fds[r].revents & (G_IO_IN | G_IO_HUP | G_IO_ERR)) && !read_from (&self->peers[r], r, error))
        return FALSE;
      if ((fds[r].revents & G_IO_OUT) && !write_to (&self->peers[r], r, error))
        return FALSE;
    }
  return TRUE;
}

/* What a receiver checks of a message, and nothing else: the header goes
 * over the socket, so it must not carry the sender's unused shape entries
 * or its pointers. */
static void
describe_message (CpMessage       *described,
                  const CpMessage *message)
{
  described->dtype = message->dtype;
  described->n_dims = message->n_dims;
  for (guint d = 0; d < message->n_dims && d < CP_TENSOR_MAX_DIMS; d++)
    described->shape[d] = message->shape[d];
  described->nbytes = message->nbytes;
}

static CpRequest *
post_send (LoopbackComm    *comm,
           int              peer,
           guint64          tag,
           const CpMessage *message,
           gconstpointer    data,
           gsize            nbytes)
{
  LoopbackTransport *self = (LoopbackTransport *) comm->parent.transport;
  CpRequest *request = g_new0 (CpRequest, 1);

  request->is_send = TRUE;
  request->peer = comm->parent.members[peer];
  request->header.comm = comm->id;
  request->header.tag = tag;
  request->header.nbytes = nbytes;
  if (message != NULL)
    describe_message (&request->header.message, message);
  request->send_data = data;
  g_queue_push_tail (&self->peers[request->peer].sending, request);
  return request;
}

static CpRequest *
post_recv (LoopbackComm *comm,
           int           peer,
           guint64       tag,
           CpMessage    *expected,
           gpointer      data)
{
  CpRequest *request = g_new0 (CpRequest, 1);

  request->peer = comm->parent.members[peer];
  request->header.comm = comm->id;
  request->header.tag = tag;
  request->expected = expected;
  request->recv_data = data;
  return request;
}

static gboolean
wait_request (LoopbackTransport  *self,
              CpRequest          *request,
              gint64              deadline,
              GCancellable       *cancellable,
              GError            **error)
{
  gboolean ok = TRUE;

  while (ok && !request->done && !(!request->is_send && try_match (self, request)))
    {
      if (g_cancellable_is_cancelled (cancellable))
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_CANCELLED, "loopback: cancelled");
          ok = FALSE;
        }
      else if (g_get_monotonic_time () >= deadline)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                       "loopback: rank %d waited too long for rank %d", self->parent.rank,
                       request->peer);
          ok = FALSE;
        }
      else
        ok = progress (self, deadline, error);
    }
  if (ok && request->error != NULL)
    {
      g_propagate_error (error, g_steal_pointer (&request->error));
      ok = FALSE;
    }
  /* A send still queued keeps its request until written: never here, as
   * a failed wait breaks off the whole operation. */
  if (request->is_send && !request->done)
    g_queue_remove (&self->peers[request->peer].sending, request);
  g_clear_error (&request->error);
  g_free (request);
  return ok;
}

/* ---- collectives ---- */

static void
pack_descriptor (WireDescriptor     *wire,
                 const CpCollective *coll)
{
  memset (wire, 0, sizeof *wire);
  wire->coll = *coll;
  wire->coll.invalid = NULL;
  wire->coll.send = CP_REGION_NONE;
  wire->coll.recv = CP_REGION_NONE;
  if (coll->invalid == NULL)
    return;
  wire->invalid = TRUE;
  wire->code = coll->invalid->code;
  g_strlcpy (wire->domain, g_quark_to_string (coll->invalid->domain), sizeof wire->domain);
  g_strlcpy (wire->text, coll->invalid->message, sizeof wire->text);
}

static void
unpack_descriptor (CpCollective         *coll,
                   const WireDescriptor *wire)
{
  *coll = wire->coll;
  if (wire->invalid)
    coll->invalid = g_error_new_literal (g_quark_from_string (wire->domain), wire->code, wire->text);
}

/* Every member sends its descriptor to every other; all decide alike. */
static gboolean
agree (LoopbackComm  *comm,
       CpCollective  *coll,
       guint64        tag,
       gint64         deadline,
       GCancellable  *cancellable,
       GError       **error)
{
  LoopbackTransport *self = (LoopbackTransport *) comm->parent.transport;
  int n = comm->parent.size;
  int me = comm->parent.index;
  g_autofree WireDescriptor *wires = g_new0 (WireDescriptor, n);
  g_autofree CpCollective *descs = g_new0 (CpCollective, n);
  g_autofree const CpCollective **order = g_new0 (const CpCollective *, n);
  g_autofree CpRequest **requests = g_new0 (CpRequest *, 2 * n);
  CpMessage expected[1] = { { 0 } };
  g_autofree CpMessage *slots = g_new0 (CpMessage, n);
  gboolean ok = TRUE;

  pack_descriptor (&wires[me], coll);
  for (int r = 0; r < n; r++)
    {
      if (r == me)
        continue;
      slots[r] = expected[0];
      slots[r].nbytes = sizeof (WireDescriptor);
      requests[2 * r] = post_send (comm, r, tag, &slots[r], &wires[me], sizeof (WireDescriptor));
      requests[2 * r + 1] = post_recv (comm, r, tag, &slots[r], &wires[r]);
    }
  for (int i = 0; i < 2 * n; i++)
    if (requests[i] != NULL)
      ok = wait_request (self, requests[i], deadline, cancellable, ok ? error : NULL) && ok;
  if (!ok)
    return FALSE;
  for (int r = 0; r < n; r++)
    {
      if (r == me)
        descs[r] = *coll;
      else
        unpack_descriptor (&descs[r], &wires[r]);
      order[r] = &descs[r];
    }
  ok = _cp_collective_check_agreement (order, n, self->parent.rank, error);
  for (int r = 0; r < n; r++)
    if (r != me)
      g_clear_error (&descs[r].invalid);
  return ok;
}

/* Rows of @block bytes, @outer of them, @stride apart. */
static void
copy_rows (guint8       *dst,
           gsize         dst_stride,
           const guint8 *src,
           gsize         src_stride,
           gsize         block,
           gsize         outer)
{
  for (gsize o = 0; o < outer; o++)
    memcpy (dst + o * dst_stride, src + o * src_stride, block);
}

/* Exchanges one buffer with every peer: sends @out[r] (@nbytes) to rank
 * r and receives its buffer into @in[r]. */
static gboolean
exchange_all (LoopbackComm  *comm,
              guint64        tag,
              guint8       **out,
              guint8       **in,
              gsize          nbytes,
              gint64         deadline,
              GCancellable  *cancellable,
              GError       **error)
{
  LoopbackTransport *self = (LoopbackTransport *) comm->parent.transport;
  int n = comm->parent.size;
  g_autofree CpRequest **requests = g_new0 (CpRequest *, 2 * n);
  g_autofree CpMessage *slots = g_new0 (CpMessage, n);
  gboolean ok = TRUE;

  for (int r = 0; r < n; r++)
    {
      if (r == comm->parent.index)
        continue;
      slots[r].nbytes = nbytes;
      if (out[r] != NULL)
        requests[2 * r] = post_send (comm, r, tag, &slots[r], out[r], nbytes);
      if (in[r] != NULL)
        requests[2 * r + 1] = post_recv (comm, r, tag, &slots[r], in[r]);
    }
  for (int i = 0; i < 2 * n; i++)
    if (requests[i] != NULL)
      ok = wait_request (self, requests[i], deadline, cancellable, ok ? error : NULL) && ok;
  return ok;
}

static gboolean
move_bytes (LoopbackComm  *comm,
            CpCollective  *coll,
            guint64        tag,
            gint64         deadline,
            GCancellable  *cancellable,
            GError       **error)
{
  int n = comm->parent.size;
  int me = comm->parent.index;
  gsize piece = coll->outer * coll->block;
  gsize elem = coll->count > 0 ? cp_dtype_get_size (coll->dtype) : 0;
  gsize nbytes = coll->kind == CP_COLL_ALL_REDUCE || coll->kind == CP_COLL_BROADCAST
                 ? coll->count * elem : piece;
  g_autofree guint8 *scratch = g_malloc (MAX ((gsize) n * nbytes * 2, 1));
  g_autofree guint8 **out = g_new0 (guint8 *, n);
  g_autofree guint8 **in = g_new0 (guint8 *, n);
  g_autofree gconstpointer *srcs = g_new0 (gconstpointer, n);
  guint8 *recv = _cp_region_get_address (&coll->recv);
  const guint8 *send = _cp_region_get_address (&coll->send);

  for (int r = 0; r < n; r++)
    {
      guint8 *outbox = scratch + (gsize) r * nbytes;
      guint8 *inbox = scratch + (gsize) (n + r) * nbytes;

      switch (coll->kind)
        {
        case CP_COLL_ALL_GATHER:
          out[r] = (guint8 *) send;
          in[r] = inbox;
          break;
        case CP_COLL_ALL_TO_ALL:
          copy_rows (outbox, coll->block, send + r * coll->block,
                     n * coll->block, coll->block, coll->outer);
          out[r] = outbox;
          in[r] = inbox;
          break;
        case CP_COLL_ALL_REDUCE:
          out[r] = recv;
          in[r] = inbox;
          break;
        default: /* broadcast */
          out[r] = me == coll->root ? recv : NULL;
          in[r] = r == coll->root && me != coll->root ? recv : NULL;
          break;
        }
    }
  if (!exchange_all (comm, tag, out, in, nbytes, deadline, cancellable, error))
    return FALSE;
  for (int r = 0; r < n && coll->kind != CP_COLL_BROADCAST; r++)
    {
      const guint8 *from = r == me && coll->kind != CP_COLL_ALL_REDUCE ? out[r] : in[r];

      if (coll->kind == CP_COLL_ALL_REDUCE)
        srcs[r] = r == me ? memcpy (in[r], recv, nbytes) : in[r];
      else
        copy_rows (recv + r * coll->block, n * coll->block, from, coll->block, coll->block,
                   coll->outer);
    }
  if (coll->kind == CP_COLL_ALL_REDUCE)
    _cp_reduce_many (coll->dtype, coll->op, recv, srcs, n, 0, coll->count);
  return TRUE;
}

static gboolean
loopback_collective (CpComm        *comm,
                     CpCollective  *coll,
                     gint64         deadline,
                     GCancellable  *cancellable,
                     GError       **error)
{
  LoopbackComm *self = (LoopbackComm *) comm;
  guint64 tag = LOOPBACK_COLLECTIVE_TAG | (self->calls++ << 1);

  if (!agree (self, coll, tag, deadline, cancellable, error))
    return FALSE;
  if (coll->kind == CP_COLL_BARRIER)
    return TRUE;
  return move_bytes (self, coll, tag | 1, deadline, cancellable, error);
}

/* ---- point to point ---- */

static CpRequest *
loopback_isend (CpComm          *comm,
                int              peer,
                guint64          tag,
                const CpMessage *message)
{
  g_atomic_int_inc (&((LoopbackTransport *) comm->transport)->sends);
  return post_send ((LoopbackComm *) comm, peer, tag, message,
                    _cp_region_get_address (&message->data), message->nbytes);
}

static CpRequest *
loopback_irecv (CpComm    *comm,
                int        peer,
                guint64    tag,
                CpMessage *message)
{
  return post_recv ((LoopbackComm *) comm, peer, tag, message,
                    _cp_region_get_address (&message->data));
}

static gboolean
loopback_wait (CpComm        *comm,
               CpRequest     *request,
               gint64         deadline,
               GCancellable  *cancellable,
               GError       **error)
{
  return wait_request ((LoopbackTransport *) comm->transport, request, deadline, cancellable,
                       error);
}

/* ---- lifetime ---- */

static CpComm *
loopback_comm_new (CpTransport  *transport,
                   const char   *label,
                   const int    *members,
                   int           n_members,
                   int           my_index,
                   GError      **error)
{
  LoopbackComm *self = g_new0 (LoopbackComm, 1);
  g_autofree char *key = _cp_comm_key (label, members, n_members);

  _cp_comm_init (&self->parent, transport, members, n_members, my_index);
  self->id = g_str_hash (key);
  return &self->parent;
}

static void
loopback_comm_free (CpComm *comm)
{
  _cp_comm_clear (comm);
  g_free (comm);
}

static void
loopback_transport_free (CpTransport *transport)
{
  LoopbackTransport *self = (LoopbackTransport *) transport;

  for (int r = 0; r < transport->world_size; r++)
    {
      Peer *peer = &self->peers[r];
      Arrival *arrival;

      if (peer->fd >= 0)
        close (peer->fd);
      while ((arrival = g_queue_pop_head (&peer->arrived)) != NULL)
        {
          g_free (arrival->payload);
          g_free (arrival);
        }
      if (peer->reading != NULL)
        g_free (peer->reading->payload);
      g_free (peer->reading);
    }
  g_free (self->peers);
  _cp_transport_clear (transport);
  g_free (self);
}

static void
loopback_fail (CpTransport  *transport,
               const char   *operation,
               const GError *failure)
{
}

static const CpTransportOps loopback_ops;

guint
_cp_transport_loopback_count_sends (CpTransport *transport)
{
  g_return_val_if_fail (transport->ops == &loopback_ops, 0);

  return (guint) g_atomic_int_get (&((LoopbackTransport *) transport)->sends);
}

static const CpTransportOps loopback_ops = {
  .name = "loopback",
  .device_kinds = CP_TRANSPORT_DEVICE (CP_DEVICE_KIND_HOST),
  .caps = CP_TRANSPORT_CAP_SHARED_ADDRESS_SPACE,
  .transport_free = loopback_transport_free,
  .comm_new = loopback_comm_new,
  .comm_free = loopback_comm_free,
  .collective = loopback_collective,
  .isend = loopback_isend,
  .irecv = loopback_irecv,
  .wait = loopback_wait,
  .fail = loopback_fail,
};

CpTransport *
_cp_transport_loopback_connect (const CpMeshConfig  *config,
                                GCancellable        *cancellable,
                                GError             **error)
{
  LoopbackTransport *self = g_new0 (LoopbackTransport, 1);

  _cp_transport_init (&self->parent, &loopback_ops, config->rank, config->world_size);
  self->peers = g_new0 (Peer, config->world_size);
  if (!meet (config, self->peers, error))
    {
      _cp_transport_unref (&self->parent);
      return NULL;
    }
  for (int r = 0; r < config->world_size; r++)
    if (self->peers[r].fd >= 0 && !g_unix_set_fd_nonblocking (self->peers[r].fd, TRUE, error))
      {
        _cp_transport_unref (&self->parent);
        return NULL;
      }
  return &self->parent;
}
