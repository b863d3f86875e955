/* fuzz-batch.c: batch preparation from arbitrary shapes, dtypes and keys
 *
 * Input: ten bytes choose the context-parallel size (1 to 8 ranks of an
 * in-process mesh), the rows, the sequence length, which keys the batch
 * holds (input_ids or inputs_embeds, labels, position_ids in four shapes,
 * loss_mask, padding_mask, attention_mask, an extra buffer along any
 * dimension), the dtypes, a key whose length is off, a rank whose
 * sequence length differs from the others', and the options (a loss
 * mask, a rotate method name, extra buffers).  Missing bytes read as 0.
 *
 * Every rank prepares its own copy of the batch, all ranks together on
 * threads; then, if every rank accepted, all ranks enter together.  The
 * rows may be 0, the last batch of a dataset.
 *
 * Invariant: no crash, no sanitizer report, no critical, and:
 *   - prepare reaches the same verdict on every rank, with the same error
 *     code; a rejection is a GError with a non-empty message that leaves
 *     the batch as it was: the same keys, the same tensor objects, over
 *     the same storage, with the same contents;
 *   - an accepted batch has every registered buffer padded to a multiple
 *     of 2·C along its sequence dimension, starting with the original
 *     contents;
 *   - enter succeeds on every rank or fails on every rank with one error;
 *     a failed enter leaves every buffer as prepare left it;
 *   - after a successful enter, the local pieces of all ranks, unsharded
 *     with the context's layout, are the padded buffers again, and exit
 *     restores position_ids exactly.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "fuzz-common.h"
#include "cp-test-util.h"

#define MAX_RANKS 8

typedef struct
{
  int cp_size;
  gint64 rows;
  gint64 seq_len;
  gint64 hidden;
  guint8 keys;          /* which optional keys the batch holds */
  guint8 position_shape;
  guint8 bad_key;       /* 0, or 1 + the index of a key whose length is off */
  guint8 disagree;      /* 0, or how much rank 1's length differs */
  guint8 dtypes;
  guint8 options;
  int extra_dim;
} Shape;

enum
{
  KEY_EMBEDS = 1 << 0,
  KEY_LABELS = 1 << 1,
  KEY_POSITIONS = 1 << 2,
  KEY_LOSS_MASK = 1 << 3,
  KEY_PADDING_MASK = 1 << 4,
  KEY_ATTENTION_MASK = 1 << 5,
  KEY_EXTRA = 1 << 6,
  KEY_REQUIRES_GRAD = 1 << 7,
};

static void
read_shape (FuzzInput *in,
            Shape     *shape)
{
  guint8 dims = fuzz_take_u8 (in);

  shape->cp_size = 1 + fuzz_take_u8 (in) % MAX_RANKS;
  shape->rows = dims & 0x80 ? 0 : 1 + dims % 3;
  shape->hidden = 1 + (dims >> 2) % 3;
  shape->seq_len = fuzz_take_u8 (in) % 40;
  shape->keys = fuzz_take_u8 (in) ^ KEY_LABELS;
  shape->position_shape = fuzz_take_u8 (in) % 5;
  shape->bad_key = fuzz_take_u8 (in) % 12;
  shape->disagree = fuzz_take_u8 (in) % 4;
  shape->dtypes = fuzz_take_u8 (in);
  shape->options = fuzz_take_u8 (in);
  shape->extra_dim = (int) (fuzz_take_u8 (in) % 7) - 3;
}

/* The length of @key on @rank: the batch's, unless fuzzed off. */
static gint64
length_of (const Shape *shape,
           int          rank,
           guint        key)
{
  gint64 length = shape->seq_len + (rank == 1 ? shape->disagree : 0);

  return shape->bad_key == key + 1 ? length + 1 : length;
}

static CpTensor *
position_ids (const Shape *shape,
              gint64       length)
{
  gint64 dims[3] = { shape->rows, length, 0 };

  switch (shape->position_shape)
    {
    case 1:
      dims[0] = 1;
      return cp_test_tensor_pattern (CP_DTYPE_INT64, dims, 2, 5);
    case 2:
      dims[0] = 3;
      dims[1] = shape->rows;
      dims[2] = length;
      return cp_test_tensor_pattern (CP_DTYPE_INT64, dims, 3, 5);
    case 3:
      return cp_test_tensor_pattern (CP_DTYPE_INT64, &length, 1, 5);
    default:
      return cp_test_tensor_pattern (CP_DTYPE_INT64, dims, 2, 5);
    }
}

