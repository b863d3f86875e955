/* cpmesh-bench-attention.c: `cpmesh bench attention`
 *
 * Single-rank causal attention forward and forward+backward against
 * oneDNN's own matmul throughput measured in the same run, then C ranks
 * of an in-process mesh on the same sequence: per-rank imbalance and
 * total CPU time against the single-rank run.
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
  gint64 *seq_lens;
  int n_seq_lens;
  int reps;
  int cp_size;
  gint64 cp_seq_len;
  gboolean skip_torch;
} BenchOptions;

static double
now_s (void)
{
  return g_get_monotonic_time () / 1e6;
}

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
      double t = now_s ();

      dnnl_sgemm ('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      t = now_s () - t;
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
          double t = now_s ();

          dnnl_primitive_execute (prim, stream, 3, args);
          dnnl_stream_wait (stream);
          t = now_s () - t;
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

static gboolean
time_attention (CpAttention  *attention,
                CpTensor     *q,
                CpTensor     *k,
                CpTensor     *v,
                CpTensor     *dout,
                Timing       *timing,
                GError      **error)
{
  g_autoptr(CpTensor) out = NULL;
  g_autoptr(CpTensor) lse = NULL;
  g_autoptr(CpTensor) dq = NULL, dk = NULL, dv = NULL;
  double t0 = now_s (), t1;

  if (!cp_attention_forward (attention, q, k, v, &out, &lse, error))
    return FALSE;
  t1 = now_s ();
  if (!cp_attention_backward (attention, dout, q, k, v, out, lse, &dq, &dk, &dv, error))
    return FALSE;
  timing->forward_s = t1 - t0;
  timing->backward_s = now_s () - t1;
  return TRUE;
}

/* A baseline GFLOP/s figure measured next to an attention run. */
typedef double (*BaselineFunc) (int reps);

typedef struct
{
  Timing timing;
  double baseline;   /* GFLOP/s, the mean of right before and right after */
} Sample;

/* Times @reps forward+backward runs after an uncounted one that faults
 * the buffers in.  With @baseline, the matmul is measured right before and
 * after every run, so that each run has a baseline taken under the same
 * load: the machine is shared and its speed drifts. */
static gboolean
single_rank (CpDType       dtype,
             gint64        s,
             int           reps,
             BaselineFunc  baseline,
             Sample       *samples,
             GError      **error)
{
  const char *names[] = { "cp", NULL };
  int one = 1;
  GList *meshes = cp_mesh_new_local_group (names, &one, 1, error);
  g_autoptr(CpAttention) attention = NULL;
  g_autoptr(CpTensor) q = random_tensor (dtype, 1, 16, s, 128, 1);
  g_autoptr(CpTensor) k = random_tensor (dtype, 1, 16, s, 128, 2);
  g_autoptr(CpTensor) v = random_tensor (dtype, 1, 16, s, 128, 3);
  g_autoptr(CpTensor) dout = random_tensor (dtype, 1, 16, s, 128, 4);
  gboolean ok = meshes != NULL;

  if (ok)
    attention = cp_attention_new (meshes->data, NULL, error);
  ok = attention != NULL;
  for (int r = -1; ok && r < reps; r++)
    {
      double before = baseline && r >= 0 ? baseline (1) : 0.0;
      double cpu = process_cpu_s ();
      Timing t;

      ok = time_attention (attention, q, k, v, dout, &t, error);
      if (r < 0)
        continue;
      t.cpu_s = process_cpu_s () - cpu;
      samples[r] = (Sample) { t, baseline ? (before + baseline (1)) / 2 : 0.0 };
    }
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
 * softmax + matmul, when python3 can import torch. */
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
  const char *argv[] = { "/usr/bin/python3", "-c", script, NULL };
  g_autofree char *output = NULL;
  int status = 0;

  if (!torch_fits (s))
    return 0.0;
  if (!g_spawn_sync (NULL, (char **) argv, NULL, G_SPAWN_STDERR_TO_DEV_NULL, NULL, NULL,
                     &output, NULL, &status, NULL) || status != 0)
    return 0.0;
  return forward_flops (s, 16, 128) / g_ascii_strtod (output, NULL) / 1e9;
}

