/* cp-attention-gemm.c: oneDNN sgemm and cached matmul primitives
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "cp-attention-gemm-private.h"
#include "cp-dtype-private.h"
#include "cp-sync-private.h"

/* A product's full description: primitives are specialised to it. */
typedef struct
{
  gint64 m, n, k;
  gint64 lda, ldb, ldc;
  float alpha, beta;
  gint32 transa, transb;
  gint32 type;
} GemmKey;

/* A cached primitive, immutable once cached.  Every OpenMP thread of
 * every rank executes the primitive of a tile shape, often at the same
 * moment.  oneDNN's default, library-managed scratchpad is only safe for
 * that when oneDNN is built for concurrent execution, which Debian's is
 * not: there the scratchpad belongs to the thread that created the
 * primitive and is shared by everything that thread created, so
 * concurrent executions overwrite each other's intermediate results (the
 * AVX-512 and AMX matmuls use one; the AVX2 ones do not).  So every
 * primitive is created with a user-managed scratchpad, and every
 * execution brings its own thread's. */
typedef struct
{
  dnnl_primitive_t primitive;
  dnnl_memory_desc_t a, b, c;
  dnnl_memory_desc_t scratchpad;
  gsize scratchpad_size;
} GemmPrimitive;

/* What one executing thread owns and never lends: its stream and its
 * scratchpad memory, grown to the largest primitive it has run. */
typedef struct
{
  dnnl_stream_t stream;
  gpointer scratchpad;
  gsize scratchpad_size;
} GemmThread;

/* oneDNN asks for 64-byte alignment; a page avoids false sharing too. */
#define SCRATCHPAD_ALIGNMENT 4096

static CpMutex cache_lock = CP_MUTEX_INIT;
static GHashTable *cache;      /* GemmKey → GemmPrimitive, never freed */
static dnnl_engine_t engine;   /* thread-safe: only creates primitives and memory */
static gint force_primitives;  /* read by every kernel thread */

static void
gemm_thread_free (gpointer data)
{
  GemmThread *thread = data;

  dnnl_stream_destroy (thread->stream);
  g_aligned_free (thread->scratchpad);
  g_free (thread);
}

/* Freed when its thread exits. */
static GPrivate thread_state = G_PRIVATE_INIT (gemm_thread_free);

static guint
key_hash (gconstpointer key)
{
  const guint8 *bytes = key;
  guint hash = 5381;

  for (gsize i = 0; i < sizeof (GemmKey); i++)
    hash = hash * 33 + bytes[i];
  return hash;
}

static gboolean
key_equal (gconstpointer a,
           gconstpointer b)
{
  return memcmp (a, b, sizeof (GemmKey)) == 0;
}

/* Field by field after zeroing: the padding bytes are hashed too. */
static void
key_init (GemmKey    *key,
          CpAttnType  type,
          char        transa,
          char        transb,
          gint64      m,
          gint64      n,
          gint64      k,
          float       alpha,
          gsize       lda,
          gsize       ldb,
          float       beta,
          gsize       ldc)
{
  memset (key, 0, sizeof *key);
  key->m = m;
  key->n = n;
  key->k = k;
  key->lda = (gint64) lda;
  key->ldb = (gint64) ldb;
  key->ldc = (gint64) ldc;
  key->alpha = alpha;
  key->beta = beta;
  key->transa = transa;
  key->transb = transb;
  key->type = type;
}

static dnnl_engine_t
get_engine (void)
{
  static gsize initialized;

  if (g_once_init_enter (&initialized))
    {
      dnnl_status_t status = dnnl_engine_create (&engine, dnnl_cpu, 0);

      g_assert (status == dnnl_success);
      cache = g_hash_table_new (key_hash, key_equal);
      g_once_init_leave (&initialized, 1);
    }
  return engine;
}

