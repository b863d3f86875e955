/* test-attention-errors.c: bad inputs fail on every rank, named in the
 * message
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-test-util.h"

static CpTensor *
tensor4 (CpDType dtype,
         gint64  b,
         gint64  h,
         gint64  s,
         gint64  d)
{
  gint64 shape[] = { b, h, s, d };

  return cp_test_tensor_pattern (dtype, shape, 4, 1);
}

/* Each rank builds its inputs with @make and expects forward to fail
 * with @code and a message containing @needle. */
typedef void (*MakeInputs) (int        rank,
                            CpTensor **q,
                            CpTensor **k,
                            CpTensor **v,
                            CpAttentionOptions *options);

typedef struct
{
  MakeInputs make;
  int code;
  const char *needle;
  const char *what;      /* for the reliability table */
} Case;

static void
expect_failure (CpMesh   *mesh,
                gpointer  data)
{
  const Case *c = data;
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(CpTensor) q = NULL, k = NULL, v = NULL, out = NULL;
  g_autoptr(CpAttention) attention = NULL;
  g_autoptr(GError) error = NULL;

  c->make (cp_mesh_get_rank (mesh), &q, &k, &v, options);
  attention = cp_attention_new (mesh, options, &error);
  g_assert_no_error (error);
  g_assert_false (cp_attention_forward (attention, q, k, v, &out, NULL, &error));
  CP_TEST_ASSERT_CASE (error, CP_ATTENTION_ERROR, c->code, "CpAttention", c->what);
  if (strstr (error->message, c->needle) == NULL)
    g_error ("message \"%s\" does not name \"%s\"", error->message, c->needle);
  g_assert_null (out);
}

static void
run_case (const Case *c)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  cp_test_run_ranks (meshes, expect_failure, (gpointer) c);
  cp_test_free_group (meshes);
}

static void
make_dtype_mismatch (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  *q = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, 8);
  *k = tensor4 (rank == 1 ? CP_DTYPE_BFLOAT16 : CP_DTYPE_FLOAT32, 1, 2, 4, 8);
  *v = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, 8);
}

static void
test_dtype_mismatch (void)
{
  Case c = { make_dtype_mismatch, CP_ATTENTION_ERROR_SHAPE, "k is bfloat16",
             "forward where one rank's k has another dtype (every rank fails)" };

  g_test_summary ("A dtype disagreement on one rank fails on every rank, naming the tensor");
  run_case (&c);
}

static void
make_shape_mismatch (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  *q = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, 8);
  *k = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, 8);
  *v = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, rank == 0 ? 16 : 8);
}

static void
test_shape_mismatch (void)
{
  Case c = { make_shape_mismatch, CP_ATTENTION_ERROR_SHAPE, "v is float32[1, 2, 4, 16]",
             "forward where one rank's v has another head dimension (every rank fails)" };

  run_case (&c);
}

static void
make_heads_indivisible (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  *q = tensor4 (CP_DTYPE_FLOAT32, 1, 3, 4, 8);
  *k = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, 8);
  *v = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, 8);
}

static void
test_heads_indivisible (void)
{
  Case c = { make_heads_indivisible, CP_ATTENTION_ERROR_SHAPE, "n_heads 3 (q) is not divisible by n_kv_heads 2",
             "forward with q heads not a multiple of k/v heads (GQA)" };

  run_case (&c);
}

static void
make_odd_length (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  *q = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 3, 8);
  *k = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 3, 8);
  *v = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 3, 8);
}

static void
test_local_length (void)
{
  Case c = { make_odd_length, CP_ATTENTION_ERROR_SHAPE, "local length S = 3",
             "forward with an odd local sequence length" };

  g_test_summary ("A local length no head-tail layout gives is an error");
  run_case (&c);
}

