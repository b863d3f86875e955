/* test-async-attention.c: attention's _async/_finish calls, every rank of
 * an in-process mesh driven from one main loop, and their cancellation
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "cp-test-loop.h"
#include "cp-test-util.h"

#define MAX_RANKS CP_TEST_LOOP_MAX_RANKS

/* Meshes whose timeout no test reaches. */
#define TIMEOUT_MS 30000

typedef CpTestLoopRanks Ranks;

#define DONE CP_TEST_LOOP_DONE
/* ---- attention, against one rank holding the whole sequence ---- */

#define HEADS 2
#define KV_HEADS 1
#define HEAD_DIM 8

static CpTensor *
smooth_tensor (int    heads,
               gint64 seq_len,
               guint  seed)
{
  const gint64 shape[] = { 1, heads, seq_len, HEAD_DIM };
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 4, NULL);

  for (gint64 i = 0; i < cp_tensor_get_numel (tensor); i++)
    cp_tensor_set_value (tensor, i, sin ((double) i * 0.37 + seed) * 0.5);
  return cp_test_on_device (tensor);
}

static CpAttention *
attention_on (CpMesh *mesh)
{
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(GError) error = NULL;
  CpAttention *attention;

  cp_attention_options_set_causal (options, TRUE);
  cp_attention_options_set_heads (options, HEADS, KV_HEADS);
  attention = cp_attention_new (mesh, options, &error);
  g_assert_no_error (error);
  return attention;
}

typedef struct
{
  CpTensor *q, *k, *v, *dout;
  CpTensor *out, *lse, *dq, *dk, *dv;
} Pass;

static void
pass_clear (Pass *p)
{
  CpTensor **all[] = { &p->q, &p->k, &p->v, &p->dout, &p->out, &p->lse, &p->dq, &p->dk, &p->dv };

  for (gsize i = 0; i < G_N_ELEMENTS (all); i++)
    g_clear_object (all[i]);
}

/* Forward and backward over the whole sequence, on a mesh of one rank,
 * with the blocking calls. */
static void
reference_pass (Pass *p)
{
  GList *one = cp_test_local_group ("cp", 1);
  g_autoptr(CpAttention) attention = attention_on (one->data);
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_attention_forward (attention, p->q, p->k, p->v, &p->out, &p->lse, &error));
  g_assert_no_error (error);
  g_assert_true (cp_attention_backward (attention, p->dout, p->q, p->k, p->v, p->out, p->lse,
                                        &p->dq, &p->dk, &p->dv, &error));
  g_assert_no_error (error);
  cp_test_free_group (one);
}

static void
assert_close (CpTensor   *actual,
              CpTensor   *expected,
              const char *what)
{
  double worst = 0.0;

  g_assert_cmpint (cp_tensor_get_numel (actual), ==, cp_tensor_get_numel (expected));
  for (gint64 i = 0; i < cp_tensor_get_numel (actual); i++)
    worst = MAX (worst, fabs (cp_tensor_get_value (actual, i) - cp_tensor_get_value (expected, i)));
  /* float32 products summed in another order: a few ulps of values of
   * order 1. */
  if (worst > 1e-5)
    g_error ("%s: max error %g against the one-rank reference", what, worst);
}

/* Unshards every rank's @pieces with async calls and compares with
 * @expected. */
static void
assert_unsharded (Ranks      *ranks,
                  CpTensor  **pieces,
                  int         seq_dim,
                  CpTensor   *expected,
                  const char *what)
{
  for (int r = 0; r < ranks->n; r++)
    cp_mesh_unshard_async (ranks->meshes[r], pieces[r], seq_dim, NULL, DONE (ranks, r));
  cp_test_loop_await_all (ranks);
  for (int r = 0; r < ranks->n; r++)
    {
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) whole = cp_mesh_unshard_finish (ranks->meshes[r], ranks->results[r], &error);

      g_assert_no_error (error);
      assert_close (whole, expected, what);
    }
  cp_test_loop_ranks_forget (ranks);
}

