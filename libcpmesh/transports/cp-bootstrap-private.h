/* cp-bootstrap-private.h: how the processes of a mesh find each other
 *
 * The bootstrap is transport-neutral: rank 0 listens on a plain TCP
 * socket (the gate), every other rank connects there, proves it holds the
 * mesh token and hands over an opaque blob (a UCX worker address, an
 * NCCL unique id, …); once every rank is in, each receives the blobs of
 * all ranks.  It makes no call into any transport library, so nothing a
 * stranger sends ever reaches one: every byte read off the network goes
 * through the parsers below first.  They take arbitrary bytes; anything
 * malformed is a GError naming what is wrong, never a crash, an
 * assertion or a read past the bytes given, so fuzz/fuzz-wire.c feeds
 * them directly.
 *
 * The exchange, on one TCP connection (numbers big endian):
 *
 *   rank 0 → joiner   greeting: "CPMESH\0", the protocol version (1 byte)
 *                     and a random challenge (32 bytes)
 *   joiner → rank 0   hello frame
 *   rank 0 → joiner   verdict frame: accepted, or why not
 *   rank 0 → joiner   (accepted joiners, once every rank is in) table
 *                     frame: every rank's blob, or the error rank 0 gave
 *                     up with
 *
 * A frame is a length (4 bytes) and that many bytes: a serialized GVariant
 * body followed by its proof, HMAC-SHA256 keyed with the token over the
 * message's purpose, the challenge, the joiner's nonce and the body.  So
 * the token never crosses the wire, a message cannot be replayed on
 * another connection, and a joiner trusts an acceptance or a table only
 * from a holder of the token.  A refusal cannot carry such proof (the
 * joiner may hold the wrong token) and is reported as it comes.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gio/gio.h>

#include "cp-mesh-config-private.h"

G_BEGIN_DECLS

#define CP_BOOTSTRAP_PROTOCOL_VERSION 2
#define CP_BOOTSTRAP_NONCE_SIZE 32
#define CP_BOOTSTRAP_MAC_SIZE 32
#define CP_BOOTSTRAP_MAGIC "CPMESH"
#define CP_BOOTSTRAP_MAGIC_SIZE 7   /* with its NUL */
#define CP_BOOTSTRAP_GREETING_SIZE (CP_BOOTSTRAP_MAGIC_SIZE + 1 + CP_BOOTSTRAP_NONCE_SIZE)
#define CP_BOOTSTRAP_FRAME_HEAD 4
/* A blob is a transport's address: a UCX worker address is a few hundred
 * bytes; anything far larger is not one. */
#define CP_BOOTSTRAP_BLOB_MAX (64 << 10)
/* A hello is a blob and a few names; a verdict a short text. */
#define CP_BOOTSTRAP_HELLO_MAX (CP_BOOTSTRAP_BLOB_MAX + (8 << 10))
#define CP_BOOTSTRAP_VERDICT_MAX (8 << 10)
/* The verdict code of an accepted hello, and of a table that carries the
 * blobs; anything else is a CpMeshError code. */
#define CP_BOOTSTRAP_ACCEPTED (-1)

/* ---- joining a mesh ---- */

/* Where rank 0 listens and what reaches it from here. */
typedef struct
{
  GSocketAddress *address;  /* MASTER_ADDR resolved, with the rendezvous port */
  char *interface;          /* the network interface that reaches it */
  gboolean is_loopback;     /* that interface is the loopback one */
  gboolean is_any;          /* MASTER_ADDR is 0.0.0.0 or ::: rank 0 listens on every
                             * interface, though joiners reach it over loopback */
} CpBootstrapRoute;

/* Resolves the rendezvous address of @config and finds the interface
 * whose address routes to it (getifaddrs and a connected UDP socket's
 * local address), so that a transport can keep to that interface. */
gboolean    _cp_bootstrap_find_route   (const CpMeshConfig *config,
                                        CpBootstrapRoute   *route,
                                        GError            **error);
void        _cp_bootstrap_route_clear  (CpBootstrapRoute   *route);

/* Whether the blob another rank offers is one this rank's transport can
 * take; FALSE with a CpMeshError saying what is wrong with it. */
typedef gboolean (*CpBootstrapCheckFunc) (GBytes    *blob,
                                          gpointer   user_data,
                                          GError   **error);

/* Joins the mesh @config describes, offering @blob as this rank's, and
 * returns the blob of every rank in rank order (GBytes*), once all have
 * joined, or an error with a CpMeshError code (or G_IO_ERROR_CANCELLED).
 * @backend names the transport in messages and fault injection.
 *
 * @check (nullable) judges every other rank's blob before the caller
 * sees it: rank 0 checks each hello's, a joiner the table's.  A bad blob
 * fails the rendezvous on every rank alike: rank 0 goes on admitting
 * ranks and, once all are in, or at its timeout, gives up with the error
 * naming the rank and the blob, which every admitted rank receives
 * instead of the table; a joiner refuses a table with a bad blob. */
