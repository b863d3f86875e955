/* cpmesh-info.c: cpmesh info
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>
#include <unistd.h>

#include "cpmesh-tool.h"
#include "transports/cp-transport-private.h"

#if CP_HAS_CUDA
#include "kernels/cuda/cp-cuda-private.h"
#endif

typedef struct
{
  const char *name;
  gboolean built_in;
  const char *what;
} Backend;

static const Backend backends[] = {
  { "local", TRUE, "in-process ranks on threads" },
  { "ucx", CP_HAS_UCX, "multi-process meshes over host memory" },
  { "shm", TRUE, "multi-process meshes of one host, each byte copied once out of its owner's memory" },
  { "cuda", CP_HAS_CUDA, "CUDA device memory and the layout kernels" },
};

/* The features the copy loops and CPU attention kernels care about,
 * spelt as the kernel spells them in /proc/cpuinfo. */
static const char * const cpu_features[] = {
  "avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16",
};

/* The "flags" line of /proc/cpuinfo: what the CPU has and the kernel
 * enabled, which is what matters for AVX-512 and AMX state. */
static char **
read_cpu_flags (void)
{
  g_autofree char *contents = NULL;
  g_auto(GStrv) lines = NULL;

  if (!g_file_get_contents ("/proc/cpuinfo", &contents, NULL, NULL))
    return NULL;
  lines = g_strsplit (contents, "\n", -1);
  for (char **line = lines; *line != NULL; line++)
    if (g_str_has_prefix (*line, "flags") && strchr (*line, ':') != NULL)
      return g_strsplit_set (strchr (*line, ':') + 1, " \t", -1);
  return NULL;
}

/* "yes" only where the backend can run here: CUDA built in finds no
 * use without a driver and a device. */
static const char *
backend_status (const Backend *backend)
{
  if (!backend->built_in)
    return "no";
#if CP_HAS_CUDA
  if (g_str_equal (backend->name, "cuda"))
    {
      CpCudaInfo info;
      g_autoptr(GError) error = NULL;

      _cp_cuda_probe (&info, &error);
      if (info.driver_version == 0)
        return "built with CUDA; no driver:";
      if (error != NULL || info.device_count == 0)
        return "built with CUDA; no device:";
    }
#endif
  if (g_str_equal (backend->name, "shm") && !_cp_transport_shm_probe (NULL))
    return "no";
  return "yes";
}

/* Why a backend that is built cannot run here, or NULL. */
static char *
backend_obstacle (const Backend *backend)
{
  g_autoptr(GError) error = NULL;

  if (g_str_equal (backend->name, "shm") && !_cp_transport_shm_probe (&error))
    return g_strdup (error->message);
  return NULL;
}

static void
print_backends (void)
{
  g_print ("backends:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (backends); i++)
    {
      g_autofree char *obstacle = backend_obstacle (&backends[i]);

      g_print ("  %-6s %-4s %s%s%s\n", backends[i].name, backend_status (&backends[i]),
               backends[i].what, obstacle ? "; unusable here: " : "", obstacle ? obstacle : "");
    }
}

/* The transports a mesh of processes can connect over, whether each can
 * run in this process, and how the default one is picked. */
static void
print_transports (void)
{
  g_autofree char *described = _cp_transport_describe_backends ();

  g_print ("transports (CPMESH_TRANSPORT names one; by default the first usable on every rank):\n%s",
           described);
}

static void
print_cpu_features (void)
{
  g_auto(GStrv) flags = read_cpu_flags ();

  g_print ("cpu features:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (cpu_features); i++)
    g_print ("  %-12s %s\n", cpu_features[i],
             flags == NULL ? "unknown" :
             g_strv_contains ((const char * const *) flags, cpu_features[i]) ? "yes" : "no");
}

#if CP_HAS_CUDA
/* CUDA spells its runtime and driver versions 1000 · major + 10 · minor,
 * NCCL its own 10000 · major + 100 · minor + patch. */
static char *
cuda_version_string (int version)
{
  if (version == 0)
    return g_strdup ("none (0)");
  return g_strdup_printf ("%d.%d (%d)", version / 1000, version % 1000 / 10, version);
}

/* Which copy of each GPU library the process opens, or why none: the
 * libraries are not linked, so this is the only place a user sees it. */
static void
print_gpu_libraries (void)
{
  for (CpGpuLibrary library = 0; library < CP_GPU_LIBRARY_N; library++)
    {
      const CpGpuLibraryInfo *found = _cp_gpu_library_get (library);

      if (found->handle != NULL)
        g_print ("%s: %s at %s\n", _cp_gpu_library_name (library), found->version, found->path);
      else
        g_print ("%s: none (%s)\n", _cp_gpu_library_name (library), found->reason);
    }
}

static void
print_cuda (void)
{
  CpCudaInfo info;
  g_autoptr(GError) error = NULL;
  g_autofree char *runtime = NULL;
  g_autofree char *driver = NULL;

  _cp_cuda_probe (&info, &error);
  runtime = cuda_version_string (info.runtime_version);
  driver = cuda_version_string (info.driver_version);
  g_print ("cuda runtime: %s\n", runtime);
  g_print ("cuda driver: %s\n", driver);
  if (error != NULL)
    g_print ("cuda devices: 0 (%s)\n", error->message);
  else
    g_print ("cuda devices: %d\n", info.device_count);
  print_gpu_libraries ();
}
#else
static void
print_cuda (void)
{
  g_print ("cuda: not built in\n");
}
#endif

int
cpmesh_info (int    argc,
             char **argv)
{
  CpmeshOption entries[] = { CPMESH_OPTION_END };

  if (!cpmesh_parse_options ("Show the libcpmesh version, the backends compiled in (and why one cannot run here), "
                             "the transports that can run here and how the default one is picked, "
                             "the CPU features that matter, the number of online CPUs and, in builds "
                             "with CUDA, the CUDA runtime, driver and devices, and the NCCL, cuDNN and "
                             "NVRTC libraries found (CPMESH_GPU_LIBRARY_PATH names the "
                             "directories to look in instead of the loader's path).",
                             entries, NULL, &argc, &argv))
    return CPMESH_EXIT_USAGE;

  g_print ("libcpmesh %s\n", CP_VERSION_S);
  print_backends ();
  print_transports ();
  print_cpu_features ();
  g_print ("online cpus: %ld\n", sysconf (_SC_NPROCESSORS_ONLN));
  print_cuda ();
  return 0;
}
