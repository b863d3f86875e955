/* cp-gpu-libraries.c: NCCL, cuDNN and NVRTC, opened at run time
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * Nothing links these libraries: where they live differs from machine to
 * machine (the CUDA toolkit's lib64, a distribution's libdir, PyTorch's
 * wheel under site-packages/nvidia/), and NCCL alone is over 200 MB.  A
 * link-time dependency would make the library and every program on it
 * fail to load wherever the linker's copy is not on the loader's path.
 * Instead each is opened by its soname when first asked for, from the
 * directories CPMESH_GPU_LIBRARY_PATH names or else wherever the dynamic
 * loader finds it, and what was found (or why nothing was) is kept for
 * `cpmesh info` and for the code that calls into it.
 */

#include "config.h"

#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_runtime_api.h>

#include "cp-features.h"
#include "cp-cuda-private.h"

/* NVRTC's soname carries the major version of the CUDA it belongs to:
 * that of the runtime linked in. */
#if CUDART_VERSION >= 14000
#error "add the NVRTC soname of this CUDA version"
#elif CUDART_VERSION >= 13000
#define NVRTC_SONAME "libnvrtc.so.13"
#else
#define NVRTC_SONAME "libnvrtc.so.12"
#endif

typedef gboolean (*VersionReader) (gpointer    handle,
                                   int        *code,
                                   char      **text);

/* The version calls, declared here rather than through each library's
 * header: only their signatures matter, and the build needs none of the
 * three libraries' development files. */
typedef int (*NcclGetVersion) (int *version);
typedef size_t (*CudnnGetVersion) (void);
typedef int (*NvrtcVersion) (int *major, int *minor);

/* NCCL since 2.9 and cuDNN since 9 spell a version 10000 · major +
 * 100 · minor + patch; their older releases 1000 · major + 100 · minor +
 * patch. */
/* The libraries stay mapped once opened, even when the last handle is
 * closed: they keep state of their own for the life of the process
 * (NVRTC's bundled C++ runtime allocates its exception pool when it is
 * loaded, NCCL and cuDNN register with the CUDA runtime), and unmapping
 * them under it would leave that state pointing into nothing. */
#define GPU_LIBRARY_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)

