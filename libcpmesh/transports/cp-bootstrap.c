/* cp-bootstrap.c: ranks find and authenticate each other over TCP
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>

#include "cp-bootstrap-private.h"
#include "cp-error.h"
#include "cp-fault-private.h"

/* Rank 0 listens on the rendezvous port with a plain TCP socket, the
 * gate; every other rank connects there, answers rank 0's challenge with
 * a hello that proves it holds the token, and gets a verdict at once.
 * Rank 0 keeps the connections of the ranks it admitted and, once all are
 * in, sends each the offers of all ranks.  The exchange is in
 * cp-bootstrap-private.h, its parsers in cp-bootstrap-wire.c.
 *
 * Strangers reach the gate too: port scanners, programs that hold a
 * connection open and say nothing, programs that trickle bytes.  None of
 * them may keep a real rank out.  A visitor that has not finished its
 * hello (a real rank sends it within microseconds of the greeting) must
 * send its first bytes within a second and the whole hello within five,
 * and at most MAX_PENDING visitors wait at once, at most
 * MAX_PENDING_PER_SOURCE from one host: a newcomer makes room by
 * evicting the oldest waiting visitor of its own host when that holds its
 * share, else of the host that holds most places, so that strangers on
 * one host never take every place.  A visitor is heard once more before
 * it is evicted, so a real rank whose hello has arrived gets in; one
 * evicted before it spoke knocks again.  Nothing a visitor sends is read
 * before its length is checked, and no visitor holds more than one
 * hello's worth of memory.
 *
 * Joiners knock until rank 0 lets them in or their deadline passes: a
 * refused connection, a connection closed before the verdict (rank 0 was
 * not listening yet, or evicted them) only costs a pause, 1 ms at first
 * and twice as long each time up to 100 ms, with some randomness so that
 * many ranks do not knock in step.  A refusal, or any failure after rank
 * 0 admitted them, is final.  Every error is a CpMeshError, but for
 * cancellation. */

#define FIRST_BYTES_WAIT_US G_TIME_SPAN_SECOND
#define HELLO_WAIT_US (5 * G_TIME_SPAN_SECOND)
#define MAX_PENDING 128
#define MAX_PENDING_PER_SOURCE 64
#define MAX_ACCEPTS_PER_ROUND 32
#define LISTEN_BACKLOG 128
/* After accept() failed (out of descriptors, say), before trying again. */
#define ACCEPT_PAUSE_US (10 * G_TIME_SPAN_MILLISECOND)
#define FIRST_KNOCK_PAUSE_US G_TIME_SPAN_MILLISECOND
#define LAST_KNOCK_PAUSE_US (100 * G_TIME_SPAN_MILLISECOND)

/* ---- where rank 0 is ---- */

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

/* The address this host sends from to reach @address: the kernel's
 * choice for a connected UDP socket, which sends nothing. */
static GInetAddress *
local_address_towards (GSocketAddress  *address,
                       GError         **error)
{
  GInetAddress *host = g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (address));
  g_autoptr(GSocketAddress) probe_target = g_inet_socket_address_new (host, 9);
  g_autoptr(GSocket) probe = g_socket_new (g_socket_address_get_family (address), G_SOCKET_TYPE_DATAGRAM,
                                           G_SOCKET_PROTOCOL_UDP, error);
  g_autoptr(GSocketAddress) local = NULL;

  if (probe == NULL || !g_socket_connect (probe, probe_target, NULL, error) ||
      (local = g_socket_get_local_address (probe, error)) == NULL)
    return NULL;
  return g_object_ref (g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (local)));
}

static gboolean
is_inet (const struct sockaddr *address)
{
  return address != NULL && (address->sa_family == AF_INET || address->sa_family == AF_INET6);
}

/* The interface that has @local as one of its addresses, or NULL. */
static char *
interface_with (GInetAddress *local,
                gboolean     *is_loopback)
{
  struct ifaddrs *list = NULL;
  char *name = NULL;

  if (getifaddrs (&list) != 0)
    return NULL;
  for (struct ifaddrs *ifa = list; ifa != NULL && name == NULL; ifa = ifa->ifa_next)
    {
      g_autoptr(GSocketAddress) address = NULL;

      if (!is_inet (ifa->ifa_addr))
        continue;
      address = g_socket_address_new_from_native (ifa->ifa_addr, ifa->ifa_addr->sa_family == AF_INET
                                                                 ? sizeof (struct sockaddr_in)
                                                                 : sizeof (struct sockaddr_in6));
      if (G_IS_INET_SOCKET_ADDRESS (address) &&
          g_inet_address_equal (g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (address)), local))
        {
          name = g_strdup (ifa->ifa_name);
          *is_loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
        }
    }
  freeifaddrs (list);
  return name;
}

gboolean
_cp_bootstrap_find_route (const CpMeshConfig  *config,
                          CpBootstrapRoute    *route,
                          GError             **error)
{
  g_autoptr(GInetAddress) local = NULL;
  g_autoptr(GError) route_error = NULL;

  memset (route, 0, sizeof *route);
  /* A mesh of one rank talks to nobody: it needs no rendezvous, and its
   * transport no network. */
  if (config->world_size == 1)
    {
      route->is_loopback = TRUE;
      return TRUE;
    }
  route->address = resolve (config, error);
  if (route->address == NULL)
    return FALSE;
  route->is_any = g_inet_address_get_is_any (g_inet_socket_address_get_address (
                                               G_INET_SOCKET_ADDRESS (route->address)));
  local = local_address_towards (route->address, &route_error);
  if (local == NULL)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "this host has no route to the rendezvous address %s (MASTER_ADDR): %s",
                   config->address, route_error->message);
      _cp_bootstrap_route_clear (route);
      return FALSE;
    }
  route->interface = interface_with (local, &route->is_loopback);
  /* The interface may be missing for exotic routes (tunnels without an
   * address of their own); a transport that needs it says so. */
  if (route->interface == NULL)
    route->is_loopback = g_inet_address_get_is_loopback (local);
  return TRUE;
}

