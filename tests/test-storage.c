/* test-storage.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include <gio/gunixfdlist.h>

#include "cp-test-util.h"

static void
test_owned (void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpStorage) storage = cp_storage_new (100, &error);
  const guint8 *data;

  g_assert_no_error (error);
  g_assert_cmpint (cp_storage_get_kind (storage), ==, CP_STORAGE_KIND_OWNED);
  g_assert_cmpint (cp_storage_get_device (storage), ==, CP_DEVICE_KIND_HOST);
  g_assert_cmpuint (cp_storage_get_size (storage), ==, 100);
  g_assert_cmpuint (cp_storage_get_data_address (storage) % 64, ==, 0);
  g_assert_cmpint (cp_storage_get_fd (storage), ==, -1);
  data = cp_storage_get_data (storage);
  for (int i = 0; i < 100; i++)
    g_assert_cmpuint (data[i], ==, 0);
}

static void
test_shared_between_tensors (void)
{
  g_autoptr(CpStorage) storage = cp_storage_new (32, NULL);
  const gint64 four[] = { 4 };
  const gint64 two_by_two[] = { 2, 2 };
  g_autoptr(CpTensor) a = cp_tensor_new_from_storage (CP_DTYPE_INT64, four, 1, storage, 0, NULL);
  g_autoptr(CpTensor) b = cp_tensor_new_from_storage (CP_DTYPE_INT32, two_by_two, 2, storage, 16, NULL);

  cp_tensor_set_value (a, 2, 0x0000000700000005);
  CP_TEST_ASSERT_VALUES (b, 5, 7, 0, 0);
}

static void
test_borrowed_without_release (void)
{
  static guint8 memory[8];
  CpStorage *storage = cp_storage_new_borrowed ((guintptr) memory, sizeof memory, NULL, NULL, NULL);

  g_assert_cmpint (cp_storage_get_kind (storage), ==, CP_STORAGE_KIND_BORROWED);
  g_assert_true (cp_storage_get_data (storage) == memory);
  g_assert_true (cp_storage_ref (storage) == storage);
  cp_storage_unref (storage);
  cp_storage_unref (storage);
}

/* The owner lives exactly as long as some tensor uses the memory: the
 * storage holds one reference on it and drops it with the last view. */
static void
test_owner (void)
{
  static gint32 memory[6] = { 1, 2, 3, 4, 5, 6 };
  const gint64 shape[] = { 2, 3 };
  GObject *owner = g_object_new (G_TYPE_OBJECT, NULL);
  CpStorage *storage = cp_storage_new_with_owner ((guintptr) memory, sizeof memory, owner);
  g_autoptr(CpTensor) tensor = cp_tensor_new_from_storage (CP_DTYPE_INT32, shape, 2, storage, 0, NULL);
  g_autoptr(CpTensor) row = cp_tensor_narrow (tensor, 0, 1, 1, NULL);

  g_object_add_weak_pointer (owner, (gpointer *) &owner);
  cp_storage_unref (storage);
  g_object_unref (owner);
  g_assert_nonnull (owner);
  g_assert_cmpint (cp_storage_get_kind (cp_tensor_get_storage (tensor)), ==, CP_STORAGE_KIND_BORROWED);
  g_assert_true (cp_tensor_get_data (tensor) == memory);
  CP_TEST_ASSERT_VALUES (row, 4, 5, 6);
  g_clear_object (&tensor);
  g_assert_nonnull (owner);
  g_clear_object (&row);
  g_assert_null (owner);
}

/* Starts cp-test-fd-child with a duplicate of @fd as its descriptor 3 and
 * returns the first line it prints; the child then waits until its stdin
 * is closed (close_child). */
static GSubprocess *
spawn_fd_child (int          fd,
                gint64       n,
                const char  *mode,
                char       **line)
{
  g_autoptr(GSubprocessLauncher) launcher =
    g_subprocess_launcher_new (G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE);
  g_autoptr(GDataInputStream) out = NULL;
  g_autofree char *child_path = g_test_build_filename (G_TEST_BUILT, "cp-test-fd-child", NULL);
  g_autofree char *n_arg = g_strdup_printf ("%" G_GINT64_FORMAT, n);
  g_autoptr(GError) error = NULL;
  GSubprocess *child;

  g_subprocess_launcher_take_fd (launcher, dup (fd), 3);
  child = g_subprocess_launcher_spawn (launcher, &error, child_path, "3", n_arg, mode, NULL);
  g_assert_no_error (error);
  out = g_data_input_stream_new (g_subprocess_get_stdout_pipe (child));
  *line = g_data_input_stream_read_line (out, NULL, NULL, &error);
  g_assert_no_error (error);
  return child;
}

