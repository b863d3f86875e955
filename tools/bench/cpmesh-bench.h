/* cpmesh-bench.h: the benchmarks of cpmesh bench, and what they share
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "cpmesh-tool.h"

G_BEGIN_DECLS

#define CPMESH_N_BENCH_COMMANDS 5

/* The commands of `cpmesh bench`, and what the group's --help says. */
extern const CpmeshCommand cpmesh_bench_commands[CPMESH_N_BENCH_COMMANDS];

#define CPMESH_BENCH_ABOUT \
  "Measure libcpmesh against a baseline measured in the same run (memcpy of the same bytes, " \
  "oneDNN's matmul, Open MPI's collectives between the same processes). Every benchmark first checks its results against a " \
  "computation of its own and prints no speed for wrong results (exit status 1); then it " \
  "prints each target as met or missed, and with --check-targets a missed target makes the " \
  "exit status 3. Progress goes to stderr. Figures vary on shared machines: compare ratios, " \
  "and repeat runs that look off."

int       cpmesh_bench_layout        (int              argc,
                                      char           **argv);
int       cpmesh_bench_mesh          (int              argc,
                                      char           **argv);
int       cpmesh_bench_batch         (int              argc,
                                      char           **argv);
int       cpmesh_bench_thd           (int              argc,
                                      char           **argv);
int       cpmesh_bench_attention     (int              argc,
                                      char           **argv);

/* ---- one run of a benchmark: its targets and its verdict ---- */

/* Test-only: the test suite sets CPMESH_BENCH_TEST to
 *   corrupt-result       every benchmark alters one value of its result
 *                        before checking it, so its check must refuse;
 *   unreachable-targets  every target is judged, whatever the sizes,
 *                        against a bound no run can meet.
 * Nobody else has a reason to set it. */
#define CPMESH_BENCH_TEST_VARIABLE "CPMESH_BENCH_TEST"

typedef struct
{
  gboolean quick;           /* --quick */
  gboolean check_targets;   /* --check-targets */
  gboolean judged;          /* this run's sizes are those the targets are stated for */
  const char *stated_for;   /* those sizes, in words */
  guint n_targets;
  guint n_missed;
} CpmeshBench;

/* Starts a run whose targets apply when @judged, and says where they
 * apply otherwise (@stated_for, e.g. "the default sizes").  A usage error
 * (FALSE) when --check-targets asks to judge targets that do not apply. */
gboolean  cpmesh_bench_begin         (CpmeshBench     *bench,
                                      gboolean         judged,
                                      const char      *stated_for);

typedef enum
{
  CPMESH_AT_LEAST,
  CPMESH_AT_MOST,
} CpmeshBound;

/* Prints the one line of every target, "target: WHAT: 0.93× ≥ 0.80×: met"
 * ("missed", or "not judged (…)" for sizes it is not stated for), and
 * counts it. */
void      cpmesh_bench_target        (CpmeshBench     *bench,
                                      const char      *what,
                                      double           ratio,
                                      CpmeshBound      bound,
                                      double           target);

/* The exit status of a run whose results were right: 0, or
 * CPMESH_EXIT_TARGET_MISSED with --check-targets and a missed target. */
int       cpmesh_bench_end           (CpmeshBench     *bench);

/* Errors of the benchmarks' own checks: the results are wrong. */
#define CPMESH_BENCH_ERROR (cpmesh_bench_error_quark ())
#define CPMESH_BENCH_ERROR_WRONG_RESULT 1
#define CPMESH_BENCH_ERROR_PEER_WRONG   2

GQuark    cpmesh_bench_error_quark   (void);

gboolean  cpmesh_bench_wrong         (GError         **error,
                                      const char      *format,
                                      ...) G_GNUC_PRINTF (2, 3);

/* Prints why the run failed, "wrong results, no speed printed: …" for a
 * failed check, and returns CPMESH_EXIT_FAILED. */
int       cpmesh_bench_fail          (GError          *error);

/* With CPMESH_BENCH_TEST=corrupt-result, adds 1000 to the first element
 * of @tensor, which every check looks at.  The checks below call it on
 * what they check. */
