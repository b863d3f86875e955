/* cp-layout.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <string.h>

#include "cp-error.h"
#include "cp-layout-private.h"
#include "cp-tensor-private.h"

/**
 * CpLayout:
 *
 * Which global sequence positions each rank of a context-parallel group
 * holds, as an immutable value.
 *
 * With %CP_LOAD_BALANCE_HEAD_TAIL the sequence of length S is cut into 2·C
 * chunks of S/(2·C) positions and rank r holds chunk r followed by chunk
 * 2·C−1−r, so under causal attention every rank does the same work. For
 * C = 2 and S = 8, rank 0 holds positions `[0, 1, 6, 7]` and rank 1 holds
 * `[2, 3, 4, 5]`. With %CP_LOAD_BALANCE_CONTIGUOUS rank r holds chunk r of C.
 *
 * A packed (THD) layout ([ctor@Cp.Layout.new_thd]) applies head-tail to
 * every document separately, the partition Transformer Engine uses: for
 * document i of padded length L_i, rank r takes L_i/(2·C) positions from its
 * head and as many from its tail, documents in order.
 *
 * Lengths that do not divide are errors, never a silent fallback to
 * another layout. Layouts are immutable and can be shared between threads.
 *
 * Since: 1.0
 */
struct _CpLayout
{
  gatomicrefcount ref_count;
  CpLoadBalance balance;
  int cp_size;
  gint64 seq_len;
  guint n_documents;
  gint64 *bounds;        /* n_documents + 1 document boundaries */
  cp_index_run *runs;           /* every rank's runs, rank after rank */
  guint *first_run;      /* cp_size + 1 indices into runs */
  gint64 *local_len;     /* per rank */
  gint64 *rank_offset;   /* per rank: prefix sums of local_len */
  double *cost;          /* per rank */
  guint64 fingerprint;
};

G_DEFINE_BOXED_TYPE (CpLayout, cp_layout, cp_layout_ref, cp_layout_unref)

/* Big enough for any real mesh, small enough that the per-rank tables of
 * a hostile size cannot exhaust memory. */
#define MAX_CP_SIZE 65536

static gboolean
check_cp_size (int      cp_size,
               GError **error)
{
  if (cp_size < 1 || cp_size > MAX_CP_SIZE)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "cp_size %d is outside [1, %d]", cp_size, MAX_CP_SIZE);
      return FALSE;
    }
  return TRUE;
}

/* Whether each document is cut into 2·C chunks (head-tail) or C. */
static gboolean
is_head_tail (CpLayout *self)
{
  return self->balance == CP_LOAD_BALANCE_HEAD_TAIL;
}

/* How many chunks each rank takes from every document. */
static guint
chunks_per_document (CpLayout *self)
{
  return (guint) cp_index_chunks_per_document (is_head_tail (self));
}

static guint64
fnv1a (guint64  hash,
       gint64   value)
{
  guint64 bits = (guint64) value;

  /* Explicit little-endian bytes: the same layout hashes the same on every
   * host, which is what ranks compare. */
  for (int i = 0; i < 8; i++)
    {
      hash ^= (bits >> (8 * i)) & 0xff;
      hash *= G_GUINT64_CONSTANT (0x100000001b3);
    }
  return hash;
}

static guint64
compute_fingerprint (CpLayout *self)
{
  guint64 hash = G_GUINT64_CONSTANT (0xcbf29ce484222325);

  hash = fnv1a (hash, 0x31544c5059414c43); /* "CPLAYLT1" */
  hash = fnv1a (hash, self->balance);
  hash = fnv1a (hash, self->cp_size);
  hash = fnv1a (hash, self->n_documents);
  for (guint i = 0; i <= self->n_documents; i++)
    hash = fnv1a (hash, self->bounds[i]);
  return hash;
}

