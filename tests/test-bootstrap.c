/* test-bootstrap.c: the rendezvous's proofs and its gate, from inside
 *
 * The wrong-token cases of the ucx suites send random proofs, which any
 * comparison that looks at one byte rejects.  These cases alter a valid
 * proof in each byte in turn, for the comparison and for rank 0's
 * judgement of a hello; check what rank 0 tells a visitor that proved
 * nothing; and fill rank 0's gate with silent visitors to see which one
 * it evicts for a newcomer.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cp-bootstrap-private.h"
#include "cp-error.h"
#include "cp-test-procs.h"
#include "cp-test-util.h"

#define SUBJECT "CpMesh (rendezvous)"
#define TOKEN "the mesh token"

/* ---- proofs ---- */

static void
test_mac_each_byte (void)
{
  g_autoptr(GBytes) body = g_bytes_new_static ("a body", 6);
  guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE] = { 1 }, nonce[CP_BOOTSTRAP_NONCE_SIZE] = { 2 };
  guint8 mac[CP_BOOTSTRAP_MAC_SIZE], copy[CP_BOOTSTRAP_MAC_SIZE];

  g_test_summary ("The proof comparison rejects a valid proof altered in any one byte, the first "
                  "and the last included, in any bit");
  _cp_bootstrap_sign (TOKEN, "cpmesh join", challenge, nonce, body, mac);
  memcpy (copy, mac, sizeof mac);
  g_assert_true (_cp_bootstrap_mac_equal (mac, copy));
  for (guint i = 0; i < CP_BOOTSTRAP_MAC_SIZE; i++)
    for (guint bit = 0; bit < 8; bit++)
      {
        memcpy (copy, mac, sizeof mac);
        copy[i] ^= (guint8) (1u << bit);
        g_assert_false (_cp_bootstrap_mac_equal (mac, copy));
        g_assert_false (_cp_bootstrap_mac_equal (copy, mac));
      }
}

static void
init_config (CpMeshConfig *config,
             const char   *token)
{
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_mesh_config_init (config, 0, 2, "127.0.0.1", 29501, token, NULL, NULL, 0, 1000, &error));
  g_assert_no_error (error);
}

/* Rank 0's verdict on @payload, a hello off the wire. */
static int
judge_payload (const CpMeshConfig *config,
               const guint8       *challenge,
               GBytes             *payload,
               char              **why)
{
  gboolean joined[2] = { TRUE, FALSE };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpBootstrapHello) hello = _cp_bootstrap_parse_hello (payload, &error);

  g_assert_no_error (error);
  return _cp_bootstrap_judge_hello (hello, config, challenge, joined, why);
}

static void
test_hello_altered_proof (void)
{
  CpMeshConfig config, joiner;
  guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE], nonce[CP_BOOTSTRAP_NONCE_SIZE];
  g_autoptr(GBytes) blob = g_bytes_new_static ("an address", 10);
  g_autoptr(CpBootstrapOffer) offer = _cp_bootstrap_offer_new ();
  g_autoptr(GBytes) payload = NULL;
  gsize size = 0;
  const guint8 *bytes;
  char *why = NULL;

  g_test_summary ("Rank 0 refuses, as CP_MESH_ERROR_AUTH, a hello whose valid proof is altered in "
                  "any one byte");
  init_config (&config, TOKEN);
  init_config (&joiner, TOKEN);
  joiner.rank = 1;
  g_assert_true (_cp_bootstrap_fill_nonce (challenge, NULL));
  g_assert_true (_cp_bootstrap_fill_nonce (nonce, NULL));
  _cp_bootstrap_offer_add (offer, "test", blob);
  payload = _cp_bootstrap_pack_hello (&joiner, challenge, nonce, offer);
  g_assert_cmpint (judge_payload (&config, challenge, payload, &why), ==, CP_BOOTSTRAP_ACCEPTED);
  g_assert_null (why);
  bytes = g_bytes_get_data (payload, &size);
  for (gsize i = size - CP_BOOTSTRAP_MAC_SIZE; i < size; i++)
    {
      g_autofree guint8 *copy = g_memdup2 (bytes, size);
      g_autoptr(GBytes) altered = NULL;
      g_autofree char *reason = NULL;

      copy[i] ^= 0x01;
      altered = g_bytes_new (copy, size);
      g_assert_cmpint (judge_payload (&config, challenge, altered, &reason), ==, CP_MESH_ERROR_AUTH);
      g_assert_nonnull (strstr (reason, "did not prove it holds the mesh token"));
      if (i == size - CP_BOOTSTRAP_MAC_SIZE)
        {
          g_autoptr(GError) error = g_error_new_literal (CP_MESH_ERROR, CP_MESH_ERROR_AUTH, reason);

          cp_test_record_error (SUBJECT, "a hello whose valid proof is altered in its first byte "
                                "(and, one at a time, in each other byte)", error);
        }
    }
  _cp_mesh_config_clear (&config);
  _cp_mesh_config_clear (&joiner);
}

