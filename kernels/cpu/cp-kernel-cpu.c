/* cp-kernel-cpu.c: the CPU kernels' table, and their row-wise loops
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "cp-attention-kernel-private.h"
#include "cp-dtype-private.h"

/* out = acc / l and lse = m + log l for a real query row, whatever they
 * hold, so that NaN and ∞ reach the output as the float64 formula carries
 * them: a row whose every score is −∞ gives 0 / 0.  A padding row, which
 * attends to nothing, gets 0 and −∞. */
static void
finish_row (const CpAttnProblem *p,
            const CpAttnState   *state,
            int                  b,
            int                  h,
            gint64               i,
            gboolean             real,
            float               *lse)
{
  const CpAttnView *view = &state->acc;
  float *acc = (float *) view->data + b * view->batch_stride + h * view->head_stride +
               (gsize) i * view->row_stride;
  gsize row = ((gsize) b * p->n_heads + (gsize) h) * (gsize) p->q_rows + (gsize) i;
  float m = state->m[row] == -INFINITY ? NAN : state->m[row];
  float l = state->l[row];
  float inverse = 1.0f / l;

  for (int j = 0; j < p->head_dim; j++)
    acc[j] = real ? acc[j] * inverse : 0.0f;
  lse[row] = real ? m + logf (l) : -INFINITY;
}

static void
cpu_finalize (const CpAttnProblem *p,
              const CpAttnState   *state,
              float               *lse)
{
  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->n_heads; h++)
      for (guint r = 0; r < p->n_q_runs; r++)
        {
          const CpAttnRun *run = &p->q_runs[r];
          gint64 real = p->real_end[(gsize) b * p->n_docs + run->doc] - run->pos;

          for (gint64 i = 0; i < run->length; i++)
            finish_row (p, state, b, h, run->row + i, i < real, lse);
        }
}

static inline float
load (CpAttnType    type,
      gconstpointer data,
      gsize         i)
{
  if (type == CP_ATTN_FLOAT32)
    return ((const float *) data)[i];
  return _cp_bf16_to_float (((const guint16 *) data)[i]);
}

static void
cpu_row_deltas (const CpAttnProblem *p,
                CpAttnType           type,
                const CpAttnView    *dout,
                const CpAttnView    *out,
                float               *delta)
{
  const CpAttnView *view = dout;
  gsize row = 0;

  for (int b = 0; b < p->batch; b++)
    for (int h = 0; h < p->n_heads; h++)
      for (gint64 i = 0; i < p->q_rows; i++, row++)
        {
          gsize at = b * view->batch_stride + h * view->head_stride + (gsize) i * view->row_stride;
          float sum = 0.0f;

          for (int j = 0; j < p->head_dim; j++)
            sum += load (type, dout->data, at + j) * load (type, out->data, at + j);
          delta[row] = sum;
        }
}

static void
cpu_bfloat16_to_float32 (float         *dst,
                         const guint16 *src,
                         gsize          n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = _cp_bf16_to_float (src[i]);
}

static void
cpu_float32_to_bfloat16 (guint16     *dst,
                         const float *src,
                         gsize        n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = _cp_float_to_bf16 (src[i]);
}

static void
cpu_add_float32 (float       *dst,
                 const float *src,
                 gsize        n)
{
  for (gsize i = 0; i < n; i++)
    dst[i] += src[i];
}

const CpKernel _cp_kernel_cpu = {
  .name = "cpu",
  .forward_block = _cp_attn_forward_block,
  .backward_block = _cp_attn_backward_block,
  .finalize = cpu_finalize,
  .row_deltas = cpu_row_deltas,
  .bfloat16_to_float32 = cpu_bfloat16_to_float32,
  .float32_to_bfloat16 = cpu_float32_to_bfloat16,
  .add_float32 = cpu_add_float32,
  .multiplies_bfloat16 = _cp_attn_gemm_has_bfloat16,
  .default_threads = _cp_attn_default_threads,
};