void
_cp_bootstrap_route_clear (CpBootstrapRoute *route)
{
  g_clear_object (&route->address);
  g_clear_pointer (&route->interface, g_free);
}

/* "host:port", with brackets around an IPv6 host. */
static char *
describe_address (GSocketAddress *address)
{
  GInetSocketAddress *inet = G_INET_SOCKET_ADDRESS (address);
  g_autofree char *host = g_inet_address_to_string (g_inet_socket_address_get_address (inet));

  return g_strdup_printf (strchr (host, ':') ? "[%s]:%u" : "%s:%u", host, g_inet_socket_address_get_port (inet));
}

/* Anyone who reaches the gate of a mesh without a token joins it as a
 * rank and receives its data: say so once per process, as a message and
 * not a warning, so that programs (and tests) that chose it go on.  A
 * gate on the unspecified address (0.0.0.0, ::) is reached over
 * loopback from this host, and from every other host too. */
static void
warn_without_token (const CpMeshConfig     *config,
                    const CpBootstrapRoute *route,
                    const char             *where)
{
  static gsize warned = 0;

  if (config->token != NULL || (route->is_loopback && !route->is_any) || !g_once_init_enter (&warned))
    return;
  if (route->is_any)
    g_message ("CPMESH_TOKEN is not set: rank 0 listens at %s, on every interface of its host, and "
               "any process that reaches it can join this mesh as a rank and receive its data. Give "
               "every rank the same secret in CPMESH_TOKEN.", where);
  else
    g_message ("CPMESH_TOKEN is not set: any process that reaches %s can join this mesh as a rank "
               "and receive its data. Give every rank the same secret in CPMESH_TOKEN.", where);
  g_once_init_leave (&warned, 1);
}

/* ---- sockets ---- */

static void
set_no_delay (GSocket *socket)
{
  /* Frames go out whole; waiting for an acknowledgement first only adds
   * a delayed ACK's 40 ms to every rendezvous. */
  g_socket_set_option (socket, IPPROTO_TCP, TCP_NODELAY, 1, NULL);
}

/* Sends what the socket takes now; TRUE once all of @data from @sent on
 * went out. */
static gboolean
send_some (GSocket  *socket,
           GBytes   *data,
           gsize    *sent,
           GError  **error)
{
  gsize size = 0;
  const char *bytes = g_bytes_get_data (data, &size);

  while (*sent < size)
    {
      g_autoptr(GError) send_error = NULL;
      gssize n = g_socket_send (socket, bytes + *sent, size - *sent, NULL, &send_error);

      if (n < 0 && g_error_matches (send_error, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK))
        return FALSE;
      if (n < 0)
        {
          g_propagate_error (error, g_steal_pointer (&send_error));
          return FALSE;
        }
      *sent += (gsize) n;
    }
  return TRUE;
}

/* ---- rank 0: the gate ---- */

typedef struct
{
  GSocket *socket;
  char *peer;              /* "host:port", for messages */
  char *source;            /* the host, for the limit per source */
  gint64 since;
  guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE];
  guint8 head[CP_BOOTSTRAP_FRAME_HEAD];
  gsize have;              /* bytes of head and payload so far */
  guint8 *payload;         /* allocated once the head is read */
  gsize length;            /* the payload's, from the head */
  int rank;                /* once admitted */
  guint8 nonce[CP_BOOTSTRAP_NONCE_SIZE];  /* the joiner's, once admitted */
} Visitor;

typedef struct
{
  const CpMeshConfig *config;
  const char *where;
  GSocket *listener;
  GPtrArray *pending;      /* Visitor*, oldest first */
  Visitor **members;       /* by rank, NULL until admitted */
  CpBootstrapOffer **offers; /* by rank */
  int n_joined;
  gint64 accept_resume;
  const CpBootstrapCheck *checks;
  guint n_checks;
  GError *doomed;          /* a member's blob was bad: what every rank fails with */
} Gate;

static void
visitor_free (Visitor *visitor)
{
  g_socket_close (visitor->socket, NULL);
  g_object_unref (visitor->socket);
  g_free (visitor->peer);
  g_free (visitor->source);
  g_free (visitor->payload);
  g_free (visitor);
}

static gboolean
open_gate (Gate                   *gate,
           const CpBootstrapRoute *route,
           GError                **error)
{
  g_autoptr(GError) listen_error = NULL;
  g_autoptr(GSocket) listener = g_socket_new (g_socket_address_get_family (route->address),
                                              G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP, &listen_error);

  if (listener != NULL)
    g_socket_set_listen_backlog (listener, LISTEN_BACKLOG);
  if (listener == NULL || !g_socket_bind (listener, route->address, TRUE, &listen_error) ||
      !g_socket_listen (listener, &listen_error))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "rank 0 cannot listen on %s (MASTER_ADDR, and %s): %s", gate->where,
                   gate->config->port_origin, listen_error->message);
      return FALSE;
    }
  g_socket_set_blocking (listener, FALSE);
  gate->listener = g_steal_pointer (&listener);
  return TRUE;
}

