/* cpmesh.c: the cpmesh command-line program
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>

#include "cpmesh-tool.h"

static const CpmeshCommand commands[] = {
  { "info", "Show the version, the backends built in and the CPU features", cpmesh_info },
  { "layout", "Show which sequence positions each rank holds, and their cost", cpmesh_layout },
  { "bench", "Measure shard, unshard and collectives against memcpy", cpmesh_bench },
  { "demo", "Shard a batch over in-process ranks and gather it back", cpmesh_demo },
  { "launch", "Start N local ranks of a program, as torchrun --standalone does", cpmesh_launch },
};

int
main (int    argc,
      char **argv)
{
  setlocale (LC_ALL, "");
  g_set_prgname ("cpmesh");
  return cpmesh_dispatch ("Context parallelism for long sequences: inspect layouts, "
                          "benchmark and demonstrate libcpmesh.",
                          commands, G_N_ELEMENTS (commands), argc, argv);
}
