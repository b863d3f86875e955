/* cpmesh-tool.h: what the cpmesh subcommands share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <libcpmesh.h>

G_BEGIN_DECLS

/* Exit statuses of every subcommand: 1 when the work itself failed (bad
 * input data, a failed check), 2 when the command line was wrong. */
#define CPMESH_EXIT_FAILED 1
#define CPMESH_EXIT_USAGE  2

/* A subcommand receives its own name as argv[0], then its arguments. */
typedef int (*CpmeshCommandFunc) (int    argc,
                                  char **argv);

typedef struct
{
  const char *name;
  const char *summary;
  CpmeshCommandFunc run;
} CpmeshCommand;

int          cpmesh_info               (int                   argc,
                                        char                **argv);
int          cpmesh_layout             (int                   argc,
                                        char                **argv);
int          cpmesh_bench              (int                   argc,
                                        char                **argv);
int          cpmesh_bench_layout       (int                   argc,
                                        char                **argv);
int          cpmesh_bench_mesh         (int                   argc,
                                        char                **argv);
int          cpmesh_demo               (int                   argc,
                                        char                **argv);
int          cpmesh_launch             (int                   argc,
                                        char                **argv);
int          cpmesh_bench_mesh_ucx     (int                   argc,
                                        char                **argv);

/* Runs the command argv[1] names out of @commands, after @argv[0]'s own
 * --help.  The program name becomes "cpmesh <command>", which every
 * message and usage line then shows. */
int          cpmesh_dispatch           (const char           *summary,
                                        const CpmeshCommand  *commands,
                                        gsize                 n_commands,
                                        int                   argc,
                                        char                **argv);

/* Parses a subcommand's options, which take no positional arguments.
 * --help prints and exits 0; on an error it prints it and returns FALSE,
 * and the caller exits with CPMESH_EXIT_USAGE. */
gboolean     cpmesh_parse_options      (const char           *summary,
                                        const GOptionEntry   *entries,
                                        int                   argc,
                                        char                **argv);

/* Prints "<program>: <message>" to stderr and returns @status. */
int          cpmesh_fail               (int                   status,
                                        const char           *format,
                                        ...) G_GNUC_PRINTF (2, 3);
int          cpmesh_fail_error         (GError               *error);

/* "head-tail" and "contiguous", as the --balance option spells them. */
const char  *cpmesh_balance_name       (CpLoadBalance         balance);
gboolean     cpmesh_balance_from_name  (const char           *name,
                                        CpLoadBalance        *balance);

/* The global positions @rank holds, chunk by chunk, so that chunks that
 * touch stay apart: "head 6-7, tail 8-9" (head-tail), "doc 0: head 0-1,
 * tail 6-7; doc 1: head 8, tail 11" (packed documents), "4-7"
 * (contiguous).  A rank with more than CPMESH_MAX_LISTED_CHUNKS chunks
 * gets a note saying so instead of a line nobody reads. */
#define CPMESH_MAX_LISTED_CHUNKS (G_GINT64_CONSTANT (1) << 16)

char        *cpmesh_format_positions   (CpLayout             *layout,
                                        int                   rank);

/* One in-process mesh per rank, all in one group of @n_ranks along a
 * dimension named "cp". */
GList       *cpmesh_local_group        (int                   n_ranks,
                                        guint                 timeout_ms,
                                        GError              **error);

/* Calls @func on its own thread for each mesh of @meshes, with
 * @rank_data[rank], and waits for all of them. */
typedef void (*CpmeshRankFunc) (CpMesh   *mesh,
                                gpointer  rank_data);

void         cpmesh_run_ranks          (GList                *meshes,
                                        CpmeshRankFunc        func,
                                        gpointer             *rank_data);

double       cpmesh_now_seconds        (void);

/* A copy of @tensor right-padded with @value along @dim to @length. */
CpTensor    *cpmesh_pad_sequence       (CpTensor             *tensor,
                                        int                   dim,
                                        gint64                length,
                                        double                value,
                                        GError              **error);

/* A TCP port on loopback that was free a moment ago, for a rendezvous. */
guint16      cpmesh_free_port          (void);

G_END_DECLS
