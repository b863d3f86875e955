/* test-attention.c: CpAttention against a float64 reference on the full
 * sequence
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "cp-test-util.h"

#ifdef CP_TEST_FORCE_PRIMITIVES
/* From the internal library: float32 through oneDNN matmul primitives,
 * and what their executions shared. */
#include "kernels/cpu/cp-attention-gemm-private.h"
#endif

/* One attention problem: the global (padded) sequence, its documents and
 * real lengths, and how it is computed. */
typedef struct
{
  int cp_size;
  CpRotateMethod method;
  gboolean causal;
  gboolean thd;
  CpDType dtype;
  int batch;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  gint64 real_len;          /* BSHD: real length of every row */
  const gint64 *doc_lens;   /* THD: real document lengths */
  guint n_docs;
  int n_threads;
  const struct _Poison *poison;  /* a non-finite input value, or NULL */
} Config;

/* One element of a global input set to NaN or ±∞ before the reference
 * is computed: the reference carries it as float64 arithmetic does, and
 * the ranks must give the same non-finite elements. */
typedef struct _Poison
{
  int tensor;        /* 0 q, 1 k, 2 v, 3 dout */
  gint64 pos;        /* position in the global sequence */
  double value;
  const char *what;
} Poison;

/* The global problem and its float64 reference. */
typedef struct
{
  const Config *config;
  gint64 seq_len;              /* padded */
  gint64 *bounds;              /* padded document bounds (THD), n_docs + 1 */
  gint64 *real_bounds;         /* real cumulative lengths (THD) */
  CpLayout *layout;
  CpTensor *q, *k, *v, *dout;  /* global inputs, in config->dtype */
  double *q64, *k64, *v64, *dout64;
  double *out, *lse, *dq, *dk, *dv;
  CpTensor *pieces[5][16];     /* per rank: out, lse, dq, dk, dv */
} Problem;

static gint64
round_up (gint64 n,
          gint64 m)
{
  return (n + m - 1) / m * m;
}

/* Element offset of (b, h, position, d) in a global [B,H,S,D] or [T,H,D]
 * tensor with @heads heads. */
static gsize
offset_of (const Problem *p,
           int            heads,
           int            b,
           int            h,
           gint64         pos,
           int            d)
{
  gsize D = (gsize) p->config->head_dim;

  if (p->config->thd)
    return ((gsize) pos * (gsize) heads + (gsize) h) * D + (gsize) d;
  return (((gsize) b * (gsize) heads + (gsize) h) * (gsize) p->seq_len + (gsize) pos) * D + (gsize) d;
}

static void
document_of (const Problem *p,
             gint64         pos,
             gint64        *start,
             gint64        *real_end)
{
  if (!p->config->thd)
    {
      *start = 0;
      *real_end = p->config->real_len;
      return;
    }
  for (guint d = 0; d < p->config->n_docs; d++)
    if (pos < p->bounds[d + 1])
      {
        *start = p->bounds[d];
        *real_end = p->bounds[d] + p->config->doc_lens[d];
        return;
      }
  g_assert_not_reached ();
}

static gboolean
visible (const Problem *p,
         gint64         i,
         gint64         j)
{
  gint64 start_i, end_i, start_j, end_j;

  document_of (p, i, &start_i, &end_i);
  document_of (p, j, &start_j, &end_j);
  return i < end_i && start_i == start_j && j < end_j && (!p->config->causal || j <= i);
}

static CpTensor *
random_tensor (const Config *c,
               const gint64 *shape,
               guint         n_dims,
               GRand        *rand)
{
  g_autoptr(GError) error = NULL;
  CpTensor *t = cp_tensor_new (c->dtype, shape, n_dims, &error);

  g_assert_no_error (error);
  for (gint64 i = 0; i < cp_tensor_get_numel (t); i++)
    cp_tensor_set_value (t, i, g_rand_double_range (rand, -1.0, 1.0));
  return cp_test_on_device (t);
}

static void
make_inputs (Problem *p,
             GRand   *rand)
{
  const Config *c = p->config;
  gint64 qshape[4], kshape[4];
  guint n;

  if (c->thd)
    {
      n = 3;
      qshape[0] = kshape[0] = p->seq_len;
      qshape[1] = c->n_heads;
      kshape[1] = c->n_kv_heads;
      qshape[2] = kshape[2] = c->head_dim;
    }
  else
    {
      n = 4;
      qshape[0] = kshape[0] = c->batch;
      qshape[1] = c->n_heads;
      kshape[1] = c->n_kv_heads;
      qshape[2] = kshape[2] = p->seq_len;
      qshape[3] = kshape[3] = c->head_dim;
    }
  p->q = random_tensor (c, qshape, n, rand);
  p->k = random_tensor (c, kshape, n, rand);
  p->v = random_tensor (c, kshape, n, rand);
  p->dout = random_tensor (c, qshape, n, rand);
}