/* Builds every table from balance, cp_size and the document bounds. */
static CpLayout *
layout_build (CpLoadBalance  balance,
              int            cp_size,
              const gint64  *bounds,
              guint          n_documents)
{
  CpLayout *self = g_new0 (CpLayout, 1);
  g_autoptr(GArray) runs = g_array_new (FALSE, FALSE, sizeof (cp_index_run));
  g_autofree cp_index_run *rank_runs = NULL;

  g_atomic_ref_count_init (&self->ref_count);
  self->balance = balance;
  self->cp_size = cp_size;
  self->n_documents = n_documents;
  self->bounds = g_memdup2 (bounds, (n_documents + 1) * sizeof (gint64));
  self->seq_len = bounds[n_documents] - bounds[0];
  self->first_run = g_new (guint, cp_size + 1);
  self->local_len = g_new0 (gint64, cp_size);
  self->rank_offset = g_new0 (gint64, cp_size);
  self->cost = g_new0 (double, cp_size);
  rank_runs = g_new (cp_index_run, MAX (cp_index_max_runs (is_head_tail (self), n_documents), 1));

  for (int r = 0; r < cp_size; r++)
    {
      gsize n_runs = cp_index_rank_runs (is_head_tail (self), cp_size, r,
                                         bounds, n_documents, rank_runs);

      self->first_run[r] = runs->len;
      g_array_append_vals (runs, rank_runs, (guint) n_runs);
      self->local_len[r] = cp_index_runs_length (rank_runs, n_runs);
      self->cost[r] = cp_index_rank_cost (bounds, n_documents, rank_runs, n_runs);
      if (r > 0)
        self->rank_offset[r] = self->rank_offset[r - 1] + self->local_len[r - 1];
    }
  self->first_run[cp_size] = runs->len;
  self->runs = (cp_index_run *) g_array_steal (runs, NULL);
  self->fingerprint = compute_fingerprint (self);
  return self;
}

/**
 * cp_layout_new:
 * @balance: how to split the sequence
 * @seq_len: the global sequence length, a multiple of 2·@cp_size for
 *   %CP_LOAD_BALANCE_HEAD_TAIL or of @cp_size for
 *   %CP_LOAD_BALANCE_CONTIGUOUS
 * @cp_size: the number of ranks in the context-parallel group
 * @error: return location for a #GError
 *
 * Creates the layout of one sequence over @cp_size ranks.
 *
 * Returns: (transfer full): a new layout, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE naming the length and the divisor when
 *   @seq_len does not divide, or %CP_TENSOR_ERROR_OUT_OF_RANGE for a bad
 *   @cp_size
 *
 * Since: 1.0
 */
CpLayout *
cp_layout_new (CpLoadBalance   balance,
               gint64          seq_len,
               int             cp_size,
               GError        **error)
{
  gint64 bounds[2] = { 0, seq_len };
  gint64 divisor;

  g_return_val_if_fail (balance == CP_LOAD_BALANCE_HEAD_TAIL ||
                        balance == CP_LOAD_BALANCE_CONTIGUOUS, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!check_cp_size (cp_size, error))
    return NULL;
  divisor = balance == CP_LOAD_BALANCE_HEAD_TAIL ? 2 * (gint64) cp_size : cp_size;
  if (seq_len < 0 || seq_len % divisor != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "sequence length %" G_GINT64_FORMAT " is not a non-negative multiple of %"
                   G_GINT64_FORMAT " (%s over cp_size %d); pad it first",
                   seq_len, divisor,
                   balance == CP_LOAD_BALANCE_HEAD_TAIL ? "2·C head-tail chunks" : "C chunks",
                   cp_size);
      return NULL;
    }
  return layout_build (balance, cp_size, bounds, 1);
}

