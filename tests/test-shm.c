/* test-shm.c: multi-process meshes of one host over the shm backend
 *
 * Most cases start ranks as processes of cp-test-ucx-rank with
 * CPMESH_TRANSPORT=shm and check what they report; the checks of what a
 * rank takes from outside (offers, the control segment, the probe) run in
 * this process.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "cp-shm-private.h"
#include "cp-test-procs.h"
#include "cp-test-util.h"
#include "cp-transport-private.h"

#define SUBJECT "CpMesh (shm)"
#define SETTINGS CP_TEST_SETTINGS

typedef CpTestRank Rank;
typedef CpTestGroup Group;

/* cp-test-ucx-rank with the shm backend and @extra settings. */
static Rank *
spawn (Group              *group,
       const char         *scenario,
       int                 rank,
       int                 world,
       guint16             port,
       const char * const *extra)
{
  g_autoptr(GPtrArray) settings = g_ptr_array_new ();

  g_ptr_array_add (settings, (gpointer) "CPMESH_TRANSPORT=shm");
  for (guint i = 0; extra != NULL && extra[i] != NULL; i++)
    g_ptr_array_add (settings, (gpointer) extra[i]);
  g_ptr_array_add (settings, NULL);
  return cp_test_group_spawn (group, scenario, rank, world, port, (const char * const *) settings->pdata);
}

static gboolean
shm_usable (void)
{
  g_autoptr(GError) error = NULL;

  if (_cp_transport_shm_probe (&error))
    return TRUE;
  g_test_skip (error->message);
  return FALSE;
}

/* ---- collectives ---- */

typedef struct
{
  int n;
  const char *setting;   /* NAME=VALUE, or NULL */
} CollectivesCase;

static void
test_collectives (gconstpointer data)
{
  const CollectivesCase *c = data;
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  g_test_summary ("Every collective and message, every dtype and odd sizes, over shm between "
                  "processes equals the in-process backend bit for bit (all_reduce in buffer order), "
                  "and a send/recv shape mismatch fails on both sides");
  if (!shm_usable ())
    return;
  for (int r = 0; r < c->n; r++)
    spawn (&group, "collectives", r, c->n, port,
           c->n == 4 ? SETTINGS ("CPMESH_MESH_DIMS=dp=2,cp=2", "CPMESH_TIMEOUT_MS=30000")
                     : SETTINGS ("CPMESH_TIMEOUT_MS=30000", c->setting));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < c->n; r++)
    {
      cp_test_assert_exit (group.ranks[r], 0);
      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "OK"));
    }
  cp_test_group_clear (&group);
}

/* ---- ring attention read in place ---- */

#define ATTENTION_RANKS 3

/* Runs the attention scenario on ATTENTION_RANKS processes with
 * @settings and stores every rank's digest and its forward ring report. */
static void
run_attention (const char * const *settings,
               char              **digests,
               char              **rings)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  for (int r = 0; r < ATTENTION_RANKS; r++)
    spawn (&group, "attention", r, ATTENTION_RANKS, port, settings);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < ATTENTION_RANKS; r++)
    {
      const char *digest = cp_test_rank_find_line (group.ranks[r], "DIGEST");
      const char *ring = cp_test_rank_find_line (group.ranks[r], "RING forward");

      cp_test_assert_exit (group.ranks[r], 0);
      g_assert_nonnull (digest);
      g_assert_nonnull (ring);
      digests[r] = g_strdup (digest);
      rings[r] = g_strdup (ring);
    }
  cp_test_group_clear (&group);
}