static void
test_hello_other_protocol (void)
{
  CpMeshConfig config;
  guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE] = { 0 };
  gboolean joined[2] = { TRUE, FALSE };
  CpBootstrapHello hello = { 1, (char *) "0.1-visitor", 1, 2, NULL, NULL, 0, { 0 }, NULL, NULL, { 0 } };
  g_autofree char *why = NULL;
  g_autoptr(GError) error = NULL;

  g_test_summary ("A visitor that speaks another rendezvous protocol learns rank 0's protocol, not "
                  "its libcpmesh version");
  init_config (&config, TOKEN);
  g_assert_cmpint (_cp_bootstrap_judge_hello (&hello, &config, challenge, joined, &why), ==,
                   CP_MESH_ERROR_UNSUPPORTED);
  g_test_message ("%s", why);
  g_assert_null (strstr (why, CP_VERSION_S));
  g_assert_null (strstr (why, "0.1-visitor"));
  g_assert_nonnull (strstr (why, "it speaks rendezvous protocol 1; rank 0 speaks 3"));
  error = g_error_new_literal (CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, why);
  cp_test_record_error (SUBJECT, "an unproven visitor speaking another rendezvous protocol (rank 0's "
                        "answer names no libcpmesh version)", error);
  _cp_mesh_config_clear (&config);
}

/* ---- offers ---- */

/* A hello of rank 1 of 2 whose offer is @offer, a GVariant of type
 * a{say} (floating), parsed as rank 0 parses it. */
static CpBootstrapHello *
parse_crafted_hello (GVariant  *offer,
                     GError   **error)
{
  const char * const no_names[] = { NULL };
  guint8 nonce[CP_BOOTSTRAP_NONCE_SIZE] = { 3 }, challenge[CP_BOOTSTRAP_NONCE_SIZE] = { 4 };
  g_autoptr(GVariant) body = g_variant_ref_sink (
    g_variant_new ("(usii^as@ai@ay@a{say})", CP_BOOTSTRAP_PROTOCOL_VERSION, "test", 1, 2, no_names,
                   g_variant_new_fixed_array (G_VARIANT_TYPE_INT32, NULL, 0, sizeof (gint32)),
                   g_variant_new_fixed_array (G_VARIANT_TYPE_BYTE, nonce, sizeof nonce, 1), offer));
  g_autoptr(GBytes) bytes = g_variant_get_data_as_bytes (body);
  g_autoptr(GBytes) payload = _cp_bootstrap_prove (TOKEN, "cpmesh join", challenge, nonce, bytes);

  return _cp_bootstrap_parse_hello (payload, error);
}

static GVariant *
entry (const char *name,
       gsize       size)
{
  g_autofree guint8 *data = g_malloc0 (MAX (size, 1));

  return g_variant_new_dict_entry (g_variant_new_string (name),
                                   g_variant_new_fixed_array (G_VARIANT_TYPE_BYTE, data, size, 1));
}