/* Attention of one query row in float64: output, lse and, given dout, the
 * gradient contributions. */
static void
reference_row (Problem *p,
               int      b,
               int      h,
               gint64   i)
{
  const Config *c = p->config;
  int hk = h / (c->n_heads / c->n_kv_heads);
  double scale = 1.0 / sqrt (c->head_dim);
  g_autofree double *s = g_new0 (double, p->seq_len);
  g_autofree double *dp = g_new0 (double, p->seq_len);
  gsize row = ((gsize) b * c->n_heads + h) * (gsize) p->seq_len + (gsize) i;
  gsize qi = offset_of (p, c->n_heads, b, h, i, 0);
  const double *q = p->q64 + qi, *dout = p->dout64 + qi;
  double *out = p->out + qi, *dq = p->dq + qi;
  double max = -INFINITY, sum = 0.0, delta = 0.0;
  gboolean any = FALSE;

  /* Feature d of a row is element d from its start, in both layouts. */
  for (gint64 j = 0; j < p->seq_len; j++)
    {
      const double *k = p->k64 + offset_of (p, c->n_kv_heads, b, hk, j, 0);

      double score = 0.0;

      if (!visible (p, i, j))
        continue;
      for (int d = 0; d < c->head_dim; d++)
        score += q[d] * k[d];
      s[j] = score * scale;
      max = isnan (max) || max >= s[j] ? max : s[j];  /* NaN wins */
      any = TRUE;
    }
  p->lse[row] = -INFINITY;
  if (!any)
    return;
  for (gint64 j = 0; j < p->seq_len; j++)
    if (visible (p, i, j))
      sum += exp (s[j] - max);
  p->lse[row] = max + log (sum);
  for (gint64 j = 0; j < p->seq_len; j++)
    {
      const double *v = p->v64 + offset_of (p, c->n_kv_heads, b, hk, j, 0);

      double prob, grad = 0.0;

      if (!visible (p, i, j))
        continue;
      s[j] = prob = exp (s[j] - p->lse[row]);
      for (int d = 0; d < c->head_dim; d++)
        {
          out[d] += prob * v[d];
          grad += dout[d] * v[d];
        }
      dp[j] = grad;
    }
  for (int d = 0; d < c->head_dim; d++)
    delta += dout[d] * out[d];
  for (gint64 j = 0; j < p->seq_len; j++)
    {
      gsize kj = offset_of (p, c->n_kv_heads, b, hk, j, 0);
      const double *k = p->k64 + kj;
      double *dk = p->dk + kj, *dv = p->dv + kj;
      double ds;

      if (!visible (p, i, j))
        continue;
      ds = s[j] * (dp[j] - delta);
      for (int d = 0; d < c->head_dim; d++)
        {
          dq[d] += scale * ds * k[d];
          dk[d] += scale * ds * q[d];
          dv[d] += s[j] * dout[d];
        }
    }
}

static double *
to_float64 (CpTensor *t)
{
  double *values = g_new (double, cp_tensor_get_numel (t));

  for (gint64 i = 0; i < cp_tensor_get_numel (t); i++)
    values[i] = cp_tensor_get_value (t, i);
  return values;
}

static void
compute_reference (Problem *p)
{
  const Config *c = p->config;

  p->q64 = to_float64 (p->q);
  p->k64 = to_float64 (p->k);
  p->v64 = to_float64 (p->v);
  p->dout64 = to_float64 (p->dout);

  p->out = g_new0 (double, cp_tensor_get_numel (p->q));
  p->dq = g_new0 (double, cp_tensor_get_numel (p->q));
  p->dk = g_new0 (double, cp_tensor_get_numel (p->k));
  p->dv = g_new0 (double, cp_tensor_get_numel (p->k));
  p->lse = g_new0 (double, (gsize) c->batch * c->n_heads * (gsize) p->seq_len);
  for (int b = 0; b < c->batch; b++)
    for (int h = 0; h < c->n_heads; h++)
      for (gint64 i = 0; i < p->seq_len; i++)
        reference_row (p, b, h, i);
}

