/* test-batch.c: CpBatch and its prepare, the native make_cp_batch_and_ctx
 *
 * The reference cases (NeMo Automodel's test_cp_utils,
 * test_cp_utils_diffcov and test_cp_utils_inputs_embeds) are reproduced on
 * real in-process meshes: every rank prepares its own copy of the batch
 * and enters the context together with the others.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <string.h>

#include "cp-test-util.h"

static const gint64 row6[] = { 1, 6 };
static const gint64 row8[] = { 1, 8 };

/* E2: ids [[11..16]], labels [[1..6]], no position ids. */
static CpBatch *
e2_batch (void)
{
  CpBatch *batch = cp_batch_new ();

  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 11, 12, 13, 14, 15, 16));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 2, 3, 4, 5, 6));
  return batch;
}

static CpContext *
prepare_ok (CpBatch        *batch,
            CpMesh         *mesh,
            CpBatchOptions *options)
{
  g_autoptr(GError) error = NULL;
  CpContext *context = cp_batch_prepare (batch, mesh, options, &error);

  g_assert_no_error (error);
  g_assert_nonnull (context);
  return context;
}

static void
test_container (void)
{
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) a = CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 2, 3, 4, 5, 6);
  g_autoptr(CpTensor) b = CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 6, 5, 4, 3, 2, 1);
  const char *order[] = { "labels", "input_ids", "teacher_logits", NULL };
  g_auto(GStrv) copied_keys = NULL;
  int dim = 0;

  g_assert_cmpuint (cp_batch_get_n_keys (batch), ==, 0);
  g_assert_null (cp_batch_get_keys (batch)[0]);
  cp_batch_set (batch, "labels", a);
  cp_batch_set (batch, "input_ids", b);
  cp_batch_set (batch, "teacher_logits", a);
  g_assert_cmpstrv (cp_batch_get_keys (batch), order);
  copied_keys = cp_batch_dup_keys (batch);
  g_assert_cmpstrv (copied_keys, order);
  g_assert_true (cp_batch_get (batch, "input_ids") == b);
  g_assert_null (cp_batch_get (batch, "position_ids"));
  g_assert_true (cp_batch_contains (batch, "labels"));
  g_assert_false (cp_batch_contains (batch, "loss_mask"));

  /* Replacing keeps the position and the sequence dimension. */
  cp_batch_set_seq_dim (batch, "teacher_logits", -1);
  cp_batch_set (batch, "teacher_logits", b);
  g_assert_cmpstrv (cp_batch_get_keys (batch), order);
  g_assert_true (cp_batch_get_seq_dim (batch, "teacher_logits", &dim));
  g_assert_cmpint (dim, ==, -1);
  g_assert_false (cp_batch_get_seq_dim (batch, "labels", NULL));

  g_assert_true (cp_batch_remove (batch, "input_ids"));
  g_assert_false (cp_batch_remove (batch, "input_ids"));
  g_assert_cmpuint (cp_batch_get_n_keys (batch), ==, 2);
  g_assert_cmpstr (cp_batch_get_keys (batch)[1], ==, "teacher_logits");
  g_assert_null (cp_batch_get_keys (batch)[2]);
  /* The copy does not follow the batch. */
  g_assert_cmpstrv (copied_keys, order);
  g_assert_true (cp_batch_remove (batch, "teacher_logits"));
  cp_batch_set (batch, "teacher_logits", b);
  g_assert_false (cp_batch_get_seq_dim (batch, "teacher_logits", NULL));
  g_assert_cmpstr (cp_batch_get_qkv_format (batch), ==, "bshd");
}

/* test_cp_utils: mesh None gives a context that does nothing and the
 * untouched batch. */
static void
test_no_mesh (void)
{
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(CpTensor) mask = CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 1, 1, 1, 1, 1);
  CpTensor *ids = cp_batch_get (batch, "input_ids");
  CpStorage *storage = cp_tensor_get_storage (ids);
  g_autoptr(CpContext) context = NULL;
  const char *keys[] = { "input_ids", "labels", "attention_mask", NULL };

  cp_batch_set (batch, "attention_mask", mask);
  context = prepare_ok (batch, NULL, NULL);
  g_assert_null (cp_context_get_mesh (context));
  g_assert_cmpint (cp_context_get_cp_size (context), ==, 1);
  g_assert_cmpuint (cp_context_get_n_buffers (context), ==, 0);
  g_assert_cmpstrv (cp_batch_get_keys (batch), keys);
  cp_test_enter_ok (context);
  g_assert_true (cp_context_is_entered (context));
  cp_test_exit_ok (context);
  g_assert_true (cp_tensor_get_storage (ids) == storage);
  CP_TEST_ASSERT_VALUES (ids, 11, 12, 13, 14, 15, 16);
}

/* test_inputs_embeds_no_op_when_cp_size_le_1: cp = 1 leaves the batch
 * untouched, no position ids are injected. */
static void
cp_one_rank (CpMesh   *mesh,
             gpointer  user_data)
{
  const gint64 shape[] = { 1, 6, 4 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;
  const char *keys[] = { "inputs_embeds", "labels", NULL };

  cp_test_batch_take (batch, "inputs_embeds", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 1));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 2, 3, 4, 5, 6));
  context = prepare_ok (batch, mesh, NULL);
  g_assert_cmpint (cp_context_get_cp_size (context), ==, 1);
  g_assert_cmpuint (cp_context_get_n_buffers (context), ==, 0);
  g_assert_cmpstrv (cp_batch_get_keys (batch), keys);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "inputs_embeds"), 1, 6, 4);
  cp_test_enter_ok (context);
  cp_test_exit_ok (context);
}

static void
test_cp_size_one (void)
{
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 2, 1 };

  cp_test_run_mesh (names, sizes, 2, cp_one_rank, NULL);
}