static void
test_attention_in_place (void)
{
  char *in_place[ATTENTION_RANKS], *passed[ATTENTION_RANKS], *over_ucx[ATTENTION_RANKS];
  char *rings[3][ATTENTION_RANKS];

  g_test_summary ("Ring attention over shm processes reads every peer's K/V where it lies, "
                  "copying no K/V byte, and gives the bits of the ring that passes shards, "
                  "over shm and over UCX");
  if (!shm_usable ())
    return;
  run_attention (SETTINGS ("CPMESH_TIMEOUT_MS=30000"), in_place, rings[0]);
  run_attention (SETTINGS ("CPMESH_TIMEOUT_MS=30000", "CPMESH_ATTENTION_IN_PLACE=0"), passed, rings[1]);
  run_attention (SETTINGS ("CPMESH_TIMEOUT_MS=30000", "CPMESH_TRANSPORT=ucx", "CP_TEST_EXPECT_BACKEND=ucx"),
                 over_ucx, rings[2]);
  for (int r = 0; r < ATTENTION_RANKS; r++)
    {
      g_test_message ("rank %d: %s | %s | %s", r, rings[0][r], rings[1][r], rings[2][r]);
      g_assert_nonnull (strstr (rings[0][r], "over shm read every peer's K/V in place: "
                                             "0 K/V bytes copied per step"));
      g_assert_nonnull (strstr (rings[1][r], "over shm passed"));
      g_assert_nonnull (strstr (rings[2][r], "over ucx passed"));
      g_assert_cmpstr (in_place[r], ==, passed[r]);
      g_assert_cmpstr (in_place[r], ==, over_ucx[r]);
      for (int m = 0; m < 3; m++)
        g_free (rings[m][r]);
      g_free (in_place[r]);
      g_free (passed[r]);
      g_free (over_ucx[r]);
    }
}

/* ---- the default chain ---- */

static void
test_default_one_host (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  g_test_summary ("Without CPMESH_TRANSPORT, processes of one host that all offer shm pick it in their "
                  "one rendezvous, and every collective matches the in-process backend");
  if (!shm_usable ())
    return;
  for (int r = 0; r < 3; r++)
    spawn (&group, "collectives", r, 3, port,
           SETTINGS ("CPMESH_TRANSPORT=", "CP_TEST_EXPECT_BACKEND=shm", "CPMESH_TIMEOUT_MS=30000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 3; r++)
    {
      cp_test_assert_exit (group.ranks[r], 0);
      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "OK"));
    }
  cp_test_group_clear (&group);
}

/* ---- failures ---- */

static gboolean
survivors_failed (CpTestRank **ranks,
                  guint        n)
{
  return cp_test_all_said (ranks, n, "FAILED");
}

/* Rank 3 of 4 is killed while all ranks run all_gathers: each survivor
 * fails with PEER_LOST within a second of the kill, from its pidfd. */
static void
test_sigkill (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  gint64 killed, noticed_us;

  g_test_summary ("A rank of four killed in the middle of all_gathers makes every survivor fail "
                  "with PEER_LOST within a second, and nothing is left behind");
  if (!shm_usable ())
    return;
  for (int r = 0; r < 4; r++)
    spawn (&group, "gather-loop", r, 4, port, SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_ready);
  cp_test_run_for (50);
  g_subprocess_send_signal (group.ranks[3]->process, SIGKILL);
  killed = g_get_monotonic_time ();
  cp_test_run_until (group.ranks, 3, survivors_failed);
  noticed_us = g_get_monotonic_time () - killed;
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  g_test_message ("all survivors reported %" G_GINT64_FORMAT " ms after the kill", noticed_us / 1000);
  for (int r = 0; r < 3; r++)
    {
      const char *line = cp_test_rank_find_line (group.ranks[r], "FAILED");
      int code = -1, offset = 0;
      gint64 call_ms = -1;
      g_autoptr(GError) error = NULL;

      g_assert_cmpint (sscanf (line, "FAILED %d %" G_GINT64_FORMAT " %n", &code, &call_ms, &offset), ==, 2);
      g_test_message ("rank %d: %s", r, line);
      error = g_error_new_literal (CP_MESH_ERROR, code, line + offset);
      if (r == 0)
        CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, SUBJECT,
                             "a rank of four is killed (SIGKILL) during all_gathers: the survivors' error");
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST);
      /* The failing call began before the kill, at most one call earlier
       * (under a sanitizer, a call of 4 MiB pieces may take a while). */
      g_assert_cmpint (call_ms, <, 2000 * cp_test_time_factor ());
      g_assert_nonnull (cp_test_rank_find_line (group.ranks[r], "CLOSED"));
      cp_test_assert_exit (group.ranks[r], 0);
    }
  g_assert_cmpint (noticed_us, <, G_TIME_SPAN_SECOND * cp_test_time_factor ());
  g_assert_true (g_subprocess_get_if_signaled (group.ranks[3]->process));
  cp_test_group_clear (&group);
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