static void
describe_peer (Visitor *visitor)
{
  g_autoptr(GSocketAddress) address = g_socket_get_remote_address (visitor->socket, NULL);

  if (address == NULL || !G_IS_INET_SOCKET_ADDRESS (address))
    {
      visitor->peer = g_strdup ("an unknown address");
      visitor->source = g_strdup ("");
      return;
    }
  visitor->peer = describe_address (address);
  visitor->source = g_inet_address_to_string (g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (address)));
}

static guint
count_from (Gate       *gate,
            const char *source)
{
  guint n = 0;

  for (guint i = 0; i < gate->pending->len; i++)
    n += g_str_equal (((Visitor *) g_ptr_array_index (gate->pending, i))->source, source);
  return n;
}

/* The source holding most places, @source on a tie. */
static const char *
busiest_source (Gate       *gate,
                const char *source)
{
  const char *busiest = source;
  guint most = count_from (gate, source);

  for (guint i = 0; i < gate->pending->len; i++)
    {
      const char *other = ((Visitor *) g_ptr_array_index (gate->pending, i))->source;
      guint n = count_from (gate, other);

      if (n > most)
        {
          busiest = other;
          most = n;
        }
    }
  return busiest;
}

static gboolean hear (Gate    *gate,
                      Visitor *visitor);

/* Makes room for a visitor from @source, evicting the oldest waiting
 * visitor of its own source when that holds its share, else of the
 * busiest source.  A candidate is heard once more first: a real rank's
 * hello may be waiting unread in its socket. */
static void
make_room (Gate       *gate,
           const char *source)
{
  while (gate->pending->len >= MAX_PENDING || count_from (gate, source) >= MAX_PENDING_PER_SOURCE)
    {
      const char *victims = count_from (gate, source) >= MAX_PENDING_PER_SOURCE ? source
                            : busiest_source (gate, source);
      guint i = 0;

      while (i < gate->pending->len && !g_str_equal (((Visitor *) g_ptr_array_index (gate->pending, i))->source,
                                                     victims))
        i++;
      g_assert (i < gate->pending->len);
      if (hear (gate, g_ptr_array_index (gate->pending, i)))
        g_ptr_array_steal_index (gate->pending, i);
      else
        {
          g_debug ("rendezvous: evicting the visitor from %s to make room",
                   ((Visitor *) g_ptr_array_index (gate->pending, i))->peer);
          g_ptr_array_remove_index (gate->pending, i);
        }
    }
}

/* A greeting fits any socket buffer: it goes out whole or not at all. */
static void
admit (Gate    *gate,
       GSocket *socket)
{
  Visitor *visitor = g_new0 (Visitor, 1);
  guint8 greeting[CP_BOOTSTRAP_GREETING_SIZE];

  visitor->socket = socket;
  visitor->since = g_get_monotonic_time ();
  visitor->rank = -1;
  g_socket_set_blocking (socket, FALSE);
  set_no_delay (socket);
  describe_peer (visitor);
  if (!_cp_bootstrap_fill_nonce (visitor->challenge, NULL))
    {
      visitor_free (visitor);
      return;
    }
  _cp_bootstrap_pack_greeting (visitor->challenge, greeting);
  if (g_socket_send (socket, (const char *) greeting, sizeof greeting, NULL, NULL) != sizeof greeting)
    {
      visitor_free (visitor);
      return;
    }
  make_room (gate, visitor->source);
  g_ptr_array_add (gate->pending, visitor);
}

static void
accept_visitors (Gate *gate)
{
  for (guint n = 0; n < MAX_ACCEPTS_PER_ROUND && g_get_monotonic_time () >= gate->accept_resume; n++)
    {
      g_autoptr(GError) error = NULL;
      GSocket *socket = g_socket_accept (gate->listener, NULL, &error);

      if (socket != NULL)
        {
          admit (gate, socket);
          continue;
        }
      if (!g_error_matches (error, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK))
        {
          g_debug ("rendezvous: accepting failed: %s", error->message);
          gate->accept_resume = g_get_monotonic_time () + ACCEPT_PAUSE_US;
        }
      return;
    }
}

/* Sends @payload framed, now, as a fresh connection's buffer takes it. */
static gboolean
send_frame_now (Visitor  *visitor,
                GBytes   *payload,
                GError  **error)
{
  g_autoptr(GBytes) frame = _cp_bootstrap_frame (payload);
  gsize sent = 0;

  if (send_some (visitor->socket, frame, &sent, error))
    return TRUE;
  if (error != NULL && *error == NULL)
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, "its socket took only %" G_GSIZE_FORMAT
                 " of %" G_GSIZE_FORMAT " bytes", sent, g_bytes_get_size (frame));
  return FALSE;
}

static gboolean *
joined_ranks (Gate *gate)
{
  gboolean *joined = g_new0 (gboolean, gate->config->world_size);

  for (int r = 0; r < gate->config->world_size; r++)
    joined[r] = r == 0 || gate->members[r] != NULL;
  return joined;
}

/* Rank 0's decision on the hello @visitor sent, or why not. */
static int
judge (Gate              *gate,
       Visitor           *visitor,
       CpBootstrapHello **hello,
       char             **why)
{
  g_autoptr(GBytes) payload = g_bytes_new_take (g_steal_pointer (&visitor->payload), visitor->length);
  g_autoptr(GError) malformed = NULL;
  g_autofree gboolean *joined = NULL;

  *hello = _cp_bootstrap_parse_hello (payload, &malformed);
  if (*hello == NULL)
    {
      *why = g_strdup (malformed->message);
      return malformed->code;
    }
  joined = joined_ranks (gate);
  return _cp_bootstrap_judge_hello (*hello, gate->config, visitor->challenge, joined, why);
}

