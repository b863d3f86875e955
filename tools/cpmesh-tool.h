/* cpmesh-tool.h: what the cpmesh subcommands share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <libcpmesh.h>

#include "cp-harness.h"

G_BEGIN_DECLS

/* Exit statuses of every subcommand: 1 when the work itself failed (bad
 * input data, a wrong result, a failed check), 2 when the command line
 * was wrong, 3 when a benchmark run with --check-targets missed one of
 * its targets. */
#define CPMESH_EXIT_FAILED        1
#define CPMESH_EXIT_USAGE         2
#define CPMESH_EXIT_TARGET_MISSED 3

/* The most ranks any command runs, starts or lays out. */
#define CPMESH_MAX_RANKS 1024

/* A subcommand receives its own name as argv[0], then its arguments. */
typedef int (*CpmeshCommandFunc) (int    argc,
                                  char **argv);

typedef struct _CpmeshCommand CpmeshCommand;

/* A command runs @run.  A group of commands (`cpmesh bench`, and the
 * program itself) has no @run but @commands, and @about for its --help. */
struct _CpmeshCommand
{
  const char *name;
  const char *summary;
  CpmeshCommandFunc run;
  const CpmeshCommand *commands;
  gsize n_commands;
  const char *about;
};

int          cpmesh_info               (int                   argc,
                                        char                **argv);
int          cpmesh_layout             (int                   argc,
                                        char                **argv);
int          cpmesh_demo               (int                   argc,
                                        char                **argv);
int          cpmesh_launch             (int                   argc,
                                        char                **argv);

/* Runs the command that argv[1] names among @program's commands, after
 * the program's own options (--help, --version); `help [COMMAND…]` prints
 * the help of the program, of a group or of a command.  The program name
 * becomes "cpmesh <command>", which every message and usage line then
 * shows. */
int          cpmesh_main               (const CpmeshCommand  *program,
                                        int                   argc,
                                        char                **argv);

/* The one option parser of every command.  Each option is a row of a
 * table, parsed and checked here, so that every command spells, checks
 * and reports its options alike; the rows the commands share are the
 * CPMESH_OPTION_… macros below, the vocabulary of the program. */
typedef enum
{
  CPMESH_VALUE_FLAG,        /* gboolean */
  CPMESH_VALUE_INT,         /* int in [min, max] */
  CPMESH_VALUE_INT64,       /* gint64 in [min, max] */
  CPMESH_VALUE_INT64_LIST,  /* GArray * of gint64, each in [min, max], given as 1,2,3 */
  CPMESH_VALUE_DOUBLE,      /* finite double in [min, max] */
  CPMESH_VALUE_CHOICE,      /* int: the index of the value given in @choices */
  CPMESH_VALUE_STRING,      /* char *, which the command frees */
  CPMESH_VALUE_FILENAME,    /* char *, which the command frees */
} CpmeshValueKind;

typedef struct
{
  const char *long_name;
  char short_name;
  CpmeshValueKind kind;
  gpointer value;
  const char *description;
  const char *arg_description;
  gint64 min;
  gint64 max;
  const char * const *choices;  /* CPMESH_VALUE_CHOICE: NULL-terminated */
  gboolean given;               /* set by the parser */
} CpmeshOption;

#define CPMESH_OPTION_END { NULL, 0, 0, NULL, NULL, NULL, 0, 0, NULL, FALSE }

/* The shared vocabulary.  @about completes the description with what the
 * command adds, usually its default: " (default 4)". */
#define CPMESH_OPTION_CP(value, about) \
  { "cp", 'C', CPMESH_VALUE_INT, (value), "Ranks in the context-parallel group" about, "C", \
    1, CPMESH_MAX_RANKS, NULL, FALSE }
#define CPMESH_OPTION_SEQ(value, about) \
  { "seq", 'S', CPMESH_VALUE_INT64, (value), "Sequence length in positions" about, "S", \
    1, G_MAXINT32, NULL, FALSE }
#define CPMESH_OPTION_SEQS(value, about) \
  { "seq", 'S', CPMESH_VALUE_INT64_LIST, (value), "Sequence lengths in positions" about, \
    "S[,S…]", 1, G_MAXINT32, NULL, FALSE }
#define CPMESH_OPTION_BATCH(value, about) \
  { "batch", 'b', CPMESH_VALUE_INT64, (value), "Sequences (rows) in the batch" about, "B", \
    1, G_MAXINT32, NULL, FALSE }
