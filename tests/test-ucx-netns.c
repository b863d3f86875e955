/* test-ucx-netns.c: two hosts in two network namespaces
 *
 * Two ranks run in separate network namespaces joined by a veth pair and
 * talk UCX over TCP across it, as two hosts would.  Once both are in the
 * middle of all_gathers, the link goes down: both must fail with
 * PEER_LOST or TIMED_OUT within the mesh timeout and tear down quickly.
 * Then two more namespaces whose link has IPv6 addresses only: the ranks
 * meet at MASTER_ADDR=fd00:cb::1 and every collective matches the
 * in-process backend.
 *
 * The ranks name no transport: the default chain passes shm over, since
 * the ranks' offers name two network namespaces, and the whole mesh runs
 * on UCX (the rank program asserts that it does).  Named, shm is refused
 * on both hosts with CP_MESH_ERROR_UNSUPPORTED saying why.
 *
 * Needs root and iproute2; exits 77 (skipped) where namespaces cannot be
 * made.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <libcpmesh.h>

#include "cp-harness.h"

#define SKIP 77
#define TIMEOUT_MS 3000
/* The whole case, mesh formation included, takes seconds: past this it
 * has hung, and fails then rather than when Meson kills it. */
#define LIMIT_US (30 * G_TIME_SPAN_SECOND)

typedef struct
{
  char *namespace;
  char *device;
  const char *address;
  const char *prefix;   /* "/24", or "/64 nodad": usable at once */
} Host;

/* The environment of the processes `ip` runs.  `ip` is not built with
 * the sanitizers: a runtime the test environment preloads (ASan builds)
 * would report `ip`'s own leaks as failures.  The rank program needs no
 * preloading, it links its runtime itself. */
static char **
ip_environment (void)
{
  char **env = g_get_environ ();

  return g_environ_unsetenv (env, "LD_PRELOAD");
}

static gboolean
ip (const char *arguments)
{
  g_autofree char *command = g_strdup_printf ("ip %s", arguments);
  g_auto(GStrv) argv = g_strsplit (command, " ", -1);
  g_auto(GStrv) env = ip_environment ();
  g_autofree char *err = NULL;
  int status = -1;

  if (!g_spawn_sync (NULL, argv, env, G_SPAWN_SEARCH_PATH, NULL, NULL, NULL, &err, &status, NULL) ||
      !g_spawn_check_wait_status (status, NULL))
    {
      g_printerr ("# %s: %s", command, err ? err : "failed\n");
      return FALSE;
    }
  return TRUE;
}

static void
tear_down (Host *hosts)
{
  for (int h = 0; h < 2; h++)
    {
      g_autofree char *command = g_strdup_printf ("netns del %s", hosts[h].namespace);

      ip (command);
    }
}

static gboolean
set_up (Host *hosts)
{
  g_autofree char *veth = g_strdup_printf ("link add %s type veth peer name %s", hosts[0].device,
                                           hosts[1].device);

  for (int h = 0; h < 2; h++)
    {
      g_autofree char *add = g_strdup_printf ("netns add %s", hosts[h].namespace);

      if (!ip (add))
        return FALSE;
    }
  if (!ip (veth))
    return FALSE;
  for (int h = 0; h < 2; h++)
    {
      g_autofree char *move = g_strdup_printf ("link set %s netns %s", hosts[h].device, hosts[h].namespace);
      g_autofree char *addr = g_strdup_printf ("-n %s addr add %s%s dev %s", hosts[h].namespace,
                                               hosts[h].address, hosts[h].prefix, hosts[h].device);
      g_autofree char *up = g_strdup_printf ("-n %s link set %s up", hosts[h].namespace, hosts[h].device);
      g_autofree char *lo = g_strdup_printf ("-n %s link set lo up", hosts[h].namespace);

      if (!ip (move) || !ip (addr) || !ip (up) || !ip (lo))
        return FALSE;
    }
  return TRUE;
}