static void
test_mesh_without_cp (void)
{
  const char *names[] = { "dp", "tp", NULL };
  const int sizes[] = { 1, 1 };
  g_autoptr(GError) error = NULL;
  GList *meshes = cp_mesh_new_local_group (names, sizes, 2, &error);
  g_autoptr(CpBatch) batch = e2_batch ();

  g_assert_no_error (error);
  g_assert_null (cp_batch_prepare (batch, meshes->data, NULL, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpBatch",
                       "cp_batch_prepare on a mesh without a cp dimension");
  g_assert_nonnull (strstr (error->message, "\"cp\""));
  g_assert_false (cp_batch_contains (batch, "position_ids"));
  cp_test_free_group (meshes);
}

/* E2 on two ranks: padding, position synthesis, head-tail pieces, and
 * exit restoring the position ids only. */
static void
e2_rank (CpMesh   *mesh,
         gpointer  user_data)
{
  g_autoptr(CpBatch) batch = e2_batch ();
  const gint64 mask_shape[] = { 1, 6 };
  g_autoptr(CpTensor) mask = CP_TEST_TENSOR (CP_DTYPE_BOOL, mask_shape, 0, 0, 0, 0, 1, 1);
  g_autoptr(CpContext) context = NULL;
  CpTensor *ids, *labels, *positions;
  int rank = cp_mesh_get_rank (mesh);

  cp_batch_set (batch, "padding_mask", mask);
  context = prepare_ok (batch, mesh, NULL);
  ids = cp_batch_get (batch, "input_ids");
  labels = cp_batch_get (batch, "labels");
  positions = cp_batch_get (batch, "position_ids");
  CP_TEST_ASSERT_VALUES (ids, 11, 12, 13, 14, 15, 16, 0, 0);
  CP_TEST_ASSERT_VALUES (labels, 1, 2, 3, 4, 5, 6, -100, -100);
  CP_TEST_ASSERT_VALUES (positions, 0, 1, 2, 3, 4, 5, 0, 0);
  CP_TEST_ASSERT_VALUES (mask, 0, 0, 0, 0, 1, 1, 1, 1);
  g_assert_cmpint (cp_tensor_get_dtype (positions), ==, CP_DTYPE_INT64);

  cp_test_enter_ok (context);
  CP_TEST_ASSERT_SHAPE (ids, 1, 4);
  if (rank == 0)
    {
      CP_TEST_ASSERT_VALUES (ids, 11, 12, 0, 0);
      CP_TEST_ASSERT_VALUES (labels, 1, 2, -100, -100);
      CP_TEST_ASSERT_VALUES (positions, 0, 1, 0, 0);
      CP_TEST_ASSERT_VALUES (mask, 0, 0, 1, 1);
    }
  else
    {
      CP_TEST_ASSERT_VALUES (ids, 13, 14, 15, 16);
      CP_TEST_ASSERT_VALUES (labels, 3, 4, 5, 6);
      CP_TEST_ASSERT_VALUES (positions, 2, 3, 4, 5);
      CP_TEST_ASSERT_VALUES (mask, 0, 0, 1, 1);
    }
  cp_test_exit_ok (context);
  CP_TEST_ASSERT_VALUES (positions, 0, 1, 2, 3, 4, 5, 0, 0);
  CP_TEST_ASSERT_SHAPE (ids, 1, 4);
  CP_TEST_ASSERT_SHAPE (labels, 1, 4);
  g_assert_true (cp_batch_get (batch, "position_ids") == positions);
}

/* The last batch of a dataset may have no rows: [0, S] ids or [0, S, H]
 * embeddings go through prepare, enter and exit like any other batch,
 * every buffer empty at each step.  S is long so that writing the
 * synthesized positions of a row that does not exist reaches far past
 * the empty allocation. */
#define EMPTY_S ((G_GINT64_CONSTANT (1) << 22) + 1)

static void
empty_rank (CpMesh   *mesh,
            gpointer  user_data)
{
  gboolean embeds = GPOINTER_TO_INT (user_data);
  const gint64 ids_shape[] = { 0, EMPTY_S, 3 };
  const gint64 labels_shape[] = { 0, EMPTY_S };
  const gint64 padded = EMPTY_S + 3; /* the next multiple of 2·C = 4 */
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;
  const char *primary = embeds ? "inputs_embeds" : "input_ids";
  CpTensor *positions;

  cp_test_batch_take (batch, primary,
                      cp_tensor_new (embeds ? CP_DTYPE_FLOAT32 : CP_DTYPE_INT64, ids_shape,
                                     embeds ? 3 : 2, NULL));
  cp_test_batch_take (batch, "labels", cp_tensor_new (CP_DTYPE_INT64, labels_shape, 2, NULL));
  cp_test_batch_take (batch, "odd", cp_tensor_new (CP_DTYPE_INT64, labels_shape, 2, NULL));
  cp_batch_set_seq_dim (batch, "odd", -1);
  context = prepare_ok (batch, mesh, NULL);
  positions = cp_batch_get (batch, "position_ids");
  CP_TEST_ASSERT_SHAPE (positions, 0, padded);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "labels"), 0, padded);
  g_assert_cmpuint (cp_context_get_n_buffers (context), ==, 4);
  cp_test_enter_ok (context);
  if (embeds)
    CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, primary), 0, padded / 2, 3);
  else
    CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, primary), 0, padded / 2);
  CP_TEST_ASSERT_SHAPE (positions, 0, padded / 2);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "odd"), 0, padded / 2);
  cp_test_exit_ok (context);
  CP_TEST_ASSERT_SHAPE (positions, 0, padded);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "labels"), 0, padded / 2);
}

static void
test_empty_batch (gconstpointer embeds)
{
  cp_test_run_group ("cp", 2, empty_rank, (gpointer) embeds);
}

/* E1: rank r holds chunks r and 2·C−1−r, for C ∈ {2, 3, 4, 8}. */
static void
e1_rank (CpMesh   *mesh,
         gpointer  user_data)
{
  int c = cp_mesh_get_world_size (mesh);
  int r = cp_mesh_get_rank (mesh);
  gint64 shape[] = { 1, 4 * (gint64) c };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;
  CpTensor *ids;

  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 0));
  for (gint64 i = 0; i < shape[1]; i++)
    cp_tensor_set_value (cp_batch_get (batch, "input_ids"), i, (double) i);
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 3));
  context = prepare_ok (batch, mesh, NULL);
  cp_test_enter_ok (context);
  ids = cp_batch_get (batch, "input_ids");
  CP_TEST_ASSERT_VALUES (ids, 2 * r, 2 * r + 1, 2 * (2 * c - 1 - r), 2 * (2 * c - 1 - r) + 1);
  cp_test_exit_ok (context);
}

static void
test_example_e1 (void)
{
  const int sizes[] = { 2, 3, 4, 8 };

  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    cp_test_run_group ("cp", sizes[i], e1_rank, NULL);
}

/* E3 and test_inputs_embeds_3d_position_ids_seq_dim: mRoPE [3, B, S] is
 * registered and sharded along dimension 2. */
static void
mrope_rank (CpMesh   *mesh,
            gpointer  user_data)
{
  const gint64 embeds_shape[] = { 1, 8, 4 };
  const gint64 pos_shape[] = { 3, 1, 8 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;
  CpTensor *positions;

  cp_test_batch_take (batch, "inputs_embeds", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, embeds_shape, 3, 0));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, row8, 2, 1));
  positions = cp_test_tensor_pattern (CP_DTYPE_INT64, pos_shape, 3, 0);
  for (gint64 i = 0; i < 24; i++)
    cp_tensor_set_value (positions, i, (double) i);
  cp_test_batch_take (batch, "position_ids", positions);
  context = prepare_ok (batch, mesh, NULL);
  g_assert_cmpint (cp_context_get_buffer_seq_dim (context, 0), ==, 1);
  g_assert_cmpint (cp_context_get_buffer_seq_dim (context, 1), ==, 1);
  g_assert_cmpint (cp_context_get_buffer_seq_dim (context, 2), ==, 2);
  g_assert_true (cp_context_get_buffer (context, 2) == positions);
  cp_test_enter_ok (context);
  CP_TEST_ASSERT_SHAPE (positions, 3, 1, 4);
  if (cp_mesh_get_rank (mesh) == 0)
    CP_TEST_ASSERT_VALUES (positions, 0, 1, 6, 7, 8, 9, 14, 15, 16, 17, 22, 23);
  else
    CP_TEST_ASSERT_VALUES (positions, 2, 3, 4, 5, 10, 11, 12, 13, 18, 19, 20, 21);
  cp_test_exit_ok (context);
  CP_TEST_ASSERT_SHAPE (positions, 3, 1, 8);
  CP_TEST_ASSERT_VALUES (positions, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                         16, 17, 18, 19, 20, 21, 22, 23);
}

/* test_position_ids_synthesized_from_inputs_embeds_seq_dim and
 * _for_each_batch_row: positions come from S (not H), one row per batch
 * row; test_singleton_position_ids_expand_to_batch_size: [1, 8] with
 * B = 2 becomes [2, 8], registered third. */
static void
positions_rank (CpMesh   *mesh,
                gpointer  user_data)
{
  const gint64 wide[] = { 1, 12, 32 };
  const gint64 rows[] = { 3, 8, 16 };
  const gint64 two[] = { 2, 8 };
  g_autoptr(CpBatch) a = cp_batch_new ();
  g_autoptr(CpBatch) b = cp_batch_new ();
  g_autoptr(CpBatch) c = cp_batch_new ();
  g_autoptr(CpContext) ca = NULL;
  g_autoptr(CpContext) cb = NULL;
  g_autoptr(CpContext) cc = NULL;
  CpTensor *single;
  const gint64 labels12[] = { 1, 12 };
  const gint64 labels3[] = { 3, 8 };

  cp_test_batch_take (a, "inputs_embeds", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, wide, 3, 0));
  cp_test_batch_take (a, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, labels12, 2, 0));
  ca = prepare_ok (a, mesh, NULL);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (a, "position_ids"), 1, 12);
  CP_TEST_ASSERT_VALUES (cp_batch_get (a, "position_ids"), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);

  cp_test_batch_take (b, "inputs_embeds", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, rows, 3, 0));
  cp_test_batch_take (b, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, labels3, 2, 0));
  cb = prepare_ok (b, mesh, NULL);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (b, "position_ids"), 3, 8);
  CP_TEST_ASSERT_VALUES (cp_batch_get (b, "position_ids"), 0, 1, 2, 3, 4, 5, 6, 7,
                         0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);

  cp_test_batch_take (c, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, two, 2, 0));
  cp_test_batch_take (c, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, two, 2, 1));
  single = CP_TEST_TENSOR (CP_DTYPE_INT64, row8, 0, 1, 2, 3, 4, 5, 6, 7);
  cp_test_batch_take (c, "position_ids", single);
  cc = prepare_ok (c, mesh, NULL);
  CP_TEST_ASSERT_SHAPE (single, 2, 8);
  g_assert_true (cp_batch_get (c, "position_ids") == single);
  g_assert_true (cp_context_get_buffer (cc, 2) == single);
  CP_TEST_ASSERT_VALUES (single, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
}

