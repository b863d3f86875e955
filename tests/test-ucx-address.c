/* test-ucx-address.c: what UCX itself reads from peers: worker addresses, and its TCP port
 *
 * A worker address is the one blob of a peer that UCX parses itself, and
 * UCX 1.13 trusts it: a version it does not know is an assertion that
 * aborts the process.  These cases check the parser that reads every
 * peer's address first (cp-ucx-address.c), byte by byte, and then play a
 * rank that holds the token and offers a crafted address, as a joiner to
 * rank 0 and as rank 0 to the joiners: every real rank must fail with
 * CP_MESH_ERROR_TRANSPORT naming the address, and none may abort.
 *
 * UCX's TCP transport listens for anyone, and UCX 1.13 aborts on a
 * stranger's bytes there; a rank whose UCX uses TCP on an interface
 * other hosts reach says so.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>

#include "cp-bootstrap-private.h"
#include "cp-error.h"
#include "cp-test-procs.h"
#include "cp-test-util.h"
#include "cp-ucx-private.h"
#include "cp-ucx-wire-private.h"

#define SUBJECT "CpMesh (ucx)"
#define SETTINGS CP_TEST_SETTINGS
#define TOKEN "insider"

/* ---- addresses made by hand ---- */

/* One transport of a synthetic address. */
typedef struct
{
  guint16 checksum;
  guint8 iface_length;
  gfloat bandwidth;
  guint8 extra_flags;   /* or'ed into the interface length byte */
} Transport;

/* A v1 or v2 worker address with one device of @device_length bytes and
 * @n transports, as UCX 1.13 packs one. */
static GByteArray *
build_address (guint            version,
               guint8           device_length,
               const Transport *transports,
               guint            n)
{
  GByteArray *bytes = g_byte_array_new ();
  guint8 header[2] = { (guint8) version, 0x02 };   /* v2: the worker id flag */
  guint8 uuid[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
  guint8 md = 0, length = 0x80 | device_length;    /* the last device */
  guint8 zero[64] = { 0 };

  g_byte_array_append (bytes, header, version == 0 ? 1 : 2);
  g_byte_array_append (bytes, uuid, sizeof uuid);
  g_byte_array_append (bytes, &md, 1);
  g_byte_array_append (bytes, &length, 1);
  g_byte_array_append (bytes, zero, device_length);
  for (guint i = 0; i < n; i++)
    {
      guint8 attributes[16] = { 0 };
      guint8 iface = transports[i].iface_length | transports[i].extra_flags | (i == n - 1 ? 0x80 : 0);

      memcpy (attributes + 4, &transports[i].bandwidth, sizeof (gfloat));
      g_byte_array_append (bytes, (const guint8 *) &transports[i].checksum, 2);
      g_byte_array_append (bytes, attributes, version == 0 ? 16 : 8);
      g_byte_array_append (bytes, &iface, 1);
      g_byte_array_append (bytes, zero, transports[i].iface_length);
    }
  return bytes;
}

static const Transport tcp_like = { 0x1234, 2, 1e9f, 0 };
static const Transport shm_like = { 0xbeef, 9, 1e10f, 0 };

static void
assert_refused (const guint8 *data,
                gsize         size,
                const char   *text,
                const char   *what)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(GArray) entries = _cp_ucx_address_parse (data, size, &error);

  g_assert_null (entries);
  g_test_message ("%s: %s", what, error->message);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT, what);
  if (strstr (error->message, text) == NULL)
    g_error ("expected \"%s\" in \"%s\"", text, error->message);
}

static void
test_parse_valid (void)
{
  for (guint version = 0; version <= 1; version++)
    {
      Transport both[] = { tcp_like, shm_like };
      g_autoptr(GByteArray) address = build_address (version, 6, both, 2);
      g_autoptr(GError) error = NULL;
      g_autoptr(GArray) entries = _cp_ucx_address_parse (address->data, address->len, &error);
      CpUcxAddressEntry *second;

      g_assert_no_error (error);
      g_assert_cmpuint (entries->len, ==, 2);
      second = &g_array_index (entries, CpUcxAddressEntry, 1);
      g_assert_cmpuint (second->checksum, ==, 0xbeef);
      g_assert_cmpuint (second->device_length, ==, 6);
      g_assert_cmpuint (second->iface_length, ==, 9);
    }
}

