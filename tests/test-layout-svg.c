/* test-layout-svg.c: cp_layout_to_svg(), read back as XML
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <math.h>
#include <string.h>

#include "cp-test-util.h"

/* What the picture says, element by element. */
typedef struct
{
  int rank;
  gint64 document;
  gint64 start;
  gint64 length;
  char *part;            /* "head", "tail" or "whole" */
  char *fill;
  char *x;
  char *width;
} Chunk;

typedef struct
{
  char *fill;
  char *cost;
} Cost;

/* A summary column run, or a work bar of a group of ranks. */
typedef struct
{
  int rank;
  gint64 start;          /* summary: first position */
  gint64 length;         /* summary: positions; group: the last rank */
  gint64 first_rank;     /* group */
  char *cost;            /* group */
  char *fill;
} Summary;

typedef struct
{
  gboolean saw_svg;
  GPtrArray *summaries;  /* Summary, class "summary", in order */
  GPtrArray *groups;     /* Summary, class "cost-group", in order */
  GPtrArray *chunks;     /* Chunk, in document order */
  GPtrArray *hatches;    /* "x width" of each hatch overlay */
  GHashTable *costs;     /* rank → Cost */
  guint n_document_bounds;
} Picture;

static void
chunk_free (Chunk *chunk)
{
  g_free (chunk->part);
  g_free (chunk->fill);
  g_free (chunk->x);
  g_free (chunk->width);
  g_free (chunk);
}

static void
summary_free (Summary *summary)
{
  g_free (summary->cost);
  g_free (summary->fill);
  g_free (summary);
}

static void
cost_free (Cost *cost)
{
  g_free (cost->fill);
  g_free (cost->cost);
  g_free (cost);
}

static const char *
attribute (const char **names,
           const char **values,
           const char  *name)
{
  for (gsize i = 0; names[i] != NULL; i++)
    if (g_str_equal (names[i], name))
      return values[i];
  return NULL;
}

static gint64
integer_attribute (const char **names,
                   const char **values,
                   const char  *name)
{
  const char *value = attribute (names, values, name);
  gint64 number;

  g_assert_nonnull (value);
  g_assert_true (g_ascii_string_to_signed (value, 10, G_MININT64, G_MAXINT64, &number, NULL));
  return number;
}

static void
read_chunk (Picture     *picture,
            const char  *class,
            const char **names,
            const char **values)
{
  Chunk *chunk = g_new0 (Chunk, 1);

  chunk->rank = (int) integer_attribute (names, values, "data-rank");
  chunk->document = integer_attribute (names, values, "data-document");
  chunk->start = integer_attribute (names, values, "data-start");
  chunk->length = integer_attribute (names, values, "data-length");
  chunk->part = g_strdup (class + strlen ("chunk "));
  chunk->fill = g_strdup (attribute (names, values, "fill"));
  chunk->x = g_strdup (attribute (names, values, "x"));
  chunk->width = g_strdup (attribute (names, values, "width"));
  g_ptr_array_add (picture->chunks, chunk);
}

static void
read_cost (Picture     *picture,
           const char **names,
           const char **values)
{
  Cost *cost = g_new0 (Cost, 1);
  int rank = (int) integer_attribute (names, values, "data-rank");

  cost->fill = g_strdup (attribute (names, values, "fill"));
  cost->cost = g_strdup (attribute (names, values, "data-cost"));
  g_assert_false (g_hash_table_contains (picture->costs, GINT_TO_POINTER (rank)));
  g_hash_table_insert (picture->costs, GINT_TO_POINTER (rank), cost);
}

static void
read_summary (GPtrArray    *into,
              gboolean      group,
              const char  **names,
              const char  **values)
{
  Summary *summary = g_new0 (Summary, 1);

  summary->rank = (int) integer_attribute (names, values, "data-rank");
  summary->fill = g_strdup (attribute (names, values, "fill"));
  if (group)
    {
      summary->first_rank = integer_attribute (names, values, "data-first-rank");
      summary->length = integer_attribute (names, values, "data-last-rank");
      summary->cost = g_strdup (attribute (names, values, "data-cost"));
    }
  else
    {
      summary->start = integer_attribute (names, values, "data-start");
      summary->length = integer_attribute (names, values, "data-length");
    }
  g_ptr_array_add (into, summary);
}

