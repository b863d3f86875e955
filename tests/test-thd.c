/* test-thd.c: cp_batch_to_thd, the native make_cp_batch_for_te
 *
 * The cases of NeMo Automodel's test_thd_utils and the TE cases of
 * test_cp_utils, the worked examples E6–E8, and a property over random
 * packed documents on 1 to 8 in-process ranks.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <pthread.h>
#include <string.h>

#include "cp-test-util.h"

#define SENTINEL (-1000)

#define ASSERT_SCALAR(tensor, value)                                         \
  G_STMT_START {                                                            \
    g_assert_cmpuint (cp_tensor_get_n_dims (tensor), ==, 0);                \
    g_assert_cmpfloat (cp_tensor_get_value ((tensor), 0), ==, (value));     \
  } G_STMT_END

/* A [rows, cols] tensor of @dtype from row-major values. */
static CpTensor *
matrix (CpDType       dtype,
        gint64        rows,
        gint64        cols,
        const double *values)
{
  const gint64 shape[] = { rows, cols };

  return cp_test_tensor_new_values (dtype, shape, 2, values);
}

#define MATRIX(dtype, rows, cols, ...) \
  matrix ((dtype), (rows), (cols), (const double[]) { __VA_ARGS__ })

/* ids with the given values, labels ids + 1, positions 0.. per row. */
static CpBatch *
packed_batch (gint64        rows,
              gint64        cols,
              const double *ids,
              gint64        n_docs,
              const double *seq_lens,
              const double *seq_lens_padded)
{
  CpBatch *batch = cp_batch_new ();
  CpTensor *labels = matrix (CP_DTYPE_INT64, rows, cols, ids);
  CpTensor *positions = matrix (CP_DTYPE_INT64, rows, cols, ids);

  for (gint64 i = 0; i < rows * cols; i++)
    {
      cp_tensor_set_value (labels, i, ids[i] + 1);
      cp_tensor_set_value (positions, i, (double) (i % cols));
    }
  cp_test_batch_take (batch, "input_ids", matrix (CP_DTYPE_INT64, rows, cols, ids));
  cp_test_batch_take (batch, "labels", labels);
  cp_test_batch_take (batch, "position_ids", positions);
  cp_test_batch_take (batch, "seq_lens", matrix (CP_DTYPE_INT64, rows, n_docs, seq_lens));
  cp_test_batch_take (batch, "seq_lens_padded", matrix (CP_DTYPE_INT64, rows, n_docs, seq_lens_padded));
  return batch;
}

#define PACKED(rows, cols, ids, n_docs, lens, padded) \
  packed_batch ((rows), (cols), (const double[]) ids, (n_docs), (const double[]) lens, (const double[]) padded)
#define L(...) { __VA_ARGS__ }

/* rows × cols tokens numbered from 1, each row @packs documents of equal
 * length. */
static CpBatch *
uniform_batch (gint64 rows,
               gint64 cols,
               gint64 packs)
{
  g_autofree double *ids = g_new (double, rows * cols);
  g_autofree double *lens = g_new (double, rows * packs);

  for (gint64 i = 0; i < rows * cols; i++)
    ids[i] = (double) (i + 1);
  for (gint64 i = 0; i < rows * packs; i++)
    lens[i] = (double) (cols / packs);
  return packed_batch (rows, cols, ids, packs, lens, lens);
}

static CpBatch *
convert (CpBatch      *batch,
         CpMesh       *mesh,
         CpThdOptions *options)
{
  g_autoptr(GError) error = NULL;
  CpBatch *out = cp_batch_to_thd (batch, mesh, options, &error);

  g_assert_no_error (error);
  g_assert_nonnull (out);
  g_assert_cmpstr (cp_batch_get_qkv_format (out), ==, "thd");
  return out;
}

static CpThdOptions *
chunks (int n)
{
  return g_object_new (CP_TYPE_THD_OPTIONS, "num-chunks", n, NULL);
}

/* test_basic_conversion, test_with_qkv_format_preservation,
 * test_dtype_preservation: flattening is a view of the same memory. */
static void
test_basic (void)
{
  g_autoptr(CpBatch) batch = PACKED (2, 6, L (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), 1, L (6, 6), L (6, 6));
  g_autoptr(CpBatch) out = convert (batch, NULL, NULL);
  CpTensor *ids = cp_batch_get (out, "input_ids");
  const char *keys[] = { "input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen",
                         "padding_mask", NULL };

  g_assert_cmpstrv (cp_batch_get_keys (out), keys);
  CP_TEST_ASSERT_SHAPE (ids, 12);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "labels"), 12);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "position_ids"), 12);
  CP_TEST_ASSERT_VALUES (ids, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
  g_assert_true (cp_tensor_get_storage (ids) == cp_tensor_get_storage (cp_batch_get (batch, "input_ids")));
  g_assert_cmpint (cp_tensor_get_dtype (ids), ==, CP_DTYPE_INT64);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (out, "cu_seqlens")), ==, CP_DTYPE_INT32);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0, 6, 12);
  ASSERT_SCALAR (cp_batch_get (out, "max_seqlen"), 6);
  for (gint64 i = 0; i < 12; i++)
    g_assert_cmpfloat (cp_tensor_get_value (cp_batch_get (out, "padding_mask"), i), ==, 0);
  g_assert_null (cp_batch_get_layout (out, 0));
}

/* test_with_multiple_packed_sequences and
 * test_with_variable_num_sequences_and_padding. */
static void
test_multiple_documents (void)
{
  g_autoptr(CpBatch) a = PACKED (2, 6, L (1, 2, 3, 99, 4, 5, 6, 7, 99, 8, 9, 10), 2,
                                 L (3, 2, 2, 3), L (4, 2, 3, 3));
  g_autoptr(CpBatch) b = PACKED (2, 6, L (1, 2, 3, 99, 4, 5, 6, 7, 8, 9, 10, 11), 2,
                                 L (3, 2, 6, SENTINEL), L (4, 2, 6, SENTINEL));
  g_autoptr(CpBatch) out_a = convert (a, NULL, NULL);
  g_autoptr(CpBatch) out_b = convert (b, NULL, NULL);

  CP_TEST_ASSERT_SHAPE (cp_batch_get (out_a, "input_ids"), 12);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_a, "cu_seqlens"), 0, 3, 5, 7, 10);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_a, "cu_seqlens_padded"), 0, 4, 6, 9, 12);
  ASSERT_SCALAR (cp_batch_get (out_a, "max_seqlen"), 3);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_b, "cu_seqlens"), 0, 3, 5, 11);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_b, "cu_seqlens_padded"), 0, 4, 6, 12);
  /* The padding between real and padded ends, from the layout. */
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_b, "padding_mask"), 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* test_with_embeddings_3d_input: embeddings keep their dtype and hidden
 * dimension. */
static void
test_embeddings (void)
{
  const gint64 shape[] = { 2, 6, 128 };
  g_autoptr(CpBatch) batch = uniform_batch (2, 6, 1);
  g_autoptr(CpBatch) out = NULL;

  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 5));
  out = convert (batch, NULL, NULL);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "input_ids"), 12, 128);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (out, "input_ids")), ==, CP_DTYPE_FLOAT32);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "position_ids"), 12);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "cu_seqlens"), 3);
}

/* test_different_batch_sizes, test_different_sequence_lengths,
 * test_single_batch_single_sequence, test_large_batch_with_packing. */