static void
test_offer_round_trip (void)
{
  CpMeshConfig joiner;
  guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE] = { 5 }, nonce[CP_BOOTSTRAP_NONCE_SIZE] = { 6 };
  g_autoptr(CpBootstrapOffer) offer = _cp_bootstrap_offer_new ();
  g_autoptr(GBytes) ucx = g_bytes_new_static ("a worker address", 16);
  g_autoptr(GBytes) shm = g_bytes_new_static ("a host", 6);
  g_autoptr(GBytes) payload = NULL;
  g_autoptr(CpBootstrapHello) hello = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree char *described = NULL;

  g_test_summary ("A hello carries one blob per backend, by name in byte order, and parses back to "
                  "the same offer; a backend the rank does not offer is absent");
  init_config (&joiner, TOKEN);
  joiner.rank = 1;
  /* Added out of order: the offer keeps them sorted, as the wire wants. */
  _cp_bootstrap_offer_add (offer, "ucx", ucx);
  _cp_bootstrap_offer_add (offer, "shm", shm);
  payload = _cp_bootstrap_pack_hello (&joiner, challenge, nonce, offer);
  hello = _cp_bootstrap_parse_hello (payload, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (_cp_bootstrap_offer_get_n_blobs (hello->offer), ==, 2);
  g_assert_cmpstr (_cp_bootstrap_offer_get_name (hello->offer, 0), ==, "shm");
  g_assert_cmpstr (_cp_bootstrap_offer_get_name (hello->offer, 1), ==, "ucx");
  g_assert_true (g_bytes_equal (_cp_bootstrap_offer_lookup (hello->offer, "ucx"), ucx));
  g_assert_true (g_bytes_equal (_cp_bootstrap_offer_lookup (hello->offer, "shm"), shm));
  g_assert_null (_cp_bootstrap_offer_lookup (hello->offer, "nccl"));
  described = _cp_bootstrap_offer_describe (hello->offer);
  g_assert_cmpstr (described, ==, "shm, ucx");
  _cp_mesh_config_clear (&joiner);
}

static void
test_offer_empty (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpBootstrapHello) hello = parse_crafted_hello (g_variant_new_array (G_VARIANT_TYPE ("{say}"), NULL, 0),
                                                           &error);
  g_autofree char *described = NULL;

  g_test_summary ("A rank that can use no backend still joins, offering nothing, so that every rank "
                  "reaches the same verdict");
  g_assert_no_error (error);
  g_assert_cmpuint (_cp_bootstrap_offer_get_n_blobs (hello->offer), ==, 0);
  described = _cp_bootstrap_offer_describe (hello->offer);
  g_assert_cmpstr (described, ==, "nothing");
}

typedef struct
{
  const char *path;
  const char *what;
  const char *message;
  const char *names[CP_BOOTSTRAP_MAX_BACKENDS + 2];
  gsize sizes[CP_BOOTSTRAP_MAX_BACKENDS + 2];
} BadOffer;

static const BadOffer bad_offers[] = {
  { "twice", "a hello whose offer names a backend twice", "the backend \"ucx\" comes after \"ucx\"",
    { "ucx", "ucx" }, { 4, 4 } },
  { "unsorted", "a hello whose offer is not in byte order of the names", "the backend \"shm\" comes after \"ucx\"",
    { "ucx", "shm" }, { 4, 4 } },
  { "capitals", "a hello whose offer names a backend with capitals", "the backend name \"UCX\" is not 1 to 32",
    { "UCX" }, { 4 } },
  { "empty-name", "a hello whose offer names a backend with the empty name", "the backend name \"\" is not",
    { "" }, { 4 } },
  { "empty-blob", "a hello whose offer holds an empty blob", "a ucx blob of 0 bytes, not 1 to 65536",
    { "ucx" }, { 0 } },
  { "blob-limit", "a hello whose offer holds a blob over 64 KiB", "a ucx blob of 65537 bytes, not 1 to 65536",
    { "ucx" }, { 65537 } },
  { "offer-limit", "a hello whose offer's blobs hold over 96 KiB together",
    "an offer whose blobs hold more than 98304 bytes together (b takes it to 131072)",
    { "a", "b" }, { 65536, 65536 } },
  { "backend-limit", "a hello whose offer names more than 8 backends", "an offer of 9 backends, more than 8",
    { "a", "b", "c", "d", "e", "f", "g", "h", "i" }, { 1, 1, 1, 1, 1, 1, 1, 1, 1 } },
};