/* test_build_position_ids_does_not_override_existing: given position ids
 * keep their values. */
static void
existing_positions_rank (CpMesh   *mesh,
                         gpointer  user_data)
{
  const gint64 shape[] = { 1, 4 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) positions = CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 5, 4, 3, 2);
  g_autoptr(CpContext) context = NULL;

  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 1, 2, 3, 4));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 1, 2, 3, 4));
  cp_batch_set (batch, "position_ids", positions);
  context = prepare_ok (batch, mesh, NULL);
  g_assert_true (cp_batch_get (batch, "position_ids") == positions);
  CP_TEST_ASSERT_VALUES (positions, 5, 4, 3, 2);
}

/* Registration order and axes, the reference's: primary, labels,
 * position_ids, loss mask, padding_mask, extras; only position_ids
 * restores.  test_make_cp_batch_and_ctx_mm_token_type_ids_do_not_select_manual:
 * other keys are not registered and keep their length. */
static void
order_rank (CpMesh   *mesh,
            gpointer  user_data)
{
  const gint64 logits_shape[] = { 1, 6, 5 };
  const char *names[] = { "input_ids", "labels", "position_ids", "loss_mask", "padding_mask",
                          "teacher_logits", "student_hidden" };
  const int dims[] = { 1, 1, 1, 1, 1, 1, 2 };
  const gint64 hidden_shape[] = { 1, 2, 6 };
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(CpBatchOptions) options = cp_batch_options_new ();
  g_autoptr(CpTensor) loss_mask = CP_TEST_TENSOR (CP_DTYPE_FLOAT32, row6, 1, 1, 1, 1, 0, 0);
  g_autoptr(CpContext) context = NULL;
  CpTensor *mm;

  cp_test_batch_take (batch, "padding_mask", CP_TEST_TENSOR (CP_DTYPE_BOOL, row6, 0, 0, 0, 0, 0, 0));
  cp_test_batch_take (batch, "teacher_logits", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, logits_shape, 3, 2));
  cp_test_batch_take (batch, "student_hidden", cp_test_tensor_pattern (CP_DTYPE_BFLOAT16, hidden_shape, 3, 4));
  cp_test_batch_take (batch, "mm_token_type_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 0, 1, 1, 0, 0, 0));
  cp_batch_set_seq_dim (batch, "student_hidden", -1);
  cp_batch_options_add_extra_buffer (options, "teacher_logits", 1);
  cp_batch_options_set_loss_mask (options, loss_mask);
  context = prepare_ok (batch, mesh, options);

  g_assert_cmpuint (cp_context_get_n_buffers (context), ==, G_N_ELEMENTS (names));
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    {
      CpTensor *expected = i == 3 ? loss_mask : cp_batch_get (batch, names[i]);

      g_assert_cmpstr (cp_context_get_buffer_name (context, i), ==, names[i]);
      g_assert_true (cp_context_get_buffer (context, i) == expected);
      g_assert_cmpint (cp_context_get_buffer_seq_dim (context, i), ==, dims[i]);
      g_assert_cmpint (cp_context_get_buffer_restores (context, i), ==, i == 2);
      g_assert_cmpint (cp_tensor_get_dim (expected, dims[i]), ==, 8);
    }
  mm = cp_batch_get (batch, "mm_token_type_ids");
  cp_test_enter_ok (context);
  CP_TEST_ASSERT_VALUES (mm, 0, 1, 1, 0, 0, 0);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "student_hidden"), 1, 2, 4);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "teacher_logits"), 1, 4, 5);
  cp_test_exit_ok (context);
}

/* test_padding_labels_use_negative_100_int_buffers_use_zero,
 * test_padding_input_ids_path_int_padding_with_zero,
 * test_padding_pads_all_buffers_to_cp_divisor_multiple and
 * test_padding_handles_loss_mask_and_padding_mask. */
static void
pad_values_rank (CpMesh   *mesh,
                 gpointer  user_data)
{
  const gint64 embeds_shape[] = { 1, 6, 4 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) embeds = NULL;
  g_autoptr(CpContext) context = NULL;
  g_autoptr(GError) error = NULL;

  embeds = cp_tensor_new_full (CP_DTYPE_FLOAT32, embeds_shape, 3, 1.0, &error);
  g_assert_no_error (error);
  cp_batch_set (batch, "inputs_embeds", embeds);
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 2, 3, 4, 5, 6));
  cp_test_batch_take (batch, "loss_mask", CP_TEST_TENSOR (CP_DTYPE_INT32, row6, 1, 1, 1, 1, 1, 1));
  cp_test_batch_take (batch, "padding_mask", CP_TEST_TENSOR (CP_DTYPE_BOOL, row6, 0, 0, 0, 0, 1, 1));
  context = prepare_ok (batch, mesh, NULL);

  CP_TEST_ASSERT_SHAPE (embeds, 1, 8, 4);
  for (gint64 i = 0; i < 32; i++)
    g_assert_cmpfloat (cp_tensor_get_value (embeds, i), ==, i < 24 ? 1.0 : 0.0);
  CP_TEST_ASSERT_VALUES (cp_batch_get (batch, "labels"), 1, 2, 3, 4, 5, 6, -100, -100);
  CP_TEST_ASSERT_VALUES (cp_batch_get (batch, "position_ids"), 0, 1, 2, 3, 4, 5, 0, 0);
  CP_TEST_ASSERT_VALUES (cp_batch_get (batch, "loss_mask"), 1, 1, 1, 1, 1, 1, 0, 0);
  CP_TEST_ASSERT_VALUES (cp_batch_get (batch, "padding_mask"), 0, 0, 0, 0, 1, 1, 1, 1);
  for (guint i = 0; i < cp_context_get_n_buffers (context); i++)
    g_assert_cmpint (cp_tensor_get_dim (cp_context_get_buffer (context, i), 1), ==, 8);
  /* The padding mask comes after the primary trio. */
  g_assert_cmpstr (cp_context_get_buffer_name (context, 4), ==, "padding_mask");
}

/* The reference pads every floating buffer with 0.0 whatever its key
 * (SEED-SEMANTICS 1.8): float labels get 0.0, not -100, and a float
 * padding mask 0.0, not 1.0. */
static void
float_pad_rank (CpMesh   *mesh,
                gpointer  user_data)
{
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;

  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 11, 12, 13, 14, 15, 16));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_FLOAT32, row6, 1, 2, 3, 4, 5, 6));
  cp_test_batch_take (batch, "padding_mask",
                      CP_TEST_TENSOR (CP_DTYPE_FLOAT64, row6, 0, 0, 0, 0, 1, 1));
  context = prepare_ok (batch, mesh, NULL);

  CP_TEST_ASSERT_VALUES (cp_batch_get (batch, "input_ids"), 11, 12, 13, 14, 15, 16, 0, 0);
  CP_TEST_ASSERT_VALUES (cp_batch_get (batch, "labels"), 1, 2, 3, 4, 5, 6, 0.0, 0.0);
  CP_TEST_ASSERT_VALUES (cp_batch_get (batch, "padding_mask"), 0, 0, 0, 0, 1, 1, 0.0, 0.0);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (batch, "labels")), ==, CP_DTYPE_FLOAT32);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (batch, "padding_mask")), ==, CP_DTYPE_FLOAT64);
}

/* Tensors over a GBytes are read-only, and prepare and the context never
 * write them: padding and sharding give the tensor objects new memory,
 * and exit puts the original back, its bytes as they were. */