/* Sets the poisoned element: batch row, head and feature 1 where they
 * exist, so that other rows, heads and features stay finite. */
static void
apply_poison (Problem *p)
{
  const Config *c = p->config;
  const Poison *poison = c->poison;
  CpTensor *tensors[] = { p->q, p->k, p->v, p->dout };
  int heads = poison->tensor == 1 || poison->tensor == 2 ? c->n_kv_heads : c->n_heads;

  cp_tensor_set_value (tensors[poison->tensor],
                       (gint64) offset_of (p, heads, c->batch - 1, heads - 1, poison->pos,
                                           MIN (1, c->head_dim - 1)),
                       poison->value);
}

static void
problem_init (Problem      *p,
              const Config *c,
              guint         seed)
{
  g_autoptr(GRand) rand = g_rand_new_with_seed (seed);
  g_autoptr(GError) error = NULL;
  gint64 unit = 2 * (gint64) c->cp_size;

  memset (p, 0, sizeof *p);
  p->config = c;
  if (c->thd)
    {
      p->bounds = g_new0 (gint64, c->n_docs + 1);
      p->real_bounds = g_new0 (gint64, c->n_docs + 1);
      for (guint d = 0; d < c->n_docs; d++)
        {
          p->bounds[d + 1] = p->bounds[d] + round_up (c->doc_lens[d], unit);
          p->real_bounds[d + 1] = p->real_bounds[d] + c->doc_lens[d];
        }
      p->seq_len = p->bounds[c->n_docs];
      p->layout = cp_layout_new_thd (p->bounds, c->n_docs + 1, c->cp_size, &error);
    }
  else
    {
      p->seq_len = round_up (c->real_len, unit);
      p->layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, p->seq_len, c->cp_size, &error);
    }
  g_assert_no_error (error);
  make_inputs (p, rand);
  if (c->poison != NULL)
    apply_poison (p);
  compute_reference (p);
}

static void
problem_clear (Problem *p)
{
  g_clear_object (&p->q);
  g_clear_object (&p->k);
  g_clear_object (&p->v);
  g_clear_object (&p->dout);
  g_clear_pointer (&p->layout, cp_layout_unref);
  g_free (p->bounds);
  g_free (p->real_bounds);
  g_free (p->q64);
  g_free (p->k64);
  g_free (p->v64);
  g_free (p->dout64);
  g_free (p->out);
  g_free (p->lse);
  g_free (p->dq);
  g_free (p->dk);
  g_free (p->dv);
  for (int i = 0; i < 5; i++)
    for (int r = 0; r < 16; r++)
      g_clear_object (&p->pieces[i][r]);
}

static CpAttentionOptions *
options_for (const Problem *p)
{
  const Config *c = p->config;
  CpAttentionOptions *options = cp_attention_options_new ();

  cp_attention_options_set_causal (options, c->causal);
  cp_attention_options_set_rotate_method (options, c->method);
  cp_attention_options_set_heads (options, c->n_heads, c->n_kv_heads);
  cp_attention_options_set_n_threads (options, c->n_threads);
  if (c->thd)
    {
      cp_attention_options_set_cu_seqlens_padded (options, p->bounds, c->n_docs + 1);
      cp_attention_options_set_cu_seqlens (options, p->real_bounds, c->n_docs + 1);
    }
  else
    {
      g_autofree gint64 *lens = g_new (gint64, c->batch);

      for (int b = 0; b < c->batch; b++)
        lens[b] = c->real_len;
      cp_attention_options_set_seq_lens (options, lens, c->batch);
    }
  return options;
}

static int
seq_dim (const Problem *p)
{
  return p->config->thd ? 0 : 2;
}

static CpTensor *
shard (Problem  *p,
       CpTensor *global,
       int       rank)
{
  g_autoptr(GError) error = NULL;
  CpTensor *piece = cp_layout_shard (p->layout, global, seq_dim (p), rank, &error);

  g_assert_no_error (error);
  return piece;
}

