/* cp-test-util.h: fixtures shared by the C tests
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include <libcpmesh.h>

#include "cp-harness.h"

G_BEGIN_DECLS

/* Called on its own thread for each rank of a local group. */
typedef CpHarnessRankFunc CpTestRankFunc;

/* Runs @func once per mesh of @meshes (a GList from
 * cp_mesh_new_local_group), each on its own thread, and joins them. */
void       cp_test_run_ranks          (GList          *meshes,
                                       CpTestRankFunc  func,
                                       gpointer        user_data);

/* Creates a local group with one dimension @dim_name of @size ranks,
 * runs @func on every rank's thread, and frees the group. */
void       cp_test_run_group          (const char     *dim_name,
                                       int             size,
                                       CpTestRankFunc  func,
                                       gpointer        user_data);

/* How much slower than usual the test setup runs the tests: 1, or
 * $CP_TEST_TIME_FACTOR (valgrind's setup sets 20).  Bounds on times
 * scale with it. */
guint      cp_test_time_factor        (void);

/* The same, but the test fails at once, naming the ranks still running,
 * when they are not all done @limit_ms after they started (times
 * $CP_TEST_TIME_FACTOR, which slow setups such as valgrind's raise).  For
 * tests of timeouts: a wait that never ends fails at the test's own
 * deadline instead of hanging until the harness kills the program. */
void       cp_test_run_ranks_within   (GList          *meshes,
                                       CpTestRankFunc  func,
                                       gpointer        user_data,
                                       guint           limit_ms);
void       cp_test_run_group_within   (const char     *dim_name,
                                       int             size,
                                       CpTestRankFunc  func,
                                       gpointer        user_data,
                                       guint           limit_ms);

/* Like cp_test_run_group() for a local group over several dimensions. */
void       cp_test_run_mesh           (const char * const *dim_names,
                                       const int      *dim_sizes,
                                       gsize           n_dims,
                                       CpTestRankFunc  func,
                                       gpointer        user_data);

/* The memory the suites' tensors live in: CP_TEST_DEVICE=test in the
 * environment puts them in CP_DEVICE_KIND_TEST memory, which the library
 * reaches only through its memory interface (tests/meson.build runs the
 * batch, context and THD suites so as well); host memory otherwise. */
CpDeviceKind cp_test_get_device       (void);

/* @tensor (taken) in cp_test_get_device() memory. */
CpTensor  *cp_test_on_device          (CpTensor       *tensor);

/* Asserts that the message of @error contains @needle, where "on host"
 * (how cp_tensor_describe() names a tensor's memory) stands for the
 * suite's memory, so that one expected message serves every run. */
void       cp_test_assert_message     (const GError   *error,
                                       const char     *needle);

/* Stores @tensor under @key and drops the caller's reference. */
void       cp_test_batch_take         (CpBatch        *batch,
                                       const char     *key,
                                       CpTensor       *tensor);

/* Enter and exit @context, asserting that they succeed. */
void       cp_test_enter_ok           (CpContext      *context);
void       cp_test_exit_ok            (CpContext      *context);

/* A local group with one dimension named @dim_name of @size ranks. */
GList     *cp_test_local_group        (const char     *dim_name,
                                       int             size);

void       cp_test_free_group         (GList          *meshes);

/* A tensor whose element i holds a value derived from i and @seed that
 * is exact in every dtype (small integers, 0/1 for booleans), in
 * cp_test_get_device() memory. */
CpTensor  *cp_test_tensor_pattern     (CpDType         dtype,
                                       const gint64   *shape,
                                       guint           n_dims,
                                       guint           seed);

/* Asserts that @tensor has @n_values elements equal to @values. */
void       cp_test_assert_values      (CpTensor       *tensor,
                                       const double   *values,
                                       gsize           n_values);

#define CP_TEST_ASSERT_VALUES(tensor, ...)                                   \
  G_STMT_START {                                                            \
    const double cp_test_values_[] = { __VA_ARGS__ };                      \
    cp_test_assert_values ((tensor), cp_test_values_,                       \
                           G_N_ELEMENTS (cp_test_values_));                 \
  } G_STMT_END

/* A tensor of @shape holding @values (as many as its elements), in
 * cp_test_get_device() memory. */
CpTensor  *cp_test_tensor_new_values  (CpDType         dtype,
                                       const gint64   *shape,
                                       guint           n_dims,
                                       const double   *values);

#define CP_TEST_TENSOR(dtype, shape, ...)                                    \
  cp_test_tensor_new_values ((dtype), (shape), G_N_ELEMENTS (shape),        \
                             (const double[]) { __VA_ARGS__ })

/* Asserts that @tensor has exactly @shape. */
void       cp_test_assert_shape       (CpTensor       *tensor,
                                       const gint64   *shape,
                                       guint           n_dims);

