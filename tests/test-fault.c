/* test-fault.c: injected faults on the in-process mesh
 *
 * Linked with the fault-injection variant of the library
 * (cp-fault-private.h).  Three ranks run a collective, or a context's
 * enter, while one of them suffers a fault at a chosen step; every
 * surviving rank must fail with the documented error within a bound,
 * keep its tensors as they were, and leak nothing (the valgrind and ASan
 * runs of this test check that last part).
 *
 * The bounds: a rank that is lost is noticed at once (well under the
 * timeout); a rank that never arrives costs its peers the timeout.  Each
 * case reports the times it measured.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "cp-fault-private.h"
#include "cp-test-util.h"

#define RANKS 3
#define TIMEOUT_MS 800
/* What a loaded machine (valgrind, sanitizers, 2 cores) may add to a
 * bound. */
#define SLACK_MS 2000
/* Past this a case has hung: it fails then, not when Meson kills it. */
#define LIMIT_MS (4 * TIMEOUT_MS + 2 * SLACK_MS)

typedef struct
{
  GError *error;
  gint64 elapsed_us;
  gboolean intact;
} Outcome;

typedef struct
{
  CpFault fault;
  int alloc_rank;          /* -1, or the rank whose next host allocation fails */
  Outcome outcomes[RANKS];
} Case;

typedef gboolean (*Step) (CpMesh    *mesh,
                          CpTensor  *tensor,
                          GError   **error);

/* A warm-up barrier (the fault counts it as operation 1), then @step on
 * a tensor of this rank's, timed, with the tensor compared to a copy
 * taken before. */
static void
run_rank (CpMesh   *mesh,
          Case     *c,
          Step      step)
{
  int rank = cp_mesh_get_rank (mesh);
  const gint64 shape[] = { 6, 4 };
  g_autoptr(CpTensor) tensor = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 2, (guint) rank);
  g_autoptr(CpTensor) before = cp_tensor_copy (tensor, NULL);
  g_autoptr(GError) error = NULL;
  Outcome *outcome = &c->outcomes[rank];
  gint64 started;

  cp_mesh_set_timeout_ms (mesh, TIMEOUT_MS);
  g_assert_true (cp_mesh_barrier (mesh, &error));
  g_assert_no_error (error);
  if (rank == c->alloc_rank)
    _cp_fault_fail_allocation (0);
  started = g_get_monotonic_time ();
  if (!step (mesh, tensor, &outcome->error))
    g_assert_nonnull (outcome->error);
  outcome->elapsed_us = g_get_monotonic_time () - started;
  outcome->intact = cp_tensor_equal (tensor, before);
}

static gboolean
step_all_gather (CpMesh    *mesh,
                 CpTensor  *tensor,
                 GError   **error)
{
  g_autoptr(CpTensor) out = cp_mesh_all_gather (mesh, tensor, 0, error);

  return out != NULL;
}

static gboolean
step_all_reduce (CpMesh    *mesh,
                 CpTensor  *tensor,
                 GError   **error)
{
  return cp_mesh_all_reduce (mesh, tensor, CP_REDUCE_OP_SUM, error);
}

/* Registers the tensor as a restorable buffer of a context, along its
 * first dimension, and enters. */
static gboolean
step_enter (CpMesh    *mesh,
            CpTensor  *tensor,
            GError   **error)
{
  g_autoptr(CpContext) context = cp_context_new (mesh, CP_ROTATE_METHOD_ALLGATHER);

  return cp_context_register_buffer (context, tensor, 0, TRUE, error) &&
         cp_context_enter (context, error) && cp_context_exit (context, error);
}

static Step step_func;

static void
rank_func (CpMesh   *mesh,
           gpointer  user_data)
{
  run_rank (mesh, user_data, step_func);
}

static void
run_case (Case *c,
          Step  step)
{
  step_func = step;
  if (c->fault.kind != CP_FAULT_NONE)
    _cp_fault_arm (&c->fault);
  cp_test_run_group_within ("cp", RANKS, rank_func, c, LIMIT_MS);
  _cp_fault_disarm ();
}

static void
case_clear (Case *c)
{
  for (int r = 0; r < RANKS; r++)
    g_clear_error (&c->outcomes[r].error);
}

/* Every rank but @skip failed with @code, within @bound_ms, its tensor
 * intact; the case is recorded once. */