/* A member proved the token, so its blobs are no stranger's, but one
 * may still be malformed, by a bug or by design; its backend must never
 * see it.  Refusing that member alone would leave the others waiting
 * for its place until their timeout: the mesh is doomed instead, and
 * every rank learns why once all are in (serve). */
static void
check_offer (Gate    *gate,
             Visitor *member)
{
  const CpBootstrapOffer *offer = gate->offers[member->rank];

  for (guint i = 0; gate->doomed == NULL && i < _cp_bootstrap_offer_get_n_blobs (offer); i++)
    {
      const char *backend = _cp_bootstrap_offer_get_name (offer, i);
      g_autoptr(GError) error = NULL;

      if (_cp_bootstrap_check_blob (gate->checks, gate->n_checks, backend, _cp_bootstrap_offer_get_blob (offer, i),
                                    &error))
        continue;
      g_set_error (&gate->doomed, error->domain, error->code, "rank 0: rank %d (from %s) offered, for %s, %s",
                   member->rank, member->peer, backend, error->message);
      g_debug ("rendezvous: %s", gate->doomed->message);
    }
}

static void
let_in (Gate             *gate,
        Visitor          *visitor,
        CpBootstrapHello *hello)
{
  g_autoptr(GBytes) verdict = _cp_bootstrap_pack_verdict (gate->config->token, visitor->challenge, hello->nonce,
                                                          CP_BOOTSTRAP_ACCEPTED, "");
  g_autoptr(GError) error = NULL;

  if (!send_frame_now (visitor, verdict, &error))
    {
      g_debug ("rendezvous: the rank %d from %s left before its verdict: %s", hello->rank, visitor->peer,
               error->message);
      visitor_free (visitor);
      return;
    }
  visitor->rank = hello->rank;
  memcpy (visitor->nonce, hello->nonce, CP_BOOTSTRAP_NONCE_SIZE);
  gate->members[hello->rank] = visitor;
  gate->offers[hello->rank] = _cp_bootstrap_offer_ref (hello->offer);
  gate->n_joined++;
  check_offer (gate, visitor);
}

/* Answers the whole hello @visitor sent, and lets it in or sends it away. */
static void
answer (Gate    *gate,
        Visitor *visitor)
{
  g_autoptr(CpBootstrapHello) hello = NULL;
  g_autofree char *why = NULL;
  g_autofree char *text = NULL;
  g_autoptr(GBytes) verdict = NULL;
  guint8 no_nonce[CP_BOOTSTRAP_NONCE_SIZE] = { 0 };
  int code = judge (gate, visitor, &hello, &why);

  if (code == CP_BOOTSTRAP_ACCEPTED)
    {
      let_in (gate, visitor, hello);
      return;
    }
  text = g_strdup_printf ("rank 0 rejected the process claiming rank %d from %s: %s",
                          hello != NULL ? hello->rank : -1, visitor->peer, why);
  g_debug ("rendezvous: %s", text);
  verdict = _cp_bootstrap_pack_verdict (gate->config->token, visitor->challenge,
                                        hello != NULL ? hello->nonce : no_nonce, code, text);
  send_frame_now (visitor, verdict, NULL);
  visitor_free (visitor);
}

/* Reads into @visitor's head, then into its payload, as far as the
 * socket has bytes.  Returns FALSE while it is still to be heard, TRUE
 * once it is done with (answered, or gone and freed). */
static gboolean
hear (Gate    *gate,
      Visitor *visitor)
{
  for (;;)
    {
      g_autoptr(GError) error = NULL;
      gboolean in_head = visitor->have < CP_BOOTSTRAP_FRAME_HEAD;
      guint8 *into = in_head ? visitor->head + visitor->have
                             : visitor->payload + (visitor->have - CP_BOOTSTRAP_FRAME_HEAD);
      gsize want = in_head ? CP_BOOTSTRAP_FRAME_HEAD - visitor->have
                           : visitor->length - (visitor->have - CP_BOOTSTRAP_FRAME_HEAD);
      gssize got = g_socket_receive (visitor->socket, (char *) into, want, NULL, &error);

      if (got < 0 && g_error_matches (error, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK))
        return FALSE;
      if (got <= 0)
        {
          g_debug ("rendezvous: %s left before its hello was complete", visitor->peer);
          visitor_free (visitor);
          return TRUE;
        }
      visitor->have += (gsize) got;
      if (visitor->have == CP_BOOTSTRAP_FRAME_HEAD &&
          !_cp_bootstrap_parse_frame_head (visitor->head, CP_BOOTSTRAP_HELLO_MAX, "hello",
                                           &visitor->length, &error))
        {
          g_debug ("rendezvous: %s sent %s", visitor->peer, error->message);
          visitor_free (visitor);
          return TRUE;
        }
      if (visitor->have == CP_BOOTSTRAP_FRAME_HEAD)
        visitor->payload = g_malloc (visitor->length);
      if (visitor->have == CP_BOOTSTRAP_FRAME_HEAD + visitor->length)
        {
          answer (gate, visitor);
          return TRUE;
        }
    }
}

/* The time by which @visitor must have sent what it has not. */
static gint64
visit_deadline (const Visitor *visitor)
{
  return visitor->since + (visitor->have == 0 ? FIRST_BYTES_WAIT_US : HELLO_WAIT_US);
}

static void
hear_pending (Gate *gate)
{
  gint64 now = g_get_monotonic_time ();

  for (guint i = 0; i < gate->pending->len;)
    {
      Visitor *visitor = g_ptr_array_index (gate->pending, i);

      if (hear (gate, visitor))
        g_ptr_array_steal_index (gate->pending, i);
      else if (now >= visit_deadline (visitor))
        {
          g_debug ("rendezvous: %s sent no hello in time", visitor->peer);
          g_ptr_array_remove_index (gate->pending, i);
        }
      else
        i++;
    }
}

