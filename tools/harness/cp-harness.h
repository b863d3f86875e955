/* cp-harness.h: the ranks of a mesh, for the tests, the cpmesh tool and
 * its benchmarks
 *
 * One place that knows how to run ranks: on threads of this process (a
 * local group), or as processes of their own with the environment a
 * launcher gives them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, a
 * token), each reporting lines on stdout that the caller waits for with
 * a deadline.  It also holds what a rank program plays that more than
 * one of them needs.
 *
 * An internal static library: never installed, never scanned for the
 * GIR, and compiled against the public API only, so that programs linking
 * any variant of libcpmesh (the fault-injection one included) can use it.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gio/gio.h>
#include <libcpmesh.h>

G_BEGIN_DECLS

/* ---- ports ---- */

/* A TCP port of the loopback interface that nobody listened on a moment
 * ago, or 0 when none could be had. */
/* Makes GLib's first uses of libcpmesh's types and error domains on the
 * calling thread, before rank threads would make them together (which
 * ThreadSanitizer reads as races in GLib's uninstrumented code). */
void         cp_harness_set_up_glib        (void);

guint16      cp_harness_free_port          (void);

/* A free port P whose successor is free too: MASTER_PORT for a launcher,
 * since rank 0 listens on P + 1 unless CPMESH_PORT says otherwise. */
guint16      cp_harness_free_port_pair     (void);

/* ---- ranks on threads ---- */

/* Called on its own thread for each rank of a local group. */
typedef void (*CpHarnessRankFunc) (CpMesh   *mesh,
                                   gpointer  user_data);

/* A local group with one dimension @dim_name of @size ranks; with
 * @timeout_ms other than 0, each mesh's timeout. */
GList       *cp_harness_local_group        (const char         *dim_name,
                                            int                 size,
                                            guint               timeout_ms,
                                            GError            **error);

/* Runs @func on its own thread for each mesh of @meshes, with
 * @rank_data[rank] (NULL when @rank_data is), and joins them.  With
 * @limit_ms other than 0, ranks still running that long after they
 * started give G_IO_ERROR_TIMED_OUT naming them: their threads cannot be
 * stopped and are left running, so the caller should abort. */
gboolean     cp_harness_run_threads        (GList              *meshes,
                                            CpHarnessRankFunc   func,
                                            gpointer           *rank_data,
                                            guint               limit_ms,
                                            GError            **error);

/* ---- ranks as processes ---- */

/* The environment of every rank of one world on this host, as
 * `torchrun --standalone` sets it (RANK, LOCAL_RANK, GROUP_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), plus
 * libcpmesh's own settings.  A zero or NULL field leaves its variable to
 * the caller. */
typedef struct
{
  int size;
  const char *address;        /* MASTER_ADDR; NULL: 127.0.0.1 */
  guint16 master_port;        /* MASTER_PORT */
  guint16 rendezvous_port;    /* CPMESH_PORT: where rank 0 listens */
  const char *token;          /* CPMESH_TOKEN */
  guint timeout_ms;           /* CPMESH_TIMEOUT_MS */
} CpHarnessWorld;

/* Sets rank @rank's environment of @world on @launcher, then @settings
 * (NAME=VALUE strings, NULL-terminated, may be NULL) over it. */
void         cp_harness_set_rank_environment (GSubprocessLauncher *launcher,
                                              const CpHarnessWorld *world,
                                              int                  rank,
                                              const char * const  *settings);

/* A rank process.  Its stdout is read line by line into @lines while the
 * thread-default main context runs (cp_harness_run_until runs it). */
typedef struct
{
  GSubprocess *process;
  GOutputStream *in;     /* the rank's stdin, until released; NULL without a pipe */
  GDataInputStream *out;
  GPtrArray *lines;
  gboolean exited;
  gboolean eof;
} CpHarnessRank;

/* Starts @argv with @launcher, which must pipe stdout (and may pipe
 * stdin), as rank @rank of @world with @settings over its environment. */
CpHarnessRank *cp_harness_rank_spawn       (GSubprocessLauncher *launcher,
                                            const CpHarnessWorld *world,
                                            int                  rank,
                                            const char * const  *settings,
                                            const char * const  *argv,
                                            GError             **error);
void         cp_harness_rank_free          (CpHarnessRank      *rank);

/* Exited, and its output read to the end. */
gboolean     cp_harness_rank_is_done       (CpHarnessRank      *rank);
/* Closes the rank's stdin: a rank that waits for the end of its input
 * (as a rank that must keep its mesh until its peers are done does)
 * goes on. */
void         cp_harness_rank_release       (CpHarnessRank      *rank);
/* The first line the rank reported that starts with @prefix, or NULL. */
const char  *cp_harness_rank_find_line     (CpHarnessRank      *rank,
                                            const char         *prefix);
/* The exit status of a process that ended, as a shell reports it: 128 +
 * the signal's number when a signal ended it. */
int          cp_harness_exit_status        (GSubprocess        *process);

typedef gboolean (*CpHarnessCondition) (CpHarnessRank **ranks,
                                        guint           n);

/* The conditions callers wait for.  NULL entries of @ranks count as
 * done. */
gboolean     cp_harness_all_done           (CpHarnessRank     **ranks,
                                            guint               n);
gboolean     cp_harness_any_done           (CpHarnessRank     **ranks,
                                            guint               n);
/* Every rank reported a line starting with @prefix, or is done. */
gboolean     cp_harness_all_said           (CpHarnessRank     **ranks,
                                            guint               n,
                                            const char         *prefix);
/* Every rank reported READY, or is done. */
gboolean     cp_harness_all_ready          (CpHarnessRank     **ranks,
                                            guint               n);
/* Every rank reported CLOSED (the end of
 * cp_harness_gather_until_failure), or is done. */
gboolean     cp_harness_all_closed         (CpHarnessRank     **ranks,
                                            guint               n);

/* Runs the thread-default main context until @condition holds and gives
 * TRUE; FALSE when @limit_ms (0: no limit) passed first, after killing
 * every rank of @ranks. */
gboolean     cp_harness_run_until          (CpHarnessRank     **ranks,
                                            guint               n,
                                            CpHarnessCondition  condition,
                                            guint               limit_ms);

/* Runs the thread-default main context for @ms milliseconds. */
void         cp_harness_run_for            (guint               ms);

/* ---- what rank programs play ---- */

/* One line on stdout, flushed at once so that the line survives the
 * process being killed next. */
void         cp_harness_report             (const char         *format,
                                            ...) G_GNUC_PRINTF (1, 2);

/* Joins the mesh the environment describes and reports "JOINED RANK",
 * or reports "ERROR CODE MESSAGE" and gives NULL. */
CpMesh      *cp_harness_join_from_env      (void);

/* All_gathers 4 MiB per rank until one fails, reporting "READY" after
 * the first, then "FAILED CODE MS MESSAGE" (MS: the failing call's
 * duration) and "CLOSED MS" (the teardown of @mesh, whose reference
 * this takes).  Gives FALSE if the failure touched this rank's own
 * tensor. */
gboolean     cp_harness_gather_until_failure (CpMesh           *mesh);

G_END_DECLS