static void
test_sizes (void)
{
  const gint64 batch_sizes[] = { 1, 2, 4, 8 };
  const gint64 seq_lens[] = { 32, 64, 128, 256, 512, 1024 };
  g_autoptr(CpBatch) single = PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));
  g_autoptr(CpBatch) single_out = convert (single, NULL, NULL);
  g_autoptr(CpBatch) large = uniform_batch (16, 384, 3);
  g_autoptr(CpBatch) large_out = convert (large, NULL, NULL);
  CpTensor *cu;

  for (guint i = 0; i < G_N_ELEMENTS (batch_sizes); i++)
    {
      g_autoptr(CpBatch) batch = uniform_batch (batch_sizes[i], 16, 1);
      g_autoptr(CpBatch) out = convert (batch, NULL, NULL);

      CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "input_ids"), batch_sizes[i] * 16);
      CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "labels"), batch_sizes[i] * 16);
      CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "cu_seqlens"), batch_sizes[i] + 1);
    }
  for (guint i = 0; i < G_N_ELEMENTS (seq_lens); i++)
    {
      g_autoptr(CpBatch) batch = uniform_batch (4, seq_lens[i], 1);
      g_autoptr(CpBatch) out = convert (batch, NULL, NULL);

      cu = cp_batch_get (out, "cu_seqlens");
      CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "input_ids"), 4 * seq_lens[i]);
      g_assert_cmpfloat (cp_tensor_get_value (cu, 4), ==, 4 * seq_lens[i]);
    }
  CP_TEST_ASSERT_SHAPE (cp_batch_get (single_out, "input_ids"), 4);
  CP_TEST_ASSERT_VALUES (cp_batch_get (single_out, "cu_seqlens"), 0, 4);
  cu = cp_batch_get (large_out, "cu_seqlens");
  CP_TEST_ASSERT_SHAPE (cp_batch_get (large_out, "input_ids"), 16 * 384);
  CP_TEST_ASSERT_SHAPE (cu, 49);
  g_assert_cmpfloat (cp_tensor_get_value (cu, 48), ==, 16 * 384);
}

/* test_chunking_basic, test_chunking_with_packed_sequences,
 * test_chunking_with_embeddings, test_single_chunk, test_many_chunks,
 * test_chunks_equivalence_to_no_chunks, test_dtype_preservation_in_chunks
 * and test_different_chunk_sizes. */
static void
test_chunks (void)
{
  g_autoptr(CpThdOptions) two = chunks (2);
  g_autoptr(CpThdOptions) one = chunks (1);
  g_autoptr(CpBatch) basic = uniform_batch (4, 6, 1);
  g_autoptr(CpBatch) basic_out = convert (basic, NULL, two);
  g_autoptr(CpBatch) packed = PACKED (4, 6, L (1, 2, 3, 99, 4, 5, 6, 7, 99, 8, 9, 10, 11, 12, 13, 99,
                                               14, 15, 16, 17, 99, 18, 19, 20),
                                      2, L (3, 2, 2, 3, 3, 2, 2, 3), L (4, 2, 3, 3, 4, 2, 3, 3));
  g_autoptr(CpBatch) packed_out = convert (packed, NULL, two);
  g_autoptr(CpBatch) small = uniform_batch (2, 3, 1);
  g_autoptr(CpBatch) small_one = convert (small, NULL, one);
  g_autoptr(CpBatch) small_none = convert (small, NULL, NULL);
  const gint64 embeds_shape[] = { 4, 6, 128 };
  g_autoptr(CpBatch) embeds = uniform_batch (4, 6, 1);
  g_autoptr(CpBatch) embeds_out = NULL;

  CP_TEST_ASSERT_SHAPE (cp_batch_get (basic_out, "input_ids"), 2, 12);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (basic_out, "labels"), 2, 12);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (basic_out, "position_ids"), 2, 12);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (basic_out, "labels")), ==, CP_DTYPE_INT64);
  CP_TEST_ASSERT_VALUES (cp_batch_get (basic_out, "cu_seqlens"), 0, 6, 12, 0, 6, 12);
  CP_TEST_ASSERT_VALUES (cp_batch_get (basic_out, "max_seqlen"), 6, 6);
  CP_TEST_ASSERT_VALUES (cp_batch_get (packed_out, "cu_seqlens"), 0, 3, 5, 7, 10, 0, 3, 5, 7, 10);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (small_one, "input_ids"), 6);
  CP_TEST_ASSERT_VALUES (cp_batch_get (small_one, "cu_seqlens"), 0, 3, 6);
  g_assert_true (cp_tensor_equal (cp_batch_get (small_one, "input_ids"), cp_batch_get (small_none, "input_ids")));
  g_assert_true (cp_tensor_equal (cp_batch_get (small_one, "cu_seqlens"), cp_batch_get (small_none, "cu_seqlens")));

  cp_test_batch_take (embeds, "input_ids", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, embeds_shape, 3, 1));
  embeds_out = convert (embeds, NULL, two);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (embeds_out, "input_ids"), 2, 12, 128);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (embeds_out, "position_ids"), 2, 12);

  for (int n = 2; n <= 8; n *= 2)
    {
      g_autoptr(CpThdOptions) options = chunks (n);
      g_autoptr(CpBatch) batch = uniform_batch (16, 8, 1);
      g_autoptr(CpBatch) out = convert (batch, NULL, options);
      g_autoptr(CpBatch) many = uniform_batch (16, 32, 1);
      g_autoptr(CpBatch) many_out = convert (many, NULL, options);

      CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "input_ids"), n, 16 / n * 8);
      g_assert_cmpint (cp_tensor_get_dim (cp_batch_get (out, "cu_seqlens"), 0), ==, n);
      if (n == 8)
        for (int c = 0; c < 8; c++)
          {
            g_assert_cmpfloat (cp_tensor_get_value (cp_batch_get (many_out, "cu_seqlens"), 3 * c + 2), ==, 64);
            g_assert_cmpfloat (cp_tensor_get_value (cp_batch_get (many_out, "cu_seqlens"), 3 * c + 1), ==, 32);
          }
    }
}

/* test_variable_length_cu_seqlens_padding: chunks with different document
 * counts.  Row 2 ends early (4 of its 6 tokens); its last two tokens are
 * padding of its document, so the next row's documents keep their true
 * offsets in cu_seqlens_padded (the reference's drift by 2). */
static void
test_chunk_document_counts (void)
{
  g_autoptr(CpThdOptions) two = chunks (2);
  g_autoptr(CpBatch) batch = PACKED (4, 6, L (1, 2, 3, 99, 4, 5, 6, 7, 8, 9, 10, 11,
                                               12, 13, 14, 15, 99, 99, 16, 17, 99, 18, 19, 20),
                                     3, L (3, 2, SENTINEL, 6, SENTINEL, SENTINEL, 4, SENTINEL, SENTINEL, 2, 3, SENTINEL),
                                     L (4, 2, SENTINEL, 6, SENTINEL, SENTINEL, 4, SENTINEL, SENTINEL, 3, 3, SENTINEL));
  g_autoptr(CpBatch) out = convert (batch, NULL, two);

  CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "cu_seqlens"), 2, 4);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0, 3, 5, 11, 0, 4, 6, 9);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens_padded"), 0, 4, 6, 12, 0, 6, 9, 12);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "padding_mask"),
                         0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,
                         0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0);
}

/* test_custom_seq_lens_padding_value and test_cu_seqlens_handling: the
 * sentinel pads stacked cu_seqlens; cu_seqlens_padded is emitted for every
 * chunk as soon as one needs it. */
