/* test-ucx.c: multi-process meshes over UCX
 *
 * Each case starts ranks as processes of cp-test-ucx-rank over loopback
 * and checks what they report.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cp-test-util.h"

#define TIMEOUT_MS 3000
/* Time a whole case may take before the processes count as hung. */
#define CASE_LIMIT_MS 60000

/* ---- processes ---- */

typedef struct
{
  GSubprocess *process;
  GDataInputStream *out;
  GPtrArray *lines;
  gboolean exited;
  gboolean eof;
} Rank;

static void
rank_free (Rank *rank)
{
  g_clear_object (&rank->process);
  g_clear_object (&rank->out);
  g_ptr_array_unref (rank->lines);
  g_free (rank);
}

static void
read_next_line (Rank *rank);

static void
line_read (GObject      *source,
           GAsyncResult *result,
           gpointer      user_data)
{
  Rank *rank = user_data;
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
read_next_line (Rank *rank)
{
  g_data_input_stream_read_line_async (rank->out, G_PRIORITY_DEFAULT, NULL, line_read, rank);
}

static void
exited (GObject      *source,
        GAsyncResult *result,
        gpointer      user_data)
{
  Rank *rank = user_data;

  g_subprocess_wait_finish (G_SUBPROCESS (source), result, NULL);
  rank->exited = TRUE;
}

static guint16
free_port (void)
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

/* Starts one rank; @settings are NAME=VALUE strings over the defaults. */
static Rank *
spawn_rank (const char          *scenario,
            const char * const  *settings)
{
  g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDOUT_PIPE);
  g_autofree char *program = g_test_build_filename (G_TEST_BUILT, "cp-test-ucx-rank", NULL);
  static const char *foreign[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "CPMESH_MESH_DIMS", "CPMESH_TOKEN",
  };
  g_autoptr(GError) error = NULL;
  Rank *rank = g_new0 (Rank, 1);

  for (guint i = 0; i < G_N_ELEMENTS (foreign); i++)
    g_subprocess_launcher_unsetenv (launcher, foreign[i]);
  g_subprocess_launcher_setenv (launcher, "UCX_NET_DEVICES", "lo", TRUE);
  g_subprocess_launcher_setenv (launcher, "MASTER_ADDR", "127.0.0.1", TRUE);
  g_subprocess_launcher_setenv (launcher, "CPMESH_TIMEOUT_MS", G_STRINGIFY (TIMEOUT_MS), TRUE);
  for (guint i = 0; settings[i] != NULL; i++)
    {
      g_auto(GStrv) pair = g_strsplit (settings[i], "=", 2);

      g_subprocess_launcher_setenv (launcher, pair[0], pair[1], TRUE);
    }
  rank->process = g_subprocess_launcher_spawn (launcher, &error, program, scenario, NULL);
  g_assert_no_error (error);
  rank->out = g_data_input_stream_new (g_subprocess_get_stdout_pipe (rank->process));
  rank->lines = g_ptr_array_new_with_free_func (g_free);
  read_next_line (rank);
  g_subprocess_wait_async (rank->process, NULL, exited, rank);
  return rank;
}

static gboolean
is_done (Rank *rank)
{
  return rank->exited && rank->eof;
}

static const char *
find_line (Rank       *rank,
           const char *prefix)
{
  for (guint i = 0; i < rank->lines->len; i++)
    if (g_str_has_prefix (g_ptr_array_index (rank->lines, i), prefix))
      return g_ptr_array_index (rank->lines, i);
  return NULL;
}

typedef gboolean (*Condition) (Rank **ranks, guint n);

static gboolean
all_done (Rank **ranks,
          guint  n)
{
  for (guint i = 0; i < n; i++)
    if (ranks[i] != NULL && !is_done (ranks[i]))
      return FALSE;
  return TRUE;
}

static gboolean
all_ready (Rank **ranks,
           guint  n)
{
  for (guint i = 0; i < n; i++)
    if (find_line (ranks[i], "READY") == NULL && !is_done (ranks[i]))
      return FALSE;
  return TRUE;
}

static gboolean
any_done (Rank **ranks,
          guint  n)
{
  for (guint i = 0; i < n; i++)
    if (ranks[i] != NULL && is_done (ranks[i]))
      return TRUE;
  return FALSE;
}