static CpHarnessRank *
spawn_rank (const Host *hosts,
            int         rank,
            const char *scenario,
            const char *transport,
            GError    **error)
{
  g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE);
  g_autofree char *program = g_build_filename (g_getenv ("G_TEST_BUILDDIR"), "cp-test-ucx-rank", NULL);
  g_autofree char *device = g_strdup_printf ("UCX_NET_DEVICES=%s", hosts[rank].device);
  g_auto(GStrv) env = ip_environment ();
  const char *argv[] = { "ip", "netns", "exec", hosts[rank].namespace, program, scenario, NULL };
  CpHarnessWorld world = {
    .size = 2, .address = hosts[0].address, .master_port = 29500, .token = "two hosts",
    .timeout_ms = TIMEOUT_MS,
  };
  /* TCP over the veth only: the namespaces share this kernel's memory,
   * which UCX would otherwise use. */
  g_autofree char *named = transport != NULL ? g_strdup_printf ("CPMESH_TRANSPORT=%s", transport) : NULL;
  const char *settings[] = { "UCX_TLS=tcp", device, named, NULL };

  g_subprocess_launcher_set_environ (launcher, env);
  g_subprocess_launcher_unsetenv (launcher, "CPMESH_MESH_DIMS");
  return cp_harness_rank_spawn (launcher, &world, rank, settings, argv, error);
}

/* Runs until @condition holds for both ranks; past @deadline (the whole
 * case's) the ranks are killed and the case fails. */
static gboolean
wait_for (CpHarnessRank      **ranks,
          CpHarnessCondition   condition,
          gint64               deadline)
{
  gint64 left_ms = (deadline - g_get_monotonic_time ()) / 1000;

  if (cp_harness_run_until (ranks, 2, condition, MAX (left_ms, 1)))
    return TRUE;
  g_printerr ("# still running %d s after the ranks started: a wait that should have ended did not\n",
              (int) (LIMIT_US / G_TIME_SPAN_SECOND));
  return FALSE;
}

static gboolean
both_said (CpHarnessRank **ranks,
           const char     *prefix)
{
  return cp_harness_rank_find_line (ranks[0], prefix) != NULL &&
         cp_harness_rank_find_line (ranks[1], prefix) != NULL;
}

static gboolean
check_failure (CpHarnessRank *rank,
               int            index)
{
  const char *failed = cp_harness_rank_find_line (rank, "FAILED");
  const char *closed = cp_harness_rank_find_line (rank, "CLOSED");
  int code = -1;
  double waited = -1;

  if (failed == NULL || closed == NULL || sscanf (failed, "FAILED %d %lf", &code, &waited) != 2)
    {
      g_printerr ("# rank %d reported no failure\n", index);
      return FALSE;
    }
  printf ("# rank %d: %s; %s\n", index, failed, closed);
  return (code == CP_MESH_ERROR_PEER_LOST || code == CP_MESH_ERROR_TIMED_OUT) &&
         waited <= TIMEOUT_MS + 1000 && g_ascii_strtod (closed + strlen ("CLOSED "), NULL) < 3000;
}

/* Starts both ranks playing @scenario; FALSE when one cannot start. */
static gboolean
spawn_pair (const Host     *hosts,
            const char     *scenario,
            const char     *transport,
            CpHarnessRank **ranks,
            GError        **error)
{
  ranks[0] = spawn_rank (hosts, 0, scenario, transport, error);
  ranks[1] = ranks[0] != NULL ? spawn_rank (hosts, 1, scenario, transport, error) : NULL;
  return ranks[1] != NULL;
}

/* Says why a rank could not start, if one could not, and stops both. */
static void
stop_pair (CpHarnessRank **ranks,
           const GError   *error)
{
  if (error != NULL)
    g_printerr ("# %s\n", error->message);
  for (int r = 0; r < 2; r++)
    if (ranks[r] != NULL && !cp_harness_rank_is_done (ranks[r]))
      g_subprocess_force_exit (ranks[r]->process);
  cp_harness_run_until (ranks, 2, cp_harness_all_done, 0);
  for (int r = 0; r < 2; r++)
    g_clear_pointer (&ranks[r], cp_harness_rank_free);
}

/* Both ranks all-gather across the link; then the link goes down. */
static gboolean
cut_the_link (const Host *hosts)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *down = g_strdup_printf ("-n %s link set %s down", hosts[1].namespace, hosts[1].device);
  CpHarnessRank *ranks[2] = { NULL, NULL };
  gint64 deadline = g_get_monotonic_time () + LIMIT_US;
  gboolean ok = spawn_pair (hosts, "gather-loop", NULL, ranks, &error) &&
                wait_for (ranks, cp_harness_all_ready, deadline) && both_said (ranks, "READY");
  gint64 cut = g_get_monotonic_time ();

  ok = ok && ip (down) && wait_for (ranks, cp_harness_all_closed, deadline);
  for (int r = 0; ok && r < 2; r++)
    ok = check_failure (ranks[r], r);
  if (ok && g_get_monotonic_time () - cut > (TIMEOUT_MS + 3000) * G_TIME_SPAN_MILLISECOND)
    ok = FALSE;
  stop_pair (ranks, error);
  return ok;
}