static gboolean
torch_available (void)
{
  const char *argv[] = { "/usr/bin/python3", "-c", "import torch", NULL };
  int status = 1;

  return g_spawn_sync (NULL, (char **) argv, NULL,
                       G_SPAWN_STDOUT_TO_DEV_NULL | G_SPAWN_STDERR_TO_DEV_NULL,
                       NULL, NULL, NULL, NULL, &status, NULL) && status == 0;
}

/* Prints the best times and the median of each run's ratio to its own
 * baseline. */
static void
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
  double best_fwd = INFINITY, best_both = INFINITY;
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
  printf ("| %-8s | %6" G_GINT64_FORMAT " | %6.2f | %8.1f | %7.2f | %6.2f | %8.1f | %7.2f | %6.1f | %14s |\n",
          cp_dtype_get_name (dtype), s, best_fwd, fwd / best_fwd / 1e9,
          cpmesh_bench_median (fwd_ratio, n), best_both, 3.5 * fwd / best_both / 1e9,
          cpmesh_bench_median (both_ratio, n), cpmesh_bench_median (baseline, n),
          torch_text);
}

/* The C-rank run: every rank times its own thread's CPU. */
typedef struct
{
  CpRotateMethod method;
  CpTensor *q, *k, *v, *dout;
  CpLayout *layout;
  double *rank_cpu_s;
  GError *error;
  GMutex lock;
} CpRun;

static gpointer
cp_rank_thread (gpointer data)
{
  gpointer *args = data;
  CpRun *run = args[0];
  CpMesh *mesh = args[1];
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(CpAttention) attention = NULL;
  g_autoptr(CpTensor) q = cp_layout_shard (run->layout, run->q, 2, rank, NULL);
  g_autoptr(CpTensor) k = cp_layout_shard (run->layout, run->k, 2, rank, NULL);
  g_autoptr(CpTensor) v = cp_layout_shard (run->layout, run->v, 2, rank, NULL);
  g_autoptr(CpTensor) dout = cp_layout_shard (run->layout, run->dout, 2, rank, NULL);
  GError *error = NULL;
  Timing t;
  double cpu;

  cp_attention_options_set_rotate_method (options, run->method);
  attention = cp_attention_new (mesh, options, &error);
  cpu = thread_cpu_s ();
  if (attention == NULL || !time_attention (attention, q, k, v, dout, &t, &error))
    {
      g_mutex_lock (&run->lock);
      if (run->error == NULL)
        run->error = g_steal_pointer (&error);
      g_mutex_unlock (&run->lock);
      g_clear_error (&error);
      return NULL;
    }
  run->rank_cpu_s[rank] = thread_cpu_s () - cpu;
  return NULL;
}

static gboolean
cp_ranks (CpRotateMethod  method,
          int             cp_size,
          gint64          s,
          CpTensor      **inputs,
          double         *rank_cpu_s,
          double         *process_cpu,
          double         *wall,
          GError        **error)
{
  const char *names[] = { "cp", NULL };
  GList *meshes = cp_mesh_new_local_group (names, &cp_size, 1, error);
  CpRun run = { method, inputs[0], inputs[1], inputs[2], inputs[3], NULL, rank_cpu_s, NULL };
  g_autofree GThread **threads = g_new0 (GThread *, cp_size);
  g_autofree gpointer *args = g_new0 (gpointer, 2 * cp_size);
  double cpu, t;
  int r = 0;

  if (meshes == NULL)
    return FALSE;
  run.layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, s, cp_size, error);
  g_mutex_init (&run.lock);
  cpu = process_cpu_s ();
  t = now_s ();
  for (GList *l = meshes; l != NULL; l = l->next, r++)
    {
      args[2 * r] = &run;
      args[2 * r + 1] = l->data;
      threads[r] = g_thread_new ("bench-rank", cp_rank_thread, &args[2 * r]);
    }
  for (r = 0; r < cp_size; r++)
    g_thread_join (threads[r]);
  *wall = now_s () - t;
  *process_cpu = process_cpu_s () - cpu;
  g_mutex_clear (&run.lock);
  cp_layout_unref (run.layout);
  g_list_free_full (meshes, g_object_unref);
  if (run.error != NULL)
    {
      g_propagate_error (error, run.error);
      return FALSE;
    }
  return TRUE;
}