static void
test_parse_malformed (void)
{
  Transport one[] = { tcp_like };
  g_autoptr(GByteArray) v1 = build_address (0, 6, one, 1);
  g_autoptr(GByteArray) v2 = build_address (1, 6, one, 1);
  g_autoptr(GByteArray) copy = NULL;

  g_test_summary ("Worker addresses UCX 1.13 would assert on, read past or misuse are refused "
                  "with CP_MESH_ERROR_TRANSPORT");
  for (guint version = 2; version < 16; version++)
    {
      guint8 header = (guint8) version;

      assert_refused (&header, 1, "address version", "a UCX worker address of an unknown version");
    }
  copy = g_byte_array_sized_new (v1->len);
  for (guint length = 0; length < v1->len; length++)
    assert_refused (v1->data, length, "it ends inside", "a UCX worker address cut short");
  for (guint length = 0; length < v2->len; length++)
    assert_refused (v2->data, length, "it ends inside", "a UCX worker address (v2) cut short");
  g_byte_array_append (copy, v1->data, v1->len);
  g_byte_array_append (copy, (const guint8 *) "x", 1);
  assert_refused (copy->data, copy->len, "1 bytes follow its end", "a UCX worker address with trailing bytes");
  g_byte_array_set_size (copy, 0);
  g_byte_array_append (copy, v2->data, v2->len);
  copy->data[1] |= 0x10;
  assert_refused (copy->data, copy->len, "header flags 0x12", "a UCX worker address with unknown header flags");
  {
    Transport with_endpoint = tcp_like;
    g_autoptr(GByteArray) endpoint = NULL;

    with_endpoint.extra_flags = 0x40;
    endpoint = build_address (0, 6, &with_endpoint, 1);
    assert_refused (endpoint->data, endpoint->len, "endpoint addresses",
                    "a UCX worker address carrying endpoint addresses");
  }
  for (guint i = 0; i < 3; i++)
    {
      Transport bad = tcp_like;
      g_autoptr(GByteArray) address = NULL;

      bad.bandwidth = (gfloat[]) { 0.0f, -1.0f, NAN }[i];
      address = build_address (0, 6, &bad, 1);
      assert_refused (address->data, address->len, "bandwidth", "a UCX worker address whose bandwidth is 0, negative or NaN");
    }
}

static void
test_parse_limits (void)
{
  g_autoptr(GByteArray) devices = g_byte_array_new ();
  guint8 header[10] = { 0 };
  guint8 v2_md[] = { 0x01, 0x02, 1, 2, 3, 4, 5, 6, 7, 8, 0x7f, 64, 0x80 };
  guint8 no_paths[] = { 0x00, 1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0x80 | 0x40, 0 };

  g_test_summary ("Worker addresses beyond what UCX holds (devices, memory domains, paths) are refused");
  /* 129 devices without transports: UCX indexes an array of 128 by device. */
  g_byte_array_append (devices, header, 9);
  for (guint i = 0; i < 129; i++)
    {
      guint8 device[2] = { 0x80, i == 128 ? 0x80 : 0 };

      g_byte_array_append (devices, device, 2);
    }
  assert_refused (devices->data, devices->len, "more than 128 devices", "a UCX worker address of 129 devices");
  assert_refused (v2_md, sizeof v2_md, "memory domain 64", "a UCX worker address naming memory domain 64");
  assert_refused (no_paths, sizeof no_paths, "0 paths", "a UCX worker address of a device with 0 paths");
}

/* A peer's transport that this rank has too must have the address
 * lengths this rank's gives it: a TCP entry without a device address
 * would hand UCX's TCP transport a NULL device address. */
