/* cp-harness.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cp-harness.h"

/* ---- ports ---- */

/* Binds @port (0: any) on loopback and gives the port bound, or 0. */
static guint16
bind_loopback (guint16 port)
{
  struct sockaddr_in address = {
    .sin_family = AF_INET,
    .sin_port = htons (port),
    .sin_addr.s_addr = htonl (INADDR_LOOPBACK),
  };
  socklen_t length = sizeof address;
  int fd = socket (AF_INET, SOCK_STREAM, 0);
  guint16 bound = 0;

  if (fd >= 0 && bind (fd, (struct sockaddr *) &address, sizeof address) == 0 &&
      getsockname (fd, (struct sockaddr *) &address, &length) == 0)
    bound = ntohs (address.sin_port);
  if (fd >= 0)
    close (fd);
  return bound;
}

guint16
cp_harness_free_port (void)
{
  return bind_loopback (0);
}

guint16
cp_harness_free_port_pair (void)
{
  for (guint attempt = 0; attempt < 100; attempt++)
    {
      guint16 port = cp_harness_free_port ();

      if (port != 0 && port < G_MAXUINT16 && bind_loopback (port + 1) == port + 1)
        return port;
    }
  return cp_harness_free_port ();
}

/* ---- ranks on threads ---- */

GList *
cp_harness_local_group (const char  *dim_name,
                        int          size,
                        guint        timeout_ms,
                        GError     **error)
{
  const char *names[] = { dim_name, NULL };
  GList *meshes = cp_mesh_new_local_group (names, &size, 1, error);

  for (GList *l = meshes; l != NULL && timeout_ms > 0; l = l->next)
    cp_mesh_set_timeout_ms (l->data, timeout_ms);
  return meshes;
}

/* Atomics, not a GMutex: ThreadSanitizer cannot see GLib's futex-based
 * locks. */
typedef struct
{
  CpMesh *mesh;
  CpHarnessRankFunc func;
  gpointer user_data;
  gint done;
} RankJob;

static gpointer
rank_thread (gpointer data)
{
  RankJob *job = data;

  job->func (job->mesh, job->user_data);
  g_atomic_int_set (&job->done, TRUE);
  return NULL;
}

/* GLib sets up type classes, its own locks (the type system's, the error
 * domains') and G_DEFINE_QUARK's quarks on first use, through atomics in
 * code ThreadSanitizer does not instrument or plain static variables:
 * rank threads making those first uses together read as races.  They are
 * made here, on the calling thread, first. */
void
cp_harness_set_up_glib (void)
{
  static gsize done;
  const GType types[] = {
    CP_TYPE_ATTENTION, CP_TYPE_ATTENTION_OPTIONS, CP_TYPE_BATCH, CP_TYPE_BATCH_OPTIONS,
    CP_TYPE_CONTEXT, CP_TYPE_MESH, CP_TYPE_MESH_OPTIONS, CP_TYPE_TENSOR, CP_TYPE_THD_OPTIONS,
    CP_TYPE_TENSOR_ERROR, CP_TYPE_MESH_ERROR, CP_TYPE_BATCH_ERROR, CP_TYPE_ATTENTION_ERROR,
    CP_TYPE_DTYPE, CP_TYPE_DEVICE_KIND, CP_TYPE_LOAD_BALANCE, CP_TYPE_REDUCE_OP,
    CP_TYPE_ROTATE_METHOD, CP_TYPE_PADDING_MASK_RULE,
  };

  if (!g_once_init_enter (&done))
    return;
  for (guint i = 0; i < G_N_ELEMENTS (types); i++)
    if (G_TYPE_IS_CLASSED (types[i]))
      g_type_class_unref (g_type_class_ref (types[i]));
  g_error_free (g_error_new_literal (CP_MESH_ERROR, CP_MESH_ERROR_FAILED, "set up"));
  (void) CP_TENSOR_ERROR;
  (void) CP_BATCH_ERROR;
  (void) CP_ATTENTION_ERROR;
  g_once_init_leave (&done, 1);
}

static gboolean
all_jobs_done (RankJob *jobs,
               guint    n)
{
  for (guint i = 0; i < n; i++)
    if (!g_atomic_int_get (&jobs[i].done))
      return FALSE;
  return TRUE;
}

/* Waits until every job is done or @limit_ms passed; then fails naming
 * the ranks still running. */
static gboolean
await_jobs (RankJob  *jobs,
            guint     n,
            guint     limit_ms,
            GError  **error)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) limit_ms * G_TIME_SPAN_MILLISECOND;
  g_autoptr(GString) running = g_string_new (NULL);

  while (!all_jobs_done (jobs, n) && g_get_monotonic_time () < deadline)
    g_usleep (G_TIME_SPAN_MILLISECOND);
  for (guint i = 0; i < n; i++)
    if (!g_atomic_int_get (&jobs[i].done))
      g_string_append_printf (running, "%s rank %d", running->len ? "," : "",
                              cp_mesh_get_rank (jobs[i].mesh));
  if (running->len == 0)
    return TRUE;
  g_set_error (error, G_IO_ERROR, G_IO_ERROR_TIMED_OUT,
               "still running %u ms after they started:%s; a wait that should have ended did not",
               limit_ms, running->str);
  return FALSE;
}