static gboolean
bench_cp (const BenchOptions  *options,
          GError             **error)
{
  gint64 s = options->cp_seq_len;
  int c = options->cp_size;
  CpTensor *inputs[4];
  g_autofree Sample *samples = g_new0 (Sample, options->reps);
  Timing single = { INFINITY, INFINITY, INFINITY };
  gboolean ok;

  for (int i = 0; i < 4; i++)
    inputs[i] = random_tensor (CP_DTYPE_FLOAT32, 1, 16, s, 128, 10 + i);
  ok = single_rank (CP_DTYPE_FLOAT32, s, options->reps, NULL, samples, error);
  for (int r = 0; ok && r < options->reps; r++)
    single.cpu_s = MIN (single.cpu_s, samples[r].timing.cpu_s);
  printf ("\nC = %d ranks in one process, float32, causal, B=1 H=16 D=128 S=%" G_GINT64_FORMAT
          ", forward+backward\n\n", c, s);
  printf ("| method    | wall s | rank CPU s (min..max) | imbalance max/mean | CPU s | CPU vs 1 rank (%.2f s) |\n",
          single.cpu_s);
  printf ("|-----------|--------|-----------------------|--------------------|-------|-------------------------|\n");
  for (int method = 0; ok && method < 2; method++)
    {
      g_autofree double *rank_cpu = g_new0 (double, c);
      g_autofree double *trial_cpu = g_new0 (double, c);
      double cpu = INFINITY, wall = 0, lo = INFINITY, hi = 0, mean = 0;

      /* Steady state, as in training: the first run faults its buffers
       * in, later ones reuse them; the run with the least CPU counts. */
      for (int rep = 0; ok && rep < options->reps + 1; rep++)
        {
          double trial, trial_wall;

          ok = cp_ranks (method, c, s, inputs, trial_cpu, &trial, &trial_wall, error);
          if (ok && rep > 0 && trial < cpu)
            {
              cpu = trial;
              wall = trial_wall;
              memcpy (rank_cpu, trial_cpu, c * sizeof (double));
            }
        }
      for (int r = 0; ok && r < c; r++)
        {
          lo = MIN (lo, rank_cpu[r]);
          hi = MAX (hi, rank_cpu[r]);
          mean += rank_cpu[r] / c;
        }
      if (ok)
        printf ("| %-9s | %6.2f | %9.2f..%-9.2f | %18.3f | %5.2f | %23.3f |\n",
                method == CP_ROTATE_METHOD_ALLGATHER ? "allgather" : "ring", wall, lo, hi,
                hi / mean, cpu, cpu / single.cpu_s);
    }
  for (int i = 0; i < 4; i++)
    g_object_unref (inputs[i]);
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

static gboolean
bench_single (const BenchOptions  *options,
              GError             **error)
{
  double matmul32 = matmul_float32_gflops (options->reps);
  double matmul16 = matmul_bfloat16_gflops (options->reps);
  gboolean torch = !options->skip_torch && torch_available ();

  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa ();
  /* The library's rule: bfloat16 stays bfloat16 where the CPU multiplies
   * it in hardware, and is converted to float32 once elsewhere. */
  gboolean native16 = matmul16 > 0 &&
                      (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  g_autofree char *matmul16_text = matmul16 > 0 ? g_strdup_printf ("%.1f GFLOP/s", matmul16)
                                                : g_strdup ("not available on this CPU");

  printf ("oneDNN ISA %s, %u threads; matmul 2048³: float32 %.1f GFLOP/s, bfloat16 %s\n",
          isa_name (isa), g_get_num_processors (), matmul32, matmul16_text);
  printf ("attention bfloat16 path: %s\n",
          native16 ? "bfloat16 GEMMs (compared with the bfloat16 matmul)"
                   : "converted to float32 (compared with the float32 matmul)");
  printf ("PyTorch reference: %s\n\n", torch ? "python3-torch found; \"-\" where its S x S scores would not fit in half the memory" : "skipped (python3 cannot import torch)");
  printf ("Best time of %d runs; ×matmul is the median over the runs of each run's GFLOP/s over\n"
          "the matmul measured right before and after it.\n\n", options->reps);
  printf ("| dtype    |      S |  fwd s | fwd GF/s | ×matmul |  f+b s | f+b GF/s | ×matmul | matmul | torch fwd GF/s |\n");
  printf ("|----------|--------|--------|----------|---------|--------|----------|---------|--------|----------------|\n");
  for (int i = 0; i < options->n_seq_lens; i++)
    for (int dt = 0; dt < 2; dt++)
      {
        CpDType dtype = dt == 0 ? CP_DTYPE_FLOAT32 : CP_DTYPE_BFLOAT16;
        /* Without a bfloat16 matmul the bfloat16 path computes in float32,
         * so that is its baseline. */
        gboolean use16 = dtype == CP_DTYPE_BFLOAT16 && native16;
        g_autofree Sample *samples = g_new0 (Sample, options->reps);
        gint64 s = options->seq_lens[i];

        if (!single_rank (dtype, s, options->reps,
                          use16 ? matmul_bfloat16_gflops : matmul_float32_gflops, samples, error))
          return FALSE;
        print_single_rank (dtype, s, samples, options->reps, torch ? torch_gflops (dtype, s) : 0.0);
        fflush (stdout);
      }
  return TRUE;
}

static gboolean
parse_options (int            argc,
               char         **argv,
               BenchOptions  *options,
               GError       **error)
{
  g_autofree char *seq = NULL;
  int reps = 3, cp_size = 4;
  gint64 cp_seq_len = 4096;
  gboolean skip_torch = FALSE;
  GOptionEntry entries[] = {
    { "seq", 0, 0, G_OPTION_ARG_STRING, &seq, "Sequence lengths, comma separated (4096,16384)", "S,..." },
    { "reps", 0, 0, G_OPTION_ARG_INT, &reps, "Counted runs of each case (3)", "N" },
    { "cp", 0, 0, G_OPTION_ARG_INT, &cp_size, "Ranks of the CP run (4; below 2 skips it)", "C" },
    { "cp-seq", 0, 0, G_OPTION_ARG_INT64, &cp_seq_len, "Sequence length of the CP run (4096)", "S" },
    { "no-torch", 0, 0, G_OPTION_ARG_NONE, &skip_torch, "Do not look for PyTorch", NULL },
    { NULL }
  };
  g_autoptr(GOptionContext) context = g_option_context_new ("- attention benchmark");
  g_auto(GStrv) parts = NULL;

  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, error))
    return FALSE;
  parts = g_strsplit (seq ? seq : "4096,16384", ",", -1);
  options->n_seq_lens = (int) g_strv_length (parts);
  options->seq_lens = g_new0 (gint64, MAX (options->n_seq_lens, 1));
  for (int i = 0; i < options->n_seq_lens; i++)
    if (!g_ascii_string_to_signed (parts[i], 10, 1, 1 << 20, &options->seq_lens[i], error))
      {
        g_prefix_error (error, "--seq: ");
        return FALSE;
      }
  if (reps < 1 || cp_size < 1)
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                   "--reps %d and --cp %d must be at least 1", reps, cp_size);
      return FALSE;
    }
  /* The CP run lays the sequence out head-tail: 2·C equal chunks. */
  if (cp_size >= 2 && (cp_seq_len < 1 || cp_seq_len % (2 * cp_size) != 0))
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                   "--cp-seq %" G_GINT64_FORMAT " must be a positive multiple of 2·C = %d",
                   cp_seq_len, 2 * cp_size);
      return FALSE;
    }
  options->reps = reps;
  options->cp_size = cp_size;
  options->cp_seq_len = cp_seq_len;
  options->skip_torch = skip_torch;
  return TRUE;
}

int
cpmesh_bench_attention (int    argc,
                        char **argv)
{
  BenchOptions options = { 0 };
  g_autoptr(GError) error = NULL;
  gboolean ok;

  if (!parse_options (argc, argv, &options, &error))
    {
      g_printerr ("bench attention: %s\n", error->message);
      g_free (options.seq_lens);
      return 2;
    }
  ok = bench_single (&options, &error) && (options.cp_size < 2 || bench_cp (&options, &error));
  g_free (options.seq_lens);
  if (!ok)
    {
      g_printerr ("bench attention: %s\n", error->message);
      return 1;
    }
  return 0;
}
