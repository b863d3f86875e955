/* test-ucx.c: multi-process meshes over UCX
 *
 * Each case starts ranks as processes of cp-test-ucx-rank over loopback
 * and checks what they report.  The cases every backend must pass
 * (cancellation among them) are test-conformance.c's, which runs them
 * over UCX too (conformance-ucx).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cp-test-procs.h"
#include "cp-test-util.h"

#define TIMEOUT_MS CP_TEST_RANK_TIMEOUT_MS
#define SETTINGS CP_TEST_SETTINGS

typedef CpTestRank Rank;
typedef CpTestGroup Group;

/* ---- collectives ---- */

static void
test_collectives (gconstpointer data)
{
  int n = GPOINTER_TO_INT (data);
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  g_test_summary ("Every collective over UCX between processes equals the in-process "
                  "backend bit for bit");
  for (int r = 0; r < n; r++)
    cp_test_group_spawn (&group, "collectives", r, n, port,
           n == 4 ? SETTINGS ("CPMESH_MESH_DIMS=dp=2,cp=2", "CPMESH_TIMEOUT_MS=30000")
                  : SETTINGS ("CPMESH_TIMEOUT_MS=30000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < n; r++)
    {
      cp_test_assert_exit (group.ranks[r], 0);
      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "OK"));
    }
  cp_test_group_clear (&group);
}

/* ---- rendezvous ---- */

/* Rank 0 of a world of two refuses @impostor, then lets the real rank 1
 * in: the listener keeps serving after a rejection. */
/* Asserts that @rank failed to join with @code and a message holding
 * @text, and records the case. */
static void
assert_join_error (Rank       *rank,
                   int         code,
                   const char *text,
                   const char *what)
{
  g_autoptr(GError) error = cp_test_rank_dup_error (rank, code, text);

  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, code, "CpMesh (ucx)", what);
}

