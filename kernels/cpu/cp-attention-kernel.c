/* cp-attention-kernel.c: blocked (flash-attention style) attention on CPU
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "cp-attention-kernel-private.h"
#include "cp-dtype-private.h"

/* Tiles of 128 queries × 128 keys: the shape at which oneDNN's sgemm runs
 * closest to its large-matrix speed on the machines measured (see
 * doc/attention.md), while a tile's working set (Q, K, V, scores: 4 × 64
 * KiB at head dimension 128) stays in a core's L2. */
#define TILE_Q 128
#define TILE_K 128

/* The elementwise loops (exp, max, rescale) are compiled for the baseline
 * and for x86-64-v3 (AVX2 + FMA); the loader picks the best one.  Not
 * under ThreadSanitizer: the loader runs the resolvers of the clones
 * while it relocates the library, before the sanitizer's runtime is set
 * up, and the instrumented resolvers crash there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
# define VECTOR_CLONES __attribute__((target_clones ("arch=x86-64-v3", "default")))
#else
# define VECTOR_CLONES
#endif

typedef struct
{
  guint run;
  gint64 offset;   /* within the run */
  gint64 length;
} Tile;

static inline gsize
type_size (CpAttnType type)
{
  return type == CP_ATTN_BFLOAT16 ? 2 : 4;
}

static inline gpointer
view_at (const CpAttnView *view,
         gsize             element_size,
         int               b,
         int               h,
         gint64            row)
{
  return (guint8 *) view->data + element_size * ((gsize) b * view->batch_stride +
                                                 (gsize) h * view->head_stride +
                                                 (gsize) row * view->row_stride);
}

/* A row of Q, K, V or dout. */
static inline gconstpointer
operand_row (const CpAttnProblem *p,
             const CpAttnView    *view,
             int                  b,
             int                  h,
             gint64               row)
{
  return view_at (view, type_size (p->type), b, h, row);
}

/* A row of a float32 output or accumulator. */
static inline float *
float_row (const CpAttnView *view,
           int               b,
           int               h,
           gint64            row)
{
  return view_at (view, sizeof (float), b, h, row);
}

static inline gsize
row_index (const CpAttnProblem *p,
           int                  b,
           int                  h,
           gint64               row)
{
  return ((gsize) b * (gsize) p->n_heads + (gsize) h) * (gsize) p->q_rows + (gsize) row;
}

static inline gint64
real_end (const CpAttnProblem *p,
          int                  b,
          guint                doc)
{
  return p->real_end[(gsize) b * p->n_docs + doc];
}

/* The real (unpadded) part of @length rows starting at @pos. */
static inline gint64
clip_to_real (gint64 pos,
              gint64 length,
              gint64 end)
{
  return CLAMP (end - pos, 0, length);
}

/* Cephes' expf: range reduction by ln 2 and a degree-6 polynomial, about
 * 1 ulp; written so that it vectorises.  Arguments below the smallest
 * normal result (masked scores are −inf) give exactly 0, +inf gives +inf
 * and NaN gives NaN, as expf does. */
static inline float
exp_approx (float x)
{
  float n, r, y, scale, clamped;
  gint32 bits;

  if (x < -87.0f)
    return 0.0f;
  clamped = x > 88.0f ? 88.0f : x;
  n = floorf (clamped * 1.44269504088896341f + 0.5f);
  r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  /* A NaN argument stays NaN in y; the exponent must still be built from
   * an integer, since converting NaN to one is undefined. */
  n = n == n ? n : 0.0f;
  bits = ((gint32) n + 127) << 23;
  memcpy (&scale, &bits, sizeof scale);
  return x > 88.7228394f ? INFINITY : y * scale;
}

/* The larger of two scores, NaN if either is: a NaN score makes its row
 * NaN, as in float64, instead of being passed over as smaller. */
static inline float
max_or_nan (float a,
            float b)
{
  return a > b || a != a ? a : b;
}

VECTOR_CLONES static float
row_max (const float *row,
         gint64       n)
{
  float lanes[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                     -INFINITY, -INFINITY, -INFINITY, -INFINITY };
  float best = -INFINITY;
  gint64 j = 0;

  for (; j + 8 <= n; j += 8)
    for (int t = 0; t < 8; t++)
      lanes[t] = max_or_nan (lanes[t], row[j + t]);
  for (; j < n; j++)
    best = max_or_nan (best, row[j]);
  for (int t = 0; t < 8; t++)
    best = max_or_nan (best, lanes[t]);
  return best;
}

