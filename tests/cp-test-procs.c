/* cp-test-procs.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <libcpmesh.h>

#include "cp-test-procs.h"
#include "cp-test-util.h"

/* Time a whole case may take before the processes count as hung. */
#define CASE_LIMIT_MS 60000

static void
rank_free (CpTestRank *rank)
{
  g_clear_object (&rank->process);
  g_clear_object (&rank->in);
  g_clear_object (&rank->out);
  g_ptr_array_unref (rank->lines);
  g_free (rank);
}

static void
read_next_line (CpTestRank *rank);

static void
line_read (GObject      *source,
           GAsyncResult *result,
           gpointer      user_data)
{
  CpTestRank *rank = user_data;
  char *line = g_data_input_stream_read_line_finish_utf8 (G_DATA_INPUT_STREAM (source), result, NULL, NULL);

  if (line == NULL)
    {
      rank->eof = TRUE;
      return;
    }
  g_ptr_array_add (rank->lines, line);
  read_next_line (rank);
}

static void
read_next_line (CpTestRank *rank)
{
  g_data_input_stream_read_line_async (rank->out, G_PRIORITY_DEFAULT, NULL, line_read, rank);
}

static void
exited (GObject      *source,
        GAsyncResult *result,
        gpointer      user_data)
{
  CpTestRank *rank = user_data;

  g_subprocess_wait_finish (G_SUBPROCESS (source), result, NULL);
  rank->exited = TRUE;
}

guint16
cp_test_free_port (void)
{
  struct sockaddr_in address = { .sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK) };
  socklen_t length = sizeof address;
  int fd = socket (AF_INET, SOCK_STREAM, 0);

  g_assert_cmpint (fd, >=, 0);
  g_assert_cmpint (bind (fd, (struct sockaddr *) &address, sizeof address), ==, 0);
  g_assert_cmpint (getsockname (fd, (struct sockaddr *) &address, &length), ==, 0);
  close (fd);
  return ntohs (address.sin_port);
}

static void
set_defaults (GSubprocessLauncher *launcher)
{
  static const char *foreign[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "CPMESH_MESH_DIMS", "CPMESH_TOKEN",
    "CPMESH_PORT", "MASTER_PORT",
  };

  for (guint i = 0; i < G_N_ELEMENTS (foreign); i++)
    g_subprocess_launcher_unsetenv (launcher, foreign[i]);
  /* The library picks UCX's transports from MASTER_ADDR; a choice of the
   * caller's environment would override it. */
  g_subprocess_launcher_unsetenv (launcher, "UCX_NET_DEVICES");
  g_subprocess_launcher_unsetenv (launcher, "UCX_TLS");
  g_subprocess_launcher_setenv (launcher, "MASTER_ADDR", "127.0.0.1", TRUE);
  g_subprocess_launcher_setenv (launcher, "CPMESH_TIMEOUT_MS", G_STRINGIFY (CP_TEST_RANK_TIMEOUT_MS), TRUE);
  /* The test records the cases its ranks report, not the ranks. */
  g_subprocess_launcher_unsetenv (launcher, "CP_RELIABILITY_LOG");
}

static void
set_all (GSubprocessLauncher *launcher,
         const char * const  *settings)
{
  for (guint i = 0; settings != NULL && settings[i] != NULL; i++)
    {
      g_auto(GStrv) pair = g_strsplit (settings[i], "=", 2);

      g_subprocess_launcher_setenv (launcher, pair[0], pair[1], TRUE);
    }
}

static CpTestRank *
spawn_rank (const char          *program,
            const char          *scenario,
            const char * const  *settings,
            const char * const  *extra)
{
  g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                                                                      G_SUBPROCESS_FLAGS_STDIN_PIPE);
  g_autofree char *path = g_test_build_filename (G_TEST_BUILT, program, NULL);
  g_autoptr(GError) error = NULL;
  CpTestRank *rank = g_new0 (CpTestRank, 1);

  set_defaults (launcher);
  set_all (launcher, settings);
  set_all (launcher, extra);
  rank->process = g_subprocess_launcher_spawn (launcher, &error, path, scenario, NULL);
  g_assert_no_error (error);
  rank->in = g_object_ref (g_subprocess_get_stdin_pipe (rank->process));
  rank->out = g_data_input_stream_new (g_subprocess_get_stdout_pipe (rank->process));
  rank->lines = g_ptr_array_new_with_free_func (g_free);
  read_next_line (rank);
  g_subprocess_wait_async (rank->process, NULL, exited, rank);
  return rank;
}

CpTestRank *
cp_test_group_spawn (CpTestGroup         *group,
                     const char          *scenario,
                     int                  rank,
                     int                  world_size,
                     guint16              port,
                     const char * const  *extra)
{
  g_autofree char *rank_text = g_strdup_printf ("RANK=%d", rank);
  g_autofree char *world_text = g_strdup_printf ("WORLD_SIZE=%d", world_size);
  g_autofree char *port_text = g_strdup_printf ("CPMESH_PORT=%u", port);
  g_autofree char *master_port_text = g_strdup_printf ("MASTER_PORT=%u", port);
  const char *settings[] = { rank_text, world_text, port_text, master_port_text, NULL };

  if (port == 0)
    settings[2] = NULL;

  g_assert_cmpuint (group->n, <, G_N_ELEMENTS (group->ranks));
  group->ranks[group->n] = spawn_rank (group->program ? group->program : "cp-test-ucx-rank", scenario,
                                       settings, extra);
  return group->ranks[group->n++];
}

gboolean
cp_test_rank_is_done (CpTestRank *rank)
{
  return rank->exited && rank->eof;
}