static void
read_only_rank (CpMesh   *mesh,
                gpointer  user_data)
{
  static const gint64 ids[] = { 11, 12, 13, 14, 15, 16 };
  static const gint64 labels[] = { 1, 2, 3, 4, 5, 6 };
  g_autoptr(GBytes) ids_bytes = g_bytes_new_static (ids, sizeof ids);
  g_autoptr(GBytes) labels_bytes = g_bytes_new_static (labels, sizeof labels);
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;
  g_autoptr(GError) error = NULL;
  CpTensor *local;

  cp_test_batch_take (batch, "input_ids",
                      cp_tensor_new_from_bytes (CP_DTYPE_INT64, row6, 2, ids_bytes, &error));
  cp_test_batch_take (batch, "labels",
                      cp_tensor_new_from_bytes (CP_DTYPE_INT64, row6, 2, labels_bytes, &error));
  g_assert_no_error (error);
  context = prepare_ok (batch, mesh, NULL);
  local = cp_batch_get (batch, "input_ids");
  CP_TEST_ASSERT_VALUES (local, 11, 12, 13, 14, 15, 16, 0, 0);
  g_assert_false (cp_storage_get_read_only (cp_tensor_get_storage (local)));
  cp_test_enter_ok (context);
  if (cp_mesh_get_rank (mesh) == 0)
    CP_TEST_ASSERT_VALUES (local, 11, 12, 0, 0);
  else
    CP_TEST_ASSERT_VALUES (local, 13, 14, 15, 16);
  cp_test_exit_ok (context);
  for (guint i = 0; i < G_N_ELEMENTS (ids); i++)
    {
      g_assert_cmpint (((const gint64 *) g_bytes_get_data (ids_bytes, NULL))[i], ==, 11 + i);
      g_assert_cmpint (((const gint64 *) g_bytes_get_data (labels_bytes, NULL))[i], ==, 1 + i);
    }
}

/* test_extra_sequence_buffer_is_padded_and_registered: teacher logits
 * [1, 6, 5] on dim 1 pad to [1, 8, 5] with the original in front and
 * zeros behind. */
static void
extra_rank (CpMesh   *mesh,
            gpointer  user_data)
{
  const gint64 shape[] = { 1, 6, 5 };
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(CpBatchOptions) options = cp_batch_options_new ();
  g_autoptr(CpTensor) logits = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 7);
  g_autoptr(CpTensor) original = cp_tensor_copy (logits, NULL);
  g_autoptr(CpContext) context = NULL;
  g_autoptr(CpTensor) head = NULL;

  cp_batch_set (batch, "teacher_logits", logits);
  cp_batch_options_add_extra_buffer (options, "teacher_logits", 1);
  context = prepare_ok (batch, mesh, options);
  for (guint i = 0; i < 4; i++)
    g_assert_cmpint (cp_context_get_buffer_seq_dim (context, i), ==, 1);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "teacher_logits"), 1, 8, 5);
  head = cp_tensor_narrow (logits, 1, 0, 6, NULL);
  g_assert_true (cp_tensor_equal (head, original));
  for (gint64 i = 30; i < 40; i++)
    g_assert_cmpfloat (cp_tensor_get_value (logits, i), ==, 0.0);
}

/* Extra buffers along dimensions 1, 2 (not the last) and −1 (the fourth
 * of four), every element distinct (flat index + 1), on 2 and 4 ranks
 * with a length that needs padding: inside the context each rank holds,
 * element for element, the original at the head-tail positions computed
 * here, and zeros where those positions are padding; exit leaves them so
 * (extras are not restored). */
#define EXTRA_S 13

typedef struct
{
  const char *key;
  CpDType dtype;
  gint64 shape[4];
  guint n_dims;
  int seq_dim;           /* as given to prepare */
  guint dim;             /* normalized */
  gboolean in_options;   /* an options extra, else marked on the batch */
} ExtraSpec;

static const ExtraSpec extra_specs[] = {
  { "along_1", CP_DTYPE_FLOAT32, { 2, EXTRA_S, 3 }, 3, 1, 1, TRUE },
  { "along_2", CP_DTYPE_INT32, { 2, 3, EXTRA_S, 2 }, 4, 2, 2, FALSE },
  { "along_last", CP_DTYPE_INT64, { 3, 2, 2, EXTRA_S }, 4, -1, 3, TRUE },
  { "along_2_of_3", CP_DTYPE_BFLOAT16, { 2, 2, EXTRA_S }, 3, 2, 2, FALSE },
};

/* Position @j of rank @r's piece in the head-tail layout of @padded
 * positions over @c ranks: chunk r, then chunk 2·C−1−r. */
static gint64
head_tail_global (gint64 padded,
                  int    c,
                  int    r,
                  gint64 j)
{
  gint64 k = padded / (2 * c);

  return j < k ? r * k + j : (2 * (gint64) c - 1 - r) * k + (j - k);
}

static void
assert_extra_piece (CpTensor        *local,
                    const ExtraSpec *spec,
                    gint64           padded,
                    int              c,
                    int              r)
{
  gint64 outer = 1, inner = 1;
  gint64 length = padded / c;

  for (guint d = 0; d < spec->n_dims; d++)
    {
      gint64 size = d == spec->dim ? length : spec->shape[d];

      g_assert_cmpint (cp_tensor_get_dim (local, (int) d), ==, size);
      if (d < spec->dim)
        outer *= size;
      else if (d > spec->dim)
        inner *= size;
    }
  for (gint64 o = 0; o < outer; o++)
    for (gint64 j = 0; j < length; j++)
      for (gint64 i = 0; i < inner; i++)
        {
          gint64 p = head_tail_global (padded, c, r, j);
          double want = p < EXTRA_S ? (double) ((o * EXTRA_S + p) * inner + i + 1) : 0.0;

          g_assert_cmpfloat (cp_tensor_get_value (local, (o * length + j) * inner + i), ==, want);
        }
}

static void
extra_contents_rank (CpMesh   *mesh,
                     gpointer  user_data)
{
  const gint64 padded = 16; /* 13 rounded up to a multiple of 2·C, C = 2 or 4 */
  int c = cp_mesh_get_world_size (mesh);
  int r = cp_mesh_get_rank (mesh);
  const gint64 ids_shape[] = { 2, EXTRA_S };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpBatchOptions) options = cp_batch_options_new ();
  g_autoptr(CpContext) context = NULL;
  CpTensor *extras[G_N_ELEMENTS (extra_specs)];

  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, ids_shape, 2, 1));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, ids_shape, 2, 2));
  for (guint e = 0; e < G_N_ELEMENTS (extra_specs); e++)
    {
      const ExtraSpec *spec = &extra_specs[e];

      extras[e] = cp_tensor_new (spec->dtype, spec->shape, spec->n_dims, NULL);
      for (gint64 i = 0; i < cp_tensor_get_numel (extras[e]); i++)
        cp_tensor_set_value (extras[e], i, (double) (i + 1));
      cp_test_batch_take (batch, spec->key, extras[e]);
      if (spec->in_options)
        cp_batch_options_add_extra_buffer (options, spec->key, spec->seq_dim);
      else
        cp_batch_set_seq_dim (batch, spec->key, spec->seq_dim);
    }
  context = prepare_ok (batch, mesh, options);
  cp_test_enter_ok (context);
  for (guint e = 0; e < G_N_ELEMENTS (extra_specs); e++)
    assert_extra_piece (extras[e], &extra_specs[e], padded, c, r);
  cp_test_exit_ok (context);
  for (guint e = 0; e < G_N_ELEMENTS (extra_specs); e++)
    assert_extra_piece (extras[e], &extra_specs[e], padded, c, r);
}

static void
test_extra_contents (void)
{
  cp_test_run_group ("cp", 2, extra_contents_rank, NULL);
  cp_test_run_group ("cp", 4, extra_contents_rank, NULL);
}

/* test_padding_no_op_when_seq_already_aligned and
 * _pad_tensor_seq_dim_(t, 1, 0) is t: an aligned batch keeps its objects
 * and their memory. */
static void
aligned_rank (CpMesh   *mesh,
              gpointer  user_data)
{
  const gint64 shape[] = { 1, 8, 16 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) embeds = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 0);
  g_autoptr(CpTensor) labels = cp_test_tensor_pattern (CP_DTYPE_INT64, row8, 2, 0);
  CpStorage *embeds_storage = cp_tensor_get_storage (embeds);
  CpStorage *labels_storage = cp_tensor_get_storage (labels);
  g_autoptr(CpContext) context = NULL;

  cp_batch_set (batch, "inputs_embeds", embeds);
  cp_batch_set (batch, "labels", labels);
  context = prepare_ok (batch, mesh, NULL);
  g_assert_true (cp_context_get_buffer (context, 0) == embeds);
  g_assert_true (cp_context_get_buffer (context, 1) == labels);
  g_assert_true (cp_tensor_get_storage (embeds) == embeds_storage);
  g_assert_true (cp_tensor_get_storage (labels) == labels_storage);
}