/* An admitted rank says nothing more until it has the table: a member
 * whose connection closes or speaks out of turn is gone, and its place
 * free again for a rank that restarts. */
static void
check_members (Gate *gate)
{
  for (int r = 1; r < gate->config->world_size; r++)
    {
      Visitor *member = gate->members[r];
      g_autoptr(GError) error = NULL;
      guint8 byte;

      if (member == NULL ||
          (g_socket_receive (member->socket, (char *) &byte, 1, NULL, &error) < 0 &&
           g_error_matches (error, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK)))
        continue;
      g_debug ("rendezvous: rank %d from %s left before the address table", r, member->peer);
      g_clear_pointer (&gate->members[r], visitor_free);
      g_clear_pointer (&gate->offers[r], _cp_bootstrap_offer_unref);
      gate->n_joined--;
    }
}

static void
add_poll (GArray  *fds,
          GSocket *socket,
          gushort  events)
{
  GPollFD fd = { g_socket_get_fd (socket), events, 0 };

  g_array_append_val (fds, fd);
}

/* Sleeps until a socket of the gate has something, the next visitor's
 * time is up, @deadline or cancellation. */
static void
wait_for_events (Gate         *gate,
                 gint64        deadline,
                 GCancellable *cancellable)
{
  g_autoptr(GArray) fds = g_array_new (FALSE, FALSE, sizeof (GPollFD));
  gint64 until = deadline;
  GPollFD cancel_fd;
  gboolean cancellable_fd = g_cancellable_make_pollfd (cancellable, &cancel_fd);

  if (gate->accept_resume > g_get_monotonic_time ())
    until = MIN (until, gate->accept_resume);
  else
    add_poll (fds, gate->listener, G_IO_IN);
  for (guint i = 0; i < gate->pending->len; i++)
    {
      Visitor *visitor = g_ptr_array_index (gate->pending, i);

      add_poll (fds, visitor->socket, G_IO_IN);
      until = MIN (until, visit_deadline (visitor));
    }
  for (int r = 1; r < gate->config->world_size; r++)
    if (gate->members[r] != NULL)
      add_poll (fds, gate->members[r]->socket, G_IO_IN);
  if (cancellable_fd)
    g_array_append_val (fds, cancel_fd);
  g_poll ((GPollFD *) fds->data, fds->len,
          (gint) CLAMP ((until - g_get_monotonic_time () + 999) / 1000, 0, G_MAXINT));
  if (cancellable_fd)
    g_cancellable_release_fd (cancellable);
}

static gboolean
check_waiting (Gate          *gate,
               gint64         deadline,
               GCancellable  *cancellable,
               GError       **error)
{
  GString *missing;
  int n_missing = 0;

  if (g_cancellable_set_error_if_cancelled (cancellable, error))
    return FALSE;
  if (g_get_monotonic_time () < deadline)
    return TRUE;
  missing = g_string_new (NULL);
  for (int r = 1; r < gate->config->world_size; r++)
    if (gate->members[r] == NULL)
      {
        g_string_append_printf (missing, "%s%d", missing->len ? ", " : "", r);
        n_missing++;
      }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
               "rank 0: %s %s never joined within %u ms (rendezvous at %s)",
               n_missing == 1 ? "rank" : "ranks", missing->str, gate->config->timeout_ms,
               gate->where);
  g_string_free (missing, TRUE);
  return FALSE;
}

static gboolean
wait_for_ranks (Gate          *gate,
                gint64         deadline,
                GCancellable  *cancellable,
                GError       **error)
{
  while (gate->n_joined < gate->config->world_size - 1)
    {
      if (!check_waiting (gate, deadline, cancellable, error))
        return FALSE;
      wait_for_events (gate, deadline, cancellable);
      /* Members first: a rank that restarts finds its old place free. */
      check_members (gate);
      accept_visitors (gate);
      hear_pending (gate);
    }
  return TRUE;
}

typedef struct
{
  Visitor *member;
  GBytes *frame;
  gsize sent;
} Outgoing;

static void
outgoing_clear (Outgoing *outgoing)
{
  g_clear_pointer (&outgoing->frame, g_bytes_unref);
}

/* Sends every member its table, as fast as each takes it. */
static gboolean
send_tables (Gate          *gate,
             gint64         deadline,
             GCancellable  *cancellable,
             GError       **error)
{
  int n = gate->config->world_size;
  g_autoptr(GArray) outgoing = g_array_new (FALSE, TRUE, sizeof (Outgoing));
  g_autoptr(GArray) fds = g_array_new (FALSE, FALSE, sizeof (GPollFD));

  g_array_set_clear_func (outgoing, (GDestroyNotify) outgoing_clear);
  for (int r = 1; r < n; r++)
    {
      Visitor *member = gate->members[r];
      g_autoptr(GBytes) table = _cp_bootstrap_pack_table (gate->config->token, member->challenge, member->nonce,
                                                          gate->offers, n);
      Outgoing out = { member, _cp_bootstrap_frame (table), 0 };

      g_array_append_val (outgoing, out);
    }
  for (;;)
    {
      g_array_set_size (fds, 0);
      for (guint i = 0; i < outgoing->len; i++)
        {
          Outgoing *out = &g_array_index (outgoing, Outgoing, i);
          g_autoptr(GError) send_error = NULL;

          if (send_some (out->member->socket, out->frame, &out->sent, &send_error))
            continue;
          if (send_error != NULL)
            {
              g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                           "rank 0: rank %d (from %s) left before it received the address table: %s",
                           out->member->rank, out->member->peer, send_error->message);
              return FALSE;
            }
          add_poll (fds, out->member->socket, G_IO_OUT);
        }
      if (fds->len == 0)
        return TRUE;
      if (g_cancellable_set_error_if_cancelled (cancellable, error))
        return FALSE;
      if (g_get_monotonic_time () >= deadline)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                       "rank 0: %u ranks did not take the address table within %u ms", fds->len,
                       gate->config->timeout_ms);
          return FALSE;
        }
      g_poll ((GPollFD *) fds->data, fds->len,
              (gint) CLAMP ((deadline - g_get_monotonic_time () + 999) / 1000, 0, G_MAXINT));
    }
}