static void
start_element (GMarkupParseContext  *context,
               const char           *element,
               const char          **names,
               const char          **values,
               gpointer              user_data,
               GError              **error)
{
  Picture *picture = user_data;
  const char *class = attribute (names, values, "class");

  if (g_str_equal (element, "svg"))
    {
      g_assert_cmpstr (attribute (names, values, "xmlns"), ==, "http://www.w3.org/2000/svg");
      picture->saw_svg = TRUE;
    }
  if (class == NULL)
    return;
  if (g_str_equal (element, "rect") && g_str_has_prefix (class, "chunk "))
    read_chunk (picture, class, names, values);
  else if (g_str_equal (element, "rect") && g_str_equal (class, "hatch"))
    g_ptr_array_add (picture->hatches, g_strdup_printf ("%s %s", attribute (names, values, "x"),
                                                        attribute (names, values, "width")));
  else if (g_str_equal (element, "rect") && g_str_equal (class, "cost"))
    read_cost (picture, names, values);
  else if (g_str_equal (element, "rect") && g_str_equal (class, "summary"))
    read_summary (picture->summaries, FALSE, names, values);
  else if (g_str_equal (element, "rect") && g_str_equal (class, "cost-group"))
    read_summary (picture->groups, TRUE, names, values);
  else if (g_str_equal (element, "line") && g_str_equal (class, "document-bound"))
    picture->n_document_bounds++;
}

static void
picture_clear (Picture *picture)
{
  g_clear_pointer (&picture->chunks, g_ptr_array_unref);
  g_clear_pointer (&picture->summaries, g_ptr_array_unref);
  g_clear_pointer (&picture->groups, g_ptr_array_unref);
  g_clear_pointer (&picture->hatches, g_ptr_array_unref);
  g_clear_pointer (&picture->costs, g_hash_table_unref);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Picture, picture_clear)