void      cpmesh_bench_corrupt       (CpTensor        *tensor);

/* ---- bench mesh ---- */

/* The values of bench mesh's --backend: the program's (local, ucx) and
 * shm, processes over the intra-host shared-memory transport. */
typedef enum
{
  CPMESH_MESH_BACKEND_LOCAL = CPMESH_BACKEND_LOCAL,
  CPMESH_MESH_BACKEND_UCX = CPMESH_BACKEND_UCX,
  CPMESH_MESH_BACKEND_SHM,
} CpmeshMeshBackend;

extern const char * const cpmesh_mesh_backend_names[];

/* Over processes: the rounds the targets ask for at least, and the
 * sequence length of the attention runs, by default and with --quick. */
#define CPMESH_MESH_DEFAULT_ROUNDS 5
#define CPMESH_MESH_ATTENTION_SEQ 16384
#define CPMESH_MESH_QUICK_ATTENTION_SEQ 1024

/* The options of `cpmesh bench mesh`, with threads or, with --backend ucx
 * or shm, processes (cpmesh-bench-processes.c) as ranks. */
typedef struct
{
  int n_ranks;
  int mib;                  /* 0: the backend's default */
  int reps;                 /* 0: the backend's default */
  int rounds;               /* processes: alternating rounds of every case */
  int backend;              /* a CpmeshMeshBackend */
  gint64 attention_seq;     /* processes: S of the attention comparison */
  gboolean skip_perftest;
  gboolean skip_failure;
  gboolean skip_mpi;
  gboolean skip_attention;
  CpmeshBench run;
} CpmeshMeshBenchOptions;

/* Runs the benchmark over processes, after checking the options that only
 * it takes; a rank of it when started as one. */
int       cpmesh_bench_mesh_processes (CpmeshMeshBenchOptions *options,
                                       CpmeshOption    *entries);

/* The interpreter the benchmarks' Python parts run on: $CPMESH_PYTHON,
 * else the one the build found (Debian's /usr/bin/python3), never the
 * python3 first on PATH, which may be a pyenv shim. */
const char *cpmesh_bench_python      (void);

/* ---- bench mesh: Open MPI's figures from the same run ---- */

/* The collectives of bench mesh over processes, in the order of its
 * tables and of the RESULT lines of its ranks and of Open MPI's. */
typedef enum
{
  CPMESH_COLL_ALL_GATHER,
  CPMESH_COLL_ALL_REDUCE,
  CPMESH_COLL_ALL_TO_ALL,
  CPMESH_N_COLLS
} CpmeshColl;

extern const char * const cpmesh_coll_names[CPMESH_N_COLLS];

#define CPMESH_MESH_MAX_SIZES 2

/* What each process run measures: the per-rank sizes and the timed calls
 * at each. */
typedef struct
{
  gsize sizes[CPMESH_MESH_MAX_SIZES];
  guint calls[CPMESH_MESH_MAX_SIZES];
  guint n_sizes;
} CpmeshMeshPlan;

/* Seconds per call of every collective at every size, the slowest
 * rank's, from one round. */
typedef struct
{
  double seconds[CPMESH_N_COLLS][CPMESH_MESH_MAX_SIZES];
} CpmeshMeshRound;

/* Whether Open MPI can be measured here: mpirun on PATH and mpi4py and
 * numpy importable by cpmesh_bench_python (); otherwise @why says what is
 * missing and which Debian package has it.  @version: the library's. */
gboolean  cpmesh_mpi_available       (char           **version,
                                      char           **why);

/* The seconds of one mpirun of @n_ranks processes doing Allgather,
 * Allreduce and Alltoall on numpy float32 buffers of @plan's sizes, timed
 * as the library's ranks are; the script checks every rank's results
 * first and gives CPMESH_BENCH_ERROR_WRONG_RESULT when they are wrong. */
gboolean  cpmesh_mpi_measure         (int              n_ranks,
                                      const CpmeshMeshPlan *plan,
                                      CpmeshMeshRound *round,
                                      GError         **error);