static void
test_offer_bad (gconstpointer data)
{
  const BadOffer *bad = data;
  GVariantBuilder builder;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpBootstrapHello) hello = NULL;

  g_test_summary ("Rank 0 refuses, as CP_MESH_ERROR_TRANSPORT naming what is wrong, a hello whose offer "
                  "is out of order, names a backend twice or badly, or breaks a limit per blob, per "
                  "offer or of backends");
  g_variant_builder_init (&builder, G_VARIANT_TYPE ("a{say}"));
  for (guint i = 0; bad->names[i] != NULL; i++)
    g_variant_builder_add_value (&builder, entry (bad->names[i], bad->sizes[i]));
  hello = parse_crafted_hello (g_variant_builder_end (&builder), &error);
  g_assert_null (hello);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT, bad->what);
  g_test_message ("%s", error->message);
  g_assert_nonnull (strstr (error->message, "a malformed hello"));
  g_assert_nonnull (strstr (error->message, bad->message));
}

static void
test_table_blobs (void)
{
  g_autoptr(GPtrArray) table = g_ptr_array_new_with_free_func ((GDestroyNotify) _cp_bootstrap_offer_unref);
  g_autoptr(GBytes) blob = g_bytes_new_static ("x", 1);
  guint8 challenge[CP_BOOTSTRAP_NONCE_SIZE] = { 7 }, nonce[CP_BOOTSTRAP_NONCE_SIZE] = { 8 };
  g_autoptr(GBytes) payload = NULL;
  g_autoptr(GPtrArray) parsed = NULL;
  g_autoptr(GError) error = NULL;
  g_autofree GBytes **ucx = NULL;
  g_autofree GBytes **shm = NULL;
  guint n_missing = 9;
  int first_missing = 9;

  g_test_summary ("A table holds each rank's offer; a backend's blobs per rank are NULL where a rank "
                  "does not offer it");
  for (int r = 0; r < 3; r++)
    {
      CpBootstrapOffer *offer = _cp_bootstrap_offer_new ();

      _cp_bootstrap_offer_add (offer, "ucx", blob);
      if (r != 1)
        _cp_bootstrap_offer_add (offer, "shm", blob);
      g_ptr_array_add (table, offer);
    }
  payload = _cp_bootstrap_pack_table (TOKEN, challenge, nonce, (CpBootstrapOffer * const *) table->pdata, 3);
  parsed = _cp_bootstrap_parse_table (payload, TOKEN, challenge, nonce, 3, "here", &error);
  g_assert_no_error (error);
  g_assert_cmpuint (parsed->len, ==, 3);
  ucx = _cp_bootstrap_table_blobs (parsed, "ucx", &n_missing, &first_missing);
  g_assert_cmpuint (n_missing, ==, 0);
  g_assert_cmpint (first_missing, ==, -1);
  for (int r = 0; r < 3; r++)
    g_assert_true (g_bytes_equal (ucx[r], blob));
  shm = _cp_bootstrap_table_blobs (parsed, "shm", &n_missing, &first_missing);
  g_assert_cmpuint (n_missing, ==, 1);
  g_assert_cmpint (first_missing, ==, 1);
  g_assert_nonnull (shm[0]);
  g_assert_null (shm[1]);
  g_assert_nonnull (shm[2]);
}

/* ---- one rendezvous, several backends ---- */

typedef struct
{
  int rank;
  int world_size;
  guint16 port;
  gboolean offers_beta;     /* else its offer lacks beta */
  const char *beta;         /* its beta blob */
  GPtrArray *table;
  GError *error;
} Meeter;

/* Refuses a beta blob that says "bad"; alpha is never checked. */
static gboolean
check_beta (GBytes    *blob,
            gpointer   user_data,
            GError   **error)
{
  const char *expected_data = user_data;

  g_assert_cmpstr (expected_data, ==, "beta's state");
  if (g_bytes_get_size (blob) != 3 || memcmp (g_bytes_get_data (blob, NULL), "bad", 3) != 0)
    return TRUE;
  g_set_error_literal (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, "a beta blob that says bad");
  return FALSE;
}