/* Parses the whole document: GMarkup refuses anything not well-formed. */
static void
parse_picture (const char *svg,
               Picture    *picture)
{
  const GMarkupParser parser = { .start_element = start_element };
  g_autoptr(GMarkupParseContext) context = NULL;
  g_autoptr(GError) error = NULL;

  picture->summaries = g_ptr_array_new_with_free_func ((GDestroyNotify) summary_free);
  picture->groups = g_ptr_array_new_with_free_func ((GDestroyNotify) summary_free);
  picture->chunks = g_ptr_array_new_with_free_func ((GDestroyNotify) chunk_free);
  picture->hatches = g_ptr_array_new_with_free_func (g_free);
  picture->costs = g_hash_table_new_full (NULL, NULL, NULL, (GDestroyNotify) cost_free);
  g_assert_true (g_str_has_prefix (svg, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg "));
  g_assert_true (g_utf8_validate (svg, -1, NULL));
  context = g_markup_parse_context_new (&parser, G_MARKUP_PREFIX_ERROR_POSITION, picture, NULL);
  g_markup_parse_context_parse (context, svg, -1, &error);
  g_assert_no_error (error);
  g_markup_parse_context_end_parse (context, &error);
  g_assert_no_error (error);
  g_assert_true (picture->saw_svg);
}

static void
read_picture (CpLayout *layout,
              Picture  *picture)
{
  g_autofree char *svg = cp_layout_to_svg (layout);

  parse_picture (svg, picture);
}

static const char *
expected_part (CpLayout *layout,
               gint64    row)
{
  if (cp_layout_get_balance (layout) == CP_LOAD_BALANCE_CONTIGUOUS)
    return "whole";
  return row % 2 == 0 ? "head" : "tail";
}

static gboolean
has_hatch (Picture     *picture,
           const Chunk *chunk)
{
  g_autofree char *key = g_strdup_printf ("%s %s", chunk->x, chunk->width);

  for (guint i = 0; i < picture->hatches->len; i++)
    if (g_str_equal (g_ptr_array_index (picture->hatches, i), key))
      return TRUE;
  return FALSE;
}

/* The chunks drawn for @rank are its chunks, non-empty ones, in order,
 * all in the colour of its cost bar; tail chunks are hatched. */
static void
assert_rank_drawn (CpLayout *layout,
                   Picture  *picture,
                   int       rank,
                   guint    *next)
{
  g_autoptr(CpTensor) chunks = cp_layout_get_chunks (layout, rank);
  const gint64 *rows = cp_tensor_get_data (chunks);
  guint n_per_document = cp_layout_get_balance (layout) == CP_LOAD_BALANCE_CONTIGUOUS ? 1 : 2;
  Cost *cost = g_hash_table_lookup (picture->costs, GINT_TO_POINTER (rank));
  g_autofree char *expected_cost = g_strdup_printf ("%.0f", cp_layout_get_cost (layout, rank));

  g_assert_nonnull (cost);
  g_assert_cmpstr (cost->cost, ==, expected_cost);
  for (gint64 i = 0; i < cp_tensor_get_dim (chunks, 0); i++)
    {
      const Chunk *chunk;

      if (rows[2 * i + 1] == 0)
        continue;
      g_assert_cmpuint (*next, <, picture->chunks->len);
      chunk = g_ptr_array_index (picture->chunks, (*next)++);
      g_assert_cmpint (chunk->rank, ==, rank);
      g_assert_cmpint (chunk->document, ==, i / n_per_document);
      g_assert_cmpint (chunk->start, ==, rows[2 * i]);
      g_assert_cmpint (chunk->length, ==, rows[2 * i + 1]);
      g_assert_cmpstr (chunk->part, ==, expected_part (layout, i));
      g_assert_cmpstr (chunk->fill, ==, cost->fill);
      g_assert_true (has_hatch (picture, chunk) == g_str_equal (chunk->part, "tail"));
    }
}

static void
assert_picture (CpLayout *layout)
{
  g_auto(Picture) picture = { 0 };
  g_autoptr(GHashTable) colours = g_hash_table_new (g_str_hash, g_str_equal);
  int cp_size = cp_layout_get_cp_size (layout);
  guint n_documents = cp_layout_get_n_documents (layout);
  guint next = 0;

  read_picture (layout, &picture);
  for (int r = 0; r < cp_size; r++)
    assert_rank_drawn (layout, &picture, r, &next);
  g_assert_cmpuint (next, ==, picture.chunks->len);
  /* Every rank a colour of its own. */
  for (int r = 0; r < cp_size; r++)
    {
      Cost *cost = g_hash_table_lookup (picture.costs, GINT_TO_POINTER (r));

      g_assert_true (g_hash_table_add (colours, cost->fill));
    }
  g_assert_cmpuint (g_hash_table_size (picture.costs), ==, cp_size);
  g_assert_cmpuint (picture.n_document_bounds, ==, n_documents > 1 ? n_documents - 1 : 0);
}

static void
test_head_tail (void)
{
  for (int cp_size = 1; cp_size <= 8; cp_size++)
    {
      g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 4 * cp_size,
                                                  cp_size, NULL);

      assert_picture (layout);
    }
}

static void
test_contiguous (void)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, 16, 4, NULL);
  g_autofree char *svg = cp_layout_to_svg (layout);

  assert_picture (layout);
  g_assert_null (strstr (svg, "class=\"chunk head\""));
  g_assert_null (strstr (svg, "class=\"hatch\""));
}

/* Packed documents, one of them empty: it has no chunks, but its bound
 * is drawn. */
static void
test_thd (void)
{
  const gint64 bounds[] = { 0, 8, 24, 24, 32 };
  g_autoptr(CpLayout) layout = cp_layout_new_thd (bounds, G_N_ELEMENTS (bounds), 2, NULL);

  assert_picture (layout);
}