void
cp_test_rank_release (CpTestRank *rank)
{
  if (rank->in != NULL)
    g_output_stream_close (rank->in, NULL, NULL);
  g_clear_object (&rank->in);
}

const char *
cp_test_rank_find_line (CpTestRank *rank,
                        const char *prefix)
{
  for (guint i = 0; i < rank->lines->len; i++)
    if (g_str_has_prefix (g_ptr_array_index (rank->lines, i), prefix))
      return g_ptr_array_index (rank->lines, i);
  return NULL;
}

gboolean
cp_test_all_done (CpTestRank **ranks,
                  guint        n)
{
  for (guint i = 0; i < n; i++)
    if (ranks[i] != NULL && !cp_test_rank_is_done (ranks[i]))
      return FALSE;
  return TRUE;
}

gboolean
cp_test_all_said (CpTestRank **ranks,
                  guint        n,
                  const char  *prefix)
{
  for (guint i = 0; i < n; i++)
    if (cp_test_rank_find_line (ranks[i], prefix) == NULL && !cp_test_rank_is_done (ranks[i]))
      return FALSE;
  return TRUE;
}

gboolean
cp_test_all_ready (CpTestRank **ranks,
                   guint        n)
{
  return cp_test_all_said (ranks, n, "READY");
}

gboolean
cp_test_any_done (CpTestRank **ranks,
                  guint        n)
{
  for (guint i = 0; i < n; i++)
    if (ranks[i] != NULL && cp_test_rank_is_done (ranks[i]))
      return TRUE;
  return FALSE;
}

static gboolean
time_is_up (gpointer user_data)
{
  *(gboolean *) user_data = TRUE;
  return G_SOURCE_REMOVE;
}

void
cp_test_run_for (guint ms)
{
  gboolean up = FALSE;

  g_timeout_add (ms, time_is_up, &up);
  while (!up)
    g_main_context_iteration (NULL, TRUE);
}

void
cp_test_run_until (CpTestRank      **ranks,
                   guint             n,
                   CpTestCondition   condition)
{
  gboolean late = FALSE;
  guint timer = g_timeout_add (CASE_LIMIT_MS * cp_test_time_factor (), time_is_up, &late);

  while (!condition (ranks, n) && !late)
    g_main_context_iteration (NULL, TRUE);
  if (!late)
    g_source_remove (timer);
  for (guint i = 0; late && i < n; i++)
    if (ranks[i] != NULL)
      g_subprocess_force_exit (ranks[i]->process);
  g_assert_false (late);
}

void
cp_test_assert_exit (CpTestRank *rank,
                     int         status)
{
  g_assert_true (g_subprocess_get_if_exited (rank->process));
  g_assert_cmpint (g_subprocess_get_exit_status (rank->process), ==, status);
}

GError *
cp_test_rank_dup_error (CpTestRank *rank,
                        int         code,
                        const char *text)
{
  g_autofree char *prefix = g_strdup_printf ("ERROR %d ", code);
  const char *line = cp_test_rank_find_line (rank, "ERROR");

  g_assert_nonnull (line);
  if (!g_str_has_prefix (line, prefix) || strstr (line, text) == NULL)
    g_error ("expected \"%s… %s…\", the rank reported \"%s\"", prefix, text, line);
  cp_test_assert_exit (rank, 3);
  return g_error_new_literal (CP_MESH_ERROR, code, line + strlen (prefix));
}

void
cp_test_assert_no_children (void)
{
  g_autoptr(GDir) proc = g_dir_open ("/proc", 0, NULL);
  g_autofree char *mine = g_strdup_printf (" %d ", (int) getpid ());
  const char *name;

  while ((name = g_dir_read_name (proc)) != NULL)
    {
      g_autofree char *path = g_build_filename ("/proc", name, "stat", NULL);
      g_autofree char *stat = NULL;
      const char *after;

      if (!g_ascii_isdigit (name[0]) || !g_file_get_contents (path, &stat, NULL, NULL))
        continue;
      /* "pid (comm) state ppid …": the parent follows the state. */
      after = strrchr (stat, ')');
      if (after != NULL && strncmp (after + 2 + 1, mine, strlen (mine)) == 0)
        g_error ("process %s is still a child of the test: %s", name, stat);
    }
}

void
cp_test_group_clear (CpTestGroup *group)
{
  for (guint i = 0; i < group->n; i++)
    {
      if (!cp_test_rank_is_done (group->ranks[i]))
        {
          g_subprocess_force_exit (group->ranks[i]->process);
          cp_test_run_until (&group->ranks[i], 1, cp_test_all_done);
        }
      g_clear_pointer (&group->ranks[i], rank_free);
    }
  group->n = 0;
  cp_test_assert_no_children ();
}

typedef struct
{
  GMainLoop *loop;
  CpMesh *mesh;
  GError *error;
} Connecting;

static void
connected (GObject      *source,
           GAsyncResult *result,
           gpointer      user_data)
{
  Connecting *state = user_data;

  state->mesh = cp_mesh_connect_finish (result, &state->error);
  g_main_loop_quit (state->loop);
}

CpMesh *
cp_test_connect (const char * const  *environment,
                 GCancellable        *cancellable,
                 GError             **error)
{
  Connecting state = { g_main_loop_new (NULL, FALSE), NULL, NULL };

  cp_mesh_connect_async (environment, cancellable, connected, &state);
  g_main_loop_run (state.loop);
  g_main_loop_unref (state.loop);
  if (state.error != NULL)
    g_propagate_error (error, state.error);
  return state.mesh;
}