static void
make_thd_length (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  gint64 bounds[] = { 0, 8, 16 };
  gint64 shape[] = { rank == 0 ? 6 : 8, 2, 8 };

  cp_attention_options_set_cu_seqlens_padded (o, bounds, G_N_ELEMENTS (bounds));
  *q = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 1);
  *k = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 2);
  *v = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 3);
}

static void
test_thd_length (void)
{
  Case c = { make_thd_length, CP_ATTENTION_ERROR_SHAPE, "cu_seqlens_padded gives rank 0 8 tokens",
             "forward (THD) with a local length other than cu_seqlens_padded gives the rank" };

  run_case (&c);
}

/* Agreement: every field of the descriptor the ranks compare before any
 * K/V byte moves, made to differ on rank 1 alone, in forward and in
 * backward.  Each rank's inputs are valid on their own, so only the
 * comparison can catch the difference. */

/* A valid call of one rank: [B, H, S, D] (or packed [T, H, D]) inputs and
 * the options, with the field under test changed on rank 1. */
typedef struct
{
  CpDType dtype;
  gint64 batch, heads, kv_heads, local_len, head_dim;
  gboolean thd;
  gboolean backward;
  CpAttentionOptions *options;
} Call;

typedef void (*Disagree) (Call *call);

typedef struct
{
  const char *field;       /* the path component */
  const char *difference;  /* rank 1's, for the reliability table */
  const char *needle;      /* what the message must name */
  Disagree change;         /* applied on rank 1 only */
} Field;

typedef struct
{
  const Field *field;
  gboolean backward;
  char *what;             /* for the reliability table */
} Disagreement;

static void change_call (Call *c) { c->backward = !c->backward; }
static void change_dtype (Call *c) { c->dtype = CP_DTYPE_BFLOAT16; }
static void change_batch (Call *c) { c->batch = 2; }
static void change_heads (Call *c) { c->heads = 4; }
static void change_kv_heads (Call *c) { c->kv_heads = 2; }
static void change_head_dim (Call *c) { c->head_dim = 16; }
static void change_local_len (Call *c) { c->local_len = 8; }
static void change_causal (Call *c) { cp_attention_options_set_causal (c->options, FALSE); }
static void change_scale (Call *c) { cp_attention_options_set_scale (c->options, 0.5); }

static void
change_packed (Call *c)
{
  gint64 bounds[] = { 0, 8 };

  c->thd = TRUE;
  cp_attention_options_set_cu_seqlens_padded (c->options, bounds, G_N_ELEMENTS (bounds));
}

static void
change_rotate (Call *c)
{
  cp_attention_options_set_rotate_method (c->options, CP_ROTATE_METHOD_ALLTOALL);
}

static void
change_load_balance (Call *c)
{
  cp_attention_options_set_load_balance (c->options, CP_LOAD_BALANCE_CONTIGUOUS);
}

/* Both ranks pack two documents of 8 (cu_seqlens_padded [0, 8, 16]), so
 * that each holds 8 tokens; rank 1 is told of one document of 16. */
static void
pack_two_documents (Call *c)
{
  gint64 bounds[] = { 0, 8, 16 };

  c->thd = TRUE;
  c->local_len = 8;
  cp_attention_options_set_cu_seqlens_padded (c->options, bounds, G_N_ELEMENTS (bounds));
}

static void
change_cu_seqlens_padded (Call *c)
{
  gint64 bounds[] = { 0, 16 };

  cp_attention_options_set_cu_seqlens_padded (c->options, bounds, G_N_ELEMENTS (bounds));
}

/* seq_lens {5} on rank 0 (see call_init), {7} on rank 1. */
static void
change_seq_lens (Call *c)
{
  gint64 lens[] = { 7 };

  cp_attention_options_set_seq_lens (c->options, lens, G_N_ELEMENTS (lens));
}

static void
change_cu_seqlens (Call *c)
{
  gint64 real[] = { 0, 5, 13 };

  cp_attention_options_set_cu_seqlens (c->options, real, G_N_ELEMENTS (real));
}