/* More ranks than the palette has colours: still one colour each. */
static void
test_many_ranks (void)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 128, 64, NULL);

  assert_picture (layout);
}

static void
test_empty_sequence (void)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 0, 2, NULL);
  g_auto(Picture) picture = { 0 };

  assert_picture (layout);
  read_picture (layout, &picture);
  g_assert_cmpuint (picture.chunks->len, ==, 0);
}

/* The same layout draws the same bytes: the picture is a function of
 * the layout alone. */
static void
test_deterministic (void)
{
  const gint64 bounds[] = { 0, 8, 24, 32 };
  g_autoptr(CpLayout) a = cp_layout_new_thd (bounds, G_N_ELEMENTS (bounds), 2, NULL);
  g_autoptr(CpLayout) b = cp_layout_new_thd (bounds, G_N_ELEMENTS (bounds), 2, NULL);
  g_autofree char *svg_a = cp_layout_to_svg (a);
  g_autofree char *svg_b = cp_layout_to_svg (b);

  g_assert_cmpstr (svg_a, ==, svg_b);
}

/* The colours themselves: Tableau 10 for up to ten ranks, then hues
 * evenly around the wheel at saturation and lightness 0.55. */
static const char *const tableau[] = {
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
};
static const char *const eleven_hues[] = {
  "#cb4d4d", "#cb924d", "#c0cb4d", "#7bcb4d", "#4dcb64", "#4dcba9",
  "#4da9cb", "#4d64cb", "#7b4dcb", "#c04dcb", "#cb4d92",
};

static void
assert_colours (int                cp_size,
                const char *const *expected)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_HEAD_TAIL, 2 * cp_size, cp_size, NULL);
  g_auto(Picture) picture = { 0 };

  assert_picture (layout);
  read_picture (layout, &picture);
  for (int r = 0; r < cp_size; r++)
    {
      Cost *cost = g_hash_table_lookup (picture.costs, GINT_TO_POINTER (r));

      g_assert_cmpstr (cost->fill, ==, expected[r]);
    }
}

static void
test_palette_boundary (void)
{
  assert_colours (9, tableau);
  assert_colours (10, tableau);
  assert_colours (11, eleven_hues);
}

/* The rank that holds @position. */
static int
owner_of (CpLayout *layout,
          gint64    position)
{
  for (int r = 0; r < cp_layout_get_cp_size (layout); r++)
    {
      g_autoptr(CpTensor) chunks = cp_layout_get_chunks (layout, r);
      const gint64 *rows = cp_tensor_get_data (chunks);

      for (gint64 i = 0; i < cp_tensor_get_dim (chunks, 0); i++)
        if (position >= rows[2 * i] && position < rows[2 * i] + rows[2 * i + 1])
          return r;
    }
  g_assert_not_reached ();
}

/* @n_documents documents of one position per chunk over @cp_size ranks. */
static CpLayout *
new_fine_layout (guint n_documents,
                 int   cp_size)
{
  g_autofree gint64 *bounds = g_new (gint64, n_documents + 1);

  for (guint d = 0; d <= n_documents; d++)
    bounds[d] = (gint64) d * 2 * cp_size;
  return cp_layout_new_thd (bounds, n_documents + 1, cp_size, NULL);
}

/* 8192 documents over 64 ranks once made a 308 MB picture: now the
 * sequence is summarised in columns that tile it, each run of columns
 * in the colour of the rank holding the middle of its first column. */