static GemmThread *
get_thread_state (void)
{
  GemmThread *thread = g_private_get (&thread_state);

  if (thread == NULL)
    {
      dnnl_status_t status;

      thread = g_new0 (GemmThread, 1);
      status = dnnl_stream_create (&thread->stream, get_engine (), dnnl_stream_default_flags);
      g_assert (status == dnnl_success);
      g_private_set (&thread_state, thread);
    }
  return thread;
}

/* The calling thread's scratchpad, at least @size bytes; NULL when the
 * primitive needs none. */
static gpointer
thread_scratchpad (GemmThread *thread,
                   gsize       size)
{
  if (size == 0)
    return NULL;
  if (size > thread->scratchpad_size)
    {
      gsize rounded = (size + SCRATCHPAD_ALIGNMENT - 1) / SCRATCHPAD_ALIGNMENT * SCRATCHPAD_ALIGNMENT;

      g_aligned_free (thread->scratchpad);
      thread->scratchpad = g_aligned_alloc (rounded, 1, SCRATCHPAD_ALIGNMENT);
      thread->scratchpad_size = rounded;
    }
  return thread->scratchpad;
}

/* A row-major m × n matrix with leading dimension @ld, or its transpose
 * stored as n × m. */
static void
matrix_desc (dnnl_memory_desc_t *desc,
             gint64              rows,
             gint64              cols,
             gint64              ld,
             gboolean            transposed,
             dnnl_data_type_t    type)
{
  dnnl_dims_t dims = { rows, cols };
  dnnl_dims_t strides = { transposed ? 1 : ld, transposed ? ld : 1 };
  dnnl_status_t status = dnnl_memory_desc_init_by_strides (desc, 2, dims, type, strides);

  g_assert (status == dnnl_success);
}

/* alpha as an output scale, beta as a sum post-op, and the scratchpad
 * left to the caller. */
static dnnl_primitive_attr_t
primitive_attr (const GemmKey *key)
{
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t post_ops = NULL;

  dnnl_primitive_attr_create (&attr);
  dnnl_primitive_attr_set_scratchpad_mode (attr, dnnl_scratchpad_mode_user);
  if (key->alpha != 1.0f)
    dnnl_primitive_attr_set_output_scales (attr, 1, 0, &key->alpha);
  if (key->beta != 0.0f)
    {
      dnnl_post_ops_create (&post_ops);
      dnnl_post_ops_append_sum (post_ops, key->beta);
      dnnl_primitive_attr_set_post_ops (attr, post_ops);
      dnnl_post_ops_destroy (post_ops);
    }
  return attr;
}

static void
read_scratchpad (GemmPrimitive        *gemm,
                 const_dnnl_primitive_desc_t pd)
{
  const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md (pd, dnnl_query_scratchpad_md, 0);

  if (md != NULL)
    gemm->scratchpad = *md;
  gemm->scratchpad_size = md != NULL ? dnnl_memory_desc_get_size (md) : 0;
}

/* Returns NULL when oneDNN has no implementation for this CPU. */
static GemmPrimitive *
primitive_create (const GemmKey *key)
{
  dnnl_data_type_t type = key->type == CP_ATTN_BFLOAT16 ? dnnl_bf16 : dnnl_f32;
  GemmPrimitive *gemm = g_new0 (GemmPrimitive, 1);
  dnnl_primitive_attr_t attr = primitive_attr (key);
  dnnl_primitive_desc_t pd = NULL;
  dnnl_matmul_desc_t desc;
  dnnl_status_t status;

  matrix_desc (&gemm->a, key->m, key->k, key->lda, key->transa == 'T', type);
  matrix_desc (&gemm->b, key->k, key->n, key->ldb, key->transb == 'T', type);
  matrix_desc (&gemm->c, key->m, key->n, key->ldc, FALSE, dnnl_f32);
  dnnl_matmul_desc_init (&desc, &gemm->a, &gemm->b, NULL, &gemm->c);
  status = dnnl_primitive_desc_create (&pd, &desc, attr, get_engine (), NULL);
  if (status == dnnl_success)
    {
      read_scratchpad (gemm, pd);
      status = dnnl_primitive_create (&gemm->primitive, pd);
    }
  if (pd != NULL)
    dnnl_primitive_desc_destroy (pd);
  dnnl_primitive_attr_destroy (attr);
  if (status != dnnl_success)
    g_clear_pointer (&gemm, g_free);
  return gemm;
}