/* Every field of the descriptor, with the message naming it on every
 * rank. */
static const Field fields[] = {
  { "call", "the other call (backward against forward, or forward against backward)",
    "ranks disagree on the call (forward or backward): rank 0 has", change_call },
  { "dtype", "bfloat16 inputs (rank 0: float32)",
    "ranks disagree on the dtype: rank 0 has float32, rank 1 has bfloat16", change_dtype },
  { "packed", "packed [T, H, D] inputs (rank 0: [B, H, S, D])",
    "ranks disagree on packed inputs ([T, H, D] or [B, H, S, D]): rank 0 has false, rank 1 has true",
    change_packed },
  { "batch", "batch size 2 (rank 0: 1)",
    "ranks disagree on the batch size: rank 0 has 1, rank 1 has 2", change_batch },
  { "heads", "4 query heads (rank 0: 2)",
    "ranks disagree on n_heads: rank 0 has 2, rank 1 has 4", change_heads },
  { "kv-heads", "2 key/value heads (rank 0: 1)",
    "ranks disagree on n_kv_heads: rank 0 has 1, rank 1 has 2", change_kv_heads },
  { "head-dim", "head dimension 16 (rank 0: 8)",
    "ranks disagree on the head dimension: rank 0 has 8, rank 1 has 16", change_head_dim },
  { "local-len", "local length 8 (rank 0: 4)",
    "ranks disagree on the local length: rank 0 has 4, rank 1 has 8", change_local_len },
  { "causal", "causal false (rank 0: true)",
    "ranks disagree on causal: rank 0 has true, rank 1 has false", change_causal },
  { "scale", "scale 0.5 (rank 0: the default)",
    "ranks disagree on the scale: rank 0 has 0.353553, rank 1 has 0.5", change_scale },
  { "rotate-method", "the ring (rank 0: all-gather)",
    "ranks disagree on the rotate method: rank 0 has allgather, rank 1 has alltoall", change_rotate },
  { "load-balance", "contiguous load balance (rank 0: head-tail)",
    "ranks disagree on the layout (load balance, cu_seqlens_padded): rank 0 has hash", change_load_balance },
  { "cu-seqlens-padded", "cu_seqlens_padded [0, 16] (rank 0: [0, 8, 16])",
    "ranks disagree on the layout (load balance, cu_seqlens_padded): rank 0 has hash",
    change_cu_seqlens_padded },
  { "seq-lens", "seq_lens {7} (rank 0: {5})",
    "ranks disagree on the real lengths (seq_lens, cu_seqlens): rank 0 has hash", change_seq_lens },
  { "cu-seqlens", "cu_seqlens [0, 5, 13] (rank 0: [0, 5, 12])",
    "ranks disagree on the real lengths (seq_lens, cu_seqlens): rank 0 has hash", change_cu_seqlens },
};

/* The call every rank makes before the field under test changes: C = 2,
 * [1, 2, 4, 8] float32 queries (a sequence of 8), one key/value head,
 * causal over the all-gather; seq_lens {5} where real lengths are under
 * test, two packed documents where cu_seqlens* are. */
static void
call_init (Call        *call,
           const Field *field,
           gboolean     backward)
{
  *call = (Call) { CP_DTYPE_FLOAT32, 1, 2, 1, 4, 8, FALSE, backward, cp_attention_options_new () };
  if (field->change == change_seq_lens)
    {
      gint64 lens[] = { 5 };

      cp_attention_options_set_seq_lens (call->options, lens, G_N_ELEMENTS (lens));
    }
  if (field->change == change_cu_seqlens_padded || field->change == change_cu_seqlens)
    pack_two_documents (call);
  if (field->change == change_cu_seqlens)
    {
      gint64 real[] = { 0, 5, 12 };

      cp_attention_options_set_cu_seqlens (call->options, real, G_N_ELEMENTS (real));
    }
}