static void
close_child (GSubprocess *child)
{
  g_autoptr(GError) error = NULL;

  g_output_stream_close (g_subprocess_get_stdin_pipe (child), NULL, NULL);
  g_subprocess_wait_check (child, NULL, &error);
  g_assert_no_error (error);
}

static void
test_memfd_shared_with_child (void)
{
  const gint64 n = 4096;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) shared = cp_tensor_new_shared (CP_DTYPE_INT32, &n, 1, &error);
  g_autoptr(GSubprocess) child = NULL;
  g_autofree char *line = NULL;
  gint32 *data;

  g_assert_no_error (error);
  g_assert_cmpint (cp_storage_get_kind (cp_tensor_get_storage (shared)), ==, CP_STORAGE_KIND_FD);
  g_assert_cmpint (cp_tensor_get_fd (shared), >=, 0);
  data = cp_tensor_get_data (shared);
  data[0] = 1234;

  child = spawn_fd_child (cp_tensor_get_fd (shared), n, NULL, &line);
  g_assert_cmpstr (line, ==, "written");

  /* The child is still alive, holding its mapping: its writes are ours. */
  for (gint64 i = 0; i < n; i++)
    g_assert_cmpint (data[i], ==, (gint32) (i * 3 + 1));
  close_child (child);
}

/* Another holder of a shared tensor's descriptor cannot shrink the file
 * under our mapping (which would kill this process with SIGBUS at the
 * next read), nor grow it, nor add seals of its own. */
static void
test_memfd_sealed (void)
{
  const gint64 n = 4096;
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) shared = cp_tensor_new_shared (CP_DTYPE_INT32, &n, 1, &error);
  g_autoptr(GSubprocess) child = NULL;
  g_autofree char *line = NULL;
  int fd = cp_tensor_get_fd (shared);
  gint32 *data = cp_tensor_get_data (shared);

  g_assert_no_error (error);
  for (gint64 i = 0; i < n; i++)
    data[i] = (gint32) (7 * i);
  child = spawn_fd_child (fd, n, "truncate", &line);
  /* Had the child shrunk the file, this read would end the test. */
  for (gint64 i = 0; i < n; i++)
    g_assert_cmpint (data[i], ==, (gint32) (7 * i));
  g_assert_cmpstr (line, ==, "refused: EPERM");
  g_assert_cmpint (ftruncate (fd, 16), ==, -1);
  g_assert_cmpint (errno, ==, EPERM);
  g_assert_cmpint (ftruncate (fd, 1 << 20), ==, -1);
  g_assert_cmpint (fcntl (fd, F_ADD_SEALS, F_SEAL_WRITE), ==, -1);
  g_assert_cmpint (fcntl (fd, F_GET_SEALS), ==, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  close_child (child);
}

/* Descriptors whose file could shrink under the mapping are refused with
 * CP_TENSOR_ERROR_UNSEALED; sealing a memfd against shrinking makes it
 * acceptable. */
static void
assert_unsealed (int         fd,
                 const char *needle,
                 const char *what)
{
  const gint64 n = 4;
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_new_from_fd (CP_DTYPE_INT32, &n, 1, fd, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_UNSEALED, "CpStorage", what);
  if (strstr (error->message, needle) == NULL)
    g_error ("\"%s\" does not contain \"%s\"", error->message, needle);
}

