/* test-fault-device.c: a device that fails under every operation
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 *
 * Every public operation that moves tensor bytes is run on test memory
 * with its first, second, … copy or fill failing, as a device's copy
 * engine can (_cp_fault_fail_device), until it runs out of copies to
 * fail.  Each run either fails with CP_TENSOR_ERROR_DEVICE, having hit
 * the fault, or succeeds with the bytes of a run without faults, having
 * not: a failed copy never comes back as success.
 */

#include <string.h>

#include "cp-fault-private.h"
#include "cp-memory-private.h"
#include "cp-tensor-private.h"
#include "cp-test-util.h"

typedef gboolean (*Operation) (CpMesh     *mesh,
                               CpTensor  **out,
                               GError    **error);

static CpTensor *
pattern_on_test (CpDType       dtype,
                 const gint64 *shape,
                 guint         n_dims,
                 guint         seed)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) host = NULL;
  CpTensor *test;

  _cp_fault_disarm ();
  host = cp_test_tensor_pattern (dtype, shape, n_dims, seed);
  test = cp_tensor_to_device (host, CP_DEVICE_KIND_TEST, &error);
  g_assert_no_error (error);
  return test;
}

/* The sources are made before the fault is armed: only the operation's
 * own copies fail. */
typedef struct
{
  CpTensor *a;       /* float32 [4, 24, 3] */
  CpLayout *layout;  /* head-tail, 24 positions, 2 ranks */
} Inputs;

static Inputs inputs;

/* For operations that make inputs of their own first: the fault after
 * the number of copies the sweep is at. */
static void
arm (CpMesh *mesh)
{
  _cp_fault_fail_device (GPOINTER_TO_UINT (g_object_get_data (G_OBJECT (mesh), "skip")));
}

static gboolean
op_copy (CpMesh *mesh, CpTensor **out, GError **error)
{
  return (*out = cp_tensor_copy (inputs.a, error)) != NULL;
}

static gboolean
op_to_host (CpMesh *mesh, CpTensor **out, GError **error)
{
  return (*out = cp_tensor_to_device (inputs.a, CP_DEVICE_KIND_HOST, error)) != NULL;
}

static gboolean
op_narrow (CpMesh *mesh, CpTensor **out, GError **error)
{
  return (*out = cp_tensor_narrow (inputs.a, 1, 5, 11, error)) != NULL;
}

static gboolean
op_shard (CpMesh *mesh, CpTensor **out, GError **error)
{
  return (*out = cp_layout_shard (inputs.layout, inputs.a, 1, 1, error)) != NULL;
}

static gboolean
op_shard_backward (CpMesh *mesh, CpTensor **out, GError **error)
{
  g_autoptr(CpTensor) piece = cp_tensor_narrow (inputs.a, 1, 0, 12, NULL);

  arm (mesh);
  return (*out = cp_layout_shard_backward (inputs.layout, piece, 1, 0, error)) != NULL;
}

static gboolean
op_unshard_pieces (CpMesh *mesh, CpTensor **out, GError **error)
{
  CpTensor *pieces[2];
  gboolean ok;

  pieces[0] = cp_tensor_narrow (inputs.a, 1, 0, 12, NULL);
  pieces[1] = cp_tensor_narrow (inputs.a, 1, 12, 12, NULL);
  arm (mesh);
  ok = (*out = cp_layout_unshard_pieces (inputs.layout, pieces, 2, 1, error)) != NULL;
  g_object_unref (pieces[0]);
  g_object_unref (pieces[1]);
  return ok;
}

/* Padding and position synthesis: an expanded [1, S] position row and
 * labels padded to 2·C. */
static gboolean
op_prepare (CpMesh *mesh, CpTensor **out, GError **error)
{
  const gint64 ids_shape[] = { 3, 7 };
  const gint64 row_shape[] = { 1, 7 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) ids = pattern_on_test (CP_DTYPE_INT64, ids_shape, 2, 3);
  g_autoptr(CpTensor) labels = pattern_on_test (CP_DTYPE_INT64, ids_shape, 2, 4);
  g_autoptr(CpTensor) positions = pattern_on_test (CP_DTYPE_INT64, row_shape, 2, 5);
  g_autoptr(CpContext) context = NULL;

  cp_batch_set (batch, "input_ids", ids);
  cp_batch_set (batch, "labels", labels);
  cp_batch_set (batch, "position_ids", positions);
  arm (mesh);
  context = cp_batch_prepare (batch, mesh, NULL, error);
  if (context == NULL)
    return FALSE;
  *out = g_object_ref (cp_batch_get (batch, "position_ids"));
  return TRUE;
}