static CpTensor *
call_tensor (const Call *call,
             CpDType     dtype,
             gint64      heads,
             guint       seed)
{
  gint64 bshd[] = { call->batch, heads, call->local_len, call->head_dim };
  gint64 thd[] = { call->local_len, heads, call->head_dim };

  return call->thd ? cp_test_tensor_pattern (dtype, thd, 3, seed)
                   : cp_test_tensor_pattern (dtype, bshd, 4, seed);
}

/* The log-sum-exp backward takes: [B, H, S], or [H, T] packed. */
static CpTensor *
call_lse (const Call *call)
{
  gint64 bshd[] = { call->batch, call->heads, call->local_len };
  gint64 thd[] = { call->heads, call->local_len };

  return call->thd ? cp_test_tensor_pattern (CP_DTYPE_FLOAT32, thd, 2, 5)
                   : cp_test_tensor_pattern (CP_DTYPE_FLOAT32, bshd, 3, 5);
}

/* Makes the call; returns whether it succeeded. */
static gboolean
call_run (CpMesh      *mesh,
          const Call  *call,
          GError     **error)
{
  g_autoptr(CpAttention) attention = cp_attention_new (mesh, call->options, error);
  g_autoptr(CpTensor) q = call_tensor (call, call->dtype, call->heads, 1);
  g_autoptr(CpTensor) k = call_tensor (call, call->dtype, call->kv_heads, 2);
  g_autoptr(CpTensor) v = call_tensor (call, call->dtype, call->kv_heads, 3);
  g_autoptr(CpTensor) dout = call_tensor (call, call->dtype, call->heads, 4);
  g_autoptr(CpTensor) lse = call_lse (call);
  g_autoptr(CpTensor) out = NULL, dq = NULL, dk = NULL, dv = NULL;
  gboolean ok;

  g_assert_no_error (*error);
  if (!call->backward)
    ok = cp_attention_forward (attention, q, k, v, &out, NULL, error);
  else
    ok = cp_attention_backward (attention, dout, q, k, v, dout, lse, &dq, &dk, &dv, error);
  if (!ok)
    g_assert_true (out == NULL && dq == NULL && dk == NULL && dv == NULL);
  return ok;
}

static void
disagree_rank (CpMesh   *mesh,
               gpointer  data)
{
  const Disagreement *d = data;
  g_autoptr(GError) error = NULL;
  Call call;

  call_init (&call, d->field, d->backward);
  if (cp_mesh_get_rank (mesh) == 1)
    d->field->change (&call);
  g_assert_false (call_run (mesh, &call, &error));
  CP_TEST_ASSERT_CASE (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE, "CpAttention", d->what);
  if (strstr (error->message, d->field->needle) == NULL)
    g_error ("rank %d: message \"%s\" does not name \"%s\"", cp_mesh_get_rank (mesh),
             error->message, d->field->needle);
  g_object_unref (call.options);
}

static void
test_disagreement (gconstpointer data)
{
  const Disagreement *d = data;
  GList *meshes = cp_test_local_group ("cp", 2);

  cp_test_run_ranks (meshes, disagree_rank, (gpointer) d);
  cp_test_free_group (meshes);
}

static void
free_disagreement (gpointer data)
{
  Disagreement *d = data;

  g_free (d->what);
  g_free (d);
}

static void
add_disagreement_tests (void)
{
  for (guint f = 0; f < G_N_ELEMENTS (fields); f++)
    for (int backward = 0; backward < 2; backward++)
      {
        Disagreement *d = g_new0 (Disagreement, 1);
        g_autofree char *path = g_strdup_printf ("/Cp/Attention/errors/disagree/%s/%s",
                                                 fields[f].field, backward ? "backward" : "forward");

        d->field = &fields[f];
        d->backward = backward;
        d->what = g_strdup_printf ("%s where rank 1 alone has %s (every rank fails)",
                                   backward ? "backward" : "forward", fields[f].difference);
        g_test_add_data_func_full (path, d, test_disagreement, free_disagreement);
      }
}