static void
test_from_fd_refuses_unsealed (void)
{
  const gint64 n = 4;
  int plain = memfd_create ("plain", MFD_CLOEXEC);
  int sealable = memfd_create ("sealable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int pipe_fds[2];
  g_autofree char *path = NULL;
  int file = g_file_open_tmp ("cp-test-storage-XXXXXX", &path, NULL);
  g_autoptr(CpTensor) mapped = NULL;
  g_autoptr(GError) error = NULL;
  gint32 value = 0;

  g_assert_cmpint (ftruncate (plain, 16), ==, 0);
  g_assert_cmpint (ftruncate (sealable, 16), ==, 0);
  g_assert_cmpint (ftruncate (file, 16), ==, 0);
  g_assert_cmpint (pipe (pipe_fds), ==, 0);
  assert_unsealed (plain, "no F_SEAL_SHRINK seal",
                   "cp_tensor_new_from_fd of a memfd that does not allow sealing");
  assert_unsealed (sealable, "no F_SEAL_SHRINK seal",
                   "cp_tensor_new_from_fd of a memfd not sealed against shrinking");
  assert_unsealed (file, "not a memfd, so it cannot be sealed",
                   "cp_tensor_new_from_fd of a regular file");
  assert_unsealed (pipe_fds[0], "neither a memfd nor a dma-buf",
                   "cp_tensor_new_from_fd of a pipe");

  g_assert_cmpint (fcntl (sealable, F_ADD_SEALS, F_SEAL_SHRINK), ==, 0);
  mapped = cp_tensor_new_from_fd (CP_DTYPE_INT32, &n, 1, sealable, 0, &error);
  g_assert_no_error (error);
  cp_tensor_set_value (mapped, 3, 42);
  g_assert_cmpint (pread (sealable, &value, sizeof value, 12), ==, sizeof value);
  g_assert_cmpint (value, ==, 42);

  g_unlink (path);
  for (int i = 0; i < 2; i++)
    close (pipe_fds[i]);
  close (file);
  close (sealable);
  close (plain);
}

static void
test_from_fd_checks_range (void)
{
  const gint64 n = 16;
  const gint64 too_many = 32;
  g_autoptr(CpTensor) shared = cp_tensor_new_shared (CP_DTYPE_FLOAT32, &n, 1, NULL);
  g_autoptr(CpTensor) again = NULL;
  g_autoptr(GError) error = NULL;
  int fd = cp_tensor_get_fd (shared);

  again = cp_tensor_new_from_fd (CP_DTYPE_FLOAT32, &n, 1, fd, 0, &error);
  g_assert_no_error (error);
  cp_tensor_set_value (shared, 5, 2.5);
  g_assert_cmpfloat (cp_tensor_get_value (again, 5), ==, 2.5);
  g_assert_cmpint (cp_tensor_get_fd (again), !=, fd); /* duplicated, not taken */

  g_assert_null (cp_tensor_new_from_fd (CP_DTYPE_FLOAT32, &too_many, 1, fd, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpStorage",
                       "cp_tensor_new_from_fd asking for more bytes than the file holds");
  g_assert_nonnull (strstr (error->message, "holds 64 bytes, but 128 bytes"));
  g_clear_error (&error);
  /* offset + size wraps around: the range is still out of the file. */
  g_assert_null (cp_storage_new_from_fd (fd, 8, G_MAXSIZE - 4, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE, "CpStorage",
                       "cp_storage_new_from_fd with an offset + size that wraps around");
  g_clear_error (&error);
  g_assert_null (cp_tensor_new_from_fd (CP_DTYPE_FLOAT32, &n, 1, fd, 2, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_MISALIGNED, "CpStorage",
                       "cp_tensor_new_from_fd at an offset not aligned to the element size");
}

static void
test_from_fd_offset (void)
{
  const gint64 n = 2048;
  const gint64 tail = 1000;
  g_autoptr(CpTensor) shared = cp_tensor_new_shared (CP_DTYPE_INT32, &n, 1, NULL);
  g_autoptr(CpTensor) view = NULL;
  g_autoptr(GError) error = NULL;

  for (gint64 i = 0; i < n; i++)
    cp_tensor_set_value (shared, i, (double) i);
  /* 4100 bytes: not a page multiple, so the mapping has to round down. */
  view = cp_tensor_new_from_fd (CP_DTYPE_INT32, &tail, 1, cp_tensor_get_fd (shared), 4100, &error);
  g_assert_no_error (error);
  g_assert_cmpfloat (cp_tensor_get_value (view, 0), ==, 1025);
  g_assert_cmpfloat (cp_tensor_get_value (view, tail - 1), ==, 2024);
}

/* Descriptors that cannot be mapped at all are CP_TENSOR_ERROR_BAD_FD,
 * each saying what is wrong with the descriptor rather than with the
 * file: not one (-1, a closed one), an O_PATH handle to a good sealed
 * memfd, a read-only descriptor of one. */
static void
assert_bad_fd (int         fd,
               const char *needle,
               const char *what)
{
  const gint64 n = 4;
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_tensor_new_from_fd (CP_DTYPE_INT32, &n, 1, fd, 0, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_BAD_FD, "CpStorage", what);
  if (strstr (error->message, needle) == NULL)
    g_error ("\"%s\" does not contain \"%s\"", error->message, needle);
}

static void
test_from_fd_refuses_bad_descriptors (void)
{
  const gint64 n = 4;
  g_autoptr(CpTensor) shared = cp_tensor_new_shared (CP_DTYPE_INT32, &n, 1, NULL);
  g_autofree char *proc = g_strdup_printf ("/proc/self/fd/%d", cp_tensor_get_fd (shared));
  int path_only = open (proc, O_PATH | O_CLOEXEC);
  int read_only = open (proc, O_RDONLY | O_CLOEXEC);
  int closed = dup (cp_tensor_get_fd (shared));
  g_autoptr(CpStorage) storage = NULL;
  g_autoptr(GError) error = NULL;

  g_assert_cmpint (path_only, >=, 0);
  g_assert_cmpint (read_only, >=, 0);
  g_assert_cmpint (closed, >=, 0);
  close (closed);
  assert_bad_fd (-1, "fd -1 is not a file descriptor", "cp_tensor_new_from_fd of fd -1");
  assert_bad_fd (closed, "Bad file descriptor", "cp_tensor_new_from_fd of a closed fd");
  assert_bad_fd (path_only, "was opened with O_PATH",
                 "cp_tensor_new_from_fd of an O_PATH descriptor of a sealed memfd");
  assert_bad_fd (read_only, "was opened read-only (O_RDONLY)",
                 "cp_tensor_new_from_fd of a read-only descriptor of a sealed memfd");
  g_assert_null (cp_storage_new_from_fd (-1, 0, 16, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_BAD_FD, "CpStorage",
                       "cp_storage_new_from_fd of fd -1");
  g_clear_error (&error);

  /* The memfd itself, through a descriptor opened for both, maps. */
  close (read_only);
  read_only = open (proc, O_RDWR | O_CLOEXEC);
  storage = cp_storage_new_from_fd (read_only, 0, 16, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (cp_storage_get_size (storage), ==, 16);
  close (read_only);
  close (path_only);
}

/* A GBytes storage is read-only; every other kind may be written. */
static void
test_read_only_kinds (void)
{
  static const guint8 values[16];
  g_autoptr(GBytes) bytes = g_bytes_new_static (values, sizeof values);
  g_autoptr(CpStorage) from_bytes = cp_storage_new_from_bytes (bytes);
  g_autoptr(CpStorage) owned = cp_storage_new (16, NULL);
  g_autoptr(CpStorage) shared = cp_storage_new_shared (16, NULL);
  g_autoptr(CpStorage) borrowed = cp_storage_new_borrowed ((guintptr) values, sizeof values,
                                                           NULL, NULL, NULL);

  g_assert_true (cp_storage_get_read_only (from_bytes));
  g_assert_false (cp_storage_get_read_only (owned));
  g_assert_false (cp_storage_get_read_only (shared));
  g_assert_false (cp_storage_get_read_only (borrowed));
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Storage/owned/aligned-zeroed", test_owned);
  g_test_add_func ("/Cp/Storage/views/shared", test_shared_between_tensors);
  g_test_add_func ("/Cp/Storage/borrowed/no-release", test_borrowed_without_release);
  g_test_add_func ("/Cp/Storage/borrowed/owner", test_owner);
  g_test_add_func ("/Cp/Storage/fd/child-process", test_memfd_shared_with_child);
  g_test_add_func ("/Cp/Storage/fd/sealed", test_memfd_sealed);
  g_test_add_func ("/Cp/Storage/fd/unsealed", test_from_fd_refuses_unsealed);
  g_test_add_func ("/Cp/Storage/fd/range", test_from_fd_checks_range);
  g_test_add_func ("/Cp/Storage/fd/offset", test_from_fd_offset);
  g_test_add_func ("/Cp/Storage/fd/bad-descriptors", test_from_fd_refuses_bad_descriptors);
  g_test_add_func ("/Cp/Storage/bytes/read-only", test_read_only_kinds);

  return g_test_run ();
}