static void
run_rank (CpMesh   *mesh,
          gpointer  data)
{
  Problem *p = data;
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpAttentionOptions) options = options_for (p);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpAttention) attention = cp_attention_new (mesh, options, &error);
  g_autoptr(CpTensor) q = shard (p, p->q, rank);
  g_autoptr(CpTensor) k = shard (p, p->k, rank);
  g_autoptr(CpTensor) v = shard (p, p->v, rank);
  g_autoptr(CpTensor) dout = shard (p, p->dout, rank);
  CpTensor *out = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;

  g_assert_no_error (error);
  g_assert_true (cp_attention_forward (attention, q, k, v, &out, &lse, &error));
  g_assert_no_error (error);
  g_assert_true (cp_attention_backward (attention, dout, q, k, v, out, lse, &dq, &dk, &dv, &error));
  g_assert_no_error (error);
  p->pieces[0][rank] = out;
  p->pieces[1][rank] = lse;
  p->pieces[2][rank] = dq;
  p->pieces[3][rank] = dk;
  p->pieces[4][rank] = dv;
}

/* The full tensor of the ranks' pieces of output @what. */
static CpTensor *
unshard (Problem *p,
         int      what,
         int      dim)
{
  g_autoptr(GError) error = NULL;
  CpTensor *full = cp_layout_unshard_pieces (p->layout, p->pieces[what], p->config->cp_size,
                                             dim, &error);

  g_assert_no_error (error);
  return full;
}

typedef struct
{
  double max_err;
  double max_ref;
  double sum_sq;
  double lo, hi;
  gsize n;
  gsize violations;   /* elementwise |a − b| > atol + rtol |b| */
  gsize non_finite;   /* elements the reference has NaN or ±∞ */
} Compare;

/* Where the reference is NaN or ±∞, @got must be exactly that too. */
static void
assert_same_non_finite (double      got,
                        double      want,
                        gint64      index,
                        const char *what)
{
  gboolean same = isnan (want) ? isnan (got) : got == want;

  if (!same)
    g_error ("%s[%" G_GINT64_FORMAT "] is %g where float64 gives %g", what, index, got, want);
}

static void
compare_values (CpTensor     *got,
                const double *want,
                double        atol,
                double        rtol,
                const char   *what,
                Compare      *cmp)
{
  memset (cmp, 0, sizeof *cmp);
  cmp->lo = INFINITY;
  cmp->hi = -INFINITY;
  for (gint64 i = 0; i < cp_tensor_get_numel (got); i++)
    {
      double a = cp_tensor_get_value (got, i);
      double b = want[i];

      if (!isfinite (b))
        {
          assert_same_non_finite (a, b, i, what);
          cmp->non_finite++;
          continue;
        }
      if (!isfinite (a))
        g_error ("%s[%" G_GINT64_FORMAT "] is %g where float64 gives %g", what, i, a, b);
      cmp->max_err = MAX (cmp->max_err, fabs (a - b));
      cmp->max_ref = MAX (cmp->max_ref, fabs (b));
      cmp->sum_sq += (a - b) * (a - b);
      cmp->lo = MIN (cmp->lo, MIN (a, b));
      cmp->hi = MAX (cmp->hi, MAX (a, b));
      cmp->violations += fabs (a - b) > atol + rtol * fabs (b);
      cmp->n++;
    }
}

/* float32: within 1e-5 of the largest reference value.  bfloat16: the
 * bar Transformer Engine's CP tests set, elementwise atol = rtol and an
 * RMSE of at most 1% of the value range. */
static gsize
assert_close (CpTensor     *got,
              const double *want,
              const Config *c,
              const char   *what)
{
  Compare cmp;
  double tol = c->n_heads == c->n_kv_heads ? 2.5e-2 : 3.5e-2;

  if (c->dtype == CP_DTYPE_FLOAT32)
    {
      compare_values (got, want, 0.0, 0.0, what, &cmp);
      if (cmp.max_err > 1e-5 * MAX (cmp.max_ref, 1e-3))
        g_error ("%s: max error %g against max |ref| %g", what, cmp.max_err, cmp.max_ref);
      return cmp.non_finite;
    }
  compare_values (got, want, tol, tol, what, &cmp);
  if (cmp.violations > 0)
    g_error ("%s: %" G_GSIZE_FORMAT " elements outside atol = rtol = %g (max error %g)",
             what, cmp.violations, tol, cmp.max_err);
  if (sqrt (cmp.sum_sq / MAX (cmp.n, 1)) > 0.01 * MAX (cmp.hi - cmp.lo, 1e-6))
    g_error ("%s: RMSE %g over range %g", what, sqrt (cmp.sum_sq / cmp.n), cmp.hi - cmp.lo);
  return cmp.non_finite;
}

