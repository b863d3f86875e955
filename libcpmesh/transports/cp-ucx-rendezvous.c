/* cp-ucx-rendezvous.c: ranks find and authenticate each other
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <netdb.h>
#include <string.h>

#include <gio/gio.h>

#include "cp-error.h"
#include "cp-fault-private.h"
#include "cp-ucx-private.h"

/* Rank 0 listens with UCP's listener, on an ephemeral port that the gate
 * on the rendezvous port tells token holders (cp-ucx-gate.c).  For each
 * connection it sends a fresh random challenge; the joiner answers with
 * its rank, world size, mesh shape, version, worker address and an
 * HMAC-SHA256 keyed with the shared token over both nonces, its rank and
 * world size, so the token never crosses the wire and an answer cannot be
 * replayed on another connection.  Rank 0 answers with a verdict — an
 * error the joiner reports as its own, or an HMAC proving rank 0 holds the
 * token too — and keeps listening.  Once every rank joined, it sends each
 * the table of all worker addresses.
 *
 * Messages are UCP active messages carrying a serialized GVariant, packed
 * and parsed in cp-ucx-wire.c; a message of the wrong type or size is
 * refused like any other bad answer, so garbage never reaches past the
 * parser. */

/* UCP keeps a table of handlers indexed by id: keep it small. */
#define AM_ID 7
#define NONCE_SIZE CP_UCX_NONCE_SIZE
#define MAC_SIZE CP_UCX_MAC_SIZE
#define MAX_MESSAGE_BYTES (64 << 20)

typedef enum
{
  MSG_CHALLENGE = 1,
  MSG_HELLO,
  MSG_VERDICT,
  MSG_TABLE,
} MessageKind;


typedef struct
{
  ucp_ep_h from;     /* the sender's endpoint when it asked for replies */
  guint32 kind;
  GBytes *payload;
} Message;

/* A send in flight: UCX may read its header and payload until done. */
typedef struct
{
  void *request;
  guint32 header;
  GBytes *payload;
} PendingSend;

typedef enum { CHALLENGED, JOINED, REJECTED } JoinerState;

typedef struct
{
  CpUcxEndpoint *endpoint;
  guint8 nonce[NONCE_SIZE];
  JoinerState state;
  char *peer;        /* where it connected from, for messages */
} Joiner;

struct _CpUcxRendezvous
{
  CpUcxWorker *worker;
  const CpMeshConfig *config;   /* only while running */
  char *where;                  /* "host:port" of rank 0 */
  int world_size;
  GQueue inbox;                 /* Message* */
  GPtrArray *pending;           /* PendingSend* */
  GBytes **addresses;           /* one per rank */

  /* Rank 0. */
  CpUcxGate *gate;
  ucp_listener_h listener;
  GQueue conn_requests;         /* ucp_conn_request_h */
  GPtrArray *joiners;           /* Joiner* */
  int n_joined;

  /* Every other rank. */
  CpUcxEndpoint *server;
  guint8 nonce[NONCE_SIZE];
  guint8 server_nonce[NONCE_SIZE];
};

static void
message_free (Message *message)
{
  g_bytes_unref (message->payload);
  g_free (message);
}

static void
pending_send_free (PendingSend *pending)
{
  g_bytes_unref (pending->payload);
  g_free (pending);
}

static void
joiner_free (Joiner *joiner)
{
  g_free (joiner->peer);
  g_free (joiner);
}

/* Runs inside worker progress, with the lock held: queue, parse later. */
static ucs_status_t
on_message (void                       *arg,
            const void                 *header,
            size_t                      header_length,
            void                       *data,
            size_t                      length,
            const ucp_am_recv_param_t  *param)
{
  CpUcxRendezvous *self = arg;
  Message *message;

  if (header_length != sizeof (guint32) || length > MAX_MESSAGE_BYTES ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
    return UCS_OK;
  message = g_new0 (Message, 1);
  memcpy (&message->kind, header, sizeof message->kind);
  message->payload = g_bytes_new (data, length);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
    message->from = param->reply_ep;
  g_queue_push_tail (&self->inbox, message);
  return UCS_OK;
}

static gboolean
set_message_handler (CpUcxRendezvous  *self,
                     gboolean          on,
                     GError          **error)
{
  ucp_am_handler_param_t param = {
    .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG,
    .id = AM_ID,
    .cb = on ? on_message : NULL,
    .arg = self,
  };
  ucs_status_t status = ucp_worker_set_am_recv_handler (self->worker->worker, &param);

  if (status == UCS_OK)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "UCX could not register the rendezvous handler: %s", ucs_status_string (status));
  return FALSE;
}