static CpBatch *
make_batch (const Shape *shape,
            int          rank)
{
  CpBatch *batch = cp_batch_new ();
  gint64 two[2] = { shape->rows, length_of (shape, rank, 0) };
  gint64 three[3] = { shape->rows, length_of (shape, rank, 0), shape->hidden };
  CpDType ids_dtype = shape->dtypes & 1 ? CP_DTYPE_INT32 : CP_DTYPE_INT64;
  CpTensor *primary = shape->keys & KEY_EMBEDS ? cp_test_tensor_pattern (CP_DTYPE_FLOAT32, three, 3, 1)
                                               : cp_test_tensor_pattern (ids_dtype, two, 2, 1);

  cp_tensor_set_requires_grad (primary, (shape->keys & KEY_REQUIRES_GRAD) != 0);
  cp_test_batch_take (batch, shape->keys & KEY_EMBEDS ? "inputs_embeds" : "input_ids", primary);
  two[1] = length_of (shape, rank, 1);
  if (shape->keys & KEY_LABELS)
    cp_test_batch_take (batch, "labels",
                        cp_test_tensor_pattern (shape->dtypes & 2 ? CP_DTYPE_INT32 : CP_DTYPE_INT64, two, 2, 2));
  if (shape->keys & KEY_POSITIONS)
    cp_test_batch_take (batch, "position_ids", position_ids (shape, length_of (shape, rank, 2)));
  two[1] = length_of (shape, rank, 3);
  if (shape->keys & KEY_LOSS_MASK)
    cp_test_batch_take (batch, "loss_mask",
                        cp_test_tensor_pattern (shape->dtypes & 4 ? CP_DTYPE_FLOAT32 : CP_DTYPE_BOOL, two, 2, 3));
  two[1] = length_of (shape, rank, 4);
  if (shape->keys & KEY_PADDING_MASK)
    cp_test_batch_take (batch, "padding_mask",
                        cp_test_tensor_pattern (shape->dtypes & 8 ? CP_DTYPE_UINT8 : CP_DTYPE_BOOL, two, 2, 4));
  if (shape->keys & KEY_ATTENTION_MASK)
    cp_test_batch_take (batch, "attention_mask", cp_test_tensor_pattern (CP_DTYPE_INT64, two, 2, 6));
  three[1] = length_of (shape, rank, 5);
  if (shape->keys & KEY_EXTRA)
    {
      CpDType dtype = shape->dtypes & 16 ? CP_DTYPE_BFLOAT16 : CP_DTYPE_FLOAT32;

      cp_test_batch_take (batch, "teacher_logits", cp_test_tensor_pattern (dtype, three, 3, 7));
      if (!(shape->options & 4))
        cp_batch_set_seq_dim (batch, "teacher_logits", shape->extra_dim);
    }
  return batch;
}

static CpBatchOptions *
make_options (const Shape *shape,
              CpBatch     *batch,
              int          rank)
{
  static const char *rotate_names[] = { NULL, "allgather", "alltoall", "addtoall" };
  CpBatchOptions *options = cp_batch_options_new ();
  const char *name = rotate_names[(shape->options >> 3) % 4];
  gint64 dims[2] = { shape->rows, length_of (shape, rank, 6) };

  if (shape->options & 1)
    {
      CpTensor *own = cp_batch_get (batch, "loss_mask");
      g_autoptr(CpTensor) mask = own != NULL && (shape->options & 2)
                                   ? g_object_ref (own) : cp_test_tensor_pattern (CP_DTYPE_BOOL, dims, 2, 8);

      cp_batch_options_set_loss_mask (options, mask);
    }
  if (shape->options & 4)
    cp_batch_options_add_extra_buffer (options, shape->options & 32 ? "labels" : "teacher_logits",
                                       shape->extra_dim);
  if (name != NULL)
    cp_batch_options_set_rotate_method_name (options, name);
  return options;
}

