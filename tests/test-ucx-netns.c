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

#define SKIP 77
#define TIMEOUT_MS 3000
/* The whole case, mesh formation included, takes seconds: past this it
 * has hung, and fails then rather than when Meson kills it. */
#define LIMIT_US (30 * G_TIME_SPAN_SECOND)

/* Cancelled LIMIT_US after the ranks start: reading their output then
 * fails, and the namespaces are still torn down. */
static GCancellable *giving_up;

typedef struct
{
  char *namespace;
  char *device;
  const char *address;
  const char *prefix;   /* "/24", or "/64 nodad": usable at once */
} Host;

typedef struct
{
  GSubprocess *process;
  GDataInputStream *out;
  char *failed;
  char *closed;
  gboolean ready;
} Rank;

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

static Rank *
spawn_rank (const Host *hosts,
            int         rank,
            const char *scenario,
            GError    **error)
{
  g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE);
  g_autofree char *program = g_build_filename (g_getenv ("G_TEST_BUILDDIR"), "cp-test-ucx-rank", NULL);
  g_autofree char *rank_text = g_strdup_printf ("%d", rank);
  g_auto(GStrv) env = ip_environment ();
  Rank *self = g_new0 (Rank, 1);

  g_subprocess_launcher_set_environ (launcher, env);
  g_subprocess_launcher_setenv (launcher, "RANK", rank_text, TRUE);
  g_subprocess_launcher_setenv (launcher, "WORLD_SIZE", "2", TRUE);
  g_subprocess_launcher_setenv (launcher, "MASTER_ADDR", hosts[0].address, TRUE);
  g_subprocess_launcher_setenv (launcher, "MASTER_PORT", "29500", TRUE);
  g_subprocess_launcher_setenv (launcher, "CPMESH_TIMEOUT_MS", G_STRINGIFY (TIMEOUT_MS), TRUE);
  g_subprocess_launcher_setenv (launcher, "CPMESH_TOKEN", "two hosts", TRUE);
  /* TCP over the veth only: the namespaces share this kernel's memory,
   * which UCX would otherwise use. */
  g_subprocess_launcher_setenv (launcher, "UCX_TLS", "tcp", TRUE);
  g_subprocess_launcher_setenv (launcher, "UCX_NET_DEVICES", hosts[rank].device, TRUE);
  g_subprocess_launcher_unsetenv (launcher, "CPMESH_MESH_DIMS");
  self->process = g_subprocess_launcher_spawn (launcher, error, "ip", "netns", "exec", hosts[rank].namespace,
                                               program, scenario, NULL);
  if (self->process == NULL)
    {
      g_free (self);
      return NULL;
    }
  self->out = g_data_input_stream_new (g_subprocess_get_stdout_pipe (self->process));
  return self;
}

static void
rank_free (Rank *rank)
{
  if (rank == NULL)
    return;
  g_subprocess_force_exit (rank->process);
  g_subprocess_wait (rank->process, NULL, NULL);
  g_object_unref (rank->process);
  g_object_unref (rank->out);
  g_free (rank->failed);
  g_free (rank->closed);
  g_free (rank);
}

/* Reads lines until @prefix; the process's output is small and its
 * lifetime bounded by the mesh timeout, or reading gives up at LIMIT_US. */
static char *
read_until (Rank       *rank,
            const char *prefix)
{
  char *line;

  while ((line = g_data_input_stream_read_line_utf8 (rank->out, NULL, giving_up, NULL)) != NULL)
    {
      if (g_str_has_prefix (line, prefix))
        return line;
      g_free (line);
    }
  return NULL;
}

static gboolean
check_failure (Rank *rank,
               int   index)
{
  int code = -1;
  double waited = -1;

  rank->failed = read_until (rank, "FAILED");
  rank->closed = rank->failed ? read_until (rank, "CLOSED") : NULL;
  if (rank->failed == NULL || rank->closed == NULL ||
      sscanf (rank->failed, "FAILED %d %lf", &code, &waited) != 2)
    {
      g_printerr ("# rank %d reported no failure\n", index);
      return FALSE;
    }
  printf ("# rank %d: %s; %s\n", index, rank->failed, rank->closed);
  return (code == CP_MESH_ERROR_PEER_LOST || code == CP_MESH_ERROR_TIMED_OUT) &&
         waited <= TIMEOUT_MS + 1000 && g_ascii_strtod (rank->closed + strlen ("CLOSED "), NULL) < 3000;
}

/* Starts both ranks playing @scenario; FALSE when one cannot start. */
static gboolean
spawn_pair (const Host  *hosts,
            const char  *scenario,
            Rank       **ranks,
            GError     **error)
{
  ranks[0] = spawn_rank (hosts, 0, scenario, error);
  ranks[1] = ranks[0] != NULL ? spawn_rank (hosts, 1, scenario, error) : NULL;
  return ranks[1] != NULL;
}

/* Says why a rank could not start, if one could not, and stops both. */
static void
stop_pair (Rank         **ranks,
           const GError  *error)
{
  if (error != NULL)
    g_printerr ("# %s\n", error->message);
  rank_free (ranks[0]);
  rank_free (ranks[1]);
}

static gpointer
give_up_later (gpointer data)
{
  g_usleep (LIMIT_US);
  g_printerr ("# still running %d s after the ranks started: a wait that should have ended did not\n",
              (int) (LIMIT_US / G_TIME_SPAN_SECOND));
  g_cancellable_cancel (giving_up);
  return NULL;
}

/* Both ranks all-gather across the link; then the link goes down. */
static gboolean
cut_the_link (const Host *hosts)
{
  g_autoptr(GError) error = NULL;
  g_autofree char *down = g_strdup_printf ("-n %s link set %s down", hosts[1].namespace, hosts[1].device);
  Rank *ranks[2];
  gboolean ok = spawn_pair (hosts, "gather-loop", ranks, &error);
  gint64 cut;

  giving_up = g_cancellable_new ();
  g_thread_unref (g_thread_new ("give-up", give_up_later, NULL));
  for (int r = 0; ok && r < 2; r++)
    {
      g_autofree char *ready = read_until (ranks[r], "READY");

      ok = ready != NULL;
    }
  cut = g_get_monotonic_time ();
  ok = ok && ip (down);
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
  Rank *ranks[2];
  gboolean ok = spawn_pair (hosts, "collectives", ranks, &error);

  for (int r = 0; ok && r < 2; r++)
    {
      g_autofree char *done = read_until (ranks[r], "OK");

      ok = done != NULL;
      if (!ok)
        g_printerr ("# rank %d did not pass the collectives\n", r);
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
  hosts_clear (hosts);
  hosts_clear (hosts6);
  if (skipped)
    {
      printf ("# skipped: network namespaces are not permitted here\n");
      return SKIP;
    }
  return ok ? 0 : 1;
}
