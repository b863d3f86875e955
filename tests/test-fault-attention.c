/* test-fault-attention.c: CpAttention when host memory runs out
 *
 * Linked with the fault-injection variant of the library
 * (cp-fault-private.h).  Three ranks run a forward or a backward while
 * the host allocations of one of them fail, each in turn: every rank
 * must fail with OUT_OF_MEMORY (the ranks allocate before they agree to
 * go ahead, and a collective that cannot allocate fails them all), keep
 * its inputs as they were, never abort, and leak nothing (the ASan run
 * checks that part).  Once the failures run out the call must succeed,
 * with the result of a run that had no fault.
 *
 * Suite 'jit': oneDNN's generated kernels keep it out of the valgrind
 * and ThreadSanitizer runs, as the other attention tests.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "cp-fault-private.h"
#include "cp-test-util.h"

#define RANKS 3
#define FAULTY_RANK 1
#define N_HEADS 4
#define N_KV_HEADS 2
#define LOCAL_LEN 4
#define HEAD_DIM 8

typedef struct
{
  CpDType dtype;
  CpRotateMethod rotate;
  gboolean backward;       /* the fault strikes backward, not forward */
  const char *what;        /* for the reliability table */
} Config;

typedef struct
{
  const Config *config;
  gint skip;               /* allocations of the faulty rank that succeed first; −1: none fail */
  GError *errors[RANKS];
  gboolean intact[RANKS];
  CpTensor *results[RANKS];  /* out, or dq, of each rank that succeeded */
} Run;

static CpTensor *
input (CpDType dtype,
       int     heads,
       guint   seed)
{
  const gint64 shape[] = { 1, heads, LOCAL_LEN, HEAD_DIM };

  return cp_test_tensor_pattern (dtype, shape, G_N_ELEMENTS (shape), seed);
}

static CpAttention *
attention_new (CpMesh       *mesh,
               const Config *config)
{
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(GError) error = NULL;
  CpAttention *attention;

  cp_attention_options_set_heads (options, N_HEADS, N_KV_HEADS);
  cp_attention_options_set_rotate_method (options, config->rotate);
  attention = cp_attention_new (mesh, options, &error);
  g_assert_no_error (error);
  return attention;
}

static gboolean
tensors_equal (CpTensor * const *a,
               CpTensor * const *b,
               guint             n)
{
  for (guint i = 0; i < n; i++)
    if (!cp_tensor_equal (a[i], b[i]))
      return FALSE;
  return TRUE;
}

/* Forward runs unharmed first when the fault is for backward. */
static void
run_rank (CpMesh   *mesh,
          gpointer  data)
{
  Run *run = data;
  const Config *config = run->config;
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpAttention) attention = attention_new (mesh, config);
  CpTensor *inputs[] = {
    input (config->dtype, N_HEADS, 4 * rank + 1), input (config->dtype, N_KV_HEADS, 4 * rank + 2),
    input (config->dtype, N_KV_HEADS, 4 * rank + 3), input (config->dtype, N_HEADS, 4 * rank + 4),
  };
  CpTensor *before[G_N_ELEMENTS (inputs)];
  g_autoptr(CpTensor) out = NULL, lse = NULL, dq = NULL, dk = NULL, dv = NULL;
  gboolean ok;

  for (guint i = 0; i < G_N_ELEMENTS (inputs); i++)
    before[i] = cp_tensor_copy (inputs[i], NULL);
  if (config->backward)
    g_assert_true (cp_attention_forward (attention, inputs[0], inputs[1], inputs[2], &out, &lse, NULL));
  if (rank == FAULTY_RANK && run->skip >= 0)
    _cp_fault_fail_allocation ((guint) run->skip);
  if (config->backward)
    ok = cp_attention_backward (attention, inputs[3], inputs[0], inputs[1], inputs[2], out, lse,
                                &dq, &dk, &dv, &run->errors[rank]);
  else
    ok = cp_attention_forward (attention, inputs[0], inputs[1], inputs[2], &out, &lse,
                               &run->errors[rank]);
  if (rank == FAULTY_RANK)
    _cp_fault_disarm ();
  g_assert_true (ok == (run->errors[rank] == NULL));
  if (ok)
    run->results[rank] = g_object_ref (config->backward ? dq : out);
  run->intact[rank] = tensors_equal (inputs, before, G_N_ELEMENTS (inputs));
  for (guint i = 0; i < G_N_ELEMENTS (inputs); i++)
    {
      g_object_unref (inputs[i]);
      g_object_unref (before[i]);
    }
}

