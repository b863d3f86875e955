/* test-attention-gemm.c: the attention kernel's matrix products on
 * oneDNN matmul primitives, executed by many threads at once
 *
 * Every OpenMP thread of every in-process rank executes the one cached
 * primitive of a tile shape, often at the same moment, so nothing an
 * execution writes may be shared with another: not the scratchpad, not
 * the stream.  These tests drive the primitives as the kernel does
 * (float32 forced through them on CPUs without bfloat16 matmul) and
 * check that every execution gets bit for bit the result of a sequential
 * one, and that oneDNN reports a user-managed scratchpad for every
 * primitive, so that correctness does not hang on how oneDNN was built.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include <omp.h>

#include "kernels/cpu/cp-attention-gemm-private.h"
#include "cp-dtype-private.h"

/* Products as the kernel asks for them
 * (kernels/cpu/cp-attention-kernel.c): the scores S = scale · Q·Kᵀ, P·V
 * and dS·K accumulated into the output or dQ, and Pᵀ·dO, dSᵀ·Q
 * accumulated into dV, dK, with ragged tiles (a
 * sequence length that is no multiple of 128) and several head
 * dimensions.  The leading dimensions are the kernel's: rows of a head in
 * a [T, H, D] tensor, and tiles 128 wide. */
#define TILE 128

typedef struct
{
  char transa, transb;
  gint64 m, n, k;
  float alpha, beta;
  gsize lda, ldb, ldc;
} Shape;

typedef struct
{
  CpAttnType type;
  Shape shape;
  gpointer a, b;     /* in the job's type */
  double *a64, *b64;
  float *c_start;    /* C before the product (it accumulates when beta = 1) */
  float *sequential; /* C after the product, computed by one thread alone */
  gsize c_len;
} Job;

/* Rows of op(X) for an m × k operand with leading dimension @ld. */
static gsize
stored_len (char   trans,
            gint64 rows,
            gint64 cols,
            gsize  ld)
{
  return trans == 'T' ? (gsize) (cols - 1) * ld + (gsize) rows : (gsize) (rows - 1) * ld + (gsize) cols;
}

static void
fill_operand (CpAttnType  type,
              gsize       n,
              GRand      *rand,
              gpointer   *data,
              double    **values)
{
  *values = g_new (double, n);
  *data = g_malloc (n * (type == CP_ATTN_BFLOAT16 ? 2 : 4));
  for (gsize i = 0; i < n; i++)
    {
      float x = (float) g_rand_double_range (rand, -1.0, 1.0);

      if (type == CP_ATTN_BFLOAT16)
        {
          ((guint16 *) *data)[i] = _cp_float_to_bf16 (x);
          (*values)[i] = _cp_bf16_to_float (((guint16 *) *data)[i]);
        }
      else
        {
          ((float *) *data)[i] = x;
          (*values)[i] = x;
        }
    }
}

static void
job_init (Job         *job,
          CpAttnType   type,
          const Shape *shape,
          GRand       *rand)
{
  const Shape *s = shape;

  job->type = type;
  job->shape = *shape;
  fill_operand (type, stored_len (s->transa, s->m, s->k, s->lda), rand, &job->a, &job->a64);
  fill_operand (type, stored_len (s->transb, s->k, s->n, s->ldb), rand, &job->b, &job->b64);
  job->c_len = (gsize) (s->m - 1) * s->ldc + (gsize) s->n;
  job->c_start = g_new (float, job->c_len);
  for (gsize i = 0; i < job->c_len; i++)
    job->c_start[i] = (float) g_rand_double_range (rand, -1.0, 1.0);
  job->sequential = g_new (float, job->c_len);
}

static void
job_clear (Job *job)
{
  g_free (job->a);
  g_free (job->b);
  g_free (job->a64);
  g_free (job->b64);
  g_free (job->c_start);
  g_free (job->sequential);
}

static void
job_run (const Job *job,
         float     *c)
{
  const Shape *s = &job->shape;

  memcpy (c, job->c_start, job->c_len * sizeof (float));
  _cp_attn_gemm (job->type, s->transa, s->transb, s->m, s->n, s->k, s->alpha, job->a, s->lda,
                 job->b, s->ldb, s->beta, c, s->ldc);
}

static double
element (const double *x,
         char          trans,
         gsize         ld,
         gint64        row,
         gint64        col)
{
  return trans == 'T' ? x[(gsize) col * ld + (gsize) row] : x[(gsize) row * ld + (gsize) col];
}