static CpTensor *
shard (CpTensor *full,
       int       seq_dim,
       int       rank,
       int       n)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, cp_tensor_get_dim (full, seq_dim),
                                              n, NULL);

  return cp_layout_shard (layout, full, seq_dim, rank, NULL);
}

static void
test_attention_calls (gconstpointer data)
{
  int n = GPOINTER_TO_INT (data);
  gint64 seq_len = 8 * n;
  Pass ref = { smooth_tensor (HEADS, seq_len, 1), smooth_tensor (KV_HEADS, seq_len, 2),
               smooth_tensor (KV_HEADS, seq_len, 3), smooth_tensor (HEADS, seq_len, 4) };
  Pass local[MAX_RANKS] = { { NULL } };
  CpAttention *attentions[MAX_RANKS] = { NULL };
  Ranks ranks;

  g_test_summary ("forward_async and backward_async on every rank from one main loop give, "
                  "unsharded, what one rank computes over the whole sequence");
  reference_pass (&ref);
  cp_test_loop_ranks_init (&ranks, n, TIMEOUT_MS);
  for (int r = 0; r < n; r++)
    {
      local[r].q = shard (ref.q, 2, r, n);
      local[r].k = shard (ref.k, 2, r, n);
      local[r].v = shard (ref.v, 2, r, n);
      local[r].dout = shard (ref.dout, 2, r, n);
      attentions[r] = attention_on (ranks.meshes[r]);
      cp_attention_forward_async (attentions[r], local[r].q, local[r].k, local[r].v, NULL, DONE (&ranks, r));
    }
  cp_test_loop_await_all (&ranks);
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_attention_forward_finish (attentions[r], ranks.results[r], &local[r].out,
                                                  &local[r].lse, &error));
      g_assert_no_error (error);
    }
  cp_test_loop_ranks_forget (&ranks);
  for (int r = 0; r < n; r++)
    cp_attention_backward_async (attentions[r], local[r].dout, local[r].q, local[r].k, local[r].v,
                                 local[r].out, local[r].lse, NULL, DONE (&ranks, r));
  cp_test_loop_await_all (&ranks);
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_attention_backward_finish (attentions[r], ranks.results[r], &local[r].dq,
                                                   &local[r].dk, &local[r].dv, &error));
      g_assert_no_error (error);
    }
  cp_test_loop_ranks_forget (&ranks);

  {
    CpTensor *outs[MAX_RANKS], *lses[MAX_RANKS], *dqs[MAX_RANKS], *dks[MAX_RANKS], *dvs[MAX_RANKS];

    for (int r = 0; r < n; r++)
      {
        outs[r] = local[r].out;
        lses[r] = local[r].lse;
        dqs[r] = local[r].dq;
        dks[r] = local[r].dk;
        dvs[r] = local[r].dv;
      }
    assert_unsharded (&ranks, outs, 2, ref.out, "out");
    assert_unsharded (&ranks, lses, 2, ref.lse, "lse");
    assert_unsharded (&ranks, dqs, 2, ref.dq, "dq");
    assert_unsharded (&ranks, dks, 2, ref.dk, "dk");
    assert_unsharded (&ranks, dvs, 2, ref.dv, "dv");
  }
  for (int r = 0; r < n; r++)
    {
      pass_clear (&local[r]);
      g_object_unref (attentions[r]);
    }
  pass_clear (&ref);
  cp_test_loop_ranks_clear (&ranks);
}

/* ---- cancellation ---- */

typedef struct
{
  int n;
  gboolean before;     /* cancelled before the call, else while it waits */
  gboolean backward;   /* the cancelled call: backward, else forward */
  const char *path;
  const char *what;
} CancelCase;

typedef struct
{
  const CancelCase *c;
  Ranks ranks;
  CpAttention *attentions[MAX_RANKS];
  Pass passes[MAX_RANKS];
} Scene;