static gboolean
time_is_up (gpointer user_data)
{
  *(gboolean *) user_data = TRUE;
  return G_SOURCE_REMOVE;
}

/* Runs the main loop until @condition holds; hung ranks are killed and
 * the test fails. */
static void
run_until (Rank      **ranks,
           guint       n,
           Condition   condition)
{
  gboolean late = FALSE;
  guint timer = g_timeout_add (CASE_LIMIT_MS, time_is_up, &late);

  while (!condition (ranks, n) && !late)
    g_main_context_iteration (NULL, TRUE);
  if (!late)
    g_source_remove (timer);
  for (guint i = 0; late && i < n; i++)
    if (ranks[i] != NULL)
      g_subprocess_force_exit (ranks[i]->process);
  g_assert_false (late);
}

static void
assert_exit (Rank *rank,
             int   status)
{
  g_assert_true (g_subprocess_get_if_exited (rank->process));
  g_assert_cmpint (g_subprocess_get_exit_status (rank->process), ==, status);
}

static void
assert_error (Rank       *rank,
              int         code,
              const char *text)
{
  g_autofree char *prefix = g_strdup_printf ("ERROR %d ", code);
  const char *line = find_line (rank, "ERROR");

  g_assert_nonnull (line);
  if (!g_str_has_prefix (line, prefix) || strstr (line, text) == NULL)
    g_error ("expected \"%s… %s…\", the rank reported \"%s\"", prefix, text, line);
  assert_exit (rank, 3);
}

/* No process this test started is left, not even as a zombie. */
static void
assert_no_children (void)
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

typedef struct
{
  Rank *ranks[8];
  guint n;
} Group;

static void
group_clear (Group *group)
{
  for (guint i = 0; i < group->n; i++)
    g_clear_pointer (&group->ranks[i], rank_free);
  assert_no_children ();
}

static Rank *
group_spawn (Group              *group,
             const char         *scenario,
             const char * const *settings)
{
  g_assert_cmpuint (group->n, <, G_N_ELEMENTS (group->ranks));
  group->ranks[group->n] = spawn_rank (scenario, settings);
  return group->ranks[group->n++];
}

#define SETTINGS(...) ((const char * const[]) { __VA_ARGS__, NULL })

static char *
setting (const char *name,
         int         value)
{
  return g_strdup_printf ("%s=%d", name, value);
}

/* Settings of one rank of a world of @world_size meeting at @port,
 * followed by @extra (NULL-terminated). */
static GStrv
rank_settings (int                 rank,
               int                 world_size,
               guint16             port,
               const char * const *extra)
{
  g_autoptr(GStrvBuilder) builder = g_strv_builder_new ();

  g_autofree char *rank_text = setting ("RANK", rank);
  g_autofree char *world_text = setting ("WORLD_SIZE", world_size);
  g_autofree char *port_text = setting ("MASTER_PORT", port);

  g_strv_builder_add_many (builder, rank_text, world_text, port_text, NULL);
  if (extra != NULL)
    g_strv_builder_addv (builder, (const char **) extra);
  return g_strv_builder_end (builder);
}

static Rank *
spawn (Group              *group,
       const char         *scenario,
       int                 rank,
       int                 world_size,
       guint16             port,
       const char * const *extra)
{
  g_auto(GStrv) settings = rank_settings (rank, world_size, port, extra);

  return group_spawn (group, scenario, (const char * const *) settings);
}

/* ---- collectives ---- */

static void
test_collectives (gconstpointer data)
{
  int n = GPOINTER_TO_INT (data);
  guint16 port = free_port ();
  Group group = { 0 };

  g_test_summary ("Every collective over UCX between processes equals the in-process "
                  "backend bit for bit");
  for (int r = 0; r < n; r++)
    spawn (&group, "collectives", r, n, port,
           n == 4 ? SETTINGS ("CPMESH_MESH_DIMS=dp=2,cp=2", "CPMESH_TIMEOUT_MS=30000")
                  : SETTINGS ("CPMESH_TIMEOUT_MS=30000"));
  run_until (group.ranks, group.n, all_done);
  for (int r = 0; r < n; r++)
    {
      assert_exit (group.ranks[r], 0);
      g_assert_nonnull (find_line (group.ranks[r], "OK"));
    }
  group_clear (&group);
}