static void
check_rejection (const char * const *impostor,
                 int                 impostor_world,
                 int                 code,
                 const char         *text,
                 const char         *what)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  Rank *root, *bad, *good;

  root = cp_test_group_spawn (&group, "join", 0, 2, port, SETTINGS ("CPMESH_TOKEN=right"));
  bad = cp_test_group_spawn (&group, "join", 1, impostor_world, port, impostor);
  cp_test_run_until (&bad, 1, cp_test_all_done);
  assert_join_error (bad, code, text, what);
  good = cp_test_group_spawn (&group, "join", 1, 2, port, SETTINGS ("CPMESH_TOKEN=right"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  cp_test_assert_exit (root, 0);
  cp_test_assert_exit (good, 0);
  g_assert_nonnull (cp_test_rank_find_line (good, "JOINED 1"));
  cp_test_group_clear (&group);
}

static void
test_wrong_token (void)
{
  g_test_summary ("A rank without the token is refused with AUTH; the token never "
                  "crosses the wire");
  check_rejection (SETTINGS ("CPMESH_TOKEN=wrong"), 2, CP_MESH_ERROR_AUTH,
                   "did not prove it holds the mesh token",
                   "a rank joins with the wrong token (rank 0 keeps listening)");
  check_rejection (SETTINGS ("CPMESH_TIMEOUT_MS=3000"), 2, CP_MESH_ERROR_AUTH, "CPMESH_TOKEN",
                   "a rank joins without a token where rank 0 has one");
}

static void
test_wrong_world (void)
{
  check_rejection (SETTINGS ("CPMESH_TOKEN=right"), 3, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "started with world size 3, rank 0 with 2",
                   "a rank joins with another world size than rank 0's");
  check_rejection (SETTINGS ("CPMESH_TOKEN=right", "CPMESH_MESH_DIMS=dp=1,cp=2"), 2,
                   CP_MESH_ERROR_INVALID_TOPOLOGY, "its mesh dimensions are dp=1,cp=2, rank 0's are cp=2",
                   "a rank joins with other mesh dimensions than rank 0's");
}

/* Every rank reaches one verdict at once when one of them cannot offer
 * UCX: that rank joins the rendezvous offering nothing. */
static void
test_rank_without_backend (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  gint64 started = g_get_monotonic_time ();

  g_test_summary ("When one rank cannot run UCX, every rank of a process mesh fails with "
                  "CP_MESH_ERROR_UNSUPPORTED at once, the others naming that rank, rather than at the "
                  "timeout");
  cp_test_group_spawn (&group, "join", 0, 3, port, SETTINGS ("CPMESH_TIMEOUT_MS=60000"));
  cp_test_group_spawn (&group, "join", 1, 3, port, SETTINGS ("CPMESH_TIMEOUT_MS=60000"));
  cp_test_group_spawn (&group, "join", 2, 3, port, SETTINGS ("CPMESH_TIMEOUT_MS=60000", "UCX_UNIFIED_MODE=y"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  g_assert_cmpint (g_get_monotonic_time () - started, <, 30 * G_TIME_SPAN_SECOND);
  assert_join_error (group.ranks[0], CP_MESH_ERROR_UNSUPPORTED, "rank 2 does not offer it",
                     "one rank of a process mesh cannot run UCX: rank 0");
  assert_join_error (group.ranks[1], CP_MESH_ERROR_UNSUPPORTED, "rank 2 does not offer it",
                     "one rank of a process mesh cannot run UCX: another rank");
  assert_join_error (group.ranks[2], CP_MESH_ERROR_UNSUPPORTED, ": UCX_UNIFIED_MODE=y",
                     "one rank of a process mesh cannot run UCX: that rank, which says why");
  cp_test_group_clear (&group);
}

/* Two processes claim rank 1: whichever comes second is refused. */
static void
test_duplicate_rank (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  Rank *first, *second, *refused, *accepted;

  cp_test_group_spawn (&group, "join", 0, 3, port, NULL);
  first = cp_test_group_spawn (&group, "join", 1, 3, port, NULL);
  second = cp_test_group_spawn (&group, "join", 1, 3, port, NULL);
  cp_test_run_until ((Rank *[]) { first, second }, 2, cp_test_any_done);
  refused = cp_test_rank_is_done (first) ? first : second;
  accepted = refused == first ? second : first;
  assert_join_error (refused, CP_MESH_ERROR_INVALID_TOPOLOGY, "rank 1 has already joined",
                     "two processes claim the same rank (the second is refused)");
  cp_test_group_spawn (&group, "join", 2, 3, port, NULL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  cp_test_assert_exit (group.ranks[0], 0);
  cp_test_assert_exit (accepted, 0);
  cp_test_assert_exit (group.ranks[3], 0);
  cp_test_group_clear (&group);
}

/* A rank admitted and then killed before the mesh formed leaves its
 * place to a rank 1 that starts again. */
static void
test_rejoin (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  Rank *lost, *again;

  g_test_summary ("An admitted rank that dies before the mesh formed frees its place for a "
                  "restarted rank");
  cp_test_group_spawn (&group, "join", 0, 3, port, SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  lost = cp_test_group_spawn (&group, "join", 1, 3, port, SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  /* Long enough to be admitted; the mesh cannot form without rank 2. */
  g_usleep (G_TIME_SPAN_SECOND);
  g_subprocess_send_signal (lost->process, SIGKILL);
  cp_test_run_until (&lost, 1, cp_test_all_done);
  again = cp_test_group_spawn (&group, "join", 1, 3, port, SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  cp_test_group_spawn (&group, "join", 2, 3, port, SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  g_assert_true (g_subprocess_get_if_signaled (lost->process));
  cp_test_assert_exit (group.ranks[0], 0);
  cp_test_assert_exit (again, 0);
  cp_test_assert_exit (group.ranks[3], 0);
  g_assert_nonnull (cp_test_rank_find_line (again, "JOINED 1"));
  cp_test_group_clear (&group);
  cp_test_record_outcome ("CpMesh (ucx)", "an admitted rank dies before the mesh formed, and starts again",
                          "the new rank takes its place", "rank 0 freed the place when the connection "
                          "closed; the restarted rank 1 joined");
}

static int
connect_raw (guint16 port)
{
  struct sockaddr_in address = {
    .sin_family = AF_INET,
    .sin_port = htons (port),
    .sin_addr.s_addr = htonl (INADDR_LOOPBACK),
  };
  int fd = socket (AF_INET, SOCK_STREAM, 0);

  for (int attempt = 0; attempt < 200; attempt++)
    {
      if (connect (fd, (struct sockaddr *) &address, sizeof address) == 0)
        return fd;
      g_usleep (20 * G_TIME_SPAN_MILLISECOND);
    }
  g_error ("nothing listens on port %u", port);
}

static void
send_garbage (int   fd,
              gsize size)
{
  g_autofree guint8 *bytes = g_malloc (size);

  gssize sent;

  for (gsize i = 0; i < size; i++)
    bytes[i] = (guint8) g_random_int ();
  /* Rank 0 may hang up as soon as it has read enough to refuse. */
  sent = send (fd, bytes, size, MSG_NOSIGNAL);
  if (sent < 0)
    g_assert_true (errno == EPIPE || errno == ECONNRESET);
  else
    g_assert_cmpint (sent, ==, (gssize) size);
}

/* Random bytes on the listener's port, on a connection kept open and on
 * one closed right away, neither crash nor wedge rank 0. */
static void
test_garbage (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  int lingering, closed;
  guint64 small_header[2] = { 8, 0 };

  cp_test_group_spawn (&group, "join", 0, 2, port, NULL);
  lingering = connect_raw (port);
  send_garbage (lingering, 4096);
  closed = connect_raw (port);
  /* A header that claims a short payload, then nonsense. */
  g_assert_cmpint (send (closed, small_header, sizeof small_header, MSG_NOSIGNAL), ==, sizeof small_header);
  send_garbage (closed, 64);
  close (closed);
  cp_test_group_spawn (&group, "join", 1, 2, port, NULL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  cp_test_assert_exit (group.ranks[0], 0);
  cp_test_assert_exit (group.ranks[1], 0);
  close (lingering);
  cp_test_group_clear (&group);
  cp_test_record_outcome ("CpMesh (ucx)", "random bytes on rank 0's rendezvous port",
                          "connection closed, rank 0 keeps listening",
                          "rank 0 closed the connection and let the real rank 1 join");
}

static void
test_nobody_listens (void)
{
  Group group = { 0 };
  gint64 started = g_get_monotonic_time ();
  Rank *lonely = cp_test_group_spawn (&group, "join", 1, 2, cp_test_free_port (), SETTINGS ("CPMESH_TIMEOUT_MS=500"));

  cp_test_run_until (&lonely, 1, cp_test_all_done);
  assert_join_error (lonely, CP_MESH_ERROR_TIMED_OUT, "rank 0 did not answer at 127.0.0.1:",
                     "a rank joins where no rank 0 listens, within the timeout");
  g_assert_cmpint (g_get_monotonic_time () - started, <, 5 * G_TIME_SPAN_SECOND);
  cp_test_group_clear (&group);
}

/* ---- failures ---- */

static void
check_survivor (Rank   *rank,
                gint64  since_kill_us)
{
  const char *line = cp_test_rank_find_line (rank, "FAILED");
  const char *closed = cp_test_rank_find_line (rank, "CLOSED");
  int code;
  gint64 waited_ms;

  g_assert_nonnull (line);
  g_assert_nonnull (closed);
  g_assert_cmpint (sscanf (line, "FAILED %d %" G_GINT64_FORMAT, &code, &waited_ms), ==, 2);
  if (code != CP_MESH_ERROR_PEER_LOST && code != CP_MESH_ERROR_TIMED_OUT)
    g_error ("unexpected failure: %s", line);
  g_test_message ("survivor: %s; %s", line, closed);
  g_assert_cmpint (waited_ms, <=, TIMEOUT_MS + 1000);
  g_assert_cmpint (g_ascii_strtoll (closed + strlen ("CLOSED "), NULL, 10), <, 3000);
  g_assert_cmpint (since_kill_us / 1000, <=, TIMEOUT_MS + 3000);
  cp_test_assert_exit (rank, 0);
}

static void
test_sigkill (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  gint64 killed;

  g_test_summary ("A rank killed in the middle of all_gathers makes the others fail with "
                  "PEER_LOST or TIMED_OUT within the timeout, and nothing is left behind");
  for (int r = 0; r < 3; r++)
    cp_test_group_spawn (&group, "gather-loop", r, 3, port, NULL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_ready);
  g_subprocess_send_signal (group.ranks[2]->process, SIGKILL);
  killed = g_get_monotonic_time ();
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  check_survivor (group.ranks[0], g_get_monotonic_time () - killed);
  check_survivor (group.ranks[1], g_get_monotonic_time () - killed);
  g_assert_true (g_subprocess_get_if_signaled (group.ranks[2]->process));
  cp_test_group_clear (&group);
}

/* A rank that fails takes in every notice its peers send and drops what
 * the failure left in flight before its worker goes, so UCX has no
 * unmatched message to warn of (on standard output, amid the program's
 * own, as a launcher shows it). */
static void
test_sigkill_quiet (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  g_test_summary ("Survivors of a rank killed in the middle of all_gathers among four leave no "
                  "message unmatched: UCX warns of none");
  for (int r = 0; r < 4; r++)
    cp_test_group_spawn (&group, "gather-loop", r, 4, port, NULL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_ready);
  g_subprocess_send_signal (group.ranks[3]->process, SIGKILL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 3; r++)
    {
      Rank *rank = group.ranks[r];

      g_assert_nonnull (cp_test_rank_find_line (rank, "CLOSED"));
      for (guint i = 0; i < rank->lines->len; i++)
        if (strstr (rank->lines->pdata[i], "was not matched") != NULL)
          g_error ("rank %d: %s", r, (const char *) rank->lines->pdata[i]);
      cp_test_assert_exit (rank, 0);
    }
  cp_test_group_clear (&group);
  cp_test_record_outcome ("CpMesh (ucx)", "a rank of four killed during all_gathers: what UCX says as the "
                          "survivors leave", "no warning",
                          "every notice taken in, what the failure left in flight dropped before the worker went");
}

static gboolean
all_reported (CpTestRank **ranks,
              guint        n)
{
  return cp_test_all_said (ranks, n, "LATER_MESSAGE");
}

static const char *
reported (Rank       *rank,
          const char *prefix)
{
  const char *line = cp_test_rank_find_line (rank, prefix);

  g_assert_nonnull (line);
  g_test_message ("%s", line);
  return line + strlen (prefix);
}

/* Rank 1 is stopped for 1.3 timeouts while both run all_gathers.  Both
 * fail the same call — rank 0 when its wait times out, rank 1 as it is
 * continued, on hearing of that — and every later call of both fails at
 * once, naming rank 0's timeout. */
static void
test_sigstop (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  guint failed_at[2];
  const char *named[2];

  g_test_summary ("A rank stopped past the timeout in the middle of all_gathers and then "
                  "continued: both ranks fail the same call, and every later call of both "
                  "fails at once with the first failure named");
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "stop-loop", r, 2, port, SETTINGS ("CPMESH_TIMEOUT_MS=1000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_ready);
  cp_test_run_for (50);
  g_subprocess_send_signal (group.ranks[1]->process, SIGSTOP);
  cp_test_run_for (1300);
  g_subprocess_send_signal (group.ranks[1]->process, SIGCONT);
  cp_test_run_until (group.ranks, group.n, all_reported);
  for (int r = 0; r < 2; r++)
    {
      int code;
      guint calls, succeeded;
      gint64 ms, slowest_ms;
      g_autoptr(GError) error = NULL;

      g_assert_cmpint (sscanf (reported (group.ranks[r], "STOPPED "), "%u %d %" G_GINT64_FORMAT,
                               &failed_at[r], &code, &ms), ==, 3);
      g_assert_cmpint (code, ==, CP_MESH_ERROR_TIMED_OUT);
      g_assert_cmpint (sscanf (reported (group.ranks[r], "LATER "), "%u %u %" G_GINT64_FORMAT,
                               &calls, &succeeded, &slowest_ms), ==, 3);
      g_assert_cmpuint (succeeded, ==, 0);
      g_assert_cmpint (slowest_ms, <=, 100);
      named[r] = strstr (reported (group.ranks[r], "LATER_MESSAGE "), "mesh broken: ");
      g_assert_nonnull (named[r]);
      g_assert_true (g_str_has_prefix (named[r], "mesh broken: rank 0 timed out in all_gather #"));
      error = g_error_new_literal (CP_MESH_ERROR, code, named[r]);
      cp_test_record_error ("CpMesh (ucx)", "a rank is stopped (SIGSTOP) past the timeout during "
                            "all_gathers, then continued (every later call of both ranks, at once)", error);
    }
  g_assert_null (strstr (reported (group.ranks[0], "MESSAGE "), "mesh broken"));
  g_assert_nonnull (strstr (reported (group.ranks[1], "MESSAGE "), "mesh broken: rank 0 timed out in "));
  g_assert_cmpuint (failed_at[0], ==, failed_at[1]);
  g_assert_cmpstr (named[0], ==, named[1]);
  for (int r = 0; r < 2; r++)
    cp_test_rank_release (group.ranks[r]);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 2; r++)
    cp_test_assert_exit (group.ranks[r], 0);
  cp_test_group_clear (&group);
}

static void
test_rank_lost (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  const char *line;
  int rank;
  gint64 after_ms;

  g_test_summary ("An idle main-loop program hears CpMesh::rank-lost when a peer leaves");
  cp_test_group_spawn (&group, "wait-lost", 0, 2, port, NULL);
  cp_test_group_spawn (&group, "wait-lost", 1, 2, port, NULL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  cp_test_assert_exit (group.ranks[0], 0);
  cp_test_assert_exit (group.ranks[1], 0);
  line = cp_test_rank_find_line (group.ranks[0], "LOST");
  g_assert_nonnull (line);
  g_assert_cmpint (sscanf (line, "LOST %d %" G_GINT64_FORMAT, &rank, &after_ms), ==, 2);
  g_test_message ("rank 0: %s", line);
  g_assert_cmpint (rank, ==, 1);
  g_assert_cmpint (after_ms, <=, TIMEOUT_MS);
  cp_test_group_clear (&group);
}

static void
test_async (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  cp_test_group_spawn (&group, "async", 0, 2, port, NULL);
  cp_test_group_spawn (&group, "async", 1, 2, port, NULL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  g_assert_nonnull (cp_test_rank_find_line (group.ranks[0], "OK 0"));
  g_assert_nonnull (cp_test_rank_find_line (group.ranks[1], "OK 1"));
  cp_test_group_clear (&group);
}

/* ---- settings, in this process ---- */

static void
check_bad_environment (const char * const *environment,
                       const char         *text,
                       const char         *what)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (environment, NULL, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh (ucx)", what);
  if (strstr (error->message, text) == NULL)
    g_error ("expected \"%s\" in \"%s\"", text, error->message);
}

static void
test_bad_environment (void)
{
  g_test_summary ("Bad or contradictory launcher settings name the variable and its value");
  check_bad_environment (SETTINGS ("RANK=abc", "WORLD_SIZE=2"), "RANK=\"abc\": expected a whole number",
                         "RANK that is not a number");
  check_bad_environment (SETTINGS ("RANK=2", "WORLD_SIZE=2"), "RANK=\"2\": rank is not below WORLD_SIZE=2",
                         "RANK not below WORLD_SIZE");
  check_bad_environment (SETTINGS ("RANK=1"), "RANK=\"1\": RANK is set but WORLD_SIZE is not",
                         "RANK without WORLD_SIZE");
  check_bad_environment (SETTINGS ("OMPI_COMM_WORLD_SIZE=4"),
                         "OMPI_COMM_WORLD_SIZE=\"4\": OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not",
                         "OMPI_COMM_WORLD_SIZE without OMPI_COMM_WORLD_RANK");
  check_bad_environment (SETTINGS ("SLURM_PROCID=0", "SLURM_NTASKS=0"), "SLURM_NTASKS=\"0\"",
                         "SLURM_NTASKS=0");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=-1"), "LOCAL_RANK=\"-1\"",
                         "a negative LOCAL_RANK");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=4", "CPMESH_MESH_DIMS=dp=2,cp=3"),
                         "CPMESH_MESH_DIMS=\"dp=2,cp=3\": the dimensions hold 6 ranks, but the world size is 4",
                         "CPMESH_MESH_DIMS whose product is not the world size");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=4", "CPMESH_MESH_DIMS=dp2"),
                         "CPMESH_MESH_DIMS=\"dp2\": expected comma-separated NAME=SIZE pairs",
                         "CPMESH_MESH_DIMS that is not NAME=SIZE pairs");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=4", "CPMESH_MESH_DIMS=cp=2,cp=2"),
                         "dimension name \"cp\" is empty or used twice",
                         "CPMESH_MESH_DIMS with a repeated name");
  check_bad_environment (SETTINGS ("CPMESH_TIMEOUT_MS=0"), "CPMESH_TIMEOUT_MS=\"0\"",
                         "CPMESH_TIMEOUT_MS=0");
  check_bad_environment (SETTINGS ("MASTER_PORT=70000"), "MASTER_PORT=\"70000\"",
                         "MASTER_PORT above 65535");
  check_bad_environment (SETTINGS ("MASTER_ADDR="), "MASTER_ADDR=\"\"", "an empty MASTER_ADDR");
  check_bad_environment (SETTINGS ("CPMESH_PORT=0"), "CPMESH_PORT=\"0\": expected a whole number in [1, 65535]",
                         "CPMESH_PORT=0");
  check_bad_environment (SETTINGS ("MASTER_PORT=65535"),
                         "MASTER_PORT=\"65535\": rank 0 listens one above MASTER_PORT unless CPMESH_PORT",
                         "MASTER_PORT=65535 with no CPMESH_PORT (no port above it)");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=5000"), "WORLD_SIZE=\"5000\"",
                         "WORLD_SIZE above the 1024 ranks a UCX mesh holds");
}

/* Numbers and addresses as launchers write them, and nothing else: the
 * C library's readers take more than that. */
static void
test_strict_environment (void)
{
  g_test_summary ("A sign, a leading zero or an old numeric address form is refused, naming the "
                  "variable and its value");
  check_bad_environment (SETTINGS ("MASTER_PORT=+29500"), "MASTER_PORT=\"+29500\": expected a whole number "
                         "in [1, 65535], in decimal digits alone (no sign, spaces or leading zeros)",
                         "MASTER_PORT with a plus sign (+29500)");
  check_bad_environment (SETTINGS ("RANK=-0", "WORLD_SIZE=2"), "RANK=\"-0\": expected a whole number",
                         "RANK=-0");
  check_bad_environment (SETTINGS ("RANK=01", "WORLD_SIZE=2"), "RANK=\"01\": expected a whole number",
                         "RANK with a leading zero (01)");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE= 2"), "WORLD_SIZE=\" 2\": expected a whole number",
                         "WORLD_SIZE with a leading space");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=4", "CPMESH_MESH_DIMS=dp=+2,cp=2"),
                         "CPMESH_MESH_DIMS=\"dp=+2,cp=2\": expected comma-separated NAME=SIZE pairs",
                         "CPMESH_MESH_DIMS with a signed size");
  check_bad_environment (SETTINGS ("MASTER_ADDR=0x7f000001"), "MASTER_ADDR=\"0x7f000001\": a numeric form of "
                         "127.0.0.1 that only some programs read; write 127.0.0.1",
                         "MASTER_ADDR in hexadecimal (0x7f000001)");
  check_bad_environment (SETTINGS ("MASTER_ADDR=127.1"), "MASTER_ADDR=\"127.1\": a numeric form of 127.0.0.1",
                         "MASTER_ADDR in shorthand (127.1)");
  check_bad_environment (SETTINGS ("MASTER_ADDR=2130706433"), "MASTER_ADDR=\"2130706433\": a numeric form of "
                         "127.0.0.1", "MASTER_ADDR as one decimal number");
  check_bad_environment (SETTINGS ("MASTER_ADDR=0177.0.0.1"), "MASTER_ADDR=\"0177.0.0.1\": a numeric form of "
                         "127.0.0.1", "MASTER_ADDR with an octal part");
}

/* Values that are not UTF-8, or carry control characters, reach the
 * message escaped: a binding must be able to convert it, and a terminal
 * must show it as it is. */
static void
check_escaped (const char * const *environment,
               const char         *text,
               int                 code,
               const char         *what)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (environment, NULL, &error);

  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, code, "CpMesh (ucx)", what);
  g_assert_true (g_utf8_validate (error->message, -1, NULL));
  g_assert_null (strchr (error->message, '\033'));
  g_assert_null (strchr (error->message, '\n'));
  if (strstr (error->message, text) == NULL)
    g_error ("expected \"%s\" in \"%s\"", text, error->message);
}

static void
test_environment_not_utf8 (void)
{
  g_test_summary ("Environment values that are not UTF-8 or hold control characters are escaped in "
                  "messages");
  check_escaped (SETTINGS ("MASTER_ADDR=host\xff\xfe"), "MASTER_ADDR=\"host\\xff\\xfe\": expected a host name",
                 CP_MESH_ERROR_INVALID_TOPOLOGY, "MASTER_ADDR that is not UTF-8");
  check_escaped (SETTINGS ("CPMESH_TRANSPORT=u\xe9" "cx"), "transport \"u\\xe9cx\" is not built into",
                 CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT that is not UTF-8");
  check_escaped (SETTINGS ("CPMESH_TRANSPORT=\033[31mred\n"), "transport \"\\x1b[31mred\\x0a\" is not",
                 CP_MESH_ERROR_UNSUPPORTED, "CPMESH_TRANSPORT with an ANSI escape and a newline");
  check_escaped (SETTINGS ("RANK=\xc3", "WORLD_SIZE=2"), "RANK=\"\\xc3\": expected a whole number",
                 CP_MESH_ERROR_INVALID_TOPOLOGY, "RANK that is not UTF-8");
  check_escaped (SETTINGS ("RANK=0", "WORLD_SIZE=2", "CPMESH_MESH_DIMS=c\xffp=2"),
                 "CPMESH_MESH_DIMS=\"c\\xffp=2\": expected comma-separated", CP_MESH_ERROR_INVALID_TOPOLOGY,
                 "CPMESH_MESH_DIMS whose name is not UTF-8");
}

/* torchrun's variables describe this process even when a surrounding
 * mpirun or srun left theirs. */
static void
test_launcher_precedence (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_test_connect (SETTINGS ("RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0",
                                                   "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
                                                   "SLURM_PROCID=5", "SLURM_NTASKS=8",
                                                   "CPMESH_MESH_DIMS=dp=1,cp=1", "CPMESH_TIMEOUT_MS=1234",
                                                   "CPMESH_TRANSPORT=ucx"),
                                         NULL, &error);

  g_assert_no_error (error);
  g_assert_cmpint (cp_mesh_get_rank (mesh), ==, 0);
  g_assert_cmpint (cp_mesh_get_world_size (mesh), ==, 1);
  g_assert_cmpint (cp_mesh_get_local_rank (mesh), ==, 0);
  g_assert_cmpint (cp_mesh_get_dim_size (mesh, "dp"), ==, 1);
  g_assert_cmpuint (cp_mesh_get_timeout_ms (mesh), ==, 1234);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, "ucx");
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
}

/* No launcher's variables: a mesh of this process alone, as documented. */
static void
check_one_rank (CpMesh *mesh)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) t = cp_tensor_new_arange (CP_DTYPE_INT64, 0, 6, 1, NULL);
  g_autoptr(CpTensor) gathered = NULL;

  g_assert_nonnull (mesh);
  g_assert_cmpint (cp_mesh_get_rank (mesh), ==, 0);
  g_assert_cmpint (cp_mesh_get_world_size (mesh), ==, 1);
  g_assert_cmpint (cp_mesh_get_dim_size (mesh, "cp"), ==, 1);
  g_assert_cmpstr (cp_mesh_get_backend (mesh), ==, "ucx");
  gathered = cp_mesh_all_gather (mesh, t, 0, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (gathered, 0, 1, 2, 3, 4, 5);
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
}

/* cp_mesh_new_from_env in a process that no launcher started. */
static void
check_lone_process (void)
{
  const char *launcher_variables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "CPMESH_MESH_DIMS",
  };
  g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE);
  g_autofree char *program = g_test_build_filename (G_TEST_BUILT, "cp-test-ucx-rank", NULL);
  g_autoptr(GSubprocess) process = NULL;
  g_autofree char *out = NULL;
  g_autoptr(GError) error = NULL;

  for (guint i = 0; i < G_N_ELEMENTS (launcher_variables); i++)
    g_subprocess_launcher_unsetenv (launcher, launcher_variables[i]);
  /* Over UCX: on one host the default chain would pick shm. */
  g_subprocess_launcher_setenv (launcher, "CPMESH_TRANSPORT", "ucx", TRUE);
  process = g_subprocess_launcher_spawn (launcher, &error, program, "collectives", NULL);
  g_assert_no_error (error);
  g_assert_true (g_subprocess_communicate_utf8 (process, NULL, NULL, &out, NULL, &error));
  g_assert_no_error (error);
  g_assert_cmpstr (out, ==, "JOINED 0\nOK\n");
  g_assert_true (g_subprocess_get_successful (process));
}

