/* cp-ucx-wire.c: packing and parsing what UCX ranks exchange
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "cp-error.h"
#include "cp-ucx-wire-private.h"

/* Rendezvous messages and descriptors are serialized GVariants.  GLib
 * reads a GVariant of untrusted bytes safely, but fills whatever does not
 * fit its type with defaults; a message that is not in normal form is
 * therefore refused before any field is read. */

#define CHALLENGE_TYPE "(uay)"
#define HELLO_TYPE "(usiiasaiayayay)"
#define VERDICT_TYPE "(isay)"
#define TABLE_TYPE "aay"
#define DESCRIPTOR_TYPE "(uuaxiiubsis)"
#define MESSAGE_TEXT_MAX 2048

/* ---- keys and proofs ---- */

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

void
_cp_ucx_hello_mac (const char   *token,
                   const char   *purpose,
                   const guint8 *first_nonce,
                   const guint8 *second_nonce,
                   int           rank,
                   int           world_size,
                   guint8        mac[CP_UCX_MAC_SIZE])
{
  guint8 data[2 * CP_UCX_NONCE_SIZE + 8];
  guint32 numbers[2] = { GUINT32_TO_BE ((guint32) rank), GUINT32_TO_BE ((guint32) world_size) };

  memcpy (data, first_nonce, CP_UCX_NONCE_SIZE);
  memcpy (data + CP_UCX_NONCE_SIZE, second_nonce, CP_UCX_NONCE_SIZE);
  memcpy (data + 2 * CP_UCX_NONCE_SIZE, numbers, sizeof numbers);
  _cp_ucx_mac (token, purpose, data, sizeof data, mac);
}

/* ---- the gate ---- */

gboolean
_cp_ucx_gate_parse_greeting (const guint8  *data,
                             gsize          length,
                             const char    *where,
                             guint8         challenge[CP_UCX_NONCE_SIZE],
                             GError       **error)
{
  if (length != CP_UCX_GATE_GREETING_SIZE || memcmp (data, CP_UCX_GATE_MAGIC, CP_UCX_GATE_MAGIC_SIZE) != 0)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "%s is not the rendezvous of a libcpmesh rank 0", where);
      return FALSE;
    }
  memcpy (challenge, data + CP_UCX_GATE_MAGIC_SIZE, CP_UCX_NONCE_SIZE);
  return TRUE;
}

gsize
_cp_ucx_gate_verdict_size (const guint8 head[CP_UCX_GATE_VERDICT_HEAD])
{
  if (head[0] == CP_UCX_GATE_ACCEPTED)
    return CP_UCX_GATE_VERDICT_HEAD;
  return CP_UCX_GATE_VERDICT_HEAD + (gsize) (head[1] << 8 | head[2]);
}

gboolean
_cp_ucx_gate_parse_verdict (const guint8  *data,
                            gsize          length,
                            const char    *where,
                            guint16       *ucx_port,
                            GError       **error)
{
  g_autofree char *reason = NULL;
  int code;

  if (length < CP_UCX_GATE_VERDICT_HEAD || length != _cp_ucx_gate_verdict_size (data))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "rank 0 at %s sent a verdict of %" G_GSIZE_FORMAT " bytes that does not "
                   "fit its header", where, length);
      return FALSE;
    }
  if (data[0] == CP_UCX_GATE_ACCEPTED)
    {
      *ucx_port = (guint16) (data[1] << 8 | data[2]);
      return TRUE;
    }
  code = data[0] <= CP_MESH_ERROR_NO_DEVICE ? data[0] : CP_MESH_ERROR_FAILED;
  reason = g_utf8_make_valid ((const char *) data + CP_UCX_GATE_VERDICT_HEAD,
                              (gssize) (length - CP_UCX_GATE_VERDICT_HEAD));
  g_set_error (error, CP_MESH_ERROR, code, "rank 0 at %s refused this process: %s", where,
               *reason != '\0' ? reason : "it gave no reason");
  return FALSE;
}

/* ---- the rendezvous ---- */

static GVariant *
bytes_variant (const guint8 *data,
               gsize         length)
{
  return g_variant_new_fixed_array (G_VARIANT_TYPE_BYTE, data, length, 1);
}

