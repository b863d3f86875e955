/* cpmesh.c: the cpmesh command-line program
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <locale.h>

#include "cpmesh-bench.h"

static const CpmeshCommand commands[] = {
  { "info", "Show the version, the backends built in and the CPU features", cpmesh_info },
  { "layout", "Show which sequence positions each rank holds, and their cost", cpmesh_layout },
  { "bench", "Measure libcpmesh against memcpy, matmul and ucx_perftest", NULL,
    cpmesh_bench_commands, CPMESH_N_BENCH_COMMANDS, CPMESH_BENCH_ABOUT },
  { "demo", "Shard a batch over ranks, run attention, and gather it back", cpmesh_demo },
  { "launch", "Start N local ranks of a program, as torchrun --standalone does", cpmesh_launch },
};

static const CpmeshCommand program = {
  "cpmesh", NULL, NULL, commands, G_N_ELEMENTS (commands),
  "Context parallelism for long sequences: inspect layouts, benchmark and demonstrate "
  "libcpmesh, and launch ranks."
};

int
main (int    argc,
      char **argv)
{
  setlocale (LC_ALL, "");
  return cpmesh_main (&program, argc, argv);
}