static void
assert_survivors (Case       *c,
                  int         skip,
                  GQuark      domain,
                  int         code,
                  gint64      bound_ms,
                  const char *what)
{
  for (int r = 0; r < RANKS; r++)
    {
      Outcome *outcome = &c->outcomes[r];

      if (r == skip)
        continue;
      g_test_message ("rank %d: %s after %" G_GINT64_FORMAT " ms", r,
                      outcome->error ? outcome->error->message : "success", outcome->elapsed_us / 1000);
      g_assert_error (outcome->error, domain, code);
      g_assert_cmpint (outcome->elapsed_us / 1000, <=, bound_ms);
      g_assert_true (outcome->intact);
    }
  CP_TEST_ASSERT_CASE (c->outcomes[skip == 0 ? 1 : 0].error, domain, code, "CpMesh (in-process)", what);
}

static CpFault
fault_at_arrival (CpFaultKind kind,
                  guint       delay_ms)
{
  return (CpFault) { kind, "local", 1, 2, CP_FAULT_STEP_DESCRIPTOR, delay_ms };
}

static void
test_kill (void)
{
  Case c = { fault_at_arrival (CP_FAULT_KILL, 0), -1 };

  g_test_summary ("A rank that dies instead of arriving at an all_gather fails its peers "
                  "with PEER_LOST at once, not at the timeout");
  run_case (&c, step_all_gather);
  assert_survivors (&c, 1, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, TIMEOUT_MS / 2 + SLACK_MS,
                    "fault: a rank dies at its arrival at an all_gather (its peers)");
  case_clear (&c);
}

static void
test_kill_enter (void)
{
  Case c = { fault_at_arrival (CP_FAULT_KILL, 0), -1 };

  g_test_summary ("A rank that dies during cp_context_enter leaves every buffer of the "
                  "others unsharded");
  run_case (&c, step_enter);
  assert_survivors (&c, 1, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, TIMEOUT_MS / 2 + SLACK_MS,
                    "fault: a rank dies during cp_context_enter (its peers; no buffer sharded)");
  case_clear (&c);
}

static void
test_drop (void)
{
  Case c = { fault_at_arrival (CP_FAULT_DROP, 0), -1 };

  g_test_summary ("A rank whose arrival is lost makes every rank, itself included, fail "
                  "with TIMED_OUT at the timeout");
  run_case (&c, step_all_gather);
  assert_survivors (&c, -1, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, TIMEOUT_MS + SLACK_MS,
                    "fault: a rank's arrival at an all_gather is lost (every rank)");
  for (int r = 0; r < RANKS; r++)
    g_assert_cmpint (c.outcomes[r].elapsed_us / 1000, >=, TIMEOUT_MS / 2);
  case_clear (&c);
}

static void
test_delay_within (void)
{
  Case c = { fault_at_arrival (CP_FAULT_DELAY, TIMEOUT_MS / 4), -1 };

  g_test_summary ("A rank late by less than the timeout costs time, not the result");
  run_case (&c, step_all_reduce);
  for (int r = 0; r < RANKS; r++)
    {
      g_assert_no_error (c.outcomes[r].error);
      g_assert_cmpint (c.outcomes[r].elapsed_us / 1000, >=, r == 1 ? 0 : TIMEOUT_MS / 4 - 50);
    }
  case_clear (&c);
}

static void
test_delay_past (void)
{
  Case c = { fault_at_arrival (CP_FAULT_DELAY, TIMEOUT_MS * 2), -1 };

  g_test_summary ("A rank late by more than the timeout: its peers time out, and it fails "
                  "at once with the same error when it arrives");
  run_case (&c, step_all_reduce);
  assert_survivors (&c, -1, CP_MESH_ERROR, CP_MESH_ERROR_TIMED_OUT, 2 * TIMEOUT_MS + SLACK_MS,
                    "fault: a rank arrives at an all_reduce later than the timeout (every rank)");
  case_clear (&c);
}

static void
test_alloc_all_reduce (void)
{
  Case c = { { CP_FAULT_NONE }, 1 };

  g_test_summary ("A rank that cannot allocate its all_reduce scratch fails every rank "
                  "with OUT_OF_MEMORY before any data moves");
  run_case (&c, step_all_reduce);
  assert_survivors (&c, -1, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY, TIMEOUT_MS + SLACK_MS,
                    "fault: a rank's all_reduce scratch allocation fails (every rank; tensors unchanged)");
  case_clear (&c);
}