/* With the lock held.  Takes @payload. */
static gboolean
send_message (CpUcxRendezvous  *self,
              CpUcxEndpoint    *to,
              MessageKind       kind,
              GBytes           *payload,
              GError          **error)
{
  ucp_request_param_t param = {
    .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
    .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
  };
  PendingSend *pending = g_new0 (PendingSend, 1);
  gsize size;
  gconstpointer data;
  ucs_status_ptr_t request;

  pending->header = kind;
  pending->payload = payload;
  data = g_bytes_get_data (pending->payload, &size);
  request = ucp_am_send_nbx (to->ep, AM_ID, &pending->header, sizeof pending->header, data, size, &param);
  if (UCS_PTR_IS_ERR (request))
    {
      pending_send_free (pending);
      g_set_error (error, CP_MESH_ERROR, _cp_ucx_error_code (UCS_PTR_STATUS (request)),
                   "rendezvous with %s: sending failed: %s", self->where,
                   ucs_status_string (UCS_PTR_STATUS (request)));
      return FALSE;
    }
  pending->request = request;
  g_ptr_array_add (self->pending, pending);
  return TRUE;
}

/* With the lock held: forgets the sends UCX is done with.  When
 * @abandon, a send still in flight is released to UCX and kept alive by
 * the worker, which may still read it. */
static void
reap_sends (CpUcxRendezvous *self,
            gboolean         abandon)
{
  for (guint i = self->pending->len; i-- > 0;)
    {
      PendingSend *pending = g_ptr_array_index (self->pending, i);
      gboolean done = pending->request == NULL ||
                      ucp_request_check_status (pending->request) != UCS_INPROGRESS;

      if (!done && !abandon)
        continue;
      g_clear_pointer (&pending->request, ucp_request_free);
      g_ptr_array_remove_index_fast (self->pending, i);
      if (done)
        pending_send_free (pending);
      else
        _cp_ucx_worker_retain (self->worker, pending, (GDestroyNotify) pending_send_free);
    }
}

static GSocketAddress *
resolve (const CpMeshConfig  *config,
         GError             **error)
{
  struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_NUMERICSERV };
  struct addrinfo *found = NULL;
  g_autofree char *port = g_strdup_printf ("%u", config->port);
  int status = getaddrinfo (config->address, port, &hints, &found);
  GSocketAddress *address;

  if (status != 0 || found == NULL)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "rendezvous address \"%s\" does not resolve: %s", config->address,
                   gai_strerror (status));
      return NULL;
    }
  address = g_socket_address_new_from_native (found->ai_addr, found->ai_addrlen);
  freeaddrinfo (found);
  return address;
}

/* @address with another port. */
static GSocketAddress *
with_port (GSocketAddress *address,
           guint16         port)
{
  return g_inet_socket_address_new (g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (address)), port);
}

static gboolean
to_native (GSocketAddress           *address,
           struct sockaddr_storage  *native,
           socklen_t                *length)
{
  *length = (socklen_t) g_socket_address_get_native_size (address);
  return g_socket_address_to_native (address, native, sizeof *native, NULL);
}

static gboolean
check_waiting (CpUcxRendezvous  *self,
               gint64            deadline,
               GCancellable     *cancellable,
               const char       *what,
               GError          **error)
{
  if (g_cancellable_set_error_if_cancelled (cancellable, error))
    return FALSE;
  if (g_get_monotonic_time () < deadline)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
               "rank %d: %s within %u ms (rendezvous at %s)", self->config->rank, what,
               self->config->timeout_ms, self->where);
  return FALSE;
}

/* ---- rank 0 ---- */