static void
test_sentinels (void)
{
  g_autoptr(CpThdOptions) custom = g_object_new (CP_TYPE_THD_OPTIONS, "num-chunks", 2,
                                                 "seq-lens-padding-value", (gint64) -999, NULL);
  g_autoptr(CpThdOptions) two = chunks (2);
  g_autoptr(CpBatch) a = PACKED (4, 3, L (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), 2,
                                 L (3, -999, 3, -999, 3, -999, 3, -999), L (3, -999, 3, -999, 3, -999, 3, -999));
  g_autoptr(CpBatch) out_a = convert (a, NULL, custom);
  g_autoptr(CpBatch) b = PACKED (4, 6, L (1, 2, 3, 99, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3, 99, 4, 5, 6, 7, 8, 9, 10, 11),
                                 2, L (3, 2, 6, SENTINEL, 2, 2, 2, 2), L (4, 2, 6, SENTINEL, 2, 4, 2, 4));
  g_autoptr(CpBatch) out_b = convert (b, NULL, two);

  CP_TEST_ASSERT_SHAPE (cp_batch_get (out_a, "cu_seqlens"), 2, 3);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_b, "cu_seqlens"), 0, 3, 5, 11, SENTINEL, 0, 2, 4, 6, 8);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_b, "cu_seqlens_padded"), 0, 4, 6, 12, SENTINEL, 0, 2, 6, 8, 12);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out_b, "max_seqlen"), 6, 2);
}

/* test_padding_mask_correctness: the reference's token-id rule as an
 * option, next to the layout rule. */
static void
test_padding_mask_rules (void)
{
  g_autoptr(CpThdOptions) token = g_object_new (CP_TYPE_THD_OPTIONS, "num-chunks", 2,
                                                "padding-mask-rule", CP_PADDING_MASK_RULE_TOKEN_ID,
                                                "padding-token-id", (gint64) 0, NULL);
  g_autoptr(CpThdOptions) two = chunks (2);
  g_autoptr(CpBatch) batch = PACKED (4, 3, L (0, 1, 2, 3, 0, 5, 0, 0, 8, 9, 10, 11), 1,
                                     L (3, 3, 3, 3), L (3, 3, 3, 3));
  g_autoptr(CpBatch) by_token = convert (batch, NULL, token);
  g_autoptr(CpBatch) by_layout = convert (batch, NULL, two);

  CP_TEST_ASSERT_SHAPE (cp_batch_get (by_token, "padding_mask"), 2, 6);
  CP_TEST_ASSERT_VALUES (cp_batch_get (by_token, "padding_mask"), 1, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0);
  /* Every token is real: the layout rule masks none of them. */
  CP_TEST_ASSERT_VALUES (cp_batch_get (by_layout, "padding_mask"), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* TestTrailingPadAbsorption and E8. */
static CpBatch *
pack_1024 (gint64        rows,
           const double *lens,
           const double *padded)
{
  g_autofree double *ids = g_new0 (double, rows * 1024);

  return packed_batch (rows, 1024, ids, 9, lens, padded);
}

static void
test_absorption (void)
{
  const double s = SENTINEL;
  const double short_lens[] = { 112, 112, 112, 112, 112, s, s, s, s };
  const double short_padded[] = { 112, 112, 112, 112, 576, s, s, s, s };
  const double full_lens[] = { 112, 112, 112, 112, 112, 112, 112, 112, 112 };
  const double full_padded[] = { 112, 112, 112, 112, 112, 112, 112, 112, 128 };
  double mixed_lens[18], mixed_padded[18];
  g_autoptr(CpBatch) short_batch = pack_1024 (1, short_lens, short_padded);
  g_autoptr(CpBatch) short_out = convert (short_batch, NULL, NULL);
  g_autoptr(CpBatch) full_batch = pack_1024 (1, full_lens, full_padded);
  g_autoptr(CpBatch) full_out = convert (full_batch, NULL, NULL);
  g_autoptr(CpBatch) e8 = PACKED (1, 12, L (1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0), 2, L (4, 5), L (4, 8));
  g_autoptr(CpBatch) e8_out = convert (e8, NULL, NULL);
  g_autoptr(CpThdOptions) two = chunks (2);
  g_autoptr(CpBatch) mixed = NULL;
  g_autoptr(CpBatch) mixed_out = NULL;
  CpTensor *mask = cp_batch_get (short_out, "padding_mask");

  CP_TEST_ASSERT_VALUES (cp_batch_get (short_out, "cu_seqlens"), 0, 112, 224, 336, 448, 1024);
  g_assert_false (cp_batch_contains (short_out, "cu_seqlens_padded"));
  ASSERT_SCALAR (cp_batch_get (short_out, "max_seqlen"), 576);
  /* Absorbed or not, the tail after the real tokens is padding. */
  for (gint64 i = 0; i < 1024; i++)
    g_assert_cmpfloat (cp_tensor_get_value (mask, i), ==, i >= 560);
  g_assert_cmpfloat (cp_tensor_get_value (cp_batch_get (full_out, "cu_seqlens"), 9), ==, 1024);
  g_assert_false (cp_batch_contains (full_out, "cu_seqlens_padded"));
  ASSERT_SCALAR (cp_batch_get (full_out, "max_seqlen"), 128);
  CP_TEST_ASSERT_VALUES (cp_batch_get (e8_out, "cu_seqlens"), 0, 4, 12);
  g_assert_false (cp_batch_contains (e8_out, "cu_seqlens_padded"));
  ASSERT_SCALAR (cp_batch_get (e8_out, "max_seqlen"), 8);

  memcpy (mixed_lens, full_lens, sizeof full_lens);
  memcpy (mixed_lens + 9, short_lens, sizeof short_lens);
  memcpy (mixed_padded, full_padded, sizeof full_padded);
  memcpy (mixed_padded + 9, short_padded, sizeof short_padded);
  mixed = pack_1024 (2, mixed_lens, mixed_padded);
  mixed_out = convert (mixed, NULL, two);
  g_assert_false (cp_batch_contains (mixed_out, "cu_seqlens_padded"));
  CP_TEST_ASSERT_VALUES (cp_batch_get (mixed_out, "max_seqlen"), 128, 576);
  g_assert_cmpfloat (cp_tensor_get_value (cp_batch_get (mixed_out, "cu_seqlens"), 9), ==, 1024);
  g_assert_cmpfloat (cp_tensor_get_value (cp_batch_get (mixed_out, "cu_seqlens"), 15), ==, 1024);
  g_assert_cmpfloat (cp_tensor_get_value (cp_batch_get (mixed_out, "cu_seqlens"), 16), ==, SENTINEL);
}

/* ---- sharded, on real in-process meshes ---- */

typedef void (*ShardCheck) (CpMesh *mesh, int rank);

static void
run_shard_rank (CpMesh   *mesh,
                gpointer  user_data)
{
  ShardCheck check = (ShardCheck) user_data;

  check (mesh, cp_mesh_get_rank (mesh));
}

static void
run_on (int        size,
        ShardCheck check)
{
  cp_test_run_group ("cp", size, run_shard_rank, (gpointer) check);
}

/* Runs the check given as test data on a group of two ranks. */
static void
test_on_two_ranks (gconstpointer check)
{
  run_on (2, (ShardCheck) check);
}

/* test_make_cp_batch_for_te_basic with the real partition. */
static void
te_basic_rank (CpMesh *mesh,
               int     rank)
{
  g_autoptr(CpBatch) batch = PACKED (2, 4, L (1, 2, 3, 4, 5, 6, 7, 8), 1, L (4, 4), L (4, 4));
  g_autoptr(CpBatch) out = convert (batch, mesh, NULL);
  const char *keys[] = { "input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen",
                         "padding_mask", "cp_size", "cp_rank", "local_cu_seqlens",
                         "local_cu_seqlens_padded", NULL };

  g_assert_cmpstrv (cp_batch_get_keys (out), keys);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (out, "cu_seqlens")), ==, CP_DTYPE_INT32);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0, 4, 8);
  if (rank == 0)
    CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 1, 4, 5, 8);
  else
    CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 2, 3, 6, 7);
  ASSERT_SCALAR (cp_batch_get (out, "cp_size"), 2);
  ASSERT_SCALAR (cp_batch_get (out, "cp_rank"), rank);
}

/* test_shard_thd_chunk_skips_missing_padding_mask: an already packed
 * batch is only partitioned. */