/* Rank 1 is stopped for 1.3 timeouts while both run all_gathers: rank 0
 * times out, rank 1 fails the same call as it is continued, and every
 * later call of both fails at once naming rank 0's timeout. */
static void
test_sigstop (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  guint failed_at[2];
  const char *named[2];

  g_test_summary ("A rank stopped past the timeout during all_gathers and then continued: both "
                  "fail the same call with TIMED_OUT, and every later call fails at once naming it");
  if (!shm_usable ())
    return;
  for (int r = 0; r < 2; r++)
    spawn (&group, "stop-loop", r, 2, port, SETTINGS ("CPMESH_TIMEOUT_MS=1000"));
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
      cp_test_record_error (SUBJECT, "a rank is stopped (SIGSTOP) past the timeout during all_gathers, "
                            "then continued (every later call of both ranks, at once)", error);
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

  g_test_summary ("An idle main-loop program hears CpMesh::rank-lost when a peer process leaves");
  if (!shm_usable ())
    return;
  for (int r = 0; r < 2; r++)
    spawn (&group, "wait-lost", r, 2, port, NULL);
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  cp_test_assert_exit (group.ranks[0], 0);
  cp_test_assert_exit (group.ranks[1], 0);
  line = cp_test_rank_find_line (group.ranks[0], "LOST");
  g_assert_nonnull (line);
  g_assert_cmpint (sscanf (line, "LOST %d %" G_GINT64_FORMAT, &rank, &after_ms), ==, 2);
  g_test_message ("rank 0: %s", line);
  g_assert_cmpint (rank, ==, 1);
  g_assert_cmpint (after_ms, <=, CP_TEST_RANK_TIMEOUT_MS);
  cp_test_group_clear (&group);
}

/* ---- injected faults (cp-test-fault-rank, in builds with fault injection) ---- */

#define FAULT_TIMEOUT_MS 2000
#define SLACK_MS 2000

static gboolean
fault_rank_built (void)
{
  g_autofree char *path = g_test_build_filename (G_TEST_BUILT, "cp-test-fault-rank", NULL);

  if (g_file_test (path, G_FILE_TEST_IS_EXECUTABLE))
    return shm_usable ();
  g_test_skip ("libcpmesh was built without fault injection");
  return FALSE;
}

/* Two ranks run the fault helper's all-reduce scenario with @fault armed;
 * a rank that fails waits @linger_ms before it leaves. */
static void
run_fault_pair (Group      *group,
                const char *fault,
                guint       linger_ms)
{
  g_autofree char *fault_setting = g_strdup_printf ("CP_TEST_FAULT=%s", fault);
  g_autofree char *linger = g_strdup_printf ("CP_TEST_LINGER_MS=%u", linger_ms);
  guint16 port = cp_test_free_port ();

  group->program = "cp-test-fault-rank";
  for (int r = 0; r < 2; r++)
    spawn (group, "all-reduce", r, 2, port,
           SETTINGS (fault_setting, linger, "CPMESH_TIMEOUT_MS=" G_STRINGIFY (FAULT_TIMEOUT_MS)));
  cp_test_run_until (group->ranks, group->n, cp_test_all_done);
}