static void
on_conn_request (ucp_conn_request_h  request,
                 void               *arg)
{
  CpUcxRendezvous *self = arg;

  g_queue_push_tail (&self->conn_requests, request);
}

static guint16
listener_port (ucp_listener_h listener)
{
  ucp_listener_attr_t attr = { .field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR };
  g_autoptr(GSocketAddress) address = NULL;

  if (ucp_listener_query (listener, &attr) != UCS_OK)
    return 0;
  address = g_socket_address_new_from_native (&attr.sockaddr, sizeof attr.sockaddr);
  return G_IS_INET_SOCKET_ADDRESS (address) ? g_inet_socket_address_get_port (G_INET_SOCKET_ADDRESS (address)) : 0;
}

/* The UCX listener takes any free port; the gate, the one users gave.
 * The gate binds first: a port picked free for MASTER_PORT (as launchers
 * do) is free again until then, and the listener's ephemeral port could
 * otherwise be that very port. */
static gboolean
start_listening (CpUcxRendezvous  *self,
                 GError          **error)
{
  g_autoptr(GSocketAddress) address = resolve (self->config, error);
  g_autoptr(GSocketAddress) ephemeral = address ? with_port (address, 0) : NULL;
  struct sockaddr_storage native;
  ucp_listener_params_t params = {
    .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
    .conn_handler = { on_conn_request, self },
  };
  ucs_status_t status = UCS_ERR_INVALID_ADDR;
  g_autoptr(GError) gate_error = NULL;

  if (address == NULL)
    return FALSE;
  self->gate = _cp_ucx_gate_new (address, self->config->token, &gate_error);
  if (self->gate != NULL)
    {
      _cp_mutex_lock (&self->worker->lock);
      params.sockaddr.addr = (const struct sockaddr *) &native;
      if (to_native (ephemeral, &native, &params.sockaddr.addrlen))
        status = ucp_listener_create (self->worker->worker, &params, &self->listener);
      _cp_mutex_unlock (&self->worker->lock);
    }
  if (status == UCS_OK)
    {
      _cp_ucx_gate_open (self->gate, listener_port (self->listener));
      return TRUE;
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "rank 0 cannot listen on %s (MASTER_ADDR, MASTER_PORT): %s", self->where,
               gate_error ? gate_error->message : ucs_status_string (status));
  return FALSE;
}

static char *
describe_client (ucp_conn_request_h request)
{
  ucp_conn_request_attr_t attr = { .field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR };
  g_autoptr(GSocketAddress) address = NULL;
  g_autofree char *host = NULL;

  if (ucp_conn_request_query (request, &attr) != UCS_OK)
    return g_strdup ("an unknown address");
  address = g_socket_address_new_from_native (&attr.client_address, sizeof attr.client_address);
  if (!G_IS_INET_SOCKET_ADDRESS (address))
    return g_strdup ("an unknown address");
  host = g_inet_address_to_string (g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (address)));
  return g_strdup_printf ("%s:%u", host, g_inet_socket_address_get_port (G_INET_SOCKET_ADDRESS (address)));
}

/* With the lock held: every new connection gets a challenge. */
static void
accept_connections (CpUcxRendezvous *self)
{
  ucp_conn_request_h request;

  while ((request = g_queue_pop_head (&self->conn_requests)) != NULL)
    {
      g_autoptr(GError) error = NULL;
      Joiner *joiner = g_new0 (Joiner, 1);

      joiner->peer = describe_client (request);
      joiner->endpoint = _cp_ucx_accept (self->worker, request, &error);
      if (joiner->endpoint == NULL || !_cp_ucx_fill_nonce (joiner->nonce, &error) ||
          !send_message (self, joiner->endpoint, MSG_CHALLENGE, _cp_ucx_pack_challenge (joiner->nonce),
                         &error))
        {
          /* A request UCX could not turn into an endpoint is already
           * released (or, for garbage, leaked) by UCX itself. */
          g_debug ("rendezvous: dropping the connection from %s: %s", joiner->peer, error->message);
          joiner->state = REJECTED;
        }
      g_ptr_array_add (self->joiners, joiner);
    }
}