/* Every rank's pieces, and for a backward case their forward pass. */
static void
scene_init (Scene            *scene,
            const CancelCase *c)
{
  memset (scene, 0, sizeof *scene);
  scene->c = c;
  cp_test_loop_ranks_init (&scene->ranks, c->n, TIMEOUT_MS);
  for (int r = 0; r < c->n; r++)
    {
      Pass *p = &scene->passes[r];

      scene->attentions[r] = attention_on (scene->ranks.meshes[r]);
      p->q = smooth_tensor (HEADS, 8, (guint) r);
      p->k = smooth_tensor (KV_HEADS, 8, (guint) r + 10);
      p->v = smooth_tensor (KV_HEADS, 8, (guint) r + 20);
      p->dout = smooth_tensor (HEADS, 8, (guint) r + 30);
      if (c->backward)
        cp_attention_forward_async (scene->attentions[r], p->q, p->k, p->v, NULL, DONE (&scene->ranks, r));
    }
  if (!c->backward)
    return;
  cp_test_loop_await_all (&scene->ranks);
  for (int r = 0; r < c->n; r++)
    {
      g_autoptr(GError) error = NULL;
      Pass *p = &scene->passes[r];

      g_assert_true (cp_attention_forward_finish (scene->attentions[r], scene->ranks.results[r], &p->out,
                                                  &p->lse, &error));
      g_assert_no_error (error);
    }
  cp_test_loop_ranks_forget (&scene->ranks);
}

static void
scene_clear (Scene *scene)
{
  for (int r = 0; r < scene->ranks.n; r++)
    {
      pass_clear (&scene->passes[r]);
      g_clear_object (&scene->attentions[r]);
    }
  cp_test_loop_ranks_clear (&scene->ranks);
}

static void
start_call (int           r,
            GCancellable *cancellable,
            gpointer      data)
{
  Scene *scene = data;
  const CancelCase *c = scene->c;
  Pass *p = &scene->passes[r];

  if (c->backward)
    cp_attention_backward_async (scene->attentions[r], p->dout, p->q, p->k, p->v, p->out, p->lse,
                                 cancellable, DONE (&scene->ranks, r));
  else
    cp_attention_forward_async (scene->attentions[r], p->q, p->k, p->v, cancellable, DONE (&scene->ranks, r));
}

static GError *
finish_call (int      r,
             gpointer data)
{
  Scene *scene = data;
  const CancelCase *c = scene->c;
  g_autoptr(CpTensor) a = NULL;
  g_autoptr(CpTensor) b = NULL;
  g_autoptr(CpTensor) d = NULL;
  GError *error = NULL;
  gboolean ok;

  if (c->backward)
    ok = cp_attention_backward_finish (scene->attentions[r], scene->ranks.results[r], &a, &b, &d, &error);
  else
    ok = cp_attention_forward_finish (scene->attentions[r], scene->ranks.results[r], &a, NULL, &error);
  g_assert_false (ok);
  g_assert_null (a);
  return error;
}

static void
test_cancel (gconstpointer data)
{
  const CancelCase *c = data;
  Scene scene;

  scene_init (&scene, c);
  cp_test_loop_cancel_one (&scene.ranks, c->before, start_call, finish_call, &scene, "CpAttention",
                           c->what);
  scene_clear (&scene);
}

static const CancelCase cancel_cases[] = {
  { 4, TRUE, FALSE, "/Cp/Async/attention/cancel/before/forward/4",
    "attention forward_async of 4 ranks, one cancelled before the call" },
  { 2, FALSE, FALSE, "/Cp/Async/attention/cancel/waiting/forward/2",
    "attention forward_async of 2 ranks, one cancelled while it waits" },
  { 4, FALSE, FALSE, "/Cp/Async/attention/cancel/waiting/forward/4",
    "attention forward_async of 4 ranks, one cancelled while it waits" },
  { 4, FALSE, TRUE, "/Cp/Async/attention/cancel/waiting/backward/4",
    "attention backward_async of 4 ranks, one cancelled while it waits" },
};

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_data_func ("/Cp/Async/attention/values/2", GINT_TO_POINTER (2), test_attention_calls);
  g_test_add_data_func ("/Cp/Async/attention/values/4", GINT_TO_POINTER (4), test_attention_calls);
  for (gsize i = 0; i < G_N_ELEMENTS (cancel_cases); i++)
    g_test_add_data_func (cancel_cases[i].path, &cancel_cases[i], test_cancel);

  return g_test_run ();
}
