/* test-attention-routed.c: the attention ring's hand-overs take the
 * communicator the mesh routes their memory to
 *
 * Linked with the test variant of the library, which has the loopback
 * backend.  A local group whose host memory is routed to loopback
 * transports (its agreements staying on the local one) runs ring
 * attention: every K/V and dK/dV hand-over must be a loopback send, and
 * the results must be those of the plain local group.
 *
 * Suite 'jit': oneDNN's generated kernels keep it out of the valgrind
 * and ThreadSanitizer runs, as the other attention tests.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-test-util.h"
#include "cp-mesh-private.h"

#define RANKS 3
#define N_HEADS 4
#define N_KV_HEADS 2
#define LOCAL_LEN 4
#define HEAD_DIM 8

typedef struct
{
  int rank;
  guint port;
  CpMesh *mesh;
  GError *error;
} Join;

static gpointer
join_loopback (gpointer data)
{
  Join *join = data;
  g_autoptr(CpMeshOptions) options = g_object_new (CP_TYPE_MESH_OPTIONS, "rank", join->rank,
                                                   "world-size", RANKS, "port", join->port,
                                                   "timeout-ms", 20000, "transport", "loopback",
                                                   NULL);

  join->mesh = cp_mesh_new_with_options (options, &join->error);
  return NULL;
}

/* A local group of RANKS whose host memory moves over loopback
 * transports. */
static GList *
routed_group (void)
{
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_test_local_group ("cp", RANKS);
  Join joins[RANKS];
  GThread *threads[RANKS];
  GList *l = meshes;

  cp_harness_set_up_glib ();
  for (int r = 0; r < RANKS; r++)
    {
      joins[r] = (Join) { r, 1, NULL, NULL };
      threads[r] = g_thread_new ("join", join_loopback, &joins[r]);
    }
  for (int r = 0; r < RANKS; r++, l = l->next)
    {
      g_thread_join (threads[r]);
      g_assert_no_error (joins[r].error);
      g_assert_true (_cp_mesh_add_transport (l->data, _cp_mesh_get_comm (joins[r].mesh)->transport,
                                             &error));
      g_assert_no_error (error);
      g_object_unref (joins[r].mesh);
    }
  return meshes;
}

static void
note_loopback (CpTransport *transport,
               gpointer     found)
{
  if (g_str_equal (_cp_transport_get_name (transport), "loopback"))
    *(CpTransport **) found = transport;
}

/* The sends the loopback transport of @mesh posted; 0 when it has none. */
static guint
loopback_sends (CpMesh *mesh)
{
  CpTransport *loopback = NULL;

  _cp_mesh_foreach_transport (mesh, note_loopback, &loopback);
  return loopback != NULL ? _cp_transport_loopback_count_sends (loopback) : 0;
}

typedef struct
{
  CpTensor *out[RANKS];
  CpTensor *dq[RANKS];
  CpTensor *dkv[RANKS][2];
  guint sends[RANKS];
} Run;

static CpTensor *
input (int   heads,
       guint seed)
{
  const gint64 shape[] = { 1, heads, LOCAL_LEN, HEAD_DIM };

  return cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, G_N_ELEMENTS (shape), seed);
}

static void
run_rank (CpMesh   *mesh,
          gpointer  data)
{
  Run *run = data;
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(GError) error = NULL;
  g_autoptr(CpAttention) attention = NULL;
  g_autoptr(CpTensor) q = input (N_HEADS, 4 * rank + 1);
  g_autoptr(CpTensor) k = input (N_KV_HEADS, 4 * rank + 2);
  g_autoptr(CpTensor) v = input (N_KV_HEADS, 4 * rank + 3);
  g_autoptr(CpTensor) dout = input (N_HEADS, 4 * rank + 4);
  g_autoptr(CpTensor) lse = NULL;

  cp_attention_options_set_causal (options, TRUE);
  cp_attention_options_set_heads (options, N_HEADS, N_KV_HEADS);
  cp_attention_options_set_rotate_method (options, CP_ROTATE_METHOD_ALLTOALL);
  attention = cp_attention_new (mesh, options, &error);
  g_assert_no_error (error);
  g_assert_true (cp_attention_forward (attention, q, k, v, &run->out[rank], &lse, &error));
  g_assert_no_error (error);
  g_assert_true (cp_attention_backward (attention, dout, q, k, v, run->out[rank], lse,
                                        &run->dq[rank], &run->dkv[rank][0], &run->dkv[rank][1],
                                        &error));
  g_assert_no_error (error);
  run->sends[rank] = loopback_sends (mesh);
}

static void
run_clear (Run *run)
{
  for (int r = 0; r < RANKS; r++)
    {
      g_clear_object (&run->out[r]);
      g_clear_object (&run->dq[r]);
      g_clear_object (&run->dkv[r][0]);
      g_clear_object (&run->dkv[r][1]);
    }
}

static void
test_ring_routed (gconstpointer data)
{
  gboolean in_place = GPOINTER_TO_INT (data);
  GList *meshes = routed_group ();
  Run plain = { { NULL } }, routed = { { NULL } };

  g_test_summary ("Ring attention's hand-overs go over the communicator the mesh routes host "
                  "memory to, as every other call's do, with the same results; read in place, "
                  "only the dK/dV partials travel");
  if (!in_place)
    g_setenv ("CPMESH_ATTENTION_IN_PLACE", "0", TRUE);
  cp_test_run_group ("cp", RANKS, run_rank, &plain);
  cp_test_run_ranks (meshes, run_rank, &routed);
  g_unsetenv ("CPMESH_ATTENTION_IN_PLACE");
  for (int r = 0; r < RANKS; r++)
    {
      /* Passing shards, forward hands K/V on C − 1 times; backward hands
       * K/V on C − 1 times and the dK/dV partials C times.  Read in
       * place, only the partials travel. */
      g_assert_cmpuint (plain.sends[r], ==, 0);
      g_assert_cmpuint (routed.sends[r], ==, in_place ? RANKS : (RANKS - 1) + (RANKS - 1) + RANKS);
      g_assert_true (cp_tensor_equal (routed.out[r], plain.out[r]));
      g_assert_true (cp_tensor_equal (routed.dq[r], plain.dq[r]));
      g_assert_true (cp_tensor_equal (routed.dkv[r][0], plain.dkv[r][0]));
      g_assert_true (cp_tensor_equal (routed.dkv[r][1], plain.dkv[r][1]));
    }
  run_clear (&plain);
  run_clear (&routed);
  cp_test_free_group (meshes);
}

int
main (int    argc,
      char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_data_func ("/Cp/Attention/ring/routed/passed", GINT_TO_POINTER (FALSE),
                        test_ring_routed);
  g_test_add_data_func ("/Cp/Attention/ring/routed/in-place", GINT_TO_POINTER (TRUE),
                        test_ring_routed);
  return g_test_run ();
}
