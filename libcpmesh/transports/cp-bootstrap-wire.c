/* cp-bootstrap-wire.c: packing and parsing what ranks say while they meet
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "cp-bootstrap-private.h"
#include "cp-error.h"

/* Bodies are serialized GVariants.  GLib reads a GVariant of untrusted
 * bytes safely, but fills whatever does not fit its type with defaults; a
 * body that is not in normal form is therefore refused before any field
 * is read. */

#define OFFER_TYPE "a{say}"
#define HELLO_TYPE "(usiiasaiay" OFFER_TYPE ")"
#define VERDICT_TYPE "(is)"
#define TABLE_TYPE "(isa" OFFER_TYPE ")"
#define REASON_MAX 2048

/* ---- proofs ---- */

gboolean
_cp_bootstrap_fill_nonce (guint8  *nonce,
                          GError **error)
{
  if (getrandom (nonce, CP_BOOTSTRAP_NONCE_SIZE, 0) == CP_BOOTSTRAP_NONCE_SIZE)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_FAILED,
               "rendezvous: no random bytes for a challenge: %s", g_strerror (errno));
  return FALSE;
}

void
_cp_bootstrap_sign (const char   *token,
                    const char   *purpose,
                    const guint8 *challenge,
                    const guint8 *nonce,
                    GBytes       *body,
                    guint8        mac[CP_BOOTSTRAP_MAC_SIZE])
{
  g_autoptr(GHmac) hmac = g_hmac_new (G_CHECKSUM_SHA256, (const guchar *) (token ? token : ""),
                                      token ? strlen (token) : 0);
  gsize size = 0;
  const guint8 *data = g_bytes_get_data (body, &size);
  gsize mac_length = CP_BOOTSTRAP_MAC_SIZE;

  g_hmac_update (hmac, (const guchar *) purpose, (gssize) strlen (purpose) + 1);
  g_hmac_update (hmac, challenge, CP_BOOTSTRAP_NONCE_SIZE);
  g_hmac_update (hmac, nonce, CP_BOOTSTRAP_NONCE_SIZE);
  g_hmac_update (hmac, data, (gssize) size);
  g_hmac_get_digest (hmac, mac, &mac_length);
}

gboolean
_cp_bootstrap_mac_equal (const guint8 *a,
                         const guint8 *b)
{
  guint8 difference = 0;

  for (gsize i = 0; i < CP_BOOTSTRAP_MAC_SIZE; i++)
    difference |= a[i] ^ b[i];
  return difference == 0;
}

GBytes *
_cp_bootstrap_prove (const char   *token,
                     const char   *purpose,
                     const guint8 *challenge,
                     const guint8 *nonce,
                     GBytes       *body)
{
  gsize size = g_bytes_get_size (body);
  guint8 *payload = g_malloc (size + CP_BOOTSTRAP_MAC_SIZE);

  if (size > 0)
    memcpy (payload, g_bytes_get_data (body, NULL), size);
  _cp_bootstrap_sign (token, purpose, challenge, nonce, body, payload + size);
  return g_bytes_new_take (payload, size + CP_BOOTSTRAP_MAC_SIZE);
}

/* Splits @payload into its body and proof. */
static GBytes *
split_proof (GBytes      *payload,
             guint8       mac[CP_BOOTSTRAP_MAC_SIZE],
             const char  *what,
             GError     **error)
{
  gsize size = g_bytes_get_size (payload);

  if (size < CP_BOOTSTRAP_MAC_SIZE)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "a malformed %s: %" G_GSIZE_FORMAT " bytes, too few for its proof", what, size);
      return NULL;
    }
  memcpy (mac, (const guint8 *) g_bytes_get_data (payload, NULL) + size - CP_BOOTSTRAP_MAC_SIZE,
          CP_BOOTSTRAP_MAC_SIZE);
  return g_bytes_new_from_bytes (payload, 0, size - CP_BOOTSTRAP_MAC_SIZE);
}