gboolean
cp_harness_run_threads (GList              *meshes,
                        CpHarnessRankFunc   func,
                        gpointer           *rank_data,
                        guint               limit_ms,
                        GError            **error)
{
  guint n = g_list_length (meshes);
  RankJob *jobs = g_new0 (RankJob, n);
  g_autofree GThread **threads = g_new0 (GThread *, n);
  guint i = 0;

  cp_harness_set_up_glib ();
  for (GList *l = meshes; l != NULL; l = l->next, i++)
    {
      jobs[i] = (RankJob) { l->data, func, rank_data != NULL ? rank_data[i] : NULL, FALSE };
      threads[i] = g_thread_new ("cp-rank", rank_thread, &jobs[i]);
    }
  /* Hung threads still use their jobs: those stay allocated. */
  if (limit_ms > 0 && !await_jobs (jobs, n, limit_ms, error))
    return FALSE;
  for (i = 0; i < n; i++)
    g_thread_join (threads[i]);
  g_free (jobs);
  return TRUE;
}

/* ---- ranks as processes ---- */

static void
setenv_number (GSubprocessLauncher *launcher,
               const char          *name,
               gint64               value)
{
  g_autofree char *text = g_strdup_printf ("%" G_GINT64_FORMAT, value);

  g_subprocess_launcher_setenv (launcher, name, text, TRUE);
}

static void
set_all (GSubprocessLauncher *launcher,
         const char * const  *settings)
{
  for (guint i = 0; settings != NULL && settings[i] != NULL; i++)
    {
      g_auto(GStrv) pair = g_strsplit (settings[i], "=", 2);

      g_subprocess_launcher_setenv (launcher, pair[0], pair[1] != NULL ? pair[1] : "", TRUE);
    }
}

void
cp_harness_set_rank_environment (GSubprocessLauncher  *launcher,
                                 const CpHarnessWorld *world,
                                 int                   rank,
                                 const char * const   *settings)
{
  setenv_number (launcher, "RANK", rank);
  setenv_number (launcher, "LOCAL_RANK", rank);
  setenv_number (launcher, "WORLD_SIZE", world->size);
  setenv_number (launcher, "LOCAL_WORLD_SIZE", world->size);
  g_subprocess_launcher_setenv (launcher, "GROUP_RANK", "0", TRUE);
  g_subprocess_launcher_setenv (launcher, "MASTER_ADDR", world->address ? world->address : "127.0.0.1", TRUE);
  if (world->master_port != 0)
    setenv_number (launcher, "MASTER_PORT", world->master_port);
  if (world->rendezvous_port != 0)
    setenv_number (launcher, "CPMESH_PORT", world->rendezvous_port);
  if (world->token != NULL)
    g_subprocess_launcher_setenv (launcher, "CPMESH_TOKEN", world->token, TRUE);
  if (world->timeout_ms != 0)
    setenv_number (launcher, "CPMESH_TIMEOUT_MS", world->timeout_ms);
  set_all (launcher, settings);
}

static void read_next_line (CpHarnessRank *rank);

