/* test-cuda-runtime.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * The CUDA probe on whatever machine runs it.  Without a driver (the CPU
 * machines), the runtime still loads: the driver version is 0, there are
 * no devices, and the error is CP_MESH_ERROR_NO_DEVICE with CUDA's own
 * text for the status cudaGetDeviceCount returned.  With a GPU, the
 * probe finds it.
 */

#include "config.h"

#include <cuda_runtime_api.h>

#include <libcpmesh.h>

#include "kernels/cuda/cp-cuda-kernels-private.h"
#include "kernels/cuda/cp-cuda-private.h"
#include "cp-test-util.h"

#include <glib/gstdio.h>

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (CpGpuLibraryInfo, _cp_gpu_library_info_clear)

static gboolean
machine_has_driver (void)
{
  int version = 0;

  return cudaDriverGetVersion (&version) == cudaSuccess && version > 0;
}

static void
test_probe_without_driver (void)
{
  CpCudaInfo info;
  g_autoptr(GError) error = NULL;
  int count = 0;
  cudaError_t status;

  if (machine_has_driver ())
    {
      g_test_skip ("this machine has a CUDA driver");
      return;
    }
  status = cudaGetDeviceCount (&count);
  (void) cudaGetLastError ();

  g_assert_false (_cp_cuda_probe (&info, &error));
  g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_NO_DEVICE);
  g_assert_cmpint (info.driver_version, ==, 0);
  g_assert_cmpint (info.device_count, ==, -1);
  g_assert_cmpint (info.runtime_version, >=, 13000);
  g_assert_cmpint (status, !=, cudaSuccess);
  g_assert_nonnull (strstr (error->message, "no CUDA device: cudaGetDeviceCount"));
  g_assert_nonnull (strstr (error->message, cudaGetErrorString (status)));
  g_assert_nonnull (strstr (error->message, cudaGetErrorName (status)));
}

static void
test_probe_with_driver (void)
{
  CpCudaInfo info;
  g_autoptr(GError) error = NULL;

  if (!machine_has_driver ())
    {
      g_test_skip ("this machine has no CUDA driver");
      return;
    }
  if (!_cp_cuda_probe (&info, &error))
    {
      /* A driver without a device (or an unusable one) is still a clean
       * error. */
      g_assert_error (error, CP_MESH_ERROR, CP_MESH_ERROR_NO_DEVICE);
      g_assert_cmpint (info.device_count, ==, -1);
      return;
    }
  g_assert_no_error (error);
  g_assert_cmpint (info.device_count, >=, 1);
  g_assert_cmpint (info.driver_version, >=, 13000);
}

/* A failed status becomes the asked-for domain and code with CUDA's
 * name and text; success sets nothing. */
static void
test_check (void)
{
  g_autoptr(GError) error = NULL;

  g_assert_true (_cp_cuda_check (cudaSuccess, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "x", &error));
  g_assert_no_error (error);
  g_assert_false (_cp_cuda_check (cudaErrorMemoryAllocation, CP_TENSOR_ERROR,
                                  CP_TENSOR_ERROR_DEVICE, "cudaMallocAsync of 64 bytes", &error));
  g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
  g_assert_nonnull (strstr (error->message, "cudaMallocAsync of 64 bytes failed: "));
  g_assert_nonnull (strstr (error->message, cudaGetErrorString (cudaErrorMemoryAllocation)));
  g_assert_nonnull (strstr (error->message, "(cudaErrorMemoryAllocation)"));
}

/* The directory holding @library: the first of CPMESH_GPU_LIBRARY_PATH's
 * that has it where the variable is set (a GPU machine's copies live
 * inside PyTorch's wheel), else the toolkit this test was built against
 * (CP_TEST_CUDA_LIBDIR); NULL when neither has it, and the tests that
 * need it skip. */
static char *
directory_with (CpGpuLibrary library)
{
  const char *variable = g_getenv (CP_GPU_LIBRARY_PATH_VARIABLE);
  g_autofree char *search = g_strdup (variable != NULL && variable[0] != '\0' ? variable :
                                      CP_TEST_CUDA_LIBDIR);
  g_auto(GStrv) dirs = g_strsplit (search, ":", -1);

  for (char **dir = dirs; *dir != NULL; dir++)
    {
      g_autofree char *file = g_build_filename (*dir, _cp_gpu_library_soname (library), NULL);

      if (g_path_is_absolute (*dir) && g_file_test (file, G_FILE_TEST_EXISTS))
        return g_strdup (*dir);
    }
  return NULL;
}

/* The loader names a library by the path it was first opened by: where
 * an earlier probe of the same process opened it through a symbolic link
 * (the toolkit's lib64 is one), the same file has another name. */