static void
test_alloc_all_gather (void)
{
  Case c = { { CP_FAULT_NONE }, 1 };

  run_case (&c, step_all_gather);
  assert_survivors (&c, -1, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY, TIMEOUT_MS + SLACK_MS,
                    "fault: a rank's all_gather output allocation fails (every rank)");
  case_clear (&c);
}

static void
test_alloc_enter (void)
{
  Case c = { { CP_FAULT_NONE }, 1 };

  g_test_summary ("A rank that cannot allocate its local piece during enter fails every "
                  "rank, and no rank shards anything");
  run_case (&c, step_enter);
  assert_survivors (&c, -1, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY, TIMEOUT_MS + SLACK_MS,
                    "fault: a rank's allocation fails during cp_context_enter (every rank; no buffer sharded)");
  case_clear (&c);
}

/* A batch whose padding cannot be allocated on rank 1 fails on every
 * rank, and every rank's batch is left as it was. */
static void
alloc_prepare_rank (CpMesh   *mesh,
                    gpointer  user_data)
{
  g_autoptr(CpBatch) batch = cp_batch_new ();
  const gint64 shape[] = { 2, 7 };
  g_autoptr(CpTensor) ids = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 1);
  g_autoptr(CpTensor) labels = cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 2);
  g_autoptr(CpTensor) ids_before = cp_tensor_copy (ids, NULL);
  g_autoptr(CpTensor) labels_before = cp_tensor_copy (labels, NULL);
  g_autoptr(CpContext) context = NULL;
  g_autoptr(GError) error = NULL;

  cp_batch_set (batch, "input_ids", ids);
  cp_batch_set (batch, "labels", labels);
  /* The first allocation is input_ids' padding; the second, labels'. */
  if (cp_mesh_get_rank (mesh) == 1)
    _cp_fault_fail_allocation (1);
  context = cp_batch_prepare (batch, mesh, NULL, &error);
  g_assert_null (context);
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY, "CpBatch",
                       "fault: an allocation fails on one rank while cp_batch_prepare pads "
                       "(every rank; batches unchanged)");
  g_assert_true (cp_tensor_equal (ids, ids_before));
  g_assert_true (cp_tensor_equal (labels, labels_before));
  g_assert_cmpuint (cp_batch_get_n_keys (batch), ==, 2);
  g_assert_false (cp_batch_contains (batch, "position_ids"));
}

static void
test_alloc_prepare (void)
{
  cp_test_run_group ("cp", 2, alloc_prepare_rank, NULL);
}

/* A 1×8 batch of two documents of 3 real and 4 padded tokens. */
static CpBatch *
thd_batch (void)
{
  const gint64 row[] = { 1, 8 }, docs[] = { 1, 2 };
  CpBatch *batch = cp_batch_new ();

  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, row, 2, 1));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, row, 2, 2));
  cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, row, 2, 3));
  cp_test_batch_take (batch, "seq_lens", CP_TEST_TENSOR (CP_DTYPE_INT64, docs, 3, 3));
  cp_test_batch_take (batch, "seq_lens_padded", CP_TEST_TENSOR (CP_DTYPE_INT64, docs, 4, 4));
  return batch;
}

/* Fails each host allocation of one sharded cp_batch_to_thd in turn:
 * every failure is OUT_OF_MEMORY and leaves the input batch as it was. */
static void
test_alloc_to_thd (void)
{
  GList *group = cp_test_local_group ("cp", 2);
  g_autoptr(CpBatch) batch = thd_batch ();
  g_autoptr(CpTensor) ids_before = cp_tensor_copy (cp_batch_get (batch, "input_ids"), NULL);
  guint failures = 0;

  g_test_summary ("An allocation that fails anywhere in cp_batch_to_thd is OUT_OF_MEMORY, "
                  "never an abort, and the input batch is untouched");
  for (guint skip = 0;; skip++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpBatch) thd = NULL;

      _cp_fault_fail_allocation (skip);
      thd = cp_batch_to_thd (batch, group->data, NULL, &error);
      _cp_fault_disarm ();
      if (thd != NULL)
        break;
      CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY, "CpBatch (THD)",
                           "fault: each allocation of a sharded cp_batch_to_thd fails in turn");
      g_assert_true (cp_tensor_equal (cp_batch_get (batch, "input_ids"), ids_before));
      g_assert_cmpuint (cp_batch_get_n_keys (batch), ==, 5);
      failures++;
    }
  g_test_message ("%u allocations, each failed once", failures);
  g_assert_cmpuint (failures, >=, 8);
  cp_test_free_group (group);
}

