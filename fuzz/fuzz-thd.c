/* fuzz-thd.c: THD conversion from arbitrary seq_lens, cu_seqlens,
 * sentinels and chunk counts
 *
 * Input: four bytes choose the context-parallel size (1 to 8 ranks of an
 * in-process mesh), the rows and num_chunks, the row length, and the
 * form: a padded batch [B, S] with seq_lens and seq_lens_padded [B, N],
 * or a packed one [T] with cu_seqlens (and maybe cu_seqlens_padded);
 * ids or embeddings; the padding-mask rule; the sentinel.  The lengths
 * follow, two bytes per document: taken as they are (any int8), or, in
 * "valid" mode, turned into padded lengths that are multiples of 2·C with
 * real lengths below them, so that accepted conversions are common.
 * Missing bytes read as 0.
 *
 * Every rank converts the same batch (the conversion does not
 * communicate).
 *
 * Invariant: no crash, no sanitizer report (no read out of bounds), no
 * critical, and:
 *   - every rank reaches the same verdict; a rejection is a GError with a
 *     non-empty message, and the input batch is never modified;
 *   - for an accepted conversion, in every chunk: the union of the ranks'
 *     indices covers every position of the chunk exactly once; every
 *     document is split head-tail (the layout equals cp_layout_new_thd of
 *     the emitted cu_seqlens, or is empty when there are no documents and
 *     so no tokens); each rank's tokens are the input's at its
 *     indices; with seq_lens, the ranks' local_cu_seqlens add up to the
 *     real token count, and the layout-rule padding_mask marks exactly the
 *     positions between a document's real and padded end;
 *   - a packed batch's sentinel entries stay where they were: sharded, its
 *     cu_seqlens is the given cu_seqlens_padded (or cu_seqlens), bit for
 *     bit, as the reference passes it through.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "fuzz-common.h"
#include "cp-test-util.h"

#define MAX_RANKS 8
#define MAX_DOCS 4
#define SENTINEL_DEFAULT -1000

enum
{
  FORM_PACKED = 1 << 0,
  FORM_EMBEDS = 1 << 1,
  FORM_TOKEN_RULE = 1 << 2,
  FORM_VALID = 1 << 3,
  FORM_NO_PADDED = 1 << 4,
  FORM_SENTINEL = 1 << 5,
};

typedef struct
{
  int cp_size;
  int num_chunks;
  gint64 rows;
  gint64 row_len;
  guint8 form;
  gint64 sentinel;
  gint64 real[4][MAX_DOCS];    /* per row and document */
  gint64 padded[4][MAX_DOCS];
  int n_docs;
} Input;

/* In valid mode: padded lengths of 2·C, 4·C or 6·C, real ones below;
 * an unused entry (byte 0xff) holds the sentinel. */
static void
read_document (FuzzInput *in,
               Input     *input,
               int        b,
               int        i)
{
  gint64 a = (gint8) fuzz_take_u8 (in);
  gint64 z = (gint8) fuzz_take_u8 (in);
  gint64 unit = 2 * (gint64) input->cp_size;

  if (!(input->form & FORM_VALID))
    {
      input->real[b][i] = a;
      input->padded[b][i] = z;
      return;
    }
  if ((guint8) a == 0xff && i > 0)
    {
      input->real[b][i] = input->padded[b][i] = input->sentinel;
      return;
    }
  input->padded[b][i] = unit * (1 + (guint8) z % 3);
  input->real[b][i] = (guint8) a % (input->padded[b][i] + 1);
}

static void
read_input (FuzzInput *in,
            Input     *input)
{
  guint8 shape = fuzz_take_u8 (in);
  guint8 length = fuzz_take_u8 (in);

  input->cp_size = 1 + fuzz_take_u8 (in) % MAX_RANKS;
  input->rows = 1 + shape % 4;
  input->num_chunks = 1 + (shape >> 2) % 4;
  input->n_docs = 1 + (shape >> 4) % MAX_DOCS;
  input->form = fuzz_take_u8 (in);
  input->sentinel = input->form & FORM_SENTINEL ? -1 : SENTINEL_DEFAULT;
  for (int b = 0; b < input->rows; b++)
    for (int i = 0; i < input->n_docs; i++)
      read_document (in, input, (int) b, i);
  input->row_len = length % 48;
  if (input->form & FORM_VALID)
    for (int b = 0; b < input->rows; b++)
      {
        gint64 total = 0;

        for (int i = 0; i < input->n_docs; i++)
          total += input->padded[b][i] > 0 ? input->padded[b][i] : 0;
        input->row_len = MAX (input->row_len, total);
      }
}