/* row ← exp (row − shift); returns the sum of the new row. */
VECTOR_CLONES static float
exp_shifted (float   *row,
             gint64   n,
             float    shift)
{
  float sum = 0.0f;

  for (gint64 j = 0; j < n; j++)
    {
      row[j] = exp_approx (row[j] - shift);
      sum += row[j];
    }
  return sum;
}

VECTOR_CLONES static void
scale_row (float  *row,
           gint64  n,
           float   factor)
{
  for (gint64 j = 0; j < n; j++)
    row[j] *= factor;
}

static void
store_rows (float       *dst,
            gsize        dst_stride,
            const float *src,
            gint64       rows,
            gint64       n)
{
  for (gint64 i = 0; i < rows; i++)
    memcpy (dst + (gsize) i * dst_stride, src + (gsize) i * (gsize) n, (gsize) n * sizeof (float));
}

static void
zero_rows (float  *dst,
           gsize   dst_stride,
           gint64  rows,
           gint64  n)
{
  for (gint64 i = 0; i < rows; i++)
    memset (dst + (gsize) i * dst_stride, 0, (gsize) n * sizeof (float));
}

/* dS = P ∘ (dP − delta) for one row, in place in @dp. */
VECTOR_CLONES static void
softmax_grad_row (const float *p,
                  float       *dp,
                  gint64       n,
                  float        delta)
{
  for (gint64 j = 0; j < n; j++)
    dp[j] = p[j] * (dp[j] - delta);
}

/* The probabilities (or score gradients) of a tile as a GEMM input: the
 * float32 tile itself, or its bfloat16 rounding in @scratch, as flash
 * attention rounds P before P·V. */
static gconstpointer
tile_operand (const CpAttnProblem *p,
              const float         *tile,
              gint64               rows,
              gint64               cols,
              guint16             *scratch)
{
  if (p->type == CP_ATTN_FLOAT32)
    return tile;
  for (gint64 i = 0; i < rows; i++)
    for (gint64 j = 0; j < cols; j++)
      scratch[i * TILE_K + j] = _cp_float_to_bf16 (tile[i * TILE_K + j]);
  return scratch;
}

/* Sets the entries of keys after the query to @value: the tile's query i
 * sits at key offset @diagonal + i. */
static void
mask_causal (float  *tile,
             gint64  rows,
             gint64  cols,
             gint64  diagonal,
             float   value)
{
  for (gint64 i = 0; i < rows; i++)
    for (gint64 j = MAX (diagonal + i + 1, 0); j < cols; j++)
      tile[i * TILE_K + j] = value;
}

static inline float
operand_value (const CpAttnProblem *p,
               gconstpointer        data,
               gsize                i)
{
  if (p->type == CP_ATTN_BFLOAT16)
    return _cp_bf16_to_float (((const guint16 *) data)[i]);
  return ((const float *) data)[i];
}

/* x · 0 is 0 for every finite x and NaN for ±∞ and NaN. */
VECTOR_CLONES static gboolean
floats_finite (const float *values,
               gint64       n)
{
  float probe = 0.0f;

  for (gint64 j = 0; j < n; j++)
    probe += values[j] * 0.0f;
  return probe == 0.0f;
}

VECTOR_CLONES static gboolean
bfloat16s_finite (const guint16 *values,
                  gint64         n)
{
  guint16 exponent = 0;

  for (gint64 j = 0; j < n; j++)
    exponent |= (values[j] & 0x7f80) == 0x7f80;
  return exponent == 0;
}

/* Whether @rows operand rows of the head dimension, @stride elements
 * apart, hold only finite values. */
static gboolean
rows_finite (const CpAttnProblem *p,
             gconstpointer        data,
             gsize                stride,
             gint64               rows)
{
  for (gint64 i = 0; i < rows; i++)
    {
      gsize at = (gsize) i * stride;
      gboolean finite = p->type == CP_ATTN_BFLOAT16
        ? bfloat16s_finite ((const guint16 *) data + at, p->head_dim)
        : floats_finite ((const float *) data + at, p->head_dim);

      if (!finite)
        return FALSE;
    }
  return TRUE;
}

