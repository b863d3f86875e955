/* cpmesh-launch.c: `cpmesh launch -n N [--port P] -- PROGRAM ARGS…`
 *
 * Starts N ranks of PROGRAM on this host with the environment torchrun
 * gives its workers (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT), like `torchrun --standalone`, plus a fresh
 * CPMESH_TOKEN, so that cp_mesh_new_from_env () joins them: rank 0
 * listens one above MASTER_PORT (unless CPMESH_PORT says otherwise), and
 * MASTER_PORT stays free for torch.distributed in programs that use it.  Each line a
 * rank prints comes out prefixed with its rank.  When a rank fails, the
 * others get SIGTERM, and SIGKILL after a grace period; the launcher
 * exits with the first failure's status (128 + signal for a signal).
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib-unix.h>

#include "cpmesh-tool.h"

/* After the last rank exited, how long its output may still trickle in
 * (from a child that inherited the pipe) before the launcher stops. */
#define DRAIN_MS 1000

typedef struct _Launch Launch;

typedef struct
{
  Launch *launch;
  int rank;
  GSubprocess *process;
  GDataInputStream *streams[2];   /* stdout, stderr */
  gboolean open[2];
  gboolean exited;
} Rank;

struct _Launch
{
  GMainLoop *loop;
  Rank *ranks;
  int n;
  int status;          /* the first failure's, 0 while none */
  gboolean stopping;
  guint grace_ms;
  guint kill_timer;
  guint drain_timer;
};

/* Each rank leads its own process group, so that stopping it reaches the
 * processes it started too. */
static void
become_group_leader (gpointer user_data)
{
  setpgid (0, 0);
}

static void
signal_rank (Rank *rank,
             int   signum)
{
  const char *id = rank->exited || rank->process == NULL ? NULL
                   : g_subprocess_get_identifier (rank->process);

  if (id != NULL)
    kill (-(pid_t) g_ascii_strtoll (id, NULL, 10), signum);
}

static gboolean
kill_stragglers (gpointer user_data)
{
  Launch *launch = user_data;

  launch->kill_timer = 0;
  for (int r = 0; r < launch->n; r++)
    signal_rank (&launch->ranks[r], SIGKILL);
  return G_SOURCE_REMOVE;
}

/* Asks every rank still running to stop, and makes sure it does. */
static void
stop_all (Launch *launch,
          int     status)
{
  if (launch->status == 0)
    launch->status = status;
  if (launch->stopping)
    return;
  launch->stopping = TRUE;
  for (int r = 0; r < launch->n; r++)
    signal_rank (&launch->ranks[r], SIGTERM);
  launch->kill_timer = g_timeout_add (launch->grace_ms, kill_stragglers, launch);
}

static gboolean
all_finished (Launch *launch,
              gboolean with_output)
{
  for (int r = 0; r < launch->n; r++)
    {
      Rank *rank = &launch->ranks[r];

      if (!rank->exited || (with_output && (rank->open[0] || rank->open[1])))
        return FALSE;
    }
  return TRUE;
}

static gboolean
stop_draining (gpointer user_data)
{
  Launch *launch = user_data;

  launch->drain_timer = 0;
  g_main_loop_quit (launch->loop);
  return G_SOURCE_REMOVE;
}

static void
check_finished (Launch *launch)
{
  if (all_finished (launch, TRUE))
    g_main_loop_quit (launch->loop);
  else if (all_finished (launch, FALSE) && launch->drain_timer == 0)
    launch->drain_timer = g_timeout_add (DRAIN_MS, stop_draining, launch);
}

static void read_line (Rank *rank,
                       int   which);

static void
line_read (GObject      *source,
           GAsyncResult *result,
           gpointer      user_data)
{
  Rank *rank = user_data;
  int which = G_DATA_INPUT_STREAM (source) == rank->streams[0] ? 0 : 1;
  gsize length = 0;
  g_autofree char *line = g_data_input_stream_read_line_finish (G_DATA_INPUT_STREAM (source), result,
                                                                &length, NULL);
  FILE *out = which == 0 ? stdout : stderr;

  if (line == NULL)
    {
      rank->open[which] = FALSE;
      check_finished (rank->launch);
      return;
    }
  fprintf (out, "[rank %d] %s\n", rank->rank, line);
  fflush (out);
  read_line (rank, which);
}

static void
read_line (Rank *rank,
           int   which)
{
  g_data_input_stream_read_line_async (rank->streams[which], G_PRIORITY_DEFAULT, NULL, line_read, rank);
}

static void
rank_exited (GObject      *source,
             GAsyncResult *result,
             gpointer      user_data)
{
  Rank *rank = user_data;
  Launch *launch = rank->launch;
  int status;

  g_subprocess_wait_finish (rank->process, result, NULL);
  rank->exited = TRUE;
  status = cp_harness_exit_status (rank->process);
  if (status != 0 && !launch->stopping)
    {
      fprintf (stderr, "cpmesh launch: rank %d %s %d; stopping the other ranks\n", rank->rank,
               g_subprocess_get_if_signaled (rank->process) ? "was killed by signal" : "exited with status",
               g_subprocess_get_if_signaled (rank->process) ? g_subprocess_get_term_sig (rank->process) : status);
      stop_all (launch, status);
    }
  check_finished (launch);
}

/* SIGINT or SIGTERM to the launcher: the ranks get SIGTERM, and the
 * launcher exits as if it had been killed by the signal it got. */
static gboolean
on_interrupt (gpointer user_data)
{
  stop_all (user_data, 128 + SIGINT);
  return G_SOURCE_CONTINUE;
}