static void
packed_input_rank (CpMesh *mesh,
                   int     rank)
{
  const gint64 four[] = { 4 };
  const gint64 two[] = { 2 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpBatch) out = NULL;

  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, four, 1, 2, 3, 4));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, four, 10, 20, 30, 40));
  cp_test_batch_take (batch, "position_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, four, 0, 1, 2, 3));
  cp_test_batch_take (batch, "cu_seqlens", CP_TEST_TENSOR (CP_DTYPE_INT32, two, 0, 4));
  cp_test_batch_take (batch, "cu_seqlens_padded", CP_TEST_TENSOR (CP_DTYPE_INT32, two, 0, 4));
  out = convert (batch, mesh, NULL);
  g_assert_true (cp_batch_contains (out, "input_ids"));
  g_assert_false (cp_batch_contains (out, "attention_mask"));
  if (rank == 0)
    CP_TEST_ASSERT_VALUES (cp_batch_get (out, "labels"), 10, 40);
  else
    CP_TEST_ASSERT_VALUES (cp_batch_get (out, "labels"), 20, 30);
}

/* An already packed batch whose bounds carry sentinel entries keeps
 * them, in place, in every bounds output, as the reference passes the
 * packed cu_seqlens_padded through ([0, 4, 8, -999] stays so); the
 * partition and max_seqlen ignore them. */
static CpBatch *
packed_with_sentinels (void)
{
  const gint64 eight[] = { 8 };
  const gint64 four[] = { 4 };
  CpBatch *batch = cp_batch_new ();

  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, eight, 1, 2, 3, 4, 5, 6, 7, 8));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, eight, 1, 2, 3, 4, 5, 6, 7, 8));
  cp_test_batch_take (batch, "position_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, eight, 0, 1, 2, 3, 0, 1, 2, 3));
  cp_test_batch_take (batch, "cu_seqlens", CP_TEST_TENSOR (CP_DTYPE_INT32, four, 0, 3, 7, -999));
  cp_test_batch_take (batch, "cu_seqlens_padded", CP_TEST_TENSOR (CP_DTYPE_INT32, four, 0, 4, 8, -999));
  return batch;
}

static CpThdOptions *
sentinel_999 (void)
{
  return g_object_new (CP_TYPE_THD_OPTIONS, "seq-lens-padding-value", (gint64) -999, NULL);
}

static void
packed_sentinels_rank (CpMesh *mesh,
                       int     rank)
{
  g_autoptr(CpBatch) batch = packed_with_sentinels ();
  g_autoptr(CpThdOptions) options = sentinel_999 ();
  g_autoptr(CpBatch) out = convert (batch, mesh, options);

  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0, 4, 8, -999);
  ASSERT_SCALAR (cp_batch_get (out, "max_seqlen"), 4);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens_padded"), 0, 2, 4, -999);
  if (rank == 0)
    {
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 1, 4, 5, 8);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens"), 0, 1, 3, -999);
    }
  else
    {
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 2, 3, 6, 7);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens"), 0, 2, 4, -999);
    }
}

static void
test_packed_sentinels (void)
{
  g_autoptr(CpBatch) batch = packed_with_sentinels ();
  g_autoptr(CpThdOptions) options = sentinel_999 ();
  g_autoptr(CpBatch) out = convert (batch, NULL, options);

  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0, 3, 7, -999);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens_padded"), 0, 4, 8, -999);
  ASSERT_SCALAR (cp_batch_get (out, "max_seqlen"), 4);
  run_on (2, packed_sentinels_rank);
}

/* E6: two documents in one row, C = 2. */
static void
e6_rank (CpMesh *mesh,
         int     rank)
{
  g_autoptr(CpBatch) batch = PACKED (1, 12, L (101, 102, 103, 104, 105, 106, 0, 0, 201, 202, 203, 0),
                                     2, L (6, 3), L (8, 4));
  g_autoptr(CpThdOptions) token = g_object_new (CP_TYPE_THD_OPTIONS,
                                                "padding-mask-rule", CP_PADDING_MASK_RULE_TOKEN_ID, NULL);
  g_autoptr(CpBatch) unsharded = convert (batch, NULL, NULL);
  g_autoptr(CpBatch) out = NULL;
  g_autoptr(CpBatch) by_token = convert (batch, mesh, token);

  for (gint64 i = 8; i < 12; i++)
    cp_tensor_set_value (cp_batch_get (batch, "position_ids"), i, (double) (i - 8));
  out = convert (batch, mesh, NULL);
  CP_TEST_ASSERT_VALUES (cp_batch_get (unsharded, "cu_seqlens"), 0, 6, 9);
  CP_TEST_ASSERT_VALUES (cp_batch_get (unsharded, "cu_seqlens_padded"), 0, 8, 12);
  ASSERT_SCALAR (cp_batch_get (unsharded, "max_seqlen"), 6);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0, 8, 12);
  ASSERT_SCALAR (cp_batch_get (out, "max_seqlen"), 8);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens_padded"), 0, 4, 6);
  if (rank == 0)
    {
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 101, 102, 0, 0, 201, 0);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "position_ids"), 0, 1, 6, 7, 0, 3);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "padding_mask"), 0, 0, 1, 1, 0, 1);
      CP_TEST_ASSERT_VALUES (cp_batch_get (by_token, "padding_mask"), 0, 0, 1, 1, 0, 1);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens"), 0, 2, 3);
    }
  else
    {
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 103, 104, 105, 106, 202, 203);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "position_ids"), 2, 3, 4, 5, 1, 2);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "padding_mask"), 0, 0, 0, 0, 0, 0);
      CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens"), 0, 4, 6);
    }
  /* Per-document head-tail is balanced: every rank does the same work. */
  g_assert_cmpfloat (cp_layout_get_imbalance (cp_batch_get_layout (out, 0)), ==, 1.0);
  g_assert_null (cp_batch_get_layout (out, 1));
}

/* The other E6 partitions: [0, 4, 8] over 2 ranks and [0, 8, 16] over 4. */
static void
partition_rank (CpMesh *mesh,
                int     rank)
{
  int size = cp_mesh_get_world_size (mesh);
  gint64 len = size == 2 ? 4 : 8;
  g_autofree double *ids = g_new (double, 2 * len);
  const double lens[] = { len, len };
  g_autoptr(CpBatch) batch = NULL;
  g_autoptr(CpBatch) out = NULL;
  static const double two[2][4] = { { 0, 3, 4, 7 }, { 1, 2, 5, 6 } };
  static const double four[4][4] = { { 0, 7, 8, 15 }, { 1, 6, 9, 14 }, { 2, 5, 10, 13 }, { 3, 4, 11, 12 } };

  for (gint64 i = 0; i < 2 * len; i++)
    ids[i] = (double) i;
  batch = packed_batch (1, 2 * len, ids, 2, lens, lens);
  out = convert (batch, mesh, NULL);
  cp_test_assert_values (cp_batch_get (out, "input_ids"), size == 2 ? two[rank] : four[rank], 4);
}

static void
test_partitions (void)
{
  run_on (2, partition_rank);
  run_on (4, partition_rank);
}

/* A batch of no rows, the last of a dataset, has no tokens and no
 * documents: converted unsharded or on 2 and 4 ranks, every token buffer
 * is empty, cu_seqlens is [0] and there is no max_seqlen.  (Chunks of it
 * are refused: see the no-rows error case.) */
static CpBatch *
empty_batch (void)
{
  const gint64 tokens[] = { 0, 8 };
  const gint64 documents[] = { 0, 2 };
  CpBatch *batch = cp_batch_new ();
  const char *keys[] = { "input_ids", "labels", "position_ids", "seq_lens", "seq_lens_padded" };

  for (guint i = 0; i < G_N_ELEMENTS (keys); i++)
    cp_test_batch_take (batch, keys[i], cp_tensor_new (CP_DTYPE_INT64, i < 3 ? tokens : documents, 2, NULL));
  return batch;
}

