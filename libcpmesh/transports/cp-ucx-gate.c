/* cp-ucx-gate.c: the door in front of rank 0's UCX listener
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>
#include <sys/random.h>

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
 *   gate → joiner   "CPMESH\0\1" and a 32-byte random challenge
 *   joiner → gate   HMAC-SHA256 (token, "cpmesh gate" ‖ challenge)
 *   gate → joiner   a verdict byte: 0xff, then the UCX port (2 bytes, big
 *                   endian); or a CpMeshError code, then the length (2
 *                   bytes) and text of the reason
 *
 * The gate never reads more than the 32 bytes it expects, gives every
 * visitor a few seconds, and admits a bounded number at once, so garbage
 * costs a closed socket and nothing else. */

#define MAGIC "CPMESH\0\1"
#define MAGIC_SIZE 8
#define ACCEPTED_BYTE 0xff
#define VISIT_US (5 * G_TIME_SPAN_SECOND)
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

void
_cp_ucx_mac (const char   *token,
             const char   *purpose,
             const guint8 *data,
             gsize         length,
             guint8        mac[CP_UCX_MAC_SIZE])
{
  g_autoptr(GHmac) hmac = g_hmac_new (G_CHECKSUM_SHA256, (const guchar *) (token ? token : ""),
                                      token ? strlen (token) : 0);
  gsize mac_length = CP_UCX_MAC_SIZE;

  g_hmac_update (hmac, (const guchar *) purpose, (gssize) strlen (purpose) + 1);
  g_hmac_update (hmac, data, (gssize) length);
  g_hmac_get_digest (hmac, mac, &mac_length);
}

gboolean
_cp_ucx_mac_equal (const guint8 *a,
                   const guint8 *b)
{
  guint8 difference = 0;

  for (gsize i = 0; i < CP_UCX_MAC_SIZE; i++)
    difference |= a[i] ^ b[i];
  return difference == 0;
}

gboolean
_cp_ucx_fill_nonce (guint8  *nonce,
                    GError **error)
{
  if (getrandom (nonce, CP_UCX_NONCE_SIZE, 0) == CP_UCX_NONCE_SIZE)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_FAILED,
               "rendezvous: no random bytes for a challenge: %s", g_strerror (errno));
  return FALSE;
}

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
                  guint16          ucx_port,
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
  self->ucx_port = ucx_port;
  self->visitors = g_ptr_array_new_with_free_func ((GDestroyNotify) visitor_free);
  return self;
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
  guint8 greeting[MAGIC_SIZE + CP_UCX_NONCE_SIZE];

  visitor->socket = socket;
  visitor->deadline = g_get_monotonic_time () + VISIT_US;
  g_socket_set_blocking (socket, FALSE);
  if (self->visitors->len >= MAX_VISITORS || !_cp_ucx_fill_nonce (visitor->challenge, NULL))
    {
      visitor_free (visitor);
      return;
    }
  memcpy (greeting, MAGIC, MAGIC_SIZE);
  memcpy (greeting + MAGIC_SIZE, visitor->challenge, CP_UCX_NONCE_SIZE);
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
  guint8 reply[3 + sizeof refusal];
  gsize length;

  _cp_ucx_mac (self->token, "cpmesh gate", visitor->challenge, CP_UCX_NONCE_SIZE, expected);
  if (_cp_ucx_mac_equal (expected, visitor->answer))
    {
      reply[0] = ACCEPTED_BYTE;
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
  guint8 head[3];
  g_autofree char *text = NULL;
  gsize length;

  if (!read_exactly (in, head, sizeof head, cancellable, error))
    return FALSE;
  if (head[0] == ACCEPTED_BYTE)
    {
      *ucx_port = (guint16) (head[1] << 8 | head[2]);
      return TRUE;
    }
  length = (gsize) (head[1] << 8 | head[2]);
  text = g_malloc0 (length + 1);
  if (!read_exactly (in, (guint8 *) text, length, cancellable, error))
    return FALSE;
  g_set_error (error, CP_MESH_ERROR, head[0] <= CP_MESH_ERROR_NO_DEVICE ? head[0] : CP_MESH_ERROR_FAILED,
               "rank 0 at %s refused this process: %s", where, text);
  return FALSE;
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
  guint8 greeting[MAGIC_SIZE + CP_UCX_NONCE_SIZE];
  guint8 mac[CP_UCX_MAC_SIZE];

  if (!read_exactly (in, greeting, sizeof greeting, cancellable, error))
    return FALSE;
  if (memcmp (greeting, MAGIC, MAGIC_SIZE) != 0)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "%s is not the rendezvous of a libcpmesh rank 0", where);
      return FALSE;
    }
  _cp_ucx_mac (token, "cpmesh gate", greeting + MAGIC_SIZE, CP_UCX_NONCE_SIZE, mac);
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

  /* Rank 0 may not listen yet: knock again until it answers. */
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
      g_usleep (MIN (100 * G_TIME_SPAN_MILLISECOND, MAX (deadline - g_get_monotonic_time (), 0)));
    }
}