/* @payload as a GVariant of @type, or NULL when it is not one. */
static GVariant *
parse_variant (GBytes      *payload,
               const char  *type,
               const char  *what,
               GError     **error)
{
  g_autoptr(GVariant) variant = g_variant_ref_sink (g_variant_new_from_bytes (G_VARIANT_TYPE (type),
                                                                              payload, FALSE));

  if (g_variant_is_normal_form (variant))
    return g_steal_pointer (&variant);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed %s: %" G_GSIZE_FORMAT " bytes that are not a %s message", what,
               g_bytes_get_size (payload), type);
  return NULL;
}

/* Copies the byte array child @index of @variant, of exactly @size bytes. */
static gboolean
take_fixed_bytes (GVariant    *variant,
                  gsize        index,
                  guint8      *out,
                  gsize        size,
                  const char  *what,
                  GError     **error)
{
  g_autoptr(GVariant) child = g_variant_get_child_value (variant, index);
  gsize length = 0;
  const guint8 *data = g_variant_get_fixed_array (child, &length, 1);

  if (length == size)
    {
      memcpy (out, data, size);
      return TRUE;
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed %s: %" G_GSIZE_FORMAT " bytes where %" G_GSIZE_FORMAT " belong",
               what, length, size);
  return FALSE;
}

GBytes *
_cp_ucx_pack_challenge (const guint8 *nonce)
{
  g_autoptr(GVariant) body = g_variant_ref_sink (g_variant_new ("(u@ay)", CP_UCX_PROTOCOL_VERSION,
                                                                bytes_variant (nonce, CP_UCX_NONCE_SIZE)));

  return g_variant_get_data_as_bytes (body);
}

gboolean
_cp_ucx_parse_challenge (GBytes  *payload,
                         guint8   nonce[CP_UCX_NONCE_SIZE],
                         GError **error)
{
  g_autoptr(GVariant) body = parse_variant (payload, CHALLENGE_TYPE, "challenge", error);
  guint32 protocol = 0;

  if (body == NULL)
    return FALSE;
  g_variant_get_child (body, 0, "u", &protocol);
  if (protocol != CP_UCX_PROTOCOL_VERSION)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "rank 0 speaks rendezvous protocol %u, this process %u", protocol,
                   CP_UCX_PROTOCOL_VERSION);
      return FALSE;
    }
  return take_fixed_bytes (body, 1, nonce, CP_UCX_NONCE_SIZE, "challenge nonce", error);
}

void
_cp_ucx_hello_free (CpUcxHello *hello)
{
  if (hello == NULL)
    return;
  g_free (hello->version);
  g_strfreev (hello->dim_names);
  g_free (hello->dim_sizes);
  g_clear_pointer (&hello->address, g_bytes_unref);
  g_free (hello);
}

GBytes *
_cp_ucx_pack_hello (const CpUcxHello *hello)
{
  const char * const empty[] = { NULL };
  g_autoptr(GVariant) body = NULL;

  body = g_variant_ref_sink (g_variant_new ("(usii^as@ai@ay@ay@ay)", hello->protocol, hello->version,
                                            hello->rank, hello->world_size,
                                            hello->dim_names ? (const char * const *) hello->dim_names : empty,
                                            g_variant_new_fixed_array (G_VARIANT_TYPE_INT32, hello->dim_sizes,
                                                                       hello->n_dims, sizeof (gint32)),
                                            bytes_variant (hello->nonce, CP_UCX_NONCE_SIZE),
                                            bytes_variant (hello->mac, CP_UCX_MAC_SIZE),
                                            g_variant_new_from_bytes (G_VARIANT_TYPE_BYTESTRING,
                                                                      hello->address, TRUE)));
  return g_variant_get_data_as_bytes (body);
}

static gboolean
read_hello_dims (CpUcxHello  *hello,
                 GVariant    *body,
                 GError     **error)
{
  g_autoptr(GVariant) names = g_variant_get_child_value (body, 4);
  g_autoptr(GVariant) sizes = g_variant_get_child_value (body, 5);
  const gint32 *values = g_variant_get_fixed_array (sizes, &hello->n_dims, sizeof (gint32));

  hello->dim_names = g_variant_dup_strv (names, NULL);
  hello->dim_sizes = g_memdup2 (values, hello->n_dims * sizeof (gint32));
  if (g_strv_length (hello->dim_names) == hello->n_dims)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed hello: %u dimension names for %" G_GSIZE_FORMAT " sizes",
               g_strv_length (hello->dim_names), hello->n_dims);
  return FALSE;
}

