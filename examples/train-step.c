/* train-step.c: one context-parallel attention step on 4 in-process ranks.
 *
 * Every rank prepares the same batch (token ids, labels, and one attention
 * layer's Q, K, V and output gradient, 250 positions), enters the context,
 * which shards every buffer in place, runs attention forward and backward,
 * exits, and gathers the results back.  Rank 0 prints a checksum of the
 * gathered output and gradients that the Python, gjs and Vala versions of
 * this example print too.
 *
 *   cc train-step.c $(pkg-config --cflags --libs libcpmesh-1) -lm
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <stdio.h>

#include <libcpmesh.h>

#define RANKS 4
#define SEQ 250
#define HEADS 4
#define KV_HEADS 2
#define HEAD_DIM 16

static const char *operands[] = { "q", "k", "v", "dout" };

/* Exact in float32, the same in every language. */
static float
pattern (int s, int h, int d, int a, int b, int c, int modulus)
{
  return (float) ((s * a + h * b + d * c) % modulus - modulus / 2) / 64.0f;
}

static CpTensor *
operand (int heads, int a, int b, int c, int modulus)
{
  const gint64 shape[] = { 1, heads, SEQ, HEAD_DIM };
  CpTensor *t = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 4, NULL);
  float *data = cp_tensor_get_data (t);

  for (int h = 0; h < heads; h++)
    for (int s = 0; s < SEQ; s++)
      for (int d = 0; d < HEAD_DIM; d++)
        data[(h * SEQ + s) * HEAD_DIM + d] = pattern (s, h, d, a, b, c, modulus);
  return t;
}

static CpBatch *
load_batch (void)
{
  const gint64 shape[] = { 1, SEQ };
  CpBatch *batch = cp_batch_new ();
  g_autoptr(CpTensor) ids = cp_tensor_new (CP_DTYPE_INT64, shape, 2, NULL);
  g_autoptr(CpTensor) labels = cp_tensor_new (CP_DTYPE_INT64, shape, 2, NULL);
  g_autoptr(CpTensor) q = operand (HEADS, 31, 17, 7, 97);
  g_autoptr(CpTensor) k = operand (KV_HEADS, 29, 13, 5, 89);
  g_autoptr(CpTensor) v = operand (KV_HEADS, 23, 11, 3, 83);
  g_autoptr(CpTensor) dout = operand (HEADS, 19, 5, 13, 79);

  for (int s = 0; s < SEQ; s++)
    {
      ((gint64 *) cp_tensor_get_data (ids))[s] = (s * 7 + 3) % 1000;
      ((gint64 *) cp_tensor_get_data (labels))[s] = ((s + 1) % SEQ * 7 + 3) % 1000;
    }
  cp_batch_set (batch, "input_ids", ids);
  cp_batch_set (batch, "labels", labels);
  cp_batch_set (batch, "q", q);
  cp_batch_set (batch, "k", k);
  cp_batch_set (batch, "v", v);
  cp_batch_set (batch, "dout", dout);
  return batch;
}

/* Each value in units of 2^-20, rounded down and added as integers: the
 * same sum in any order and any language. */
static gint64
checksum (CpTensor *t)
{
  const float *data = cp_tensor_get_data (t);
  gint64 sum = 0;

  for (gint64 i = 0; i < cp_tensor_get_numel (t); i++)
    sum += (gint64) floor ((double) data[i] * 1048576.0);
  return sum;
}

typedef struct
{
  CpMesh *mesh;
  gint64 checksum;
  GError *error;
} Rank;

static gboolean
train_step (Rank *rank)
{
  const gint64 seq_lens[] = { SEQ };
  g_autoptr(CpBatch) batch = load_batch ();
  g_autoptr(CpBatchOptions) batch_options = cp_batch_options_new ();
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(CpContext) ctx = NULL;
  g_autoptr(CpAttention) attention = NULL;
  g_autoptr(CpTensor) out = NULL, lse = NULL, dq = NULL, dk = NULL, dv = NULL;
  GError **error = &rank->error;

  for (guint i = 0; i < G_N_ELEMENTS (operands); i++)
    cp_batch_options_add_extra_buffer (batch_options, operands[i], 2);
  cp_attention_options_set_heads (options, HEADS, KV_HEADS);
  cp_attention_options_set_seq_lens (options, seq_lens, 1);
  cp_attention_options_set_n_threads (options, 1);
  if ((ctx = cp_batch_prepare (batch, rank->mesh, batch_options, error)) == NULL ||
      (attention = cp_attention_new (rank->mesh, options, error)) == NULL ||
      !cp_context_enter (ctx, error) ||
      !cp_attention_forward (attention, cp_batch_get (batch, "q"), cp_batch_get (batch, "k"),
                             cp_batch_get (batch, "v"), &out, &lse, error) ||
      !cp_attention_backward (attention, cp_batch_get (batch, "dout"), cp_batch_get (batch, "q"),
                              cp_batch_get (batch, "k"), cp_batch_get (batch, "v"), out, lse,
                              &dq, &dk, &dv, error) ||
      !cp_context_exit (ctx, error))
    return FALSE;
  for (guint i = 0; i < 4; i++)
    {
      CpTensor *local = (CpTensor *[]) { out, dq, dk, dv }[i];
      g_autoptr(CpTensor) full = cp_mesh_unshard (rank->mesh, local, 2, error);

      if (full == NULL)
        return FALSE;
      rank->checksum += checksum (full);
    }
  return TRUE;
}

static gpointer
rank_thread (gpointer data)
{
  train_step (data);
  return NULL;
}

int
main (void)
{
  const char *dims[] = { "cp", NULL };
  const int sizes[] = { RANKS };
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (dims, sizes, 1, &error);
  Rank ranks[RANKS] = { 0 };
  GThread *threads[RANKS];
  int status = 0;
  int r = 0;

  if (meshes == NULL)
    {
      fprintf (stderr, "%s\n", error->message);
      return 1;
    }
  for (GList *l = meshes; l != NULL; l = l->next, r++)
    {
      ranks[r].mesh = l->data;
      threads[r] = g_thread_new ("rank", rank_thread, &ranks[r]);
    }
  for (r = 0; r < RANKS; r++)
    g_thread_join (threads[r]);
  for (r = 0; r < RANKS; r++)
    if (ranks[r].error != NULL)
      {
        fprintf (stderr, "rank %d: %s\n", r, ranks[r].error->message);
        g_clear_error (&ranks[r].error);
        status = 1;
      }
  if (status == 0)
    printf ("train-step: %d ranks, %d positions padded to 256, checksum %" G_GINT64_FORMAT "\n",
            RANKS, SEQ, ranks[0].checksum);
  g_list_free_full (meshes, g_object_unref);
  return status;
}
