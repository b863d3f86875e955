/* cp-cuda-private.h: what the library knows of the CUDA runtime
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * Only in builds with CP_HAS_CUDA.  The runtime is linked statically and
 * opens the driver on first use, so every call here works on machines
 * without a GPU or a driver and reports that as an error, never a crash.
 * No CUDA header here: the cpmesh tool includes this to report what the
 * library's own copy of the runtime sees (a second static copy in the
 * tool would probe a runtime of its own).
 */

#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct
{
  int runtime_version;   /* 1000 · major + 10 · minor: 13000 is 13.0 */
  int driver_version;    /* the newest CUDA the driver supports; 0: no driver */
  int device_count;      /* −1 when the runtime could not count them */
  int nccl_version;      /* 10000 · major + 100 · minor + patch; 0: no NCCL */
} CpCudaInfo;

/* The GPU libraries the library opens at run time by soname
 * (cp-gpu-libraries.c); nothing links them. */
typedef enum
{
  CP_GPU_LIBRARY_NCCL,
  CP_GPU_LIBRARY_CUDNN,
  CP_GPU_LIBRARY_NVRTC,
  CP_GPU_LIBRARY_N
} CpGpuLibrary;

/* Directories, separated by ':', searched for the GPU libraries instead
 * of the dynamic loader's path; relative entries are ignored. */
#define CP_GPU_LIBRARY_PATH_VARIABLE "CPMESH_GPU_LIBRARY_PATH"

typedef struct
{
  CpGpuLibrary library;
  gpointer handle;       /* from dlopen; NULL: not found */
  char *path;            /* the file loaded; NULL when not found */
  char *version;         /* "2.28.9"; NULL when not found */
  int version_code;      /* the library's own number; 0 when not found */
  char *reason;          /* why it was not found; NULL when found */
} CpGpuLibraryInfo;

/* "nccl", "cudnn", "nvrtc", and the sonames opened. */
__attribute__((visibility ("default")))
const char *_cp_gpu_library_name   (CpGpuLibrary library);
const char *_cp_gpu_library_soname (CpGpuLibrary library);

/* Opens @library from @search_path's directories alone (a
 * CPMESH_GPU_LIBRARY_PATH value) or, when NULL or empty, wherever the
 * dynamic loader finds its soname, and asks it for its version.  Fills
 * @info either way; TRUE when found.  Free with
 * _cp_gpu_library_info_clear(), which closes the handle. */
gboolean _cp_gpu_library_load       (CpGpuLibrary      library,
                                     const char       *search_path,
                                     CpGpuLibraryInfo *info);
void     _cp_gpu_library_info_clear (CpGpuLibraryInfo *info);

/* The process's copy of @library, opened on the first call: one some
 * other code loaded already, else as _cp_gpu_library_load() finds it with
 * CPMESH_GPU_LIBRARY_PATH as it is at that moment.  Never freed. */
__attribute__((visibility ("default")))
const CpGpuLibraryInfo *_cp_gpu_library_get (CpGpuLibrary library);

/* Fills @info; FALSE with %CP_MESH_ERROR_NO_DEVICE when the runtime
 * finds no usable device (the rest of @info is still filled). */
__attribute__((visibility ("default")))
gboolean _cp_cuda_probe (CpCudaInfo  *info,
                         GError     **error);

/* The number of CUDA devices, or −1 with %CP_MESH_ERROR_NO_DEVICE when
 * there are none or the runtime cannot reach them (no driver). */
int _cp_cuda_device_count (GError **error);

/* FALSE, with @error set to @domain/@code and a message naming @what and
 * CUDA's name and text for @status, unless @status is cudaSuccess.
 * Clears the runtime's last error. */
gboolean _cp_cuda_check (int          status,
                         GQuark       domain,
                         int          code,
                         const char  *what,
                         GError     **error);

/* Whether @status says the runtime is being unloaded (at process exit,
 * after its own atexit handler ran): every call fails so then, and
 * whatever was still to be freed goes with the process. */
gboolean _cp_cuda_status_is_unloading (int status);

G_END_DECLS