static void
run_clear (Run *run)
{
  for (int r = 0; r < RANKS; r++)
    {
      g_clear_error (&run->errors[r]);
      g_clear_object (&run->results[r]);
    }
}

static void
run_with_skip (Run          *run,
               const Config *config,
               gint          skip)
{
  *run = (Run) { config, skip };
  cp_test_run_group ("cp", RANKS, run_rank, run);
}

/* Every rank failed with OUT_OF_MEMORY, or every rank succeeded with
 * @clean's results; every rank's inputs intact.  Returns whether they
 * failed. */
static gboolean
assert_outcome (Run *run,
                Run *clean)
{
  gboolean failed = run->errors[FAULTY_RANK] != NULL;

  for (int r = 0; r < RANKS; r++)
    {
      g_assert_true (run->intact[r]);
      if (!failed)
        {
          g_assert_no_error (run->errors[r]);
          g_assert_true (cp_tensor_equal (run->results[r], clean->results[r]));
          continue;
        }
      CP_TEST_ASSERT_CASE (run->errors[r], CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY,
                           "CpAttention", run->config->what);
    }
  return failed;
}

static void
test_alloc (gconstpointer data)
{
  const Config *config = data;
  Run clean, run;
  guint failures = 0;

  g_test_summary ("A host allocation that fails anywhere in a CpAttention call on one rank "
                  "fails every rank with OUT_OF_MEMORY, never an abort or a hang, inputs intact");
  run_with_skip (&clean, config, -1);
  for (int r = 0; r < RANKS; r++)
    g_assert_no_error (clean.errors[r]);
  for (gint skip = 0;; skip++)
    {
      gboolean failed;

      run_with_skip (&run, config, skip);
      failed = assert_outcome (&run, &clean);
      run_clear (&run);
      if (!failed)
        break;
      failures++;
    }
  g_test_message ("%u allocations of rank %d, each failed once", failures, FAULTY_RANK);
  g_assert_cmpuint (failures, >=, 3);
  run_clear (&clean);
}

static const Config configs[] = {
  { CP_DTYPE_FLOAT32, CP_ROTATE_METHOD_ALLGATHER, FALSE,
    "fault: each allocation of one rank fails in turn during forward (all-gather, float32; every rank)" },
  { CP_DTYPE_BFLOAT16, CP_ROTATE_METHOD_ALLTOALL, FALSE,
    "fault: each allocation of one rank fails in turn during forward (ring, bfloat16; every rank)" },
  { CP_DTYPE_FLOAT32, CP_ROTATE_METHOD_ALLTOALL, TRUE,
    "fault: each allocation of one rank fails in turn during backward (ring, float32; every rank)" },
  { CP_DTYPE_BFLOAT16, CP_ROTATE_METHOD_ALLGATHER, TRUE,
    "fault: each allocation of one rank fails in turn during backward (all-gather, bfloat16; every rank)" },
};

int
main (int    argc,
      char **argv)
{
  static const char *paths[] = {
    "/Cp/Fault/attention/alloc/forward-allgather-float32",
    "/Cp/Fault/attention/alloc/forward-ring-bfloat16",
    "/Cp/Fault/attention/alloc/backward-ring-float32",
    "/Cp/Fault/attention/alloc/backward-allgather-bfloat16",
  };

  g_test_init (&argc, &argv, NULL);
  for (guint i = 0; i < G_N_ELEMENTS (configs); i++)
    g_test_add_data_func (paths[i], &configs[i], test_alloc);
  return g_test_run ();
}