static void
test_large_is_summarised (void)
{
  g_autoptr(CpLayout) layout = new_fine_layout (8192, 64);
  g_autofree char *svg = cp_layout_to_svg (layout);
  g_auto(Picture) picture = { 0 };
  g_autofree char *message = NULL;
  gint64 next = 0;

  g_assert_cmpuint (strlen (svg), <, 256 * 1024);
  parse_picture (svg, &picture);
  g_assert_cmpuint (picture.chunks->len, ==, 0);
  g_assert_cmpuint (picture.hatches->len, ==, 0);
  g_assert_cmpuint (picture.n_document_bounds, ==, 0);
  g_assert_nonnull (strstr (svg, "1048576 chunks are too many to draw: each column shows the "
                                 "rank holding its middle position, and document bounds are "
                                 "left out"));
  g_assert_cmpuint (picture.summaries->len, >, 1);
  g_assert_cmpuint (picture.summaries->len, <=, 430);
  for (guint i = 0; i < picture.summaries->len; i++)
    {
      Summary *summary = g_ptr_array_index (picture.summaries, i);
      /* The middle of the first column of the run. */
      gint64 middle = (gint64) ((ceil ((double) summary->start * 430 / 1048576.0) + 0.5) *
                                1048576.0 / 430);
      Cost *cost = g_hash_table_lookup (picture.costs, GINT_TO_POINTER (summary->rank));

      g_assert_cmpint (summary->start, ==, next);
      g_assert_cmpint (summary->length, >, 0);
      g_assert_cmpint (owner_of (layout, middle), ==, summary->rank);
      g_assert_cmpstr (summary->fill, ==, cost->fill);
      next = summary->start + summary->length;
    }
  g_assert_cmpint (next, ==, 1048576);
  /* 64 ranks: each still has its own work bar. */
  g_assert_cmpuint (g_hash_table_size (picture.costs), ==, 64);
  g_assert_cmpuint (picture.groups->len, ==, 0);
  message = g_strdup_printf ("%u bytes, %u runs of columns", (guint) strlen (svg),
                             picture.summaries->len);
  cp_test_record_outcome ("cp_layout_to_svg", "a layout of 8192 documents over 64 ranks",
                          "summarised", message);
}

/* 1024 ranks: 128 work bars of 8 ranks each, drawn for the busiest. */
static void
test_many_ranks_are_grouped (void)
{
  g_autoptr(CpLayout) layout = cp_layout_new (CP_LOAD_BALANCE_CONTIGUOUS, 4096, 1024, NULL);
  g_autofree char *svg = cp_layout_to_svg (layout);
  g_auto(Picture) picture = { 0 };

  /* 1024 chunks, each drawn: the most a picture draws one by one. */
  g_assert_cmpuint (strlen (svg), <, 1024 * 1024);
  parse_picture (svg, &picture);
  g_assert_cmpuint (picture.chunks->len, ==, 1024);
  g_assert_cmpuint (g_hash_table_size (picture.costs), ==, 0);
  g_assert_cmpuint (picture.groups->len, ==, 128);
  for (guint g = 0; g < picture.groups->len; g++)
    {
      Summary *group = g_ptr_array_index (picture.groups, g);
      g_autofree char *cost = NULL;

      g_assert_cmpint (group->first_rank, ==, 8 * g);
      g_assert_cmpint (group->length, ==, 8 * g + 7);
      /* Contiguous: the last rank of a group is the busiest. */
      g_assert_cmpint (group->rank, ==, 8 * g + 7);
      cost = g_strdup_printf ("%.0f", cp_layout_get_cost (layout, group->rank));
      g_assert_cmpstr (group->cost, ==, cost);
    }
  g_assert_nonnull (strstr (svg, "causal attention work per the busiest of each 8 ranks"));
}

int
main (int   argc,
      char *argv[])
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/Cp/Layout/svg/head-tail", test_head_tail);
  g_test_add_func ("/Cp/Layout/svg/contiguous", test_contiguous);
  g_test_add_func ("/Cp/Layout/svg/thd", test_thd);
  g_test_add_func ("/Cp/Layout/svg/many-ranks", test_many_ranks);
  g_test_add_func ("/Cp/Layout/svg/empty-sequence", test_empty_sequence);
  g_test_add_func ("/Cp/Layout/svg/deterministic", test_deterministic);
  g_test_add_func ("/Cp/Layout/svg/palette/boundary", test_palette_boundary);
  g_test_add_func ("/Cp/Layout/svg/large/summarised", test_large_is_summarised);
  g_test_add_func ("/Cp/Layout/svg/large/ranks-grouped", test_many_ranks_are_grouped);

  return g_test_run ();
}
