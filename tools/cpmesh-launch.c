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
#include <sys/prctl.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib-unix.h>

#include "cpmesh-launch-keeper.h"
#include "cpmesh-tool.h"

/* After the last rank exited, how long its output may still trickle in
 * (from a child that inherited the pipe) before the launcher stops. */
#define DRAIN_MS 1000

/* A keeper asked to kill everything now gets this long before the
 * launcher kills it and its group itself. */
#define KEEPER_MS 2000

/* Output is read in blocks of READ_SIZE; the end of a block that is not
 * the end of a line waits for the rest of the line up to PARTIAL_MS or
 * PARTIAL_MAX bytes, then goes out as it is. */
#define READ_SIZE 16384
#define PARTIAL_MAX 16384
#define PARTIAL_MS 50

typedef struct _Launch Launch;
typedef struct _Rank Rank;

/* One of a rank's two output pipes. */
typedef struct
{
  Rank *rank;
  int which;               /* 0 stdout, 1 stderr */
  GInputStream *pipe;
  guint8 block[READ_SIZE];
  GByteArray *partial;     /* the line begun, not yet shown */
  guint partial_timer;
  gboolean open;
  gboolean needs_prefix;   /* what it shows next starts a line */
} Output;

struct _Rank
{
  Launch *launch;
  int rank;
  GSubprocess *process;    /* the rank's keeper */
  Output outputs[2];
  gboolean exited;
};

struct _Launch
{
  GMainLoop *loop;
  Rank *ranks;
  int n;
  int status;          /* the first failure's, 0 while none */
  gboolean stopping;
  guint grace_ms;
  guint kill_timer;
  guint keeper_timer;
  guint drain_timer;
  CpmeshKeeper keeper;
  /* The output whose line is unfinished on stdout and stderr: a line
   * of another rank first ends it. */
  Output *unfinished[2];
};

static pid_t
rank_pid (Rank *rank)
{
  const char *id = rank->exited || rank->process == NULL ? NULL
                   : g_subprocess_get_identifier (rank->process);

  return id != NULL ? (pid_t) g_ascii_strtoll (id, NULL, 10) : 0;
}

/* The keeper leads the rank's process group: a signal to the group
 * reaches the rank and what it started, and the keeper ignores it. */
static void
signal_rank (Rank *rank,
             int   signum)
{
  pid_t pid = rank_pid (rank);

  if (pid > 0)
    kill (-pid, signum);
}

/* A keeper that did not finish its work in KEEPER_MS goes with its
 * group; its rank dies with it (its parent-death signal). */
static gboolean
kill_keepers (gpointer user_data)
{
  Launch *launch = user_data;

  launch->keeper_timer = 0;
  for (int r = 0; r < launch->n; r++)
    signal_rank (&launch->ranks[r], SIGKILL);
  return G_SOURCE_REMOVE;
}

/* The grace period is over: each keeper kills its rank and everything
 * the rank started. */