static gboolean
op_attention (CpMesh *mesh, CpTensor **out, GError **error)
{
  const gint64 shape[] = { 1, 2, 8, 4 };
  g_autoptr(CpTensor) q = pattern_on_test (CP_DTYPE_FLOAT32, shape, 4, 1);
  g_autoptr(CpTensor) k = pattern_on_test (CP_DTYPE_FLOAT32, shape, 4, 2);
  g_autoptr(CpTensor) v = pattern_on_test (CP_DTYPE_FLOAT32, shape, 4, 3);
  g_autoptr(CpAttention) attention = cp_attention_new (mesh, NULL, NULL);

  arm (mesh);
  return cp_attention_forward (attention, q, k, v, out, NULL, error);
}

static gboolean
op_all_gather (CpMesh *mesh, CpTensor **out, GError **error)
{
  return (*out = cp_mesh_all_gather (mesh, inputs.a, 1, error)) != NULL;
}

typedef struct
{
  const char *name;
  Operation op;
  /* Arms the fault itself, after making its inputs. */
  gboolean arms_itself;
  /* 2: both ranks of a group run it, each with its own failing copy at
   * the same point; they copy the same, so they stop together. */
  int ranks;
} Case;

static const Case cases[] = {
  { "copy", op_copy, FALSE, 1 },
  { "to-host", op_to_host, FALSE, 1 },
  { "narrow", op_narrow, FALSE, 1 },
  { "shard", op_shard, FALSE, 1 },
  { "shard-backward", op_shard_backward, TRUE, 1 },
  { "unshard-pieces", op_unshard_pieces, TRUE, 1 },
  { "all-gather", op_all_gather, FALSE, 2 },
  { "prepare", op_prepare, TRUE, 2 },
  { "attention", op_attention, TRUE, 2 },
};

static CpTensor *
host_copy_of (CpTensor *tensor)
{
  g_autoptr(GError) error = NULL;
  CpTensor *host;

  _cp_fault_disarm ();
  host = cp_tensor_to_device (tensor, CP_DEVICE_KIND_HOST, &error);
  g_assert_no_error (error);
  return host;
}

/* One run with the fault after @skip copies; TRUE when it succeeded. */
static gboolean
run_once (const Case *c,
          CpMesh     *mesh,
          guint       skip,
          CpTensor   *want)
{
  g_autoptr(CpTensor) out = NULL;
  g_autoptr(GError) error = NULL;
  gboolean ok, pending;

  g_object_set_data (G_OBJECT (mesh), "skip", GUINT_TO_POINTER (skip));
  if (!c->arms_itself)
    _cp_fault_fail_device (skip);
  ok = c->op (mesh, &out, &error);
  pending = _cp_fault_device_pending ();
  _cp_fault_disarm ();
  if (!ok)
    {
      g_autofree char *what = g_strdup_printf ("%s with a device copy that fails", c->name);

      g_assert_false (pending);
      if (skip == 0 && cp_mesh_get_rank (mesh) == 0)
        CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE, "CpMemory", what);
      g_assert_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE);
      g_assert_nonnull (strstr (error->message, "injected device fault"));
      return FALSE;
    }
  g_assert_no_error (error);
  /* Success only where no copy failed, with the bytes of a clean run. */
  g_assert_true (pending);
  if (want != NULL)
    {
      g_autoptr(CpTensor) got = host_copy_of (out);

      g_assert_true (cp_tensor_equal (got, want));
    }
  return TRUE;
}

static void
sweep (const Case *c,
       CpMesh     *mesh)
{
  g_autoptr(CpTensor) out = NULL;
  g_autoptr(CpTensor) want = NULL;
  g_autoptr(GError) error = NULL;
  guint skip = 0;

  g_object_set_data (G_OBJECT (mesh), "skip", GUINT_TO_POINTER (G_MAXINT));
  g_assert_true (c->op (mesh, &out, &error));
  g_assert_no_error (error);
  _cp_fault_disarm ();
  want = host_copy_of (out);
  while (!run_once (c, mesh, skip, want))
    skip++;
  /* Every operation here copies at least once. */
  g_assert_cmpuint (skip, >, 0);
}

static void
sweep_rank (CpMesh   *mesh,
            gpointer  data)
{
  cp_mesh_set_timeout_ms (mesh, 20000);
  sweep (data, mesh);
}

static void
test_case (gconstpointer data)
{
  const Case *c = data;
  const gint64 shape[] = { 4, 24, 3 };
  GList *meshes = cp_test_local_group ("cp", c->ranks);

  inputs.a = pattern_on_test (CP_DTYPE_FLOAT32, shape, 3, 0);
  inputs.layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 24, 2, NULL);
  if (c->ranks == 1)
    sweep (c, meshes->data);
  else
    cp_test_run_ranks (meshes, sweep_rank, (gpointer) c);
  g_clear_object (&inputs.a);
  g_clear_pointer (&inputs.layout, cp_layout_unref);
  cp_test_free_group (meshes);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/Cp/Memory/fault/device/%s", cases[i].name);

      g_test_add_data_func (path, &cases[i], test_case);
    }
  return g_test_run ();
}