static gboolean
check_proof (const char   *token,
             const char   *purpose,
             const guint8 *challenge,
             const guint8 *nonce,
             GBytes       *body,
             const guint8 *mac)
{
  guint8 expected[CP_BOOTSTRAP_MAC_SIZE];

  _cp_bootstrap_sign (token, purpose, challenge, nonce, body, expected);
  return _cp_bootstrap_mac_equal (expected, mac);
}

/* ---- greeting and frames ---- */

void
_cp_bootstrap_pack_greeting (const guint8 *challenge,
                             guint8        greeting[CP_BOOTSTRAP_GREETING_SIZE])
{
  memcpy (greeting, CP_BOOTSTRAP_MAGIC, CP_BOOTSTRAP_MAGIC_SIZE);
  greeting[CP_BOOTSTRAP_MAGIC_SIZE] = CP_BOOTSTRAP_PROTOCOL_VERSION;
  memcpy (greeting + CP_BOOTSTRAP_MAGIC_SIZE + 1, challenge, CP_BOOTSTRAP_NONCE_SIZE);
}

gboolean
_cp_bootstrap_parse_greeting (const guint8  *data,
                              gsize          length,
                              const char    *where,
                              guint8         challenge[CP_BOOTSTRAP_NONCE_SIZE],
                              GError       **error)
{
  guint8 protocol;

  if (length != CP_BOOTSTRAP_GREETING_SIZE || memcmp (data, CP_BOOTSTRAP_MAGIC, CP_BOOTSTRAP_MAGIC_SIZE) != 0)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "%s is not the rendezvous of a libcpmesh rank 0: it greeted with other bytes", where);
      return FALSE;
    }
  protocol = data[CP_BOOTSTRAP_MAGIC_SIZE];
  if (protocol != CP_BOOTSTRAP_PROTOCOL_VERSION)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                   "rank 0 at %s speaks rendezvous protocol %u, this process %u: run the same "
                   "libcpmesh on every rank", where, protocol, CP_BOOTSTRAP_PROTOCOL_VERSION);
      return FALSE;
    }
  memcpy (challenge, data + CP_BOOTSTRAP_MAGIC_SIZE + 1, CP_BOOTSTRAP_NONCE_SIZE);
  return TRUE;
}

gboolean
_cp_bootstrap_parse_frame_head (const guint8  *head,
                                gsize          max,
                                const char    *what,
                                gsize         *length,
                                GError       **error)
{
  guint32 announced = (guint32) head[0] << 24 | (guint32) head[1] << 16 | (guint32) head[2] << 8 | head[3];

  if (announced >= 1 && announced <= max)
    {
      *length = announced;
      return TRUE;
    }
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed %s: it announces %u bytes, not 1 to %" G_GSIZE_FORMAT, what, announced, max);
  return FALSE;
}

GBytes *
_cp_bootstrap_frame (GBytes *payload)
{
  gsize size = g_bytes_get_size (payload);
  guint8 *frame = g_malloc (CP_BOOTSTRAP_FRAME_HEAD + size);

  g_assert (size <= G_MAXUINT32);
  frame[0] = (guint8) (size >> 24);
  frame[1] = (guint8) (size >> 16);
  frame[2] = (guint8) (size >> 8);
  frame[3] = (guint8) size;
  if (size > 0)
    memcpy (frame + CP_BOOTSTRAP_FRAME_HEAD, g_bytes_get_data (payload, NULL), size);
  return g_bytes_new_take (frame, CP_BOOTSTRAP_FRAME_HEAD + size);
}

/* ---- bodies ---- */

static GVariant *
bytes_variant (const guint8 *data,
               gsize         length)
{
  return g_variant_new_fixed_array (G_VARIANT_TYPE_BYTE, data, length, 1);
}