static void
assert_empty_thd (CpBatch *out)
{
  const char *tokens[] = { "input_ids", "labels", "position_ids", "padding_mask" };

  for (guint i = 0; i < G_N_ELEMENTS (tokens); i++)
    CP_TEST_ASSERT_SHAPE (cp_batch_get (out, tokens[i]), 0);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0);
  g_assert_false (cp_batch_contains (out, "max_seqlen"));
}

static void
empty_rank (CpMesh *mesh,
            int     rank)
{
  g_autoptr(CpBatch) batch = empty_batch ();
  g_autoptr(CpBatch) out = convert (batch, mesh, NULL);

  assert_empty_thd (out);
  ASSERT_SCALAR (cp_batch_get (out, "cp_rank"), rank);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens"), 0);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "local_cu_seqlens_padded"), 0);
  g_assert_cmpint (cp_layout_get_local_len (cp_batch_get_layout (out, 0), rank), ==, 0);
}

static void
test_empty (void)
{
  g_autoptr(CpBatch) batch = empty_batch ();
  g_autoptr(CpBatch) whole = convert (batch, NULL, NULL);

  assert_empty_thd (whole);
  run_on (2, empty_rank);
  run_on (4, empty_rank);
}

/* E7: two chunks on two ranks. */
static void
e7_rank (CpMesh *mesh,
         int     rank)
{
  g_autoptr(CpThdOptions) two = chunks (2);
  g_autoptr(CpBatch) batch = PACKED (2, 8, L (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16), 2,
                                     L (3, 4, 8, SENTINEL), L (4, 4, 8, SENTINEL));
  g_autoptr(CpBatch) unsharded = convert (batch, NULL, two);
  g_autoptr(CpBatch) out = convert (batch, mesh, two);

  CP_TEST_ASSERT_VALUES (cp_batch_get (unsharded, "cu_seqlens"), 0, 3, 7, 0, 8, SENTINEL);
  CP_TEST_ASSERT_VALUES (cp_batch_get (unsharded, "cu_seqlens_padded"), 0, 4, 8, 0, 8, SENTINEL);
  g_assert_false (cp_batch_contains (out, "cu_seqlens_padded"));
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens"), 0, 4, 8, 0, 8, SENTINEL);
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "max_seqlen"), 4, 8);
  ASSERT_SCALAR (cp_batch_get (out, "cp_size"), 2);
  ASSERT_SCALAR (cp_batch_get (out, "cp_rank"), rank);
  CP_TEST_ASSERT_SHAPE (cp_batch_get (out, "input_ids"), 2, 4);
  if (rank == 0)
    CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 1, 4, 5, 8, 9, 10, 15, 16);
  else
    CP_TEST_ASSERT_VALUES (cp_batch_get (out, "input_ids"), 2, 3, 6, 7, 11, 12, 13, 14);
  g_assert_nonnull (cp_batch_get_layout (out, 1));
}

/* int32 ids with a per-token dimension, in two chunks, widen to exactly
 * what int64 ids give: every chunk lands at its own place. */
static void
narrow_ids_in_chunks (CpMesh *mesh)
{
  const gint64 shape[] = { 2, 4, 2 };
  g_autoptr(CpThdOptions) options = chunks (2);
  g_autoptr(CpBatch) narrow = uniform_batch (2, 4, 1);
  g_autoptr(CpBatch) wide = uniform_batch (2, 4, 1);
  g_autoptr(CpBatch) narrow_out = NULL, wide_out = NULL;

  cp_test_batch_take (narrow, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT32, shape, 3, 7));
  cp_test_batch_take (wide, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 3, 7));
  narrow_out = convert (narrow, mesh, options);
  wide_out = convert (wide, mesh, options);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (narrow_out, "input_ids")), ==, CP_DTYPE_INT64);
  g_assert_true (cp_tensor_equal (cp_batch_get (narrow_out, "input_ids"), cp_batch_get (wide_out, "input_ids")));
}

/* Embeddings keep their dtype when sharded (the reference casts them to
 * int64); int32 ids become int64 as the reference's do. */
static void
dtypes_rank (CpMesh *mesh,
             int     rank)
{
  const gint64 shape[] = { 1, 8, 3 };
  g_autoptr(CpBatch) batch = PACKED (1, 8, L (1, 2, 3, 4, 5, 6, 7, 8), 1, L (8), L (8));
  g_autoptr(CpBatch) ints = PACKED (1, 8, L (1, 2, 3, 4, 5, 6, 7, 8), 1, L (8), L (8));
  g_autoptr(CpBatch) out = NULL;
  g_autoptr(CpBatch) ints_out = NULL;
  CpTensor *embeds = cp_test_tensor_pattern (CP_DTYPE_BFLOAT16, shape, 3, 0);
  CpTensor *local;

  for (gint64 i = 0; i < 24; i++)
    cp_tensor_set_value (embeds, i, (double) i);
  cp_batch_remove (batch, "input_ids");
  cp_test_batch_take (batch, "inputs_embeds", embeds);
  out = convert (batch, mesh, NULL);
  local = cp_batch_get (out, "inputs_embeds");
  CP_TEST_ASSERT_SHAPE (local, 4, 3);
  g_assert_cmpint (cp_tensor_get_dtype (local), ==, CP_DTYPE_BFLOAT16);
  if (rank == 0)
    CP_TEST_ASSERT_VALUES (local, 0, 1, 2, 3, 4, 5, 18, 19, 20, 21, 22, 23);

  cp_test_batch_take (ints, "input_ids", MATRIX (CP_DTYPE_INT32, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8));
  ints_out = convert (ints, mesh, NULL);
  g_assert_cmpint (cp_tensor_get_dtype (cp_batch_get (ints_out, "input_ids")), ==, CP_DTYPE_INT64);
  if (rank == 1)
    CP_TEST_ASSERT_VALUES (cp_batch_get (ints_out, "input_ids"), 3, 4, 5, 6);
  narrow_ids_in_chunks (mesh);
}

/* A real token equal to the padding id is not masked by the layout rule;
 * the token-id rule masks it, as the reference did. */
static void
mask_fix_rank (CpMesh *mesh,
               int     rank)
{
  g_autoptr(CpBatch) batch = PACKED (1, 8, L (5, 0, 7, 8, 9, 0, 0, 0), 1, L (5), L (8));
  g_autoptr(CpThdOptions) token = g_object_new (CP_TYPE_THD_OPTIONS,
                                                "padding-mask-rule", CP_PADDING_MASK_RULE_TOKEN_ID, NULL);
  g_autoptr(CpBatch) by_layout = convert (batch, mesh, NULL);
  g_autoptr(CpBatch) by_token = convert (batch, mesh, token);

  if (rank == 0)
    {
      /* positions 0, 1, 6, 7 */
      CP_TEST_ASSERT_VALUES (cp_batch_get (by_layout, "padding_mask"), 0, 0, 1, 1);
      CP_TEST_ASSERT_VALUES (cp_batch_get (by_token, "padding_mask"), 0, 1, 1, 1);
    }
  else
    CP_TEST_ASSERT_VALUES (cp_batch_get (by_layout, "padding_mask"), 0, 0, 0, 1);
}

/* A one-rank group gives the unsharded conversion. */
static void
single_rank (CpMesh *mesh,
             int     rank)
{
  g_autoptr(CpBatch) batch = PACKED (1, 6, L (1, 2, 3, 4, 5, 6), 2, L (3, 2), L (4, 2));
  g_autoptr(CpBatch) out = convert (batch, mesh, NULL);

  g_assert_false (cp_batch_contains (out, "cp_size"));
  CP_TEST_ASSERT_VALUES (cp_batch_get (out, "cu_seqlens_padded"), 0, 4, 6);
}