static gpointer
meet (gpointer data)
{
  Meeter *self = data;
  CpMeshConfig config;
  CpBootstrapRoute route;
  g_autoptr(CpBootstrapOffer) offer = _cp_bootstrap_offer_new ();
  g_autofree char *alpha = g_strdup_printf ("alpha of rank %d", self->rank);
  g_autoptr(GBytes) alpha_blob = g_bytes_new (alpha, strlen (alpha));
  const CpBootstrapCheck checks[] = { { "beta", check_beta, (gpointer) "beta's state" } };

  _cp_bootstrap_offer_add (offer, "alpha", alpha_blob);
  if (self->offers_beta)
    {
      g_autoptr(GBytes) beta_blob = g_bytes_new (self->beta, strlen (self->beta));

      _cp_bootstrap_offer_add (offer, "beta", beta_blob);
    }
  g_assert_true (_cp_mesh_config_init (&config, self->rank, self->world_size, "127.0.0.1", self->port, TOKEN,
                                       NULL, NULL, 0, 20000, NULL));
  g_assert_true (_cp_bootstrap_find_route (&config, &route, NULL));
  self->table = _cp_bootstrap_exchange (&config, &route, offer, checks, G_N_ELEMENTS (checks),
                                        g_get_monotonic_time () + 20 * G_TIME_SPAN_SECOND, NULL, &self->error);
  _cp_bootstrap_route_clear (&route);
  _cp_mesh_config_clear (&config);
  return NULL;
}

/* Ranks 0 to 2 meet on threads: rank 2 offers no beta, and the beta of
 * rank @bad_rank (-1: none) says "bad". */
static void
meet_three (Meeter   *meeters,
            int       bad_rank)
{
  guint16 port = cp_test_free_port ();
  GThread *threads[3];

  for (int r = 0; r < 3; r++)
    {
      meeters[r] = (Meeter) { r, 3, port, r != 2, r == bad_rank ? "bad" : "good", NULL, NULL };
      threads[r] = g_thread_new ("rank", meet, &meeters[r]);
    }
  for (int r = 0; r < 3; r++)
    g_thread_join (threads[r]);
}

static void
test_several_blobs (void)
{
  Meeter meeters[3];

  g_test_summary ("One rendezvous hands every rank every rank's blob of every backend; a backend "
                  "a rank does not offer is absent from that rank's offer alone");
  meet_three (meeters, -1);
  for (int r = 0; r < 3; r++)
    {
      g_autofree GBytes **alpha = NULL;
      g_autofree GBytes **beta = NULL;
      guint n_missing = 0;
      int first_missing = -1;

      g_assert_no_error (meeters[r].error);
      g_assert_cmpuint (meeters[r].table->len, ==, 3);
      alpha = _cp_bootstrap_table_blobs (meeters[r].table, "alpha", &n_missing, NULL);
      g_assert_cmpuint (n_missing, ==, 0);
      for (int q = 0; q < 3; q++)
        {
          g_autofree char *expected = g_strdup_printf ("alpha of rank %d", q);
          g_autoptr(GBytes) expected_blob = g_bytes_new (expected, strlen (expected));

          g_assert_true (g_bytes_equal (alpha[q], expected_blob));
        }
      beta = _cp_bootstrap_table_blobs (meeters[r].table, "beta", &n_missing, &first_missing);
      g_assert_cmpuint (n_missing, ==, 1);
      g_assert_cmpint (first_missing, ==, 2);
      g_assert_cmpmem (g_bytes_get_data (beta[0], NULL), g_bytes_get_size (beta[0]), "good", 4);
      g_assert_cmpmem (g_bytes_get_data (beta[1], NULL), g_bytes_get_size (beta[1]), "good", 4);
      g_ptr_array_unref (meeters[r].table);
    }
}

