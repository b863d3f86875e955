/* cpmesh-info.c: cpmesh info
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>
#include <unistd.h>

#include "cpmesh-tool.h"

typedef struct
{
  const char *name;
  gboolean built_in;
  const char *what;
} Backend;

static const Backend backends[] = {
  { "local", TRUE, "in-process ranks on threads" },
  { "ucx", CP_HAS_UCX, "multi-process meshes over host memory" },
  { "cuda", CP_HAS_CUDA, "CUDA device memory and the NCCL transport" },
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

static void
print_backends (void)
{
  g_print ("backends:\n");
  for (gsize i = 0; i < G_N_ELEMENTS (backends); i++)
    g_print ("  %-6s %-4s %s\n", backends[i].name, backends[i].built_in ? "yes" : "no",
             backends[i].what);
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

int
cpmesh_info (int    argc,
             char **argv)
{
  CpmeshOption entries[] = { CPMESH_OPTION_END };

  if (!cpmesh_parse_options ("Show the libcpmesh version, the backends compiled in, "
                             "the CPU features that matter and the number of online CPUs.",
                             entries, NULL, &argc, &argv))
    return CPMESH_EXIT_USAGE;

  g_print ("libcpmesh %s\n", CP_VERSION_S);
  print_backends ();
  print_cpu_features ();
  g_print ("online cpus: %ld\n", sysconf (_SC_NPROCESSORS_ONLN));
  return 0;
}