static void
test_single_rank (void)
{
  run_on (1, single_rank);
}

/* cp_batch_pad_documents: documents rounded up to 2·C, the shorter row's
 * last document taking the rest. */
static void
test_pad_documents (void)
{
  g_autoptr(CpBatch) batch = PACKED (2, 6, L (1, 2, 3, 4, 5, 0, 6, 7, 8, 9, 10, 11), 2,
                                     L (3, 2, 6, SENTINEL), L (3, 2, 6, SENTINEL));
  g_autoptr(CpThdOptions) options = g_object_new (CP_TYPE_THD_OPTIONS, "padding-token-id", (gint64) 99, NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(CpBatch) padded = NULL;

  cp_batch_remove (batch, "seq_lens_padded");
  padded = cp_batch_pad_documents (batch, 2, options, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (cp_batch_get (padded, "input_ids"),
                         1, 2, 3, 99, 4, 5, 99, 99, 6, 7, 8, 9, 10, 11, 99, 99);
  CP_TEST_ASSERT_VALUES (cp_batch_get (padded, "labels"),
                         2, 3, 4, -100, 5, 6, -100, -100, 7, 8, 9, 10, 11, 12, -100, -100);
  CP_TEST_ASSERT_VALUES (cp_batch_get (padded, "position_ids"),
                         0, 1, 2, 3, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 7);
  CP_TEST_ASSERT_VALUES (cp_batch_get (padded, "seq_lens"), 3, 2, 6, SENTINEL);
  CP_TEST_ASSERT_VALUES (cp_batch_get (padded, "seq_lens_padded"), 4, 4, 8, SENTINEL);
  g_clear_object (&padded);

  /* Lengths whose sum wraps around int64 run past the row all the same. */
  cp_test_batch_take (batch, "seq_lens", MATRIX (CP_DTYPE_INT64, 2, 2, 5, G_MAXINT64, 6, SENTINEL));
  g_assert_null (cp_batch_pad_documents (batch, 2, options, &error));
  CP_TEST_ASSERT_CASE (error, CP_BATCH_ERROR, CP_BATCH_ERROR_INVALID_SEQ_LENS, "CpBatch (THD)",
                       "cp_batch_pad_documents with lengths whose sum overflows int64");
  g_assert_nonnull (strstr (error->message, "seq_lens[0, 1] = 9223372036854775807"));
}

/* The property: random packed documents on C ∈ {1..8} ranks.  Token ids
 * are the flattened positions, so the sharded ids say which positions each
 * rank holds. */
typedef struct
{
  guint32 seed;
  int cp_size;
  pthread_mutex_t lock;   /* not a GMutex: ThreadSanitizer sees through pthread only */
  guint8 *seen;          /* how often each position was held */
  gint64 n_tokens;
  gint64 real_tokens;
  gint64 local_real;     /* summed over ranks */
} PropertyCase;

static CpBatch *
random_documents (PropertyCase *c,
                  gint64       *rows_out)
{
  g_autoptr(GRand) rand = g_rand_new_with_seed (c->seed);
  gint64 rows = g_rand_int_range (rand, 1, 4);
  gint64 docs = g_rand_int_range (rand, 1, 6);
  gint64 cols = 0;
  g_autofree double *lens = g_new (double, rows * docs);
  g_autofree double *ids = NULL;
  g_autoptr(CpBatch) raw = NULL;
  g_autoptr(GError) error = NULL;
  CpBatch *batch;

  for (gint64 r = 0; r < rows; r++)
    {
      gint64 total = 0;

      for (gint64 d = 0; d < docs; d++)
        {
          gboolean unused = d > 0 && g_rand_int_range (rand, 0, 4) == 0;

          lens[r * docs + d] = unused ? SENTINEL : g_rand_int_range (rand, 0, 40);
          total += unused ? 0 : (gint64) lens[r * docs + d];
        }
      cols = MAX (cols, total + g_rand_int_range (rand, 0, 5));
    }
  ids = g_new0 (double, rows * cols);
  raw = packed_batch (rows, MAX (cols, 1), ids, docs, lens, lens);
  batch = cp_batch_pad_documents (raw, c->cp_size, NULL, &error);
  g_assert_no_error (error);
  /* Ids number the flattened positions. */
  for (gint64 i = 0; i < cp_tensor_get_numel (cp_batch_get (batch, "input_ids")); i++)
    cp_tensor_set_value (cp_batch_get (batch, "input_ids"), i, (double) i);
  *rows_out = rows;
  return batch;
}

/* The document containing position @p, by the padded bounds. */
static gint64
document_of (CpTensor *cu,
             gint64    p)
{
  gint64 d = 0;

  while (cp_tensor_get_value (cu, d + 1) <= p)
    d++;
  return d;
}

/* The real length of document @d: the d-th used entry of seq_lens. */
static gint64
real_length (CpTensor *seq_lens,
             gint64    d)
{
  for (gint64 i = 0; i < cp_tensor_get_numel (seq_lens); i++)
    if (cp_tensor_get_value (seq_lens, i) != SENTINEL && d-- == 0)
      return (gint64) cp_tensor_get_value (seq_lens, i);
  g_assert_not_reached ();
}

/* Every token of this rank lies in head chunk r or tail chunk 2C-1-r of
 * its document, and is masked exactly when it lies past the document's
 * real length. */
static void
check_rank_tokens (PropertyCase *c,
                   CpBatch      *batch,
                   CpBatch      *out,
                   int           rank)
{
  CpTensor *ids = cp_batch_get (out, "input_ids");
  CpTensor *mask = cp_batch_get (out, "padding_mask");
  CpTensor *cu_padded = cp_batch_get (out, "cu_seqlens");
  int C = c->cp_size;

  for (gint64 j = 0; j < cp_tensor_get_numel (ids); j++)
    {
      gint64 p = (gint64) cp_tensor_get_value (ids, j);
      gint64 d = document_of (cu_padded, p);
      gint64 start = (gint64) cp_tensor_get_value (cu_padded, d);
      gint64 h = ((gint64) cp_tensor_get_value (cu_padded, d + 1) - start) / (2 * C);
      gint64 chunk = (p - start) / h;

      g_assert_true (chunk == rank || chunk == 2 * C - 1 - rank);
      g_assert_cmpfloat (cp_tensor_get_value (mask, j), ==,
                         p - start >= real_length (cp_batch_get (batch, "seq_lens"), d));
      pthread_mutex_lock (&c->lock);
      c->seen[p]++;
      pthread_mutex_unlock (&c->lock);
    }
}

static void
property_rank (CpMesh   *mesh,
               gpointer  user_data)
{
  PropertyCase *c = user_data;
  gint64 rows;
  g_autoptr(CpBatch) batch = random_documents (c, &rows);
  g_autoptr(CpBatch) out = convert (batch, mesh, NULL);
  int rank = cp_mesh_get_rank (mesh);
  CpTensor *local_cu;

  if (c->cp_size == 1)
    {
      pthread_mutex_lock (&c->lock);
      for (gint64 j = 0; j < c->n_tokens; j++)
        c->seen[(gint64) cp_tensor_get_value (cp_batch_get (out, "input_ids"), j)]++;
      pthread_mutex_unlock (&c->lock);
      return;
    }
  check_rank_tokens (c, batch, out, rank);
  local_cu = cp_batch_get (out, "local_cu_seqlens");
  pthread_mutex_lock (&c->lock);
  c->local_real += (gint64) cp_tensor_get_value (local_cu, cp_tensor_get_numel (local_cu) - 1);
  pthread_mutex_unlock (&c->lock);
}

static void
test_property (void)
{
  for (guint32 seed = 1; seed <= 48; seed++)
    {
      PropertyCase c = { seed, (int) (seed % 8) + 1 };
      gint64 rows;
      g_autoptr(CpBatch) probe = random_documents (&c, &rows);
      CpTensor *lens = cp_batch_get (probe, "seq_lens");
      GList *meshes = cp_test_local_group ("cp", c.cp_size);

      pthread_mutex_init (&c.lock, NULL);
      c.n_tokens = cp_tensor_get_numel (cp_batch_get (probe, "input_ids"));
      c.seen = g_new0 (guint8, MAX (c.n_tokens, 1));
      for (gint64 i = 0; i < cp_tensor_get_numel (lens); i++)
        if (cp_tensor_get_value (lens, i) != SENTINEL)
          c.real_tokens += (gint64) cp_tensor_get_value (lens, i);
      cp_test_run_ranks (meshes, property_rank, &c);
      for (gint64 p = 0; p < c.n_tokens; p++)
        g_assert_cmpuint (c.seen[p], ==, 1);
      if (c.cp_size > 1)
        g_assert_cmpint (c.local_real, ==, c.real_tokens);
      cp_test_free_group (meshes);
      g_free (c.seen);
      pthread_mutex_destroy (&c.lock);
    }
}

/* Unsharded, a packed batch may end with tokens no document covers: they
 * are padding, and the mask is never read past the last bound. */
static void
test_packed_tail (void)
{
  const gint64 twelve[] = { 12 }, three[] = { 3 };
  g_autoptr(CpBatch) batch = cp_batch_new ();
  g_autoptr(CpBatch) thd = NULL;
  g_autoptr(GError) error = NULL;

  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, twelve, 1, 1));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, twelve, 1, 2));
  cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, twelve, 1, 3));
  cp_test_batch_take (batch, "cu_seqlens", CP_TEST_TENSOR (CP_DTYPE_INT32, three, 0, 2, 6));
  cp_test_batch_take (batch, "cu_seqlens_padded", CP_TEST_TENSOR (CP_DTYPE_INT32, three, 0, 4, 8));
  thd = cp_batch_to_thd (batch, NULL, NULL, &error);
  g_assert_no_error (error);
  CP_TEST_ASSERT_VALUES (cp_batch_get (thd, "padding_mask"), 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
}