static void
test_bad_blob_of_one_backend (void)
{
  Meeter meeters[3];

  g_test_summary ("A bad blob of one backend, checked by that backend's check alone, fails the "
                  "rendezvous on every rank, naming the rank and the backend");
  meet_three (meeters, 1);
  for (int r = 0; r < 3; r++)
    {
      g_assert_null (meeters[r].table);
      g_test_message ("rank %d: %s", r, meeters[r].error->message);
      g_assert_nonnull (strstr (meeters[r].error->message, "rank 1 (from 127.0.0.1:"));
      g_assert_nonnull (strstr (meeters[r].error->message, "offered, for beta, a beta blob that says bad"));
    }
  CP_TEST_ASSERT_CASE (meeters[0].error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT,
                       "a joiner offers a blob its backend's check refuses, beside good blobs of other "
                       "backends: rank 0");
  CP_TEST_ASSERT_CASE (meeters[2].error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT,
                       "a joiner offers a blob its backend's check refuses, beside good blobs of other "
                       "backends: another joiner");
  for (int r = 0; r < 3; r++)
    g_clear_error (&meeters[r].error);
}

/* ---- the gate ---- */

typedef struct
{
  guint16 port;
  GCancellable *cancellable;
  GError *error;
} Gate;

/* Rank 0 of a world of two whose rank 1 never comes, until cancelled. */
static gpointer
run_rank_0 (gpointer data)
{
  Gate *gate = data;
  CpMeshConfig config;
  CpBootstrapRoute route;
  g_autoptr(GBytes) blob = g_bytes_new_static ("rank 0", 6);
  g_autoptr(CpBootstrapOffer) offer = _cp_bootstrap_offer_new ();
  g_autoptr(GPtrArray) blobs = NULL;

  _cp_bootstrap_offer_add (offer, "test", blob);
  g_assert_true (_cp_mesh_config_init (&config, 0, 2, "0.0.0.0", gate->port, TOKEN, NULL, NULL, 0, 60000, NULL));
  g_assert_true (_cp_bootstrap_find_route (&config, &route, NULL));
  blobs = _cp_bootstrap_exchange (&config, &route, offer, NULL, 0,
                                  g_get_monotonic_time () + 60 * G_TIME_SPAN_SECOND, gate->cancellable,
                                  &gate->error);
  g_assert_null (blobs);
  _cp_bootstrap_route_clear (&route);
  _cp_mesh_config_clear (&config);
  return NULL;
}

/* A visitor from @source (127.0.0.X) that reads the greeting and sends
 * one byte, then nothing more. */
static int
visit (guint16 port,
       guint8  source)
{
  struct sockaddr_in from = { .sin_family = AF_INET, .sin_addr.s_addr = htonl (0x7f000000u | source) };
  struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons (port),
                            .sin_addr.s_addr = htonl (INADDR_LOOPBACK) };
  guint8 greeting[CP_BOOTSTRAP_GREETING_SIZE];
  gsize have = 0;
  int fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  g_assert_cmpint (fd, >=, 0);
  g_assert_cmpint (bind (fd, (struct sockaddr *) &from, sizeof from), ==, 0);
  for (guint tries = 0; connect (fd, (struct sockaddr *) &to, sizeof to) != 0; tries++)
    {
      /* Rank 0 may not listen yet. */
      g_assert_cmpint (errno, ==, ECONNREFUSED);
      g_assert_cmpuint (tries, <, 5000);
      close (fd);
      g_usleep (1000);
      fd = socket (AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      g_assert_cmpint (bind (fd, (struct sockaddr *) &from, sizeof from), ==, 0);
    }
  while (have < sizeof greeting)
    {
      gssize got = recv (fd, greeting + have, sizeof greeting - have, 0);

      g_assert_cmpint (got, >, 0);
      have += (gsize) got;
    }
  /* The first byte of a frame head: from now on it has five seconds for
   * its hello rather than one for its first bytes, which a slow machine
   * might take to open the rest. */
  g_assert_cmpint (send (fd, "", 1, MSG_NOSIGNAL), ==, 1);
  return fd;
}