/* Tells every admitted rank why rank 0 gave up, so that it fails now
 * rather than at its own timeout. */
static void
tell_members (Gate         *gate,
              const GError *failure)
{
  for (int r = 1; r < gate->config->world_size; r++)
    {
      Visitor *member = gate->members[r];
      g_autoptr(GBytes) message = NULL;

      if (member == NULL)
        continue;
      message = _cp_bootstrap_pack_failure (gate->config->token, member->challenge, member->nonce, failure);
      send_frame_now (member, message, NULL);
    }
}

static void
gate_clear (Gate *gate)
{
  for (int r = 0; r < gate->config->world_size; r++)
    {
      g_clear_pointer (&gate->members[r], visitor_free);
      g_clear_pointer (&gate->offers[r], _cp_bootstrap_offer_unref);
    }
  g_free (gate->members);
  g_free (gate->offers);
  g_clear_error (&gate->doomed);
  g_ptr_array_unref (gate->pending);
  if (gate->listener != NULL)
    g_socket_close (gate->listener, NULL);
  g_clear_object (&gate->listener);
}

static GPtrArray *
take_offers (Gate *gate)
{
  GPtrArray *offers = g_ptr_array_new_with_free_func ((GDestroyNotify) _cp_bootstrap_offer_unref);

  for (int r = 0; r < gate->config->world_size; r++)
    g_ptr_array_add (offers, g_steal_pointer (&gate->offers[r]));
  return offers;
}

/* A doomed mesh fails with what doomed it, rather than the timeout
 * that may have come first. */
static gboolean
check_doomed (Gate    *gate,
              GError **failure)
{
  if (gate->doomed == NULL)
    return TRUE;
  g_clear_error (failure);
  *failure = g_steal_pointer (&gate->doomed);
  return FALSE;
}

static GPtrArray *
serve (const CpMeshConfig      *config,
       const CpBootstrapRoute  *route,
       const char              *where,
       CpBootstrapOffer        *offer,
       const CpBootstrapCheck  *checks,
       guint                    n_checks,
       gint64                   deadline,
       GCancellable            *cancellable,
       GError                 **error)
{
  Gate gate = {
    .config = config,
    .where = where,
    .pending = g_ptr_array_new_with_free_func ((GDestroyNotify) visitor_free),
    .members = g_new0 (Visitor *, config->world_size),
    .offers = g_new0 (CpBootstrapOffer *, config->world_size),
    .checks = checks,
    .n_checks = n_checks,
  };
  GError *failure = NULL;
  GPtrArray *offers = NULL;
  gboolean ok;

  gate.offers[0] = _cp_bootstrap_offer_ref (offer);
  ok = open_gate (&gate, route, &failure) && wait_for_ranks (&gate, deadline, cancellable, &failure);
  ok = check_doomed (&gate, &failure) && ok;
  if (ok && send_tables (&gate, deadline, cancellable, &failure))
    offers = take_offers (&gate);
  else
    {
      tell_members (&gate, failure);
      g_propagate_error (error, failure);
    }
  gate_clear (&gate);
  return offers;
}

/* ---- every other rank ---- */

typedef struct
{
  const CpMeshConfig *config;
  const char *where;
  GSocketAddress *address;
  CpBootstrapOffer *offer;
  const CpBootstrapCheck *checks;
  guint n_checks;
  gint64 deadline;
  GCancellable *cancellable;
  guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE];
  guint8 nonce[CP_BOOTSTRAP_NONCE_SIZE];
} Joiner;

/* What one knock came to. */
typedef enum
{
  KNOCK_JOINED,
  KNOCK_AGAIN,    /* nobody answered, or rank 0 closed before its verdict */
  KNOCK_FAILED,   /* final: a refusal, cancellation, or rank 0 failed us */
} Knock;

/* Waits until @socket is ready for @condition or the deadline passes. */
static gboolean
wait_on (Joiner        *self,
         GSocket       *socket,
         GIOCondition   condition,
         GError       **error)
{
  gint64 left = self->deadline - g_get_monotonic_time ();

  if (left <= 0)
    {
      g_set_error_literal (error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT, "nothing came within the timeout");
      return FALSE;
    }
  return g_socket_condition_timed_wait (socket, condition, left, self->cancellable, error);
}

static GSocket *
connect_to_gate (Joiner  *self,
                 GError **error)
{
  g_autoptr(GSocket) socket = g_socket_new (g_socket_address_get_family (self->address), G_SOCKET_TYPE_STREAM,
                                            G_SOCKET_PROTOCOL_TCP, error);
  g_autoptr(GError) connect_error = NULL;

  if (socket == NULL)
    return NULL;
  g_socket_set_blocking (socket, FALSE);
  set_no_delay (socket);
  if (!g_socket_connect (socket, self->address, self->cancellable, &connect_error))
    {
      if (!g_error_matches (connect_error, G_IO_ERROR, G_IO_ERROR_PENDING))
        {
          g_propagate_error (error, g_steal_pointer (&connect_error));
          return NULL;
        }
      if (!wait_on (self, socket, G_IO_OUT, error) || !g_socket_check_connect_result (socket, error))
        return NULL;
    }
  return g_steal_pointer (&socket);
}