/* After a peer is lost the communicator stays failed: later calls fail
 * at once, naming the first error. */
static void
later_call (CpMesh   *mesh,
            gpointer  user_data)
{
  Case *c = user_data;
  int rank = cp_mesh_get_rank (mesh);
  gint64 started;

  cp_mesh_set_timeout_ms (mesh, TIMEOUT_MS);
  run_rank (mesh, c, step_all_gather);
  if (rank == 1)
    return;
  g_clear_error (&c->outcomes[rank].error);
  started = g_get_monotonic_time ();
  g_assert_false (cp_mesh_barrier (mesh, &c->outcomes[rank].error));
  c->outcomes[rank].elapsed_us = g_get_monotonic_time () - started;
}

static void
test_stays_failed (void)
{
  Case c = { fault_at_arrival (CP_FAULT_KILL, 0), -1 };

  _cp_fault_arm (&c.fault);
  cp_test_run_group_within ("cp", RANKS, later_call, &c, LIMIT_MS);
  _cp_fault_disarm ();
  assert_survivors (&c, 1, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, SLACK_MS,
                    "fault: a collective after a rank died (fails at once)");
  case_clear (&c);
}

/* A peer whose mesh is gone has left the group: point-to-point traffic
 * with it fails at once. */
static void
test_peer_left (void)
{
  const char *names[] = { "cp", NULL };
  int sizes[] = { 2 };
  g_autoptr(GError) error = NULL;
  GList *group = cp_mesh_new_local_group (names, sizes, 1, &error);
  CpMesh *mesh = group->data;
  const gint64 shape[] = { 4 };
  g_autoptr(CpTensor) tensor = cp_test_tensor_pattern (CP_DTYPE_INT32, shape, 1, 3);
  g_autoptr(CpTensor) before = cp_tensor_copy (tensor, NULL);
  gint64 started;

  g_assert_no_error (error);
  g_object_unref (group->next->data);
  group = g_list_delete_link (group, group->next);
  started = g_get_monotonic_time ();
  g_assert_false (cp_mesh_recv (mesh, tensor, 1, 5, &error));
  g_assert_cmpint (g_get_monotonic_time () - started, <, SLACK_MS * G_TIME_SPAN_MILLISECOND);
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, "CpMesh (in-process)",
                       "recv from a rank whose mesh was freed");
  g_assert_true (cp_tensor_equal (tensor, before));
  g_clear_error (&error);
  g_assert_false (cp_mesh_send (mesh, tensor, 1, 5, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, "CpMesh (in-process)",
                       "send to a rank whose mesh was freed");
  g_clear_error (&error);
  g_assert_false (cp_mesh_barrier (mesh, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_PEER_LOST, "CpMesh (in-process)",
                       "a collective with a rank whose mesh was freed");
  cp_test_free_group (group);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Fault/local/kill/all-gather", test_kill);
  g_test_add_func ("/Cp/Fault/local/kill/enter", test_kill_enter);
  g_test_add_func ("/Cp/Fault/local/kill/stays-failed", test_stays_failed);
  g_test_add_func ("/Cp/Fault/local/drop/all-gather", test_drop);
  g_test_add_func ("/Cp/Fault/local/delay/within-timeout", test_delay_within);
  g_test_add_func ("/Cp/Fault/local/delay/past-timeout", test_delay_past);
  g_test_add_func ("/Cp/Fault/local/alloc/all-reduce", test_alloc_all_reduce);
  g_test_add_func ("/Cp/Fault/local/alloc/all-gather", test_alloc_all_gather);
  g_test_add_func ("/Cp/Fault/local/alloc/enter", test_alloc_enter);
  g_test_add_func ("/Cp/Fault/local/alloc/prepare", test_alloc_prepare);
  g_test_add_func ("/Cp/Fault/local/alloc/to-thd", test_alloc_to_thd);
  g_test_add_func ("/Cp/Fault/local/left/p2p", test_peer_left);

  return g_test_run ();
}