static void
test_no_launcher (void)
{
  const char *nothing[] = { "CPMESH_TRANSPORT=ucx", NULL };
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;

  g_test_summary ("With no launcher's variables, new_from_env and connect_async give a mesh of "
                  "one rank");
  check_lone_process ();
  mesh = cp_test_connect (nothing, NULL, &error);
  g_assert_no_error (error);
  check_one_rank (mesh);
}

/* A free port whose successor is free too. */
static guint16
free_port_pair (void)
{
  for (;;)
    {
      guint16 port = cp_test_free_port ();
      g_autoptr(GSocket) next = g_socket_new (G_SOCKET_FAMILY_IPV4, G_SOCKET_TYPE_STREAM,
                                              G_SOCKET_PROTOCOL_TCP, NULL);
      g_autoptr(GInetAddress) loopback = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4);
      g_autoptr(GSocketAddress) address = g_inet_socket_address_new (loopback, port + 1);

      if (port < 65534 && g_socket_bind (next, address, FALSE, NULL))
        return port;
    }
}

/* Listens on every address at @port, IPv6 and IPv4, as torchrun's agent
 * and torch.distributed's store do on MASTER_PORT. */
static GSocket *
hold_port (guint16 port)
{
  g_autoptr(GError) error = NULL;
  GSocket *socket = g_socket_new (G_SOCKET_FAMILY_IPV6, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP, NULL);
  g_autoptr(GInetAddress) any = g_inet_address_new_any (socket ? G_SOCKET_FAMILY_IPV6 : G_SOCKET_FAMILY_IPV4);
  g_autoptr(GSocketAddress) address = g_inet_socket_address_new (any, port);

  if (socket == NULL)
    socket = g_socket_new (G_SOCKET_FAMILY_IPV4, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP, &error);
  g_assert_no_error (error);
  g_assert_true (g_socket_bind (socket, address, TRUE, &error) && g_socket_listen (socket, &error));
  g_assert_no_error (error);
  return socket;
}