GPtrArray  *_cp_bootstrap_exchange     (const CpMeshConfig *config,
                                        const CpBootstrapRoute *route,
                                        const char         *backend,
                                        GBytes             *blob,
                                        CpBootstrapCheckFunc check,
                                        gpointer            check_data,
                                        gint64              deadline,
                                        GCancellable       *cancellable,
                                        GError            **error);

/* ---- proofs ---- */

gboolean    _cp_bootstrap_fill_nonce   (guint8             *nonce,
                                        GError            **error);
/* HMAC-SHA256 keyed with @token (NULL: empty) over @purpose, @challenge,
 * @nonce and @body. */
void        _cp_bootstrap_sign         (const char         *token,
                                        const char         *purpose,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        GBytes             *body,
                                        guint8              mac[CP_BOOTSTRAP_MAC_SIZE]);
/* @body followed by its proof, as it goes on the wire. */
GBytes     *_cp_bootstrap_prove        (const char         *token,
                                        const char         *purpose,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        GBytes             *body);
/* Compares in a time independent of where the first difference lies. */
gboolean    _cp_bootstrap_mac_equal    (const guint8       *a,
                                        const guint8       *b);

/* ---- the wire ---- */

void        _cp_bootstrap_pack_greeting (const guint8      *challenge,
                                         guint8             greeting[CP_BOOTSTRAP_GREETING_SIZE]);
/* Refuses what is not a libcpmesh rank 0 (TRANSPORT) or speaks another
 * protocol (UNSUPPORTED). */
gboolean    _cp_bootstrap_parse_greeting (const guint8     *data,
                                          gsize             length,
                                          const char       *where,
                                          guint8            challenge[CP_BOOTSTRAP_NONCE_SIZE],
                                          GError          **error);
/* The length a frame head announces, refused unless in [1, @max]. */
gboolean    _cp_bootstrap_parse_frame_head (const guint8   *head,
                                            gsize           max,
                                            const char     *what,
                                            gsize          *length,
                                            GError        **error);
/* @payload behind its head, as it goes on the wire. */
GBytes     *_cp_bootstrap_frame        (GBytes             *payload);

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
  guint8 nonce[CP_BOOTSTRAP_NONCE_SIZE];
  GBytes *blob;
  GBytes *body;       /* what the proof covers */
  guint8 mac[CP_BOOTSTRAP_MAC_SIZE];
} CpBootstrapHello;

void        _cp_bootstrap_hello_free   (CpBootstrapHello   *hello);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (CpBootstrapHello, _cp_bootstrap_hello_free)

/* The body of @hello, what its proof covers. */
GBytes     *_cp_bootstrap_pack_hello_body (const CpBootstrapHello *hello);
/* The hello of the rank @config describes, proved for @challenge. */
GBytes     *_cp_bootstrap_pack_hello   (const CpMeshConfig *config,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        GBytes             *blob);
CpBootstrapHello *_cp_bootstrap_parse_hello (GBytes        *payload,
                                             GError       **error);
/* Rank 0's decision on @hello, answering its @challenge: accepted
 * (CP_BOOTSTRAP_ACCEPTED) or the CpMeshError code of the refusal and
 * @why.  @joined says, per rank, which ranks are in already. */
int         _cp_bootstrap_judge_hello  (const CpBootstrapHello *hello,
                                        const CpMeshConfig *config,
                                        const guint8       *challenge,
                                        const gboolean     *joined,
                                        char              **why);

/* A verdict, or a table's failure: @code CP_BOOTSTRAP_ACCEPTED or a
 * CpMeshError code with @reason, proved for @challenge and @nonce. */
GBytes     *_cp_bootstrap_pack_verdict (const char         *token,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        int                 code,
                                        const char         *reason);
/* TRUE once admitted; a refusal is rank 0's error, with its code and
 * reason; an acceptance without the proof is AUTH. */
gboolean    _cp_bootstrap_parse_verdict (GBytes            *payload,
                                         const char        *token,
                                         const guint8      *challenge,
                                         const guint8      *nonce,
                                         const char        *where,
                                         GError           **error);
GBytes     *_cp_bootstrap_pack_table   (const char         *token,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        GBytes * const     *blobs,
                                        int                 n);
GBytes     *_cp_bootstrap_pack_failure (const char         *token,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        const GError       *failure);
/* One blob per rank of a world of @world_size, or the error rank 0 gave
 * up with. */
GPtrArray  *_cp_bootstrap_parse_table  (GBytes             *payload,
                                        const char         *token,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        int                 world_size,
                                        const char         *where,
                                        GError            **error);
/* The most bytes a table of @world_size ranks can take. */
gsize       _cp_bootstrap_table_max    (int                 world_size);

G_END_DECLS