/* test_make_cp_batch_and_ctx_pops_attention_mask_when_cp_enabled. */
static void
attention_mask_rank (CpMesh   *mesh,
                     gpointer  user_data)
{
  const gint64 shape[] = { 1, 3 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;

  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 1, 2, 3));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 1, 2, 3));
  cp_test_batch_take (batch, "attention_mask", CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 1, 1, 1));
  context = prepare_ok (batch, mesh, NULL);
  g_assert_false (cp_batch_contains (batch, "attention_mask"));
}

/* The reference leaves the caller's loss_mask unpadded when padding
 * happens; here the caller's object is padded, then sharded. */
static void
loss_mask_rank (CpMesh   *mesh,
                gpointer  user_data)
{
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(CpBatchOptions) options = NULL;
  g_autoptr(CpTensor) loss_mask = CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 1, 0, 1, 1, 1);
  g_autoptr(CpContext) context = NULL;

  options = g_object_new (CP_TYPE_BATCH_OPTIONS, "loss-mask", loss_mask, NULL);
  context = prepare_ok (batch, mesh, options);
  g_assert_false (cp_batch_contains (batch, "loss_mask"));
  CP_TEST_ASSERT_VALUES (loss_mask, 1, 1, 0, 1, 1, 1, 0, 0);
  cp_test_enter_ok (context);
  if (cp_mesh_get_rank (mesh) == 0)
    CP_TEST_ASSERT_VALUES (loss_mask, 1, 1, 0, 0);
  else
    CP_TEST_ASSERT_VALUES (loss_mask, 0, 1, 1, 1);
  cp_test_exit_ok (context);
  CP_TEST_ASSERT_SHAPE (loss_mask, 1, 4);
}

/* E4, test_inputs_embeds_with_grad_is_sharded_out_of_place and the HSDP
 * cases: a gradient-bearing primary is sharded out of place with the cp
 * coordinate (not the global rank); shard_backward scatters its gradient. */
static void
grad_rank (CpMesh   *mesh,
           gpointer  user_data)
{
  const gint64 shape[] = { 1, 8, 1 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) embeds = cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 0);
  g_autoptr(CpContext) context = NULL;
  g_autoptr(CpTensor) ones = NULL;
  g_autoptr(CpTensor) grad = NULL;
  g_autoptr(GError) error = NULL;
  const gint64 local_shape[] = { 1, 4, 1 };
  CpTensor *local;
  int cp_rank = cp_mesh_get_coordinate (mesh, "cp");

  for (gint64 i = 0; i < 8; i++)
    cp_tensor_set_value (embeds, i, (double) i);
  cp_tensor_set_requires_grad (embeds, TRUE);
  cp_batch_set (batch, "inputs_embeds", embeds);
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, row8, 2, 0));
  context = prepare_ok (batch, mesh, NULL);

  local = cp_batch_get (batch, "inputs_embeds");
  g_assert_true (local != embeds);
  g_assert_true (cp_tensor_get_requires_grad (local));
  CP_TEST_ASSERT_VALUES (embeds, 0, 1, 2, 3, 4, 5, 6, 7);
  if (cp_rank == 0)
    CP_TEST_ASSERT_VALUES (local, 0, 1, 6, 7);
  else
    CP_TEST_ASSERT_VALUES (local, 2, 3, 4, 5);
  g_assert_cmpuint (cp_context_get_n_buffers (context), ==, 2);
  for (guint i = 0; i < 2; i++)
    g_assert_false (cp_tensor_get_requires_grad (cp_context_get_buffer (context, i)));
  g_assert_cmpstr (cp_context_get_buffer_name (context, 0), ==, "labels");

  ones = cp_tensor_new_full (CP_DTYPE_FLOAT32, local_shape, 3, 1.0, &error);
  grad = cp_layout_shard_backward (cp_context_get_layout (context), ones, 1, cp_rank, &error);
  g_assert_no_error (error);
  if (cp_rank == 0)
    CP_TEST_ASSERT_VALUES (grad, 1, 1, 0, 0, 0, 0, 1, 1);
  else
    CP_TEST_ASSERT_VALUES (grad, 0, 0, 1, 1, 1, 1, 0, 0);
  cp_test_enter_ok (context);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (batch, "labels"), 1, 4);
  CP_TEST_ASSERT_VALUES (embeds, 0, 1, 2, 3, 4, 5, 6, 7);
  cp_test_exit_ok (context);
}

static void
test_grad_primary (void)
{
  const char *names[] = { "dp", "cp", NULL };
  const int sizes[] = { 4, 2 };

  cp_test_run_mesh (names, sizes, 2, grad_rank, NULL);
}

/* test_inputs_embeds_with_grad_and_cp_padding_preserves_global_token_mean:
 * C = 128, S = 56 padded to 256, 72 ranks without a valid label.  The
 * per-rank valid-token losses sum to the full loss and the scattered,
 * ×C-scaled gradients average to the full gradient. */
#define MEAN_C 128
#define MEAN_S 56
#define MEAN_H 3

typedef struct
{
  double loss[MEAN_C];
  double grad[MEAN_C][MEAN_S * MEAN_H];
} MeanCase;

static double
mean_weight (gint64 token,
             gint64 h)
{
  return (double) (token * MEAN_H + h) / 13.0;
}

static void
mean_rank (CpMesh   *mesh,
           gpointer  user_data)
{
  MeanCase *results = user_data;
  const gint64 shape[] = { 1, MEAN_S, MEAN_H };
  const gint64 labels_shape[] = { 1, MEAN_S };
  int rank = cp_mesh_get_rank (mesh);
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpTensor) embeds = cp_test_tensor_pattern (CP_DTYPE_FLOAT64, shape, 3, 0);
  g_autoptr(CpTensor) labels = cp_test_tensor_pattern (CP_DTYPE_INT64, labels_shape, 2, 0);
  g_autoptr(CpContext) context = NULL;
  g_autoptr(CpTensor) local_grad = NULL;
  g_autoptr(CpTensor) full_grad = NULL;
  g_autoptr(GError) error = NULL;
  const gint64 local_shape[] = { 1, 2, MEAN_H };
  CpTensor *local;

  for (gint64 i = 0; i < MEAN_S; i++)
    {
      cp_tensor_set_value (labels, i, (double) i);
      for (gint64 h = 0; h < MEAN_H; h++)
        cp_tensor_set_value (embeds, i * MEAN_H + h, mean_weight (i, h));
    }
  cp_tensor_set_requires_grad (embeds, TRUE);
  cp_batch_set (batch, "inputs_embeds", embeds);
  cp_batch_set (batch, "labels", labels);
  context = prepare_ok (batch, mesh, NULL);
  CP_TEST_ASSERT_SHAPE (cp_context_get_buffer (context, 0), 1, 256);
  for (gint64 i = MEAN_S; i < 256; i++)
    g_assert_cmpfloat (cp_tensor_get_value (labels, i), ==, -100);
  local = cp_batch_get (batch, "inputs_embeds");
  CP_TEST_ASSERT_SHAPE (local, 1, 2, MEAN_H);
  cp_test_enter_ok (context);
  CP_TEST_ASSERT_SHAPE (labels, 1, 2);

  local_grad = cp_tensor_new (CP_DTYPE_FLOAT64, local_shape, 3, &error);
  for (gint64 t = 0; t < 2; t++)
    {
      double sum = 0.75;

      if (cp_tensor_get_value (labels, t) == -100)
        continue;
      for (gint64 h = 0; h < MEAN_H; h++)
        sum += cp_tensor_get_value (local, t * MEAN_H + h);
      results->loss[rank] += sum * sum / MEAN_S;
      for (gint64 h = 0; h < MEAN_H; h++)
        cp_tensor_set_value (local_grad, t * MEAN_H + h, MEAN_C * 2.0 * sum / MEAN_S);
    }
  full_grad = cp_layout_shard_backward (cp_context_get_layout (context), local_grad, 1, rank, &error);
  g_assert_no_error (error);
  for (gint64 i = 0; i < MEAN_S * MEAN_H; i++)
    results->grad[rank][i] = cp_tensor_get_value (full_grad, i);
  cp_test_exit_ok (context);
}