static gboolean
check_thd_bounds (const gint64  *bounds,
                  gsize          n_bounds,
                  int            cp_size,
                  GError       **error)
{
  gint64 divisor = 2 * (gint64) cp_size;

  if (n_bounds < 2 || n_bounds > G_MAXUINT)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "cu_seqlens_padded needs at least 2 entries, %" G_GSIZE_FORMAT " were given",
                   n_bounds);
      return FALSE;
    }
  if (bounds[0] != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                   "cu_seqlens_padded must start at 0, not %" G_GINT64_FORMAT, bounds[0]);
      return FALSE;
    }
  for (gsize i = 1; i < n_bounds; i++)
    {
      gint64 length;

      /* Checked first: the length of a decreasing pair can overflow. */
      if (bounds[i] < bounds[i - 1])
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "cu_seqlens_padded decreases at entry %" G_GSIZE_FORMAT ": %"
                       G_GINT64_FORMAT " after %" G_GINT64_FORMAT,
                       i, bounds[i], bounds[i - 1]);
          return FALSE;
        }
      length = bounds[i] - bounds[i - 1];
      if (length % divisor != 0)
        {
          g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_SHAPE,
                       "document %" G_GSIZE_FORMAT " has padded length %" G_GINT64_FORMAT
                       ", not a multiple of %" G_GINT64_FORMAT " (2·C for cp_size %d)",
                       i - 1, length, divisor, cp_size);
          return FALSE;
        }
    }
  return TRUE;
}

/**
 * cp_layout_new_thd:
 * @cu_seqlens_padded: (array length=n_bounds): the cumulative padded
 *   document lengths: 0, then the end of each document
 * @n_bounds: the number of entries, one more than the number of documents
 * @cp_size: the number of ranks in the context-parallel group
 * @error: return location for a #GError
 *
 * Creates the per-document head-tail layout of packed documents: each
 * document is split into 2·@cp_size chunks and rank r holds its chunks r
 * and 2·C−1−r, documents in order — the partition of Transformer Engine's
 * `thd_get_partitioned_indices`.
 *
 * Returns: (transfer full): a new layout, or %NULL with
 *   %CP_TENSOR_ERROR_SHAPE when the bounds do not start at 0, decrease, or
 *   a document length is not a multiple of 2·@cp_size
 *
 * Since: 1.0
 */
CpLayout *
cp_layout_new_thd (const gint64  *cu_seqlens_padded,
                   gsize          n_bounds,
                   int            cp_size,
                   GError       **error)
{
  g_return_val_if_fail (cu_seqlens_padded != NULL || n_bounds == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!check_cp_size (cp_size, error) ||
      !check_thd_bounds (cu_seqlens_padded, n_bounds, cp_size, error))
    return NULL;
  return layout_build (CP_LOAD_BALANCE_HEAD_TAIL, cp_size,
                       cu_seqlens_padded, (guint) n_bounds - 1);
}

/**
 * cp_layout_new_thd_from_tensor:
 * @cu_seqlens_padded: a 1-D int32 or int64 tensor of cumulative padded
 *   document lengths
 * @cp_size: the number of ranks in the context-parallel group
 * @error: return location for a #GError
 *
 * Like [ctor@Cp.Layout.new_thd], with the bounds in a tensor.
 *
 * Returns: (transfer full): a new layout, or %NULL with an error;
 *   %CP_TENSOR_ERROR_DTYPE when the tensor is not int32 or int64
 *
 * Since: 1.0
 */
CpLayout *
cp_layout_new_thd_from_tensor (CpTensor  *cu_seqlens_padded,
                               int        cp_size,
                               GError   **error)
{
  CpDType dtype;
  gint64 n;
  g_autofree gint64 *bounds = NULL;
  g_autoptr(CpTensor) host = NULL;
  gconstpointer values;

  g_return_val_if_fail (CP_IS_TENSOR (cu_seqlens_padded), NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  dtype = cp_tensor_get_dtype (cu_seqlens_padded);
  if ((dtype != CP_DTYPE_INT32 && dtype != CP_DTYPE_INT64) ||
      cp_tensor_get_n_dims (cu_seqlens_padded) != 1)
    {
      g_autofree char *description = cp_tensor_describe (cu_seqlens_padded);

      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DTYPE,
                   "cu_seqlens_padded must be a 1-D int32 or int64 tensor, not %s", description);
      return NULL;
    }
  /* The bounds are few: they cross to the host in one copy, or none when
   * they are there already. */
  host = cp_tensor_to_device (cu_seqlens_padded, CP_DEVICE_KIND_HOST, error);
  if (host == NULL)
    return NULL;
  n = cp_tensor_get_numel (host);
  values = cp_tensor_get_data (host);
  bounds = g_new (gint64, MAX (n, 1));
  for (gint64 i = 0; i < n; i++)
    bounds[i] = dtype == CP_DTYPE_INT32 ? ((const gint32 *) values)[i] : ((const gint64 *) values)[i];
  return cp_layout_new_thd (bounds, (gsize) n, cp_size, error);
}