/* Both ranks form a mesh across the link and pass every collective. */
static gboolean
run_collectives (const Host *hosts)
{
  g_autoptr(GError) error = NULL;
  CpHarnessRank *ranks[2] = { NULL, NULL };
  gboolean ok = spawn_pair (hosts, "collectives", NULL, ranks, &error) &&
                wait_for (ranks, cp_harness_all_done, g_get_monotonic_time () + LIMIT_US);

  for (int r = 0; ok && r < 2; r++)
    {
      ok = cp_harness_rank_find_line (ranks[r], "OK") != NULL;
      if (!ok)
        g_printerr ("# rank %d did not pass the collectives\n", r);
    }
  stop_pair (ranks, error);
  return ok;
}

/* CPMESH_TRANSPORT=shm on two hosts: both ranks refuse, saying why,
 * rather than fall back to UCX. */
static gboolean
insist_on_shm (const Host *hosts)
{
  g_autoptr(GError) error = NULL;
  CpHarnessRank *ranks[2] = { NULL, NULL };
  gboolean ok = spawn_pair (hosts, "join", "shm", ranks, &error) &&
                wait_for (ranks, cp_harness_all_done, g_get_monotonic_time () + LIMIT_US);

  for (int r = 0; ok && r < 2; r++)
    {
      const char *refused = cp_harness_rank_find_line (ranks[r], "ERROR 6 ");

      ok = refused != NULL && strstr (refused, "transport \"shm\" was asked for") != NULL;
      printf ("# rank %d: %s\n", r, refused != NULL ? refused : "did not refuse shm");
    }
  stop_pair (ranks, error);
  return ok;
}

/* Sets @hosts up, runs @body on them and takes them down. */
static gboolean
with_hosts (Host      *hosts,
            gboolean (*body) (const Host *hosts),
            gboolean  *skipped)
{
  gboolean ok;

  if (!set_up (hosts))
    {
      tear_down (hosts);
      *skipped = TRUE;
      return FALSE;
    }
  ok = body (hosts);
  tear_down (hosts);
  return ok;
}

static void
hosts_clear (Host *hosts)
{
  for (int h = 0; h < 2; h++)
    {
      g_free (hosts[h].namespace);
      g_free (hosts[h].device);
    }
}

int
main (int   argc,
      char *argv[])
{
  g_autofree char *ip_path = g_find_program_in_path ("ip");
  int id = (int) getpid () % 100000;
  Host hosts[2] = {
    { g_strdup_printf ("cpmesh-a-%d", id), g_strdup_printf ("cpa%d", id), "10.199.0.1", "/24" },
    { g_strdup_printf ("cpmesh-b-%d", id), g_strdup_printf ("cpb%d", id), "10.199.0.2", "/24" },
  };
  Host hosts6[2] = {
    { g_strdup_printf ("cpmesh-c-%d", id), g_strdup_printf ("cpc%d", id), "fd00:cb::1", "/64 nodad" },
    { g_strdup_printf ("cpmesh-d-%d", id), g_strdup_printf ("cpd%d", id), "fd00:cb::2", "/64 nodad" },
  };
  gboolean skipped = FALSE;
  gboolean ok;

  if (!CP_HAS_UCX || ip_path == NULL || getuid () != 0)
    {
      printf ("# skipped: needs UCX, iproute2 and root\n");
      hosts_clear (hosts);
      hosts_clear (hosts6);
      return SKIP;
    }
  ok = with_hosts (hosts, cut_the_link, &skipped);
  printf ("%s\n", ok ? "# both ranks failed within the timeout" : "# FAILED");
  if (ok)
    {
      ok = with_hosts (hosts6, run_collectives, &skipped);
      printf ("%s\n", ok ? "# over IPv6, every collective passed" : "# FAILED over IPv6");
    }
  if (ok)
    {
      ok = with_hosts (hosts, insist_on_shm, &skipped);
      printf ("%s\n", ok ? "# shm named across hosts: both ranks refused it" : "# FAILED: shm across hosts");
    }
  hosts_clear (hosts);
  hosts_clear (hosts6);
  if (skipped)
    {
      printf ("# skipped: network namespaces are not permitted here\n");
      return SKIP;
    }
  return ok ? 0 : 1;
}