static void
make_float16 (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  *q = tensor4 (CP_DTYPE_FLOAT16, 1, 2, 4, 8);
  *k = tensor4 (CP_DTYPE_FLOAT16, 1, 2, 4, 8);
  *v = tensor4 (CP_DTYPE_FLOAT16, 1, 2, 4, 8);
}

static void
test_unsupported_dtype (void)
{
  Case c = { make_float16, CP_ATTENTION_ERROR_UNSUPPORTED, "q is float16",
             "forward in float16" };

  run_case (&c);
}

static void
make_wide_head (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  *q = tensor4 (CP_DTYPE_FLOAT32, 1, 1, 2, 300);
  *k = tensor4 (CP_DTYPE_FLOAT32, 1, 1, 2, 300);
  *v = tensor4 (CP_DTYPE_FLOAT32, 1, 1, 2, 300);
}

static void
test_head_dim (void)
{
  Case c = { make_wide_head, CP_ATTENTION_ERROR_UNSUPPORTED, "head dimension 300",
             "forward with a head dimension above 256" };

  run_case (&c);
}

static void
make_seq_lens (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  gint64 lens[] = { 3, 3 };

  make_shape_mismatch (1, q, k, v, o);
  cp_attention_options_set_seq_lens (o, lens, G_N_ELEMENTS (lens));
}

static void
test_seq_lens_count (void)
{
  Case c = { make_seq_lens, CP_ATTENTION_ERROR_SHAPE, "seq_lens has 2 entries but q has batch size 1",
             "forward with seq_lens of another count than the batch" };

  run_case (&c);
}

static void
test_bad_cu_seqlens (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);
  g_autoptr(CpAttentionOptions) options = cp_attention_options_new ();
  g_autoptr(GError) error = NULL;
  g_autoptr(CpAttention) attention = NULL;
  gint64 bounds[] = { 0, 6 };
  gint64 real[] = { 0, 9 };

  cp_attention_options_set_cu_seqlens_padded (options, bounds, G_N_ELEMENTS (bounds));
  attention = cp_attention_new (meshes->data, options, &error);
  CP_TEST_ASSERT_CASE (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE, "CpAttention",
                       "cp_attention_new with cu_seqlens_padded documents not a multiple of 2·C");
  g_assert_nonnull (strstr (error->message, "cu_seqlens_padded"));
  g_assert_null (attention);
  g_clear_error (&error);

  bounds[1] = 8;
  cp_attention_options_set_cu_seqlens_padded (options, bounds, G_N_ELEMENTS (bounds));
  cp_attention_options_set_cu_seqlens (options, real, G_N_ELEMENTS (real));
  attention = cp_attention_new (meshes->data, options, &error);
  CP_TEST_ASSERT_CASE (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE, "CpAttention",
                       "cp_attention_new with a real document length above its padded length");
  g_assert_nonnull (strstr (error->message, "real length 9"));
  cp_test_free_group (meshes);
}

static void
backward_bad_lse (CpMesh   *mesh,
                  gpointer  data)
{
  g_autoptr(CpAttention) attention = cp_attention_new (mesh, NULL, NULL);
  g_autoptr(CpTensor) q = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 4, 8);
  g_autoptr(CpTensor) out = NULL, lse = NULL, bad_lse = NULL;
  CpTensor *dq = NULL, *dk = NULL, *dv = NULL;
  gint64 shape[] = { 1, 2, 5 };
  g_autoptr(GError) error = NULL;

  g_assert_true (cp_attention_forward (attention, q, q, q, &out, &lse, &error));
  bad_lse = cp_test_on_device (cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, NULL));
  g_assert_false (cp_attention_backward (attention, out, q, q, q, out,
                                         cp_mesh_get_rank (mesh) == 0 ? bad_lse : lse,
                                         &dq, &dk, &dv, &error));
  CP_TEST_ASSERT_CASE (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE, "CpAttention",
                       "backward where one rank's lse has the wrong shape (every rank fails)");
  g_assert_nonnull (strstr (error->message, "lse is float32[1, 2, 5]"));
  g_assert_null (dq);
}