static GBytes *
variant_bytes (GVariant *floating)
{
  g_autoptr(GVariant) variant = g_variant_ref_sink (floating);

  return g_variant_get_data_as_bytes (variant);
}

/* @body as a GVariant of @type, or NULL when it is not one. */
static GVariant *
parse_variant (GBytes      *body,
               const char  *type,
               const char  *what,
               GError     **error)
{
  g_autoptr(GVariant) variant = g_variant_ref_sink (g_variant_new_from_bytes (G_VARIANT_TYPE (type),
                                                                              body, FALSE));

  if (g_variant_is_normal_form (variant))
    return g_steal_pointer (&variant);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed %s: %" G_GSIZE_FORMAT " bytes that are not a %s message", what,
               g_bytes_get_size (body), type);
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

/* ---- offers ---- */

typedef struct
{
  char *name;
  GBytes *blob;
} Entry;

struct _CpBootstrapOffer
{
  GArray *entries;    /* Entry, by name in byte order */
};

static void
entry_clear (Entry *entry)
{
  g_free (entry->name);
  g_bytes_unref (entry->blob);
}

static void
offer_clear (CpBootstrapOffer *offer)
{
  g_array_unref (offer->entries);
}

CpBootstrapOffer *
_cp_bootstrap_offer_new (void)
{
  CpBootstrapOffer *offer = g_rc_box_new0 (CpBootstrapOffer);

  offer->entries = g_array_new (FALSE, FALSE, sizeof (Entry));
  g_array_set_clear_func (offer->entries, (GDestroyNotify) entry_clear);
  return offer;
}

CpBootstrapOffer *
_cp_bootstrap_offer_ref (CpBootstrapOffer *offer)
{
  return g_rc_box_acquire (offer);
}

void
_cp_bootstrap_offer_unref (CpBootstrapOffer *offer)
{
  g_rc_box_release_full (offer, (GDestroyNotify) offer_clear);
}

/* Names are short words a log shows as they are. */
static gboolean
is_valid_name (const char *name)
{
  gsize length = strlen (name);

  if (length == 0 || length > CP_BOOTSTRAP_NAME_MAX)
    return FALSE;
  for (gsize i = 0; i < length; i++)
    if (!g_ascii_islower (name[i]) && !g_ascii_isdigit (name[i]) && name[i] != '_' && name[i] != '-')
      return FALSE;
  return TRUE;
}

/* Where @name is, or belongs, in @offer. */
static guint
find_place (const CpBootstrapOffer *offer,
            const char             *name,
            gboolean               *found)
{
  guint i = 0;

  while (i < offer->entries->len && strcmp (g_array_index (offer->entries, Entry, i).name, name) < 0)
    i++;
  *found = i < offer->entries->len && g_str_equal (g_array_index (offer->entries, Entry, i).name, name);
  return i;
}

void
_cp_bootstrap_offer_add (CpBootstrapOffer *offer,
                         const char       *backend,
                         GBytes           *blob)
{
  gboolean found = FALSE;
  guint i;
  Entry entry;

  g_return_if_fail (is_valid_name (backend));
  g_return_if_fail (blob != NULL);

  i = find_place (offer, backend, &found);
  if (found)
    {
      Entry *old = &g_array_index (offer->entries, Entry, i);

      g_bytes_unref (old->blob);
      old->blob = g_bytes_ref (blob);
      return;
    }
  entry = (Entry) { g_strdup (backend), g_bytes_ref (blob) };
  g_array_insert_val (offer->entries, i, entry);
}

GBytes *
_cp_bootstrap_offer_lookup (const CpBootstrapOffer *offer,
                            const char             *backend)
{
  gboolean found = FALSE;
  guint i = find_place (offer, backend, &found);

  return found ? g_array_index (offer->entries, Entry, i).blob : NULL;
}

guint
_cp_bootstrap_offer_get_n_blobs (const CpBootstrapOffer *offer)
{
  return offer->entries->len;
}

