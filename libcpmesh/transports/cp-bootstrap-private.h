/* cp-bootstrap-private.h: how the processes of a mesh find each other
 *
 * The bootstrap is transport-neutral: rank 0 listens on a plain TCP
 * socket (the gate), every other rank connects there, proves it holds the
 * mesh token and hands over its offer: one opaque blob per backend it can
 * use (a UCX worker address, the shared-memory backend's host identity,
 * an NCCL unique id, …), named by backend; once every rank is in, each
 * receives the offers of all ranks.  One rendezvous thus serves every
 * backend a mesh may pick or hold.  It makes no call into any transport
 * library, so nothing a stranger sends ever reaches one: every byte read
 * off the network goes through the parsers below first.  They take
 * arbitrary bytes; anything malformed is a GError naming what is wrong,
 * never a crash, an assertion or a read past the bytes given, so
 * fuzz/fuzz-wire.c feeds them directly.
 *
 * The exchange, on one TCP connection (numbers big endian):
 *
 *   rank 0 → joiner   greeting: "CPMESH\0", the protocol version (1 byte)
 *                     and a random challenge (32 bytes)
 *   joiner → rank 0   hello frame
 *   rank 0 → joiner   verdict frame: accepted, or why not
 *   rank 0 → joiner   (accepted joiners, once every rank is in) table
 *                     frame: every rank's offer, or the error rank 0 gave
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

/* 3: a hello and a table carry one blob per backend (a{say}), not one. */
#define CP_BOOTSTRAP_PROTOCOL_VERSION 3
#define CP_BOOTSTRAP_NONCE_SIZE 32
#define CP_BOOTSTRAP_MAC_SIZE 32
#define CP_BOOTSTRAP_MAGIC "CPMESH"
#define CP_BOOTSTRAP_MAGIC_SIZE 7   /* with its NUL */
#define CP_BOOTSTRAP_GREETING_SIZE (CP_BOOTSTRAP_MAGIC_SIZE + 1 + CP_BOOTSTRAP_NONCE_SIZE)
#define CP_BOOTSTRAP_FRAME_HEAD 4
/* A blob is a transport's address: a UCX worker address is a few hundred
 * bytes; anything far larger is not one. */
#define CP_BOOTSTRAP_BLOB_MAX (64 << 10)
/* An offer holds at most this many backends, their blobs this many bytes
 * together, and each name is 1 to CP_BOOTSTRAP_NAME_MAX bytes of
 * [a-z0-9_-]. */
#define CP_BOOTSTRAP_MAX_BACKENDS 8
#define CP_BOOTSTRAP_OFFER_MAX (96 << 10)
#define CP_BOOTSTRAP_NAME_MAX 32
/* A hello is an offer and a few names; a verdict a short text. */
#define CP_BOOTSTRAP_HELLO_MAX (CP_BOOTSTRAP_OFFER_MAX + (8 << 10))
#define CP_BOOTSTRAP_VERDICT_MAX (8 << 10)
/* The verdict code of an accepted hello, and of a table that carries the
 * blobs; anything else is a CpMeshError code. */
#define CP_BOOTSTRAP_ACCEPTED (-1)

/* ---- joining a mesh ---- */

/* Where rank 0 listens and what reaches it from here. */
typedef struct _CpBootstrapRoute
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

/* ---- offers ---- */

/* One rank's blobs, one per backend it offers, kept in byte order of
 * the names, as they cross the wire.  A backend that cannot run on that
 * rank (its probe or its offer failed there) is absent.  Reference
 * counted; not changed once handed to the exchange. */
typedef struct _CpBootstrapOffer CpBootstrapOffer;

CpBootstrapOffer *_cp_bootstrap_offer_new    (void);
CpBootstrapOffer *_cp_bootstrap_offer_ref    (CpBootstrapOffer       *offer);
void              _cp_bootstrap_offer_unref  (CpBootstrapOffer       *offer);
/* Adds @blob as @backend's, replacing any it had.  @backend must be a
 * valid name (see CP_BOOTSTRAP_NAME_MAX). */