static void
test_check_lengths (void)
{
  Transport own_transports[] = { tcp_like, shm_like };
  Transport short_tcp = tcp_like;
  Transport unknown = { 0x5555, 1, 1e9f, 0 };
  g_autoptr(GByteArray) own = build_address (0, 6, own_transports, 2);
  g_autoptr(GByteArray) theirs = NULL;
  g_autoptr(GByteArray) stranger = build_address (0, 3, &unknown, 1);
  g_autoptr(GBytes) own_bytes = g_bytes_new (own->data, own->len);
  g_autoptr(GBytes) their_bytes = NULL;
  g_autoptr(GBytes) stranger_bytes = g_bytes_new (stranger->data, stranger->len);
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_ucx_address_check (own_bytes, own_bytes, &error));
  g_assert_no_error (error);
  /* A transport this rank does not have is UCX's to skip. */
  g_assert_true (_cp_ucx_address_check (stranger_bytes, own_bytes, &error));
  g_assert_no_error (error);
  short_tcp.iface_length = 1;
  theirs = build_address (0, 0, &short_tcp, 1);
  their_bytes = g_bytes_new (theirs->data, theirs->len);
  g_assert_false (_cp_ucx_address_check (their_bytes, own_bytes, &error));
  g_test_message ("%s", error->message);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT,
                       "a UCX worker address whose transport has address lengths this rank's never has");
  g_assert_nonnull (strstr (error->message, "checksum 0x1234 has a device address of 0 bytes and an interface "
                                            "address of 1"));
}

/* ---- real workers ---- */

static GBytes *
own_worker_address (void)
{
  CpBootstrapRoute route = { NULL, NULL, TRUE };
  g_autoptr(GError) error = NULL;
  CpUcxWorker *worker = _cp_ucx_worker_new (1000, &route, &error);
  GBytes *address;

  g_assert_no_error (error);
  address = _cp_ucx_worker_dup_address (worker, &error);
  g_assert_no_error (error);
  _cp_ucx_worker_free (worker);
  return address;
}

static void
test_real_address (void)
{
  g_autoptr(GBytes) address = own_worker_address ();
  g_autoptr(GError) error = NULL;
  g_autoptr(GArray) entries = _cp_ucx_address_parse (g_bytes_get_data (address, NULL),
                                                     g_bytes_get_size (address), &error);
  gsize size = g_bytes_get_size (address);
  g_autofree guint8 *copy = g_memdup2 (g_bytes_get_data (address, NULL), size);

  g_test_summary ("This UCX's own worker address parses, and no prefix of it does");
  g_assert_no_error (error);
  g_assert_cmpuint (entries->len, >=, 1);
  g_assert_true (_cp_ucx_address_check (address, address, &error));
  for (gsize length = 0; length < size; length++)
    {
      g_autoptr(GError) cut = NULL;
      g_autoptr(GArray) none = _cp_ucx_address_parse (copy, length, &cut);

      g_assert_null (none);
      g_assert_error (cut, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT);
    }
  copy[0] = 0x05;
  assert_refused (copy, size, "address version 5", "a real UCX worker address with version 5");
}

/* ---- an insider's rendezvous ---- */

typedef struct
{
  int rank;
  int world_size;
  guint16 port;
  GBytes *blob;
  GError *error;
  GPtrArray *blobs;
} Insider;

/* Plays @insider's rank through the real rendezvous, with its crafted
 * blob as its UCX address and the token, checking nobody's blob. */
static gpointer
run_insider (gpointer data)
{
  Insider *insider = data;
  CpMeshConfig config;
  CpBootstrapRoute route;
  gint64 deadline = g_get_monotonic_time () + CP_TEST_RANK_TIMEOUT_MS * G_TIME_SPAN_MILLISECOND;

  g_autoptr(CpBootstrapOffer) offer = _cp_bootstrap_offer_new ();

  _cp_bootstrap_offer_add (offer, "ucx", insider->blob);
  g_assert_true (_cp_mesh_config_init (&config, insider->rank, insider->world_size, "127.0.0.1", insider->port,
                                       TOKEN, NULL, NULL, 0, CP_TEST_RANK_TIMEOUT_MS, NULL));
  g_assert_true (_cp_bootstrap_find_route (&config, &route, NULL));
  insider->blobs = _cp_bootstrap_exchange (&config, &route, offer, NULL, 0, deadline, NULL, &insider->error);
  _cp_bootstrap_route_clear (&route);
  _cp_mesh_config_clear (&config);
  return NULL;
}