const char *
_cp_bootstrap_offer_get_name (const CpBootstrapOffer *offer,
                              guint                   i)
{
  g_return_val_if_fail (i < offer->entries->len, NULL);

  return g_array_index (offer->entries, Entry, i).name;
}

GBytes *
_cp_bootstrap_offer_get_blob (const CpBootstrapOffer *offer,
                              guint                   i)
{
  g_return_val_if_fail (i < offer->entries->len, NULL);

  return g_array_index (offer->entries, Entry, i).blob;
}

char *
_cp_bootstrap_offer_describe (const CpBootstrapOffer *offer)
{
  GString *text = g_string_new (NULL);

  for (guint i = 0; i < offer->entries->len; i++)
    g_string_append_printf (text, "%s%s", i > 0 ? ", " : "", g_array_index (offer->entries, Entry, i).name);
  if (text->len == 0)
    g_string_append (text, "nothing");
  return g_string_free (text, FALSE);
}

GBytes **
_cp_bootstrap_table_blobs (GPtrArray  *table,
                           const char *backend,
                           guint      *n_missing,
                           int        *first_missing)
{
  GBytes **blobs = g_new0 (GBytes *, MAX (table->len, 1));
  guint missing = 0;
  int first = -1;

  for (guint r = 0; r < table->len; r++)
    {
      blobs[r] = _cp_bootstrap_offer_lookup (g_ptr_array_index (table, r), backend);
      if (blobs[r] == NULL && missing++ == 0)
        first = (int) r;
    }
  if (n_missing != NULL)
    *n_missing = missing;
  if (first_missing != NULL)
    *first_missing = first;
  return blobs;
}

static GVariant *
offer_variant (const CpBootstrapOffer *offer)
{
  GVariantBuilder builder;

  g_variant_builder_init (&builder, G_VARIANT_TYPE (OFFER_TYPE));
  for (guint i = 0; offer != NULL && i < offer->entries->len; i++)
    {
      const Entry *entry = &g_array_index (offer->entries, Entry, i);

      g_variant_builder_add (&builder, "{s@ay}", entry->name,
                             g_variant_new_from_bytes (G_VARIANT_TYPE_BYTESTRING, entry->blob, TRUE));
    }
  return g_variant_builder_end (&builder);
}

/* The blob of one entry: 1 byte to CP_BOOTSTRAP_BLOB_MAX. */
static GBytes *
take_blob (GVariant    *blob,
           const char  *what,
           const char  *backend,
           GError     **error)
{
  gsize size = g_variant_get_size (blob);

  if (size > 0 && size <= CP_BOOTSTRAP_BLOB_MAX)
    return g_variant_get_data_as_bytes (blob);
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed %s: a %s blob of %" G_GSIZE_FORMAT " bytes, not 1 to %d", what, backend, size,
               CP_BOOTSTRAP_BLOB_MAX);
  return NULL;
}

/* The name of one entry, valid and after @previous in byte order, so
 * that an offer names each backend once and has one encoding. */
static gboolean
check_entry_name (const char  *name,
                  const char  *previous,
                  const char  *what,
                  GError     **error)
{
  g_autofree char *shown = NULL;

  if (is_valid_name (name) && (previous == NULL || strcmp (previous, name) < 0))
    return TRUE;
  shown = _cp_mesh_escape_text (name, MIN (strlen (name), 2 * CP_BOOTSTRAP_NAME_MAX));
  if (!is_valid_name (name))
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                 "a malformed %s: the backend name \"%s\" is not 1 to %d of a-z, 0-9, _ and -", what, shown,
                 CP_BOOTSTRAP_NAME_MAX);
  else
    g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                 "a malformed %s: the backend \"%s\" comes after \"%s\" (names must be unique, in byte order)",
                 what, shown, previous);
  return FALSE;
}