/* Padding positions must get exactly zero output and gradients. */
static void
assert_padding_zero (Problem  *p,
                     CpTensor *full,
                     int       heads)
{
  const Config *c = p->config;

  for (int b = 0; b < c->batch; b++)
    for (int h = 0; h < heads; h++)
      for (gint64 i = 0; i < p->seq_len; i++)
        {
          gint64 start, end;

          document_of (p, i, &start, &end);
          if (i < end)
            continue;
          for (int d = 0; d < c->head_dim; d++)
            g_assert_cmpfloat (cp_tensor_get_value (full, (gint64) offset_of (p, heads, b, h, i, d)), ==, 0.0);
        }
}

static void
check_lse (Problem *p)
{
  g_autoptr(CpTensor) lse = unshard (p, 1, -1);
  const Config *c = p->config;

  for (gint64 i = 0; i < cp_tensor_get_numel (lse); i++)
    {
      double want = p->lse[i];
      double got = cp_tensor_get_value (lse, i);

      if (!isfinite (want))
        assert_same_non_finite (got, want, i, "lse");
      else
        g_assert_cmpfloat_with_epsilon (got, want, c->dtype == CP_DTYPE_FLOAT32 ? 1e-5 : 5e-2);
    }
}

static void
run_problem (Problem *p)
{
  g_autoptr(GList) unused = NULL;
  GList *meshes = cp_test_local_group ("cp", p->config->cp_size);

  cp_test_run_ranks (meshes, run_rank, p);
  cp_test_free_group (meshes);
}

/* Returns how many elements of out, dq, dk and dv the reference has NaN
 * or ±∞. */
static gsize
check_problem (Problem *p)
{
  const Config *c = p->config;
  g_autoptr(CpTensor) out = unshard (p, 0, seq_dim (p));
  g_autoptr(CpTensor) dq = unshard (p, 2, seq_dim (p));
  g_autoptr(CpTensor) dk = unshard (p, 3, seq_dim (p));
  g_autoptr(CpTensor) dv = unshard (p, 4, seq_dim (p));
  gsize non_finite = assert_close (out, p->out, c, "out") + assert_close (dq, p->dq, c, "dq") +
                     assert_close (dk, p->dk, c, "dk") + assert_close (dv, p->dv, c, "dv");

  check_lse (p);
  assert_padding_zero (p, out, c->n_heads);
  assert_padding_zero (p, dq, c->n_heads);
  assert_padding_zero (p, dk, c->n_kv_heads);
  assert_padding_zero (p, dv, c->n_kv_heads);
  return non_finite;
}

static void
check_config (const Config *c)
{
  Problem p;

  problem_init (&p, c, 1234 + c->cp_size);
  run_problem (&p);
  check_problem (&p);
  problem_clear (&p);
}

static Config
bshd (int            cp_size,
      CpRotateMethod method,
      gboolean       causal,
      int            n_kv_heads,
      int            head_dim)
{
  /* Not a multiple of 2·C (except for C = 1): the tail is padding. */
  return (Config) { cp_size, method, causal, FALSE, CP_DTYPE_FLOAT32, 2, 8, n_kv_heads, head_dim,
                    4 * cp_size + 3, NULL, 0, 1 };
}

static void
test_bshd_float32_grid (void)
{
  int sizes[] = { 1, 2, 3, 4, 8 };

  g_test_summary ("float32 [B, H, S, D] attention and gradients match the float64 reference "
                  "for C in {1, 2, 3, 4, 8}, both rotate methods, causal or not, MHA and GQA");
  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    for (int method = 0; method < 2; method++)
      for (int causal = 0; causal < 2; causal++)
        for (int kv = 2; kv <= 8; kv *= 4)  /* GQA with groups of 4, and MHA */
          {
            Config c = bshd (sizes[i], method, causal, kv, (sizes[i] + kv / 2) % 2 ? 64 : 128);

            check_config (&c);
          }
}

static void
test_bshd_float32_tiles (void)
{
  g_test_summary ("Runs longer than one tile: masks on and off the diagonal, ragged tiles");
  for (int method = 0; method < 2; method++)
    for (int causal = 0; causal < 2; causal++)
      {
        Config c = { 2, method, causal, FALSE, CP_DTYPE_FLOAT32, 1, 2, 1, 64, 597, NULL, 0, 2 };

        check_config (&c);
      }
}