static GemmPrimitive *
primitive_lookup (const GemmKey *key)
{
  GemmPrimitive *gemm;

  get_engine ();
  _cp_mutex_lock (&cache_lock);
  gemm = g_hash_table_lookup (cache, key);
  if (gemm == NULL && (gemm = primitive_create (key)) != NULL)
    g_hash_table_insert (cache, g_memdup2 (key, sizeof *key), gemm);
  _cp_mutex_unlock (&cache_lock);
  return gemm;
}

/* The audit (tests only): which thread states and scratchpad buffers
 * executions hold at each moment. */
static gint auditing;
static CpMutex audit_lock = CP_MUTEX_INIT;
static GHashTable *in_flight;   /* thread states and buffers held now */
static guint n_in_flight;
static CpAttnGemmAudit audit;

static void
audit_enter (GemmThread *thread,
             gpointer    scratchpad,
             gsize       needed)
{
  _cp_mutex_lock (&audit_lock);
  audit.executions++;
  audit.with_scratchpad += scratchpad != NULL;
  if (g_hash_table_contains (in_flight, thread) ||
      (scratchpad != NULL && g_hash_table_contains (in_flight, scratchpad)))
    audit.shared++;
  if (needed > 0 && (scratchpad == NULL || thread->scratchpad_size < needed))
    audit.short_buffers++;
  g_hash_table_add (in_flight, thread);
  if (scratchpad != NULL)
    g_hash_table_add (in_flight, scratchpad);
  n_in_flight++;
  audit.most_in_flight = MAX (audit.most_in_flight, n_in_flight);
  _cp_mutex_unlock (&audit_lock);
}

static void
audit_leave (GemmThread *thread,
             gpointer    scratchpad)
{
  _cp_mutex_lock (&audit_lock);
  g_hash_table_remove (in_flight, thread);
  if (scratchpad != NULL)
    g_hash_table_remove (in_flight, scratchpad);
  n_in_flight--;
  _cp_mutex_unlock (&audit_lock);
}

static void
primitive_execute (GemmPrimitive *gemm,
                   gconstpointer  a,
                   gconstpointer  b,
                   float         *c)
{
  GemmThread *thread = get_thread_state ();
  gpointer scratchpad = thread_scratchpad (thread, gemm->scratchpad_size);
  gboolean audited = g_atomic_int_get (&auditing);
  dnnl_memory_t memories[4] = { NULL };
  dnnl_exec_arg_t args[4];
  int n_args = 3;
  dnnl_status_t status;

  dnnl_memory_create (&memories[0], &gemm->a, engine, (gpointer) a);
  dnnl_memory_create (&memories[1], &gemm->b, engine, (gpointer) b);
  dnnl_memory_create (&memories[2], &gemm->c, engine, c);
  args[0] = (dnnl_exec_arg_t) { DNNL_ARG_SRC, memories[0] };
  args[1] = (dnnl_exec_arg_t) { DNNL_ARG_WEIGHTS, memories[1] };
  args[2] = (dnnl_exec_arg_t) { DNNL_ARG_DST, memories[2] };
  if (scratchpad != NULL)
    {
      dnnl_memory_create (&memories[3], &gemm->scratchpad, engine, scratchpad);
      args[n_args++] = (dnnl_exec_arg_t) { DNNL_ARG_SCRATCHPAD, memories[3] };
    }
  if (audited)
    audit_enter (thread, scratchpad, gemm->scratchpad_size);
  status = dnnl_primitive_execute (gemm->primitive, thread->stream, n_args, args);
  g_assert (status == dnnl_success);
  dnnl_stream_wait (thread->stream);
  if (audited)
    audit_leave (thread, scratchpad);
  for (int i = 0; i < n_args; i++)
    dnnl_memory_destroy (memories[i]);
}