#define CPMESH_OPTION_REPS(value, about) \
  { "reps", 'r', CPMESH_VALUE_INT, (value), "Timed repetitions of each measurement" about, \
    "N", 1, 1000000, NULL, FALSE }
#define CPMESH_OPTION_WARMUP(value, about) \
  { "warmup", 'w', CPMESH_VALUE_INT, (value), "Untimed repetitions before the timed ones" \
    about, "N", 0, 1000000, NULL, FALSE }
#define CPMESH_OPTION_QUICK(value, about) \
  { "quick", 'q', CPMESH_VALUE_FLAG, (value), "Small sizes, seconds rather than minutes" about, \
    NULL, 0, 0, NULL, FALSE }
#define CPMESH_OPTION_BACKEND(value, about) \
  { "backend", 0, CPMESH_VALUE_CHOICE, (value), "Where the ranks run: local, threads of " \
    "this process, or ucx, processes over UCX" about, "NAME", 0, 0, cpmesh_backend_names, FALSE }
#define CPMESH_OPTION_CHECK_TARGETS(value) \
  { "check-targets", 0, CPMESH_VALUE_FLAG, (value), "Exit with status 3 when a target is " \
    "missed (without it targets are only printed, met or missed)", NULL, 0, 0, NULL, FALSE }

/* The values of --backend, in the order of CpmeshBackend. */
typedef enum
{
  CPMESH_BACKEND_LOCAL,
  CPMESH_BACKEND_UCX,
} CpmeshBackend;

extern const char * const cpmesh_backend_names[];

/* Parses a command's options against @options.  Without @arguments the
 * command takes no positional arguments; with it (its usage, such as
 * "-- PROGRAM [ARGS…]") parsing stops at the first one, and @argc and
 * @argv are left holding the command's name and them.  --help prints and
 * exits 0; any other problem is printed and gives FALSE, and the caller
 * exits with CPMESH_EXIT_USAGE. */
gboolean     cpmesh_parse_options      (const char           *summary,
                                        CpmeshOption         *options,
                                        const char           *arguments,
                                        int                  *argc,
                                        char               ***argv);
gboolean     cpmesh_option_given       (const CpmeshOption   *options,
                                        const char           *long_name);

/* The check of every sequence length that a head-tail layout cuts into
 * 2·C equal chunks: prints a usage error naming @option, @seq_len and
 * @cp_size, and returns FALSE, unless @seq_len is a multiple of 2·@cp_size. */
gboolean     cpmesh_check_divisible    (const char           *option,
                                        gint64                seq_len,
                                        int                   cp_size);

/* Prints "<program>: <message>" to stderr and returns @status. */
int          cpmesh_fail               (int                   status,
                                        const char           *format,
                                        ...) G_GNUC_PRINTF (2, 3);
int          cpmesh_fail_error         (GError               *error);

/* A line on stderr saying what a long run is doing, with the seconds since
 * the program started: "cpmesh bench attention: [  12.3 s] …". */
void         cpmesh_progress           (const char           *format,
                                        ...) G_GNUC_PRINTF (1, 2);
void         cpmesh_progress_start     (void);

/* Whether a launcher started this process as one of several ranks, by the
 * variables cp_mesh_new_from_env() reads: torchrun's and cpmesh launch's,
 * then Open MPI's, then Slurm's, the first launcher found counting.  Then
 * @description says what was found, e.g. "WORLD_SIZE=4". */
gboolean     cpmesh_launched_as_rank   (char                **description);

/* "head-tail" and "contiguous", as the --balance option spells them. */
extern const char * const cpmesh_balance_names[];

CpLoadBalance cpmesh_balance_from_index (int                  index);
const char  *cpmesh_balance_name       (CpLoadBalance         balance);

/* The global positions @rank holds, chunk by chunk, so that chunks that
 * touch stay apart: "head 6-7, tail 8-9" (head-tail), "doc 0: head 0-1,
 * tail 6-7; doc 1: head 8, tail 11" (packed documents), "4-7"
 * (contiguous).  A rank with more than CPMESH_MAX_LISTED_CHUNKS chunks
 * gets a note saying so instead of a line nobody reads. */
#define CPMESH_MAX_LISTED_CHUNKS (G_GINT64_CONSTANT (1) << 16)

char        *cpmesh_format_positions   (CpLayout             *layout,
                                        int                   rank);

double       cpmesh_now_seconds        (void);

/* A copy of @tensor right-padded with @value along @dim to @length. */
CpTensor    *cpmesh_pad_sequence       (CpTensor             *tensor,
                                        int                   dim,
                                        gint64                length,
                                        double                value,
                                        GError              **error);

G_END_DECLS