static Joiner *
find_joiner (CpUcxRendezvous *self,
             ucp_ep_h         ep)
{
  for (guint i = 0; i < self->joiners->len; i++)
    {
      Joiner *joiner = g_ptr_array_index (self->joiners, i);

      if (joiner->endpoint != NULL && joiner->endpoint->ep == ep && ep != NULL)
        return joiner;
    }
  return NULL;
}

/* With the lock held: the verdict that lets @joiner in. */
static GBytes *
accept_hello (CpUcxRendezvous  *self,
              Joiner           *joiner,
              CpUcxHello       *hello)
{
  guint8 mac[MAC_SIZE];

  _cp_ucx_hello_mac (self->config->token, "cpmesh accept", hello->nonce, joiner->nonce,
                     hello->rank, self->config->world_size, mac);
  self->addresses[hello->rank] = g_bytes_ref (hello->address);
  joiner->state = JOINED;
  self->n_joined++;
  return _cp_ucx_pack_verdict (CP_UCX_ACCEPTED, "", mac);
}

/* With the lock held: rank 0's decision on a HELLO, or why not. */
static int
judge (CpUcxRendezvous  *self,
       Joiner           *joiner,
       Message          *message,
       CpUcxHello      **hello,
       char            **why)
{
  g_autoptr(GError) malformed = NULL;
  g_autofree gboolean *joined = g_new0 (gboolean, self->config->world_size);

  *hello = _cp_ucx_parse_hello (message->payload, &malformed);
  if (*hello == NULL)
    {
      *why = g_strdup (malformed->message);
      return malformed->code;
    }
  for (int r = 0; r < self->config->world_size; r++)
    joined[r] = self->addresses[r] != NULL;
  return _cp_ucx_judge_hello (*hello, self->config, joiner->nonce, joined, why);
}

/* With the lock held: answers one HELLO. */
static void
answer_hello (CpUcxRendezvous *self,
              Joiner          *joiner,
              Message         *message)
{
  g_autoptr(CpUcxHello) hello = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree char *why = NULL;
  GBytes *verdict;
  int code = judge (self, joiner, message, &hello, &why);

  if (code == CP_UCX_ACCEPTED)
    verdict = accept_hello (self, joiner, hello);
  else
    {
      g_autofree char *text = NULL;

      text = g_strdup_printf ("rank 0 rejected the process claiming rank %d from %s: %s",
                              hello != NULL ? hello->rank : -1, joiner->peer, why);
      g_debug ("rendezvous: %s", text);
      joiner->state = REJECTED;
      verdict = _cp_ucx_pack_verdict (code, text, NULL);
    }
  if (!send_message (self, joiner->endpoint, MSG_VERDICT, verdict, &error))
    g_debug ("rendezvous: %s", error->message);
}

static void
handle_inbox (CpUcxRendezvous *self)
{
  Message *message;

  while ((message = g_queue_pop_head (&self->inbox)) != NULL)
    {
      Joiner *joiner = find_joiner (self, message->from);

      if (joiner != NULL && joiner->state == CHALLENGED && message->kind == MSG_HELLO)
        answer_hello (self, joiner, message);
      message_free (message);
    }
}

/* "ranks 1, 3 never joined" */
static char *
describe_missing (CpUcxRendezvous *self)
{
  GString *text = g_string_new ("ranks ");

  for (int r = 1; r < self->config->world_size; r++)
    if (self->addresses[r] == NULL)
      g_string_append_printf (text, "%d, ", r);
  g_string_truncate (text, text->len - 2);
  g_string_append (text, " never joined");
  return g_string_free (text, FALSE);
}

static gboolean
wait_for_ranks (CpUcxRendezvous  *self,
                gint64            deadline,
                GCancellable     *cancellable,
                GError          **error)
{
  guint idle = 0;

  while (self->n_joined < self->config->world_size - 1)
    {
      g_autofree char *missing = NULL;

      if (_cp_ucx_worker_progress (self->worker) > 0)
        idle = 0;
      _cp_ucx_gate_serve (self->gate);
      _cp_mutex_lock (&self->worker->lock);
      accept_connections (self);
      handle_inbox (self);
      reap_sends (self, FALSE);
      _cp_mutex_unlock (&self->worker->lock);
      if (self->n_joined == self->config->world_size - 1)
        break;
      missing = describe_missing (self);
      if (!check_waiting (self, deadline, cancellable, missing, error))
        return FALSE;
      _cp_ucx_idle (&idle);
    }
  return TRUE;
}

