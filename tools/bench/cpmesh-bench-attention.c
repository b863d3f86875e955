/* cpmesh-bench-attention.c: `cpmesh bench attention`
 *
 * Single-rank causal attention forward and forward+backward against
 * oneDNN's own matmul throughput measured in the same run, then C ranks
 * of an in-process mesh on the same sequence: per-rank imbalance and
 * total CPU time against the single-rank run.  No speed is printed for
 * results that are wrong: every case is checked against float64 first.
 *
 * Its targets, on the default sizes: forward + backward at half the
 * matmul's rate or better, and C ranks within 10 % of each other and
 * within 25 % of the single rank's CPU time.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>

#include "cpmesh-bench.h"

typedef struct
{
  GArray *seq_lens;        /* of gint64; NULL: the default */
  int reps;
  int cp_size;
  gint64 cp_seq_len;
  gboolean skip_torch;
  double tolerance_scale;
  CpmeshBench run;
} BenchOptions;

/* Every case runs with B = 1, H = 16, D = 128. */
#define HEADS 16
#define HEAD_DIM 128

static double
process_cpu_s (void)
{
  struct rusage usage;

  getrusage (RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

static double
thread_cpu_s (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* oneDNN's float32 GEMM on 2048³, all threads: the baseline every
 * attention figure is compared with. */
static double
matmul_float32_gflops (int reps)
{
  gint64 n = 2048;
  g_autofree float *a = g_new (float, n * n);
  g_autofree float *b = g_new (float, n * n);
  g_autofree float *c = g_new (float, n * n);
  double best = INFINITY;

  for (gint64 i = 0; i < n * n; i++)
    a[i] = b[i] = (float) ((i % 17) - 8) / 8.0f;
  for (int r = 0; r < reps + 1; r++)
    {
      double t = cpmesh_now_seconds ();

      dnnl_sgemm ('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      t = cpmesh_now_seconds () - t;
      if (r > 0)
        best = MIN (best, t);
    }
  return 2.0 * n * n * n / best / 1e9;
}

/* oneDNN's bfloat16 matmul (float32 result) on 2048³, or 0 when this
 * oneDNN has no bfloat16 matmul for this CPU. */
static double
matmul_bfloat16_gflops (int reps)
{
  dnnl_dim_t n = 2048;
  dnnl_dims_t dims = { n, n };
  dnnl_engine_t engine = NULL;
  dnnl_stream_t stream = NULL;
  dnnl_memory_desc_t a_md, b_md, c_md;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  dnnl_memory_t a = NULL, b = NULL, c = NULL;
  double best = INFINITY;

  dnnl_engine_create (&engine, dnnl_cpu, 0);
  dnnl_stream_create (&stream, engine, dnnl_stream_default_flags);
  dnnl_memory_desc_init_by_tag (&a_md, 2, dims, dnnl_bf16, dnnl_ab);
  dnnl_memory_desc_init_by_tag (&b_md, 2, dims, dnnl_bf16, dnnl_ab);
  dnnl_memory_desc_init_by_tag (&c_md, 2, dims, dnnl_f32, dnnl_ab);
  dnnl_matmul_desc_init (&desc, &a_md, &b_md, NULL, &c_md);
  if (dnnl_primitive_desc_create (&pd, &desc, NULL, engine, NULL) == dnnl_success &&
      dnnl_primitive_create (&prim, pd) == dnnl_success)
    {
      dnnl_memory_create (&a, &a_md, engine, DNNL_MEMORY_ALLOCATE);
      dnnl_memory_create (&b, &b_md, engine, DNNL_MEMORY_ALLOCATE);
      dnnl_memory_create (&c, &c_md, engine, DNNL_MEMORY_ALLOCATE);
      for (int r = 0; r < reps + 1; r++)
        {
          dnnl_exec_arg_t args[] = { { DNNL_ARG_SRC, a }, { DNNL_ARG_WEIGHTS, b }, { DNNL_ARG_DST, c } };
          double t = cpmesh_now_seconds ();

          dnnl_primitive_execute (prim, stream, 3, args);
          dnnl_stream_wait (stream);
          t = cpmesh_now_seconds () - t;
          if (r > 0)
            best = MIN (best, t);
        }
    }
  if (a) dnnl_memory_destroy (a);
  if (b) dnnl_memory_destroy (b);
  if (c) dnnl_memory_destroy (c);
  if (prim) dnnl_primitive_destroy (prim);
  if (pd) dnnl_primitive_desc_destroy (pd);
  dnnl_stream_destroy (stream);
  dnnl_engine_destroy (engine);
  return isfinite (best) ? 2.0 * n * n * n / best / 1e9 : 0.0;
}

/* Causal forward FLOPs: 2·S²·D·H (half of 4·S²·D·H); backward 2.5×. */
static double
forward_flops (gint64 s,
               int    h,
               int    d)
{
  return 2.0 * (double) s * (double) s * d * h;
}

static CpTensor *
random_tensor (CpDType  dtype,
               gint64   b,
               gint64   h,
               gint64   s,
               gint64   d,
               guint    seed)
{
  gint64 shape[] = { b, h, s, d };
  g_autoptr(GError) error = NULL;
  CpTensor *t = cp_tensor_new (dtype, shape, 4, &error);
  GRand *rand;
  gint64 n;

  if (t == NULL)
    {
      /* A benchmark has nothing to measure without its inputs. */
      g_printerr ("bench attention: %s\n", error->message);
      exit (CPMESH_EXIT_FAILED);
    }
  rand = g_rand_new_with_seed (seed);
  n = cp_tensor_get_numel (t);

  if (dtype == CP_DTYPE_FLOAT32)
    {
      float *data = cp_tensor_get_data (t);

      for (gint64 i = 0; i < n; i++)
        data[i] = (float) g_rand_double_range (rand, -1.0, 1.0);
    }
  else
    for (gint64 i = 0; i < n; i++)
      cp_tensor_set_value (t, i, g_rand_double_range (rand, -1.0, 1.0));
  g_rand_free (rand);
  return t;
}

typedef struct
{
  double forward_s;
  double backward_s;
  double cpu_s;
} Timing;

/* What one forward+backward returns: out, lse, dq, dk, dv. */
#define N_OUTPUTS 5

static const char * const output_names[N_OUTPUTS] = { "out", "lse", "dq", "dk", "dv" };

static void
outputs_clear (CpTensor **outputs)
{
  for (int o = 0; o < N_OUTPUTS; o++)
    g_clear_object (&outputs[o]);
}

/* Times one forward+backward and keeps its results in @outputs. */
static gboolean
time_attention (CpAttention  *attention,
                CpTensor     *q,
                CpTensor     *k,
                CpTensor     *v,
                CpTensor     *dout,
                Timing       *timing,
                CpTensor    **outputs,
                GError      **error)
{
  double t0 = cpmesh_now_seconds (), t1;

  outputs_clear (outputs);
  if (!cp_attention_forward (attention, q, k, v, &outputs[0], &outputs[1], error))
    return FALSE;
  t1 = cpmesh_now_seconds ();
  if (!cp_attention_backward (attention, dout, q, k, v, outputs[0], outputs[1],
                              &outputs[2], &outputs[3], &outputs[4], error))
    return FALSE;
  timing->forward_s = t1 - t0;
  timing->backward_s = cpmesh_now_seconds () - t1;
  return TRUE;
}

/* The check.  The first run of every case is compared with causal
 * attention computed here in float64 from the same inputs: on the first
 * rows, at the first tile boundary, in the middle and on the last
 * CHECK_TAIL rows of three heads (the last keys' dK and dV depend on the
 * last rows alone, so they are checked too), or everywhere for a small
 * problem.  Every later run must give the first run's bits: the library's
 * results do not depend on timing or scheduling, so any difference is a
 * wrong result, wherever it lies. */
#define CHECK_TAIL 32

typedef struct
{
  double err[N_OUTPUTS];   /* max |library − float64| */
  double ref[N_OUTPUTS];   /* max |float64| */
  double tolerance;        /* allowed error, relative to max |float64| of each output */
  gsize rows;              /* query rows compared */
  int repeats;             /* later runs found bit-identical */
} Check;

/* float32: the sums run over up to S terms in float32; bfloat16: the
 * outputs are rounded to bfloat16 and, where the CPU multiplies
 * bfloat16, so are P and dS, as flash attention does. */
static double
tolerance_of (CpDType dtype,
              double  scale)
{
  return (dtype == CP_DTYPE_FLOAT32 ? 1e-4 : 2.5e-2) * scale;
}

static inline double
element (CpTensor *t,
         gsize     i)
{
  gconstpointer data = cp_tensor_get_data (t);
  guint32 bits;
  float f;

  if (cp_tensor_get_dtype (t) == CP_DTYPE_FLOAT32)
    return ((const float *) data)[i];
  bits = (guint32) ((const guint16 *) data)[i] << 16;
  memcpy (&f, &bits, sizeof f);
  return f;
}

static void
compare (Check  *check,
         int     output,
         double  got,
         double  want)
{
  /* NaN counts as an infinite error. */
  double err = isnan (got) || isnan (want) ? INFINITY : fabs (got - want);

  check->err[output] = MAX (check->err[output], err);
  check->ref[output] = MAX (check->ref[output], fabs (want));
}

/* One head of the inputs in float64, [S, D] each. */
typedef struct
{
  int h;
  gint64 S;
  double *q, *k, *v, *dout;
  double *s;           /* S scores, then probabilities, of one row */
  double *dk, *dv;     /* the keys' gradients from @tail on */
  gint64 tail;
} Head;

static double *
head_values (CpTensor *t,
             int       h,
             gint64    S)
{
  gsize n = (gsize) S * HEAD_DIM, first = (gsize) h * n;
  double *values = g_new (double, n);

  for (gsize i = 0; i < n; i++)
    values[i] = element (t, first + i);
  return values;
}

static void
head_init (Head      *head,
           CpTensor **inputs,
           int        h,
           gint64     tail)
{
  gint64 S = cp_tensor_get_dim (inputs[0], 2);

  *head = (Head) { h, S, head_values (inputs[0], h, S), head_values (inputs[1], h, S),
                   head_values (inputs[2], h, S), head_values (inputs[3], h, S), g_new (double, S),
                   g_new0 (double, (gsize) (S - tail) * HEAD_DIM),
                   g_new0 (double, (gsize) (S - tail) * HEAD_DIM), tail };
}

static void
head_clear (Head *head)
{
  g_free (head->q);
  g_free (head->k);
  g_free (head->v);
  g_free (head->dout);
  g_free (head->s);
  g_free (head->dk);
  g_free (head->dv);
}

static double
dot (const double *a,
     const double *b)
{
  double sum = 0.0;

  for (int d = 0; d < HEAD_DIM; d++)
    sum += a[d] * b[d];
  return sum;
}

/* Query row @i in float64, compared with out, lse and dq; the row's share
 * of dK, dV of the keys from the tail on goes to the head's sums. */
static void
check_row (Head       *head,
           CpTensor  **outputs,
           gint64      i,
           Check      *check)
{
  double scale = 1.0 / sqrt (HEAD_DIM), m = -INFINITY, l = 0.0, lse, delta;
  const double *q = head->q + (gsize) i * HEAD_DIM, *dout = head->dout + (gsize) i * HEAD_DIM;
  gsize row = ((gsize) head->h * (gsize) head->S + (gsize) i) * HEAD_DIM;
  double out[HEAD_DIM] = { 0 }, dq[HEAD_DIM] = { 0 };
  double *s = head->s;

  for (gint64 j = 0; j <= i; j++)
    {
      s[j] = scale * dot (q, head->k + (gsize) j * HEAD_DIM);
      m = MAX (m, s[j]);
    }
  for (gint64 j = 0; j <= i; j++)
    l += exp (s[j] - m);
  lse = m + log (l);
  for (gint64 j = 0; j <= i; j++)
    {
      s[j] = exp (s[j] - lse);
      for (int d = 0; d < HEAD_DIM; d++)
        out[d] += s[j] * head->v[(gsize) j * HEAD_DIM + d];
    }
  delta = dot (dout, out);
  for (gint64 j = 0; j <= i; j++)
    {
      double ds = s[j] * (dot (dout, head->v + (gsize) j * HEAD_DIM) - delta);
      gsize key = (gsize) (j - head->tail) * HEAD_DIM;

      for (int d = 0; d < HEAD_DIM; d++)
        dq[d] += scale * ds * head->k[(gsize) j * HEAD_DIM + d];
      for (int d = 0; d < HEAD_DIM && j >= head->tail; d++)
        {
          head->dk[key + d] += scale * ds * q[d];
          head->dv[key + d] += s[j] * dout[d];
        }
    }
  for (int d = 0; d < HEAD_DIM; d++)
    {
      compare (check, 0, element (outputs[0], row + d), out[d]);
      compare (check, 2, element (outputs[2], row + d), dq[d]);
    }
  compare (check, 1, element (outputs[1], (gsize) head->h * (gsize) head->S + (gsize) i), lse);
  check->rows++;
}

/* Rows 0, 1, 127, 128 (the first tile boundary) and S/2, and the keys
 * and queries from @tail on, whose dK and dV are then complete. */
static void
check_head (CpTensor **inputs,
            CpTensor **outputs,
            int        h,
            gint64     tail,
            Check     *check)
{
  gint64 S = cp_tensor_get_dim (inputs[0], 2);
  gint64 samples[] = { 0, 1, 127, 128, S / 2 };
  gsize first_key = ((gsize) h * (gsize) S + (gsize) tail) * HEAD_DIM;
  Head head;

  head_init (&head, inputs, h, tail);
  for (guint n = 0; n < G_N_ELEMENTS (samples); n++)
    if (samples[n] < tail && (n == 0 || samples[n] > samples[n - 1]))
      check_row (&head, outputs, samples[n], check);
  for (gint64 i = tail; i < S; i++)
    check_row (&head, outputs, i, check);
  for (gsize e = 0; e < (gsize) (S - tail) * HEAD_DIM; e++)
    {
      compare (check, 3, element (outputs[3], first_key + e), head.dk[e]);
      compare (check, 4, element (outputs[4], first_key + e), head.dv[e]);
    }
  head_clear (&head);
}

/* Heads 0, H/2 and H − 1 at sampled rows, or with @everywhere every
 * element of every head. */
static void
check_float64 (CpTensor **inputs,
               CpTensor **outputs,
               gboolean   everywhere,
               double     tolerance_scale,
               Check     *check)
{
  gint64 S = cp_tensor_get_dim (inputs[0], 2);
  gint64 tail = everywhere ? 0 : MAX (S - CHECK_TAIL, 0);

  memset (check, 0, sizeof *check);
  check->tolerance = tolerance_of (cp_tensor_get_dtype (inputs[0]), tolerance_scale);
  for (int h = 0; h < HEADS; h += everywhere ? 1 : HEADS / 2)
    check_head (inputs, outputs, h, tail, check);
  if (!everywhere)
    check_head (inputs, outputs, HEADS - 1, tail, check);
}

static gboolean
check_passed (const Check *check)
{
  for (int o = 0; o < N_OUTPUTS; o++)
    if (!(check->err[o] <= check->tolerance * MAX (check->ref[o], 1e-6)))
      return FALSE;
  return TRUE;
}

/* "out 1.2e-07/3.4e-05, lse ..., …": each output's max error against its
 * tolerance. */
static char *
check_describe (const Check *check)
{
  GString *text = g_string_new (NULL);

  for (int o = 0; o < N_OUTPUTS; o++)
    g_string_append_printf (text, "%s%s %.2g/%.2g", o > 0 ? ", " : "", output_names[o],
                            check->err[o], check->tolerance * MAX (check->ref[o], 1e-6));
  return g_string_free (text, FALSE);
}

/* Fails with the check's figures when a result is wrong. */
static gboolean
check_report (const Check  *check,
              const char   *what,
              GError      **error)
{
  g_autofree char *figures = NULL;

  if (check_passed (check))
    return TRUE;
  figures = check_describe (check);
  return cpmesh_bench_wrong (error, "%s: max error against float64 over %" G_GSIZE_FORMAT
                             " rows above the tolerance (%g of the largest |value|) "
                             "(max error/tolerance: %s)", what, check->rows, check->tolerance,
                             figures);
}

/* Later runs: the first run's bits, or an error naming the output. */
static gboolean
check_same_bits (CpTensor   **first,
                 CpTensor   **again,
                 const char  *what,
                 int          run,
                 Check       *check,
                 GError     **error)
{
  for (int o = 0; o < N_OUTPUTS; o++)
    if (!cp_tensor_equal (first[o], again[o]))
      {
        return cpmesh_bench_wrong (error, "%s: run %d gave %s other bits than the first run, "
                                   "which matched float64", what, run + 1, output_names[o]);
      }
  check->repeats++;
  return TRUE;
}

/* Checks the results of run @run of a case: the first against float64,
 * the others against the first, which it keeps in @first. */
static gboolean
check_run (CpTensor    **inputs,
           CpTensor    **outputs,
           CpTensor    **first,
           int           run,
           gboolean      everywhere,
           double        tolerance_scale,
           const char   *what,
           Check        *check,
           GError      **error)
{
  if (run > 0)
    return check_same_bits (first, outputs, what, run, check, error);
  cpmesh_bench_corrupt (outputs[0]);
  check_float64 (inputs, outputs, everywhere, tolerance_scale, check);
  for (int o = 0; o < N_OUTPUTS; o++)
    g_set_object (&first[o], outputs[o]);
  return check_report (check, what, error);
}

/* A baseline GFLOP/s figure measured next to an attention run. */
typedef double (*BaselineFunc) (int reps);

typedef struct
{
  Timing timing;
  double baseline;   /* GFLOP/s, the mean of right before and right after */
} Sample;

/* Four [1, H, S, D] inputs: q, k, v, dout. */
static void
inputs_new (CpDType    dtype,
            gint64     s,
            guint      seed,
            CpTensor **inputs)
{
  for (guint i = 0; i < 4; i++)
    inputs[i] = random_tensor (dtype, 1, HEADS, s, HEAD_DIM, seed + i);
}

static void
inputs_clear (CpTensor **inputs)
{
  for (int i = 0; i < 4; i++)
    g_clear_object (&inputs[i]);
}

/* One case of one rank: its inputs, what the check found, and the
 * settings of the check. */
typedef struct
{
  CpDType dtype;
  gint64 seq_len;
  gboolean everywhere;     /* check every element against float64 */
  double tolerance_scale;
  Check check;
} Case;

static char *
case_name (const Case *c)
{
  return g_strdup_printf ("%s S=%" G_GINT64_FORMAT, cp_dtype_get_name (c->dtype), c->seq_len);
}

/* Times @reps forward+backward runs after an uncounted one that faults
 * the buffers in and is checked against float64; every counted run must
 * give its bits.  With @baseline, the matmul is measured right before and
 * after every run, so that each run has a baseline taken under the same
 * load: the machine is shared and its speed drifts. */
static gboolean
single_rank (Case          *c,
             int            reps,
             BaselineFunc   baseline,
             Sample        *samples,
             GError       **error)
{
  const char *names[] = { "cp", NULL };
  int one = 1;
  GList *meshes = cp_mesh_new_local_group (names, &one, 1, error);
  g_autoptr(CpAttention) attention = NULL;
  g_autofree char *what = case_name (c);
  CpTensor *inputs[4], *outputs[N_OUTPUTS] = { NULL }, *first[N_OUTPUTS] = { NULL };
  gboolean ok = meshes != NULL;

  inputs_new (c->dtype, c->seq_len, 1, inputs);
  if (ok)
    attention = cp_attention_new (meshes->data, NULL, error);
  ok = attention != NULL;
  for (int r = -1; ok && r < reps; r++)
    {
      double before, cpu;
      Timing t;

      cpmesh_progress ("%s: run %d of %d%s", what, r + 2, reps + 1,
                       r < 0 ? " (checked against float64, not timed)" : "");
      before = baseline && r >= 0 ? baseline (1) : 0.0;
      cpu = process_cpu_s ();

      ok = time_attention (attention, inputs[0], inputs[1], inputs[2], inputs[3], &t, outputs, error);
      if (ok)
        t.cpu_s = process_cpu_s () - cpu;
      if (ok && r >= 0)
        samples[r] = (Sample) { t, baseline ? (before + baseline (1)) / 2 : 0.0 };
      ok = ok && check_run (inputs, outputs, first, r + 1, c->everywhere, c->tolerance_scale,
                            what, &c->check, error);
    }
  outputs_clear (outputs);
  outputs_clear (first);
  inputs_clear (inputs);
  g_list_free_full (meshes, g_object_unref);
  return ok;
}

/* Whether PyTorch's S × S scores, and the softmax of them, fit in half
 * of physical memory: at S = 16384 they take 32 GiB. */
static gboolean
torch_fits (gint64 s)
{
  double bytes = 2.0 * 16 * (double) s * (double) s * sizeof (float);
  double memory = (double) sysconf (_SC_PHYS_PAGES) * (double) sysconf (_SC_PAGESIZE);

  return bytes <= memory / 2;
}

/* Times PyTorch computing the same causal attention as matmul + mask +
 * softmax + matmul, when cpmesh_bench_python () can import torch. */
static double
torch_gflops (CpDType dtype,
              gint64  s)
{
  g_autofree char *script = g_strdup_printf (
    "import time, torch\n"
    "torch.set_num_threads(%d)\n"
    "dt = torch.%s\n"
    "q, k, v = (torch.randn(1, 16, %" G_GINT64_FORMAT ", 128, dtype=dt) for _ in range(3))\n"
    "mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1)\n"
    "best = 1e9\n"
    "for _ in range(2):\n"
    "    t = time.perf_counter()\n"
    "    s = (q @ k.transpose(-1, -2)) * 128 ** -0.5\n"
    "    s.masked_fill_(mask, float('-inf'))\n"
    "    o = torch.softmax(s, -1) @ v\n"
    "    best = min(best, time.perf_counter() - t)\n"
    "print(best)\n",
    (int) g_get_num_processors (), dtype == CP_DTYPE_FLOAT32 ? "float32" : "bfloat16", s);
  const char *argv[] = { cpmesh_bench_python (), "-c", script, NULL };
  g_autofree char *output = NULL;
  int status = 0;

  if (!torch_fits (s))
    return 0.0;
  if (!g_spawn_sync (NULL, (char **) argv, NULL, G_SPAWN_STDERR_TO_DEV_NULL, NULL, NULL,
                     &output, NULL, &status, NULL) || status != 0)
    return 0.0;
  return forward_flops (s, 16, 128) / g_ascii_strtod (output, NULL) / 1e9;
}

/* The version of torch that cpmesh_bench_python () imports, or NULL. */
static char *
torch_version (void)
{
  const char *argv[] = { cpmesh_bench_python (), "-c", "import torch; print(torch.__version__)", NULL };
  g_autofree char *output = NULL;
  int status = 1;

  if (!g_spawn_sync (NULL, (char **) argv, NULL, G_SPAWN_STDERR_TO_DEV_NULL, NULL, NULL,
                     &output, NULL, &status, NULL) || status != 0)
    return NULL;
  return g_strstrip (g_steal_pointer (&output));
}

/* What the PyTorch column holds, and why it may be empty. */
static char *
describe_torch (gboolean    skipped,
                gboolean    quick,
                const char *version)
{
  if (skipped)
    return g_strdup_printf ("skipped (%s)", quick ? "--quick" : "--no-torch");
  if (version == NULL)
    return g_strdup_printf ("skipped (%s cannot import torch; set CPMESH_PYTHON to an "
                            "interpreter that can)", cpmesh_bench_python ());
  return g_strdup_printf ("torch %s from %s; \"-\" where its S x S scores would not fit in "
                          "half the memory", version, cpmesh_bench_python ());
}

/* Prints the best times and the median of each run's ratio to its own
 * baseline; returns that of forward + backward. */
static double
print_single_rank (CpDType       dtype,
                   gint64        s,
                   const Sample *samples,
                   int           n,
                   double        torch)
{
  double fwd = forward_flops (s, 16, 128);
  g_autofree double *fwd_ratio = g_new (double, n);
  g_autofree double *both_ratio = g_new (double, n);
  g_autofree double *baseline = g_new (double, n);
  double best_fwd = INFINITY, best_both = INFINITY, median_both;
  char torch_text[32] = "-";

  for (int r = 0; r < n; r++)
    {
      double both = samples[r].timing.forward_s + samples[r].timing.backward_s;

      fwd_ratio[r] = fwd / samples[r].timing.forward_s / 1e9 / samples[r].baseline;
      both_ratio[r] = 3.5 * fwd / both / 1e9 / samples[r].baseline;
      baseline[r] = samples[r].baseline;
      best_fwd = MIN (best_fwd, samples[r].timing.forward_s);
      best_both = MIN (best_both, both);
    }
  if (torch > 0)
    g_snprintf (torch_text, sizeof torch_text, "%.1f", torch);
  median_both = cpmesh_bench_median (both_ratio, n);
  printf ("| %-8s | %6" G_GINT64_FORMAT " | %6.2f | %8.1f | %7.2f | %6.2f | %8.1f | %7.2f | %6.1f | %14s |\n",
          cp_dtype_get_name (dtype), s, best_fwd, fwd / best_fwd / 1e9,
          cpmesh_bench_median (fwd_ratio, n), best_both, 3.5 * fwd / best_both / 1e9,
          median_both, cpmesh_bench_median (baseline, n), torch_text);
  return median_both;
}

/* The C-rank run: every rank times its own thread's CPU and hands in its
 * pieces of the results. */
typedef struct
{
  CpRotateMethod method;
  CpTensor **inputs;
  CpLayout *layout;
  int cp_size;
  double *rank_cpu_s;
  CpTensor **pieces;      /* [N_OUTPUTS][cp_size] */
} CpRun;

typedef struct
{
  CpmeshBenchRank base;
  CpRun *run;
} CpRank;

static gboolean
cp_rank_attention (gpointer   data,
                   GError   **error)
{
  CpRank *self = data;
  CpRun *run = self->run;
  int rank = self->base.rank;
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(CpAttention) attention = NULL;
  CpTensor *shards[4] = { NULL }, *outputs[N_OUTPUTS] = { NULL };
  gboolean ok = TRUE;
  Timing t;
  double cpu;

  for (int i = 0; ok && i < 4; i++)
    ok = (shards[i] = cp_layout_shard (run->layout, run->inputs[i], 2, rank, error)) != NULL;
  cp_attention_options_set_rotate_method (options, run->method);
  if (ok)
    ok = (attention = cp_attention_new (self->base.mesh, options, error)) != NULL;
  cpu = thread_cpu_s ();
  ok = ok && time_attention (attention, shards[0], shards[1], shards[2], shards[3], &t, outputs,
                             error);
  run->rank_cpu_s[rank] = thread_cpu_s () - cpu;
  for (int o = 0; o < N_OUTPUTS; o++)
    run->pieces[o * run->cp_size + rank] = outputs[o];
  for (int i = 0; i < 4; i++)
    g_clear_object (&shards[i]);
  return ok;
}

/* The full results of the ranks' pieces (the sequence is dimension 2 of
 * every output). */
static gboolean
cp_unshard (CpRun     *run,
            CpTensor **outputs,
            GError   **error)
{
  for (int o = 0; o < N_OUTPUTS; o++)
    {
      outputs[o] = cp_layout_unshard_pieces (run->layout, &run->pieces[o * run->cp_size],
                                             run->cp_size, 2, error);
      if (outputs[o] == NULL)
        return FALSE;
    }
  return TRUE;
}

static gboolean
cp_ranks (CpRotateMethod  method,
          int             cp_size,
          gint64          s,
          CpTensor      **inputs,
          double         *rank_cpu_s,
          double         *process_cpu,
          double         *wall,
          CpTensor      **outputs,
          GError        **error)
{
  g_autofree CpTensor **pieces = g_new0 (CpTensor *, N_OUTPUTS * cp_size);
  g_autofree CpRank *ranks = g_new0 (CpRank, cp_size);
  g_autofree gpointer *rank_data = g_new0 (gpointer, cp_size);
  CpRun run = { method, inputs, NULL, cp_size, rank_cpu_s, pieces };
  gboolean ok;
  double cpu, t;

  run.layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, s, cp_size, error);
  if (run.layout == NULL)
    return FALSE;
  for (int r = 0; r < cp_size; r++)
    {
      ranks[r].run = &run;
      rank_data[r] = &ranks[r];
    }
  cpu = process_cpu_s ();
  t = cpmesh_now_seconds ();
  ok = cpmesh_bench_run_ranks (cp_size, cp_rank_attention, rank_data, error);
  *wall = cpmesh_now_seconds () - t;
  *process_cpu = process_cpu_s () - cpu;
  for (int r = 0; r < cp_size; r++)
    g_clear_error (&ranks[r].base.error);
  outputs_clear (outputs);
  ok = ok && cp_unshard (&run, outputs, error);
  for (int i = 0; i < N_OUTPUTS * cp_size; i++)
    g_clear_object (&pieces[i]);
  cp_layout_unref (run.layout);
  return ok;
}

/* Lines that say what each case's check found. */
static void
append_check (GString    *text,
              const char *what,
              const Check *check)
{
  g_autofree char *figures = check_describe (check);

  g_string_append_printf (text, "%s: float64 at %" G_GSIZE_FORMAT " query rows, max error/tolerance "
                          "%s; later runs bit-identical: %d\n", what, check->rows, figures,
                          check->repeats);
}

typedef struct
{
  double cpu, wall;
  double *rank_cpu;
} CpBest;

static const char *
method_name (CpRotateMethod method)
{
  return method == CP_ROTATE_METHOD_ALLGATHER ? "allgather" : "ring";
}

static char *
method_case_name (const BenchOptions *options,
                  CpRotateMethod      method)
{
  return g_strdup_printf ("C=%d %s float32 S=%" G_GINT64_FORMAT, options->cp_size,
                          method_name (method), options->cp_seq_len);
}

/* Steady state, as in training: the first run faults its buffers in and
 * is checked against float64, later ones reuse them and must give its
 * bits; the run with the least CPU counts. */
static gboolean
cp_method (const BenchOptions  *options,
           CpRotateMethod       method,
           CpTensor           **inputs,
           CpBest              *best,
           Check               *check,
           GError             **error)
{
  int c = options->cp_size;
  g_autofree double *trial_cpu = g_new0 (double, c);
  g_autofree char *what = method_case_name (options, method);
  CpTensor *outputs[N_OUTPUTS] = { NULL }, *first[N_OUTPUTS] = { NULL };
  gboolean ok = TRUE;

  best->cpu = INFINITY;
  for (int rep = 0; ok && rep < options->reps + 1; rep++)
    {
      double trial, trial_wall;

      cpmesh_progress ("%s: run %d of %d%s", what, rep + 1, options->reps + 1,
                       rep == 0 ? " (checked against float64, not timed)" : "");
      ok = cp_ranks (method, c, options->cp_seq_len, inputs, trial_cpu, &trial, &trial_wall,
                     outputs, error) &&
           check_run (inputs, outputs, first, rep, FALSE, options->tolerance_scale, what, check, error);
      if (ok && rep > 0 && trial < best->cpu)
        {
          best->cpu = trial;
          best->wall = trial_wall;
          memcpy (best->rank_cpu, trial_cpu, c * sizeof (double));
        }
    }
  outputs_clear (outputs);
  outputs_clear (first);
  return ok;
}

/* The targets of the C-rank run: how evenly the ranks share the work,
 * and what splitting it costs. */
#define MAX_IMBALANCE 1.10
#define MAX_CPU_VS_ONE_RANK 1.25

static gboolean
bench_cp (BenchOptions  *options,
          GError       **error)
{
  gint64 s = options->cp_seq_len;
  int c = options->cp_size;
  CpTensor *inputs[4];
  g_autofree Sample *samples = g_new0 (Sample, options->reps);
  g_autoptr(GString) checks = g_string_new (NULL);
  g_autofree char *single_what = NULL;
  Case single_case = { CP_DTYPE_FLOAT32, s, FALSE, options->tolerance_scale };
  Timing single = { INFINITY, INFINITY, INFINITY };
  double imbalance[2] = { 0 }, cpu_ratio[2] = { 0 };
  gboolean ok;

  inputs_new (CP_DTYPE_FLOAT32, s, 10, inputs);
  ok = single_rank (&single_case, options->reps, NULL, samples, error);
  for (int r = 0; ok && r < options->reps; r++)
    single.cpu_s = MIN (single.cpu_s, samples[r].timing.cpu_s);
  single_what = g_strdup_printf ("C=1 float32 S=%" G_GINT64_FORMAT, s);
  append_check (checks, single_what, &single_case.check);
  for (int method = 0; ok && method < 2; method++)
    {
      g_autofree double *rank_cpu = g_new0 (double, c);
      CpBest best = { INFINITY, 0, rank_cpu };
      double lo = INFINITY, hi = 0, mean = 0;
      Check check;

      ok = cp_method (options, method, inputs, &best, &check, error);
      if (!ok)
        break;
      if (method == 0)
        {
          printf ("\nC = %d ranks in one process, float32, causal, B=1 H=16 D=128 S=%" G_GINT64_FORMAT
                  ", forward+backward\n\n", c, s);
          printf ("| method    | wall s | rank CPU s (min..max) | imbalance max/mean | CPU s | CPU vs 1 rank (%.2f s) |\n",
                  single.cpu_s);
          printf ("|-----------|--------|-----------------------|--------------------|-------|-------------------------|\n");
        }
      for (int r = 0; r < c; r++)
        {
          lo = MIN (lo, rank_cpu[r]);
          hi = MAX (hi, rank_cpu[r]);
          mean += rank_cpu[r] / c;
        }
      imbalance[method] = hi / mean;
      cpu_ratio[method] = best.cpu / single.cpu_s;
      printf ("| %-9s | %6.2f | %9.2f..%-9.2f | %18.3f | %5.2f | %23.3f |\n",
              method_name (method), best.wall, lo, hi, imbalance[method], best.cpu,
              cpu_ratio[method]);
      fflush (stdout);
      {
        g_autofree char *what = method_case_name (options, method);

        append_check (checks, what, &check);
      }
    }
  if (ok)
    printf ("\nChecked before timing: %s\n", checks->str);
  for (int method = 0; ok && method < 2; method++)
    {
      g_autofree char *balance = g_strdup_printf ("%s: rank CPU imbalance, max over mean",
                                                  method_name (method));
      g_autofree char *cost = g_strdup_printf ("%s: CPU time against 1 rank", method_name (method));

      cpmesh_bench_target (&options->run, balance, imbalance[method], CPMESH_AT_MOST, MAX_IMBALANCE);
      cpmesh_bench_target (&options->run, cost, cpu_ratio[method], CPMESH_AT_MOST,
                           MAX_CPU_VS_ONE_RANK);
    }
  inputs_clear (inputs);
  return ok;
}

/* The instruction set oneDNN dispatches to, by name. */
static const char *
isa_name (dnnl_cpu_isa_t isa)
{
  switch (isa)
    {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

/* Both dtypes on one rank at S = 256, every element against float64,
 * before any figure is printed. */
#define SMALL_SEQ 256

static gboolean
check_small (const BenchOptions  *options,
             GError             **error)
{
  g_autoptr(GString) checks = g_string_new (NULL);

  cpmesh_progress ("every element at S = %d against float64", SMALL_SEQ);
  for (int dt = 0; dt < 2; dt++)
    {
      Case c = { dt == 0 ? CP_DTYPE_FLOAT32 : CP_DTYPE_BFLOAT16, SMALL_SEQ, TRUE,
                 options->tolerance_scale };
      g_autofree char *what = case_name (&c);
      Sample sample;

      if (!single_rank (&c, 1, NULL, &sample, error))
        return FALSE;
      append_check (checks, what, &c.check);
    }
  printf ("Every element checked against float64 first: %s\n", checks->str);
  return TRUE;
}

/* The single-rank target: forward + backward at half the matmul's rate. */
#define MIN_FORWARD_BACKWARD_VS_MATMUL 0.5

static gboolean
bench_single (BenchOptions  *options,
              GError       **error)
{
  g_autoptr(GString) checks = g_string_new (NULL);
  guint n_cases = 2 * options->seq_lens->len;
  g_autofree double *ratios = g_new0 (double, n_cases);
  g_auto(GStrv) whats = g_new0 (char *, n_cases + 1);
  double matmul32, matmul16;
  gboolean torch, native16;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa ();
  g_autofree char *matmul16_text = NULL;
  g_autofree char *version = NULL;
  g_autofree char *torch_text = NULL;

  if (!check_small (options, error))
    return FALSE;
  cpmesh_progress ("oneDNN matmul 2048³, the baseline");
  matmul32 = matmul_float32_gflops (options->reps);
  matmul16 = matmul_bfloat16_gflops (options->reps);
  version = options->skip_torch ? NULL : torch_version ();
  torch = version != NULL;
  torch_text = describe_torch (options->skip_torch, options->run.quick, version);
  /* The library's rule: bfloat16 stays bfloat16 where the CPU multiplies
   * it in hardware, and is converted to float32 once elsewhere. */
  native16 = matmul16 > 0 && (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  matmul16_text = matmul16 > 0 ? g_strdup_printf ("%.1f GFLOP/s", matmul16)
                               : g_strdup ("not available on this CPU");
  printf ("oneDNN ISA %s, %u threads; matmul 2048³: float32 %.1f GFLOP/s, bfloat16 %s\n",
          isa_name (isa), g_get_num_processors (), matmul32, matmul16_text);
  printf ("attention bfloat16 path: %s\n",
          native16 ? "bfloat16 GEMMs (compared with the bfloat16 matmul)"
                   : "converted to float32 (compared with the float32 matmul)");
  printf ("PyTorch reference: %s\n\n", torch_text);
  printf ("Best time of %d runs; ×matmul is the median over the runs of each run's GFLOP/s over\n"
          "the matmul measured right before and after it.\n\n", options->reps);
  printf ("| dtype    |      S |  fwd s | fwd GF/s | ×matmul |  f+b s | f+b GF/s | ×matmul | matmul | torch fwd GF/s |\n");
  printf ("|----------|--------|--------|----------|---------|--------|----------|---------|--------|----------------|\n");
  for (guint i = 0; i < options->seq_lens->len; i++)
    for (int dt = 0; dt < 2; dt++)
      {
        CpDType dtype = dt == 0 ? CP_DTYPE_FLOAT32 : CP_DTYPE_BFLOAT16;
        /* Without a bfloat16 matmul the bfloat16 path computes in float32,
         * so that is its baseline. */
        gboolean use16 = dtype == CP_DTYPE_BFLOAT16 && native16;
        g_autofree Sample *samples = g_new0 (Sample, options->reps);
        gint64 s = g_array_index (options->seq_lens, gint64, i);
        Case c = { dtype, s, FALSE, options->tolerance_scale };
        char *what = whats[2 * i + dt] = case_name (&c);

        if (!single_rank (&c, options->reps,
                          use16 ? matmul_bfloat16_gflops : matmul_float32_gflops, samples, error))
          return FALSE;
        ratios[2 * i + dt] = print_single_rank (dtype, s, samples, options->reps,
                                                torch ? torch_gflops (dtype, s) : 0.0);
        append_check (checks, what, &c.check);
        fflush (stdout);
      }
  printf ("\nChecked before timing: %s\n", checks->str);
  for (guint i = 0; i < n_cases; i++)
    {
      g_autofree char *what = g_strdup_printf ("%s: forward + backward against matmul", whats[i]);

      cpmesh_bench_target (&options->run, what, ratios[i], CPMESH_AT_LEAST,
                           MIN_FORWARD_BACKWARD_VS_MATMUL);
    }
  return TRUE;
}

static gboolean
parse_options (int            argc,
               char         **argv,
               BenchOptions  *options)
{
  CpmeshOption entries[] = {
    CPMESH_OPTION_SEQS (&options->seq_lens, " of the single-rank cases (default 4096,16384, "
                        "1024 with --quick)"),
    CPMESH_OPTION_REPS (&options->reps, ": counted runs of each case (default 3, 1 with --quick)"),
    CPMESH_OPTION_CP (&options->cp_size, " of the C-rank run; 1 skips it (default 4, 2 with --quick)"),
    { "cp-seq", 0, CPMESH_VALUE_INT64, &options->cp_seq_len, "Sequence length of the C-rank run, "
      "a multiple of 2·C (default 4096, 1024 with --quick)", "S", 1, 1 << 20, NULL, FALSE },
    { "no-torch", 0, CPMESH_VALUE_FLAG, &options->skip_torch, "Do not look for PyTorch", NULL,
      0, 0, NULL, FALSE },
    CPMESH_OPTION_QUICK (&options->run.quick, ": no PyTorch either"),
    { "tolerance", 0, CPMESH_VALUE_DOUBLE, &options->tolerance_scale, "Scale the check's "
      "tolerances against float64 by F (default 1; 0 demands exact results)", "F", 0, 1000000,
      NULL, FALSE },
    CPMESH_OPTION_CHECK_TARGETS (&options->run.check_targets),
    CPMESH_OPTION_END
  };
  gint64 quick_seq = 1024;

  if (!cpmesh_parse_options ("Time single-rank causal attention forward and forward + backward "
                             "(B = 1, H = 16, D = 128) against oneDNN's matmul measured around "
                             "every run, then C ranks of an in-process mesh on one sequence: "
                             "their balance and CPU time against one rank. Every case is checked "
                             "against float64 before its figures are printed.",
                             entries, NULL, &argc, &argv))
    return FALSE;
  if (options->seq_lens == NULL)
    {
      const gint64 defaults[] = { 4096, 16384 };

      options->seq_lens = g_array_new (FALSE, FALSE, sizeof (gint64));
      if (options->run.quick)
        g_array_append_val (options->seq_lens, quick_seq);
      else
        g_array_append_vals (options->seq_lens, defaults, G_N_ELEMENTS (defaults));
    }
  if (options->run.quick)
    {
      options->skip_torch = TRUE;
      if (!cpmesh_option_given (entries, "reps"))
        options->reps = 1;
      if (!cpmesh_option_given (entries, "cp"))
        options->cp_size = 2;
      if (!cpmesh_option_given (entries, "cp-seq"))
        options->cp_seq_len = quick_seq;
    }
  /* The C-rank run lays the sequence out head-tail. */
  return (options->cp_size < 2 ||
          cpmesh_check_divisible ("--cp-seq", options->cp_seq_len, options->cp_size)) &&
         cpmesh_bench_begin (&options->run, !cpmesh_option_given (entries, "seq") &&
                             !cpmesh_option_given (entries, "cp-seq") && !options->run.quick &&
                             options->cp_size == 4, "the default sizes");
}

int
cpmesh_bench_attention (int    argc,
                        char **argv)
{
  BenchOptions options = { NULL, 3, 4, 4096, FALSE, 1.0 };
  g_autoptr(GError) error = NULL;
  gboolean ok;

  if (!parse_options (argc, argv, &options))
    {
      g_clear_pointer (&options.seq_lens, g_array_unref);
      return CPMESH_EXIT_USAGE;
    }
  ok = bench_single (&options, &error) && (options.cp_size < 2 || bench_cp (&options, &error));
  g_clear_pointer (&options.seq_lens, g_array_unref);
  return ok ? cpmesh_bench_end (&options.run) : cpmesh_bench_fail (error);
}