/* "RESULT DOMAIN CODE MS INTACT" and "MESSAGE …" of a fault rank. */
static void
assert_fault_result (Rank       *rank,
                     GQuark      domain,
                     int         code,
                     gint64      bound_ms,
                     const char *what)
{
  const char *line = cp_test_rank_find_line (rank, "RESULT ");
  const char *message = cp_test_rank_find_line (rank, "MESSAGE ");
  char got_domain[64] = "";
  int got_code = -1, intact = 0;
  gint64 ms = -1;
  g_autoptr(GError) error = NULL;

  g_assert_nonnull (line);
  g_assert_cmpint (sscanf (line, "RESULT %63s %d %" G_GINT64_FORMAT " %d", got_domain, &got_code, &ms,
                           &intact), ==, 4);
  g_test_message ("%s; %s", line, message ? message : "");
  if (domain == 0)
    {
      g_assert_cmpstr (got_domain, ==, "-");
      cp_test_assert_exit (rank, 0);
      return;
    }
  g_assert_nonnull (message);
  error = g_error_new_literal (g_quark_from_string (got_domain), got_code, message + strlen ("MESSAGE "));
  CP_TEST_ASSERT_CASE (error, domain, code, SUBJECT, what);
  g_assert_cmpint (ms, <=, bound_ms);
  /* A failed all_reduce leaves the caller's tensor as it was. */
  g_assert_true (intact);
  cp_test_assert_exit (rank, 0);
}

static void
test_fault_kill (gconstpointer data)
{
  const char *step = data;
  g_autofree char *fault = g_strdup_printf ("kill %s 1 2", step);
  g_autofree char *what = g_strdup_printf ("fault: a rank dies at the %s step of an all_reduce (its peer)",
                                           step);
  Group group = { 0 };

  g_test_summary ("A rank that dies in an all_reduce fails its peer with PEER_LOST within a second, "
                  "its tensor as it was");
  if (!fault_rank_built ())
    return;
  run_fault_pair (&group, fault, 0);
  g_assert_true (g_subprocess_get_if_signaled (group.ranks[1]->process));
  assert_fault_result (group.ranks[0], CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, 1000, what);
  cp_test_group_clear (&group);
}

static void
test_fault_drop (void)
{
  Group group = { 0 };

  g_test_summary ("A rank that never arrives at an all_reduce fails both ranks with TIMED_OUT");
  if (!fault_rank_built ())
    return;
  run_fault_pair (&group, "drop descriptor 1 2", 0);
  for (int r = 0; r < 2; r++)
    assert_fault_result (group.ranks[r], CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, FAULT_TIMEOUT_MS + SLACK_MS,
                         "fault: a rank never arrives at an all_reduce (both ranks)");
  cp_test_group_clear (&group);
}

static void
test_fault_delay (void)
{
  Group group = { 0 };

  g_test_summary ("A rank late within the timeout is waited for; one late past it fails both");
  if (!fault_rank_built ())
    return;
  run_fault_pair (&group, "delay descriptor 1 2 500", 0);
  for (int r = 0; r < 2; r++)
    assert_fault_result (group.ranks[r], 0, 0, 0, NULL);
  cp_test_group_clear (&group);
  run_fault_pair (&group, "delay descriptor 1 2 4000", 3000);
  assert_fault_result (group.ranks[0], CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, FAULT_TIMEOUT_MS + SLACK_MS,
                       "fault: a rank arrives at an all_reduce later than the timeout (its peer)");
  assert_fault_result (group.ranks[1], CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT,
                       2 * FAULT_TIMEOUT_MS + SLACK_MS,
                       "fault: a rank arrives at an all_reduce later than the timeout (the late rank)");
  cp_test_group_clear (&group);
}

static void
test_fault_alloc (void)
{
  Group group = { 0 };

  g_test_summary ("A rank that cannot allocate its all_reduce scratch fails both ranks with "
                  "OUT_OF_MEMORY before any data moves");
  if (!fault_rank_built ())
    return;
  run_fault_pair (&group, "alloc 1", 0);
  for (int r = 0; r < 2; r++)
    assert_fault_result (group.ranks[r], CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY, SLACK_MS,
                         "fault: a rank's all_reduce scratch allocation fails (both ranks)");
  cp_test_group_clear (&group);
}

