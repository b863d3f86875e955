/* cp-test-procs.h: ranks of a multi-process mesh as child processes
 *
 * A test starts each rank as a child process (a rank helper program such
 * as cp-test-ucx-rank), reads the lines it reports on stdout ("JOINED 1",
 * "ERROR 4 …", "OK") and waits on its main loop for a condition, never
 * longer than a minute: hung ranks are killed and the test fails.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <gio/gio.h>
#include <libcpmesh.h>

#include "cp-harness.h"

G_BEGIN_DECLS

/* The mesh timeout ranks get unless their settings say otherwise. */
#define CP_TEST_RANK_TIMEOUT_MS 3000

/* A rank process of the harness; CpTestRank is the tests' name for it. */
typedef CpHarnessRank CpTestRank;
typedef CpHarnessCondition CpTestCondition;

/* The ranks one test case started. */
typedef struct
{
  const char *program;   /* the helper in the build directory; NULL: cp-test-ucx-rank */
  CpTestRank *ranks[8];
  guint n;
} CpTestGroup;

#define CP_TEST_SETTINGS(...) ((const char * const[]) { __VA_ARGS__, NULL })

/* A TCP port of the loopback interface nobody listens on (asserted). */
guint16      cp_test_free_port        (void);

/* Starts rank @rank of a world of @world_size meeting at @port (both
 * CPMESH_PORT and MASTER_PORT; 0 leaves them to @extra), playing
 * @scenario, with @extra NAME=VALUE settings (NULL-terminated, may be
 * NULL) over the defaults. */
CpTestRank  *cp_test_group_spawn      (CpTestGroup         *group,
                                       const char          *scenario,
                                       int                  rank,
                                       int                  world_size,
                                       guint16              port,
                                       const char * const  *extra);

/* Kills what is left, frees the ranks and asserts that no child process
 * of this test is left, not even a zombie. */
void         cp_test_group_clear      (CpTestGroup         *group);

/* The harness's functions under the names the tests use: see
 * cp-harness.h. */
#define cp_test_rank_is_done   cp_harness_rank_is_done
#define cp_test_rank_release   cp_harness_rank_release
#define cp_test_rank_find_line cp_harness_rank_find_line
#define cp_test_all_done       cp_harness_all_done
#define cp_test_all_said       cp_harness_all_said
#define cp_test_all_ready      cp_harness_all_ready
#define cp_test_any_done       cp_harness_any_done
#define cp_test_run_for        cp_harness_run_for

/* Runs the main loop until @condition holds; the test fails, its ranks
 * killed, when that takes a minute (times $CP_TEST_TIME_FACTOR). */
void         cp_test_run_until        (CpTestRank         **ranks,
                                       guint                n,
                                       CpTestCondition      condition);

void         cp_test_assert_exit      (CpTestRank          *rank,
                                       int                  status);

/* The error the rank reported ("ERROR code message", a CpMeshError) and
 * exited 3 for, asserting that its message contains @text. */
GError      *cp_test_rank_dup_error   (CpTestRank          *rank,
                                       int                  code,
                                       const char          *text);

void         cp_test_assert_no_children (void);

/* Joins the mesh @environment describes with cp_mesh_connect_async, in a
 * worker thread, while this thread runs its main loop (which serves what
 * listens on it, and the joiner's callbacks). */
CpMesh      *cp_test_connect          (const char * const  *environment,
                                       GCancellable        *cancellable,
                                       GError             **error);

G_END_DECLS