/* Element (row, col) of op(X) for a bfloat16 X with leading dimension @ld. */
static inline float
bf16_element (gconstpointer x,
              char          trans,
              gsize         ld,
              gint64        row,
              gint64        col)
{
  const guint16 *values = x;

  return _cp_bf16_to_float (trans == 'T' ? values[(gsize) col * ld + (gsize) row]
                                         : values[(gsize) row * ld + (gsize) col]);
}

/* Whether oneDNN can be given this bfloat16 product whole.  oneDNN 2.6's
 * avx512_core_bf16 GEMM (its AMX one does not) turns ±∞ in the last
 * element of an odd K into NaN across the row of C, as if it multiplied
 * the value by the zero padding the pair: one +∞ in op(A)'s last column
 * makes a NaN row where exact arithmetic gives ±∞.  Finite values are not
 * affected, so only a non-finite last column needs the exact path. */
static gboolean
last_column_finite (char          transa,
                    gint64        m,
                    gint64        k,
                    gconstpointer a,
                    gsize         lda)
{
  if (k % 2 == 0)
    return TRUE;
  for (gint64 i = 0; i < m; i++)
    if (!isfinite (bf16_element (a, transa, lda, i, k - 1)))
      return FALSE;
  return TRUE;
}

/* C = beta · C for a product whose every term was left out. */
static void
scale_rows (gint64  m,
            gint64  n,
            float   beta,
            float  *c,
            gsize   ldc)
{
  for (gint64 i = 0; i < m; i++)
    for (gint64 j = 0; j < n; j++)
      c[(gsize) i * ldc + (gsize) j] = beta == 0.0f ? 0.0f : beta * c[(gsize) i * ldc + (gsize) j];
}

/* C += alpha · op(A)[:, l] · op(B)[l, :], in float32 as IEEE says. */
static void
add_outer_product (char          transa,
                   char          transb,
                   gint64        m,
                   gint64        n,
                   gint64        l,
                   float         alpha,
                   gconstpointer a,
                   gsize         lda,
                   gconstpointer b,
                   gsize         ldb,
                   float        *c,
                   gsize         ldc)
{
  for (gint64 i = 0; i < m; i++)
    {
      float left = bf16_element (a, transa, lda, i, l);

      for (gint64 j = 0; j < n; j++)
        c[(gsize) i * ldc + (gsize) j] += alpha * (left * bf16_element (b, transb, ldb, l, j));
    }
}

static void
primitive_gemm (CpAttnType     type,
                char           transa,
                char           transb,
                gint64         m,
                gint64         n,
                gint64         k,
                float          alpha,
                gconstpointer  a,
                gsize          lda,
                gconstpointer  b,
                gsize          ldb,
                float          beta,
                float         *c,
                gsize          ldc)
{
  GemmKey key;
  GemmPrimitive *gemm;

  key_init (&key, type, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc);
  gemm = primitive_lookup (&key);
  /* Callers only ask for bfloat16 after _cp_attn_gemm_has_bfloat16(), and
   * oneDNN then implements every layout (its reference code included). */
  g_assert (gemm != NULL);
  primitive_execute (gemm, a, b, c);
}

