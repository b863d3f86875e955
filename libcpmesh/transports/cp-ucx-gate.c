/* cp-ucx-gate.c: the door in front of rank 0's UCX listener
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include <gio/gio.h>

#include "cp-error.h"
#include "cp-ucx-private.h"

/* UCX 1.13's listener aborts the whole process when a connection sends it
 * bytes that are not its own handshake (an assertion in the TCP connection
 * manager, enabled in distribution builds), and port scanners send just
 * that.  So the rendezvous port is ours: a plain TCP socket that asks each
 * visitor to prove it holds the token and only then tells it the
 * ephemeral port of the UCX listener, where the rendezvous proper runs.
 *
 * The exchange is in cp-ucx-wire-private.h.
 *
 * The gate never reads more than the 32 bytes it expects, gives every
 * visitor a few seconds, and admits a bounded number at once, so garbage
 * costs a closed socket and nothing else. */

#define VISIT_US (5 * G_TIME_SPAN_SECOND)
#define FIRST_KNOCK_PAUSE_US G_TIME_SPAN_MILLISECOND
#define LAST_KNOCK_PAUSE_US (100 * G_TIME_SPAN_MILLISECOND)
#define MAX_VISITORS 64

typedef struct
{
  GSocket *socket;
  guint8 challenge[CP_UCX_NONCE_SIZE];
  guint8 answer[CP_UCX_MAC_SIZE];
  gsize have;
  gint64 deadline;
} Visitor;

struct _CpUcxGate
{
  GSocket *listener;
  char *token;
  guint16 ucx_port;
  GPtrArray *visitors;  /* Visitor* */
};

static void
visitor_free (Visitor *visitor)
{
  g_socket_close (visitor->socket, NULL);
  g_object_unref (visitor->socket);
  g_free (visitor);
}

CpUcxGate *
_cp_ucx_gate_new (GSocketAddress  *address,
                  const char      *token,
                  GError         **error)
{
  g_autoptr(GSocket) listener = g_socket_new (g_socket_address_get_family (address), G_SOCKET_TYPE_STREAM,
                                              G_SOCKET_PROTOCOL_TCP, error);
  CpUcxGate *self;

  if (listener == NULL || !g_socket_bind (listener, address, TRUE, error) ||
      !g_socket_listen (listener, error))
    return NULL;
  g_socket_set_blocking (listener, FALSE);
  self = g_new0 (CpUcxGate, 1);
  self->listener = g_steal_pointer (&listener);
  self->token = g_strdup (token);
  self->visitors = g_ptr_array_new_with_free_func ((GDestroyNotify) visitor_free);
  return self;
}

void
_cp_ucx_gate_open (CpUcxGate *self,
                   guint16    ucx_port)
{
  self->ucx_port = ucx_port;
}

void
_cp_ucx_gate_free (CpUcxGate *self)
{
  g_socket_close (self->listener, NULL);
  g_object_unref (self->listener);
  g_ptr_array_unref (self->visitors);
  g_free (self->token);
  g_free (self);
}

/* A greeting fits any socket buffer: it goes out whole or not at all. */
static void
admit (CpUcxGate *self,
       GSocket   *socket)
{
  Visitor *visitor = g_new0 (Visitor, 1);
  guint8 greeting[CP_UCX_GATE_GREETING_SIZE];

  visitor->socket = socket;
  visitor->deadline = g_get_monotonic_time () + VISIT_US;
  g_socket_set_blocking (socket, FALSE);
  if (self->visitors->len >= MAX_VISITORS || !_cp_ucx_fill_nonce (visitor->challenge, NULL))
    {
      visitor_free (visitor);
      return;
    }
  memcpy (greeting, CP_UCX_GATE_MAGIC, CP_UCX_GATE_MAGIC_SIZE);
  memcpy (greeting + CP_UCX_GATE_MAGIC_SIZE, visitor->challenge, CP_UCX_NONCE_SIZE);
  if (g_socket_send (socket, (const char *) greeting, sizeof greeting, NULL, NULL) != sizeof greeting)
    visitor_free (visitor);
  else
    g_ptr_array_add (self->visitors, visitor);
}

static void
answer (CpUcxGate *self,
        Visitor   *visitor)
{
  static const char refusal[] = "it did not prove it holds the mesh token (CPMESH_TOKEN)";
  guint8 expected[CP_UCX_MAC_SIZE];
  guint8 reply[CP_UCX_GATE_VERDICT_HEAD + sizeof refusal];
  gsize length;

  _cp_ucx_mac (self->token, "cpmesh gate", visitor->challenge, CP_UCX_NONCE_SIZE, expected);
  if (_cp_ucx_mac_equal (expected, visitor->answer))
    {
      reply[0] = CP_UCX_GATE_ACCEPTED;
      reply[1] = self->ucx_port >> 8;
      reply[2] = self->ucx_port & 0xff;
      length = 3;
    }
  else
    {
      reply[0] = CP_MESH_ERROR_AUTH;
      reply[1] = (sizeof refusal - 1) >> 8;
      reply[2] = (sizeof refusal - 1) & 0xff;
      memcpy (reply + 3, refusal, sizeof refusal - 1);
      length = 3 + sizeof refusal - 1;
    }
  g_socket_send (visitor->socket, (const char *) reply, length, NULL, NULL);
}