#define CP_TEST_ASSERT_SHAPE(tensor, ...)                                    \
  G_STMT_START {                                                            \
    const gint64 cp_test_shape_[] = { __VA_ARGS__ };                       \
    cp_test_assert_shape ((tensor), cp_test_shape_,                         \
                          G_N_ELEMENTS (cp_test_shape_));                   \
  } G_STMT_END

/* A tensor of a batch as it was: the object, its storage and a copy of
 * its contents, to check later that nothing changed it. */
typedef struct
{
  char *key;
  CpTensor *tensor;
  CpStorage *storage;
  CpTensor *copy;
} CpTestSnapshot;

CpTestSnapshot *cp_test_snapshot_new    (const char     *key,
                                         CpTensor       *tensor);
void       cp_test_snapshot_free      (CpTestSnapshot *snapshot);
/* Asserts that the tensor is the same object over the same storage with
 * the same contents. */
void       cp_test_snapshot_assert_unchanged (const CpTestSnapshot *snapshot);
/* The snapshot of @key in @snapshots, or NULL. */
CpTestSnapshot *cp_test_snapshot_find   (GPtrArray      *snapshots,
                                         const char     *key);

/* Snapshots of every tensor of @batch, in key order. */
GPtrArray *cp_test_snapshot_batch     (CpBatch        *batch);
/* Asserts that @batch has the same keys, in order, each unchanged. */
void       cp_test_assert_batch_unchanged (CpBatch    *batch,
                                           GPtrArray  *snapshots);

/* Resident memory of this process, in KiB (/proc/self/statm). */
gsize      cp_test_resident_kib       (void);

/* Descriptors this process has open (/proc/self/fd). */
gsize      cp_test_open_fds           (void);

/* Records, for doc/reliability.md, that the running test tried @what
 * against @subject and got @error.  The record is a JSON line appended to
 * the file named by $CP_RELIABILITY_LOG; without that variable nothing is
 * written.  The first record of a test process empties the file; start
 * helper processes that record too (ranks of a multi-process test) with
 * CP_RELIABILITY_APPEND=1 so they add to it instead. */
void       cp_test_record_error       (const char     *subject,
                                       const char     *what,
                                       const GError   *error);

/* The same for a case whose outcome is not a GError, such as a
 * connection the peer closes: @outcome reads like "connection closed". */
void       cp_test_record_outcome     (const char     *subject,
                                       const char     *what,
                                       const char     *outcome,
                                       const char     *message);

/* Asserts that @error is (@domain, @code) and records the case.  Every
 * bad-input or fault case a test checks goes through here, so the
 * reliability table lists it. */
#define CP_TEST_ASSERT_CASE(error, domain, code, subject, what)              \
  G_STMT_START {                                                            \
    g_assert_error ((error), (domain), (code));                             \
    cp_test_record_error ((subject), (what), (error));                      \
  } G_STMT_END

/* Every subtest runs in a process of its own, so that a failed assertion
 * (which aborts) or a crash fails that subtest alone and the program goes
 * on to report every other one.  The test files keep calling GLib's
 * registration functions; these macros route them through a proxy that
 * runs the subtest in a GTest subprocess and turns its exit into a pass,
 * a failure or a skip of the parent's subtest.  CP_TEST_IN_PROCESS=1 in
 * the environment (the valgrind setup sets it, since memcheck does not
 * follow the subprocesses) runs every subtest in the one process. */
void       cp_test_add_func_isolated  (const char     *path,
                                       GTestFunc       func);
void       cp_test_add_data_func_isolated (const char     *path,
                                           gconstpointer   data,
                                           GTestDataFunc   func);
/* @data stays reachable until exit and @destroy is never called: the
 * child process of another subtest never runs this one. */
void       cp_test_add_data_func_full_isolated (const char     *path,
                                                gpointer        data,
                                                GTestDataFunc   func,
                                                GDestroyNotify  destroy);
/* For a subtest that starts GTest subprocesses of its own (to watch a
 * critical abort, say): it always runs in the test program's process. */
void       cp_test_add_func_in_process (const char     *path,
                                        GTestFunc       func);
/* Skips the running subtest; from an isolated subtest the parent reports
 * the skip. */
void       cp_test_skip               (const char     *message);

#define g_test_add_func(path, func) cp_test_add_func_isolated ((path), (func))
#define g_test_add_data_func(path, data, func)                               \
  cp_test_add_data_func_isolated ((path), (data), (func))
#define g_test_add_data_func_full(path, data, func, destroy)                \
  cp_test_add_data_func_full_isolated ((path), (data), (func), (destroy))
#define g_test_skip(message) cp_test_skip (message)

G_END_DECLS