/* Where a tile lies against the causal mask. */
typedef struct
{
  gboolean masked;
  gint64 diagonal;   /* query i sees key offsets up to diagonal + i */
} Mask;

/* C += alpha · op(tile) · B for a rows × cols tile of probabilities or
 * score gradients (op is the transpose with @transposed) and B of the
 * head dimension.  A GEMM multiplies the hidden pairs of a masked tile
 * too, by their zero: harmless unless B holds ±∞ or NaN, where 0 · ∞
 * would spread NaN to rows that never see it.  Then only the visible
 * pairs (key j ≤ diagonal + query i) are multiplied, one by one, so that
 * non-finite inputs propagate exactly as in attention computed row by
 * row; finite inputs never take that loop. */
static void
tile_product (const CpAttnProblem *p,
              const Mask          *mask,
              gboolean             transposed,
              gint64               rows,
              gint64               cols,
              float                alpha,
              gconstpointer        tile,
              gconstpointer        b,
              gsize                ldb,
              float               *c,
              gsize                ldc)
{
  if (!mask->masked || rows_finite (p, b, ldb, transposed ? rows : cols))
    {
      if (transposed)
        _cp_attn_gemm (p->type, 'T', 'N', cols, p->head_dim, rows, alpha, tile, TILE_K, b, ldb, 1.0f, c, ldc);
      else
        _cp_attn_gemm (p->type, 'N', 'N', rows, p->head_dim, cols, alpha, tile, TILE_K, b, ldb, 1.0f, c, ldc);
      return;
    }
  for (gint64 i = 0; i < rows; i++)
    for (gint64 j = 0; j < MIN (cols, mask->diagonal + i + 1); j++)
      {
        float a = alpha * operand_value (p, tile, (gsize) i * TILE_K + (gsize) j);
        float *dst = c + (gsize) (transposed ? j : i) * ldc;
        gsize src = (gsize) (transposed ? i : j) * ldb;

        for (int d = 0; d < p->head_dim; d++)
          dst[d] += a * operand_value (p, b, src + (gsize) d);
      }
}

/* Splits every run into tiles of at most @size rows. */
static GArray *
split_runs (const CpAttnRun *runs,
            guint            n_runs,
            gint64           size)
{
  GArray *tiles = g_array_new (FALSE, FALSE, sizeof (Tile));

  for (guint r = 0; r < n_runs; r++)
    for (gint64 offset = 0; offset < runs[r].length; offset += size)
      {
        Tile tile = { r, offset, MIN (size, runs[r].length - offset) };

        g_array_append_val (tiles, tile);
      }
  return tiles;
}

/* Whether the key tile at [@kpos, @kpos + @kn) can be seen by queries
 * [@qpos, @qpos + @rows), and whether some of it must be masked. */
static inline gboolean
tile_visible (const CpAttnProblem *p,
              gint64               qpos,
              gint64               rows,
              gint64               kpos,
              gint64               kn,
              Mask                *mask)
{
  if (rows <= 0 || kn <= 0)
    return FALSE;
  if (p->causal && kpos > qpos + rows - 1)
    return FALSE;
  mask->masked = p->causal && kpos + kn - 1 > qpos;
  mask->diagonal = qpos - kpos;
  return TRUE;
}

/* Folds one tile of probabilities into the running softmax of its rows
 * and rescales their accumulated output. */
static void
online_softmax (const CpAttnProblem *p,
                float               *scores,
                gint64               rows,
                gint64               cols,
                float               *m,
                float               *l,
                float               *acc,
                gsize                acc_stride)
{
  for (gint64 i = 0; i < rows; i++)
    {
      float *row = scores + i * TILE_K;
      float m_new = max_or_nan (m[i], row_max (row, cols));
      float alpha;

      if (m_new == -INFINITY)
        {
          memset (row, 0, (gsize) cols * sizeof (float));
          continue;
        }
      alpha = m[i] == -INFINITY ? 0.0f : expf (m[i] - m_new);
      l[i] = l[i] * alpha + exp_shifted (row, cols, m_new);
      m[i] = m_new;
      if (alpha != 1.0f)
        scale_row (acc + (gsize) i * acc_stride, p->head_dim, alpha);
    }
}