static void
test_global_token_mean (void)
{
  GList *meshes = cp_test_local_group ("cp", MEAN_C);
  g_autofree MeanCase *results = g_new0 (MeanCase, 1);
  double loss = 0.0, reference = 0.0;

  cp_test_run_ranks (meshes, mean_rank, results);
  cp_test_free_group (meshes);
  for (int r = 0; r < MEAN_C; r++)
    loss += results->loss[r];
  for (gint64 i = 0; i < MEAN_S; i++)
    {
      double sum = 0.75, mean = 0.0;

      for (gint64 h = 0; h < MEAN_H; h++)
        sum += mean_weight (i, h);
      reference += sum * sum / MEAN_S;
      for (int r = 0; r < MEAN_C; r++)
        mean += results->grad[r][i * MEAN_H] / MEAN_C;
      g_assert_cmpfloat_with_epsilon (mean, 2.0 * sum / MEAN_S, 1e-9);
    }
  g_assert_cmpfloat_with_epsilon (loss, reference, 1e-9);
}

/* E5: logits unsharded over the context give positions 0..7; narrowing
 * drops the CP padding. */
static void
unshard_rank (CpMesh   *mesh,
              gpointer  user_data)
{
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(CpContext) context = prepare_ok (batch, mesh, NULL);
  const gint64 shape[] = { 1, 4, 2 };
  g_autoptr(CpTensor) logits = cp_tensor_new (CP_DTYPE_FLOAT32, shape, 3, NULL);
  g_autoptr(CpTensor) full = NULL;
  g_autoptr(CpTensor) trimmed = NULL;
  g_autoptr(GError) error = NULL;
  CpTensor *positions = cp_batch_get (batch, "position_ids");

  cp_test_enter_ok (context);
  /* Each local position p carries logits (p, 10 p) — the labels say which
   * global position every local one is. */
  for (gint64 t = 0; t < 4; t++)
    {
      double p = cp_tensor_get_value (cp_batch_get (batch, "labels"), t);

      cp_tensor_set_value (logits, 2 * t, p);
      cp_tensor_set_value (logits, 2 * t + 1, 10 * p);
    }
  g_assert_nonnull (positions);
  full = cp_context_unshard (context, logits, 1, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_SHAPE (full, 1, 8, 2);
  trimmed = cp_tensor_narrow (full, 1, 0, 6, &error);
  CP_TEST_ASSERT_VALUES (trimmed, 1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60);
  CP_TEST_ASSERT_VALUES (full, 1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60, -100, -1000, -100, -1000);
  cp_test_exit_ok (context);
}

/* The property: for random B, S, C and buffer sets, the padded buffers
 * unsharded after enter equal the padded originals bit for bit, and exit
 * restores the position ids exactly. */
typedef struct
{
  guint32 seed;
} PropertyCase;

static const CpDType property_dtypes[] = {
  CP_DTYPE_BOOL, CP_DTYPE_UINT8, CP_DTYPE_INT32, CP_DTYPE_INT64,
  CP_DTYPE_FLOAT16, CP_DTYPE_BFLOAT16, CP_DTYPE_FLOAT32, CP_DTYPE_FLOAT64,
};

static CpTensor *
random_tensor (GRand        *rand,
               const gint64 *shape,
               guint         n_dims)
{
  CpDType dtype = property_dtypes[g_rand_int_range (rand, 0, G_N_ELEMENTS (property_dtypes))];

  return cp_test_tensor_pattern (dtype, shape, n_dims, g_rand_int_range (rand, 0, 1000));
}

static CpBatch *
random_batch (GRand *rand)
{
  gint64 b = g_rand_int_range (rand, 1, 4);
  gint64 s = g_rand_int_range (rand, 1, 41);
  gint64 h = g_rand_int_range (rand, 1, 5);
  const gint64 ids[] = { b, s };
  const gint64 embeds[] = { b, s, h };
  const gint64 single[] = { 1, s };
  const gint64 mrope[] = { 3, b, s };
  const gint64 tail[] = { b, h, s };
  CpBatch *batch = cp_batch_new ();
  int positions = g_rand_int_range (rand, 0, 4);

  if (g_rand_boolean (rand))
    cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, ids, 2, 1));
  else
    cp_test_batch_take (batch, "inputs_embeds", random_tensor (rand, embeds, 3));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, ids, 2, 2));
  if (positions == 1)
    cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, ids, 2, 3));
  else if (positions == 2)
    cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, single, 2, 3));
  else if (positions == 3)
    cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, mrope, 3, 3));
  if (g_rand_boolean (rand))
    cp_test_batch_take (batch, "loss_mask", random_tensor (rand, ids, 2));
  if (g_rand_boolean (rand))
    cp_test_batch_take (batch, "padding_mask", cp_test_tensor_pattern (CP_DTYPE_BOOL, ids, 2, 4));
  if (g_rand_boolean (rand))
    {
      cp_test_batch_take (batch, "teacher_logits", random_tensor (rand, embeds, 3));
      cp_batch_set_seq_dim (batch, "teacher_logits", 1);
    }
  if (g_rand_boolean (rand))
    {
      cp_test_batch_take (batch, "hidden_by_seq", random_tensor (rand, tail, 3));
      cp_batch_set_seq_dim (batch, "hidden_by_seq", -1);
    }
  return batch;
}

static void
property_rank (CpMesh   *mesh,
               gpointer  user_data)
{
  PropertyCase *c = user_data;
  g_autoptr(GRand) rand = g_rand_new_with_seed (c->seed);
  g_autoptr(CpBatch) batch = random_batch (rand);
  g_autoptr(CpContext) context = prepare_ok (batch, mesh, NULL);
  g_autoptr(GPtrArray) padded = g_ptr_array_new_with_free_func (g_object_unref);
  guint n = cp_context_get_n_buffers (context);
  int cp_size = cp_mesh_get_world_size (mesh);

  for (guint i = 0; i < n; i++)
    g_ptr_array_add (padded, cp_tensor_copy (cp_context_get_buffer (context, i), NULL));
  cp_test_enter_ok (context);
  for (guint i = 0; i < n; i++)
    {
      CpTensor *buffer = cp_context_get_buffer (context, i);
      int dim = cp_context_get_buffer_seq_dim (context, i);
      g_autoptr(GError) error = NULL;
      g_autoptr(CpTensor) full = cp_context_unshard (context, buffer, dim, &error);

      g_assert_no_error (error);
      g_assert_cmpint (cp_tensor_get_dim (buffer, dim) * cp_size, ==,
                       cp_tensor_get_dim (padded->pdata[i], dim));
      g_assert_true (cp_tensor_equal (full, padded->pdata[i]));
    }
  cp_test_exit_ok (context);
  for (guint i = 0; i < n; i++)
    if (cp_context_get_buffer_restores (context, i))
      g_assert_true (cp_tensor_equal (cp_context_get_buffer (context, i), padded->pdata[i]));
}

static void
test_property (void)
{
  const int sizes[] = { 1, 2, 3, 4, 8 };

  for (guint32 seed = 1; seed <= 40; seed++)
    {
      PropertyCase c = { seed };

      cp_test_run_group ("cp", sizes[seed % G_N_ELEMENTS (sizes)], property_rank, &c);
    }
}

/* Every bad input: a specific error naming the key and values, and a
 * batch exactly as it was. */
typedef struct
{
  const char *name;
  void (*spoil) (CpBatch *batch, CpBatchOptions *options);
  GQuark domain;
  int code;
  const char *needle;
  const char *what;      /* for the reliability table */
} ErrorCase;

static void
drop_labels (CpBatch *batch, CpBatchOptions *options)
{
  cp_batch_remove (batch, "labels");
}

static void
add_embeds (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 1, 6, 2 };

  cp_test_batch_take (batch, "inputs_embeds", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 0));
}

static void
drop_primary (CpBatch *batch, CpBatchOptions *options)
{
  cp_batch_remove (batch, "input_ids");
}

static void
bad_extra_axis (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 1, 6, 5 };

  cp_test_batch_take (batch, "teacher_logits", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 0));
  cp_batch_options_add_extra_buffer (options, "teacher_logits", 3);
}

static void
missing_extra (CpBatch *batch, CpBatchOptions *options)
{
  cp_batch_options_add_extra_buffer (options, "teacher_logits", 1);
}