static CpTensor *
lengths (const Input *input,
         gint64     (*values)[MAX_DOCS])
{
  const gint64 dims[] = { input->rows, input->n_docs };
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_INT64, dims, 2, NULL);

  for (int b = 0; b < input->rows; b++)
    for (int i = 0; i < input->n_docs; i++)
      cp_tensor_set_value (tensor, b * input->n_docs + i, (double) values[b][i]);
  return tensor;
}

/* Bounds from the first row's lengths, as a packed batch carries them;
 * a document whose length is the sentinel leaves a sentinel entry. */
static CpTensor *
packed_bounds (const Input *input,
               gint64     (*values)[MAX_DOCS])
{
  gint64 n = input->n_docs + 1;
  CpTensor *tensor = cp_tensor_new (CP_DTYPE_INT32, &n, 1, NULL);
  gint64 total = 0;

  for (int i = 0; i < input->n_docs; i++)
    {
      gboolean sentinel = i > 0 && values[0][i] == input->sentinel;

      total += sentinel ? 0 : values[0][i];
      cp_tensor_set_value (tensor, i + 1, (double) (sentinel ? input->sentinel : (gint32) total));
    }
  return tensor;
}

static CpBatch *
make_batch (const Input *input)
{
  CpBatch *batch = cp_batch_new ();
  gboolean packed = input->form & FORM_PACKED;
  gint64 tokens = input->rows * input->row_len;
  gint64 dims[3] = { input->rows, input->row_len, 2 };
  gint64 *shape = packed ? &tokens : dims;
  guint n = packed ? 1 : 2;

  if (input->form & FORM_EMBEDS)
    {
      gint64 embeds[3] = { shape[0], n == 2 ? shape[1] : 2, 2 };

      cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_FLOAT32, embeds, n + 1, 1));
    }
  else
    cp_test_batch_take (batch, "input_ids", cp_test_tensor_pattern (CP_DTYPE_INT32, shape, n, 1));
  cp_test_batch_take (batch, "labels", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, n, 2));
  cp_test_batch_take (batch, "position_ids", cp_test_tensor_pattern (CP_DTYPE_INT64, shape, n, 3));
  if (packed)
    {
      cp_test_batch_take (batch, "cu_seqlens", packed_bounds (input, (gint64 (*)[MAX_DOCS]) input->real));
      if (!(input->form & FORM_NO_PADDED))
        cp_test_batch_take (batch, "cu_seqlens_padded", packed_bounds (input, (gint64 (*)[MAX_DOCS]) input->padded));
      return batch;
    }
  cp_test_batch_take (batch, "seq_lens", lengths (input, (gint64 (*)[MAX_DOCS]) input->real));
  if (!(input->form & FORM_NO_PADDED))
    cp_test_batch_take (batch, "seq_lens_padded", lengths (input, (gint64 (*)[MAX_DOCS]) input->padded));
  return batch;
}

static CpThdOptions *
make_options (const Input *input)
{
  CpThdOptions *options = cp_thd_options_new ();

  cp_thd_options_set_num_chunks (options, input->num_chunks);
  cp_thd_options_set_seq_lens_padding_value (options, input->sentinel);
  if (input->form & FORM_TOKEN_RULE)
    cp_thd_options_set_padding_mask_rule (options, CP_PADDING_MASK_RULE_TOKEN_ID);
  return options;
}

/* Whether position @p of row @b is a real token: the documents of the
 * row follow each other from its start, and what their padded lengths
 * leave at the end of the row is padding. */
static gboolean
is_real (const Input *input,
         int          b,
         gint64       p)
{
  gint64 start = 0;

  for (int i = 0; i < input->n_docs; i++)
    {
      if (input->real[b][i] == input->sentinel)
        continue;
      if (p < start + input->padded[b][i])
        return p < start + input->real[b][i];
      start += input->padded[b][i];
    }
  return FALSE;
}

static gint64
real_tokens (const Input *input,
             int          first_row,
             int          rows)
{
  gint64 total = 0;

  for (int b = first_row; b < first_row + rows; b++)
    for (int i = 0; i < input->n_docs; i++)
      if (input->real[b][i] != input->sentinel)
        total += input->real[b][i];
  return total;
}