static gboolean
send_tables (CpUcxRendezvous  *self,
             GError          **error)
{
  g_autoptr(GBytes) table = _cp_ucx_pack_table (self->addresses, self->config->world_size);
  gboolean ok = TRUE;

  _cp_mutex_lock (&self->worker->lock);
  for (guint i = 0; ok && i < self->joiners->len; i++)
    {
      Joiner *joiner = g_ptr_array_index (self->joiners, i);

      if (joiner->state == JOINED)
        ok = send_message (self, joiner->endpoint, MSG_TABLE, g_bytes_ref (table), error);
    }
  _cp_mutex_unlock (&self->worker->lock);
  return ok;
}

static gboolean
serve (CpUcxRendezvous  *self,
       gint64            deadline,
       GCancellable     *cancellable,
       GError          **error)
{
  self->joiners = g_ptr_array_new_with_free_func ((GDestroyNotify) joiner_free);
  return start_listening (self, error) && wait_for_ranks (self, deadline, cancellable, error) &&
         send_tables (self, error);
}

/* ---- every other rank ---- */

/* Waits for a message of @kind from rank 0. */
static Message *
wait_for (CpUcxRendezvous  *self,
          MessageKind       kind,
          gint64            deadline,
          GCancellable     *cancellable,
          GError          **error)
{
  guint idle = 0;

  for (;;)
    {
      Message *message;
      ucs_status_t failure;

      if (_cp_ucx_worker_progress (self->worker) > 0)
        idle = 0;
      _cp_mutex_lock (&self->worker->lock);
      while ((message = g_queue_pop_head (&self->inbox)) != NULL && message->kind != kind)
        message_free (message);
      reap_sends (self, FALSE);
      failure = self->server->failure;
      _cp_mutex_unlock (&self->worker->lock);
      if (message != NULL)
        return message;
      if (failure != UCS_OK)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                       "rank %d: the connection to rank 0 at %s failed: %s", self->config->rank,
                       self->where, ucs_status_string (failure));
          return NULL;
        }
      if (!check_waiting (self, deadline, cancellable, "rank 0 did not answer", error))
        return NULL;
      _cp_ucx_idle (&idle);
    }
}

/* Asks the gate where rank 0's UCX listener is and connects there. */
static gboolean
connect_to_server (CpUcxRendezvous  *self,
                   gint64            deadline,
                   GCancellable     *cancellable,
                   GError          **error)
{
  g_autoptr(GSocketAddress) address = resolve (self->config, error);
  g_autoptr(GSocketAddress) listener = NULL;
  struct sockaddr_storage native;
  socklen_t length;
  guint16 port = 0;

  if (address == NULL ||
      !_cp_ucx_gate_pass (address, self->config->token, self->where, deadline, cancellable, &port, error))
    return FALSE;
  listener = with_port (address, port);
  if (!to_native (listener, &native, &length))
    return FALSE;
  _cp_mutex_lock (&self->worker->lock);
  self->server = _cp_ucx_connect_sockaddr (self->worker, (struct sockaddr *) &native, length, error);
  _cp_mutex_unlock (&self->worker->lock);
  return self->server != NULL;
}

/* With the lock held: sends @hello as an injected fault (cp-fault-private.h)
 * leaves it, in the test variant of the library. */