/* A crafted address UCX 1.13 asserts on: version 5. */
static GBytes *
crafted_address (void)
{
  g_autoptr(GBytes) real = own_worker_address ();
  gsize size = g_bytes_get_size (real);
  guint8 *copy = g_memdup2 (g_bytes_get_data (real, NULL), size);

  copy[0] = 0x05;
  return g_bytes_new_take (copy, size);
}

/* Asserts that @rank failed with CP_MESH_ERROR_TRANSPORT, exiting as a
 * rank that reports an error does (not aborted), with @text and
 * "malformed UCX worker address" in its message. */
static void
assert_rank_refused (CpTestRank *rank,
                     const char *text,
                     const char *what)
{
  g_autoptr(GError) error = cp_test_rank_dup_error (rank, CP_MESH_ERROR_TRANSPORT, text);

  g_test_message ("%s", error->message);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT, what);
  g_assert_nonnull (strstr (error->message, "a malformed UCX worker address"));
  g_assert_nonnull (strstr (error->message, "address version 5"));
}

static void
test_from_joiner (void)
{
  guint16 port = cp_test_free_port ();
  CpTestGroup group = { 0 };
  Insider insider = { 1, 3, port, crafted_address (), NULL, NULL };
  CpTestRank *root, *other;
  GThread *thread;

  g_test_summary ("A joiner that holds the token and offers a malformed worker address makes every "
                  "rank fail with CP_MESH_ERROR_TRANSPORT; rank 0 does not abort");
  root = cp_test_group_spawn (&group, "join", 0, 3, port, SETTINGS ("CPMESH_TOKEN=" TOKEN));
  other = cp_test_group_spawn (&group, "join", 2, 3, port, SETTINGS ("CPMESH_TOKEN=" TOKEN));
  thread = g_thread_new ("insider", run_insider, &insider);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  g_thread_join (thread);
  assert_rank_refused (root, "rank 0: rank 1 (from 127.0.0.1:",
                       "rendezvous: a joiner holding the token offers a malformed UCX worker address: rank 0");
  assert_rank_refused (other, "gave up: rank 0: rank 1 (from",
                       "rendezvous: a joiner holding the token offers a malformed UCX worker address: another joiner");
  g_assert_null (insider.blobs);
  CP_TEST_ASSERT_CASE (insider.error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT,
                       "rendezvous: a joiner holding the token offers a malformed UCX worker address: that joiner");
  g_assert_nonnull (strstr (insider.error->message, "address version 5"));
  g_clear_error (&insider.error);
  g_bytes_unref (insider.blob);
  cp_test_group_clear (&group);
}

static void
test_from_rank_0 (void)
{
  guint16 port = cp_test_free_port ();
  CpTestGroup group = { 0 };
  Insider insider = { 0, 3, port, crafted_address (), NULL, NULL };
  GThread *thread = g_thread_new ("insider", run_insider, &insider);

  g_test_summary ("A rank 0 that holds the token and sends a malformed worker address in the table "
                  "makes every joiner fail with CP_MESH_ERROR_TRANSPORT; none aborts");
  cp_test_group_spawn (&group, "join", 1, 3, port, SETTINGS ("CPMESH_TOKEN=" TOKEN));
  cp_test_group_spawn (&group, "join", 2, 3, port, SETTINGS ("CPMESH_TOKEN=" TOKEN));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  g_thread_join (thread);
  for (guint r = 0; r < group.n; r++)
    assert_rank_refused (group.ranks[r], "holds, for rank 0's ucx, a malformed UCX worker address",
                         "rendezvous: rank 0 holding the token sends a malformed UCX worker address in the "
                         "table: every joiner");
  g_assert_no_error (insider.error);
  g_ptr_array_unref (insider.blobs);
  g_bytes_unref (insider.blob);
  cp_test_group_clear (&group);
}