/* The global padded bounds of chunk @c, as the output gives them. */
static GArray *
emitted_bounds (CpBatch     *out,
                const Input *input,
                int          c)
{
  CpTensor *cu = cp_batch_get (out, "cu_seqlens");
  gint64 width = cp_tensor_get_dim (cu, -1);
  GArray *bounds = g_array_new (FALSE, FALSE, sizeof (gint64));

  for (gint64 i = 0; i < width; i++)
    {
      gint64 value = (gint64) cp_tensor_get_value (cu, c * width + i);

      if (value == input->sentinel && i > 0)
        continue;
      g_array_append_val (bounds, value);
    }
  return bounds;
}

typedef struct
{
  const Input *input;
  CpBatch *in;
  CpBatch *outs[MAX_RANKS];
  int chunk;
  gint64 chunk_tokens;
} Check;

/* Rank @r's token @j of chunk @c is the input's at global index @g. */
static void
check_token (Check  *check,
             int     r,
             gint64  j,
             gint64  g,
             gint64  local)
{
  CpTensor *ids = cp_batch_get (check->outs[r], "input_ids");
  CpTensor *source = cp_batch_get (check->in, "input_ids");
  gint64 width = cp_tensor_get_n_dims (ids) > (guint) (check->input->num_chunks > 1 ? 2 : 1)
    ? cp_tensor_get_dim (ids, -1) : 1;
  gint64 first = (gint64) check->chunk * check->chunk_tokens;

  for (gint64 h = 0; h < width; h++)
    g_assert_cmpfloat (cp_tensor_get_value (ids, ((gint64) check->chunk * local + j) * width + h), ==,
                       cp_tensor_get_value (source, (first + g) * width + h));
}

static void
check_mask (Check  *check,
            int     r,
            gint64  j,
            gint64  g,
            gint64  local)
{
  const Input *input = check->input;
  CpTensor *mask = cp_batch_get (check->outs[r], "padding_mask");
  gint64 rows_per_chunk = input->rows / input->num_chunks;
  int b = (int) (check->chunk * rows_per_chunk + g / input->row_len);
  gboolean padding = cp_tensor_get_value (mask, (gint64) check->chunk * local + j) != 0;

  if (!(input->form & (FORM_PACKED | FORM_TOKEN_RULE)))
    g_assert_cmpint (padding, ==, !is_real (input, b, g % input->row_len));
}

/* Every position of the chunk once, head-tail per document, the right
 * tokens, the right padding mask. */
static void
check_chunk (Check *check)
{
  int cp = check->input->cp_size;
  g_autoptr(GArray) bounds = emitted_bounds (check->outs[0], check->input, check->chunk);
  /* No documents (no tokens either): every rank's share is empty. */
  g_autoptr(CpLayout) expected = bounds->len > 1
    ? cp_layout_new_thd ((gint64 *) bounds->data, bounds->len, cp, NULL)
    : cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 0, cp, NULL);
  CpLayout *layout = cp_batch_get_layout (check->outs[0], (guint) check->chunk);
  g_autofree guint8 *seen = g_malloc0 ((gsize) check->chunk_tokens + 1);

  g_assert_nonnull (expected);
  g_assert_true (cp_layout_equal (layout, expected));
  g_assert_cmpint (cp_layout_get_seq_len (layout), ==, check->chunk_tokens);
  for (int r = 0; r < cp; r++)
    {
      g_autoptr(CpTensor) indices = cp_layout_get_local_indices (layout, r);
      gint64 local = cp_tensor_get_numel (indices);

      g_assert_true (cp_layout_equal (cp_batch_get_layout (check->outs[r], (guint) check->chunk), layout));
      for (gint64 j = 0; j < local; j++)
        {
          gint64 g = (gint64) cp_tensor_get_value (indices, j);

          g_assert_cmpint (g, >=, 0);
          g_assert_cmpint (g, <, check->chunk_tokens);
          g_assert_cmpuint (seen[g]++, ==, 0);
          check_token (check, r, j, g, local);
          check_mask (check, r, j, g, local);
        }
    }
  for (gint64 g = 0; g < check->chunk_tokens; g++)
    g_assert_cmpuint (seen[g], ==, 1);
}

