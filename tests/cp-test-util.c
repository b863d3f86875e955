/* cp-test-util.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "cp-test-util.h"

guint
cp_test_time_factor (void)
{
  const char *factor = g_getenv ("CP_TEST_TIME_FACTOR");

  return factor != NULL ? MAX ((guint) g_ascii_strtoull (factor, NULL, 10), 1) : 1;
}

void
cp_test_run_ranks_within (GList          *meshes,
                          CpTestRankFunc  func,
                          gpointer        user_data,
                          guint           limit_ms)
{
  guint n = g_list_length (meshes);
  g_autofree gpointer *rank_data = g_new (gpointer, n);
  g_autoptr(GError) error = NULL;

  for (guint i = 0; i < n; i++)
    rank_data[i] = user_data;
  /* Ranks that hang cannot be stopped, so the process aborts. */
  if (!cp_harness_run_threads (meshes, func, rank_data, limit_ms * cp_test_time_factor (), &error))
    g_error ("%s", error->message);
}

void
cp_test_enter_ok (CpContext *context)
{
  g_autoptr(GError) error = NULL;

  gboolean entered = cp_context_enter (context, &error);

  g_assert_no_error (error);
  g_assert_true (entered);
}

void
cp_test_exit_ok (CpContext *context)
{
  g_autoptr(GError) error = NULL;

  gboolean exited = cp_context_exit (context, &error);

  g_assert_no_error (error);
  g_assert_true (exited);
}

void
cp_test_run_ranks (GList          *meshes,
                   CpTestRankFunc  func,
                   gpointer        user_data)
{
  cp_test_run_ranks_within (meshes, func, user_data, 0);
}

GList *
cp_test_local_group (const char *dim_name,
                     int         size)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_harness_local_group (dim_name, size, 0, &error);

  g_assert_no_error (error);
  g_assert_cmpuint (g_list_length (meshes), ==, (guint) size);
  return meshes;
}

void
cp_test_free_group (GList *meshes)
{
  g_list_free_full (meshes, g_object_unref);
}

CpTensor *
cp_test_tensor_pattern (CpDType       dtype,
                        const gint64 *shape,
                        guint         n_dims,
                        guint         seed)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (dtype, shape, n_dims, &error);
  gint64 numel;

  g_assert_no_error (error);
  numel = cp_tensor_get_numel (tensor);
  for (gint64 i = 0; i < numel; i++)
    {
      /* Values up to 200 are exact in every dtype, uint8 and float16
       * included. */
      double value = (double) ((i * 7 + seed * 13) % 201);

      cp_tensor_set_value (tensor, i, dtype == CP_DTYPE_BOOL ? (double) ((i + seed) % 2) : value);
    }
  return cp_test_on_device (tensor);
}

void
cp_test_assert_values (CpTensor     *tensor,
                       const double *values,
                       gsize         n_values)
{
  g_assert_cmpint (cp_tensor_get_numel (tensor), ==, (gint64) n_values);
  for (gsize i = 0; i < n_values; i++)
    g_assert_cmpfloat (cp_tensor_get_value (tensor, (gint64) i), ==, values[i]);
}

CpTensor *
cp_test_tensor_new_values (CpDType       dtype,
                           const gint64 *shape,
                           guint         n_dims,
                           const double *values)
{
  g_autoptr(GError) error = NULL;
  CpTensor *tensor = cp_tensor_new (dtype, shape, n_dims, &error);

  g_assert_no_error (error);
  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    cp_tensor_set_value (tensor, i, values[i]);
  return cp_test_on_device (tensor);
}

CpDeviceKind
cp_test_get_device (void)
{
  return g_strcmp0 (g_getenv ("CP_TEST_DEVICE"), "test") == 0 ? CP_DEVICE_KIND_TEST
                                                             : CP_DEVICE_KIND_HOST;
}

void
cp_test_assert_message (const GError *error,
                        const char   *needle)
{
  g_auto(GStrv) parts = g_strsplit (needle, " on host", -1);
  const char *device = cp_test_get_device () == CP_DEVICE_KIND_TEST ? "test" : "host";
  g_autofree char *device_text = g_strdup_printf (" on %s", device);
  g_autofree char *expected = g_strjoinv (device_text, parts);

  g_assert_nonnull (error);
  if (strstr (error->message, expected) == NULL)
    g_error ("\"%s\" does not contain \"%s\"", error->message, expected);
}