/* Errors: a specific code, the offending values, and no output. */
typedef struct
{
  const char *name;
  int cp_size;
  CpBatch *(*make) (CpThdOptions *options);
  GQuark (*domain) (void);
  int code;
  const char *needle;
  const char *what;      /* for the reliability table */
} ErrorCase;

static CpBatch *
bshd_format (CpThdOptions *options)
{
  cp_thd_options_set_qkv_format (options, "bshd");
  return PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));
}

static CpBatch *
no_seq_lens (CpThdOptions *options)
{
  g_autoptr(CpBatch) batch = PACKED (1, 3, L (1, 2, 3), 1, L (3), L (3));

  cp_batch_remove (batch, "seq_lens");
  cp_batch_remove (batch, "seq_lens_padded");
  return g_steal_pointer (&batch);
}

static CpBatch *
no_positions (CpThdOptions *options)
{
  g_autoptr(CpBatch) batch = PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));

  cp_batch_remove (batch, "position_ids");
  return g_steal_pointer (&batch);
}

static CpBatch *
no_padded (CpThdOptions *options)
{
  g_autoptr(CpBatch) batch = PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));

  cp_batch_remove (batch, "seq_lens_padded");
  return g_steal_pointer (&batch);
}

static CpBatch *
indivisible (CpThdOptions *options)
{
  return PACKED (1, 8, L (1, 2, 3, 4, 5, 6, 7, 8), 2, L (6, 2), L (6, 2));
}

static CpBatch *
negative (CpThdOptions *options)
{
  return PACKED (1, 8, L (1, 2, 3, 4, 5, 6, 7, 8), 2, L (4, -3), L (4, 4));
}

static CpBatch *
real_past_padded (CpThdOptions *options)
{
  return PACKED (1, 8, L (1, 2, 3, 4, 5, 6, 7, 8), 2, L (5, 3), L (4, 4));
}

static CpBatch *
sentinel_mismatch (CpThdOptions *options)
{
  return PACKED (1, 8, L (1, 2, 3, 4, 5, 6, 7, 8), 2, L (4, SENTINEL), L (4, 4));
}

static CpBatch *
past_the_row (CpThdOptions *options)
{
  return PACKED (1, 8, L (1, 2, 3, 4, 5, 6, 7, 8), 2, L (4, 4), L (4, 8));
}

static CpBatch *
bad_chunks (CpThdOptions *options)
{
  cp_thd_options_set_num_chunks (options, 3);
  return uniform_batch (4, 4, 1);
}

static CpBatch *
int64_cu (CpThdOptions *options)
{
  const gint64 four[] = { 4 };
  const gint64 two[] = { 2 };
  CpBatch *batch = cp_batch_new ();

  cp_test_batch_take (batch, "input_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, four, 1, 2, 3, 4));
  cp_test_batch_take (batch, "labels", CP_TEST_TENSOR (CP_DTYPE_INT64, four, 1, 2, 3, 4));
  cp_test_batch_take (batch, "position_ids", CP_TEST_TENSOR (CP_DTYPE_INT64, four, 0, 1, 2, 3));
  cp_test_batch_take (batch, "cu_seqlens", CP_TEST_TENSOR (CP_DTYPE_INT64, two, 0, 4));
  return batch;
}

static CpBatch *
uncovered (CpThdOptions *options)
{
  CpBatch *batch = int64_cu (options);
  const gint64 two[] = { 2 };

  cp_test_batch_take (batch, "cu_seqlens", CP_TEST_TENSOR (CP_DTYPE_INT32, two, 0, 2));
  cp_test_batch_take (batch, "cu_seqlens_padded", CP_TEST_TENSOR (CP_DTYPE_INT32, two, 0, 2));
  return batch;
}

static CpBatch *
extras (CpThdOptions *options)
{
  const gint64 shape[] = { 1, 4, 3 };
  CpBatch *batch = PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));

  cp_test_batch_take (batch, "teacher_logits", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 0));
  cp_batch_set_seq_dim (batch, "teacher_logits", 1);
  return batch;
}

static CpBatch *
empty_row (CpThdOptions *options)
{
  return PACKED (2, 4, L (1, 2, 3, 4, 5, 6, 7, 8), 1, L (4, SENTINEL), L (4, SENTINEL));
}

static CpBatch *
token_rule_embeddings (CpThdOptions *options)
{
  const gint64 shape[] = { 1, 4, 2 };
  CpBatch *batch = PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));

  cp_thd_options_set_padding_mask_rule (options, CP_PADDING_MASK_RULE_TOKEN_ID);
  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, shape, 3, 0));
  return batch;
}

static CpBatch *
token_rule_per_token_dim (CpThdOptions *options)
{
  const gint64 shape[] = { 1, 4, 2 };
  CpBatch *batch = PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));

  cp_thd_options_set_padding_mask_rule (options, CP_PADDING_MASK_RULE_TOKEN_ID);
  cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 3, 0));
  return batch;
}

static CpBatch *
chunks_of_nothing (CpThdOptions *options)
{
  const gint64 empty[] = { 0, 4 };
  const gint64 no_docs[] = { 0, 1 };
  CpBatch *batch = cp_batch_new ();

  cp_thd_options_set_num_chunks (options, 2);
  cp_test_batch_take (batch, "input_ids", cp_tensor_new (CP_DTYPE_INT64, empty, 2, NULL));
  cp_test_batch_take (batch, "labels", cp_tensor_new (CP_DTYPE_INT64, empty, 2, NULL));
  cp_test_batch_take (batch, "position_ids", cp_tensor_new (CP_DTYPE_INT64, empty, 2, NULL));
  cp_test_batch_take (batch, "seq_lens", cp_tensor_new (CP_DTYPE_INT64, no_docs, 2, NULL));
  cp_test_batch_take (batch, "seq_lens_padded", cp_tensor_new (CP_DTYPE_INT64, no_docs, 2, NULL));
  return batch;
}