static void
short_labels (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 1, 5 };

  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 1, 2, 3, 4, 5));
}

static void
short_extra (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 1, 7, 5 };

  cp_test_batch_take (batch, "teacher_logits", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 0));
  cp_batch_set_seq_dim (batch, "teacher_logits", 1);
}

static void
labels_of_other_rows (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 2, 6 };

  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 0));
}

static void
loss_mask_of_other_rows (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 2, 6 };

  cp_test_batch_take (batch, "loss_mask", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 2, 0));
}

static void
mrope_of_other_rows (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 3, 2, 6 };

  cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 3, 0));
}

static void
unknown_rotate (CpBatch *batch, CpBatchOptions *options)
{
  cp_batch_options_set_rotate_method_name (options, "addtoall");
}

static void
out_of_range_rotate (CpBatch *batch, CpBatchOptions *options)
{
  cp_batch_options_set_rotate_method (options, (CpRotateMethod) 7);
}

static void
shared_object (CpBatch *batch, CpBatchOptions *options)
{
  cp_batch_set (batch, "padding_mask", cp_batch_get (batch, "labels"));
}

static void
two_loss_masks (CpBatch *batch, CpBatchOptions *options)
{
  g_autoptr(CpTensor) mask = CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 1, 1, 1, 1, 1);

  cp_test_batch_take (batch, "loss_mask", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 1, 1, 1, 1, 1));
  cp_batch_options_set_loss_mask (options, mask);
}

static void
extra_is_labels (CpBatch *batch, CpBatchOptions *options)
{
  cp_batch_set_seq_dim (batch, "labels", 1);
}

static void
bad_positions (CpBatch *batch, CpBatchOptions *options)
{
  const gint64 shape[] = { 6 };

  cp_test_batch_take (batch, "position_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, shape, 0, 1, 2, 3, 4, 5));
}

static void
float_input_ids (CpBatch *batch, CpBatchOptions *options)
{
  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, row6, 2, 0));
}

static void
bool_input_ids (CpBatch *batch, CpBatchOptions *options)
{
  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_BOOL, row6, 1, 0, 1, 0, 1, 0));
}

/* Rank 0 holds 6 tokens and rank 1 holds 8: both pad to 8, the same
 * layout, yet they are not the same batch.  Enter fails on both and
 * shards nothing. */
static void
unpadded_disagree_rank (CpMesh   *mesh,
                        gpointer  user_data)
{
  gint64 shape[] = { 1, cp_mesh_get_rank (mesh) == 0 ? 6 : 8 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpContext) context = NULL;
  g_autoptr(GError) error = NULL;
  CpTensor *ids;

  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 1));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 2, 2));
  context = cp_batch_prepare (batch, mesh, NULL, &error);
  g_assert_no_error (error);
  ids = cp_batch_get (batch, "input_ids");
  g_assert_false (cp_context_enter (context, &error));
  CP_TEST_ASSERT_CASE (error, CP_MESH_ERROR, CP_MESH_ERROR_INVALID_TOPOLOGY, "CpContext",
                       "cp_context_enter where ranks' batches differ in length but pad to the same "
                       "length (every rank fails)");
  g_assert_nonnull (strstr (error->message, "sequence length before padding"));
  CP_TEST_ASSERT_SHAPE (ids, 1, 8);
}

static const ErrorCase error_cases[] = {
  { "missing-labels", drop_labels, 0, CP_BATCH_ERROR_MISSING_KEY, "no 'labels'",
    "cp_batch_prepare of a batch without labels" },
  { "both-primaries", add_embeds, 0, CP_BATCH_ERROR_CONFLICTING_KEYS, "both 'input_ids' and 'inputs_embeds'",
    "cp_batch_prepare of a batch with both input_ids and inputs_embeds" },
  { "no-primary", drop_primary, 0, CP_BATCH_ERROR_MISSING_KEY, "neither 'input_ids' nor 'inputs_embeds'",
    "cp_batch_prepare of a batch with neither input_ids nor inputs_embeds" },
  { "wrong-axis", bad_extra_axis, 1, CP_TENSOR_ERROR_SHAPE, "dimension 3 does not exist",
    "cp_batch_prepare with an extra buffer along a dimension it does not have" },
  { "missing-extra", missing_extra, 0, CP_BATCH_ERROR_MISSING_KEY, "'teacher_logits' is missing",
    "cp_batch_prepare naming an extra buffer the batch lacks" },
  { "length-mismatch", short_labels, 1, CP_TENSOR_ERROR_SHAPE, "'labels' (int64[1, 5] on host) has length 5",
    "cp_batch_prepare with labels shorter than input_ids" },
  { "extra-length-mismatch", short_extra, 1, CP_TENSOR_ERROR_SHAPE, "'teacher_logits' (float32[1, 7, 5] on host) has length 7 along its sequence dimension 1, but 'input_ids' has sequence length 6",
    "cp_batch_prepare with an extra buffer of another sequence length" },
  { "unknown-rotate-name", unknown_rotate, 0, CP_BATCH_ERROR_INVALID_OPTION, "\"addtoall\"",
    "cp_batch_prepare with an unknown rotate method name" },
  { "out-of-range-rotate", out_of_range_rotate, 0, CP_BATCH_ERROR_INVALID_OPTION, "rotate method 7",
    "cp_batch_prepare with a rotate method outside the enum" },
  { "same-object-twice", shared_object, 0, CP_BATCH_ERROR_CONFLICTING_KEYS, "'labels' and 'padding_mask' are the same tensor",
    "cp_batch_prepare with one tensor under two keys" },
  { "two-loss-masks", two_loss_masks, 0, CP_BATCH_ERROR_CONFLICTING_KEYS, "loss mask",
    "cp_batch_prepare with a loss mask in the options and another in the batch" },
  { "standard-key-as-extra", extra_is_labels, 0, CP_BATCH_ERROR_CONFLICTING_KEYS, "'labels' is already registered as a standard buffer",
    "cp_batch_prepare with labels also named as an extra buffer" },
  { "rows-mismatch-labels", labels_of_other_rows, 1, CP_TENSOR_ERROR_SHAPE,
    "'labels' is int64[2, 6] on host; it must be [B, S] with B = 1 like 'input_ids'",
    "cp_batch_prepare with labels of another batch size than input_ids" },
  { "rows-mismatch-loss-mask", loss_mask_of_other_rows, 1, CP_TENSOR_ERROR_SHAPE,
    "'loss_mask' is float32[2, 6] on host; it must be [B, S] with B = 1 like 'input_ids'",
    "cp_batch_prepare with a loss_mask of another batch size than input_ids" },
  { "rows-mismatch-mrope", mrope_of_other_rows, 1, CP_TENSOR_ERROR_SHAPE,
    "'position_ids' is int64[3, 2, 6] on host; it must be [3, B, S] with B = 1 like 'input_ids'",
    "cp_batch_prepare with mRoPE position_ids of another batch size than input_ids" },
  { "bad-position-ids", bad_positions, 1, CP_TENSOR_ERROR_SHAPE, "'position_ids' is int64[6] on host",
    "cp_batch_prepare with 1-d position_ids" },
  { "float-input-ids", float_input_ids, 0, CP_BATCH_ERROR_DTYPE,
    "prepare: 'input_ids' is float32[1, 6] on host, but token ids are integers (int64, int32 or "
    "uint8), not float32; embeddings belong under 'inputs_embeds'",
    "cp_batch_prepare with float32 input_ids" },
  { "bool-input-ids", bool_input_ids, 0, CP_BATCH_ERROR_DTYPE,
    "'input_ids' is bool[1, 6] on host, but token ids are integers",
    "cp_batch_prepare with bool input_ids" },
};

static void
error_rank (CpMesh   *mesh,
            gpointer  user_data)
{
  const ErrorCase *c = user_data;
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(CpBatchOptions) options = cp_batch_options_new ();
  g_autoptr(GPtrArray) snapshots = NULL;
  g_autoptr(GError) error = NULL;
  GQuark domain = c->domain == 0 ? CP_BATCH_ERROR : CP_TENSOR_ERROR;

  cp_test_batch_take (batch, "attention_mask", CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 1, 1, 1, 1, 1));
  c->spoil (batch, options);
  snapshots = cp_test_snapshot_batch (batch);
  g_assert_null (cp_batch_prepare (batch, mesh, options, &error));
  CP_TEST_ASSERT_CASE (error, domain, c->code, "CpBatch", c->what);
  cp_test_assert_message (error, c->needle);
  cp_test_assert_batch_unchanged (batch, snapshots);
}