static void
test_port (void)
{
  guint16 master = free_port_pair ();
  g_autoptr(GSocket) store = hold_port (master);
  g_autofree char *master_port = g_strdup_printf ("MASTER_PORT=%u", master);
  g_autofree char *own_port = g_strdup_printf ("CPMESH_PORT=%u", cp_test_free_port ());
  CpTestGroup group = { 0 };

  g_test_summary ("With MASTER_PORT held by another program (torchrun's agent, torch's store), "
                  "rank 0 listens one port above it, or on CPMESH_PORT");
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "join", r, 2, 0, SETTINGS (master_port, "TORCHELASTIC_USE_AGENT_STORE=True"));
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "join", r, 2, 0, SETTINGS (master_port, own_port));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (guint r = 0; r < group.n; r++)
    {
      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "JOINED"));
      cp_test_assert_exit (group.ranks[r], 0);
    }
  cp_test_group_clear (&group);
  cp_test_record_outcome ("CpMesh (ucx)", "another program (torchrun's agent store) listens on "
                          "MASTER_PORT", "the mesh forms", "rank 0 listened on MASTER_PORT + 1, or on "
                          "CPMESH_PORT where set");
}

static gboolean
has_ipv6_loopback (void)
{
  g_autoptr(GSocket) socket = g_socket_new (G_SOCKET_FAMILY_IPV6, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP,
                                            NULL);
  g_autoptr(GInetAddress) loopback = g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV6);
  g_autoptr(GSocketAddress) address = g_inet_socket_address_new (loopback, 0);

  return socket != NULL && g_socket_bind (socket, address, FALSE, NULL);
}