/* ---- rendezvous ---- */

/* Rank 0 of a world of two refuses @impostor, then lets the real rank 1
 * in: the listener keeps serving after a rejection. */
static void
check_rejection (const char * const *impostor,
                 int                 impostor_world,
                 int                 code,
                 const char         *text)
{
  guint16 port = free_port ();
  Group group = { 0 };
  Rank *root, *bad, *good;

  root = spawn (&group, "join", 0, 2, port, SETTINGS ("CPMESH_TOKEN=right"));
  bad = spawn (&group, "join", 1, impostor_world, port, impostor);
  run_until (&bad, 1, all_done);
  assert_error (bad, code, text);
  good = spawn (&group, "join", 1, 2, port, SETTINGS ("CPMESH_TOKEN=right"));
  run_until (group.ranks, group.n, all_done);
  assert_exit (root, 0);
  assert_exit (good, 0);
  g_assert_nonnull (find_line (good, "JOINED 1"));
  group_clear (&group);
}

static void
test_wrong_token (void)
{
  g_test_summary ("A rank without the token is refused with AUTH; the token never "
                  "crosses the wire");
  check_rejection (SETTINGS ("CPMESH_TOKEN=wrong"), 2, CP_MESH_ERROR_AUTH,
                   "did not prove it holds the mesh token");
  check_rejection (SETTINGS ("CPMESH_TIMEOUT_MS=3000"), 2, CP_MESH_ERROR_AUTH, "CPMESH_TOKEN");
}

static void
test_wrong_world (void)
{
  check_rejection (SETTINGS ("CPMESH_TOKEN=right"), 3, CP_MESH_ERROR_INVALID_TOPOLOGY,
                   "started with world size 3, rank 0 with 2");
  check_rejection (SETTINGS ("CPMESH_TOKEN=right", "CPMESH_MESH_DIMS=dp=1,cp=2"), 2,
                   CP_MESH_ERROR_INVALID_TOPOLOGY, "its mesh dimensions are dp=1,cp=2, rank 0's are cp=2");
}

/* Two processes claim rank 1: whichever comes second is refused. */
static void
test_duplicate_rank (void)
{
  guint16 port = free_port ();
  Group group = { 0 };
  Rank *first, *second, *refused, *accepted;

  spawn (&group, "join", 0, 3, port, NULL);
  first = spawn (&group, "join", 1, 3, port, NULL);
  second = spawn (&group, "join", 1, 3, port, NULL);
  run_until ((Rank *[]) { first, second }, 2, any_done);
  refused = is_done (first) ? first : second;
  accepted = refused == first ? second : first;
  assert_error (refused, CP_MESH_ERROR_INVALID_TOPOLOGY, "rank 1 has already joined");
  spawn (&group, "join", 2, 3, port, NULL);
  run_until (group.ranks, group.n, all_done);
  assert_exit (group.ranks[0], 0);
  assert_exit (accepted, 0);
  assert_exit (group.ranks[3], 0);
  group_clear (&group);
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

  for (gsize i = 0; i < size; i++)
    bytes[i] = (guint8) g_random_int ();
  g_assert_cmpint (write (fd, bytes, size), ==, (gssize) size);
}

/* Random bytes on the listener's port, on a connection kept open and on
 * one closed right away, neither crash nor wedge rank 0. */
static void
test_garbage (void)
{
  guint16 port = free_port ();
  Group group = { 0 };
  int lingering, closed;
  guint64 small_header[2] = { 8, 0 };

  spawn (&group, "join", 0, 2, port, NULL);
  lingering = connect_raw (port);
  send_garbage (lingering, 4096);
  closed = connect_raw (port);
  /* A header that claims a short payload, then nonsense. */
  g_assert_cmpint (write (closed, small_header, sizeof small_header), ==, sizeof small_header);
  send_garbage (closed, 64);
  close (closed);
  spawn (&group, "join", 1, 2, port, NULL);
  run_until (group.ranks, group.n, all_done);
  assert_exit (group.ranks[0], 0);
  assert_exit (group.ranks[1], 0);
  close (lingering);
  group_clear (&group);
}