/* The sequential result against float64: every element within 1e-5 of
 * the sum of the magnitudes of its terms (float32 accumulation; bfloat16
 * products are exact in float32), and C's elements outside the m × n
 * window (the padding of the leading dimension) untouched. */
static void
job_check_reference (const Job *job)
{
  const Shape *s = &job->shape;

  for (gint64 i = 0; i < s->m; i++)
    for (gint64 j = 0; j < s->n; j++)
      {
        gsize at = (gsize) i * s->ldc + (gsize) j;
        double sum = 0.0, magnitude = fabs (s->beta * job->c_start[at]);

        for (gint64 l = 0; l < s->k; l++)
          {
            double term = element (job->a64, s->transa, s->lda, i, l) *
                          element (job->b64, s->transb, s->ldb, l, j);

            sum += term;
            magnitude += fabs (s->alpha * term);
          }
        sum = s->alpha * sum + s->beta * job->c_start[at];
        if (fabs (job->sequential[at] - sum) > 1e-5 * MAX (magnitude, 1.0))
          g_error ("%c%c %" G_GINT64_FORMAT "×%" G_GINT64_FORMAT "×%" G_GINT64_FORMAT
                   ": C[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] = %.9g, float64 gives %.9g",
                   s->transa, s->transb, s->m, s->n, s->k, i, j, job->sequential[at], sum);
      }
  for (gint64 i = 0; i < s->m; i++)
    for (gsize j = (gsize) s->n; j < s->ldc && (gsize) i * s->ldc + j < job->c_len; j++)
      g_assert_cmpfloat (job->sequential[(gsize) i * s->ldc + j], ==, job->c_start[(gsize) i * s->ldc + j]);
}

/* Head dimensions 1, 40, 64, 128, 256, with [T, H, D] leading dimensions
 * (H = 2), and tiles of 1, 37, 100 and 128 rows. */
static GArray *
kernel_shapes (void)
{
  static const gint64 dims[] = { 1, 40, 64, 128, 256 };
  static const gint64 rows[] = { 1, 37, 100, 128 };
  GArray *shapes = g_array_new (FALSE, FALSE, sizeof (Shape));

  for (guint d = 0; d < G_N_ELEMENTS (dims); d++)
    {
      gint64 D = dims[d];
      gsize ld = 2 * (gsize) D;
      gint64 q = rows[d % G_N_ELEMENTS (rows)];
      gint64 kn = rows[(d + 2) % G_N_ELEMENTS (rows)];
      Shape products[] = {
        { 'N', 'T', q, kn, D, 0.125f, 0.0f, ld, ld, TILE },       /* S = scale · Q·Kᵀ */
        { 'N', 'N', q, D, kn, 1.0f, 1.0f, TILE, ld, ld },         /* out += P·V */
        { 'T', 'N', kn, D, q, 1.0f, 1.0f, TILE, ld, (gsize) D },  /* dV += Pᵀ·dO */
        { 'T', 'N', kn, D, q, 0.125f, 1.0f, TILE, ld, (gsize) D },/* dK += scale · dSᵀ·Q */
        { 'N', 'N', q, D, kn, 0.125f, 1.0f, TILE, ld, ld },       /* dQ += scale · dS·K */
      };

      g_array_append_vals (shapes, products, G_N_ELEMENTS (products));
    }
  return shapes;
}

typedef struct
{
  Job *jobs;
  guint n_jobs;
  int repeats;
  gint mismatches;
  gint runs;
} Stress;

static void
jobs_init (Stress *stress,
           guint   seed)
{
  g_autoptr(GArray) shapes = kernel_shapes ();
  g_autoptr(GRand) rand = g_rand_new_with_seed (seed);
  gboolean bfloat16 = _cp_attn_gemm_has_bfloat16 ();
  guint n_types = bfloat16 ? 2 : 1;

  stress->n_jobs = shapes->len * n_types;
  stress->jobs = g_new0 (Job, stress->n_jobs);
  for (guint t = 0; t < n_types; t++)
    for (guint i = 0; i < shapes->len; i++)
      job_init (&stress->jobs[t * shapes->len + i], t == 0 ? CP_ATTN_FLOAT32 : CP_ATTN_BFLOAT16,
                &g_array_index (shapes, Shape, i), rand);
  if (!bfloat16)
    g_test_message ("no bfloat16 matmul on this CPU: float32 products only, through the primitives");
}

static void
jobs_clear (Stress *stress)
{
  for (guint i = 0; i < stress->n_jobs; i++)
    job_clear (&stress->jobs[i]);
  g_free (stress->jobs);
}