/* Whether rank 0 closed @fd, waiting at most @wait_ms for it to. */
static gboolean
is_closed (int  fd,
           int  wait_ms)
{
  struct pollfd poller = { fd, POLLIN, 0 };
  guint8 byte;

  if (poll (&poller, 1, wait_ms) <= 0)
    return FALSE;
  return recv (fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

typedef struct
{
  guint8 sources[2];      /* where the visitors that fill the gate come from */
  guint per_source;
  guint8 newcomer;        /* where the one more comes from */
  const char *what;
} Siege;

static void
test_gate_eviction (gconstpointer data)
{
  const Siege *siege = data;
  Gate gate = { cp_test_free_port (), g_cancellable_new (), NULL };
  GThread *thread = g_thread_new ("rank 0", run_rank_0, &gate);
  g_autoptr(GArray) fds = g_array_new (FALSE, FALSE, sizeof (int));
  int newcomer;

  g_test_summary ("A newcomer at a full gate evicts the oldest waiting visitor of its own source when "
                  "that holds its share, else of the busiest source; every other visitor stays");
  for (guint s = 0; s < G_N_ELEMENTS (siege->sources) && siege->sources[s] != 0; s++)
    for (guint i = 0; i < siege->per_source; i++)
      {
        int fd = visit (gate.port, siege->sources[s]);

        g_array_append_val (fds, fd);
      }
  /* Rank 0 took them all in before the newcomer: each had its greeting. */
  for (guint i = 0; i < fds->len; i++)
    g_assert_false (is_closed (g_array_index (fds, int, i), 0));
  newcomer = visit (gate.port, siege->newcomer);
  g_assert_true (is_closed (g_array_index (fds, int, 0), 2000));
  for (guint i = 1; i < fds->len; i++)
    if (is_closed (g_array_index (fds, int, i), i == 1 ? 200 : 0))
      g_error ("%s: rank 0 evicted visitor %u, not only the oldest one", siege->what, i);
  g_assert_false (is_closed (newcomer, 0));
  cp_test_record_outcome (SUBJECT, siege->what, "connection closed",
                          "the oldest visitor of the evicted source, and it alone");
  g_cancellable_cancel (gate.cancellable);
  g_thread_join (thread);
  g_assert_error (gate.error, G_IO_ERROR, G_IO_ERROR_CANCELLED);
  g_clear_error (&gate.error);
  g_object_unref (gate.cancellable);
  for (guint i = 0; i < fds->len; i++)
    close (g_array_index (fds, int, i));
  close (newcomer);
}

static const Siege own_source = { { 2, 0 }, 64, 2, "a gate holding 64 silent visitors from one host, and one "
                                  "more from it: the oldest of that host is evicted" };
static const Siege busiest_source = { { 2, 3 }, 64, 4, "a gate holding 128 silent visitors from two hosts, and "
                                      "one from a third: the oldest of the first busiest host is evicted" };

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/Cp/Bootstrap/mac/each-byte", test_mac_each_byte);
  g_test_add_func ("/Cp/Bootstrap/hello/altered-proof", test_hello_altered_proof);
  g_test_add_func ("/Cp/Bootstrap/hello/other-protocol", test_hello_other_protocol);
  g_test_add_func ("/Cp/Bootstrap/offer/round-trip", test_offer_round_trip);
  g_test_add_func ("/Cp/Bootstrap/offer/empty", test_offer_empty);
  for (gsize i = 0; i < G_N_ELEMENTS (bad_offers); i++)
    {
      g_autofree char *path = g_strdup_printf ("/Cp/Bootstrap/offer/bad/%s", bad_offers[i].path);

      g_test_add_data_func (path, &bad_offers[i], test_offer_bad);
    }
  g_test_add_func ("/Cp/Bootstrap/table/blobs", test_table_blobs);
  g_test_add_func ("/Cp/Bootstrap/exchange/several-blobs", test_several_blobs);
  g_test_add_func ("/Cp/Bootstrap/exchange/bad-blob-of-one-backend", test_bad_blob_of_one_backend);
  g_test_add_data_func ("/Cp/Bootstrap/gate/evict/own-source", &own_source, test_gate_eviction);
  g_test_add_data_func ("/Cp/Bootstrap/gate/evict/busiest-source", &busiest_source, test_gate_eviction);
  return g_test_run ();
}