/* An offer as a GVariant of OFFER_TYPE holds it, within its limits. */
static CpBootstrapOffer *
take_offer (GVariant    *variant,
            const char  *what,
            GError     **error)
{
  g_autoptr(CpBootstrapOffer) offer = _cp_bootstrap_offer_new ();
  gsize n = g_variant_n_children (variant);
  gsize total = 0;
  const char *previous = NULL;

  if (n > CP_BOOTSTRAP_MAX_BACKENDS)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "a malformed %s: an offer of %" G_GSIZE_FORMAT " backends, more than %d", what, n,
                   CP_BOOTSTRAP_MAX_BACKENDS);
      return NULL;
    }
  for (gsize i = 0; i < n; i++)
    {
      g_autoptr(GVariant) entry = g_variant_get_child_value (variant, i);
      g_autoptr(GVariant) key = g_variant_get_child_value (entry, 0);
      g_autoptr(GVariant) value = g_variant_get_child_value (entry, 1);
      const char *name = g_variant_get_string (key, NULL);
      g_autoptr(GBytes) blob = NULL;
      Entry taken;

      if (!check_entry_name (name, previous, what, error) || (blob = take_blob (value, what, name, error)) == NULL)
        return NULL;
      total += g_bytes_get_size (blob);
      if (total > CP_BOOTSTRAP_OFFER_MAX)
        {
          g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                       "a malformed %s: an offer whose blobs hold more than %d bytes together (%s takes it "
                       "to %" G_GSIZE_FORMAT ")", what, CP_BOOTSTRAP_OFFER_MAX, name, total);
          return NULL;
        }
      taken = (Entry) { g_strdup (name), g_steal_pointer (&blob) };
      g_array_append_val (offer->entries, taken);
      previous = taken.name;
    }
  return g_steal_pointer (&offer);
}

gboolean
_cp_bootstrap_check_blob (const CpBootstrapCheck *checks,
                          guint                   n_checks,
                          const char             *backend,
                          GBytes                 *blob,
                          GError                **error)
{
  for (guint i = 0; i < n_checks; i++)
    if (g_str_equal (checks[i].backend, backend))
      return checks[i].check == NULL || checks[i].check (blob, checks[i].check_data, error);
  return TRUE;
}

/* Splits @payload into its body, a GVariant of @type, and its proof. */
static GVariant *
open_payload (GBytes      *payload,
              const char  *type,
              const char  *what,
              GBytes     **body,
              guint8       mac[CP_BOOTSTRAP_MAC_SIZE],
              GError     **error)
{
  *body = split_proof (payload, mac, what, error);
  return *body != NULL ? parse_variant (*body, type, what, error) : NULL;
}

/* ---- hello ---- */

void
_cp_bootstrap_hello_free (CpBootstrapHello *hello)
{
  if (hello == NULL)
    return;
  g_free (hello->version);
  g_strfreev (hello->dim_names);
  g_free (hello->dim_sizes);
  g_clear_pointer (&hello->offer, _cp_bootstrap_offer_unref);
  g_clear_pointer (&hello->body, g_bytes_unref);
  g_free (hello);
}

GBytes *
_cp_bootstrap_pack_hello_body (const CpBootstrapHello *hello)
{
  const char * const empty[] = { NULL };

  return variant_bytes (g_variant_new ("(usii^as@ai@ay@" OFFER_TYPE ")", hello->protocol, hello->version,
                                       hello->rank,
                                       hello->world_size,
                                       hello->dim_names ? (const char * const *) hello->dim_names : empty,
                                       g_variant_new_fixed_array (G_VARIANT_TYPE_INT32, hello->dim_sizes,
                                                                  hello->n_dims, sizeof (gint32)),
                                       bytes_variant (hello->nonce, CP_BOOTSTRAP_NONCE_SIZE),
                                       offer_variant (hello->offer)));
}