/* The ranks' local_cu_seqlens add up to the chunk's real tokens. */
static void
check_real_count (Check *check)
{
  const Input *input = check->input;
  int rows = (int) (input->rows / input->num_chunks);
  gint64 total = 0;

  for (int r = 0; r < input->cp_size; r++)
    {
      CpTensor *local = cp_batch_get (check->outs[r], "local_cu_seqlens");
      gint64 width = cp_tensor_get_dim (local, -1);
      gint64 last = 0;

      for (gint64 i = 0; i < width; i++)
        {
          gint64 value = (gint64) cp_tensor_get_value (local, check->chunk * width + i);

          if (i > 0 && value == input->sentinel)
            break;
          last = value;
        }
      total += last;
    }
  g_assert_cmpint (total, ==, real_tokens (input, check->chunk * rows, rows));
}

/* Sharded, a packed batch's cu_seqlens is its padded bounds as given,
 * sentinel entries in place, as the reference passes them through. */
static void
check_packed_bounds (Check *check)
{
  CpTensor *given = cp_batch_get (check->in, "cu_seqlens_padded");

  if (given == NULL)
    given = cp_batch_get (check->in, "cu_seqlens");
  for (int r = 0; r < check->input->cp_size; r++)
    g_assert_true (cp_tensor_equal (cp_batch_get (check->outs[r], "cu_seqlens"), given));
}

static void
check_accepted (Check *check)
{
  const Input *input = check->input;
  gint64 tokens = input->form & FORM_PACKED ? input->rows * input->row_len
                                            : input->rows * input->row_len;

  if (input->cp_size == 1)
    return; /* unsharded: views of the input, checked by the unit tests */
  if (input->form & FORM_PACKED)
    check_packed_bounds (check);
  check->chunk_tokens = tokens / input->num_chunks;
  for (check->chunk = 0; check->chunk < input->num_chunks; check->chunk++)
    {
      check_chunk (check);
      if (!(input->form & FORM_PACKED))
        check_real_count (check);
    }
}

static GPtrArray *
copy_batch (CpBatch *batch)
{
  GPtrArray *copies = g_ptr_array_new_with_free_func (g_object_unref);
  const char * const *keys = cp_batch_get_keys (batch);

  for (guint i = 0; keys[i] != NULL; i++)
    g_ptr_array_add (copies, cp_tensor_copy (cp_batch_get (batch, keys[i]), NULL));
  return copies;
}

static void
check_untouched (CpBatch   *batch,
                 GPtrArray *copies)
{
  const char * const *keys = cp_batch_get_keys (batch);

  g_assert_cmpuint (cp_batch_get_n_keys (batch), ==, copies->len);
  for (guint i = 0; keys[i] != NULL; i++)
    g_assert_true (cp_tensor_equal (cp_batch_get (batch, keys[i]), g_ptr_array_index (copies, i)));
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data,
                        size_t         size)
{
  FuzzInput in = { data, size };
  Input input = { 0 };
  Check check = { &input };
  g_autoptr(CpThdOptions) options = NULL;
  g_autoptr(GPtrArray) copies = NULL;
  GError *errors[MAX_RANKS] = { NULL };
  GList *group;
  int rejected = 0;

  fuzz_init ();
  read_input (&in, &input);
  group = fuzz_local_group (input.cp_size);
  check.in = make_batch (&input);
  options = make_options (&input);
  copies = copy_batch (check.in);
  for (int r = 0; r < input.cp_size; r++)
    {
      check.outs[r] = cp_batch_to_thd (check.in, g_list_nth_data (group, (guint) r), options, &errors[r]);
      if (check.outs[r] == NULL)
        {
          fuzz_assert_rejected (errors[r]);
          /* Every rank reaches the same verdict: rank 0 rejected too. */
          g_assert_nonnull (errors[0]);
          g_assert_cmpuint (errors[r]->domain, ==, errors[0]->domain);
          g_assert_cmpint (errors[r]->code, ==, errors[0]->code);
          rejected++;
        }
      check_untouched (check.in, copies);
    }
  g_assert_true (rejected == 0 || rejected == input.cp_size);
  if (rejected == 0)
    check_accepted (&check);
  for (int r = 0; r < input.cp_size; r++)
    {
      g_clear_object (&check.outs[r]);
      g_clear_error (&errors[r]);
    }
  g_object_unref (check.in);
  return 0;
}