static void
test_bshd_head_dims (void)
{
  int dims[] = { 1, 40, 256 };

  g_test_summary ("Head dimensions from 1 to the largest supported, 256");
  for (guint i = 0; i < G_N_ELEMENTS (dims); i++)
    {
      Config c = bshd (2, i % 2 ? CP_ROTATE_METHOD_ALLTOALL : CP_ROTATE_METHOD_ALLGATHER, TRUE, 2, dims[i]);

      check_config (&c);
    }
}

static void
test_bshd_bfloat16 (void)
{
  int sizes[] = { 1, 4 };

  g_test_summary ("bfloat16 inputs meet atol = rtol = 2.5e-2 (3.5e-2 for GQA) and RMSE <= 1%");
  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    for (int method = 0; method < 2; method++)
      for (int kv = 2; kv <= 8; kv *= 4)
        {
          Config c = bshd (sizes[i], method, TRUE, kv, 128);

          c.dtype = CP_DTYPE_BFLOAT16;
          check_config (&c);
        }
}

static const gint64 doc_lens[] = { 5, 12, 1, 13 };

static void
test_thd (void)
{
  int sizes[] = { 1, 2, 3 };

  g_test_summary ("Packed documents: per-document head-tail, no attention across documents, "
                  "padded document tails get zero gradients");
  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    for (int method = 0; method < 2; method++)
      for (int causal = 0; causal < 2; causal++)
        {
          Config c = { sizes[i], method, causal, TRUE, CP_DTYPE_FLOAT32, 1, 4, 2, 64, 0,
                       doc_lens, G_N_ELEMENTS (doc_lens), 1 };

          check_config (&c);
        }
}

static void
test_thd_bfloat16 (void)
{
  Config c = { 2, CP_ROTATE_METHOD_ALLTOALL, TRUE, TRUE, CP_DTYPE_BFLOAT16, 1, 4, 1, 128, 0,
               doc_lens, G_N_ELEMENTS (doc_lens), 1 };

  check_config (&c);
}

static void
test_deterministic (void)
{
  Config c = bshd (3, CP_ROTATE_METHOD_ALLTOALL, TRUE, 1, 64);
  Problem first, second;

  g_test_summary ("Two runs of the same problem give identical bits");
  c.n_threads = 2;
  problem_init (&first, &c, 99);
  problem_init (&second, &c, 99);
  run_problem (&first);
  run_problem (&second);
  for (int what = 0; what < 5; what++)
    for (int r = 0; r < c.cp_size; r++)
      g_assert_true (cp_tensor_equal (first.pieces[what][r], second.pieces[what][r]));
  problem_clear (&first);
  problem_clear (&second);
}

/* Runs @c with the ring reading K/V in place or passing shards. */
static void
run_ring_mode (Problem      *p,
               const Config *c,
               gboolean      in_place)
{
  problem_init (p, c, 7);
  if (!in_place)
    g_setenv ("CPMESH_ATTENTION_IN_PLACE", "0", TRUE);
  run_problem (p);
  g_unsetenv ("CPMESH_ATTENTION_IN_PLACE");
}

static void
test_ring_in_place (gconstpointer data)
{
  CpDType dtype = GPOINTER_TO_INT (data);

  g_test_summary ("The ring that reads every peer's K/V where it lies gives the bits of the "
                  "ring that passes shards, forward and backward, causal or not, C = 2 to 4");
  for (int size = 2; size <= 4; size++)
    for (int causal = 0; causal < 2; causal++)
      {
        Config c = bshd (size, CP_ROTATE_METHOD_ALLTOALL, causal, 2, 64);
        Problem in_place, passed;

        c.dtype = dtype;
        run_ring_mode (&in_place, &c, TRUE);
        run_ring_mode (&passed, &c, FALSE);
        for (int what = 0; what < 5; what++)
          for (int r = 0; r < c.cp_size; r++)
            g_assert_true (cp_tensor_equal (in_place.pieces[what][r], passed.pieces[what][r]));
        problem_clear (&in_place);
        problem_clear (&passed);
      }
}

/* NaN and ±∞ in every input, at a real position (seen by some queries,
 * hidden by the causal mask from others) and, for v, at a padding
 * position, which nothing may see. */
static const Poison poisons[] = {
  { 0, -3, NAN, "NaN in q" },
  { 0, -3, -INFINITY, "-inf in q" },
  { 1, -3, INFINITY, "+inf in k" },
  { 1, -3, NAN, "NaN in k" },
  { 2, -3, NAN, "NaN in v" },
  { 2, -3, INFINITY, "+inf in v" },
  { 3, -3, NAN, "NaN in dout" },
  { 2, 0, NAN, "NaN in v at a padding position" },
};