static gboolean
send_hello_as (CpUcxRendezvous   *self,
               const CpUcxHello  *hello,
               GError           **error)
{
  g_autoptr(GBytes) payload = _cp_ucx_pack_hello (hello);
  guint delay_ms = 0;

  switch (_cp_fault_strike ("ucx", hello->rank, 0, CP_FAULT_STEP_HELLO, &delay_ms))
    {
    case CP_FAULT_DROP:
      return TRUE;
    case CP_FAULT_TRUNCATE:
      {
        g_autoptr(GBytes) whole = g_steal_pointer (&payload);

        payload = g_bytes_new_from_bytes (whole, 0, g_bytes_get_size (whole) / 2);
      }
      break;
    case CP_FAULT_KILL:
      _cp_fault_kill_process ();
      break;
    case CP_FAULT_DELAY:
      g_usleep ((gulong) delay_ms * G_TIME_SPAN_MILLISECOND);
      break;
    default:
      break;
    }
  return send_message (self, self->server, MSG_HELLO, g_steal_pointer (&payload), error);
}

static gboolean
send_hello (CpUcxRendezvous  *self,
            Message          *challenge,
            GBytes           *my_address,
            GError          **error)
{
  const CpMeshConfig *config = self->config;
  g_autoptr(GError) malformed = NULL;
  CpUcxHello hello = {
    .protocol = CP_UCX_PROTOCOL_VERSION,
    .version = (char *) PACKAGE_VERSION,
    .rank = config->rank,
    .world_size = config->world_size,
    .dim_names = config->dim_names,
    .dim_sizes = (gint32 *) config->dim_sizes,
    .n_dims = config->n_dims,
    .address = my_address,
  };
  gboolean ok;

  if (!_cp_ucx_parse_challenge (challenge->payload, self->server_nonce, &malformed))
    {
      g_set_error (error, CP_MESH_ERROR, malformed->code == CP_MESH_ERROR_UNSUPPORTED ? malformed->code : CP_MESH_ERROR_AUTH,
                   "rank %d: %s sent no valid challenge (%s); it is not a libcpmesh rank 0 of "
                   "this version", config->rank, self->where, malformed->message);
      return FALSE;
    }
  if (!_cp_ucx_fill_nonce (self->nonce, error))
    return FALSE;
  memcpy (hello.nonce, self->nonce, NONCE_SIZE);
  _cp_ucx_hello_mac (config->token, "cpmesh join", self->server_nonce, self->nonce, config->rank,
                     config->world_size, hello.mac);
  _cp_mutex_lock (&self->worker->lock);
  ok = send_hello_as (self, &hello, error);
  _cp_mutex_unlock (&self->worker->lock);
  return ok;
}

static gboolean
read_verdict (CpUcxRendezvous  *self,
              Message          *message,
              GError          **error)
{
  const CpMeshConfig *config = self->config;
  g_autoptr(GError) malformed = NULL;
  g_autofree char *why = NULL;
  guint8 mac[MAC_SIZE];
  guint8 expected[MAC_SIZE];
  int code = 0;

  if (!_cp_ucx_parse_verdict (message->payload, &code, &why, mac, &malformed))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, "rank %d: rank 0 at %s sent %s",
                   config->rank, self->where, malformed->message);
      return FALSE;
    }
  if (code != CP_UCX_ACCEPTED)
    {
      g_set_error_literal (error, CP_MESH_ERROR, code, why);
      return FALSE;
    }
  _cp_ucx_hello_mac (config->token, "cpmesh accept", self->nonce, self->server_nonce, config->rank,
                     config->world_size, expected);
  if (_cp_ucx_mac_equal (expected, mac))
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_AUTH,
               "rank %d: the process listening at %s did not prove it holds the mesh token "
               "(CPMESH_TOKEN)", config->rank, self->where);
  return FALSE;
}

static gboolean
read_table (CpUcxRendezvous  *self,
            Message          *message,
            GError          **error)
{
  g_autoptr(GError) malformed = NULL;
  g_autoptr(GPtrArray) addresses = _cp_ucx_parse_table (message->payload, self->config->world_size,
                                                        &malformed);

  if (addresses == NULL)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, "rank %d: %s", self->config->rank,
                   malformed->message);
      return FALSE;
    }
  for (int r = 0; r < self->config->world_size; r++)
    self->addresses[r] = g_bytes_ref (g_ptr_array_index (addresses, r));
  return TRUE;
}