static gboolean
receive_exactly (Joiner   *self,
                 GSocket  *socket,
                 guint8   *buffer,
                 gsize     size,
                 GError  **error)
{
  gsize have = 0;

  while (have < size)
    {
      g_autoptr(GError) receive_error = NULL;
      gssize got = g_socket_receive (socket, (char *) buffer + have, size - have, NULL, &receive_error);

      if (got > 0)
        have += (gsize) got;
      else if (got == 0)
        {
          g_set_error_literal (error, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED, "the connection closed");
          return FALSE;
        }
      else if (!g_error_matches (receive_error, G_IO_ERROR, G_IO_ERROR_WOULD_BLOCK))
        {
          g_propagate_error (error, g_steal_pointer (&receive_error));
          return FALSE;
        }
      else if (!wait_on (self, socket, G_IO_IN, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
send_all (Joiner   *self,
          GSocket  *socket,
          GBytes   *data,
          GError  **error)
{
  gsize sent = 0;

  while (!send_some (socket, data, &sent, error))
    if ((error != NULL && *error != NULL) || !wait_on (self, socket, G_IO_OUT, error))
      return FALSE;
  return TRUE;
}

/* One frame of at most @max bytes; an I/O error is a GIOError, a frame
 * head out of range a CpMeshError. */
static GBytes *
receive_frame (Joiner      *self,
               GSocket     *socket,
               gsize        max,
               const char  *what,
               GError     **error)
{
  guint8 head[CP_BOOTSTRAP_FRAME_HEAD];
  g_autofree guint8 *payload = NULL;
  gsize length = 0;

  if (!receive_exactly (self, socket, head, sizeof head, error) ||
      !_cp_bootstrap_parse_frame_head (head, max, what, &length, error))
    return NULL;
  payload = g_malloc (length);
  if (!receive_exactly (self, socket, payload, length, error))
    return NULL;
  return g_bytes_new_take (g_steal_pointer (&payload), length);
}

/* What an I/O error before the verdict means: knock again, unless the
 * caller gave up. */
static Knock
knock_again_unless_cancelled (const GError *error)
{
  return g_error_matches (error, G_IO_ERROR, G_IO_ERROR_CANCELLED) ? KNOCK_FAILED : KNOCK_AGAIN;
}

/* Sends this rank's hello as an injected fault (cp-fault-private.h)
 * leaves it, in the test variant of the library. */
static gboolean
send_hello (Joiner   *self,
            GSocket  *socket,
            GError  **error)
{
  g_autoptr(GBytes) payload = _cp_bootstrap_pack_hello (self->config, self->challenge, self->nonce, self->offer);
  g_autoptr(GBytes) frame = NULL;
  guint delay_ms = 0;

  switch (_cp_fault_strike ("bootstrap", self->config->rank, 0, CP_FAULT_STEP_HELLO, &delay_ms))
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
  frame = _cp_bootstrap_frame (payload);
  return send_all (self, socket, frame, error);
}

/* After the greeting: the hello, and rank 0's verdict. */
static Knock
introduce (Joiner   *self,
           GSocket  *socket,
           GError  **error)
{
  g_autoptr(GError) io_error = NULL;
  g_autoptr(GBytes) verdict = NULL;

  if (!_cp_bootstrap_fill_nonce (self->nonce, error))
    return KNOCK_FAILED;
  if (!send_hello (self, socket, &io_error) ||
      (verdict = receive_frame (self, socket, CP_BOOTSTRAP_VERDICT_MAX, "verdict", &io_error)) == NULL)
    {
      if (io_error->domain == CP_MESH_ERROR)
        {
          g_propagate_prefixed_error (error, g_steal_pointer (&io_error), "rank %d: rank 0 at %s sent ",
                                      self->config->rank, self->where);
          return KNOCK_FAILED;
        }
      g_propagate_prefixed_error (error, g_steal_pointer (&io_error), "no verdict: ");
      return knock_again_unless_cancelled (*error);
    }
  if (_cp_bootstrap_parse_verdict (verdict, self->config->token, self->challenge, self->nonce, self->where,
                                   error))
    return KNOCK_JOINED;
  g_prefix_error (error, "rank %d: ", self->config->rank);
  return KNOCK_FAILED;
}

/* Rank 0 checked every joiner's blobs, but a rank 0 that holds the
 * token is not therefore well behaved. */
static gboolean
check_table (Joiner     *self,
             GPtrArray  *offers,
             GError    **error)
{
  for (guint r = 0; r < offers->len; r++)
    {
      const CpBootstrapOffer *offer = g_ptr_array_index (offers, r);

      for (guint i = 0; (int) r != self->config->rank && i < _cp_bootstrap_offer_get_n_blobs (offer); i++)
        if (!_cp_bootstrap_check_blob (self->checks, self->n_checks, _cp_bootstrap_offer_get_name (offer, i),
                                       _cp_bootstrap_offer_get_blob (offer, i), error))
          {
            g_prefix_error (error, "rank %d: the address table from rank 0 at %s holds, for rank %u's %s, ",
                            self->config->rank, self->where, r, _cp_bootstrap_offer_get_name (offer, i));
            return FALSE;
          }
    }
  return TRUE;
}

/* Once admitted: every rank's blob, or the error rank 0 gave up with. */
static GPtrArray *
receive_table (Joiner   *self,
               GSocket  *socket,
               GError  **error)
{
  const CpMeshConfig *config = self->config;
  g_autoptr(GError) io_error = NULL;
  g_autoptr(GBytes) table = receive_frame (self, socket, _cp_bootstrap_table_max (config->world_size),
                                           "address table", &io_error);
  GPtrArray *blobs;

  if (table == NULL && g_error_matches (io_error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT))
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                 "rank %d: rank 0 at %s admitted this rank but did not send the address table within "
                 "%u ms: other ranks never joined", config->rank, self->where, config->timeout_ms);
  else if (table == NULL && io_error->domain == G_IO_ERROR && io_error->code != G_IO_ERROR_CANCELLED)
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST,
                 "rank %d: rank 0 at %s admitted this rank, then left before it sent the address "
                 "table: %s", config->rank, self->where, io_error->message);
  else if (table == NULL && io_error->domain == CP_MESH_ERROR)
    g_propagate_prefixed_error (error, g_steal_pointer (&io_error), "rank %d: rank 0 at %s sent ",
                                config->rank, self->where);
  else if (table == NULL)
    g_propagate_error (error, g_steal_pointer (&io_error));
  if (table == NULL)
    return NULL;
  blobs = _cp_bootstrap_parse_table (table, config->token, self->challenge, self->nonce, config->world_size,
                                     self->where, error);
  if (blobs == NULL)
    g_prefix_error (error, "rank %d: ", config->rank);
  else if (!check_table (self, blobs, error))
    g_clear_pointer (&blobs, g_ptr_array_unref);
  return blobs;
}

/* One knock on rank 0's gate; @blobs once the whole mesh joined. */
static Knock
knock (Joiner     *self,
       GPtrArray **blobs,
       GError    **error)
{
  g_autoptr(GSocket) socket = connect_to_gate (self, error);
  guint8 greeting[CP_BOOTSTRAP_GREETING_SIZE];
  Knock outcome;

  if (socket == NULL)
    return knock_again_unless_cancelled (*error);
  if (!receive_exactly (self, socket, greeting, sizeof greeting, error))
    {
      g_prefix_error (error, "no greeting: ");
      return knock_again_unless_cancelled (*error);
    }
  if (!_cp_bootstrap_parse_greeting (greeting, sizeof greeting, self->where, self->challenge, error))
    {
      g_prefix_error (error, "rank %d: ", self->config->rank);
      return KNOCK_FAILED;
    }
  outcome = introduce (self, socket, error);
  if (outcome != KNOCK_JOINED)
    return outcome;
  *blobs = receive_table (self, socket, error);
  g_socket_close (socket, NULL);
  return *blobs != NULL ? KNOCK_JOINED : KNOCK_FAILED;
}

/* Sleeps @pause_us with some randomness, or until cancelled. */
static void
pause_between_knocks (Joiner *self,
                      gint64  pause_us)
{
  gint64 sleep_us = MIN (pause_us / 2 + g_random_int_range (0, (gint32) MAX (pause_us, 1)),
                         MAX (self->deadline - g_get_monotonic_time (), 0));
  GPollFD cancel_fd;

  if (g_cancellable_make_pollfd (self->cancellable, &cancel_fd))
    {
      g_poll (&cancel_fd, 1, (gint) ((sleep_us + 999) / 1000));
      g_cancellable_release_fd (self->cancellable);
    }
  else
    g_usleep ((gulong) sleep_us);
}

static GPtrArray *
join (Joiner  *self,
      GError **error)
{
  gint64 pause_us = FIRST_KNOCK_PAUSE_US;
  g_autoptr(GError) last_error = NULL;

  for (;;)
    {
      g_autoptr(GError) knock_error = NULL;
      GPtrArray *blobs = NULL;

      switch (knock (self, &blobs, &knock_error))
        {
        case KNOCK_JOINED:
          return blobs;
        case KNOCK_FAILED:
          g_propagate_error (error, g_steal_pointer (&knock_error));
          return NULL;
        case KNOCK_AGAIN:
        default:
          break;
        }
      /* A knock cut short by the deadline says less than the one before. */
      if (last_error == NULL || !g_error_matches (knock_error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT))
        {
          g_clear_error (&last_error);
          last_error = g_steal_pointer (&knock_error);
        }
      if (g_get_monotonic_time () >= self->deadline)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                       "rank %d: rank 0 did not answer at %s within %u ms: %s", self->config->rank,
                       self->where, self->config->timeout_ms, last_error->message);
          return NULL;
        }
      pause_between_knocks (self, pause_us);
      pause_us = MIN (2 * pause_us, LAST_KNOCK_PAUSE_US);
    }
}

GPtrArray *
_cp_bootstrap_exchange (const CpMeshConfig      *config,
                        const CpBootstrapRoute  *route,
                        CpBootstrapOffer        *offer,
                        const CpBootstrapCheck  *checks,
                        guint                    n_checks,
                        gint64                   deadline,
                        GCancellable            *cancellable,
                        GError                 **error)
{
  g_autofree char *where = NULL;
  Joiner joiner = {
    .config = config, .address = route->address, .offer = offer, .checks = checks, .n_checks = n_checks,
    .deadline = deadline, .cancellable = cancellable,
  };

  if (config->world_size == 1)
    {
      GPtrArray *offers = g_ptr_array_new_with_free_func ((GDestroyNotify) _cp_bootstrap_offer_unref);

      g_ptr_array_add (offers, _cp_bootstrap_offer_ref (offer));
      return offers;
    }
  where = describe_address (route->address);
  warn_without_token (config, route, where);
  if (config->rank == 0)
    return serve (config, route, where, offer, checks, n_checks, deadline, cancellable, error);
  joiner.where = where;
  return join (&joiner, error);
}