/* The poison of @base at a position of @c's sequence: counted back from
 * the end of the real part, or the first padding position (pos 0). */
static Poison
poison_at (const Poison *base,
           const Config *c,
           gint64        real_len)
{
  Poison poison = *base;

  poison.pos = base->pos < 0 ? real_len + base->pos : real_len;
  g_assert_cmpint (c->real_len % (2 * c->cp_size), !=, 0);  /* a padding position exists */
  return poison;
}

static void
check_poisoned (Config       *c,
                const Poison *base,
                const char   *where)
{
  Poison poison = poison_at (base, c, c->real_len);
  g_autofree char *what = NULL;
  Problem p;
  gsize non_finite;

  c->poison = &poison;
  problem_init (&p, c, 77);
  run_problem (&p);
  non_finite = check_problem (&p);
  /* Otherwise the case checked nothing about propagation. */
  if (base->pos < 0)
    g_assert_cmpuint (non_finite, >, 0);
  else
    g_assert_cmpuint (non_finite, ==, 0);
  problem_clear (&p);
  c->poison = NULL;
  what = g_strdup_printf ("forward and backward with %s (%s)", base->what, where);
  cp_test_record_outcome ("CpAttention", what, "NaN and ±∞ propagate as in float64",
                          "the same NaN and ±∞ elements as the float64 reference, the rest within tolerance");
}

static void
test_non_finite (void)
{
  int sizes[] = { 1, 2, 3 };

  g_test_summary ("NaN and ±∞ in q, k, v or dout give exactly the NaN and ±∞ elements of "
                  "float64 attention in out, lse, dq, dk and dv, and no others, for C in "
                  "{1, 2, 3}, both rotate methods, causal or not; padding positions see nothing");
  for (guint x = 0; x < G_N_ELEMENTS (poisons); x++)
    for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
      for (int method = 0; method < 2; method++)
        for (int causal = 0; causal < 2; causal++)
          {
            Config c = bshd (sizes[i], method, causal, 2, 64);

            check_poisoned (&c, &poisons[x], "float32, C = 1 to 3, both rotate methods, causal or not");
          }
}

static void
test_non_finite_tiles (void)
{
  /* The ring, causal, in both dtypes; the all-gather, full, in float32. */
  static const struct { CpRotateMethod method; CpDType dtype; } runs[] = {
    { CP_ROTATE_METHOD_ALLTOALL, CP_DTYPE_FLOAT32 },
    { CP_ROTATE_METHOD_ALLTOALL, CP_DTYPE_BFLOAT16 },
    { CP_ROTATE_METHOD_ALLGATHER, CP_DTYPE_FLOAT32 },
  };

  g_test_summary ("The same over several tiles (S = 301 padded to 304): masked diagonal tiles, "
                  "unmasked tiles, the ring's log-sum-exp merge, bfloat16");
  for (guint x = 0; x < G_N_ELEMENTS (poisons); x++)
    for (guint r = 0; r < G_N_ELEMENTS (runs); r++)
      {
        Config c = { 2, runs[r].method, runs[r].method == CP_ROTATE_METHOD_ALLTOALL, FALSE,
                     runs[r].dtype, 1, 2, 1, 64, 301, NULL, 0, 2 };

        check_poisoned (&c, &poisons[x], "C = 2, several tiles, float32 and bfloat16");
      }
}

/* Moves the pieces of the last run out of @p into @pieces. */
static void
take_pieces (Problem  *p,
             CpTensor *pieces[5][16])
{
  memcpy (pieces, p->pieces, sizeof p->pieces);
  memset (p->pieces, 0, sizeof p->pieces);
}

static void
clear_pieces (CpTensor *pieces[5][16])
{
  for (int what = 0; what < 5; what++)
    for (int r = 0; r < 16; r++)
      g_clear_object (&pieces[what][r]);
}

static void
assert_same_pieces (CpTensor   *want[5][16],
                    CpTensor   *got[5][16],
                    int         cp_size,
                    int         n_threads)
{
  static const char * const names[] = { "out", "lse", "dq", "dk", "dv" };

  for (int what = 0; what < 5; what++)
    for (int r = 0; r < cp_size; r++)
      if (!cp_tensor_equal (want[what][r], got[what][r]))
        g_error ("%s of rank %d with %d threads differs from the single-threaded run",
                 names[what], r, n_threads);
}