GBytes *
_cp_bootstrap_pack_hello (const CpMeshConfig *config,
                          const guint8       *challenge,
                          const guint8       *nonce,
                          const CpBootstrapOffer *offer)
{
  CpBootstrapHello hello = {
    .protocol = CP_BOOTSTRAP_PROTOCOL_VERSION,
    .version = (char *) PACKAGE_VERSION,
    .rank = config->rank,
    .world_size = config->world_size,
    .dim_names = config->dim_names,
    .dim_sizes = (gint32 *) config->dim_sizes,
    .n_dims = config->n_dims,
    .offer = (CpBootstrapOffer *) offer,
  };
  g_autoptr(GBytes) body = NULL;

  memcpy (hello.nonce, nonce, CP_BOOTSTRAP_NONCE_SIZE);
  body = _cp_bootstrap_pack_hello_body (&hello);
  return _cp_bootstrap_prove (config->token, "cpmesh join", challenge, nonce, body);
}

static gboolean
read_hello_dims (CpBootstrapHello  *hello,
                 GVariant          *body,
                 GError           **error)
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

CpBootstrapHello *
_cp_bootstrap_parse_hello (GBytes  *payload,
                           GError **error)
{
  g_autoptr(CpBootstrapHello) hello = g_new0 (CpBootstrapHello, 1);
  g_autoptr(GVariant) body = open_payload (payload, HELLO_TYPE, "hello", &hello->body, hello->mac, error);
  g_autoptr(GVariant) offer = NULL;

  if (body == NULL)
    return NULL;
  g_variant_get_child (body, 0, "u", &hello->protocol);
  g_variant_get_child (body, 1, "s", &hello->version);
  g_variant_get_child (body, 2, "i", &hello->rank);
  g_variant_get_child (body, 3, "i", &hello->world_size);
  offer = g_variant_get_child_value (body, 7);
  if (!read_hello_dims (hello, body, error) ||
      !take_fixed_bytes (body, 6, hello->nonce, CP_BOOTSTRAP_NONCE_SIZE, "hello nonce", error) ||
      (hello->offer = take_offer (offer, "hello", error)) == NULL)
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
same_dims (const CpBootstrapHello *hello,
           const CpMeshConfig     *config)
{
  if (hello->n_dims != config->n_dims)
    return FALSE;
  for (gsize i = 0; i < hello->n_dims; i++)
    if (!g_str_equal (hello->dim_names[i], config->dim_names[i]) ||
        hello->dim_sizes[i] != config->dim_sizes[i])
      return FALSE;
  return TRUE;
}

/* The version and the proof of the token.  The visitor has proved
 * nothing yet: it learns rank 0's protocol (the greeting says it anyway)
 * but not which libcpmesh rank 0 runs; rank 0's log keeps the version
 * the visitor claims. */
static int
check_credentials (const CpBootstrapHello *hello,
                   const CpMeshConfig     *config,
                   const guint8           *challenge,
                   char                  **why)
{
  if (hello->protocol != CP_BOOTSTRAP_PROTOCOL_VERSION)
    {
      g_autofree char *claimed = _cp_mesh_escape_text (hello->version, -1);

      g_debug ("rendezvous: a visitor speaking protocol %u claims libcpmesh %s", hello->protocol, claimed);
      *why = g_strdup_printf ("it speaks rendezvous protocol %u; rank 0 speaks %u: run the same libcpmesh "
                              "on every rank", hello->protocol, CP_BOOTSTRAP_PROTOCOL_VERSION);
      return CP_MESH_ERROR_UNSUPPORTED;
    }
  if (check_proof (config->token, "cpmesh join", challenge, hello->nonce, hello->body, hello->mac))
    return CP_BOOTSTRAP_ACCEPTED;
  *why = g_strdup ("it did not prove it holds the mesh token (CPMESH_TOKEN)");
  return CP_MESH_ERROR_AUTH;
}

/* Where the joiner fits in the mesh. */
static int
check_place (const CpBootstrapHello *hello,
             const CpMeshConfig     *config,
             const gboolean         *joined,
             char                  **why)
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
  return *why == NULL ? CP_BOOTSTRAP_ACCEPTED : CP_MESH_ERROR_INVALID_TOPOLOGY;
}

