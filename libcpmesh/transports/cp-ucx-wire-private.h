/* cp-ucx-wire-private.h: what UCX ranks say to each other, byte by byte
 *
 * Every message a rank of the UCX backend reads from a peer goes through
 * one of these parsers before anything else looks at it: the descriptor
 * of a collective and the header of a point-to-point message (what ranks
 * say while they meet is in cp-bootstrap-private.h).  They take arbitrary
 * bytes; anything malformed is a GError naming what is wrong, never a
 * crash, an assertion or a read past the bytes given.  They need no UCX,
 * so fuzz/fuzz-wire.c feeds them directly.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

#include "cp-mesh-config-private.h"
#include "cp-transport-private.h"

G_BEGIN_DECLS

/* The receive slot of one descriptor: a packed descriptor never exceeds it. */
#define CP_UCX_DESCRIPTOR_MAX 4096

/* ---- collectives and point-to-point messages (cp-transport-ucx.c) ---- */

GBytes     *_cp_ucx_pack_descriptor    (const CpCollective *coll);
/* Fills @coll (and its invalid error) from what a peer sent. */
gboolean    _cp_ucx_unpack_descriptor  (const guint8       *data,
                                        gsize               length,
                                        CpCollective       *coll,
                                        GError            **error);

/* What a point-to-point header and acknowledgement carry. */
typedef struct
{
  guint32 dtype;
  guint32 n_dims;
  guint64 nbytes;
  gint64 shape[CP_TENSOR_MAX_DIMS];
} CpUcxWireMessage;

typedef struct
{
  guint32 accepted;
  guint32 padding;
  CpUcxWireMessage expected;
} CpUcxWireAck;

void        _cp_ucx_wire_from_message  (CpUcxWireMessage   *wire,
                                        const CpMessage    *message);
/* A header out of range (dtype, dimensions) is clamped into range, so
 * the message can always be described. */
void        _cp_ucx_message_from_wire  (CpMessage          *message,
                                        const CpUcxWireMessage *wire);

/* ---- worker addresses (cp-ucx-address.c) ---- */

/* What UCX reads of one transport of a worker address. */
typedef struct
{
  guint16 checksum;        /* of the transport's name, as UCX packs it */
  guint device_length;
  guint iface_length;
} CpUcxAddressEntry;

/* The transports of a worker address (CpUcxAddressEntry), or NULL with
 * CP_MESH_ERROR_TRANSPORT when UCX 1.13 could not unpack it safely. */
GArray     *_cp_ucx_address_parse      (const guint8       *data,
                                        gsize               size,
                                        GError            **error);
/* Whether a peer's @address is safe for this rank's UCX, whose own
 * worker address is @own: it parses, and every transport the two share
 * has address lengths that @own gives it too. */
gboolean    _cp_ucx_address_check      (GBytes             *address,
                                        GBytes             *own,
                                        GError            **error);

G_END_DECLS