/* One thread's products, as a kernel thread runs them: inside an OpenMP
 * region whose threads each run products single-threaded, items handed
 * out dynamically, in an order of its own. */
static void
run_team (Stress *stress,
          int     n_threads,
          guint   offset)
{
#pragma omp parallel num_threads (n_threads)
  {
    g_autofree float *c = NULL;
    gsize c_len = 0;

    omp_set_num_threads (1);
    for (guint i = 0; i < stress->n_jobs; i++)
      c_len = MAX (c_len, stress->jobs[i].c_len);
    c = g_new (float, c_len);
#pragma omp for schedule (dynamic, 1)
    for (guint i = 0; i < stress->n_jobs; i++)
      {
        const Job *job = &stress->jobs[(i + offset) % stress->n_jobs];

        job_run (job, c);
        if (memcmp (c, job->sequential, job->c_len * sizeof (float)) != 0)
          g_atomic_int_inc (&stress->mismatches);
        g_atomic_int_inc (&stress->runs);
      }
  }
}

/* Every product once, one after the other, as the kernel runs them: in
 * an OpenMP region, single-threaded (oneDNN would otherwise split a
 * product over the threads it may use, in another order of sums). */
static void
run_sequential (Stress *stress)
{
#pragma omp parallel num_threads (1)
  {
    omp_set_num_threads (1);
    for (guint i = 0; i < stress->n_jobs; i++)
      job_run (&stress->jobs[i], stress->jobs[i].sequential);
  }
}

/* A rank thread: every OpenMP team size in turn, @repeats times. */
static gpointer
stress_thread (gpointer data)
{
  gpointer *args = data;
  Stress *stress = args[0];
  guint offset = GPOINTER_TO_UINT (args[1]);

  for (int r = 0; r < stress->repeats; r++)
    for (int n_threads = 1; n_threads <= 3; n_threads++)
      run_team (stress, n_threads, offset + (guint) (r * 7 + n_threads));
  return NULL;
}

#define STRESS_THREADS 6

static void
test_concurrent (void)
{
  Stress stress = { 0 };
  GThread *threads[STRESS_THREADS];
  gpointer args[STRESS_THREADS][2];
  CpAttnGemmAudit audit;
  int expected;

  g_test_summary ("6 threads, each with OpenMP teams of 1, 2 and 3 threads, run the kernel's "
                  "products (ragged tiles, head dimensions 1 to 256) through the cached "
                  "primitives at once, 16 times over: every result equals the sequential one "
                  "bit for bit, which is within 1e-5 of float64, and no two executions in "
                  "flight share a thread's stream or scratchpad");
  _cp_attn_gemm_force_primitives (TRUE);
  jobs_init (&stress, 11);
  run_sequential (&stress);
  for (guint i = 0; i < stress.n_jobs; i++)
    job_check_reference (&stress.jobs[i]);

  stress.repeats = 16;
  _cp_attn_gemm_audit_start ();
  for (int t = 0; t < STRESS_THREADS; t++)
    {
      args[t][0] = &stress;
      args[t][1] = GUINT_TO_POINTER ((guint) t * 5);
      threads[t] = g_thread_new ("gemm-stress", stress_thread, args[t]);
    }
  for (int t = 0; t < STRESS_THREADS; t++)
    g_thread_join (threads[t]);
  _cp_attn_gemm_audit_stop (&audit);
  _cp_attn_gemm_force_primitives (FALSE);

  expected = STRESS_THREADS * stress.repeats * 3 * (int) stress.n_jobs;
  g_test_message ("%" G_GUINT64_FORMAT " executions, %" G_GUINT64_FORMAT " with a scratchpad "
                  "(largest %" G_GSIZE_FORMAT " bytes), at most %u at once",
                  audit.executions, audit.with_scratchpad, audit.largest_scratchpad,
                  audit.most_in_flight);
  g_assert_cmpint (stress.runs, ==, expected);
  g_assert_cmpint (stress.mismatches, ==, 0);
  g_assert_cmpuint (audit.executions, ==, (guint64) expected);
  g_assert_cmpuint (audit.shared, ==, 0);
  g_assert_cmpuint (audit.short_buffers, ==, 0);
  /* Otherwise the test proved nothing about concurrency. */
  g_assert_cmpuint (audit.most_in_flight, >=, 2);
  jobs_clear (&stress);
}