/**
 * cp_layout_ref:
 * @self: a layout
 *
 * Takes a reference on @self.
 *
 * Returns: (transfer full): @self
 *
 * Since: 1.0
 */
CpLayout *
cp_layout_ref (CpLayout *self)
{
  g_return_val_if_fail (self != NULL, NULL);

  g_atomic_ref_count_inc (&self->ref_count);
  return self;
}

/**
 * cp_layout_unref:
 * @self: (transfer full): a layout
 *
 * Drops a reference on @self.
 *
 * Since: 1.0
 */
void
cp_layout_unref (CpLayout *self)
{
  g_return_if_fail (self != NULL);

  if (!g_atomic_ref_count_dec (&self->ref_count))
    return;
  g_free (self->bounds);
  g_free (self->runs);
  g_free (self->first_run);
  g_free (self->local_len);
  g_free (self->rank_offset);
  g_free (self->cost);
  g_free (self);
}

/**
 * cp_layout_get_balance:
 * @self: a layout
 *
 * Gets how @self splits sequences.
 *
 * Returns: the load-balancing scheme
 *
 * Since: 1.0
 */
CpLoadBalance
cp_layout_get_balance (CpLayout *self)
{
  g_return_val_if_fail (self != NULL, CP_LOAD_BALANCE_HEAD_TAIL);

  return self->balance;
}

/**
 * cp_layout_get_seq_len:
 * @self: a layout
 *
 * Gets the global (padded) sequence length, all documents together.
 *
 * Returns: the number of positions
 *
 * Since: 1.0
 */
gint64
cp_layout_get_seq_len (CpLayout *self)
{
  g_return_val_if_fail (self != NULL, 0);

  return self->seq_len;
}

/**
 * cp_layout_get_cp_size:
 * @self: a layout
 *
 * Gets the number of ranks the layout splits over.
 *
 * Returns: the context-parallel size
 *
 * Since: 1.0
 */
int
cp_layout_get_cp_size (CpLayout *self)
{
  g_return_val_if_fail (self != NULL, 0);

  return self->cp_size;
}

/**
 * cp_layout_get_n_documents:
 * @self: a layout
 *
 * Gets the number of documents: 1 for [ctor@Cp.Layout.new].
 *
 * Returns: the number of documents
 *
 * Since: 1.0
 */
guint
cp_layout_get_n_documents (CpLayout *self)
{
  g_return_val_if_fail (self != NULL, 0);

  return self->n_documents;
}

#define RETURN_IF_BAD_RANK(self, rank, val) \
  g_return_val_if_fail ((rank) >= 0 && (rank) < (self)->cp_size, val)

/* A row of cp_layout_get_chunks() is a cp_index_run: start, then length. */
G_STATIC_ASSERT (sizeof (cp_index_run) == 2 * sizeof (gint64));

/**
 * cp_layout_get_local_len:
 * @self: a layout
 * @rank: a rank in `[0, cp_size)`
 *
 * Gets how many positions @rank holds.
 *
 * A rank outside `[0, cp_size)` is a programmer error, as for the other
 * getters that take a rank ([method@Cp.Layout.get_local_indices],
 * [method@Cp.Layout.get_chunks]): the ranks of a layout are those of the
 * mesh it was made for, never data read at run time. It is reported with
 * a critical naming the check, and 0 is returned. Calls that take a rank
 * from their caller's data, such as [method@Cp.Layout.shard], check it
 * and fail with %CP_TENSOR_ERROR_OUT_OF_RANGE instead.
 *
 * Returns: the local sequence length
 *
 * Since: 1.0
 */