static void
line_read (GObject      *source,
           GAsyncResult *result,
           gpointer      user_data)
{
  CpHarnessRank *rank = user_data;
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
read_next_line (CpHarnessRank *rank)
{
  g_data_input_stream_read_line_async (rank->out, G_PRIORITY_DEFAULT, NULL, line_read, rank);
}

static void
exited (GObject      *source,
        GAsyncResult *result,
        gpointer      user_data)
{
  CpHarnessRank *rank = user_data;

  g_subprocess_wait_finish (G_SUBPROCESS (source), result, NULL);
  rank->exited = TRUE;
}

CpHarnessRank *
cp_harness_rank_spawn (GSubprocessLauncher  *launcher,
                       const CpHarnessWorld *world,
                       int                   rank,
                       const char * const   *settings,
                       const char * const   *argv,
                       GError              **error)
{
  GSubprocess *process;
  GOutputStream *in;
  CpHarnessRank *self;

  cp_harness_set_rank_environment (launcher, world, rank, settings);
  process = g_subprocess_launcher_spawnv (launcher, argv, error);
  if (process == NULL)
    return NULL;
  self = g_new0 (CpHarnessRank, 1);
  self->process = process;
  in = g_subprocess_get_stdin_pipe (process);
  self->in = in != NULL ? g_object_ref (in) : NULL;
  self->out = g_data_input_stream_new (g_subprocess_get_stdout_pipe (process));
  self->lines = g_ptr_array_new_with_free_func (g_free);
  read_next_line (self);
  g_subprocess_wait_async (process, NULL, exited, self);
  return self;
}

void
cp_harness_rank_free (CpHarnessRank *rank)
{
  g_clear_object (&rank->process);
  g_clear_object (&rank->in);
  g_clear_object (&rank->out);
  g_ptr_array_unref (rank->lines);
  g_free (rank);
}

gboolean
cp_harness_rank_is_done (CpHarnessRank *rank)
{
  return rank->exited && rank->eof;
}

void
cp_harness_rank_release (CpHarnessRank *rank)
{
  if (rank->in != NULL)
    g_output_stream_close (rank->in, NULL, NULL);
  g_clear_object (&rank->in);
}

const char *
cp_harness_rank_find_line (CpHarnessRank *rank,
                           const char    *prefix)
{
  for (guint i = 0; i < rank->lines->len; i++)
    if (g_str_has_prefix (g_ptr_array_index (rank->lines, i), prefix))
      return g_ptr_array_index (rank->lines, i);
  return NULL;
}

int
cp_harness_exit_status (GSubprocess *process)
{
  if (g_subprocess_get_if_signaled (process))
    return 128 + g_subprocess_get_term_sig (process);
  return g_subprocess_get_exit_status (process);
}

static gboolean
is_done (CpHarnessRank *rank)
{
  return rank == NULL || cp_harness_rank_is_done (rank);
}

gboolean
cp_harness_all_done (CpHarnessRank **ranks,
                     guint           n)
{
  for (guint i = 0; i < n; i++)
    if (!is_done (ranks[i]))
      return FALSE;
  return TRUE;
}

gboolean
cp_harness_any_done (CpHarnessRank **ranks,
                     guint           n)
{
  for (guint i = 0; i < n; i++)
    if (ranks[i] != NULL && cp_harness_rank_is_done (ranks[i]))
      return TRUE;
  return FALSE;
}

gboolean
cp_harness_all_said (CpHarnessRank **ranks,
                     guint           n,
                     const char     *prefix)
{
  for (guint i = 0; i < n; i++)
    if (!is_done (ranks[i]) && cp_harness_rank_find_line (ranks[i], prefix) == NULL)
      return FALSE;
  return TRUE;
}

gboolean
cp_harness_all_ready (CpHarnessRank **ranks,
                      guint           n)
{
  return cp_harness_all_said (ranks, n, "READY");
}

gboolean
cp_harness_all_closed (CpHarnessRank **ranks,
                       guint           n)
{
  return cp_harness_all_said (ranks, n, "CLOSED");
}

static gboolean
time_is_up (gpointer user_data)
{
  *(gboolean *) user_data = TRUE;
  return G_SOURCE_REMOVE;
}

void
cp_harness_run_for (guint ms)
{
  gboolean up = FALSE;

  g_timeout_add (ms, time_is_up, &up);
  while (!up)
    g_main_context_iteration (NULL, TRUE);
}

gboolean
cp_harness_run_until (CpHarnessRank      **ranks,
                      guint                n,
                      CpHarnessCondition   condition,
                      guint                limit_ms)
{
  gboolean late = FALSE;
  guint timer = limit_ms > 0 ? g_timeout_add (limit_ms, time_is_up, &late) : 0;

  while (!condition (ranks, n) && !late)
    g_main_context_iteration (NULL, TRUE);
  if (!late && timer != 0)
    g_source_remove (timer);
  for (guint i = 0; late && i < n; i++)
    if (ranks[i] != NULL)
      g_subprocess_force_exit (ranks[i]->process);
  return !late;
}

/* ---- what rank programs play ---- */

void
cp_harness_report (const char *format,
                   ...)
{
  va_list args;

  va_start (args, format);
  vprintf (format, args);
  va_end (args);
  putchar ('\n');
  fflush (stdout);
}

CpMesh *
cp_harness_join_from_env (void)
{
  g_autoptr(GError) error = NULL;
  CpMesh *mesh = cp_mesh_new_from_env (&error);

  if (mesh == NULL)
    cp_harness_report ("ERROR %d %s", error->code, error->message);
  else
    cp_harness_report ("JOINED %d", cp_mesh_get_rank (mesh));
  return mesh;
}

static gint64
ms_since (gint64 started)
{
  return (g_get_monotonic_time () - started) / 1000;
}

gboolean
cp_harness_gather_until_failure (CpMesh *mesh)
{
  const gint64 shape[] = { 1 << 20 };
  g_autoptr(CpTensor) mine = cp_tensor_new_full (CP_DTYPE_FLOAT32, shape, 1, cp_mesh_get_rank (mesh), NULL);
  g_autoptr(CpTensor) before = cp_tensor_copy (mine, NULL);
  g_autoptr(GError) error = NULL;
  gint64 started;

  for (guint i = 0;; i++)
    {
      g_autoptr(CpTensor) out = NULL;

      started = g_get_monotonic_time ();
      out = cp_mesh_all_gather (mesh, mine, 0, &error);
      if (out == NULL)
        break;
      if (i == 0)
        cp_harness_report ("READY");
    }
  cp_harness_report ("FAILED %d %" G_GINT64_FORMAT " %s", error->code, ms_since (started), error->message);
  started = g_get_monotonic_time ();
  g_object_unref (mesh);
  cp_harness_report ("CLOSED %" G_GINT64_FORMAT, ms_since (started));
  /* The rank's own tensor survives the failure untouched. */
  return cp_tensor_equal (mine, before);
}
