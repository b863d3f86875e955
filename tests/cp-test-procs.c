/* cp-test-procs.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>
#include <unistd.h>

#include <libcpmesh.h>

#include "cp-test-procs.h"
#include "cp-test-util.h"

/* Time a whole case may take before the processes count as hung. */
#define CASE_LIMIT_MS 60000

guint16
cp_test_free_port (void)
{
  guint16 port = cp_harness_free_port ();

  g_assert_cmpuint (port, !=, 0);
  return port;
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
  /* The rank programs test the backend they are told to: UCX unless the
   * settings name another (on one host the default chain would pick
   * shm); a test of the default chain sets CPMESH_TRANSPORT empty. */
  g_subprocess_launcher_setenv (launcher, "CPMESH_TRANSPORT", "ucx", TRUE);
  /* The test records the cases its ranks report, not the ranks. */
  g_subprocess_launcher_unsetenv (launcher, "CP_RELIABILITY_LOG");
}

CpTestRank *
cp_test_group_spawn (CpTestGroup         *group,
                     const char          *scenario,
                     int                  rank,
                     int                  world_size,
                     guint16              port,
                     const char * const  *extra)
{
  g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                                                                      G_SUBPROCESS_FLAGS_STDIN_PIPE);
  const char *program = group->program ? group->program : "cp-test-ucx-rank";
  g_autofree char *path = g_test_build_filename (G_TEST_BUILT, program, NULL);
  const char *argv[] = { path, scenario, NULL };
  CpHarnessWorld world = {
    .size = world_size, .master_port = port, .rendezvous_port = port, .timeout_ms = CP_TEST_RANK_TIMEOUT_MS,
  };
  g_autoptr(GError) error = NULL;

  g_assert_cmpuint (group->n, <, G_N_ELEMENTS (group->ranks));
  set_defaults (launcher);
  group->ranks[group->n] = cp_harness_rank_spawn (launcher, &world, rank, extra, argv, &error);
  g_assert_no_error (error);
  return group->ranks[group->n++];
}

void
cp_test_run_until (CpTestRank      **ranks,
                   guint             n,
                   CpTestCondition   condition)
{
  g_assert_true (cp_harness_run_until (ranks, n, condition, CASE_LIMIT_MS * cp_test_time_factor ()));
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
      g_clear_pointer (&group->ranks[i], cp_harness_rank_free);
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

  cp_harness_set_up_glib ();
  cp_mesh_connect_async (environment, cancellable, connected, &state);
  g_main_loop_run (state.loop);
  g_main_loop_unref (state.loop);
  if (state.error != NULL)
    g_propagate_error (error, state.error);
  return state.mesh;
}
