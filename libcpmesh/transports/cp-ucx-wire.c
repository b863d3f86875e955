/* cp-ucx-wire.c: packing and parsing what UCX ranks exchange
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-error.h"
#include "cp-ucx-wire-private.h"

/* Descriptors are serialized GVariants.  GLib reads a GVariant of
 * untrusted bytes safely, but fills whatever does not fit its type with
 * defaults; a message that is not in normal form is therefore refused
 * before any field is read. */

#define DESCRIPTOR_TYPE "(uuaxiiubsis)"
#define MESSAGE_TEXT_MAX 2048

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