static gboolean
read_hello_address (CpUcxHello  *hello,
                    GVariant    *body,
                    GError     **error)
{
  g_autoptr(GVariant) address = g_variant_get_child_value (body, 8);
  gsize size = g_variant_get_size (address);

  if (size > 0 && size <= CP_UCX_ADDRESS_MAX)
    {
      hello->address = g_variant_get_data_as_bytes (address);
      return TRUE;
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed hello: a worker address of %" G_GSIZE_FORMAT " bytes", size);
  return FALSE;
}

CpUcxHello *
_cp_ucx_parse_hello (GBytes  *payload,
                     GError **error)
{
  g_autoptr(GVariant) body = parse_variant (payload, HELLO_TYPE, "hello", error);
  g_autoptr(CpUcxHello) hello = NULL;

  if (body == NULL)
    return NULL;
  hello = g_new0 (CpUcxHello, 1);
  g_variant_get_child (body, 0, "u", &hello->protocol);
  g_variant_get_child (body, 1, "s", &hello->version);
  g_variant_get_child (body, 2, "i", &hello->rank);
  g_variant_get_child (body, 3, "i", &hello->world_size);
  if (!read_hello_dims (hello, body, error) ||
      !take_fixed_bytes (body, 6, hello->nonce, CP_UCX_NONCE_SIZE, "hello nonce", error) ||
      !take_fixed_bytes (body, 7, hello->mac, CP_UCX_MAC_SIZE, "hello proof", error) ||
      !read_hello_address (hello, body, error))
    return NULL;
  return g_steal_pointer (&hello);
}

static char *
describe_dims (char * const  *names,
               const gint32  *sizes,
               gsize          n)
{
  GString *text = g_string_new (NULL);

  for (gsize i = 0; i < n; i++)
    g_string_append_printf (text, "%s%s=%d", i ? "," : "", names[i], sizes[i]);
  return g_string_free (text, FALSE);
}

static gboolean
same_dims (const CpUcxHello   *hello,
           const CpMeshConfig *config)
{
  if (hello->n_dims != config->n_dims)
    return FALSE;
  for (gsize i = 0; i < hello->n_dims; i++)
    if (!g_str_equal (hello->dim_names[i], config->dim_names[i]) ||
        hello->dim_sizes[i] != config->dim_sizes[i])
      return FALSE;
  return TRUE;
}

/* The version and the proof of the token. */
static int
check_proof (const CpUcxHello   *hello,
             const CpMeshConfig *config,
             const guint8       *nonce,
             char              **why)
{
  guint8 expected[CP_UCX_MAC_SIZE];

  if (hello->protocol != CP_UCX_PROTOCOL_VERSION)
    {
      *why = g_strdup_printf ("it speaks rendezvous protocol %u (libcpmesh %s); rank 0 speaks %u "
                              "(libcpmesh %s)", hello->protocol, hello->version,
                              CP_UCX_PROTOCOL_VERSION, PACKAGE_VERSION);
      return CP_MESH_ERROR_UNSUPPORTED;
    }
  _cp_ucx_hello_mac (config->token, "cpmesh join", nonce, hello->nonce, hello->rank,
                     hello->world_size, expected);
  if (_cp_ucx_mac_equal (expected, hello->mac))
    return CP_UCX_ACCEPTED;
  *why = g_strdup ("it did not prove it holds the mesh token (CPMESH_TOKEN)");
  return CP_MESH_ERROR_AUTH;
}

/* Where the joiner fits in the mesh. */
static int
check_place (const CpUcxHello   *hello,
             const CpMeshConfig *config,
             const gboolean     *joined,
             char              **why)
{
  if (hello->world_size != config->world_size)
    *why = g_strdup_printf ("it was started with world size %d, rank 0 with %d", hello->world_size,
                            config->world_size);
  else if (hello->rank < 1 || hello->rank >= config->world_size)
    *why = g_strdup_printf ("rank %d is outside [1, %d); rank 0 is the listener", hello->rank,
                            config->world_size);
  else if (joined[hello->rank])
    *why = g_strdup_printf ("rank %d has already joined", hello->rank);
  else if (!same_dims (hello, config))
    {
      g_autofree char *theirs = describe_dims (hello->dim_names, hello->dim_sizes, hello->n_dims);
      g_autofree char *ours = describe_dims (config->dim_names, (const gint32 *) config->dim_sizes,
                                             config->n_dims);

      *why = g_strdup_printf ("its mesh dimensions are %s, rank 0's are %s", theirs, ours);
    }
  return *why == NULL ? CP_UCX_ACCEPTED : CP_MESH_ERROR_INVALID_TOPOLOGY;
}

int
_cp_ucx_judge_hello (const CpUcxHello   *hello,
                     const CpMeshConfig *config,
                     const guint8       *nonce,
                     const gboolean     *joined,
                     char              **why)
{
  int code = check_proof (hello, config, nonce, why);

  return code != CP_UCX_ACCEPTED ? code : check_place (hello, config, joined, why);
}

GBytes *
_cp_ucx_pack_verdict (int           code,
                      const char   *reason,
                      const guint8 *mac)
{
  g_autoptr(GVariant) body = g_variant_ref_sink (g_variant_new ("(is@ay)", code, reason,
                                                                bytes_variant (mac, mac ? CP_UCX_MAC_SIZE : 0)));

  return g_variant_get_data_as_bytes (body);
}

gboolean
_cp_ucx_parse_verdict (GBytes  *payload,
                       int     *code,
                       char   **reason,
                       guint8   mac[CP_UCX_MAC_SIZE],
                       GError **error)
{
  g_autoptr(GVariant) body = parse_variant (payload, VERDICT_TYPE, "verdict", error);

  if (body == NULL)
    return FALSE;
  g_variant_get_child (body, 0, "i", code);
  if (*code == CP_UCX_ACCEPTED)
    return take_fixed_bytes (body, 2, mac, CP_UCX_MAC_SIZE, "acceptance proof", error);
  if (*code < CP_MESH_ERROR_FAILED || *code > CP_MESH_ERROR_NO_DEVICE)
    *code = CP_MESH_ERROR_FAILED;
  g_variant_get_child (body, 1, "s", reason);
  return TRUE;
}

GBytes *
_cp_ucx_pack_table (GBytes * const *addresses,
                    int             n)
{
  GVariantBuilder builder;
  g_autoptr(GVariant) table = NULL;

  g_variant_builder_init (&builder, G_VARIANT_TYPE (TABLE_TYPE));
  for (int r = 0; r < n; r++)
    g_variant_builder_add_value (&builder, g_variant_new_from_bytes (G_VARIANT_TYPE_BYTESTRING,
                                                                     addresses[r], TRUE));
  table = g_variant_ref_sink (g_variant_builder_end (&builder));
  return g_variant_get_data_as_bytes (table);
}

GPtrArray *
_cp_ucx_parse_table (GBytes  *payload,
                     int      world_size,
                     GError **error)
{
  g_autoptr(GVariant) table = parse_variant (payload, TABLE_TYPE, "address table", error);
  g_autoptr(GPtrArray) addresses = NULL;

  if (table == NULL)
    return NULL;
  if (g_variant_n_children (table) != (gsize) world_size)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "rank 0 sent %" G_GSIZE_FORMAT " worker addresses for %d ranks",
                   g_variant_n_children (table), world_size);
      return NULL;
    }
  addresses = g_ptr_array_new_with_free_func ((GDestroyNotify) g_bytes_unref);
  for (int r = 0; r < world_size; r++)
    {
      g_autoptr(GVariant) address = g_variant_get_child_value (table, (gsize) r);
      gsize size = g_variant_get_size (address);

      if (size == 0 || size > CP_UCX_ADDRESS_MAX)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                       "rank 0 sent a worker address of %" G_GSIZE_FORMAT " bytes for rank %d",
                       size, r);
          return NULL;
        }
      g_ptr_array_add (addresses, g_variant_get_data_as_bytes (address));
    }
  return g_steal_pointer (&addresses);
}