/* Reads what the visitor sent so far; TRUE when it is done with. */
static gboolean
listen_to (CpUcxGate *self,
           Visitor   *visitor)
{
  gssize got = g_socket_receive (visitor->socket, (char *) visitor->answer + visitor->have,
                                 CP_UCX_MAC_SIZE - visitor->have, NULL, NULL);

  if (got > 0)
    visitor->have += (gsize) got;
  if (visitor->have == CP_UCX_MAC_SIZE)
    {
      answer (self, visitor);
      return TRUE;
    }
  /* 0 is the end of the stream; -1 is "nothing yet" or an error. */
  return got == 0 || g_get_monotonic_time () >= visitor->deadline ||
         g_socket_condition_check (visitor->socket, G_IO_ERR | G_IO_HUP) != 0;
}

void
_cp_ucx_gate_serve (CpUcxGate *self)
{
  GSocket *socket;

  if (self->ucx_port == 0)
    return;
  while ((socket = g_socket_accept (self->listener, NULL, NULL)) != NULL)
    admit (self, socket);
  for (guint i = self->visitors->len; i-- > 0;)
    if (listen_to (self, g_ptr_array_index (self->visitors, i)))
      g_ptr_array_remove_index_fast (self->visitors, i);
}

/* ---- the joiner's side ---- */

static gboolean
read_exactly (GInputStream  *in,
              guint8        *buffer,
              gsize          size,
              GCancellable  *cancellable,
              GError       **error)
{
  gsize got = 0;

  if (!g_input_stream_read_all (in, buffer, size, &got, cancellable, error))
    return FALSE;
  if (got == size)
    return TRUE;
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_CONNECTION_CLOSED, "the connection closed early");
  return FALSE;
}

static gboolean
read_verdict (GInputStream  *in,
              const char    *where,
              guint16       *ucx_port,
              GCancellable  *cancellable,
              GError       **error)
{
  guint8 head[CP_UCX_GATE_VERDICT_HEAD];
  g_autofree guint8 *verdict = NULL;
  gsize size;

  if (!read_exactly (in, head, sizeof head, cancellable, error))
    return FALSE;
  size = _cp_ucx_gate_verdict_size (head);
  verdict = g_malloc (size);
  memcpy (verdict, head, sizeof head);
  return read_exactly (in, verdict + sizeof head, size - sizeof head, cancellable, error) &&
         _cp_ucx_gate_parse_verdict (verdict, size, where, ucx_port, error);
}

/* One visit; fails with a GIOError when nothing answered at all. */
static gboolean
visit (GSocketConnection  *connection,
       const char         *token,
       const char         *where,
       guint16            *ucx_port,
       GCancellable       *cancellable,
       GError            **error)
{
  GInputStream *in = g_io_stream_get_input_stream (G_IO_STREAM (connection));
  GOutputStream *out = g_io_stream_get_output_stream (G_IO_STREAM (connection));
  guint8 greeting[CP_UCX_GATE_GREETING_SIZE];
  guint8 challenge[CP_UCX_NONCE_SIZE];
  guint8 mac[CP_UCX_MAC_SIZE];

  if (!read_exactly (in, greeting, sizeof greeting, cancellable, error) ||
      !_cp_ucx_gate_parse_greeting (greeting, sizeof greeting, where, challenge, error))
    return FALSE;
  _cp_ucx_mac (token, "cpmesh gate", challenge, CP_UCX_NONCE_SIZE, mac);
  return g_output_stream_write_all (out, mac, sizeof mac, NULL, cancellable, error) &&
         read_verdict (in, where, ucx_port, cancellable, error);
}

static guint
seconds_left (gint64 deadline)
{
  gint64 left = deadline - g_get_monotonic_time ();

  return (guint) MAX (1, (left + G_TIME_SPAN_SECOND - 1) / G_TIME_SPAN_SECOND);
}

gboolean
_cp_ucx_gate_pass (GSocketAddress  *address,
                   const char      *token,
                   const char      *where,
                   gint64           deadline,
                   GCancellable    *cancellable,
                   guint16         *ucx_port,
                   GError         **error)
{
  g_autoptr(GSocketClient) client = g_socket_client_new ();
  gint64 pause = FIRST_KNOCK_PAUSE_US;

  /* Rank 0 may not listen yet: knock again until it answers, soon at
   * first (ranks usually start within milliseconds of each other), then
   * every 100 ms. */
  for (;;)
    {
      g_autoptr(GError) attempt_error = NULL;
      g_autoptr(GSocketConnection) connection = NULL;

      g_socket_client_set_timeout (client, seconds_left (deadline));
      connection = g_socket_client_connect (client, G_SOCKET_CONNECTABLE (address), cancellable,
                                            &attempt_error);
      if (connection != NULL)
        return visit (connection, token, where, ucx_port, cancellable, error);
      if (g_cancellable_set_error_if_cancelled (cancellable, error))
        return FALSE;
      if (g_get_monotonic_time () >= deadline)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                       "rank 0 did not answer at %s: %s", where, attempt_error->message);
          return FALSE;
        }
      g_usleep (MIN (pause, MAX (deadline - g_get_monotonic_time (), 0)));
      pause = MIN (2 * pause, LAST_KNOCK_PAUSE_US);
    }
}