/* One configuration run single-threaded (checked against float64), then
 * twice over with 1, 2 and 3 threads per rank: every run gives the bits
 * of the first. */
static void
check_thread_counts (Config *c)
{
  CpTensor *first[5][16] = { { NULL } };
  CpTensor *again[5][16] = { { NULL } };
  Problem p;

  c->n_threads = 1;
  problem_init (&p, c, 4321);
  run_problem (&p);
  check_problem (&p);
  take_pieces (&p, first);
  for (int repeat = 0; repeat < 2; repeat++)
    for (int n_threads = 1; n_threads <= 3; n_threads++)
      {
        c->n_threads = n_threads;
        run_problem (&p);
        take_pieces (&p, again);
        assert_same_pieces (first, again, c->cp_size, n_threads);
        clear_pieces (again);
      }
  clear_pieces (first);
  problem_clear (&p);
}

static void
test_thread_counts (void)
{
#ifdef CP_TEST_FORCE_PRIMITIVES
  CpAttnGemmAudit audit;
#endif

  g_test_summary ("Ranks running at once, each with 1, 2 or 3 threads, over ragged tiles "
                  "(S = 597 padded to 600, the runs of the ranks' shards cut tiles short), causal "
                  "on the ring and full over the all-gather: "
                  "two repeats give the bits of a single-threaded run, which matches float64");
#ifdef CP_TEST_FORCE_PRIMITIVES
  _cp_attn_gemm_audit_start ();
#endif
  for (int dt = 0; dt < 2; dt++)
    for (int cp_size = 2; cp_size <= 3; cp_size++)
      {
        /* The ring with a causal mask, the all-gather without. */
        Config c = { cp_size, cp_size == 2 ? CP_ROTATE_METHOD_ALLTOALL : CP_ROTATE_METHOD_ALLGATHER,
                     cp_size == 2, FALSE, dt == 0 ? CP_DTYPE_FLOAT32 : CP_DTYPE_BFLOAT16, 1, 2, 1, 64, 597,
                     NULL, 0, 1 };

        check_thread_counts (&c);
      }
#ifdef CP_TEST_FORCE_PRIMITIVES
  _cp_attn_gemm_audit_stop (&audit);
  g_test_message ("%" G_GUINT64_FORMAT " primitive executions, %" G_GUINT64_FORMAT " with a "
                  "scratchpad, at most %u at once", audit.executions, audit.with_scratchpad,
                  audit.most_in_flight);
  g_assert_cmpuint (audit.executions, >, 0);
  g_assert_cmpuint (audit.user_scratchpad, ==, audit.primitives);
  g_assert_cmpuint (audit.shared, ==, 0);
  g_assert_cmpuint (audit.short_buffers, ==, 0);
#endif
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);
#ifdef CP_TEST_FORCE_PRIMITIVES
  _cp_attn_gemm_force_primitives (TRUE);
#endif

  g_test_add_func ("/Cp/Attention/bshd/float32/grid", test_bshd_float32_grid);
  g_test_add_func ("/Cp/Attention/bshd/float32/tiles", test_bshd_float32_tiles);
  g_test_add_func ("/Cp/Attention/bshd/float32/head-dims", test_bshd_head_dims);
  g_test_add_func ("/Cp/Attention/bshd/bfloat16", test_bshd_bfloat16);
  g_test_add_func ("/Cp/Attention/thd/float32", test_thd);
  g_test_add_func ("/Cp/Attention/thd/bfloat16", test_thd_bfloat16);
  g_test_add_func ("/Cp/Attention/deterministic", test_deterministic);
  g_test_add_data_func ("/Cp/Attention/ring/in-place/float32", GINT_TO_POINTER (CP_DTYPE_FLOAT32),
                        test_ring_in_place);
  g_test_add_data_func ("/Cp/Attention/ring/in-place/bfloat16", GINT_TO_POINTER (CP_DTYPE_BFLOAT16),
                        test_ring_in_place);
  g_test_add_func ("/Cp/Attention/thread-counts", test_thread_counts);
  g_test_add_func ("/Cp/Attention/non-finite/small", test_non_finite);
  g_test_add_func ("/Cp/Attention/non-finite/tiles", test_non_finite_tiles);

  return g_test_run ();
}