static void
test_nobody_listens (void)
{
  Group group = { 0 };
  gint64 started = g_get_monotonic_time ();
  Rank *lonely = spawn (&group, "join", 1, 2, free_port (), SETTINGS ("CPMESH_TIMEOUT_MS=500"));

  run_until (&lonely, 1, all_done);
  assert_error (lonely, CP_MESH_ERROR_TIMED_OUT, "rank 0 did not answer at 127.0.0.1:");
  g_assert_cmpint (g_get_monotonic_time () - started, <, 5 * G_TIME_SPAN_SECOND);
  group_clear (&group);
}

/* ---- failures ---- */

static void
check_survivor (Rank   *rank,
                gint64  since_kill_us)
{
  const char *line = find_line (rank, "FAILED");
  const char *closed = find_line (rank, "CLOSED");
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
  assert_exit (rank, 0);
}

static void
test_sigkill (void)
{
  guint16 port = free_port ();
  Group group = { 0 };
  gint64 killed;

  g_test_summary ("A rank killed in the middle of all_gathers makes the others fail with "
                  "PEER_LOST or TIMED_OUT within the timeout, and nothing is left behind");
  for (int r = 0; r < 3; r++)
    spawn (&group, "gather-loop", r, 3, port, NULL);
  run_until (group.ranks, group.n, all_ready);
  g_subprocess_send_signal (group.ranks[2]->process, SIGKILL);
  killed = g_get_monotonic_time ();
  run_until (group.ranks, group.n, all_done);
  check_survivor (group.ranks[0], g_get_monotonic_time () - killed);
  check_survivor (group.ranks[1], g_get_monotonic_time () - killed);
  g_assert_true (g_subprocess_get_if_signaled (group.ranks[2]->process));
  group_clear (&group);
}

static void
test_rank_lost (void)
{
  guint16 port = free_port ();
  Group group = { 0 };
  const char *line;
  int rank;
  gint64 after_ms;

  g_test_summary ("An idle main-loop program hears CpMesh::rank-lost when a peer leaves");
  spawn (&group, "wait-lost", 0, 2, port, NULL);
  spawn (&group, "wait-lost", 1, 2, port, NULL);
  run_until (group.ranks, group.n, all_done);
  assert_exit (group.ranks[0], 0);
  assert_exit (group.ranks[1], 0);
  line = find_line (group.ranks[0], "LOST");
  g_assert_nonnull (line);
  g_assert_cmpint (sscanf (line, "LOST %d %" G_GINT64_FORMAT, &rank, &after_ms), ==, 2);
  g_test_message ("rank 0: %s", line);
  g_assert_cmpint (rank, ==, 1);
  g_assert_cmpint (after_ms, <=, TIMEOUT_MS);
  group_clear (&group);
}

static void
test_async (void)
{
  guint16 port = free_port ();
  Group group = { 0 };

  spawn (&group, "async", 0, 2, port, NULL);
  spawn (&group, "async", 1, 2, port, NULL);
  run_until (group.ranks, group.n, all_done);
  g_assert_nonnull (find_line (group.ranks[0], "OK 0"));
  g_assert_nonnull (find_line (group.ranks[1], "OK 1"));
  group_clear (&group);
}

/* ---- settings, in this process ---- */

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

static CpMesh *
connect_with (const char * const  *environment,
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

static void
check_bad_environment (const char * const *environment,
                       const char         *text)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = connect_with (environment, NULL, &error);

  g_assert_null (mesh);
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
  if (strstr (error->message, text) == NULL)
    g_error ("expected \"%s\" in \"%s\"", text, error->message);
}