int
_cp_bootstrap_judge_hello (const CpBootstrapHello *hello,
                           const CpMeshConfig     *config,
                           const guint8           *challenge,
                           const gboolean         *joined,
                           char                  **why)
{
  int code = check_credentials (hello, config, challenge, why);

  return code != CP_BOOTSTRAP_ACCEPTED ? code : check_place (hello, config, joined, why);
}

/* ---- verdict and table ---- */

/* A code off the wire: an acceptance, or a CpMeshError code. */
static int
clamp_code (int code)
{
  if (code == CP_BOOTSTRAP_ACCEPTED || (code >= CP_MESH_ERROR_FAILED && code <= CP_MESH_ERROR_NO_DEVICE))
    return code;
  return CP_MESH_ERROR_FAILED;
}

static char *
clip_reason (const char *reason)
{
  return g_utf8_make_valid (reason, MIN (strlen (reason), REASON_MAX));
}

GBytes *
_cp_bootstrap_pack_verdict (const char   *token,
                            const guint8 *challenge,
                            const guint8 *nonce,
                            int           code,
                            const char   *reason)
{
  g_autofree char *text = clip_reason (reason);
  g_autoptr(GBytes) body = variant_bytes (g_variant_new (VERDICT_TYPE, code, text));

  return _cp_bootstrap_prove (token, "cpmesh verdict", challenge, nonce, body);
}

gboolean
_cp_bootstrap_parse_verdict (GBytes        *payload,
                             const char    *token,
                             const guint8  *challenge,
                             const guint8  *nonce,
                             const char    *where,
                             GError       **error)
{
  guint8 mac[CP_BOOTSTRAP_MAC_SIZE];
  g_autoptr(GBytes) body = NULL;
  g_autoptr(GVariant) verdict = open_payload (payload, VERDICT_TYPE, "verdict", &body, mac, error);
  const char *reason = NULL;
  int code = 0;

  if (verdict == NULL)
    return FALSE;
  g_variant_get (verdict, "(i&s)", &code, &reason);
  code = clamp_code (code);
  if (code != CP_BOOTSTRAP_ACCEPTED)
    {
      /* Whoever listens on the port wrote it, token or not. */
      g_autofree char *shown = _cp_mesh_escape_text (reason, MIN (strlen (reason), REASON_MAX));

      g_set_error (error, CP_MESH_ERROR, code, "rank 0 at %s refused this process: %s", where,
                   *shown != '\0' ? shown : "it gave no reason");
      return FALSE;
    }
  if (check_proof (token, "cpmesh verdict", challenge, nonce, body, mac))
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_AUTH,
               "the process listening at %s did not prove it holds the mesh token (CPMESH_TOKEN)", where);
  return FALSE;
}

/* What one rank's offer takes in a table at most: its blobs, and per
 * entry a name, its NUL, the entry's framing and alignment. */
#define OFFER_ENTRY_OVERHEAD (CP_BOOTSTRAP_NAME_MAX + 16)

gsize
_cp_bootstrap_table_max (int world_size)
{
  return (gsize) MAX (world_size, 1) * (CP_BOOTSTRAP_OFFER_MAX + CP_BOOTSTRAP_MAX_BACKENDS * OFFER_ENTRY_OVERHEAD + 8)
         + CP_BOOTSTRAP_VERDICT_MAX;
}

static GBytes *
pack_table_body (int                       code,
                 const char               *reason,
                 CpBootstrapOffer * const *offers,
                 int                       n)
{
  GVariantBuilder builder;
  g_autofree char *text = clip_reason (reason);

  g_variant_builder_init (&builder, G_VARIANT_TYPE ("a" OFFER_TYPE));
  for (int r = 0; r < n; r++)
    g_variant_builder_add_value (&builder, offer_variant (offers[r]));
  return variant_bytes (g_variant_new (TABLE_TYPE, code, text, &builder));
}