/* Ranks that choose the all-reduce differently fail alike, at once. */
static void
test_direct_disagreement (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };

  g_test_summary ("Ranks whose CPMESH_SHM_DIRECT differ fail an all_reduce alike with INVALID_TOPOLOGY "
                  "instead of falling out of step");
  if (!fault_rank_built ())
    return;
  group.program = "cp-test-fault-rank";
  spawn (&group, "all-reduce", 0, 2, port, SETTINGS ("CPMESH_SHM_DIRECT=0"));
  spawn (&group, "all-reduce", 1, 2, port, SETTINGS ("CPMESH_SHM_DIRECT=1048576"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  for (int r = 0; r < 2; r++)
    {
      assert_fault_result (group.ranks[r], CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, SLACK_MS,
                           "ranks set CPMESH_SHM_DIRECT differently (every rank's all_reduce)");
      g_assert_nonnull (strstr (cp_test_rank_find_line (group.ranks[r], "MESSAGE "),
                                "ranks disagree on CPMESH_SHM_DIRECT: communicator rank 0 has 0, rank 1 has 1048576"));
    }
  cp_test_group_clear (&group);
}

/* ---- outsiders ---- */

/* The inodes of the sockets process @pid has open. */
static GHashTable *
socket_inodes (const char *pid)
{
  g_autofree char *dir_path = g_build_filename ("/proc", pid, "fd", NULL);
  g_autoptr(GDir) dir = g_dir_open (dir_path, 0, NULL);
  GHashTable *inodes = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  const char *name;

  while (dir != NULL && (name = g_dir_read_name (dir)) != NULL)
    {
      g_autofree char *path = g_build_filename (dir_path, name, NULL);
      g_autofree char *target = g_file_read_link (path, NULL);

      if (target != NULL && g_str_has_prefix (target, "socket:[") && g_str_has_suffix (target, "]"))
        g_hash_table_add (inodes, g_strndup (target + 8, strlen (target) - 9));
    }
  return inodes;
}

/* The abstract name (without its NUL) of the shm socket @rank listens on,
 * or NULL while it listens on none. */
static char *
find_shm_socket (Rank *rank)
{
  g_autoptr(GHashTable) inodes = socket_inodes (g_subprocess_get_identifier (rank->process));
  g_autofree char *table = NULL;
  g_auto(GStrv) lines = NULL;

  if (!g_file_get_contents ("/proc/net/unix", &table, NULL, NULL))
    return NULL;
  lines = g_strsplit (table, "\n", -1);
  for (char **line = lines; *line != NULL; line++)
    {
      g_auto(GStrv) fields = g_strsplit_set (*line, " ", -1);
      g_autoptr(GPtrArray) words = g_ptr_array_new ();

      for (char **f = fields; *f != NULL; f++)
        if (**f != '\0')
          g_ptr_array_add (words, *f);
      /* Num RefCount Protocol Flags Type St Inode Path */
      if (words->len >= 8 && g_hash_table_contains (inodes, words->pdata[6]) &&
          g_str_has_prefix (words->pdata[7], "@" CP_SHM_SOCKET_PREFIX))
        return g_strdup ((char *) words->pdata[7] + 1);
    }
  return NULL;
}

static int
connect_abstract (const char *name)
{
  struct sockaddr_un address = { .sun_family = AF_UNIX };
  socklen_t length = (socklen_t) (offsetof (struct sockaddr_un, sun_path) + 1 + strlen (name));
  int fd = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  g_assert_cmpint (fd, >=, 0);
  memcpy (address.sun_path + 1, name, strlen (name));
  if (connect (fd, (struct sockaddr *) &address, length) == 0)
    return fd;
  close (fd);
  return -1;
}

/* A process of the same user connects to rank 1's socket before rank 0
 * does: rank 1 drops it, takes the segment from rank 0, and the stranger
 * receives nothing, no descriptor above all. */
static void
test_stranger_first (void)
{
  guint16 port = cp_test_free_port ();
  Group group = { 0 };
  g_autofree char *name = NULL;
  Rank *joiner;
  int stranger, late;
  char byte;
  union { struct cmsghdr header; char space[CMSG_SPACE (sizeof (int))]; } control;
  struct iovec iov = { &byte, 1 };
  struct msghdr message = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                            .msg_controllen = sizeof control.space };

  g_test_summary ("A stranger that connects to a rank's shm socket before rank 0 neither locks "
                  "rank 0 out nor receives a descriptor");
  if (!shm_usable ())
    return;
  joiner = spawn (&group, "join", 1, 2, port, SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  for (gint64 give_up = g_get_monotonic_time () + 10 * G_TIME_SPAN_SECOND * cp_test_time_factor ();
       (name = find_shm_socket (joiner)) == NULL;)
    {
      g_assert_cmpint (g_get_monotonic_time (), <, give_up);
      g_usleep (10 * G_TIME_SPAN_MILLISECOND);
    }
  stranger = connect_abstract (name);
  g_assert_cmpint (stranger, >=, 0);
  spawn (&group, "join", 0, 2, port, SETTINGS ("CPMESH_TIMEOUT_MS=20000"));
  cp_test_run_until (group.ranks, group.n, cp_test_all_done);
  cp_test_assert_exit (group.ranks[0], 0);
  cp_test_assert_exit (joiner, 0);
  g_assert_nonnull (cp_test_rank_find_line (joiner, "JOINED 1"));
  /* Dropped: the end of the stream, and no descriptor with it. */
  g_assert_cmpint (recvmsg (stranger, &message, MSG_CMSG_CLOEXEC), ==, 0);
  g_assert_cmpuint (message.msg_controllen, ==, 0);
  close (stranger);
  /* The socket is gone once the mesh formed. */
  late = connect_abstract (name);
  g_assert_cmpint (late, ==, -1);
  cp_test_group_clear (&group);
  cp_test_record_outcome (SUBJECT, "a process of the same user connects to a rank's shm socket before "
                          "rank 0 does", "connection closed, no descriptor; the mesh forms",
                          "the rank checked SO_PEERCRED, dropped the stranger and took the control "
                          "segment from rank 0");
}

/* ---- what a rank takes from outside ---- */

static int
sealed_memfd (gsize size,
              int   seals)
{
  int fd = memfd_create ("test-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);

  g_assert_cmpint (fd, >=, 0);
  g_assert_cmpint (ftruncate (fd, (off_t) size), ==, 0);
  if (seals != 0)
    g_assert_cmpint (fcntl (fd, F_ADD_SEALS, seals), ==, 0);
  return fd;
}

static void
check_refused (int         fd,
               gsize       size,
               const char *text,
               const char *what)
{
  g_autoptr(GError) error = NULL;

  g_assert_false (_cp_shm_check_segment (fd, size, "rank 0", &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT, SUBJECT, what);
  if (strstr (error->message, text) == NULL)
    g_error ("expected \"%s\" in \"%s\"", text, error->message);
  close (fd);
}

static void
test_segment_check (void)
{
  const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  gsize size = _cp_shm_segment_size (4);
  g_autoptr(GError) error = NULL;
  int good = sealed_memfd (size, seals);
  int pipe_fds[2];

  g_test_summary ("A control segment is mapped only when it is a memfd of the mesh's size sealed "
                  "against shrinking, growing and resealing");
  g_assert_true (_cp_shm_check_segment (good, size, "rank 0", &error));
  g_assert_no_error (error);
  close (good);
  check_refused (sealed_memfd (size, 0), size, "rank 0 handed over a control segment sealed 0x0",
                 "a forged control segment without seals");
  check_refused (sealed_memfd (size, F_SEAL_SHRINK | F_SEAL_SEAL), size, "sealed 0x",
                 "a forged control segment that may still grow");
  check_refused (sealed_memfd (size, seals | F_SEAL_WRITE), size, "writable",
                 "a forged control segment sealed against writing");
  check_refused (sealed_memfd (size / 2, seals), size, "of the wrong size",
                 "a forged control segment of the wrong size");
  g_assert_cmpint (pipe (pipe_fds), ==, 0);
  close (pipe_fds[1]);
  check_refused (pipe_fds[0], size, "not a sealable memfd", "a descriptor that is not a memfd in place of "
                 "the control segment");
}

static void
check_bad_blob (GBytes     *blob,
                int         code,
                const char *text,
                const char *what)
{
  g_autoptr(GError) error = NULL;
  CpShmPeer peer;

  g_assert_false (_cp_transport_shm_check_blob (blob, NULL, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, code, SUBJECT, what);
  if (strstr (error->message, text) == NULL)
    g_error ("expected \"%s\" in \"%s\"", text, error->message);
  g_clear_error (&error);
  g_assert_false (_cp_shm_parse_blob (blob, &peer, &error));
}

static GBytes *
variant_bytes (GVariant *variant)
{
  g_autoptr(GVariant) sunk = g_variant_ref_sink (variant);

  return g_variant_get_data_as_bytes (sunk);
}

static void
test_blob (void)
{
  CpShmPeer self, parsed, other;
  g_autoptr(GError) error = NULL;
  g_autoptr(GBytes) blob = NULL;
  g_autoptr(GBytes) garbage = g_bytes_new_static ("\x01\x02\x03", 3);
  g_autoptr(GBytes) versioned = NULL;
  g_autoptr(GBytes) bad_socket = NULL;

  g_test_summary ("Offers parse strictly, and a peer of another host, namespace or user is refused "
                  "with UNSUPPORTED naming it");
  g_assert_true (_cp_shm_peer_init_self (&self, CP_SHM_SOCKET_PREFIX "0123456789abcdef0123456789abcdef",
                                         &error));
  g_assert_no_error (error);
  blob = _cp_shm_pack_blob (&self);
  g_assert_true (_cp_shm_parse_blob (blob, &parsed, &error));
  g_assert_no_error (error);
  g_assert_cmpstr (parsed.boot_id, ==, self.boot_id);
  g_assert_cmpstr (parsed.socket, ==, self.socket);
  g_assert_cmpuint (parsed.pid, ==, (guint) getpid ());
  g_assert_true (_cp_shm_peer_check_same_host (&self, &parsed, 1, &error));

  check_bad_blob (garbage, CP_MESH_ERROR_TRANSPORT, "a malformed shm offer", "an shm offer of three random bytes");
  versioned = variant_bytes (g_variant_new ("(uusttttuus)", CP_SHM_BLOB_MAGIC, 9, self.boot_id, (guint64) 0,
                                            self.pid_ns, self.net_ns, self.user_ns, self.uid, self.pid,
                                            self.socket));
  check_bad_blob (versioned, CP_MESH_ERROR_UNSUPPORTED, "a shm offer of version 9",
                  "an shm offer of a later version");
  bad_socket = variant_bytes (g_variant_new ("(uusttttuus)", CP_SHM_BLOB_MAGIC, CP_SHM_BLOB_VERSION,
                                             self.boot_id, (guint64) 0, self.pid_ns, self.net_ns, self.user_ns,
                                             self.uid, self.pid, "cpmesh-shm-../../etc"));
  check_bad_blob (bad_socket, CP_MESH_ERROR_TRANSPORT, "its socket name", "an shm offer naming a socket of "
                  "another form");

  other = parsed;
  other.boot_id[0] = other.boot_id[0] == 'a' ? 'b' : 'a';
  g_assert_false (_cp_shm_peer_check_same_host (&self, &other, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, SUBJECT,
                       "an shm offer from another host");
  g_assert_nonnull (strstr (error->message, "rank 2 runs on another host"));
  g_clear_error (&error);
  other = parsed;
  other.net_ns++;
  g_assert_false (_cp_shm_peer_check_same_host (&self, &other, 3, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, SUBJECT,
                       "an shm offer from another network namespace");
  g_assert_nonnull (strstr (error->message, "rank 3 runs in another network namespace"));
  g_clear_error (&error);
  other = parsed;
  other.uid++;
  g_assert_false (_cp_shm_peer_check_same_host (&self, &other, 1, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED, SUBJECT,
                       "an shm offer from another user");
}

/* Makes process_vm_readv fail with EPERM in this process, as a seccomp
 * profile of a container may. */
static void
refuse_process_vm_readv (void)
{
  struct sock_filter code[] = {
    BPF_STMT (BPF_LD | BPF_W | BPF_ABS, offsetof (struct seccomp_data, nr)),
    BPF_JUMP (BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
    BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
    BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = { G_N_ELEMENTS (code), code };

  g_assert_cmpint (prctl (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), ==, 0);
  g_assert_cmpint (prctl (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0), ==, 0);
}

static void
test_probe (void)
{
  g_autoptr(GError) error = NULL;

  g_test_summary ("The probe says why shm cannot work where process_vm_readv is refused");
  if (g_test_subprocess ())
    {
      refuse_process_vm_readv ();
      g_assert_false (_cp_transport_shm_probe (&error));
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED);
      g_print ("PROBE %s\n", error->message);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
  g_test_trap_assert_stdout ("*PROBE process_vm_readv is refused here: Operation not permitted*");
  error = g_error_new_literal (CP_MESH_ERROR, CP_MESH_ERROR_UNSUPPORTED,
                               "process_vm_readv is refused here: Operation not permitted");
  cp_test_record_error (SUBJECT, "the shm probe where a seccomp profile refuses process_vm_readv", error);
}

/* A bad CPMESH_SHM_CHUNK fails the join, naming it. */
static void
test_bad_chunk (void)
{
  Group group = { 0 };
  Rank *lone;
  g_autoptr(GError) error = NULL;

  g_test_summary ("CPMESH_SHM_CHUNK that is not a size in range fails the join, naming the variable");
  if (!shm_usable ())
    return;
  lone = spawn (&group, "join", 0, 1, cp_test_free_port (), SETTINGS ("CPMESH_SHM_CHUNK=12"));
  cp_test_run_until (&lone, 1, cp_test_all_done);
  error = cp_test_rank_dup_error (lone, CP_MESH_ERROR_INVALID_TOPOLOGY, "CPMESH_SHM_CHUNK=\"12\"");
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, SUBJECT,
                       "CPMESH_SHM_CHUNK below 4096 bytes");
  cp_test_group_clear (&group);
}

int
main (int   argc,
      char *argv[])
{
  /* Every all-reduce through the reduce-scatter, many chunks of it, and
   * the defaults (small ones direct). */
  static const CollectivesCase two = { 2, "CPMESH_SHM_DIRECT=0" }, three = { 3, "CPMESH_SHM_CHUNK=4096" },
                               four = { 4, NULL };

  g_test_init (&argc, &argv, NULL);

  g_test_add_data_func ("/Cp/Shm/collectives/2-scattered", &two, test_collectives);
  g_test_add_data_func ("/Cp/Shm/collectives/3-small-chunks", &three, test_collectives);
  g_test_add_data_func ("/Cp/Shm/collectives/4", &four, test_collectives);
  g_test_add_func ("/Cp/Shm/default-chain/one-host", test_default_one_host);
  g_test_add_func ("/Cp/Shm/failure/sigkill", test_sigkill);
  g_test_add_func ("/Cp/Shm/failure/sigstop", test_sigstop);
  g_test_add_func ("/Cp/Shm/failure/rank-lost", test_rank_lost);
  g_test_add_func ("/Cp/Shm/attention/in-place", test_attention_in_place);
  g_test_add_data_func ("/Cp/Shm/fault/kill/descriptor", "descriptor", test_fault_kill);
  g_test_add_data_func ("/Cp/Shm/fault/kill/data", "data", test_fault_kill);
  g_test_add_data_func ("/Cp/Shm/fault/kill/result", "result", test_fault_kill);
  g_test_add_func ("/Cp/Shm/fault/drop", test_fault_drop);
  g_test_add_func ("/Cp/Shm/fault/delay", test_fault_delay);
  g_test_add_func ("/Cp/Shm/fault/alloc", test_fault_alloc);
  g_test_add_func ("/Cp/Shm/outsider/stranger-first", test_stranger_first);
  g_test_add_func ("/Cp/Shm/outsider/segment-check", test_segment_check);
  g_test_add_func ("/Cp/Shm/outsider/blob", test_blob);
  cp_test_add_func_in_process ("/Cp/Shm/probe/refused", test_probe);
  g_test_add_func ("/Cp/Shm/settings/bad-chunk", test_bad_chunk);
  g_test_add_func ("/Cp/Shm/settings/direct-disagreement", test_direct_disagreement);

  return g_test_run ();
}