static CpBatch *
mrope_positions (CpThdOptions *options)
{
  const gint64 shape[] = { 3, 1, 4 };
  CpBatch *batch = PACKED (1, 4, L (1, 2, 3, 4), 1, L (4), L (4));

  cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, 3, 0));
  return batch;
}

static const ErrorCase error_cases[] = {
  { "unsupported-format", 2, bshd_format, cp_batch_error_quark, CP_BATCH_ERROR_UNSUPPORTED_FORMAT,
    "only 'thd' format is supported, got: bshd",
    "cp_batch_to_thd with a qkv format other than thd" },
  { "missing-seq-lens", 1, no_seq_lens, cp_batch_error_quark, CP_BATCH_ERROR_MISSING_KEY, "'seq_lens'",
    "cp_batch_to_thd of a padded batch without seq_lens" },
  { "missing-position-ids", 2, no_positions, cp_batch_error_quark, CP_BATCH_ERROR_MISSING_KEY, "'position_ids'",
    "cp_batch_to_thd without position_ids" },
  { "missing-seq-lens-padded", 2, no_padded, cp_batch_error_quark, CP_BATCH_ERROR_MISSING_KEY, "'seq_lens_padded'",
    "cp_batch_to_thd without seq_lens_padded" },
  { "indivisible-document", 2, indivisible, cp_batch_error_quark, CP_BATCH_ERROR_INDIVISIBLE,
    "document 0 has padded length 6, not a multiple of 2·C = 4",
    "cp_batch_to_thd with a padded document length not a multiple of 2·C" },
  { "negative-length", 2, negative, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_SEQ_LENS,
    "negative length at [0, 1]: seq_lens -3",
    "cp_batch_to_thd with a negative sequence length" },
  { "real-past-padded", 2, real_past_padded, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_SEQ_LENS,
    "seq_lens[0, 0] = 5 exceeds seq_lens_padded[0, 0] = 4",
    "cp_batch_to_thd with a real length above its padded length" },
  { "sentinel-mismatch", 2, sentinel_mismatch, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_SEQ_LENS,
    "seq_lens[0, 1] = -1000 but seq_lens_padded[0, 1] = 4",
    "cp_batch_to_thd with the sentinel in seq_lens but not in seq_lens_padded" },
  { "past-the-row", 2, past_the_row, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_SEQ_LENS,
    "run past the row length 8 at seq_lens_padded[0, 1] = 8",
    "cp_batch_to_thd with padded lengths that run past the row" },
  { "chunks-indivisible", 2, bad_chunks, cp_batch_error_quark, CP_BATCH_ERROR_INDIVISIBLE,
    "num_chunks 3 does not divide the 4 batch rows",
    "cp_batch_to_thd with num_chunks not dividing the batch rows" },
  { "cu-seqlens-not-int32", 2, int64_cu, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_SEQ_LENS,
    "'cu_seqlens' is int64[2] on host; it must be int32",
    "cp_batch_to_thd of a packed batch whose cu_seqlens are not int32" },
  { "uncovered-tokens", 2, uncovered, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_SEQ_LENS,
    "the padded documents cover 2 of the 4 tokens",
    "cp_batch_to_thd of a packed batch with tokens outside every document (sharded)" },
  { "extra-buffers", 2, extras, cp_batch_error_quark, CP_BATCH_ERROR_UNSUPPORTED_FORMAT, "'teacher_logits'",
    "cp_batch_to_thd of a batch with extra sequence buffers" },
  { "row-without-documents", 1, empty_row, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_SEQ_LENS,
    "row 1 holds 4 tokens but no document",
    "cp_batch_to_thd with a row that holds tokens but no document" },
  { "token-rule-embeddings", 1, token_rule_embeddings, cp_batch_error_quark, CP_BATCH_ERROR_INVALID_OPTION,
    "needs one integer id per token, and 'input_ids' is float32[1, 4, 2]",
    "cp_batch_to_thd with the token-id padding-mask rule on embeddings" },
  { "token-rule-per-token-dim", 1, token_rule_per_token_dim, cp_batch_error_quark,
    CP_BATCH_ERROR_INVALID_OPTION, "needs one integer id per token, and 'input_ids' is int64[1, 4, 2]",
    "cp_batch_to_thd with the token-id padding-mask rule on ids with a per-token dimension" },
  { "chunks-of-no-rows", 1, chunks_of_nothing, cp_batch_error_quark, CP_BATCH_ERROR_INDIVISIBLE,
    "num_chunks 2 splits the batch rows, and the batch has none",
    "cp_batch_to_thd of a batch without rows into several chunks" },
  { "mrope-positions", 2, mrope_positions, cp_tensor_error_quark, CP_TENSOR_ERROR_SHAPE,
    "'position_ids' is int64[3, 1, 4] on host; it must be [1, 4] like 'input_ids'",
    "cp_batch_to_thd with mRoPE position_ids [3, B, S]" },
};

static void
error_rank (CpMesh   *mesh,
            gpointer  user_data)
{
  const ErrorCase *c = user_data;
  g_autoptr(CpThdOptions) options = cp_thd_options_new ();
  g_autoptr(CpBatch) batch = c->make (options);
  g_autoptr(GError) error = NULL;

  g_assert_null (cp_batch_to_thd (batch, mesh, options, &error));
  CP_TEST_ASSERT_CASE (error, c->domain (), c->code, "CpBatch (THD)", c->what);
  cp_test_assert_message (error, c->needle);
}

static void
test_errors (gconstpointer data)
{
  const ErrorCase *c = data;

  cp_test_run_group ("cp", c->cp_size, error_rank, (gpointer) data);
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Thd/convert/basic", test_basic);
  g_test_add_func ("/Cp/Thd/convert/documents", test_multiple_documents);
  g_test_add_func ("/Cp/Thd/convert/embeddings", test_embeddings);
  g_test_add_func ("/Cp/Thd/convert/sizes", test_sizes);
  g_test_add_func ("/Cp/Thd/chunks/shapes", test_chunks);
  g_test_add_func ("/Cp/Thd/chunks/document-counts", test_chunk_document_counts);
  g_test_add_func ("/Cp/Thd/chunks/sentinels", test_sentinels);
  g_test_add_func ("/Cp/Thd/padding-mask/rules", test_padding_mask_rules);
  g_test_add_func ("/Cp/Thd/padding-mask/packed-tail", test_packed_tail);
  g_test_add_func ("/Cp/Thd/absorption/examples", test_absorption);
  g_test_add_data_func ("/Cp/Thd/shard/te-basic", te_basic_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Thd/shard/packed-input", packed_input_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Thd/shard/packed-sentinels", test_packed_sentinels);
  g_test_add_data_func ("/Cp/Thd/shard/example-e6", e6_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Thd/shard/partitions", test_partitions);
  g_test_add_data_func ("/Cp/Thd/shard/example-e7", e7_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Thd/shard/no-rows", test_empty);
  g_test_add_data_func ("/Cp/Thd/shard/dtypes", dtypes_rank, test_on_two_ranks);
  g_test_add_data_func ("/Cp/Thd/shard/padding-mask-fix", mask_fix_rank, test_on_two_ranks);
  g_test_add_func ("/Cp/Thd/shard/single-rank", test_single_rank);
  g_test_add_func ("/Cp/Thd/pad-documents/example", test_pad_documents);
  g_test_add_func ("/Cp/Thd/shard/property", test_property);
  for (guint i = 0; i < G_N_ELEMENTS (error_cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/Cp/Thd/errors/%s", error_cases[i].name);

      g_test_add_data_func (path, &error_cases[i], test_errors);
    }

  return g_test_run ();
}