GBytes *
_cp_bootstrap_pack_table (const char               *token,
                          const guint8             *challenge,
                          const guint8             *nonce,
                          CpBootstrapOffer * const *offers,
                          int                       n)
{
  g_autoptr(GBytes) body = pack_table_body (CP_BOOTSTRAP_ACCEPTED, "", offers, n);

  return _cp_bootstrap_prove (token, "cpmesh table", challenge, nonce, body);
}

GBytes *
_cp_bootstrap_pack_failure (const char   *token,
                            const guint8 *challenge,
                            const guint8 *nonce,
                            const GError *failure)
{
  int code = failure->domain == CP_MESH_ERROR ? failure->code : CP_MESH_ERROR_FAILED;
  g_autoptr(GBytes) body = pack_table_body (clamp_code (code), failure->message, NULL, 0);

  return _cp_bootstrap_prove (token, "cpmesh table", challenge, nonce, body);
}

static GPtrArray *
take_offers (GVariant    *table,
             int          world_size,
             GError     **error)
{
  g_autoptr(GVariant) list = g_variant_get_child_value (table, 2);
  g_autoptr(GPtrArray) offers = g_ptr_array_new_with_free_func ((GDestroyNotify) _cp_bootstrap_offer_unref);

  if (g_variant_n_children (list) != (gsize) world_size)
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "a malformed address table: %" G_GSIZE_FORMAT " offers for %d ranks",
                   g_variant_n_children (list), world_size);
      return NULL;
    }
  for (int r = 0; r < world_size; r++)
    {
      g_autoptr(GVariant) child = g_variant_get_child_value (list, (gsize) r);
      g_autofree char *what = g_strdup_printf ("address table (rank %d's offer)", r);
      CpBootstrapOffer *offer = take_offer (child, what, error);

      if (offer == NULL)
        return NULL;
      g_ptr_array_add (offers, offer);
    }
  return g_steal_pointer (&offers);
}

GPtrArray *
_cp_bootstrap_parse_table (GBytes        *payload,
                           const char    *token,
                           const guint8  *challenge,
                           const guint8  *nonce,
                           int            world_size,
                           const char    *where,
                           GError       **error)
{
  guint8 mac[CP_BOOTSTRAP_MAC_SIZE];
  g_autoptr(GBytes) body = NULL;
  g_autoptr(GVariant) table = open_payload (payload, TABLE_TYPE, "address table", &body, mac, error);
  g_autofree char *shown = NULL;
  const char *reason = NULL;
  int code = 0;

  if (table == NULL)
    return NULL;
  if (!check_proof (token, "cpmesh table", challenge, nonce, body, mac))
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_AUTH,
                   "the address table from %s does not prove it comes from a holder of the mesh "
                   "token (CPMESH_TOKEN)", where);
      return NULL;
    }
  g_variant_get_child (table, 0, "i", &code);
  g_variant_get_child (table, 1, "&s", &reason);
  code = clamp_code (code);
  /* An acceptance says nothing more: one with a reason is not one rank 0
   * packs, and is refused like any other malformed table. */
  if (code == CP_BOOTSTRAP_ACCEPTED && *reason != '\0')
    {
      g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
                   "a malformed address table from %s: an acceptance that gives a reason", where);
      return NULL;
    }
  if (code == CP_BOOTSTRAP_ACCEPTED)
    return take_offers (table, world_size, error);
  shown = _cp_mesh_escape_text (reason, MIN (strlen (reason), REASON_MAX));
  g_set_error (error, CP_MESH_ERROR, code, "rank 0 at %s gave up: %s", where,
               *shown != '\0' ? shown : "it gave no reason");
  return NULL;
}