static gboolean
kill_stragglers (gpointer user_data)
{
  Launch *launch = user_data;

  launch->kill_timer = 0;
  for (int r = 0; r < launch->n; r++)
    {
      pid_t pid = rank_pid (&launch->ranks[r]);

      if (pid > 0)
        kill (pid, CPMESH_KEEPER_KILL_NOW);
    }
  launch->keeper_timer = g_timeout_add (KEEPER_MS, kill_keepers, launch);
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

      if (!rank->exited || (with_output && (rank->outputs[0].open || rank->outputs[1].open)))
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

/* ---- output ---- */

static FILE *
output_file (const Output *output)
{
  return output->which == 0 ? stdout : stderr;
}

/* Ends the line another rank left unfinished on the same file, so that
 * no line holds two ranks' text. */
static void
take_the_line (Output *output)
{
  Output **unfinished = &output->rank->launch->unfinished[output->which];

  if (*unfinished != NULL && *unfinished != output)
    {
      fputc ('\n', output_file (output));
      (*unfinished)->needs_prefix = TRUE;
    }
  *unfinished = output;
}

/* Shows @length bytes of one line: all of it or its start, up to and
 * including its `\n` or `\r` if it has one. */
static void
show (Output       *output,
      const guint8 *text,
      gsize         length)
{
  FILE *out = output_file (output);
  guint8 last = text[length - 1];
  gboolean ours = output->rank->launch->unfinished[output->which] == output;
  /* A lone `\r` before a progress bar's first state, or the `\n` after
   * its last one, carries no text to name a rank for. */
  gboolean bare = length == 1 && (last == '\r' || (last == '\n' && ours));

  take_the_line (output);
  if (output->needs_prefix && !bare)
    fprintf (out, "[rank %d] ", output->rank->rank);
  fwrite (text, 1, length, out);
  fflush (out);
  /* After `\r` the next text overwrites this line, and starts with the
   * rank again; a line of another rank goes below it. */
  output->needs_prefix = last == '\n' || last == '\r';
  if (last == '\n')
    output->rank->launch->unfinished[output->which] = NULL;
}

static void
show_partial (Output *output)
{
  g_clear_handle_id (&output->partial_timer, g_source_remove);
  if (output->partial->len > 0)
    show (output, output->partial->data, output->partial->len);
  g_byte_array_set_size (output->partial, 0);
}

static gboolean
partial_waited (gpointer user_data)
{
  Output *output = user_data;

  output->partial_timer = 0;
  show_partial (output);
  return G_SOURCE_REMOVE;
}

/* Shows every line that @block ends, and keeps the start of the next
 * one a moment, within bounds. */
static void
show_block (Output       *output,
            const guint8 *block,
            gsize         length)
{
  const guint8 *end = block + length;

  while (block < end)
    {
      const guint8 *stop = block;

      while (stop < end && *stop != '\n' && *stop != '\r')
        stop++;
      if (stop == end)
        break;
      show_partial (output);
      show (output, block, (gsize) (stop + 1 - block));
      block = stop + 1;
    }
  if (block == end)
    return;
  if (output->partial->len + (gsize) (end - block) > PARTIAL_MAX)
    {
      show_partial (output);
      show (output, block, (gsize) (end - block));
      return;
    }
  g_byte_array_append (output->partial, block, (guint) (end - block));
  if (output->partial_timer == 0)
    output->partial_timer = g_timeout_add (PARTIAL_MS, partial_waited, output);
}

/* The pipe closed: what is left of its last line goes out, ended. */
static void
close_output (Output *output)
{
  Launch *launch = output->rank->launch;

  show_partial (output);
  if (launch->unfinished[output->which] == output)
    {
      fputc ('\n', output_file (output));
      fflush (output_file (output));
      launch->unfinished[output->which] = NULL;
    }
  output->open = FALSE;
  check_finished (launch);
}

static void read_block (Output *output);

static void
block_read (GObject      *source,
            GAsyncResult *result,
            gpointer      user_data)
{
  Output *output = user_data;
  gssize n = g_input_stream_read_finish (G_INPUT_STREAM (source), result, NULL);

  if (n <= 0)
    {
      close_output (output);
      return;
    }
  show_block (output, output->block, (gsize) n);
  read_block (output);
}

static void
read_block (Output *output)
{
  g_input_stream_read_async (output->pipe, output->block, sizeof output->block, G_PRIORITY_DEFAULT,
                             NULL, block_read, output);
}

static void
start_output (Rank         *rank,
              int           which,
              GInputStream *pipe)
{
  Output *output = &rank->outputs[which];

  output->rank = rank;
  output->which = which;
  output->pipe = g_object_ref (pipe);
  output->partial = g_byte_array_new ();
  output->open = TRUE;
  output->needs_prefix = TRUE;
  read_block (output);
}

static void
output_clear (Output *output)
{
  g_clear_handle_id (&output->partial_timer, g_source_remove);
  g_clear_object (&output->pipe);
  g_clear_pointer (&output->partial, g_byte_array_unref);
}

/* ---- ranks ---- */

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
make_launcher (Launch               *launch,
               const CpHarnessWorld *world,
               int                   rank)
{
  GSubprocessLauncher *launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                                                             G_SUBPROCESS_FLAGS_STDERR_PIPE);

  cp_harness_set_rank_environment (launcher, world, rank, NULL);
  g_subprocess_launcher_set_child_setup (launcher, cpmesh_keeper_child_setup, &launch->keeper, NULL);
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
      g_autoptr(GSubprocessLauncher) launcher = make_launcher (launch, &world, r);
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
      start_output (rank, 0, g_subprocess_get_stdout_pipe (rank->process));
      start_output (rank, 1, g_subprocess_get_stderr_pipe (rank->process));
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

      output_clear (&rank->outputs[0]);
      output_clear (&rank->outputs[1]);
      g_clear_object (&rank->process);
    }
  g_clear_handle_id (&launch->kill_timer, g_source_remove);
  g_clear_handle_id (&launch->keeper_timer, g_source_remove);
  g_clear_handle_id (&launch->drain_timer, g_source_remove);
  g_free (launch->ranks);
  g_main_loop_unref (launch->loop);
}

/* Starts the ranks and runs until they are all gone.  The launcher is a
 * subreaper too: should a keeper be killed by SIGKILL, what its rank
 * started comes to the launcher, which kills it at the end. */
static int
run (int                  n,
     guint16              port,
     guint                grace_ms,
     const char * const  *command)
{
  Launch launch = { .loop = g_main_loop_new (NULL, FALSE), .ranks = g_new0 (Rank, n), .n = n,
                    .grace_ms = grace_ms, .keeper = { .launcher = getpid () } };
  g_autoptr(GError) error = NULL;
  guint sigint = g_unix_signal_add (SIGINT, on_interrupt, &launch);
  guint sigterm = g_unix_signal_add (SIGTERM, on_terminate, &launch);
  int status;

  prctl (PR_SET_CHILD_SUBREAPER, 1);
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
  cpmesh_kill_descendants (0, NULL);
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