gint64
cp_layout_get_local_len (CpLayout *self,
                         int       rank)
{
  g_return_val_if_fail (self != NULL, 0);
  RETURN_IF_BAD_RANK (self, rank, 0);

  return self->local_len[rank];
}

const cp_index_run *
_cp_layout_get_runs (CpLayout *self,
                     int       rank,
                     guint    *n_runs)
{
  *n_runs = self->first_run[rank + 1] - self->first_run[rank];
  /* An empty sequence has no runs at all, and no run table to point into. */
  return *n_runs > 0 ? self->runs + self->first_run[rank] : NULL;
}

gint64
_cp_layout_get_rank_offset (CpLayout *self,
                            int       rank)
{
  return self->rank_offset[rank];
}

gint64
_cp_layout_get_first_position (CpLayout *self)
{
  return self->bounds[0];
}

/**
 * cp_layout_get_local_indices:
 * @self: a layout
 * @rank: a rank in `[0, cp_size)`
 *
 * Gets the global positions @rank holds, in local order.
 *
 * Returns: (transfer full): a 1-D int64 tensor of length
 *   [method@Cp.Layout.get_local_len]
 *
 * Since: 1.0
 */
CpTensor *
cp_layout_get_local_indices (CpLayout *self,
                             int       rank)
{
  CpTensor *indices;
  const cp_index_run *runs;
  guint n_runs;

  g_return_val_if_fail (self != NULL, NULL);
  RETURN_IF_BAD_RANK (self, rank, NULL);

  indices = _cp_tensor_new_uninit (CP_DTYPE_INT64, &self->local_len[rank], 1, NULL);
  g_return_val_if_fail (indices != NULL, NULL);
  runs = _cp_layout_get_runs (self, rank, &n_runs);
  cp_index_runs_positions (runs, n_runs, cp_tensor_get_data (indices));
  return indices;
}

/**
 * cp_layout_get_chunks:
 * @self: a layout
 * @rank: a rank in `[0, cp_size)`
 *
 * Gets the chunks @rank holds, in local order, each as its first global
 * position and its length: for a head-tail layout two rows per document,
 * its head chunk then its tail chunk, documents in order; for a contiguous
 * layout one row. Unlike the runs of [method@Cp.Layout.get_local_indices],
 * chunks that touch stay apart (rank C−1's head and tail chunks are
 * neighbours), so the head-tail structure stays visible; an empty
 * document gives rows of length 0. For C = 4 and S = 16, rank 3 holds
 * `[[6, 2], [8, 2]]`.
 *
 * Returns: (transfer full): an int64 tensor of shape
 *   `[chunks per document × n_documents, 2]`
 *
 * Since: 1.0
 */
CpTensor *
cp_layout_get_chunks (CpLayout *self,
                      int       rank)
{
  CpTensor *chunks;
  cp_index_run *rows;
  gint64 shape[2];

  g_return_val_if_fail (self != NULL, NULL);
  RETURN_IF_BAD_RANK (self, rank, NULL);

  shape[0] = chunks_per_document (self) * (gint64) self->n_documents;
  shape[1] = 2;
  chunks = _cp_tensor_new_uninit (CP_DTYPE_INT64, shape, 2, NULL);
  g_return_val_if_fail (chunks != NULL, NULL);
  rows = cp_tensor_get_data (chunks);
  for (guint d = 0; d < self->n_documents; d++)
    cp_index_document_chunks (is_head_tail (self), self->cp_size, rank,
                              self->bounds[d], self->bounds[d + 1],
                              rows + (gsize) d * chunks_per_document (self));
  return chunks;
}

/**
 * cp_layout_get_restore_indices:
 * @self: a layout
 *
 * Gets the permutation that restores global order from the rank-order
 * concatenation of every rank's piece (what an all-gather produces):
 * element i is where global position i sits in that concatenation, so
 * `gathered[restore]` is the sequence in order. For C = 2, S = 8 the
 * concatenation holds positions `[0, 1, 6, 7, 2, 3, 4, 5]` and the
 * restore indices are `[0, 1, 4, 5, 6, 7, 2, 3]`.
 *
 * Returns: (transfer full): a 1-D int64 tensor of length
 *   [method@Cp.Layout.get_seq_len]
 *
 * Since: 1.0
 */