/* A query tile of one batch row, placed: its run, first global position
 * and row, and how many of its rows are real (not padding). */
typedef struct
{
  const CpAttnRun *run;
  gint64 pos;
  gint64 row;
  gint64 rows;
} Queries;

static void
place_queries (const CpAttnProblem *p,
               int                  b,
               const Tile          *tile,
               Queries             *q)
{
  q->run = &p->q_runs[tile->run];
  q->pos = q->run->pos + tile->offset;
  q->row = q->run->row + tile->offset;
  q->rows = clip_to_real (q->pos, tile->length, real_end (p, b, q->run->doc));
}

static inline int
kv_head (const CpAttnProblem *p,
         int                  h)
{
  return h / (p->n_heads / p->n_kv_heads);
}

typedef struct
{
  float *scores;     /* TILE_Q × TILE_K: S, then P */
  float *dp;         /* TILE_Q × TILE_K: dP, then dS */
  guint16 *rounded;  /* TILE_Q × TILE_K: P or dS as a bfloat16 GEMM input */
  float *dk;         /* TILE_K × head_dim */
  float *dv;
} Scratch;

static void
scratch_init (Scratch  *s,
              int       head_dim,
              gboolean  backward)
{
  gsize tile = (gsize) TILE_Q * TILE_K;
  gsize rows = (gsize) TILE_K * head_dim;

  s->scores = g_new (float, tile);
  s->rounded = g_new (guint16, tile);
  s->dp = backward ? g_new (float, tile) : NULL;
  s->dk = backward ? g_new (float, rows) : NULL;
  s->dv = backward ? g_new (float, rows) : NULL;
}

static void
scratch_clear (Scratch *s)
{
  g_free (s->scores);
  g_free (s->rounded);
  g_free (s->dp);
  g_free (s->dk);
  g_free (s->dv);
}

static void
forward_tile (const CpAttnProblem *p,
              const CpAttnView    *q,
              const CpAttnKeys    *keys,
              CpAttnState         *state,
              int                  b,
              int                  h,
              const Tile          *tile,
              Scratch             *s)
{
  int hk = kv_head (p, h);
  Queries qt;
  gconstpointer qdata;
  float *acc, *m, *l;

  place_queries (p, b, tile, &qt);
  qdata = operand_row (p, q, b, h, qt.row);
  acc = float_row (&state->acc, b, h, qt.row);
  m = state->m + row_index (p, b, h, qt.row);
  l = state->l + row_index (p, b, h, qt.row);
  for (guint r = 0; r < keys->n_runs; r++)
    {
      const CpAttnRun *krun = &keys->runs[r];
      gint64 klen = clip_to_real (krun->pos, krun->length, real_end (p, b, krun->doc));

      if (krun->doc != qt.run->doc)
        continue;
      for (gint64 k0 = 0; k0 < klen; k0 += TILE_K)
        {
          gint64 kn = MIN (TILE_K, klen - k0);
          Mask mask;

          if (!tile_visible (p, qt.pos, qt.rows, krun->pos + k0, kn, &mask))
            break;  /* later key tiles are later positions */
          _cp_attn_gemm (p->type, 'N', 'T', qt.rows, kn, p->head_dim, p->scale, qdata, q->row_stride,
                         operand_row (p, &keys->k, b, hk, krun->row + k0), keys->k.row_stride,
                         0.0f, s->scores, TILE_K);
          if (mask.masked)
            mask_causal (s->scores, qt.rows, kn, mask.diagonal, -INFINITY);
          online_softmax (p, s->scores, qt.rows, kn, m, l, acc, state->acc.row_stride);
          tile_product (p, &mask, FALSE, qt.rows, kn, 1.0f,
                        tile_operand (p, s->scores, qt.rows, kn, s->rounded),
                        operand_row (p, &keys->v, b, hk, krun->row + k0), keys->v.row_stride,
                        acc, state->acc.row_stride);
        }
    }
}

/* oneDNN runs its GEMMs single-threaded inside an OpenMP parallel
 * region; a region of one thread is not "active", so the thread count is
 * pinned explicitly to keep oneDNN from starting threads of its own. */
static void
pin_gemm_threads (void)
{
  omp_set_num_threads (1);
}

