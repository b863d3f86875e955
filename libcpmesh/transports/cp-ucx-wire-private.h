/* cp-ucx-wire-private.h: what UCX ranks say to each other, byte by byte
 *
 * Every message a rank of the UCX backend reads off the network goes
 * through one of these parsers before anything else looks at it: the
 * gate's greeting and verdict, the rendezvous' challenge, hello, verdict
 * and address table, the descriptor of a collective and the header of a
 * point-to-point message.  They take arbitrary bytes; anything malformed
 * is a GError naming what is wrong, never a crash, an assertion or a read
 * past the bytes given.  They need no UCX, so fuzz/fuzz-wire.c feeds them
 * directly.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <glib.h>

#include "cp-mesh-config-private.h"
#include "cp-transport-private.h"

G_BEGIN_DECLS

#define CP_UCX_PROTOCOL_VERSION 1
#define CP_UCX_NONCE_SIZE 32
#define CP_UCX_MAC_SIZE 32
/* The receive slot of one descriptor: a packed descriptor never exceeds it. */
#define CP_UCX_DESCRIPTOR_MAX 4096
/* A UCP worker address is a few hundred bytes; anything far larger is not one. */
#define CP_UCX_ADDRESS_MAX (64 << 10)
/* The verdict code of an accepted hello; rejections carry a CpMeshError. */
#define CP_UCX_ACCEPTED (-1)

/* ---- keys and proofs ---- */

/* HMAC-SHA256 keyed with @token (NULL: empty) over @purpose and @data. */
void        _cp_ucx_mac                (const char         *token,
                                        const char         *purpose,
                                        const guint8       *data,
                                        gsize               length,
                                        guint8              mac[CP_UCX_MAC_SIZE]);
/* Compares in a time independent of where the first difference lies. */
gboolean    _cp_ucx_mac_equal          (const guint8       *a,
                                        const guint8       *b);
gboolean    _cp_ucx_fill_nonce         (guint8             *nonce,
                                        GError            **error);
/* The rendezvous' proofs: an HMAC over both nonces and the joiner's rank
 * and world size, for @purpose ("cpmesh join" or "cpmesh accept"). */
void        _cp_ucx_hello_mac          (const char         *token,
                                        const char         *purpose,
                                        const guint8       *first_nonce,
                                        const guint8       *second_nonce,
                                        int                 rank,
                                        int                 world_size,
                                        guint8              mac[CP_UCX_MAC_SIZE]);

/* ---- the gate (cp-ucx-gate.c) ----
 *
 *   gate → joiner   magic, then a random challenge
 *   joiner → gate   HMAC-SHA256 (token, "cpmesh gate" ‖ challenge)
 *   gate → joiner   CP_UCX_GATE_ACCEPTED and the UCX port (2 bytes, big
 *                   endian); or a CpMeshError code, the length (2 bytes,
 *                   big endian) and the text of the reason */

#define CP_UCX_GATE_MAGIC "CPMESH\0\1"
#define CP_UCX_GATE_MAGIC_SIZE 8
#define CP_UCX_GATE_GREETING_SIZE (CP_UCX_GATE_MAGIC_SIZE + CP_UCX_NONCE_SIZE)
#define CP_UCX_GATE_VERDICT_HEAD 3
#define CP_UCX_GATE_ACCEPTED 0xff

gboolean    _cp_ucx_gate_parse_greeting (const guint8      *data,
                                         gsize              length,
                                         const char        *where,
                                         guint8             challenge[CP_UCX_NONCE_SIZE],
                                         GError           **error);
/* The whole length of the verdict that starts with @head. */
gsize       _cp_ucx_gate_verdict_size   (const guint8       head[CP_UCX_GATE_VERDICT_HEAD]);
/* TRUE with the UCX port when admitted; a refusal is the gate's error,
 * with its code and text. */
gboolean    _cp_ucx_gate_parse_verdict  (const guint8      *data,
                                         gsize              length,
                                         const char        *where,
                                         guint16           *ucx_port,
                                         GError           **error);

/* ---- the rendezvous (cp-ucx-rendezvous.c) ---- */

/* What a joiner tells rank 0 about itself. */
typedef struct
{
  guint32 protocol;
  char *version;
  int rank;
  int world_size;
  char **dim_names;
  gint32 *dim_sizes;
  gsize n_dims;
  guint8 nonce[CP_UCX_NONCE_SIZE];
  guint8 mac[CP_UCX_MAC_SIZE];
  GBytes *address;
} CpUcxHello;

void        _cp_ucx_hello_free         (CpUcxHello         *hello);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (CpUcxHello, _cp_ucx_hello_free)

GBytes     *_cp_ucx_pack_challenge     (const guint8       *nonce);
gboolean    _cp_ucx_parse_challenge    (GBytes             *payload,
                                        guint8              nonce[CP_UCX_NONCE_SIZE],
                                        GError            **error);
GBytes     *_cp_ucx_pack_hello         (const CpUcxHello   *hello);
CpUcxHello *_cp_ucx_parse_hello        (GBytes             *payload,
                                        GError            **error);
/* Rank 0's decision on @hello, answering its challenge @nonce: accepted
 * (CP_UCX_ACCEPTED) or the CpMeshError code of the refusal and @why.
 * @joined says, per rank, which ranks are in already. */
int         _cp_ucx_judge_hello        (const CpUcxHello   *hello,
                                        const CpMeshConfig *config,
                                        const guint8       *nonce,
                                        const gboolean     *joined,
                                        char              **why);
/* @mac: the acceptance's proof, or NULL for a refusal. */
GBytes     *_cp_ucx_pack_verdict       (int                 code,
                                        const char         *reason,
                                        const guint8       *mac);
/* TRUE with the code and reason; @mac gets the proof of an acceptance. */
gboolean    _cp_ucx_parse_verdict      (GBytes             *payload,
                                        int                *code,
                                        char              **reason,
                                        guint8              mac[CP_UCX_MAC_SIZE],
                                        GError            **error);
GBytes     *_cp_ucx_pack_table         (GBytes * const     *addresses,
                                        int                 n);
/* One address per rank of a world of @world_size. */
GPtrArray  *_cp_ucx_parse_table        (GBytes             *payload,
                                        int                 world_size,
                                        GError            **error);

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

G_END_DECLS
