/* cp-attention-gemm.c: oneDNN sgemm and cached matmul primitives
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "cp-attention-gemm-private.h"

/* A product's full description: primitives are specialised to it. */
typedef struct
{
  gint64 m, n, k;
  gint64 lda, ldb, ldc;
  float alpha, beta;
  gint32 transa, transb;
  gint32 type;
} GemmKey;

typedef struct
{
  dnnl_primitive_t primitive;
  dnnl_memory_desc_t a, b, c;
} GemmPrimitive;

static GMutex cache_lock;
static GHashTable *cache;      /* GemmKey → GemmPrimitive, never freed */
static dnnl_engine_t engine;
static gboolean force_primitives;

static void
stream_free (gpointer stream)
{
  dnnl_stream_destroy (stream);
}

/* Streams are not shared between threads. */
static GPrivate thread_stream = G_PRIVATE_INIT (stream_free);

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

static dnnl_stream_t
get_stream (void)
{
  dnnl_stream_t stream = g_private_get (&thread_stream);

  if (stream == NULL)
    {
      dnnl_status_t status = dnnl_stream_create (&stream, get_engine (), dnnl_stream_default_flags);

      g_assert (status == dnnl_success);
      g_private_set (&thread_stream, stream);
    }
  return stream;
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

static dnnl_primitive_attr_t
scale_and_accumulate (const GemmKey *key)
{
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t post_ops = NULL;

  dnnl_primitive_attr_create (&attr);
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

/* Returns NULL when oneDNN has no implementation for this CPU. */
static GemmPrimitive *
primitive_create (const GemmKey *key)
{
  dnnl_data_type_t type = key->type == CP_ATTN_BFLOAT16 ? dnnl_bf16 : dnnl_f32;
  GemmPrimitive *gemm = g_new0 (GemmPrimitive, 1);
  dnnl_primitive_attr_t attr = scale_and_accumulate (key);
  dnnl_primitive_desc_t pd = NULL;
  dnnl_matmul_desc_t desc;
  dnnl_status_t status;

  matrix_desc (&gemm->a, key->m, key->k, key->lda, key->transa == 'T', type);
  matrix_desc (&gemm->b, key->k, key->n, key->ldb, key->transb == 'T', type);
  matrix_desc (&gemm->c, key->m, key->n, key->ldc, FALSE, dnnl_f32);
  dnnl_matmul_desc_init (&desc, &gemm->a, &gemm->b, NULL, &gemm->c);
  status = dnnl_primitive_desc_create (&pd, &desc, attr, get_engine (), NULL);
  if (status == dnnl_success)
    status = dnnl_primitive_create (&gemm->primitive, pd);
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
  g_mutex_lock (&cache_lock);
  gemm = g_hash_table_lookup (cache, key);
  if (gemm == NULL && (gemm = primitive_create (key)) != NULL)
    g_hash_table_insert (cache, g_memdup2 (key, sizeof *key), gemm);
  g_mutex_unlock (&cache_lock);
  return gemm;
}

static void
primitive_execute (GemmPrimitive *gemm,
                   gconstpointer  a,
                   gconstpointer  b,
                   float         *c)
{
  dnnl_memory_t memories[3] = { NULL };
  dnnl_exec_arg_t args[3];
  dnnl_status_t status;

  dnnl_memory_create (&memories[0], &gemm->a, engine, (gpointer) a);
  dnnl_memory_create (&memories[1], &gemm->b, engine, (gpointer) b);
  dnnl_memory_create (&memories[2], &gemm->c, engine, c);
  args[0] = (dnnl_exec_arg_t) { DNNL_ARG_SRC, memories[0] };
  args[1] = (dnnl_exec_arg_t) { DNNL_ARG_WEIGHTS, memories[1] };
  args[2] = (dnnl_exec_arg_t) { DNNL_ARG_DST, memories[2] };
  status = dnnl_primitive_execute (gemm->primitive, get_stream (), 3, args);
  g_assert (status == dnnl_success);
  dnnl_stream_wait (get_stream ());
  for (int i = 0; i < 3; i++)
    dnnl_memory_destroy (memories[i]);
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
  GemmKey key;
  GemmPrimitive *gemm;

  if (type == CP_ATTN_FLOAT32 && !force_primitives)
    {
      dnnl_status_t status = dnnl_sgemm (transa, transb, m, n, k, alpha, a, (dnnl_dim_t) lda,
                                         b, (dnnl_dim_t) ldb, beta, c, (dnnl_dim_t) ldc);

      /* Only malformed arguments fail, which would be a bug here. */
      g_assert (status == dnnl_success);
      return;
    }
  key_init (&key, type, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc);
  gemm = primitive_lookup (&key);
  /* Callers only ask for bfloat16 after _cp_attn_gemm_has_bfloat16(), and
   * oneDNN then implements every layout (its reference code included). */
  g_assert (gemm != NULL);
  primitive_execute (gemm, a, b, c);
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
  force_primitives = force;
}