static void
assert_same_file (const char *path,
                  const char *expected)
{
  GStatBuf got, want;

  g_assert_cmpint (g_stat (path, &got), ==, 0);
  g_assert_cmpint (g_stat (expected, &want), ==, 0);
  if (got.st_dev != want.st_dev || got.st_ino != want.st_ino)
    g_error ("loaded %s, which is not %s", path, expected);
}

/* Found through the override: the file in that directory, with the
 * library's own version. */
static void
test_load_from_override (gconstpointer data)
{
  CpGpuLibrary library = GPOINTER_TO_INT (data);
  g_auto(CpGpuLibraryInfo) info = { 0 };
  g_autofree char *dir = directory_with (library);
  g_autofree char *expected = NULL;
  g_autofree char *search = NULL;

  if (library == CP_GPU_LIBRARY_NCCL && !CP_HAS_NCCL)
    {
      g_test_skip ("this build leaves NCCL out");
      return;
    }
  if (dir == NULL)
    {
      g_autofree char *why = g_strdup_printf ("no %s in %s", _cp_gpu_library_soname (library),
                                              g_getenv (CP_GPU_LIBRARY_PATH_VARIABLE) != NULL ?
                                              CP_GPU_LIBRARY_PATH_VARIABLE "'s directories" :
                                              CP_TEST_CUDA_LIBDIR);

      g_test_skip (why);
      return;
    }
  expected = g_build_filename (dir, _cp_gpu_library_soname (library), NULL);
  search = g_strconcat ("relative/dir:/nonexistent:", dir, NULL);
  g_assert_true (_cp_gpu_library_load (library, search, &info));
  g_assert_nonnull (info.handle);
  assert_same_file (info.path, expected);
  g_assert_null (info.reason);
  g_assert_nonnull (info.version);
  switch (library)
    {
    case CP_GPU_LIBRARY_NCCL:
      /* 2.x.y: 20000 and up since NCCL 2.9. */
      g_assert_cmpint (info.version_code, >=, 20900);
      g_assert_cmpint (info.version_code, <, 30000);
      g_assert_true (g_str_has_prefix (info.version, "2."));
      break;
    case CP_GPU_LIBRARY_CUDNN:
      g_assert_cmpint (info.version_code, >=, 90000);
      g_assert_cmpint (info.version_code, <, 100000);
      g_assert_true (g_str_has_prefix (info.version, "9."));
      break;
    case CP_GPU_LIBRARY_NVRTC:
      /* The NVRTC of the CUDA this was built with. */
      g_assert_cmpint (info.version_code / 1000, ==, CUDART_VERSION / 1000);
      break;
    case CP_GPU_LIBRARY_N:
    default:
      g_assert_not_reached ();
    }
}

/* A directory without it: not found, and the reason names the soname,
 * the variable and the directories looked in. */
static void
test_load_from_empty_directory (void)
{
  g_autofree char *dir = g_dir_make_tmp ("cp-gpu-libs-XXXXXX", NULL);
  g_autofree char *search = g_strconcat ("lib:", dir, NULL);

  g_assert_nonnull (dir);
  for (CpGpuLibrary library = 0; library < CP_GPU_LIBRARY_N; library++)
    {
      g_auto(CpGpuLibraryInfo) info = { 0 };

      g_assert_false (_cp_gpu_library_load (library, search, &info));
      g_assert_null (info.handle);
      g_assert_null (info.path);
      g_assert_null (info.version);
      g_assert_cmpint (info.version_code, ==, 0);
      g_assert_nonnull (info.reason);
      if (library == CP_GPU_LIBRARY_NCCL && !CP_HAS_NCCL)
        continue;
      g_assert_nonnull (strstr (info.reason, _cp_gpu_library_soname (library)));
      g_assert_nonnull (strstr (info.reason, CP_GPU_LIBRARY_PATH_VARIABLE));
      g_assert_nonnull (strstr (info.reason, dir));
      g_assert_nonnull (strstr (info.reason, "lib (relative: ignored)"));
      cp_test_record_outcome ("CPMESH_GPU_LIBRARY_PATH without the library",
                              _cp_gpu_library_soname (library), "not found, reason reported",
                              info.reason);
    }
  g_rmdir (dir);
}

/* A file by the soname that is no library: its loader error, not a
 * crash, and the next directory is still tried for the message. */