/* A registered buffer is padded to a multiple of 2·C and starts with
 * what the batch held (the positions prepare synthesises excepted). */
static void
check_padded (CpContext *context,
              GPtrArray *originals,
              int        cp_size)
{
  for (guint i = 0; i < cp_context_get_n_buffers (context); i++)
    {
      CpTensor *buffer = cp_context_get_buffer (context, i);
      int dim = cp_context_get_buffer_seq_dim (context, i);
      CpTestSnapshot *original = cp_test_snapshot_find (originals, cp_context_get_buffer_name (context, i));
      gint64 length = cp_tensor_get_dim (buffer, dim);
      g_autoptr(CpTensor) prefix = NULL;

      g_assert_cmpint (length % (2 * cp_size), ==, 0);
      if (original == NULL || cp_tensor_get_n_dims (original->copy) != cp_tensor_get_n_dims (buffer) ||
          cp_tensor_get_dim (original->copy, 0) != cp_tensor_get_dim (buffer, 0))
        continue; /* synthesised, or [1, S] expanded to [B, S] */
      prefix = cp_tensor_narrow (buffer, dim, 0, cp_tensor_get_dim (original->copy, dim), NULL);
      g_assert_nonnull (prefix);
      g_assert_true (cp_tensor_equal (prefix, original->copy));
    }
}

static gpointer
enter_rank (gpointer data)
{
  GError *error = NULL;

  cp_context_enter (*(CpContext **) data, &error);
  return error;
}

/* Enters every rank on its own thread; TRUE when all succeeded.  A failed
 * enter fails on every rank, with one error. */
static gboolean
enter_all (CpContext **contexts,
           int         n)
{
  GThread *threads[MAX_RANKS];
  GError *errors[MAX_RANKS];
  int failed = 0;

  for (int r = 0; r < n; r++)
    threads[r] = g_thread_new ("fuzz-rank", enter_rank, &contexts[r]);
  for (int r = 0; r < n; r++)
    {
      errors[r] = g_thread_join (threads[r]);
      failed += errors[r] != NULL;
    }
  g_assert_true (failed == 0 || failed == n);
  for (int r = 0; r < n && failed > 0; r++)
    {
      fuzz_assert_rejected (errors[r]);
      g_assert_cmpuint (errors[r]->domain, ==, errors[0]->domain);
      g_assert_cmpint (errors[r]->code, ==, errors[0]->code);
    }
  for (int r = 0; r < n; r++)
    g_clear_error (&errors[r]);
  return failed == 0;
}

/* The local pieces of every rank, unsharded, are the padded buffers. */
static void
check_round_trip (CpContext **contexts,
                  GPtrArray **prepared,
                  int         n)
{
  CpLayout *layout = cp_context_get_layout (contexts[0]);

  for (guint i = 0; i < cp_context_get_n_buffers (contexts[0]); i++)
    {
      CpTensor *pieces[MAX_RANKS];
      g_autoptr(CpTensor) whole = NULL;
      const char *name = cp_context_get_buffer_name (contexts[0], i);
      CpTestSnapshot *padded = cp_test_snapshot_find (prepared[0], name);

      for (int r = 0; r < n; r++)
        pieces[r] = cp_context_get_buffer (contexts[r], i);
      whole = cp_layout_unshard_pieces (layout, pieces, (guint) n, cp_context_get_buffer_seq_dim (contexts[0], i), NULL);
      g_assert_nonnull (whole);
      if (padded != NULL)
        g_assert_true (cp_tensor_equal (whole, padded->copy));
    }
}

static void
check_exit (CpContext **contexts,
            GPtrArray **prepared,
            int         n)
{
  for (int r = 0; r < n; r++)
    {
      g_autoptr(GError) error = NULL;

      g_assert_true (cp_context_exit (contexts[r], &error));
      g_assert_no_error (error);
      for (guint i = 0; i < cp_context_get_n_buffers (contexts[r]); i++)
        if (cp_context_get_buffer_restores (contexts[r], i))
          {
            CpTestSnapshot *padded = cp_test_snapshot_find (prepared[r], cp_context_get_buffer_name (contexts[r], i));

            g_assert_nonnull (padded);
            g_assert_true (cp_tensor_equal (cp_context_get_buffer (contexts[r], i), padded->copy));
          }
    }
}