static void
test_errors (gconstpointer data)
{
  cp_test_run_group ("cp", 2, error_rank, (gpointer) data);
}

/* Token ids that are not integers are refused without context
 * parallelism too (one rank, or no mesh): a program must not start
 * failing only when it gets a second rank. */
static void
test_float_input_ids_one_rank (void)
{
  static const char * const names[] = { "cp" };
  static const int sizes[] = { 1 };
  GList *meshes = cp_mesh_new_local_group (names, sizes, 1, NULL);
  CpMesh *choices[] = { meshes->data, NULL };

  for (guint i = 0; i < G_N_ELEMENTS (choices); i++)
    {
      g_autoptr(CpBatch) batch = e2_batch ();
      g_autoptr(CpBatchOptions) options = cp_batch_options_new ();
      g_autoptr(CpContext) context = NULL;
      g_autoptr(GError) error = NULL;

      float_input_ids (batch, options);
      context = cp_batch_prepare (batch, choices[i], options, &error);
      g_assert_null (context);
      CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_DTYPE, "CpBatch",
                           choices[i] != NULL ? "cp_batch_prepare with float32 input_ids on one rank"
                                              : "cp_batch_prepare with float32 input_ids and no mesh");
      cp_test_assert_message (error, "'input_ids' is float32[1, 6] on host, but token ids are integers");
    }
  g_list_free_full (meshes, g_object_unref);
}

/* One tensor in the batches of all ranks, or in the one options object
 * they all pass, cannot be padded in place by every rank: every rank
 * fails with CP_TENSOR_ERROR_IN_USE naming the key, and no batch and no
 * tensor changes.  Which rank claims the tensor first varies from run to
 * run; the verdict must not, so each case runs many times on 2 and 4
 * ranks. */
typedef enum
{
  SHARE_LABELS,
  SHARE_OPTIONS_LOSS_MASK,
  SHARE_EXTRA,
} Share;

typedef struct
{
  Share share;
  const char *needle;
  const char *what;
  CpTensor *shared;        /* [1, 6], made for each run */
  CpBatchOptions *options; /* one for all ranks */
} ShareCase;

static const ShareCase share_cases[] = {
  { SHARE_LABELS, "prepare: 'labels' is being changed in place by another batch or context",
    "cp_batch_prepare on every rank with one labels tensor in every rank's batch (every rank fails)" },
  { SHARE_OPTIONS_LOSS_MASK, "prepare: 'loss_mask' is being changed in place",
    "cp_batch_prepare on every rank with one options object carrying a loss mask (every rank fails)" },
  { SHARE_EXTRA, "prepare: 'teacher' is being changed in place",
    "cp_batch_prepare on every rank with one extra buffer in every rank's batch (every rank fails)" },
};

static void
shared_rank (CpMesh   *mesh,
             gpointer  user_data)
{
  const ShareCase *c = user_data;
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(GPtrArray) snapshots = NULL;
  g_autoptr(GError) error = NULL;

  if (c->share == SHARE_LABELS)
    cp_batch_set (batch, "labels", c->shared);
  else if (c->share == SHARE_EXTRA)
    {
      cp_batch_set (batch, "teacher", c->shared);
      cp_batch_set_seq_dim (batch, "teacher", 1);
    }
  snapshots = cp_test_snapshot_batch (batch);
  g_assert_null (cp_batch_prepare (batch, mesh, c->options, &error));
  CP_TEST_ASSERT_CASE (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_IN_USE, "CpBatch", c->what);
  cp_test_assert_message (error, c->needle);
  cp_test_assert_batch_unchanged (batch, snapshots);
}

static void
test_shared_tensor (gconstpointer data)
{
  const int sizes[] = { 2, 4 };

  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    for (int run = 0; run < 25; run++)
      {
        ShareCase c = *(const ShareCase *) data;
        g_autoptr(CpTensor) shared = CP_TEST_TENSOR (CP_DTYPE_INT64, row6, 1, 1, 0, 1, 1, 0);
        g_autoptr(CpBatchOptions) options = cp_batch_options_new ();
        CpStorage *storage = cp_tensor_get_storage (shared);

        c.shared = shared;
        c.options = options;
        if (c.share == SHARE_OPTIONS_LOSS_MASK)
          g_object_set (options, "loss-mask", shared, NULL);
        cp_test_run_group ("cp", sizes[i], shared_rank, &c);
        g_assert_true (cp_tensor_get_storage (shared) == storage);
        CP_TEST_ASSERT_VALUES (shared, 1, 1, 0, 1, 1, 0);
      }
}

/* A rank whose prepare fails makes every rank's prepare fail with its
 * error, and no rank's batch changes: rank 1's batch lacks labels. */
static void
one_rank_fails_rank (CpMesh   *mesh,
                     gpointer  user_data)
{
  g_autoptr(CpBatch) batch = e2_batch ();
  g_autoptr(GPtrArray) snapshots = NULL;
  g_autoptr(GError) error = NULL;

  if (cp_mesh_get_rank (mesh) == 1)
    cp_batch_remove (batch, "labels");
  snapshots = cp_test_snapshot_batch (batch);
  g_assert_null (cp_batch_prepare (batch, mesh, NULL, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_MISSING_KEY, "CpBatch",
                       "cp_batch_prepare where one rank's batch has no labels (every rank fails)");
  g_assert_nonnull (strstr (error->message, "communicator rank 1: prepare: the batch has no 'labels'"));
  cp_test_assert_batch_unchanged (batch, snapshots);
}

/* Runs the rank function given as test data on a group of two ranks. */
static void
test_on_two_ranks (gconstpointer rank_func)
{
  cp_test_run_group ("cp", 2, (CpTestRankFunc) rank_func, NULL);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Batch/container/basic", test_container);
  g_test_add_func ("/Cp/Batch/prepare/no-mesh", test_no_mesh);
  g_test_add_func ("/Cp/Batch/prepare/cp-size-one", test_cp_size_one);
  g_test_add_func ("/Cp/Batch/prepare/mesh-without-cp", test_mesh_without_cp);
  g_test_add_func ("/Cp/Batch/prepare/example-e1", test_example_e1);
  g_test_add_data_func ("/Cp/Batch/prepare/example-e2", e2_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/no-rows/input-ids", GINT_TO_POINTER (FALSE), test_empty_batch);
  g_test_add_data_func ("/Cp/Batch/prepare/no-rows/inputs-embeds", GINT_TO_POINTER (TRUE), test_empty_batch);
  g_test_add_data_func ("/Cp/Batch/prepare/mrope-e3", mrope_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/position-ids", positions_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/existing-position-ids", existing_positions_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/registration-order", order_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/pad-values", pad_values_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/extra-buffers", extra_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/float-pad-values", float_pad_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/read-only-buffers", read_only_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Batch/enter/extra-buffer-contents", test_extra_contents);
  g_test_add_data_func ("/Cp/Batch/prepare/aligned-identity", aligned_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/attention-mask", attention_mask_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/prepare/loss-mask-padded", loss_mask_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Batch/prepare/grad-primary-e4", test_grad_primary);
  g_test_add_func ("/Cp/Batch/prepare/global-token-mean", test_global_token_mean);
  g_test_add_data_func ("/Cp/Batch/prepare/unshard-e5", unshard_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Batch/prepare/property", test_property);
  g_test_add_data_func ("/Cp/Batch/enter/unpadded-lengths-disagree", unpadded_disagree_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Batch/errors/one-rank", one_rank_fails_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Batch/errors/float-input-ids/one-rank", test_float_input_ids_one_rank);
  g_test_add_data_func ("/Cp/Batch/shared/labels", &share_cases[0], test_shared_tensor);
  g_test_add_data_func ("/Cp/Batch/shared/options-loss-mask", &share_cases[1], test_shared_tensor);
  g_test_add_data_func ("/Cp/Batch/shared/extra-buffer", &share_cases[2], test_shared_tensor);
  for (guint i = 0; i < G_N_ELEMENTS (error_cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/Cp/Batch/errors/%s", error_cases[i].name);

      g_test_add_data_func (path, &error_cases[i], test_errors);
    }

  return g_test_run ();
}