/* ---- descriptors and point-to-point headers ---- */

GBytes *
_cp_ucx_pack_descriptor (const CpCollective *coll)
{
  g_autofree char *text = NULL;
  const GError *invalid = coll->invalid;
  g_autoptr(GVariant) variant = NULL;

  if (invalid != NULL)
    text = g_utf8_make_valid (invalid->message, MIN (strlen (invalid->message), MESSAGE_TEXT_MAX));
  variant = g_variant_new ("(uu@axiiubsis)", coll->kind, coll->dtype,
                           g_variant_new_fixed_array (G_VARIANT_TYPE_INT64, coll->shape, coll->n_dims,
                                                      sizeof (gint64)),
                           coll->dim, coll->root, coll->op, invalid != NULL,
                           invalid ? g_quark_to_string (invalid->domain) : "",
                           invalid ? invalid->code : 0, text ? text : "");
  g_variant_ref_sink (variant);
  return g_variant_get_data_as_bytes (variant);
}

/* The library's error domains, or one this process knows already. */
static GQuark
known_domain (const char *domain)
{
  const GQuark library[] = { CP_TENSOR_ERROR, CP_MESH_ERROR, CP_BATCH_ERROR, CP_ATTENTION_ERROR };

  for (guint i = 0; i < G_N_ELEMENTS (library); i++)
    if (g_str_equal (g_quark_to_string (library[i]), domain))
      return library[i];
  return g_quark_try_string (domain);
}