CpTensor *
cp_test_on_device (CpTensor *tensor)
{
  g_autoptr(CpTensor) taken = tensor;
  g_autoptr(GError) error = NULL;
  CpTensor *moved = cp_tensor_to_device (taken, cp_test_get_device (), &error);

  g_assert_no_error (error);
  return moved;
}

void
cp_test_run_group_within (const char     *dim_name,
                          int             size,
                          CpTestRankFunc  func,
                          gpointer        user_data,
                          guint           limit_ms)
{
  GList *meshes = cp_test_local_group (dim_name, size);

  cp_test_run_ranks_within (meshes, func, user_data, limit_ms);
  cp_test_free_group (meshes);
}

void
cp_test_run_group (const char     *dim_name,
                   int             size,
                   CpTestRankFunc  func,
                   gpointer        user_data)
{
  cp_test_run_group_within (dim_name, size, func, user_data, 0);
}

void
cp_test_assert_shape (CpTensor     *tensor,
                      const gint64 *shape,
                      guint         n_dims)
{
  guint actual;
  const gint64 *have = cp_tensor_get_shape (tensor, &actual);

  g_assert_cmpuint (actual, ==, n_dims);
  g_assert_cmpmem (have, actual * sizeof (gint64), shape, n_dims * sizeof (gint64));
}

void
cp_test_run_mesh (const char * const *dim_names,
                  const int          *dim_sizes,
                  gsize               n_dims,
                  CpTestRankFunc      func,
                  gpointer            user_data)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (dim_names, dim_sizes, n_dims, &error);

  g_assert_no_error (error);
  cp_test_run_ranks (meshes, func, user_data);
  cp_test_free_group (meshes);
}

void
cp_test_batch_take (CpBatch    *batch,
                    const char *key,
                    CpTensor   *tensor)
{
  cp_batch_set (batch, key, tensor);
  g_object_unref (tensor);
}

CpTestSnapshot *
cp_test_snapshot_new (const char *key,
                      CpTensor   *tensor)
{
  CpTestSnapshot *snapshot = g_new0 (CpTestSnapshot, 1);

  snapshot->key = g_strdup (key);
  snapshot->tensor = g_object_ref (tensor);
  snapshot->storage = cp_tensor_get_storage (tensor);
  snapshot->copy = cp_tensor_copy (tensor, NULL);
  return snapshot;
}

void
cp_test_snapshot_free (CpTestSnapshot *snapshot)
{
  g_free (snapshot->key);
  g_object_unref (snapshot->tensor);
  g_object_unref (snapshot->copy);
  g_free (snapshot);
}

void
cp_test_snapshot_assert_unchanged (const CpTestSnapshot *snapshot)
{
  g_assert_true (cp_tensor_get_storage (snapshot->tensor) == snapshot->storage);
  g_assert_true (cp_tensor_equal (snapshot->tensor, snapshot->copy));
}

CpTestSnapshot *
cp_test_snapshot_find (GPtrArray  *snapshots,
                       const char *key)
{
  for (guint i = 0; i < snapshots->len; i++)
    {
      CpTestSnapshot *snapshot = g_ptr_array_index (snapshots, i);

      if (g_str_equal (snapshot->key, key))
        return snapshot;
    }
  return NULL;
}

GPtrArray *
cp_test_snapshot_batch (CpBatch *batch)
{
  GPtrArray *snapshots = g_ptr_array_new_with_free_func ((GDestroyNotify) cp_test_snapshot_free);
  const char * const *keys = cp_batch_get_keys (batch);

  for (guint i = 0; keys[i] != NULL; i++)
    g_ptr_array_add (snapshots, cp_test_snapshot_new (keys[i], cp_batch_get (batch, keys[i])));
  return snapshots;
}

void
cp_test_assert_batch_unchanged (CpBatch   *batch,
                                GPtrArray *snapshots)
{
  g_assert_cmpuint (cp_batch_get_n_keys (batch), ==, snapshots->len);
  for (guint i = 0; i < snapshots->len; i++)
    {
      CpTestSnapshot *snapshot = g_ptr_array_index (snapshots, i);

      g_assert_cmpstr (cp_batch_get_keys (batch)[i], ==, snapshot->key);
      g_assert_true (cp_batch_get (batch, snapshot->key) == snapshot->tensor);
      cp_test_snapshot_assert_unchanged (snapshot);
    }
}