void
_cp_attn_gemm (CpAttnType     type,
               char           transa,
               char           transb,
               gint64         m,
               gint64         n,
               gint64         k,
               float          alpha,
               gconstpointer  a,
               gsize          lda,
               gconstpointer  b,
               gsize          ldb,
               float          beta,
               float         *c,
               gsize          ldc)
{
  /* oneDNN's sgemm keeps no state between calls. */
  if (type == CP_ATTN_FLOAT32 && !g_atomic_int_get (&force_primitives))
    {
      dnnl_status_t status = dnnl_sgemm (transa, transb, m, n, k, alpha, a, (dnnl_dim_t) lda,
                                         b, (dnnl_dim_t) ldb, beta, c, (dnnl_dim_t) ldc);

      /* Only malformed arguments fail, which would be a bug here. */
      g_assert (status == dnnl_success);
      return;
    }
  if (type == CP_ATTN_BFLOAT16 && !last_column_finite (transa, m, k, a, lda))
    {
      /* The leading K − 1 terms through oneDNN (even, so unaffected), the
       * last one exactly. */
      if (k > 1)
        primitive_gemm (type, transa, transb, m, n, k - 1, alpha, a, lda, b, ldb, beta, c, ldc);
      else
        scale_rows (m, n, beta, c, ldc);
      add_outer_product (transa, transb, m, n, k - 1, alpha, a, lda, b, ldb, c, ldc);
      return;
    }
  primitive_gemm (type, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static gboolean
probe_bfloat16 (void)
{
  GemmKey key;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa ();

  /* avx512_core_bf16 and AMX set this bit; plain avx512_core emulates
   * bfloat16, slower than converting to float32 once. */
  if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16)
    return FALSE;
  key_init (&key, CP_ATTN_BFLOAT16, 'N', 'N', 16, 16, 16, 1.0f, 16, 16, 0.0f, 16);
  return primitive_lookup (&key) != NULL;
}

gboolean
_cp_attn_gemm_has_bfloat16 (void)
{
  static gsize answer;

  if (g_once_init_enter (&answer))
    g_once_init_leave (&answer, probe_bfloat16 () ? 2 : 1);
  return answer == 2;
}

void
_cp_attn_gemm_force_primitives (gboolean force)
{
  g_atomic_int_set (&force_primitives, force);
}

void
_cp_attn_gemm_audit_start (void)
{
  _cp_mutex_lock (&audit_lock);
  memset (&audit, 0, sizeof audit);
  if (in_flight == NULL)
    in_flight = g_hash_table_new (NULL, NULL);
  g_atomic_int_set (&auditing, TRUE);
  _cp_mutex_unlock (&audit_lock);
}

/* What oneDNN itself says of a cached primitive. */
static void
audit_primitive (GemmPrimitive   *gemm,
                 CpAttnGemmAudit *report)
{
  const_dnnl_primitive_desc_t pd = NULL;
  const_dnnl_primitive_attr_t attr = NULL;
  dnnl_scratchpad_mode_t mode = dnnl_scratchpad_mode_library;
  const dnnl_memory_desc_t *md;

  dnnl_primitive_get_primitive_desc (gemm->primitive, &pd);
  dnnl_primitive_desc_get_attr (pd, &attr);
  dnnl_primitive_attr_get_scratchpad_mode (attr, &mode);
  md = dnnl_primitive_desc_query_md (pd, dnnl_query_scratchpad_md, 0);
  report->primitives++;
  report->user_scratchpad += mode == dnnl_scratchpad_mode_user;
  report->largest_scratchpad = MAX (report->largest_scratchpad,
                                    md != NULL ? dnnl_memory_desc_get_size (md) : 0);
}

void
_cp_attn_gemm_audit_stop (CpAttnGemmAudit *report)
{
  GHashTableIter iter;
  gpointer value;

  _cp_mutex_lock (&audit_lock);
  g_atomic_int_set (&auditing, FALSE);
  *report = audit;
  _cp_mutex_unlock (&audit_lock);

  get_engine ();
  _cp_mutex_lock (&cache_lock);
  g_hash_table_iter_init (&iter, cache);
  while (g_hash_table_iter_next (&iter, NULL, &value))
    audit_primitive (value, report);
  _cp_mutex_unlock (&cache_lock);
}