/* The error a peer's own arguments raised.  Its domain is one this
 * process knows, or the message is kept under CP_MESH_ERROR_FAILED: a
 * peer never makes this process intern new strings. */
static GError *
peer_error (const char *domain,
            int         code,
            const char *message)
{
  GQuark quark = known_domain (domain);

  if (quark != 0)
    return g_error_new_literal (quark, code, message);
  return g_error_new (CP_MESH_ERROR, CP_MESH_ERROR_FAILED, "%s (error %d of domain \"%s\")",
                      message, code, domain);
}

gboolean
_cp_ucx_unpack_descriptor (const guint8  *data,
                           gsize          length,
                           CpCollective  *coll,
                           GError       **error)
{
  g_autoptr(GBytes) bytes = g_bytes_new (data, length);
  g_autoptr(GVariant) variant = parse_variant (bytes, DESCRIPTOR_TYPE, "descriptor", error);
  g_autoptr(GVariant) shape = NULL;
  const char *domain, *message;
  gboolean has_invalid;
  gsize n_dims = 0;
  const gint64 *dims;
  int code;

  memset (coll, 0, sizeof *coll);
  if (variant == NULL)
    return FALSE;
  g_variant_get (variant, "(uu@axiiub&si&s)", &coll->kind, &coll->dtype, &shape, &coll->dim,
                 &coll->root, &coll->op, &has_invalid, &domain, &code, &message);
  dims = g_variant_get_fixed_array (shape, &n_dims, sizeof (gint64));
  if (n_dims > CP_TENSOR_MAX_DIMS || coll->kind > CP_COLL_BROADCAST || coll->dtype > CP_DTYPE_FLOAT64)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "a descriptor out of range: collective %u, dtype %u, %" G_GSIZE_FORMAT " dimensions",
                   coll->kind, coll->dtype, n_dims);
      return FALSE;
    }
  coll->n_dims = (guint) n_dims;
  /* A 0-d shape comes back as NULL, which memcpy must never see. */
  if (n_dims > 0)
    memcpy (coll->shape, dims, n_dims * sizeof (gint64));
  if (has_invalid)
    coll->invalid = peer_error (domain, code, message);
  return TRUE;
}

void
_cp_ucx_wire_from_message (CpUcxWireMessage *wire,
                           const CpMessage  *message)
{
  memset (wire, 0, sizeof *wire);
  wire->dtype = message->dtype;
  wire->n_dims = message->n_dims;
  wire->nbytes = message->nbytes;
  memcpy (wire->shape, message->shape, message->n_dims * sizeof (gint64));
}

void
_cp_ucx_message_from_wire (CpMessage              *message,
                           const CpUcxWireMessage *wire)
{
  memset (message, 0, sizeof *message);
  message->dtype = MIN (wire->dtype, CP_DTYPE_FLOAT64);
  message->n_dims = MIN (wire->n_dims, CP_TENSOR_MAX_DIMS);
  message->nbytes = wire->nbytes;
  memcpy (message->shape, wire->shape, message->n_dims * sizeof (gint64));
}