static gboolean
on_terminate (gpointer user_data)
{
  stop_all (user_data, 128 + SIGTERM);
  return G_SOURCE_CONTINUE;
}

static GSubprocessLauncher *
make_launcher (const CpHarnessWorld *world,
               int                   rank)
{
  GSubprocessLauncher *launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                                                             G_SUBPROCESS_FLAGS_STDERR_PIPE);

  cp_harness_set_rank_environment (launcher, world, rank, NULL);
  g_subprocess_launcher_set_child_setup (launcher, become_group_leader, NULL, NULL);
  return launcher;
}

static gboolean
start_ranks (Launch              *launch,
             const char * const  *command,
             guint16              port,
             GError             **error)
{
  g_autofree char *fresh_token = g_uuid_string_random ();
  /* A token the caller set is the ranks' too. */
  const char *token = g_getenv ("CPMESH_TOKEN") ? g_getenv ("CPMESH_TOKEN") : fresh_token;
  CpHarnessWorld world = { .size = launch->n, .master_port = port, .token = token };

  for (int r = 0; r < launch->n; r++)
    {
      g_autoptr(GSubprocessLauncher) launcher = make_launcher (&world, r);
      Rank *rank = &launch->ranks[r];

      rank->launch = launch;
      rank->rank = r;
      rank->process = g_subprocess_launcher_spawnv (launcher, command, error);
      if (rank->process == NULL)
        {
          /* This rank and the ones never started count as gone, so that
           * the launch ends once the started ones have been stopped. */
          for (int later = r; later < launch->n; later++)
            launch->ranks[later].exited = TRUE;
          return FALSE;
        }
      rank->streams[0] = g_data_input_stream_new (g_subprocess_get_stdout_pipe (rank->process));
      rank->streams[1] = g_data_input_stream_new (g_subprocess_get_stderr_pipe (rank->process));
      rank->open[0] = rank->open[1] = TRUE;
      read_line (rank, 0);
      read_line (rank, 1);
      g_subprocess_wait_async (rank->process, NULL, rank_exited, rank);
    }
  return TRUE;
}

static void
launch_clear (Launch *launch)
{
  for (int r = 0; r < launch->n; r++)
    {
      Rank *rank = &launch->ranks[r];

      g_clear_object (&rank->streams[0]);
      g_clear_object (&rank->streams[1]);
      g_clear_object (&rank->process);
    }
  g_clear_handle_id (&launch->kill_timer, g_source_remove);
  g_clear_handle_id (&launch->drain_timer, g_source_remove);
  g_free (launch->ranks);
  g_main_loop_unref (launch->loop);
}

/* Starts the ranks and runs until they are all gone. */
static int
run (int                  n,
     guint16              port,
     guint                grace_ms,
     const char * const  *command)
{
  Launch launch = { g_main_loop_new (NULL, FALSE), g_new0 (Rank, n), n, 0, FALSE, grace_ms, 0, 0 };
  g_autoptr(GError) error = NULL;
  guint sigint = g_unix_signal_add (SIGINT, on_interrupt, &launch);
  guint sigterm = g_unix_signal_add (SIGTERM, on_terminate, &launch);
  int status;

  if (!start_ranks (&launch, command, port, &error))
    {
      fprintf (stderr, "cpmesh launch: cannot start %s: %s\n", command[0], error->message);
      stop_all (&launch, 127);
    }
  if (!all_finished (&launch, TRUE))
    g_main_loop_run (launch.loop);
  g_source_remove (sigint);
  g_source_remove (sigterm);
  status = launch.status;
  launch_clear (&launch);
  return status;
}

/**
 * cpmesh_launch:
 * @argc: the number of arguments
 * @argv: the arguments after `cpmesh`, the first being `launch`
 *
 * Runs `cpmesh launch -n N [--port P] [--grace SECONDS] -- PROGRAM ARGS…`.
 *
 * Returns: 0 when every rank succeeded, otherwise the status of the first
 *   rank that failed (128 + signal number when a signal killed it)
 */
int
cpmesh_launch (int    argc,
               char **argv)
{
  int n = 0, port = 0, grace = 5;
  CpmeshOption entries[] = {
    { "nproc", 'n', CPMESH_VALUE_INT, &n, "Ranks to start, one process each", "N",
      1, CPMESH_MAX_RANKS, NULL, FALSE },
    { "port", 0, CPMESH_VALUE_INT, &port,
      "MASTER_PORT (default: a free one); rank 0 listens on P + 1 unless CPMESH_PORT is set", "P",
      1, 65534, NULL, FALSE },
    { "grace", 0, CPMESH_VALUE_INT, &grace, "Seconds between SIGTERM and SIGKILL (default 5)",
      "SECONDS", 0, 3600, NULL, FALSE },
    CPMESH_OPTION_END
  };

  /* Options after PROGRAM are PROGRAM's. */
  if (!cpmesh_parse_options ("Run N ranks of PROGRAM on this host, as torchrun --standalone "
                             "does, each line of their output prefixed with its rank.",
                             entries, "-- PROGRAM [ARGS…]", &argc, &argv))
    return CPMESH_EXIT_USAGE;
  if (argc > 1 && g_str_equal (argv[1], "--"))
    {
      argv++;
      argc--;
    }
  if (!cpmesh_option_given (entries, "nproc"))
    return cpmesh_fail (CPMESH_EXIT_USAGE, "give the number of ranks with -n N");
  if (argc < 2)
    return cpmesh_fail (CPMESH_EXIT_USAGE, "give the program to start after --");
  return run (n, port != 0 ? (guint16) port : cp_harness_free_port_pair (), (guint) grace * 1000,
              (const char * const *) argv + 1);
}
