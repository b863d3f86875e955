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
  g_test_add_data_func ("/Cp/Bootstrap/gate/evict/own-source", &own_source, test_gate_eviction);
  g_test_add_data_func ("/Cp/Bootstrap/gate/evict/busiest-source", &busiest_source, test_gate_eviction);
  return g_test_run ();
}