static void
test_load_broken_file (void)
{
  g_autofree char *dir = g_dir_make_tmp ("cp-gpu-libs-XXXXXX", NULL);
  g_autofree char *file = g_build_filename (dir, _cp_gpu_library_soname (CP_GPU_LIBRARY_CUDNN), NULL);
  g_auto(CpGpuLibraryInfo) info = { 0 };

  g_assert_true (g_file_set_contents (file, "not an ELF file", -1, NULL));
  g_assert_false (_cp_gpu_library_load (CP_GPU_LIBRARY_CUDNN, dir, &info));
  g_assert_null (info.handle);
  g_assert_nonnull (strstr (info.reason, "libcudnn.so.9 from " CP_GPU_LIBRARY_PATH_VARIABLE ": "));
  g_assert_nonnull (strstr (info.reason, file));
  cp_test_record_outcome ("CPMESH_GPU_LIBRARY_PATH holding a broken file", "libcudnn.so.9",
                          "not found, loader's error reported", info.reason);
  g_unlink (file);
  g_rmdir (dir);
}

/* The process's copy follows the variable, read once: in a child
 * process, so that the variable is set before the first use. */
static void
test_process_copy_follows_variable (void)
{
  g_autofree char *dir = NULL;
  g_autofree char *expected = NULL;

  if (g_test_subprocess ())
    {
      CpCudaInfo info;
      const CpGpuLibraryInfo *nccl;

      g_setenv (CP_GPU_LIBRARY_PATH_VARIABLE, g_getenv ("CP_TEST_GPU_LIBRARY_PATH"), TRUE);
      (void) _cp_cuda_probe (&info, NULL);
      nccl = _cp_gpu_library_get (CP_GPU_LIBRARY_NCCL);
      g_assert_true (_cp_gpu_library_get (CP_GPU_LIBRARY_NCCL) == nccl);
      g_assert_cmpint (info.nccl_version, ==, nccl->version_code);
      g_print ("nccl=%s|%s\n", nccl->path != NULL ? nccl->path : "none",
               nccl->reason != NULL ? nccl->reason : "");
      return;
    }
  dir = directory_with (CP_GPU_LIBRARY_NCCL);
  if (!CP_HAS_NCCL || dir == NULL)
    {
      g_test_skip ("no NCCL where the test looks (" CP_GPU_LIBRARY_PATH_VARIABLE ", the toolkit)");
      return;
    }
  g_setenv ("CP_TEST_GPU_LIBRARY_PATH", dir, TRUE);
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
  expected = g_strdup_printf ("*nccl=%s/libnccl.so.2|\n*", dir);
  g_test_trap_assert_stdout (expected);

  g_setenv ("CP_TEST_GPU_LIBRARY_PATH", "/nonexistent", TRUE);
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
  g_test_trap_assert_stdout ("*nccl=none|libnccl.so.2 is in none of the directories "
                             CP_GPU_LIBRARY_PATH_VARIABLE " names (/nonexistent)\n*");
}

/* Position ids of runs that reach outside the documents are refused
 * before anything is launched (so this needs no device), never left
 * unwritten; a fill of a width no dtype has is refused as well. */
static void
test_launchers_refuse (void)
{
  const gint64 bounds[] = { 0, 8, 16 };
  const cp_index_run outside[] = { { 12, 8 } };
  const guint8 pattern[16] = { 0 };

  g_assert_cmpint (_cp_cuda_position_ids (NULL, 1, outside, 1, bounds, 2, true, NULL), ==,
                   cudaErrorInvalidValue);
  g_assert_cmpint (_cp_cuda_fill (NULL, 4, pattern, 3, NULL), ==, cudaErrorInvalidValue);
  g_assert_cmpint (_cp_cuda_fill (NULL, 0, pattern, 8, NULL), ==, cudaSuccess);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Cuda/probe/without-driver", test_probe_without_driver);
  g_test_add_func ("/Cp/Cuda/probe/with-driver", test_probe_with_driver);
  g_test_add_func ("/Cp/Cuda/check/error-text", test_check);
  g_test_add_data_func ("/Cp/Cuda/libraries/override/nccl", GINT_TO_POINTER (CP_GPU_LIBRARY_NCCL),
                        test_load_from_override);
  g_test_add_data_func ("/Cp/Cuda/libraries/override/cudnn", GINT_TO_POINTER (CP_GPU_LIBRARY_CUDNN),
                        test_load_from_override);
  g_test_add_data_func ("/Cp/Cuda/libraries/override/nvrtc", GINT_TO_POINTER (CP_GPU_LIBRARY_NVRTC),
                        test_load_from_override);
  g_test_add_func ("/Cp/Cuda/libraries/not-found/empty-directory", test_load_from_empty_directory);
  g_test_add_func ("/Cp/Cuda/libraries/not-found/broken-file", test_load_broken_file);
  cp_test_add_func_in_process ("/Cp/Cuda/libraries/process-copy/variable",
                               test_process_copy_follows_variable);
  g_test_add_func ("/Cp/Cuda/launchers/refuse", test_launchers_refuse);

  return g_test_run ();
}