static void
test_backward_lse (void)
{
  GList *meshes = cp_test_local_group ("cp", 2);

  g_test_summary ("backward checks lse against q, and a bad lse on one rank fails both");
  cp_test_run_ranks (meshes, backward_bad_lse, NULL);
  cp_test_free_group (meshes);
}

/* Without a mesh, attention is that of one rank: the same results as on
 * the only rank of a one-rank mesh, bit for bit, forward and backward;
 * and bad inputs are still refused. */
static void
test_without_mesh (void)
{
  GList *one = cp_test_local_group ("cp", 1);
  g_autoptr(CpTensor) q = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 8, 8);
  g_autoptr(CpTensor) k = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 8, 8);
  g_autoptr(CpTensor) v = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 8, 8);
  g_autoptr(CpTensor) odd = tensor4 (CP_DTYPE_FLOAT32, 1, 2, 8, 4);
  g_autoptr(CpAttention) alone = NULL;
  g_autoptr(CpAttention) ranked = NULL;
  g_autoptr(CpTensor) out = NULL, lse = NULL, ranked_out = NULL, ranked_lse = NULL;
  g_autoptr(CpTensor) dq = NULL, dk = NULL, dv = NULL;
  g_autoptr(CpTensor) ranked_dq = NULL, ranked_dk = NULL, ranked_dv = NULL;
  g_autoptr(CpTensor) bad = NULL;
  g_autoptr(GError) error = NULL;

#if defined (__SANITIZE_THREAD__)
  /* This case runs the attention kernel, whose OpenMP threads
   * ThreadSanitizer cannot see (the other kernel tests are in suite
   * 'jit', which the ThreadSanitizer run leaves out). */
  g_test_skip ("runs the attention kernel's OpenMP threads, which ThreadSanitizer cannot see");
  cp_test_free_group (one);
  return;
#endif
  alone = cp_attention_new (NULL, NULL, &error);
  g_assert_no_error (error);
  ranked = cp_attention_new (one->data, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpint (cp_mesh_get_world_size (cp_attention_get_mesh (alone)), ==, 1);

  g_assert_true (cp_attention_forward (alone, q, k, v, &out, &lse, &error));
  g_assert_no_error (error);
  g_assert_true (cp_attention_forward (ranked, q, k, v, &ranked_out, &ranked_lse, &error));
  g_assert_no_error (error);
  CP_TEST_ASSERT_SHAPE (out, 1, 2, 8, 8);
  CP_TEST_ASSERT_SHAPE (lse, 1, 2, 8);
  g_assert_true (cp_tensor_equal (out, ranked_out));
  g_assert_true (cp_tensor_equal (lse, ranked_lse));

  g_assert_true (cp_attention_backward (alone, out, q, k, v, out, lse, &dq, &dk, &dv, &error));
  g_assert_no_error (error);
  g_assert_true (cp_attention_backward (ranked, ranked_out, q, k, v, ranked_out, ranked_lse,
                                        &ranked_dq, &ranked_dk, &ranked_dv, &error));
  g_assert_no_error (error);
  g_assert_true (cp_tensor_equal (dq, ranked_dq));
  g_assert_true (cp_tensor_equal (dk, ranked_dk));
  g_assert_true (cp_tensor_equal (dv, ranked_dv));

  g_assert_false (cp_attention_forward (alone, q, k, odd, &bad, NULL, &error));
  CP_TEST_ASSERT_CASE (error, CP_ATTENTION_ERROR, CP_ATTENTION_ERROR_SHAPE, "CpAttention",
                       "forward without a mesh where v has another head dimension");
  g_assert_null (bad);
  g_clear_object (&ranked);
  cp_test_free_group (one);
}