static void
test_user_scratchpad (void)
{
  Stress stress = { 0 };
  CpAttnGemmAudit audit;

  g_test_summary ("oneDNN reports a user-managed scratchpad for every cached primitive: the "
                  "library-managed one is shared by the threads executing a primitive unless "
                  "oneDNN was built for concurrent execution");
  _cp_attn_gemm_force_primitives (TRUE);
  jobs_init (&stress, 12);
  _cp_attn_gemm_audit_start ();
  run_sequential (&stress);
  _cp_attn_gemm_audit_stop (&audit);
  _cp_attn_gemm_force_primitives (FALSE);

  g_assert_cmpuint (audit.primitives, >=, 25);
  g_assert_cmpuint (audit.user_scratchpad, ==, audit.primitives);
  g_assert_cmpuint (audit.executions, ==, stress.n_jobs);
  g_assert_cmpuint (audit.short_buffers, ==, 0);
  jobs_clear (&stress);
}

/* oneDNN 2.6's avx512_core_bf16 GEMM turned ±∞ in the last element of
 * an odd K into NaN across the row of C (its AMX GEMM did not).  The
 * row of op(A) holding the ∞ must give exactly the infinities of exact
 * arithmetic, every other row its float64 value, whichever ISA oneDNN
 * takes (the suite runs again under each cap). */
static void
test_non_finite_odd_k (void)
{
  static const gint64 ks[] = { 1, 3, 73, 128 };

  g_test_summary ("bfloat16 products with ±∞ in op(A)'s last column give ±∞, not NaN, "
                  "for odd and even K, either transpose of A, beta 0 and 1");
  if (!_cp_attn_gemm_has_bfloat16 ())
    {
      g_test_skip ("oneDNN multiplies no bfloat16 on this CPU (float32 is used)");
      return;
    }
  for (guint x = 0; x < G_N_ELEMENTS (ks); x++)
    for (int t = 0; t < 2; t++)
      for (int beta = 0; beta < 2; beta++)
        {
          gint64 m = 76, n = 64, k = ks[x];
          char transa = t ? 'T' : 'N';
          gsize lda = t ? TILE : (gsize) k, ldb = (gsize) n, ldc = (gsize) n;
          gsize a_len = stored_len (transa, m, k, lda), b_len = stored_len ('N', k, n, ldb);
          g_autofree guint16 *a = g_new0 (guint16, a_len);
          g_autofree guint16 *b = g_new0 (guint16, b_len);
          g_autofree float *c = g_new (float, (gsize) m * ldc);
          float infinity = x % 2 ? -INFINITY : INFINITY;

          for (gint64 i = 0; i < m; i++)
            for (gint64 l = 0; l < k; l++)
              a[t ? (gsize) l * lda + (gsize) i : (gsize) i * lda + (gsize) l] =
                _cp_float_to_bf16 (0.25f + 0.125f * (float) ((i + l) % 5));
          a[t ? (gsize) (k - 1) * lda : (gsize) (k - 1)] = _cp_float_to_bf16 (infinity);
          for (gint64 l = 0; l < k; l++)
            for (gint64 j = 0; j < n; j++)
              b[(gsize) l * ldb + (gsize) j] = _cp_float_to_bf16 (j % 2 ? 0.5f : -0.75f);
          for (gsize i = 0; i < (gsize) m * ldc; i++)
            c[i] = 1.0f;

          _cp_attn_gemm (CP_ATTN_BFLOAT16, transa, 'N', m, n, k, 0.125f, a, lda, b, ldb,
                         (float) beta, c, ldc);

          for (gint64 j = 0; j < n; j++)
            {
              /* Row 0: every term finite but the last, ∞ times ±b. */
              float want = (j % 2 ? 1.0f : -1.0f) * infinity;

              if (c[j] != want)
                g_error ("K = %" G_GINT64_FORMAT ", A%s, beta %d: C[0][%" G_GINT64_FORMAT "] is %g "
                         "where exact arithmetic gives %g", k, t ? "^T" : "", beta, j, c[j], want);
            }
          for (gint64 i = 1; i < m; i++)
            for (gint64 j = 0; j < n; j++)
              {
                double want = beta;

                for (gint64 l = 0; l < k; l++)
                  want += 0.125 * (0.25 + 0.125 * (double) ((i + l) % 5)) * (j % 2 ? 0.5 : -0.75);
                g_assert_cmpfloat_with_epsilon (c[(gsize) i * ldc + (gsize) j], want, 1e-3 * (1.0 + fabs (want)));
              }
        }
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Attention/gemm/user-scratchpad", test_user_scratchpad);
  g_test_add_func ("/Cp/Attention/gemm/concurrent", test_concurrent);
  g_test_add_func ("/Cp/Attention/gemm/non-finite/odd-k", test_non_finite_odd_k);

  return g_test_run ();
}