/* ---- UCX's TCP port ---- */

/* An interface other hosts may reach (up, with an IPv4 address, not
 * loopback), or NULL. */
static char *
outside_interface (void)
{
  struct ifaddrs *list = NULL;
  char *name = NULL;

  if (getifaddrs (&list) != 0)
    return NULL;
  for (struct ifaddrs *ifa = list; ifa != NULL && name == NULL; ifa = ifa->ifa_next)
    if (ifa->ifa_addr != NULL && ifa->ifa_addr->sa_family == AF_INET && (ifa->ifa_flags & IFF_UP) &&
        !(ifa->ifa_flags & IFF_LOOPBACK))
      name = g_strdup (ifa->ifa_name);
  freeifaddrs (list);
  return name;
}

static void
count_tcp_message (const char     *domain,
                   GLogLevelFlags  level,
                   const char     *message,
                   gpointer        user_data)
{
  if (strstr (message, "UCX uses TCP") != NULL)
    (*(guint *) user_data)++;
}

static void
start_worker (CpBootstrapRoute *route)
{
  g_autoptr(GError) error = NULL;
  CpUcxWorker *worker = _cp_ucx_worker_new (1000, route, &error);

  g_assert_no_error (error);
  _cp_ucx_worker_free (worker);
}

static void
test_tcp_reachable (void)
{
  g_autofree char *device = outside_interface ();
  CpBootstrapRoute route = { NULL, device, FALSE };
  g_autofree char *pattern = g_strdup_printf ("UCX uses TCP on %s: any process that reaches that network "
                                              "can connect to this rank's UCX port*", device);
  guint seen = 0;
  guint handler;

  g_test_summary ("A rank whose UCX uses TCP on an interface other hosts reach says so, once");
  if (device == NULL)
    {
      g_test_skip ("this host has no interface but loopback");
      return;
    }
  g_test_expect_message ("Cp", G_LOG_LEVEL_MESSAGE, pattern);
  start_worker (&route);
  g_test_assert_expected_messages ();
  handler = g_log_set_handler ("Cp", G_LOG_LEVEL_MESSAGE, count_tcp_message, &seen);
  start_worker (&route);
  g_log_remove_handler ("Cp", handler);
  g_assert_cmpuint (seen, ==, 0);
}

static void
test_tcp_loopback (void)
{
  CpBootstrapRoute route = { NULL, NULL, TRUE };
  guint seen = 0;
  guint handler = g_log_set_handler ("Cp", G_LOG_LEVEL_MESSAGE, count_tcp_message, &seen);

  g_test_summary ("Ranks that meet over loopback (shared memory), or whose TCP keeps to loopback, "
                  "say nothing of TCP");
  start_worker (&route);
  g_setenv ("UCX_TLS", "tcp,self", TRUE);
  g_setenv ("UCX_NET_DEVICES", "lo", TRUE);
  start_worker (&route);
  g_log_remove_handler ("Cp", handler);
  g_assert_cmpuint (seen, ==, 0);
}

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/Cp/Ucx/address/parse/valid", test_parse_valid);
  g_test_add_func ("/Cp/Ucx/address/parse/malformed", test_parse_malformed);
  g_test_add_func ("/Cp/Ucx/address/parse/limits", test_parse_limits);
  g_test_add_func ("/Cp/Ucx/address/check/lengths", test_check_lengths);
  g_test_add_func ("/Cp/Ucx/address/real", test_real_address);
  g_test_add_func ("/Cp/Ucx/address/insider/joiner", test_from_joiner);
  g_test_add_func ("/Cp/Ucx/address/insider/rank-0", test_from_rank_0);
  g_test_add_func ("/Cp/Ucx/tcp/reachable", test_tcp_reachable);
  g_test_add_func ("/Cp/Ucx/tcp/loopback", test_tcp_loopback);
  return g_test_run ();
}