/* One work item, given a thread's scratch. */
typedef void (*ItemFunc) (gint64    item,
                          Scratch  *scratch,
                          gpointer  data);

/* Runs @n_items items over the problem's threads.  Item costs differ
 * under a causal mask, so they are handed out one by one; every item owns
 * the rows it writes, so the result does not depend on the schedule. */
static void
run_items (const CpAttnProblem *p,
           gint64               n_items,
           gboolean             backward,
           ItemFunc             func,
           gpointer             data)
{
#pragma omp parallel num_threads (p->n_threads)
  {
    Scratch s;

    scratch_init (&s, p->head_dim, backward);
    pin_gemm_threads ();
#pragma omp for schedule (dynamic, 1)
    for (gint64 item = 0; item < n_items; item++)
      func (item, &s, data);
    scratch_clear (&s);
  }
}

typedef struct
{
  const CpAttnProblem *p;
  const CpAttnView *q;
  const CpAttnKeys *keys;
  CpAttnState *state;
  GArray *tiles;
} ForwardItems;

/* Item i: query tile i mod n_tiles of (batch, head) i / n_tiles, so that
 * threads working at the same time share the head's keys in cache. */
static void
forward_item (gint64    item,
              Scratch  *s,
              gpointer  data)
{
  ForwardItems *f = data;
  gint64 n_tiles = f->tiles->len;
  gint64 bh = item / n_tiles;

  forward_tile (f->p, f->q, f->keys, f->state, (int) (bh / f->p->n_heads),
                (int) (bh % f->p->n_heads), &g_array_index (f->tiles, Tile, item % n_tiles), s);
}

void
_cp_attn_forward_block (const CpAttnProblem *p,
                        const CpAttnView    *q,
                        const CpAttnKeys    *keys,
                        CpAttnState         *state)
{
  g_autoptr(GArray) tiles = split_runs (p->q_runs, p->n_q_runs, TILE_Q);
  ForwardItems items = { p, q, keys, state, tiles };

  run_items (p, (gint64) p->batch * p->n_heads * tiles->len, FALSE, forward_item, &items);
}

/* One (query tile, key tile) pair of one head: accumulates into the
 * key tile's dK, dV scratch and into the queries' dQ. */
static void
backward_pair (const CpAttnProblem *p,
               const CpAttnGrads   *g,
               const CpAttnKeys    *keys,
               int                  b,
               int                  h,
               const Tile          *qtile,
               const CpAttnRun     *krun,
               gint64               k0,
               gint64               kn,
               Scratch             *s)
{
  int hk = kv_head (p, h);
  gconstpointer kdata = operand_row (p, &keys->k, b, hk, krun->row + k0);
  gconstpointer vdata = operand_row (p, &keys->v, b, hk, krun->row + k0);
  gconstpointer qdata, dout, ds;
  Mask mask;
  Queries qt;
  gint64 rows;
  gsize first;

  place_queries (p, b, qtile, &qt);
  rows = qt.rows;
  if (qt.run->doc != krun->doc || !tile_visible (p, qt.pos, rows, krun->pos + k0, kn, &mask))
    return;
  qdata = operand_row (p, &g->q, b, h, qt.row);
  dout = operand_row (p, &g->dout, b, h, qt.row);
  first = row_index (p, b, h, qt.row);
  _cp_attn_gemm (p->type, 'N', 'T', rows, kn, p->head_dim, p->scale, qdata, g->q.row_stride,
                 kdata, keys->k.row_stride, 0.0f, s->scores, TILE_K);
  if (mask.masked)
    mask_causal (s->scores, rows, kn, mask.diagonal, -INFINITY);
  for (gint64 i = 0; i < rows; i++)
    exp_shifted (s->scores + i * TILE_K, kn, g->lse[first + i]);
  /* Hidden pairs get exactly zero probability and gradient, even in a
   * row whose lse, dP or delta is not finite (exp (−∞ − NaN) is NaN). */
  if (mask.masked)
    mask_causal (s->scores, rows, kn, mask.diagonal, 0.0f);
  tile_product (p, &mask, TRUE, rows, kn, 1.0f, tile_operand (p, s->scores, rows, kn, s->rounded),
                dout, g->dout.row_stride, s->dv, p->head_dim);
  _cp_attn_gemm (p->type, 'N', 'T', rows, kn, p->head_dim, 1.0f, dout, g->dout.row_stride,
                 vdata, keys->v.row_stride, 0.0f, s->dp, TILE_K);
  for (gint64 i = 0; i < rows; i++)
    softmax_grad_row (s->scores + i * TILE_K, s->dp + i * TILE_K, kn, g->delta[first + i]);
  if (mask.masked)
    mask_causal (s->dp, rows, kn, mask.diagonal, 0.0f);
  ds = tile_operand (p, s->dp, rows, kn, s->rounded);
  tile_product (p, &mask, TRUE, rows, kn, p->scale, ds, qdata, g->q.row_stride, s->dk, p->head_dim);
  tile_product (p, &mask, FALSE, rows, kn, p->scale, ds, kdata, keys->k.row_stride,
                float_row (&g->dq, b, h, qt.row), g->dq.row_stride);
}