static void
test_ipv6 (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  g_test_summary ("MASTER_ADDR=::1 forms a mesh whose collectives match the in-process backend");
  if (!has_ipv6_loopback ())
    {
      g_test_skip ("this host has no IPv6 loopback");
      return;
    }
  for (int r = 0; r < 2; r++)
    cp_test_group_spawn (&group, "collectives", r, 2, port, SETTINGS ("MASTER_ADDR=::1", "CPMESH_TIMEOUT_MS=30000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 2; r++)
    {
      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "OK"));
      cp_test_assert_exit (group.ranks[r], 0);
    }
  cp_test_group_clear (&group);
}

static void
test_explicit (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = cp_mesh_new_ucx (0, 1, NULL, 0, NULL, NULL, NULL, 0, 0, &error);
  g_autoptr(CpTensor) t = cp_tensor_new_arange (CP_DTYPE_FLOAT32, 0, 4, 1, NULL);
  g_autoptr(CpTensor) gathered = NULL;

  g_assert_no_error (error);
  g_assert_cmpint (cp_mesh_get_dim_size (mesh, "cp"), ==, 1);
  g_assert_cmpint (cp_mesh_get_local_rank (mesh), ==, -1);
  gathered = cp_mesh_all_gather (mesh, t, 0, &error);
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (gathered, t));

  g_assert_null (cp_mesh_new_ucx (2, 2, NULL, 29500, NULL, NULL, NULL, 0, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh (ucx)",
                       "cp_mesh_new_ucx with a rank not below the world size");
  g_clear_error (&error);
  g_assert_null (cp_mesh_new_ucx (1, 2, NULL, 0, NULL, NULL, NULL, 0, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh (ucx)",
                       "cp_mesh_new_ucx joining a rendezvous on port 0");
  g_assert_nonnull (strstr (error->message, "port 0"));
  g_clear_error (&error);
  g_assert_null (cp_mesh_new_ucx (0, 1, NULL, 0, NULL, NULL, NULL, 0, 3000000000u, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh (ucx)",
                       "cp_mesh_new_ucx with a timeout past G_MAXINT ms");
  g_assert_nonnull (strstr (error->message, "timeout 3000000000 ms"));
  g_clear_error (&error);
  g_assert_null (cp_mesh_new_ucx (0, 2, "no.such.host.invalid", 29500, NULL, NULL, NULL, 0, 500, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpMesh (ucx)",
                       "a rendezvous address that does not resolve");
  g_assert_nonnull (strstr (error->message, "no.such.host.invalid"));
}

static gboolean
cancel_soon (gpointer user_data)
{
  g_cancellable_cancel (user_data);
  return G_SOURCE_REMOVE;
}

static void
test_cancel (void)
{
  g_autoptr(GCancellable) cancellable = g_cancellable_new ();
  g_autofree char *port = g_strdup_printf ("MASTER_PORT=%u", cp_test_free_port ());
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;
  gint64 started = g_get_monotonic_time ();

  g_timeout_add (100, cancel_soon, cancellable);
  mesh = cp_test_connect (SETTINGS ("RANK=1", "WORLD_SIZE=2", "CPMESH_TIMEOUT_MS=20000", port),
                       cancellable, &error);
  g_assert_null (mesh);
  CP_TEST_ASSERT_CASE (error, G_IO_ERROR, G_IO_ERROR_CANCELLED, "CpMesh (ucx)",
                       "cp_mesh_connect_async cancelled while waiting for rank 0");
  g_assert_cmpint (g_get_monotonic_time () - started, <, 5 * G_TIME_SPAN_SECOND);
}

int
main (int   argc,
      char *argv[])
{
  /* TAP's way of skipping a whole program. */
  if (!CP_HAS_UCX)
    {
      g_print ("1..0 # SKIP libcpmesh was built without UCX\n");
      return 0;
    }
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Ucx/settings/bad-environment", test_bad_environment);
  g_test_add_func ("/Cp/Ucx/settings/strict-environment", test_strict_environment);
  g_test_add_func ("/Cp/Ucx/settings/environment-not-utf8", test_environment_not_utf8);
  g_test_add_func ("/Cp/Ucx/settings/launcher-precedence", test_launcher_precedence);
  g_test_add_func ("/Cp/Ucx/settings/explicit", test_explicit);
  g_test_add_func ("/Cp/Ucx/settings/no-launcher", test_no_launcher);
  g_test_add_func ("/Cp/Ucx/settings/port", test_port);
  g_test_add_func ("/Cp/Ucx/settings/ipv6", test_ipv6);
  g_test_add_func ("/Cp/Ucx/settings/cancel", test_cancel);
  g_test_add_data_func ("/Cp/Ucx/collectives/2", GINT_TO_POINTER (2), test_collectives);
  g_test_add_data_func ("/Cp/Ucx/collectives/3", GINT_TO_POINTER (3), test_collectives);
  g_test_add_data_func ("/Cp/Ucx/collectives/4", GINT_TO_POINTER (4), test_collectives);
  g_test_add_func ("/Cp/Ucx/rendezvous/wrong-token", test_wrong_token);
  g_test_add_func ("/Cp/Ucx/rendezvous/wrong-world", test_wrong_world);
  g_test_add_func ("/Cp/Ucx/rendezvous/duplicate-rank", test_duplicate_rank);
  g_test_add_func ("/Cp/Ucx/rendezvous/rank-without-backend", test_rank_without_backend);
  g_test_add_func ("/Cp/Ucx/rendezvous/garbage", test_garbage);
  g_test_add_func ("/Cp/Ucx/rendezvous/rejoin", test_rejoin);
  g_test_add_func ("/Cp/Ucx/rendezvous/nobody-listens", test_nobody_listens);
  g_test_add_func ("/Cp/Ucx/failure/sigkill", test_sigkill);
  g_test_add_func ("/Cp/Ucx/failure/sigkill-quiet", test_sigkill_quiet);
  g_test_add_func ("/Cp/Ucx/failure/rank-lost", test_rank_lost);
  g_test_add_func ("/Cp/Ucx/failure/sigstop", test_sigstop);
  g_test_add_func ("/Cp/Ucx/async/connect-barrier", test_async);

  return g_test_run ();
}