/* The mpirun command line bench mesh runs, for its report. */
char     *cpmesh_mpi_describe        (int              n_ranks);

/* ---- bench mesh: attention over processes and over threads ---- */

/* A rank's forward + backward of ring CP attention at B = 1, H = 16,
 * D = 128 over @mesh on its head-tail share of a sequence of @seq_len
 * whose inputs every rank computes alike: the slowest rank's seconds, and
 * a digest of the rank's outputs, by which a run over processes is
 * checked against one over threads.  Only the side @checked is altered
 * by CPMESH_BENCH_TEST=corrupt-result. */
gboolean  cpmesh_bench_attention_rank (CpMesh         *mesh,
                                       gint64          seq_len,
                                       gboolean        checked,
                                       double         *seconds,
                                       char          **digest,
                                       GError        **error);

/* The same on @n_ranks threads of this process: the slowest rank's
 * seconds and every rank's digest (@digests, n_ranks strings). */
gboolean  cpmesh_bench_attention_threads (int           n_ranks,
                                          gint64        seq_len,
                                          double       *seconds,
                                          GStrv        *digests,
                                          GError      **error);

/* ---- checks ---- */

/* Element @index of the benchmarks' inputs: neighbours differ, and the
 * value is exact in float32 and int64, so that a check finds any element
 * out of place. */
static inline double
cpmesh_bench_pattern (guint64 index)
{
  return (double) ((index * G_GUINT64_CONSTANT (2654435761)) % 16777213u);
}

/* Fills @tensor with cpmesh_bench_pattern (@first + i) for its element i. */
void      cpmesh_bench_fill_pattern  (CpTensor        *tensor,
                                      guint64          first);

/* The global position of local position @local of @rank when head-tail
 * cuts @seq_len into 2·@cp_size equal chunks, worked out here, apart from
 * the library, for the checks. */
gint64    cpmesh_bench_head_tail_position (gint64      seq_len,
                                           int         cp_size,
                                           int         rank,
                                           gint64      local);

/* Whether the rows of @piece, [outer, local_len, inner], hold @rank's
 * head-tail share of @full, [outer, seq_len, inner]; an error names the
 * first row that does not. */
gboolean  cpmesh_bench_check_shard   (CpTensor        *full,
                                      CpTensor        *piece,
                                      int              dim,
                                      int              cp_size,
                                      int              rank,
                                      const char      *what,
                                      GError         **error);

/* The collectives' check: rank r's piece holds the pattern from
 * r · (its number of elements) on, so a gather along @dim holds it
 * everywhere; an error names the first element that differs. */
void      cpmesh_bench_fill_gather_piece (CpTensor    *piece,
                                          int          rank);
gboolean  cpmesh_bench_check_gathered    (CpTensor    *gathered,
                                          int          dim,
                                          int          n_ranks,
                                          int          rank,
                                          GError     **error);

/* Rank r's operand of a SUM holds (i mod 13 + 1)·(r mod 4 + 1) at i, so
 * the sum is known, and exact in float32 in any order. */
void      cpmesh_bench_fill_reduce_operand (CpTensor  *operand,
                                            int        rank);
gboolean  cpmesh_bench_check_reduced     (CpTensor    *sum,
                                          int          n_ranks,
                                          int          rank,
                                          GError     **error);

/* ---- timing ---- */

/* The median of @n values, which it sorts in place. */
double    cpmesh_bench_median        (double          *values,
                                      gsize            n);

/* When each rank started and ended one timed region, in every timed
 * repetition: ranks that share cores need not run at once, so the group's
 * time is from the first start to the last end. */
typedef struct
{
  int n_ranks;
  int n_reps;
  double *start;          /* [rank · n_reps + rep] */
  double *end;
} CpmeshSpans;

void      cpmesh_spans_init          (CpmeshSpans     *spans,
                                      int              n_ranks,
                                      int              n_reps);
