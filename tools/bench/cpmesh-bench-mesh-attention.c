/* cpmesh-bench-mesh-attention.c: ring CP attention over processes and
 * over threads, for `cpmesh bench mesh` over processes
 *
 * The same problem on C processes of one host and on C threads of one
 * process: every rank computes its head-tail share of the inputs from the
 * global positions alone (no rank holds the whole sequence), runs forward
 * and backward once untimed and once timed, and hands back the slowest
 * rank's time and a digest of its outputs.  The library's results do not
 * depend on the transport, so the digests of the two runs must match.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "cpmesh-bench.h"

#define HEADS 16
#define HEAD_DIM 128
#define N_INPUTS 4   /* q, k, v, dout */
#define N_OUTPUTS 5  /* out, lse, dq, dk, dv */

/* Input @which at (head, global position, d): a value in [-1, 1] that
 * depends on nothing else, so that every rank computes its share alike. */
static float
input_value (int    which,
             int    head,
             gint64 position,
             int    d)
{
  guint64 index = (((guint64) which * HEADS + (guint64) head) * (1u << 24) + (guint64) position) *
                  HEAD_DIM + (guint64) d;

  return (float) (cpmesh_bench_pattern (index) / 8388606.5 - 1.0);
}

/* @rank's share of input @which, [1, H, S/C, D], in head-tail order. */
static CpTensor *
input_share (int      which,
             gint64   seq_len,
             int      cp_size,
             int      rank,
             GError **error)
{
  gint64 local = seq_len / cp_size;
  const gint64 shape[] = { 1, HEADS, local, HEAD_DIM };
  CpTensor *share = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 4, error);
  float *data;

  if (share == NULL)
    return NULL;
  data = cp_tensor_get_data (share);
  for (int h = 0; h < HEADS; h++)
    for (gint64 j = 0; j < local; j++)
      {
        gint64 position = cpmesh_bench_head_tail_position (seq_len, cp_size, rank, j);
        float *row = data + ((gsize) h * (gsize) local + (gsize) j) * HEAD_DIM;

        for (int d = 0; d < HEAD_DIM; d++)
          row[d] = input_value (which, h, position, d);
      }
  return share;
}

static void
clear_all (CpTensor **tensors,
           int        n)
{
  for (int i = 0; i < n; i++)
    g_clear_object (&tensors[i]);
}

static gboolean
forward_backward (CpAttention  *attention,
                  CpTensor    **inputs,
                  CpTensor    **outputs,
                  GError      **error)
{
  clear_all (outputs, N_OUTPUTS);
  return cp_attention_forward (attention, inputs[0], inputs[1], inputs[2], &outputs[0],
                               &outputs[1], error) &&
         cp_attention_backward (attention, inputs[3], inputs[0], inputs[1], inputs[2], outputs[0],
                                outputs[1], &outputs[2], &outputs[3], &outputs[4], error);
}

/* SHA-256 over the bytes of every output, in order. */
static char *
digest_of (CpTensor **outputs,
           gboolean   checked)
{
  g_autoptr(GChecksum) checksum = g_checksum_new (G_CHECKSUM_SHA256);

  if (checked)
    cpmesh_bench_corrupt (outputs[0]);
  for (int o = 0; o < N_OUTPUTS; o++)
    g_checksum_update (checksum, cp_tensor_get_data (outputs[o]),
                       (gssize) cp_tensor_get_nbytes (outputs[o]));
  return g_strdup (g_checksum_get_string (checksum));
}

static double
slowest (CpMesh   *mesh,
         double    seconds,
         GError  **error)
{
  const gint64 one[] = { 1 };
  g_autoptr(CpTensor) value = cp_tensor_new_full (CP_DTYPE_FLOAT64, one, 1, seconds, NULL);

  if (!cp_mesh_all_reduce (mesh, value, CP_REDUCE_OP_MAX, error))
    return -1;
  return cp_tensor_get_value (value, 0);
}

gboolean
cpmesh_bench_attention_rank (CpMesh   *mesh,
                             gint64    seq_len,
                             gboolean  checked,
                             double   *seconds,
                             char    **digest,
                             GError  **error)
{
  int rank = cp_mesh_get_rank (mesh), n = cp_mesh_get_world_size (mesh);
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(CpAttention) attention = NULL;
  CpTensor *inputs[N_INPUTS] = { NULL }, *outputs[N_OUTPUTS] = { NULL };
  gboolean ok = TRUE;
  double started = 0;

  for (int i = 0; ok && i < N_INPUTS; i++)
    ok = (inputs[i] = input_share (i, seq_len, n, rank, error)) != NULL;
  cp_attention_options_set_rotate_method (options, CP_ROTATE_METHOD_ALLTOALL);
  ok = ok && (attention = cp_attention_new (mesh, options, error)) != NULL;
  /* The first run faults the buffers in; the second, as in training,
   * reuses them and is timed from a barrier on. */
  ok = ok && forward_backward (attention, inputs, outputs, error) &&
       cp_mesh_barrier (mesh, error);
  if (ok)
    started = cpmesh_now_seconds ();
  ok = ok && forward_backward (attention, inputs, outputs, error);
  if (ok)
    *seconds = slowest (mesh, cpmesh_now_seconds () - started, error);
  ok = ok && *seconds >= 0;
  if (ok)
    *digest = digest_of (outputs, checked);
  clear_all (inputs, N_INPUTS);
  clear_all (outputs, N_OUTPUTS);
  return ok;
}

typedef struct
{
  CpmeshBenchRank base;
  gint64 seq_len;
  double seconds;
  char *digest;
} ThreadRank;

static gboolean
thread_rank (gpointer   data,
             GError   **error)
{
  ThreadRank *self = data;

  return cpmesh_bench_attention_rank (self->base.mesh, self->seq_len, FALSE, &self->seconds,
                                      &self->digest, error);
}

gboolean
cpmesh_bench_attention_threads (int      n_ranks,
                                gint64   seq_len,
                                double  *seconds,
                                GStrv   *digests,
                                GError **error)
{
  g_autofree ThreadRank *ranks = g_new0 (ThreadRank, n_ranks);
  g_autofree gpointer *data = g_new0 (gpointer, n_ranks);
  gboolean ok;

  for (int r = 0; r < n_ranks; r++)
    {
      ranks[r].seq_len = seq_len;
      data[r] = &ranks[r];
    }
  ok = cpmesh_bench_run_ranks (n_ranks, thread_rank, data, error);
  *digests = g_new0 (char *, n_ranks + 1);
  for (int r = 0; r < n_ranks; r++)
    {
      (*digests)[r] = ranks[r].digest != NULL ? ranks[r].digest : g_strdup ("");
      g_clear_error (&ranks[r].base.error);
    }
  *seconds = ranks[0].seconds;
  return ok;
}