gsize
cp_test_resident_kib (void)
{
  g_autofree char *statm = NULL;
  g_auto(GStrv) fields = NULL;

  g_assert_true (g_file_get_contents ("/proc/self/statm", &statm, NULL, NULL));
  fields = g_strsplit (statm, " ", -1);
  g_assert_cmpuint (g_strv_length (fields), >=, 2);
  return (gsize) g_ascii_strtoull (fields[1], NULL, 10) * (gsize) sysconf (_SC_PAGESIZE) / 1024;
}

gsize
cp_test_open_fds (void)
{
  g_autoptr(GDir) dir = g_dir_open ("/proc/self/fd", 0, NULL);
  gsize n = 0;

  g_assert_nonnull (dir);
  while (g_dir_read_name (dir) != NULL)
    n++;
  return n - 1; /* the directory's own descriptor */
}

/* Reliability records ------------------------------------------------ */

static void
append_json_string (GString    *out,
                    const char *text)
{
  g_string_append_c (out, '"');
  for (const char *p = text; *p != '\0'; p++)
    {
      if (*p == '"' || *p == '\\')
        g_string_append_printf (out, "\\%c", *p);
      else if ((guchar) *p < 0x20)
        g_string_append_printf (out, "\\u%04x", (guchar) *p);
      else
        g_string_append_c (out, *p);
    }
  g_string_append_c (out, '"');
}

static void
append_json_field (GString    *out,
                   const char *key,
                   const char *value)
{
  g_string_append (out, out->len > 1 ? ", " : "");
  append_json_string (out, key);
  g_string_append (out, ": ");
  append_json_string (out, value);
}

/* "CP_TENSOR_ERROR_SHAPE" for the library's domains, whose codes are
 * registered enums; "domain-quark 3" for any other. */
static char *
describe_error_code (const GError *error)
{
  const struct { GQuark domain; GType type; } domains[] = {
    { CP_TENSOR_ERROR, CP_TYPE_TENSOR_ERROR },
    { CP_MESH_ERROR, CP_TYPE_MESH_ERROR },
    { CP_BATCH_ERROR, CP_TYPE_BATCH_ERROR },
    { CP_ATTENTION_ERROR, CP_TYPE_ATTENTION_ERROR },
  };

  for (guint i = 0; i < G_N_ELEMENTS (domains); i++)
    {
      g_autoptr(GEnumClass) klass = NULL;
      GEnumValue *value;

      if (error->domain != domains[i].domain)
        continue;
      klass = g_type_class_ref (domains[i].type);
      value = g_enum_get_value (klass, error->code);
      if (value != NULL)
        return g_strdup (value->value_name);
    }
  return g_strdup_printf ("%s %d", g_quark_to_string (error->domain), error->code);
}

/* One write(2) per line on an O_APPEND descriptor: lines from rank
 * threads never interleave.  The first record of a test process empties
 * the file, so it holds one run's records; a GTest subprocess, or a
 * process started with CP_RELIABILITY_APPEND=1 in its environment (a rank
 * of a multi-process test), appends to its parent's. */
static void
append_record_line (const char *line)
{
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static gboolean started;
  const char *path = g_getenv ("CP_RELIABILITY_LOG");
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC;
  int fd;

  if (path == NULL || *path == '\0')
    return;
  pthread_mutex_lock (&lock);
  if (!started)
    {
      g_autofree char *dir = g_path_get_dirname (path);

      g_assert_cmpint (g_mkdir_with_parents (dir, 0755), ==, 0);
      if (!g_test_subprocess () && g_getenv ("CP_RELIABILITY_APPEND") == NULL)
        flags |= O_TRUNC;
      started = TRUE;
    }
  fd = open (path, flags, 0644);
  g_assert_cmpint (fd, >=, 0);
  g_assert_cmpint (write (fd, line, strlen (line)), ==, (gssize) strlen (line));
  close (fd);
  pthread_mutex_unlock (&lock);
}

static void
record (const char *subject,
        const char *what,
        const char *outcome,
        const char *message)
{
  g_autoptr(GString) line = g_string_new ("{");
  const char *test = g_test_get_path ();

  g_assert_cmpstr (message, !=, "");
  append_json_field (line, "subject", subject);
  append_json_field (line, "case", what);
  append_json_field (line, "error", outcome);
  append_json_field (line, "message", message);
  append_json_field (line, "test", test != NULL ? test : g_get_prgname ());
  g_string_append (line, "}\n");
  append_record_line (line->str);
}

void
cp_test_record_error (const char   *subject,
                      const char   *what,
                      const GError *error)
{
  g_autofree char *code = NULL;

  g_assert_nonnull (error);
  code = describe_error_code (error);
  record (subject, what, code, error->message);
}