static void
test_bad_environment (void)
{
  g_test_summary ("Bad or contradictory launcher settings name the variable and its value");
  check_bad_environment (SETTINGS ("RANK=abc", "WORLD_SIZE=2"), "RANK=\"abc\": expected a whole number");
  check_bad_environment (SETTINGS ("RANK=2", "WORLD_SIZE=2"), "RANK=\"2\": rank is not below WORLD_SIZE=2");
  check_bad_environment (SETTINGS ("RANK=1"), "RANK=\"1\": RANK is set but WORLD_SIZE is not");
  check_bad_environment (SETTINGS ("OMPI_COMM_WORLD_SIZE=4"),
                         "OMPI_COMM_WORLD_SIZE=\"4\": OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
  check_bad_environment (SETTINGS ("SLURM_PROCID=0", "SLURM_NTASKS=0"), "SLURM_NTASKS=\"0\"");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=-1"), "LOCAL_RANK=\"-1\"");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=4", "CPMESH_MESH_DIMS=dp=2,cp=3"),
                         "CPMESH_MESH_DIMS=\"dp=2,cp=3\": the dimensions hold 6 ranks, but the world size is 4");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=4", "CPMESH_MESH_DIMS=dp2"),
                         "CPMESH_MESH_DIMS=\"dp2\": expected comma-separated NAME=SIZE pairs");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=4", "CPMESH_MESH_DIMS=cp=2,cp=2"),
                         "dimension name \"cp\" is empty or used twice");
  check_bad_environment (SETTINGS ("CPMESH_TIMEOUT_MS=0"), "CPMESH_TIMEOUT_MS=\"0\"");
  check_bad_environment (SETTINGS ("MASTER_PORT=70000"), "MASTER_PORT=\"70000\"");
  check_bad_environment (SETTINGS ("MASTER_ADDR="), "MASTER_ADDR=\"\"");
  check_bad_environment (SETTINGS ("RANK=0", "WORLD_SIZE=5000"), "WORLD_SIZE=\"5000\"");
}

/* torchrun's variables describe this process even when a surrounding
 * mpirun or srun left theirs. */
static void
test_launcher_precedence (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = connect_with (SETTINGS ("RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0",
                                                   "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
                                                   "SLURM_PROCID=5", "SLURM_NTASKS=8",
                                                   "CPMESH_MESH_DIMS=dp=1,cp=1", "CPMESH_TIMEOUT_MS=1234"),
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
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
  g_clear_error (&error);
  g_assert_null (cp_mesh_new_ucx (1, 2, NULL, 0, NULL, NULL, NULL, 0, 0, &error));
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
  g_assert_nonnull (strstr (error->message, "port 0"));
  g_clear_error (&error);
  g_assert_null (cp_mesh_new_ucx (0, 2, "no.such.host.invalid", 29500, NULL, NULL, NULL, 0, 500, &error));
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY);
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
  g_autofree char *port = setting ("MASTER_PORT", free_port ());
  g_autoptr(GError) error = NULL;
  g_autoptr(CpMesh) mesh = NULL;
  gint64 started = g_get_monotonic_time ();

  g_timeout_add (100, cancel_soon, cancellable);
  mesh = connect_with (SETTINGS ("RANK=1", "WORLD_SIZE=2", "CPMESH_TIMEOUT_MS=20000", port),
                       cancellable, &error);
  g_assert_null (mesh);
  g_assert_error (error, G_IO_ERROR, G_IO_ERROR_CANCELLED);
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
  g_setenv ("UCX_NET_DEVICES", "lo", TRUE);
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Ucx/settings/bad-environment", test_bad_environment);
  g_test_add_func ("/Cp/Ucx/settings/launcher-precedence", test_launcher_precedence);
  g_test_add_func ("/Cp/Ucx/settings/explicit", test_explicit);
  g_test_add_func ("/Cp/Ucx/settings/cancel", test_cancel);
  g_test_add_data_func ("/Cp/Ucx/collectives/2", GINT_TO_POINTER (2), test_collectives);
  g_test_add_data_func ("/Cp/Ucx/collectives/3", GINT_TO_POINTER (3), test_collectives);
  g_test_add_data_func ("/Cp/Ucx/collectives/4", GINT_TO_POINTER (4), test_collectives);
  g_test_add_func ("/Cp/Ucx/rendezvous/wrong-token", test_wrong_token);
  g_test_add_func ("/Cp/Ucx/rendezvous/wrong-world", test_wrong_world);
  g_test_add_func ("/Cp/Ucx/rendezvous/duplicate-rank", test_duplicate_rank);
  g_test_add_func ("/Cp/Ucx/rendezvous/garbage", test_garbage);
  g_test_add_func ("/Cp/Ucx/rendezvous/nobody-listens", test_nobody_listens);
  g_test_add_func ("/Cp/Ucx/failure/sigkill", test_sigkill);
  g_test_add_func ("/Cp/Ucx/failure/rank-lost", test_rank_lost);
  g_test_add_func ("/Cp/Ucx/async/connect-barrier", test_async);

  return g_test_run ();
}