static gboolean
join (CpUcxRendezvous  *self,
      GBytes           *my_address,
      gint64            deadline,
      GCancellable     *cancellable,
      GError          **error)
{
  Message *message = NULL;
  gboolean ok;

  if (!connect_to_server (self, deadline, cancellable, error) ||
      (message = wait_for (self, MSG_CHALLENGE, deadline, cancellable, error)) == NULL)
    return FALSE;
  ok = send_hello (self, message, my_address, error);
  message_free (message);
  if (!ok || (message = wait_for (self, MSG_VERDICT, deadline, cancellable, error)) == NULL)
    return FALSE;
  ok = read_verdict (self, message, error);
  message_free (message);
  if (!ok || (message = wait_for (self, MSG_TABLE, deadline, cancellable, error)) == NULL)
    return FALSE;
  ok = read_table (self, message, error);
  message_free (message);
  return ok;
}

CpUcxRendezvous *
_cp_ucx_rendezvous_run (CpUcxWorker         *worker,
                        const CpMeshConfig  *config,
                        GBytes              *my_address,
                        gint64               deadline,
                        GCancellable        *cancellable,
                        GError             **error)
{
  CpUcxRendezvous *self = g_new0 (CpUcxRendezvous, 1);
  gboolean ok;

  self->worker = worker;
  self->config = config;
  self->where = g_strdup_printf (strchr (config->address, ':') ? "[%s]:%u" : "%s:%u",
                                 config->address, config->port);
  self->pending = g_ptr_array_new ();
  self->world_size = config->world_size;
  self->addresses = g_new0 (GBytes *, config->world_size);
  _cp_mutex_lock (&worker->lock);
  ok = set_message_handler (self, TRUE, error);
  _cp_mutex_unlock (&worker->lock);
  if (ok && config->rank == 0)
    {
      self->addresses[0] = g_bytes_ref (my_address);
      ok = serve (self, deadline, cancellable, error);
    }
  else if (ok)
    ok = join (self, my_address, deadline, cancellable, error);
  self->config = NULL;
  if (!ok)
    {
      _cp_ucx_rendezvous_free (self, g_get_monotonic_time ());
      return NULL;
    }
  return self;
}

GBytes * const *
_cp_ucx_rendezvous_get_addresses (CpUcxRendezvous *self)
{
  return self->addresses;
}

static void
stop_listening (CpUcxRendezvous *self)
{
  ucp_conn_request_h request;

  if (self->listener == NULL)
    return;
  while ((request = g_queue_pop_head (&self->conn_requests)) != NULL)
    ucp_listener_reject (self->listener, request);
  g_clear_pointer (&self->listener, ucp_listener_destroy);
}

static void
close_all (CpUcxRendezvous *self,
           gint64           deadline)
{
  g_autoptr(GPtrArray) endpoints = g_ptr_array_new ();

  if (self->server != NULL)
    g_ptr_array_add (endpoints, self->server);
  for (guint i = 0; self->joiners != NULL && i < self->joiners->len; i++)
    g_ptr_array_add (endpoints, ((Joiner *) g_ptr_array_index (self->joiners, i))->endpoint);
  _cp_ucx_close_endpoints (self->worker, (CpUcxEndpoint **) endpoints->pdata, endpoints->len,
                           FALSE, deadline);
}

void
_cp_ucx_rendezvous_free (CpUcxRendezvous *self,
                         gint64           deadline)
{
  CpUcxWorker *worker = self->worker;

  g_clear_pointer (&self->gate, _cp_ucx_gate_free);
  _cp_mutex_lock (&worker->lock);
  stop_listening (self);
  _cp_mutex_unlock (&worker->lock);
  close_all (self, deadline);
  _cp_mutex_lock (&worker->lock);
  set_message_handler (self, FALSE, NULL);
  reap_sends (self, TRUE);
  _cp_mutex_unlock (&worker->lock);
  g_queue_clear_full (&self->inbox, (GDestroyNotify) message_free);
  g_clear_pointer (&self->joiners, g_ptr_array_unref);
  for (int r = 0; r < self->world_size; r++)
    g_clear_pointer (&self->addresses[r], g_bytes_unref);
  g_free (self->addresses);
  g_ptr_array_unref (self->pending);
  g_free (self->where);
  g_free (self);
}