void
cp_test_record_outcome (const char *subject,
                        const char *what,
                        const char *outcome,
                        const char *message)
{
  record (subject, what, outcome, message);
}

/* ---- one process per subtest ---- */

#undef g_test_add_func
#undef g_test_add_data_func
#undef g_test_add_data_func_full
#undef g_test_skip

typedef struct
{
  GTestFunc func;
  GTestDataFunc data_func;
  gconstpointer data;
} Subtest;

/* Every registered subtest, reachable until exit: a child process runs
 * one of them, so GLib frees none of the others' data. */
static GPtrArray *subtests;

static Subtest *
subtest_new (void)
{
  if (subtests == NULL)
    subtests = g_ptr_array_new_with_free_func (g_free);
  g_ptr_array_add (subtests, g_new0 (Subtest, 1));
  return g_ptr_array_index (subtests, subtests->len - 1);
}

/* The child writes its skip message here; the parent names the file. */
#define SKIP_FILE_VARIABLE "CP_TEST_SKIP_FILE"

static gboolean
run_in_process (void)
{
  return g_test_subprocess () || g_strcmp0 (g_getenv ("CP_TEST_IN_PROCESS"), "1") == 0;
}

static void
run_subtest (const Subtest *subtest)
{
  if (subtest->func != NULL)
    subtest->func ();
  else
    subtest->data_func (subtest->data);
}

/* The parent's records are the children's: it starts the file afresh. */
static void
start_reliability_log_once (void)
{
  static gboolean started;
  const char *path = g_getenv ("CP_RELIABILITY_LOG");
  g_autofree char *dir = NULL;

  if (started || path == NULL || *path == '\0' || g_test_subprocess ()
      || g_getenv ("CP_RELIABILITY_APPEND") != NULL)
    return;
  started = TRUE;
  dir = g_path_get_dirname (path);
  g_assert_cmpint (g_mkdir_with_parents (dir, 0755), ==, 0);
  g_assert_true (g_file_set_contents (path, "", 0, NULL));
  g_setenv ("CP_RELIABILITY_APPEND", "1", TRUE);
}

static char *
take_skip_message (const char *skip_file)
{
  char *message = NULL;

  if (!g_file_get_contents (skip_file, &message, NULL, NULL))
    return NULL;
  g_unlink (skip_file);
  return message;
}

static void
run_isolated (gconstpointer data)
{
  g_autofree char *skip_file = NULL;
  g_autofree char *skipped = NULL;
  int fd;

  if (run_in_process ())
    {
      run_subtest (data);
      return;
    }
  fd = g_file_open_tmp ("cp-test-skip-XXXXXX", &skip_file, NULL);
  g_assert_cmpint (fd, >=, 0);
  close (fd);
  g_unlink (skip_file);
  g_setenv (SKIP_FILE_VARIABLE, skip_file, TRUE);
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_INHERIT_STDERR);
  g_unsetenv (SKIP_FILE_VARIABLE);
  skipped = take_skip_message (skip_file);
  /* A child whose only subtest skipped exits with 77. */
  if (skipped != NULL)
    g_test_skip (skipped);
  else if (!g_test_trap_has_passed ())
    g_test_fail_printf ("the subtest's process failed (see its output above)");
}

void
cp_test_add_func_isolated (const char *path,
                           GTestFunc   func)
{
  Subtest *subtest = subtest_new ();

  start_reliability_log_once ();
  subtest->func = func;
  g_test_add_data_func (path, subtest, run_isolated);
}

void
cp_test_add_data_func_isolated (const char    *path,
                                gconstpointer  data,
                                GTestDataFunc  func)
{
  Subtest *subtest = subtest_new ();

  start_reliability_log_once ();
  subtest->data_func = func;
  subtest->data = data;
  g_test_add_data_func (path, subtest, run_isolated);
}

void
cp_test_add_data_func_full_isolated (const char     *path,
                                     gpointer        data,
                                     GTestDataFunc   func,
                                     GDestroyNotify  destroy)
{
  cp_test_add_data_func_isolated (path, data, func);
}

void
cp_test_add_func_in_process (const char *path,
                             GTestFunc   func)
{
  start_reliability_log_once ();
  g_test_add_func (path, func);
}

void
cp_test_skip (const char *message)
{
  const char *skip_file = g_getenv (SKIP_FILE_VARIABLE);

  if (g_test_subprocess () && skip_file != NULL)
    g_assert_true (g_file_set_contents (skip_file, message, -1, NULL));
  g_test_skip (message);
}