static char *
three_part_version (int code)
{
  if (code >= 10000)
    return g_strdup_printf ("%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
  return g_strdup_printf ("%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

static gboolean
read_nccl_version (gpointer   handle,
                   int       *code,
                   char     **text)
{
  NcclGetVersion get_version = (NcclGetVersion) dlsym (handle, "ncclGetVersion");

  if (get_version == NULL || get_version (code) != 0 || *code <= 0)
    return FALSE;
  *text = three_part_version (*code);
  return TRUE;
}

static gboolean
read_cudnn_version (gpointer   handle,
                    int       *code,
                    char     **text)
{
  CudnnGetVersion get_version = (CudnnGetVersion) dlsym (handle, "cudnnGetVersion");
  size_t version;

  if (get_version == NULL || (version = get_version ()) == 0 || version > G_MAXINT)
    return FALSE;
  *code = (int) version;
  *text = three_part_version (*code);
  return TRUE;
}

static gboolean
read_nvrtc_version (gpointer   handle,
                    int       *code,
                    char     **text)
{
  NvrtcVersion get_version = (NvrtcVersion) dlsym (handle, "nvrtcVersion");
  int major = 0, minor = 0;

  if (get_version == NULL || get_version (&major, &minor) != 0 || major <= 0)
    return FALSE;
  /* CUDA's own spelling, as the runtime's and the driver's versions. */
  *code = 1000 * major + 10 * minor;
  *text = g_strdup_printf ("%d.%d", major, minor);
  return TRUE;
}

typedef struct
{
  const char *name;
  const char *soname;
  const char *version_symbol;
  VersionReader read_version;
} Library;

static const Library libraries[CP_GPU_LIBRARY_N] = {
  [CP_GPU_LIBRARY_NCCL] = { "nccl", "libnccl.so.2", "ncclGetVersion", read_nccl_version },
  [CP_GPU_LIBRARY_CUDNN] = { "cudnn", "libcudnn.so.9", "cudnnGetVersion", read_cudnn_version },
  [CP_GPU_LIBRARY_NVRTC] = { "nvrtc", NVRTC_SONAME, "nvrtcVersion", read_nvrtc_version },
};

const char *
_cp_gpu_library_name (CpGpuLibrary library)
{
  g_return_val_if_fail (library < CP_GPU_LIBRARY_N, NULL);
  return libraries[library].name;
}

const char *
_cp_gpu_library_soname (CpGpuLibrary library)
{
  g_return_val_if_fail (library < CP_GPU_LIBRARY_N, NULL);
  return libraries[library].soname;
}

/* Paths and the loader's messages come from the file system and the
 * environment: they reach GError-free text that Python and the terminal
 * print, so they must be UTF-8. */
static char *
displayable (const char *text)
{
  return g_utf8_make_valid (text, -1);
}

static void
set_reason (CpGpuLibraryInfo *info,
            char             *reason)
{
  g_free (info->reason);
  info->reason = displayable (reason);
  g_free (reason);
}

static char *
loaded_path (gpointer handle)
{
  struct link_map *map = NULL;

  if (dlinfo (handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL || map->l_name == NULL ||
      map->l_name[0] == '\0')
    return g_strdup ("(unknown path)");
  return displayable (map->l_name);
}

/* Takes over @handle: found when its version call answers. */
static gboolean
accept_handle (const Library    *library,
               gpointer          handle,
               CpGpuLibraryInfo *info)
{
  g_autofree char *path = loaded_path (handle);

  if (!library->read_version (handle, &info->version_code, &info->version))
    {
      set_reason (info, g_strdup_printf ("%s at %s has no working %s", library->soname, path,
                                         library->version_symbol));
      dlclose (handle);
      return FALSE;
    }
  info->handle = handle;
  info->path = g_steal_pointer (&path);
  g_clear_pointer (&info->reason, g_free);
  return TRUE;
}

static gboolean
is_directory (const char *path)
{
  struct stat st;

  return stat (path, &st) == 0 && S_ISDIR (st.st_mode);
}

static gboolean
load_from_directories (const Library    *library,
                       const char       *search_path,
                       CpGpuLibraryInfo *info)
{
  g_auto(GStrv) directories = g_strsplit (search_path, G_SEARCHPATH_SEPARATOR_S, -1);
  g_autoptr(GString) looked = g_string_new (NULL);
  g_autofree char *failure = NULL;

  for (char **dir = directories; *dir != NULL; dir++)
    {
      g_autofree char *file = NULL;
      gpointer handle;

      if ((*dir)[0] == '\0')
        continue;
      g_string_append_printf (looked, "%s%s", looked->len > 0 ? ", " : "", *dir);
      /* A relative entry would load code from wherever the process
       * happens to run. */
      if (!g_path_is_absolute (*dir))
        {
          g_string_append (looked, " (relative: ignored)");
          continue;
        }
      if (!is_directory (*dir))
        continue;
      file = g_build_filename (*dir, library->soname, NULL);
      if (!g_file_test (file, G_FILE_TEST_EXISTS))
        continue;
      handle = dlopen (file, GPU_LIBRARY_DLOPEN_FLAGS);
      if (handle == NULL)
        {
          /* The first that exists and fails says most (a missing
           * dependency, another architecture). */
          if (failure == NULL)
            failure = g_strdup (dlerror ());
          continue;
        }
      if (accept_handle (library, handle, info))
        return TRUE;
      if (failure == NULL)
        failure = g_strdup (info->reason);
    }
  if (failure != NULL)
    set_reason (info, g_strdup_printf ("%s from %s: %s", library->soname,
                                       CP_GPU_LIBRARY_PATH_VARIABLE, failure));
  else
    set_reason (info, g_strdup_printf ("%s is in none of the directories %s names (%s)",
                                       library->soname, CP_GPU_LIBRARY_PATH_VARIABLE,
                                       looked->len > 0 ? looked->str : "none"));
  return FALSE;
}

static gboolean
load_from_loader_path (const Library    *library,
                       CpGpuLibraryInfo *info)
{
  gpointer handle = dlopen (library->soname, GPU_LIBRARY_DLOPEN_FLAGS);

  if (handle == NULL)
    {
      set_reason (info, g_strdup_printf ("%s; set %s to the directory that holds it",
                                         dlerror (), CP_GPU_LIBRARY_PATH_VARIABLE));
      return FALSE;
    }
  return accept_handle (library, handle, info);
}

gboolean
_cp_gpu_library_load (CpGpuLibrary      library,
                      const char       *search_path,
                      CpGpuLibraryInfo *info)
{
  const Library *lib;

  g_return_val_if_fail (library < CP_GPU_LIBRARY_N, FALSE);
  g_return_val_if_fail (info != NULL, FALSE);

  lib = &libraries[library];
  memset (info, 0, sizeof *info);
  info->library = library;
  if (library == CP_GPU_LIBRARY_NCCL && !CP_HAS_NCCL)
    {
      info->reason = g_strdup ("this build leaves NCCL out (-Dnccl=disabled)");
      return FALSE;
    }
  if (search_path != NULL && search_path[0] != '\0')
    return load_from_directories (lib, search_path, info);
  return load_from_loader_path (lib, info);
}

void
_cp_gpu_library_info_clear (CpGpuLibraryInfo *info)
{
  g_return_if_fail (info != NULL);

  if (info->handle != NULL)
    dlclose (info->handle);
  g_free (info->path);
  g_free (info->version);
  g_free (info->reason);
  memset (info, 0, sizeof *info);
}

/* A copy some other part of the process loaded already (PyTorch loads
 * its NCCL when it initialises CUDA): two copies of NCCL or cuDNN in one
 * process would not share their state, so the loaded one wins. */
static gboolean
load_already_loaded (CpGpuLibrary      library,
                     CpGpuLibraryInfo *info)
{
  gpointer handle;

  memset (info, 0, sizeof *info);
  info->library = library;
  if (library == CP_GPU_LIBRARY_NCCL && !CP_HAS_NCCL)
    return FALSE;
  handle = dlopen (libraries[library].soname, GPU_LIBRARY_DLOPEN_FLAGS | RTLD_NOLOAD);
  return handle != NULL && accept_handle (&libraries[library], handle, info);
}

const CpGpuLibraryInfo *
_cp_gpu_library_get (CpGpuLibrary library)
{
  static CpGpuLibraryInfo infos[CP_GPU_LIBRARY_N];
  static gsize loaded[CP_GPU_LIBRARY_N];

  g_return_val_if_fail (library < CP_GPU_LIBRARY_N, NULL);

  if (g_once_init_enter (&loaded[library]))
    {
      if (!load_already_loaded (library, &infos[library]))
        {
          _cp_gpu_library_info_clear (&infos[library]);
          _cp_gpu_library_load (library, g_getenv (CP_GPU_LIBRARY_PATH_VARIABLE), &infos[library]);
        }
      g_once_init_leave (&loaded[library], 1);
    }
  return &infos[library];
}