void              _cp_bootstrap_offer_add    (CpBootstrapOffer       *offer,
                                              const char             *backend,
                                              GBytes                 *blob);
/* (transfer none) @backend's blob, or NULL when the offer has none. */
GBytes           *_cp_bootstrap_offer_lookup (const CpBootstrapOffer *offer,
                                              const char             *backend);
guint             _cp_bootstrap_offer_get_n_blobs (const CpBootstrapOffer *offer);
const char       *_cp_bootstrap_offer_get_name    (const CpBootstrapOffer *offer,
                                                   guint                   i);
GBytes           *_cp_bootstrap_offer_get_blob    (const CpBootstrapOffer *offer,
                                                   guint                   i);
/* "shm, ucx", or "nothing" */
char             *_cp_bootstrap_offer_describe    (const CpBootstrapOffer *offer);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (CpBootstrapOffer, _cp_bootstrap_offer_unref)

/* Every rank's blob of @backend, in rank order, from @table, the
 * CpBootstrapOffer* of every rank: a new array of @table->len entries
 * (transfer none each), NULL where a rank does not offer it.  Sets
 * @n_missing (nullable) to the number of such ranks and @first_missing
 * (nullable) to the first, or -1. */
GBytes          **_cp_bootstrap_table_blobs  (GPtrArray              *table,
                                              const char             *backend,
                                              guint                  *n_missing,
                                              int                    *first_missing);

/* ---- the rendezvous ---- */

/* Whether the blob another rank offers for a backend is one this rank's
 * side of that backend can take; FALSE with a CpMeshError saying what is
 * wrong with it. */
typedef gboolean (*CpBootstrapCheckFunc) (GBytes    *blob,
                                          gpointer   user_data,
                                          GError   **error);

/* The check of one backend's blobs. */
typedef struct
{
  const char *backend;
  CpBootstrapCheckFunc check;
  gpointer check_data;
} CpBootstrapCheck;

/* Joins the mesh @config describes, offering @offer as this rank's, and
 * returns the offer of every rank in rank order (CpBootstrapOffer*), once
 * all have joined, or an error with a CpMeshError code (or
 * G_IO_ERROR_CANCELLED).
 *
 * Each of @checks judges every other rank's blob of its backend before
 * the caller sees it: rank 0 checks each hello's, a joiner the table's;
 * blobs of backends no check names pass as they are.  A bad blob fails
 * the rendezvous on every rank alike: rank 0 goes on admitting ranks and,
 * once all are in, or at its timeout, gives up with the error naming the
 * rank, the backend and the blob, which every admitted rank receives
 * instead of the table; a joiner refuses a table with a bad blob. */
GPtrArray  *_cp_bootstrap_exchange     (const CpMeshConfig *config,
                                        const CpBootstrapRoute *route,
                                        CpBootstrapOffer   *offer,
                                        const CpBootstrapCheck *checks,
                                        guint               n_checks,
                                        gint64              deadline,
                                        GCancellable       *cancellable,
                                        GError            **error);

/* Runs the one of @checks that names @backend, if any, on @blob. */
gboolean    _cp_bootstrap_check_blob   (const CpBootstrapCheck *checks,
                                        guint               n_checks,
                                        const char         *backend,
                                        GBytes             *blob,
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
  CpBootstrapOffer *offer;
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
                                        const CpBootstrapOffer *offer);
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
                                        CpBootstrapOffer * const *offers,
                                        int                 n);
GBytes     *_cp_bootstrap_pack_failure (const char         *token,
                                        const guint8       *challenge,
                                        const guint8       *nonce,
                                        const GError       *failure);
/* One offer (CpBootstrapOffer*) per rank of a world of @world_size, or
 * the error rank 0 gave up with. */
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