CpTensor *
cp_layout_get_restore_indices (CpLayout *self)
{
  CpTensor *restore;
  gint64 *out;
  gint64 gathered = 0;

  g_return_val_if_fail (self != NULL, NULL);

  restore = _cp_tensor_new_uninit (CP_DTYPE_INT64, &self->seq_len, 1, NULL);
  g_return_val_if_fail (restore != NULL, NULL);
  out = cp_tensor_get_data (restore);
  for (guint i = 0; i < self->first_run[self->cp_size]; i++)
    for (gint64 p = 0; p < self->runs[i].length; p++)
      out[self->runs[i].start - self->bounds[0] + p] = gathered++;
  return restore;
}

/**
 * cp_layout_get_cost:
 * @self: a layout
 * @rank: a rank in `[0, cp_size)`
 *
 * Gets the causal-attention work of @rank: the number of (query, key)
 * pairs its positions attend to, each position p of a document starting at
 * s attending to p − s + 1 keys.
 *
 * Returns: the work, in query-key pairs
 *
 * Since: 1.0
 */
double
cp_layout_get_cost (CpLayout *self,
                    int       rank)
{
  g_return_val_if_fail (self != NULL, 0.0);
  RETURN_IF_BAD_RANK (self, rank, 0.0);

  return self->cost[rank];
}

/**
 * cp_layout_get_imbalance:
 * @self: a layout
 *
 * Gets the maximum per-rank causal cost divided by the mean: exactly 1 for
 * head-tail, (2·C−1)/C for contiguous chunks.
 *
 * Returns: the imbalance, at least 1
 *
 * Since: 1.0
 */
double
cp_layout_get_imbalance (CpLayout *self)
{
  double max = 0.0;
  double sum = 0.0;

  g_return_val_if_fail (self != NULL, 1.0);

  for (int r = 0; r < self->cp_size; r++)
    {
      max = MAX (max, self->cost[r]);
      sum += self->cost[r];
    }
  return sum > 0.0 ? max / (sum / self->cp_size) : 1.0;
}

/**
 * cp_layout_fingerprint:
 * @self: a layout
 *
 * Gets a hash of everything that defines the layout (scheme, cp size,
 * document bounds), the same on every host and every run. Ranks compare
 * fingerprints before they shard so that they never run with different
 * layouts.
 *
 * Returns: the fingerprint
 *
 * Since: 1.0
 */
guint64
cp_layout_fingerprint (CpLayout *self)
{
  g_return_val_if_fail (self != NULL, 0);

  return self->fingerprint;
}

/**
 * cp_layout_dup_fingerprint_hex:
 * @self: a layout
 *
 * Gets [method@Cp.Layout.fingerprint] as 16 lower-case hexadecimal digits,
 * for languages whose numbers cannot hold 64 bits exactly (JavaScript).
 *
 * Returns: (transfer full): the fingerprint in hexadecimal
 *
 * Since: 1.0
 */
char *
cp_layout_dup_fingerprint_hex (CpLayout *self)
{
  g_return_val_if_fail (self != NULL, NULL);

  return g_strdup_printf ("%016" G_GINT64_MODIFIER "x", self->fingerprint);
}

/**
 * cp_layout_equal:
 * @self: a layout
 * @other: another layout
 *
 * Compares two layouts.
 *
 * Returns: %TRUE when both assign the same positions to the same ranks
 *   under the same scheme
 *
 * Since: 1.0
 */
gboolean
cp_layout_equal (CpLayout *self,
                 CpLayout *other)
{
  g_return_val_if_fail (self != NULL, FALSE);
  g_return_val_if_fail (other != NULL, FALSE);

  return self->balance == other->balance &&
         self->cp_size == other->cp_size &&
         self->n_documents == other->n_documents &&
         memcmp (self->bounds, other->bounds, (self->n_documents + 1) * sizeof (gint64)) == 0;
}