void      cpmesh_spans_clear         (CpmeshSpans     *spans);
/* Ignores @rep < 0: a warm-up. */
void      cpmesh_spans_record        (CpmeshSpans     *spans,
                                      int              rank,
                                      int              rep,
                                      double           start,
                                      double           end);
/* The median over repetitions of the group's time. */
double    cpmesh_spans_median_group  (const CpmeshSpans *spans);
/* The median over repetitions of the slowest rank's time. */
double    cpmesh_spans_median_slowest (const CpmeshSpans *spans);

/* The memcpy baseline: @n blocks one after another into @destination. */
void      cpmesh_bench_copy_blocks   (guint8          *destination,
                                      const guint8   **blocks,
                                      const gsize     *sizes,
                                      guint            n);

/* ---- ranks on threads ---- */

/* A rank's work, on its own thread: @rank starts with a CpmeshBenchRank. */
typedef gboolean (*CpmeshBenchRankFunc) (gpointer   rank,
                                         GError   **error);

/* What every rank of a benchmark on an in-process mesh starts with. */
typedef struct
{
  CpMesh *mesh;
  int rank;
  CpmeshBenchRankFunc func;
  GError *error;           /* why this rank stopped */
} CpmeshBenchRank;

/* Runs @func on a thread per rank of an in-process mesh of @n_ranks, with
 * @ranks[rank].  Fails with the ranks' error: a failed check first, since
 * it makes its peers fail too. */
gboolean  cpmesh_bench_run_ranks     (int                   n_ranks,
                                      CpmeshBenchRankFunc   func,
                                      gpointer             *ranks,
                                      GError              **error);

/* The memcpy baseline of a rank: @n blocks one after another into
 * @destination, timed from a barrier on, recorded in @spans. */
gboolean  cpmesh_bench_timed_copy    (CpmeshBenchRank      *rank,
                                      guint8               *destination,
                                      const guint8        **blocks,
                                      const gsize          *sizes,
                                      guint                 n,
                                      CpmeshSpans          *spans,
                                      int                   rep,
                                      GError              **error);

/* One repetition @rep of a measurement on @rank; @rep < 0 is a warm-up. */
typedef gboolean (*CpmeshBenchRepFunc) (gpointer   rank,
                                        int        rep,
                                        GError   **error);

/* Runs @measured, then @baseline, @warmup times untimed and then @reps
 * times: interleaved, so that both see the same machine load.  Rank 0
 * reports progress on @what. */
gboolean  cpmesh_bench_interleave    (CpmeshBenchRank      *rank,
                                      const char           *what,
                                      int                   warmup,
                                      int                   reps,
                                      CpmeshBenchRepFunc    measured,
                                      CpmeshBenchRepFunc    baseline,
                                      GError              **error);

/* Every rank learns whether any rank's check failed (@ok FALSE, with
 * @error set), so that none waits for a peer that stopped: a rank whose
 * own check passed then fails with CPMESH_BENCH_ERROR_PEER_WRONG. */
gboolean  cpmesh_bench_agree         (CpMesh           *mesh,
                                      gboolean          ok,
                                      GError          **error);

/* ---- rows against a baseline (bench layout, bench mesh) ---- */

/* One measured operation: every pass moves @bytes, and its throughput is
 * compared with the row named @baseline, measured in the same run. */
typedef struct
{
  const char *name;
  const char *baseline;   /* NULL for a baseline itself */
  double bytes;
  double target;          /* the ratio it should reach; 0 when none */
  GArray *seconds;        /* one sample per timed pass */
} CpmeshBenchRow;

void      cpmesh_bench_rows_init     (CpmeshBenchRow  *rows,
                                      gsize            n_rows);
void      cpmesh_bench_rows_clear    (CpmeshBenchRow  *rows,
                                      gsize            n_rows);
void      cpmesh_bench_record        (CpmeshBenchRow  *row,
                                      double           seconds);

/* Prints a table of best and median GB/s and the ratio of each row's best
 * to its baseline's best, then each row's target. */
void      cpmesh_bench_report        (CpmeshBench     *bench,
                                      CpmeshBenchRow  *rows,
                                      gsize            n_rows);

G_END_DECLS
