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

static void
make_disagreeing_options (int rank, CpTensor **q, CpTensor **k, CpTensor **v, CpAttentionOptions *o)
{
  make_shape_mismatch (1, q, k, v, o);
  cp_attention_options_set_causal (o, rank == 0);
}

static void
test_options_disagree (void)
{
  Case c = { make_disagreeing_options, CP_ATTENTION_ERROR_SHAPE, "ranks disagree on causal",
             "forward where ranks pass different options (every rank fails)" };

  g_test_summary ("Ranks called with different options fail together");
  run_case (&c);
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
  bad_lse = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, NULL);
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
  g_test_add_func ("/Cp/Attention/errors/options-disagree", test_options_disagree);
  g_test_add_func ("/Cp/Attention/errors/dtype-unsupported", test_unsupported_dtype);
  g_test_add_func ("/Cp/Attention/errors/head-dim", test_head_dim);
  g_test_add_func ("/Cp/Attention/errors/seq-lens-count", test_seq_lens_count);
  g_test_add_func ("/Cp/Attention/errors/cu-seqlens", test_bad_cu_seqlens);
  g_test_add_func ("/Cp/Attention/errors/backward-lse", test_backward_lse);

  return g_test_run ();
}