/* Snapshots of every registered buffer as prepare left it. */
static GPtrArray *
snapshot_context (CpContext *context)
{
  GPtrArray *snapshots = g_ptr_array_new_with_free_func ((GDestroyNotify) cp_test_snapshot_free);

  for (guint i = 0; i < cp_context_get_n_buffers (context); i++)
    g_ptr_array_add (snapshots, cp_test_snapshot_new (cp_context_get_buffer_name (context, i),
                                                      cp_context_get_buffer (context, i)));
  return snapshots;
}

static void
check_entered_or_untouched (CpContext **contexts,
                            int         n)
{
  GPtrArray *prepared[MAX_RANKS];

  for (int r = 0; r < n; r++)
    prepared[r] = snapshot_context (contexts[r]);
  if (enter_all (contexts, n))
    {
      check_round_trip (contexts, prepared, n);
      check_exit (contexts, prepared, n);
    }
  else
    for (int r = 0; r < n; r++)
      for (guint i = 0; i < prepared[r]->len; i++)
        cp_test_snapshot_assert_unchanged (g_ptr_array_index (prepared[r], i));
  for (int r = 0; r < n; r++)
    g_ptr_array_unref (prepared[r]);
}

typedef struct
{
  const Shape *shape;
  int rank;
  CpMesh *mesh;
  CpBatch *batch;
  CpContext *context;
  GError *error;
} PrepareJob;

/* One rank's prepare: prepare is collective, so every rank runs on its
 * own thread. */
static gpointer
prepare_rank (gpointer data)
{
  PrepareJob *job = data;
  g_autoptr(GPtrArray) before = NULL;
  g_autoptr(CpBatchOptions) options = NULL;

  job->batch = make_batch (job->shape, job->rank);
  options = make_options (job->shape, job->batch, job->rank);
  before = cp_test_snapshot_batch (job->batch);
  job->context = cp_batch_prepare (job->batch, job->mesh, options, &job->error);
  if (job->context == NULL)
    {
      fuzz_assert_rejected (job->error);
      cp_test_assert_batch_unchanged (job->batch, before);
    }
  else
    check_padded (job->context, before, cp_context_get_cp_size (job->context));
  return NULL;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data,
                        size_t         size)
{
  FuzzInput in = { data, size };
  Shape shape = { 0 };
  PrepareJob jobs[MAX_RANKS];
  GThread *threads[MAX_RANKS];
  CpContext *contexts[MAX_RANKS] = { NULL };
  GList *group;
  int rejected = 0;

  fuzz_init ();
  read_shape (&in, &shape);
  group = fuzz_local_group (shape.cp_size);
  for (int r = 0; r < shape.cp_size; r++)
    {
      jobs[r] = (PrepareJob) { &shape, r, g_list_nth_data (group, (guint) r) };
      threads[r] = g_thread_new ("fuzz-rank", prepare_rank, &jobs[r]);
    }
  for (int r = 0; r < shape.cp_size; r++)
    {
      g_thread_join (threads[r]);
      contexts[r] = jobs[r].context;
      if (jobs[r].error == NULL)
        continue;
      g_assert_nonnull (jobs[0].error);
      g_assert_cmpuint (jobs[r].error->domain, ==, jobs[0].error->domain);
      g_assert_cmpint (jobs[r].error->code, ==, jobs[0].error->code);
      rejected++;
    }
  /* The ranks agree on the verdict, even when their lengths differ. */
  g_assert_true (rejected == 0 || rejected == shape.cp_size);
  if (rejected == 0 && shape.cp_size > 1)
    check_entered_or_untouched (contexts, shape.cp_size);
  for (int r = 0; r < shape.cp_size; r++)
    {
      g_clear_object (&jobs[r].context);
      g_clear_error (&jobs[r].error);
      g_object_unref (jobs[r].batch);
    }
  return 0;
}