/* Everything of one batch row and one key/value head: the key tiles
 * outside, the heads sharing them and the query tiles inside.  The item
 * owns the dK, dV rows of its head and the dQ rows of its query heads,
 * so no two threads write the same row and the sums run in a fixed
 * order.  Every dK, dV row of @keys is written exactly once, so the
 * caller need not clear them. */
static void
backward_item (const CpAttnProblem *p,
               const CpAttnGrads   *g,
               const CpAttnKeys    *keys,
               const CpAttnView    *dk,
               const CpAttnView    *dv,
               int                  b,
               int                  hk,
               GArray              *qtiles,
               Scratch             *s)
{
  int group = p->n_heads / p->n_kv_heads;
  gsize tile_bytes = (gsize) TILE_K * p->head_dim * sizeof (float);

  for (guint r = 0; r < keys->n_runs; r++)
    {
      const CpAttnRun *krun = &keys->runs[r];
      gint64 klen = clip_to_real (krun->pos, krun->length, real_end (p, b, krun->doc));

      for (gint64 k0 = 0; k0 < klen; k0 += TILE_K)
        {
          gint64 kn = MIN (TILE_K, klen - k0);

          memset (s->dk, 0, tile_bytes);
          memset (s->dv, 0, tile_bytes);
          for (int h = hk * group; h < (hk + 1) * group; h++)
            for (guint t = 0; t < qtiles->len; t++)
              backward_pair (p, g, keys, b, h, &g_array_index (qtiles, Tile, t), krun, k0, kn, s);
          store_rows (float_row (dk, b, hk, krun->row + k0), dk->row_stride, s->dk, kn, p->head_dim);
          store_rows (float_row (dv, b, hk, krun->row + k0), dv->row_stride, s->dv, kn, p->head_dim);
        }
      /* Padding keys are never attended: their gradient is zero. */
      zero_rows (float_row (dk, b, hk, krun->row + klen), dk->row_stride, krun->length - klen, p->head_dim);
      zero_rows (float_row (dv, b, hk, krun->row + klen), dv->row_stride, krun->length - klen, p->head_dim);
    }
}

typedef struct
{
  const CpAttnProblem *p;
  const CpAttnGrads *g;
  const CpAttnKeys *keys;
  const CpAttnView *dk;
  const CpAttnView *dv;
  GArray *qtiles;
} BackwardItems;

static void
backward_run_item (gint64    item,
                   Scratch  *s,
                   gpointer  data)
{
  BackwardItems *w = data;

  backward_item (w->p, w->g, w->keys, w->dk, w->dv, (int) (item / w->p->n_kv_heads),
                 (int) (item % w->p->n_kv_heads), w->qtiles, s);
}

void
_cp_attn_backward_block (const CpAttnProblem *p,
                         const CpAttnGrads   *g,
                         const CpAttnKeys    *keys,
                         const CpAttnView    *dk,
                         const CpAttnView    *dv)
{
  g_autoptr(GArray) qtiles = split_runs (p->q_runs, p->n_q_runs, TILE_Q);
  BackwardItems items = { p, g, keys, dk, dv, qtiles };

  run_items (p, (gint64) p->batch * p->n_kv_heads, TRUE, backward_run_item, &items);
}

int
_cp_attn_default_threads (int ranks_in_process)
{
  return MAX (1, (int) g_get_num_processors () / MAX (ranks_in_process, 1));
}