static void
count_notify (GObject    *object,
              GParamSpec *pspec,
              gpointer    user_data)
{
  (*(guint *) user_data)++;
}

static void
test_options_properties (void)
{
  g_autoptr(CpAttentionOptions) options = NULL;
  g_autoptr(CpAttentionOptions) copy = NULL;
  const gint64 bounds[] = { 0, 8, 12 };
  CpRotateMethod method;
  guint notified = 0;
  gboolean causal;
  int n_kv_heads;

  g_test_summary ("CpAttentionOptions is a GObject: its settings are properties, set at "
                  "construction and through the setters, which notify only on a change");
  options = g_object_new (CP_TYPE_ATTENTION_OPTIONS,
                          "causal", FALSE,
                          "rotate-method", CP_ROTATE_METHOD_ALLTOALL,
                          "n-threads", 2,
                          NULL);
  g_assert_false (cp_attention_options_get_causal (options));
  g_assert_cmpint (cp_attention_options_get_rotate_method (options), ==, CP_ROTATE_METHOD_ALLTOALL);
  g_assert_cmpint (cp_attention_options_get_n_threads (options), ==, 2);
  g_assert_cmpint (cp_attention_options_get_load_balance (options), ==, CP_LOAD_BALANCE_HEAD_TAIL);

  g_signal_connect (options, "notify", G_CALLBACK (count_notify), &notified);
  cp_attention_options_set_heads (options, 8, 2);
  g_assert_cmpuint (notified, ==, 2);
  cp_attention_options_set_heads (options, 8, 2);
  cp_attention_options_set_n_threads (options, 2);
  g_assert_cmpuint (notified, ==, 2);
  g_object_get (options, "n-kv-heads", &n_kv_heads, "causal", &causal, "rotate-method", &method, NULL);
  g_assert_cmpint (n_kv_heads, ==, 2);
  g_assert_false (causal);
  g_assert_cmpint (method, ==, CP_ROTATE_METHOD_ALLTOALL);

  /* A copy is new options with the same settings, arrays included. */
  cp_attention_options_set_cu_seqlens_padded (options, bounds, G_N_ELEMENTS (bounds));
  copy = cp_attention_options_copy (options);
  g_assert_true (copy != options);
  g_assert_cmpint (cp_attention_options_get_n_heads (copy), ==, 8);
  g_assert_cmpint (cp_attention_options_get_cu_seqlens_padded (copy, NULL)[2], ==, 12);
  cp_attention_options_set_causal (copy, TRUE);
  g_assert_false (cp_attention_options_get_causal (options));
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Attention/errors/dtype-mismatch", test_dtype_mismatch);
  g_test_add_func ("/Cp/Attention/errors/shape-mismatch", test_shape_mismatch);
  g_test_add_func ("/Cp/Attention/errors/heads-indivisible", test_heads_indivisible);
  g_test_add_func ("/Cp/Attention/errors/local-length", test_local_length);
  g_test_add_func ("/Cp/Attention/errors/thd-length", test_thd_length);
  add_disagreement_tests ();
  g_test_add_func ("/Cp/Attention/errors/dtype-unsupported", test_unsupported_dtype);
  g_test_add_func ("/Cp/Attention/errors/head-dim", test_head_dim);
  g_test_add_func ("/Cp/Attention/errors/seq-lens-count", test_seq_lens_count);
  g_test_add_func ("/Cp/Attention/errors/cu-seqlens", test_bad_cu_seqlens);
  g_test_add_func ("/Cp/Attention/errors/backward-lse", test_backward_lse);
  g_test_add_func ("/Cp/AttentionOptions/properties", test_options_properties);
  g_test_add_func ("/Cp/Attention/new/no-mesh", test_without_mesh);

  return g_test_run ();
}
