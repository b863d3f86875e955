/* test-layout-svg.c: cp_layout_to_svg(), read back as XML
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

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

typedef struct
{
  gboolean saw_svg;
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
  else if (g_str_equal (element, "line") && g_str_equal (class, "document-bound"))
    picture->n_document_bounds++;
}

static void
picture_clear (Picture *picture)
{
  g_clear_pointer (&picture->chunks, g_ptr_array_unref);
  g_clear_pointer (&picture->hatches, g_ptr_array_unref);
  g_clear_pointer (&picture->costs, g_hash_table_unref);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Picture, picture_clear)

/* Parses the whole document: GMarkup refuses anything not well-formed. */
static void
read_picture (CpLayout *layout,
              Picture  *picture)
{
  const GMarkupParser parser = { .start_element = start_element };
  g_autofree char *svg = cp_layout_to_svg (layout);
  g_autoptr(GMarkupParseContext) context = NULL;
  g_autoptr(GError) error = NULL;

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

  return g_test_run ();
}
