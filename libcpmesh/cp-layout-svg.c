/* cp-layout-svg.c: a picture of a layout
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>

#include "cp-layout.h"
#include "cp-tensor.h"

/* Where things go, in pixels: the sequence as one bar, every rank's
 * causal work as a bar of its own below it. */
#define WIDTH 960.0
#define LEFT 80.0
#define RIGHT 20.0
#define BAR_WIDTH (WIDTH - LEFT - RIGHT)
#define SEQUENCE_TOP 70.0
#define SEQUENCE_HEIGHT 40.0
#define COST_TOP 160.0
#define COST_ROW 20.0
#define COST_BAR 14.0
#define COST_TEXT_ROOM 170.0

/* Labels go only where they fit. */
#define RANK_LABEL_WIDTH 24.0
#define PART_LABEL_WIDTH 36.0
#define DOCUMENT_LABEL_WIDTH 44.0

/* A picture stays readable, and its size bounded (about a megabyte),
 * whatever the layout: beyond MAX_DRAWN_CHUNKS chunks the sequence bar
 * shows SUMMARY_COLUMNS columns instead, each in the colour of the rank
 * holding its middle position; beyond MAX_DOCUMENT_BOUNDS documents their
 * bounds are left out; beyond MAX_COST_ROWS ranks each work bar stands
 * for a group of consecutive ranks, and shows the busiest of them. */
#define MAX_DRAWN_CHUNKS 1024
#define SUMMARY_COLUMNS 430
#define MAX_DOCUMENT_BOUNDS 256
#define MAX_COST_ROWS 128

/* Ranks 0–9 of up to ten take these (Tableau 10); larger groups spread
 * their hues evenly around the colour wheel. */
static const char *const palette[] = {
  "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
};

/* HSL to RGB, per sector of 60° of hue: the channels that take the
 * chroma and the second-largest component (red 0, green 1, blue 2). */
static const int chroma_channel[6] = { 0, 1, 1, 2, 2, 0 };
static const int second_channel[6] = { 1, 0, 2, 1, 0, 2 };

typedef struct
{
  CpLayout *layout;
  int cp_size;
  gint64 seq_len;
  gboolean head_tail;
  double scale;            /* pixels per position */
  char hatch_id[32];       /* unique per layout, for pages showing several */
  gboolean summarised;     /* columns rather than chunks */
  int ranks_per_row;       /* of the work bars */
  GString *out;
} Svg;

/* How many chunk rows the layout has in all, empty ones included. */
static double
n_chunk_rows (CpLayout *layout)
{
  double per_document = cp_layout_get_balance (layout) == CP_LOAD_BALANCE_HEAD_TAIL ? 2 : 1;

  return per_document * cp_layout_get_n_documents (layout) * cp_layout_get_cp_size (layout);
}

static void
rank_colour (const Svg *svg,
             int        rank,
             char       colour[8])
{
  const double saturation = 0.55, lightness = 0.55;
  double hue, chroma, second, rgb[3] = { 0 };
  int sector;

  if (svg->cp_size <= (int) G_N_ELEMENTS (palette))
    {
      g_strlcpy (colour, palette[rank], 8);
      return;
    }
  hue = 360.0 * rank / svg->cp_size;
  sector = (int) (hue / 60.0);
  chroma = (1.0 - fabs (2.0 * lightness - 1.0)) * saturation;
  second = chroma * (1.0 - fabs (fmod (hue / 60.0, 2.0) - 1.0));
  rgb[chroma_channel[sector]] = chroma;
  rgb[second_channel[sector]] = second;
  g_snprintf (colour, 8, "#%02x%02x%02x",
              (int) ((rgb[0] + lightness - chroma / 2) * 255 + 0.5),
              (int) ((rgb[1] + lightness - chroma / 2) * 255 + 0.5),
              (int) ((rgb[2] + lightness - chroma / 2) * 255 + 0.5));
}

/* Numbers in the C locale: a decimal comma would break the file. */
static const char *
number (char        buffer[G_ASCII_DTOSTR_BUF_SIZE],
        const char *format,
        double      value)
{
  return g_ascii_formatd (buffer, G_ASCII_DTOSTR_BUF_SIZE, format, value);
}

/* A whole rect element, with a tooltip when @title is not %NULL. */
static void
append_rect (Svg        *svg,
             const char *attributes,
             double      x,
             double      y,
             double      width,
             double      height,
             const char *fill,
             const char *title)
{
  char bx[G_ASCII_DTOSTR_BUF_SIZE], by[G_ASCII_DTOSTR_BUF_SIZE];
  char bw[G_ASCII_DTOSTR_BUF_SIZE], bh[G_ASCII_DTOSTR_BUF_SIZE];
  g_autofree char *escaped = title != NULL ? g_markup_escape_text (title, -1) : NULL;

  g_string_append_printf (svg->out, "<rect %s x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\"",
                          attributes, number (bx, "%.3f", x), number (by, "%.3f", y),
                          number (bw, "%.3f", width), number (bh, "%.3f", height), fill);
  if (escaped != NULL)
    g_string_append_printf (svg->out, "><title>%s</title></rect>\n", escaped);
  else
    g_string_append (svg->out, "/>\n");
}

static void
append_text (Svg        *svg,
             const char *attributes,
             double      x,
             double      y,
             const char *text)
{
  char bx[G_ASCII_DTOSTR_BUF_SIZE], by[G_ASCII_DTOSTR_BUF_SIZE];
  g_autofree char *escaped = g_markup_escape_text (text, -1);

  g_string_append_printf (svg->out, "<text %s x=\"%s\" y=\"%s\">%s</text>\n", attributes,
                          number (bx, "%.3f", x), number (by, "%.3f", y), escaped);
}

static double
position_x (const Svg *svg,
            gint64     position)
{
  return LEFT + svg->scale * (double) position;
}

/* Column c of the summary covers positions [first (c), first (c + 1)). */
static gint64
column_first (const Svg *svg,
              gint64     column)
{
  return (gint64) ((double) column * (double) svg->seq_len / SUMMARY_COLUMNS);
}

static gint64
column_middle (const Svg *svg,
               gint64     column)
{
  return (gint64) (((double) column + 0.5) * (double) svg->seq_len / SUMMARY_COLUMNS);
}

static const char *
part_name (const Svg *svg,
           gint64     row)
{
  if (!svg->head_tail)
    return "whole";
  return row % 2 == 0 ? "head" : "tail";
}

static char *
describe_positions (gint64 start,
                    gint64 length)
{
  if (length == 1)
    return g_strdup_printf ("position %" G_GINT64_FORMAT, start);
  return g_strdup_printf ("positions %" G_GINT64_FORMAT "–%" G_GINT64_FORMAT,
                          start, start + length - 1);
}

/* One chunk: the rank's colour, hatched when it is a tail chunk, with
 * the rank and the part written in it when they fit. */
static void
append_chunk (Svg        *svg,
              int         rank,
              gint64      row,
              gint64      start,
              gint64      length,
              const char *colour)
{
  gint64 document = svg->head_tail ? row / 2 : row;
  const char *part = part_name (svg, row);
  double x = position_x (svg, start);
  double width = svg->scale * (double) length;
  g_autofree char *attributes = g_strdup_printf (
    "class=\"chunk %s\" data-rank=\"%d\" data-document=\"%" G_GINT64_FORMAT "\" data-start=\"%"
    G_GINT64_FORMAT "\" data-length=\"%" G_GINT64_FORMAT "\"", part, rank, document, start, length);
  g_autofree char *positions = describe_positions (start, length);
  g_autofree char *tooltip = svg->head_tail
    ? g_strdup_printf ("rank %d, %s chunk of document %" G_GINT64_FORMAT ": %s", rank, part,
                       document, positions)
    : g_strdup_printf ("rank %d: %s", rank, positions);
  g_autofree char *rank_label = g_strdup_printf ("r%d", rank);
  g_autofree char *hatch = g_strdup_printf ("url(#%s)", svg->hatch_id);

  append_rect (svg, attributes, x, SEQUENCE_TOP, width, SEQUENCE_HEIGHT, colour, tooltip);
  if (g_str_equal (part, "tail"))
    append_rect (svg, "class=\"hatch\" pointer-events=\"none\"", x, SEQUENCE_TOP, width,
                 SEQUENCE_HEIGHT, hatch, NULL);
  if (width >= RANK_LABEL_WIDTH)
    append_text (svg, "class=\"chunk-label\" text-anchor=\"middle\"", x + width / 2,
                 SEQUENCE_TOP + (svg->head_tail ? 17 : 25), rank_label);
  if (width >= PART_LABEL_WIDTH && svg->head_tail)
    append_text (svg, "class=\"chunk-label\" text-anchor=\"middle\"", x + width / 2,
                 SEQUENCE_TOP + 32, part);
}

static void
append_rank_chunks (Svg *svg,
                    int  rank)
{
  g_autoptr(CpTensor) chunks = cp_layout_get_chunks (svg->layout, rank);
  const gint64 *rows = cp_tensor_get_data (chunks);
  gint64 n_rows = cp_tensor_get_dim (chunks, 0);
  char colour[8];

  rank_colour (svg, rank, colour);
  for (gint64 i = 0; i < n_rows; i++)
    if (rows[2 * i + 1] > 0)
      append_chunk (svg, rank, i, rows[2 * i], rows[2 * i + 1], colour);
}

/* Packed documents: a line where each starts, its number above it when
 * it fits.  Rank 0's head chunk starts every document, and a document
 * holds 2·C of its chunks. */
static void
append_documents (Svg *svg)
{
  g_autoptr(CpTensor) chunks = cp_layout_get_chunks (svg->layout, 0);
  const gint64 *rows = cp_tensor_get_data (chunks);
  guint n_documents = cp_layout_get_n_documents (svg->layout);

  for (guint d = 0; d < n_documents; d++)
    {
      gint64 start = rows[4 * (gsize) d];
      double x = position_x (svg, start);
      double width = svg->scale * (double) (2 * svg->cp_size * rows[4 * (gsize) d + 1]);
      char bx[G_ASCII_DTOSTR_BUF_SIZE];

      if (d > 0)
        g_string_append_printf (svg->out, "<line class=\"document-bound\" x1=\"%s\" x2=\"%s\" "
                                "y1=\"%.0f\" y2=\"%.0f\" stroke=\"#222\" stroke-width=\"2\"/>\n",
                                number (bx, "%.3f", x), bx, SEQUENCE_TOP - 14,
                                SEQUENCE_TOP + SEQUENCE_HEIGHT);
      if (width >= DOCUMENT_LABEL_WIDTH)
        {
          g_autofree char *label = g_strdup_printf ("doc %u", d);

          append_text (svg, "class=\"document-label\" text-anchor=\"middle\"", x + width / 2,
                       SEQUENCE_TOP - 4, label);
        }
    }
}

/* The column whose middle position is at or after @position. */
static gint64
first_column_from (const Svg *svg,
                   gint64     position)
{
  /* Column c's middle position is floor ((c + 0.5) · S / N). */
  gint64 column = (gint64) ((double) position * SUMMARY_COLUMNS / (double) svg->seq_len - 0.5);

  column = CLAMP (column, 0, SUMMARY_COLUMNS);
  while (column > 0 && column_middle (svg, column - 1) >= position)
    column--;
  while (column < SUMMARY_COLUMNS && column_middle (svg, column) < position)
    column++;
  return column;
}

/* Which rank holds the middle position of each column: every chunk of
 * every rank marks the columns whose middles it covers. */
static void
find_column_owners (const Svg *svg,
                    int        owners[SUMMARY_COLUMNS])
{
  for (int c = 0; c < SUMMARY_COLUMNS; c++)
    owners[c] = -1;
  for (int r = 0; r < svg->cp_size; r++)
    {
      g_autoptr(CpTensor) chunks = cp_layout_get_chunks (svg->layout, r);
      const gint64 *rows = cp_tensor_get_data (chunks);
      gint64 n_rows = cp_tensor_get_dim (chunks, 0);

      for (gint64 i = 0; i < n_rows; i++)
        for (gint64 c = first_column_from (svg, rows[2 * i]);
             c < SUMMARY_COLUMNS && column_middle (svg, c) < rows[2 * i] + rows[2 * i + 1]; c++)
          owners[c] = r;
    }
}

/* Neighbouring columns of the same rank make one rect, of class
 * `summary`, from the first position of its first column to the last of
 * its last. */
static void
append_columns (Svg *svg)
{
  int owners[SUMMARY_COLUMNS];

  find_column_owners (svg, owners);
  for (int c = 0; c < SUMMARY_COLUMNS;)
    {
      int end = c + 1;
      gint64 start, stop;
      char colour[8];
      g_autofree char *attributes = NULL;
      g_autofree char *tooltip = NULL;

      while (end < SUMMARY_COLUMNS && owners[end] == owners[c])
        end++;
      start = column_first (svg, c);
      stop = column_first (svg, end);
      if (owners[c] >= 0 && stop > start)
        {
          rank_colour (svg, owners[c], colour);
          attributes = g_strdup_printf ("class=\"summary\" data-rank=\"%d\" data-start=\"%"
                                        G_GINT64_FORMAT "\" data-length=\"%" G_GINT64_FORMAT "\"",
                                        owners[c], start, stop - start);
          tooltip = g_strdup_printf ("positions %" G_GINT64_FORMAT "–%" G_GINT64_FORMAT ": rank %d "
                                     "holds the middle of each column here", start, stop - 1,
                                     owners[c]);
          append_rect (svg, attributes, position_x (svg, start), SEQUENCE_TOP,
                       svg->scale * (double) (stop - start), SEQUENCE_HEIGHT, colour, tooltip);
        }
      c = end;
    }
}

static void
append_sequence (Svg *svg)
{
  g_autofree char *end = g_strdup_printf ("%" G_GINT64_FORMAT, svg->seq_len);

  guint n_documents = cp_layout_get_n_documents (svg->layout);

  g_string_append (svg->out, "<g class=\"sequence\">\n");
  if (svg->summarised)
    append_columns (svg);
  else
    for (int r = 0; r < svg->cp_size; r++)
      append_rank_chunks (svg, r);
  append_rect (svg, "class=\"outline\" stroke=\"#222\"", LEFT, SEQUENCE_TOP, BAR_WIDTH,
               SEQUENCE_HEIGHT, "none", NULL);
  if (svg->head_tail && n_documents > 1 && n_documents <= MAX_DOCUMENT_BOUNDS)
    append_documents (svg);
  append_text (svg, "text-anchor=\"start\"", LEFT, SEQUENCE_TOP + SEQUENCE_HEIGHT + 16, "0");
  append_text (svg, "text-anchor=\"middle\"", LEFT + BAR_WIDTH / 2,
               SEQUENCE_TOP + SEQUENCE_HEIGHT + 16, "sequence position");
  append_text (svg, "text-anchor=\"end\"", LEFT + BAR_WIDTH,
               SEQUENCE_TOP + SEQUENCE_HEIGHT + 16, end);
  g_string_append (svg->out, "</g>\n");
}

static double
max_cost (const Svg *svg)
{
  double max = 0.0;

  for (int r = 0; r < svg->cp_size; r++)
    max = MAX (max, cp_layout_get_cost (svg->layout, r));
  return max;
}

static int
n_cost_rows (const Svg *svg)
{
  return (svg->cp_size + svg->ranks_per_row - 1) / svg->ranks_per_row;
}

/* The busiest of ranks @first to @last. */
static int
busiest_rank (const Svg *svg,
              int        first,
              int        last)
{
  int busiest = first;

  for (int r = first + 1; r <= last; r++)
    if (cp_layout_get_cost (svg->layout, r) > cp_layout_get_cost (svg->layout, busiest))
      busiest = r;
  return busiest;
}

/* One work bar: of a rank (class `cost`), or of a group of ranks (class
 * `cost-group`, with `data-first-rank` and `data-last-rank`) drawn for
 * the busiest of them, whose rank and cost `data-rank` and `data-cost`
 * give. */
static void
append_cost_row (Svg    *svg,
                 int     row,
                 double  max,
                 double  mean)
{
  int first = row * svg->ranks_per_row;
  int last = MIN (first + svg->ranks_per_row, svg->cp_size) - 1;
  int rank = busiest_rank (svg, first, last);
  double cost = cp_layout_get_cost (svg->layout, rank);
  double y = COST_TOP + row * COST_ROW;
  double width = max > 0.0 ? (BAR_WIDTH - COST_TEXT_ROOM) * cost / max : 0.0;
  char colour[8], bc[G_ASCII_DTOSTR_BUF_SIZE], bm[G_ASCII_DTOSTR_BUF_SIZE];
  g_autofree char *attributes = NULL;
  g_autofree char *rank_label = NULL;
  g_autofree char *value = NULL;

  number (bc, "%.0f", cost);
  number (bm, "%.2f", mean > 0.0 ? cost / mean : 1.0);
  if (first == last)
    {
      attributes = g_strdup_printf ("class=\"cost\" data-rank=\"%d\" data-cost=\"%s\"", rank, bc);
      rank_label = g_strdup_printf ("rank %d", rank);
      value = g_strdup_printf ("%s (%s× mean)", bc, bm);
    }
  else
    {
      attributes = g_strdup_printf ("class=\"cost-group\" data-first-rank=\"%d\" "
                                    "data-last-rank=\"%d\" data-rank=\"%d\" data-cost=\"%s\"",
                                    first, last, rank, bc);
      rank_label = g_strdup_printf ("%d–%d", first, last);
      value = g_strdup_printf ("%s (%s× mean), rank %d", bc, bm, rank);
    }
  rank_colour (svg, rank, colour);
  append_text (svg, "text-anchor=\"end\"", LEFT - 8, y + COST_BAR - 3, rank_label);
  append_rect (svg, attributes, LEFT, y, width, COST_BAR, colour, NULL);
  append_text (svg, "text-anchor=\"start\"", LEFT + width + 6, y + COST_BAR - 3, value);
}

/* Every rank's causal work as a bar, scaled to the busiest rank. */
static void
append_costs (Svg *svg)
{
  double max = max_cost (svg);
  double mean = 0.0;
  char bi[G_ASCII_DTOSTR_BUF_SIZE];
  g_autofree char *heading = NULL;
  g_autofree char *per = svg->ranks_per_row > 1
    ? g_strdup_printf ("the busiest of each %d ranks", svg->ranks_per_row) : g_strdup ("rank");

  for (int r = 0; r < svg->cp_size; r++)
    mean += cp_layout_get_cost (svg->layout, r) / svg->cp_size;
  heading = g_strdup_printf ("causal attention work per %s (query–key pairs); imbalance "
                             "(max/mean) %s", per,
                             number (bi, "%.2f", cp_layout_get_imbalance (svg->layout)));
  g_string_append (svg->out, "<g class=\"costs\">\n");
  append_text (svg, "font-weight=\"bold\"", LEFT, COST_TOP - 10, heading);
  for (int row = 0; row < n_cost_rows (svg); row++)
    append_cost_row (svg, row, max, mean);
  g_string_append (svg->out, "</g>\n");
}

static char *
describe_layout (CpLayout *layout)
{
  guint n_documents = cp_layout_get_n_documents (layout);

  if (n_documents > 1)
    return g_strdup_printf ("per-document head-tail layout: %u documents, %" G_GINT64_FORMAT
                            " positions over %d ranks", n_documents,
                            cp_layout_get_seq_len (layout), cp_layout_get_cp_size (layout));
  return g_strdup_printf ("%s layout: %" G_GINT64_FORMAT " positions over %d ranks",
                          cp_layout_get_balance (layout) == CP_LOAD_BALANCE_HEAD_TAIL
                            ? "head-tail" : "contiguous",
                          cp_layout_get_seq_len (layout), cp_layout_get_cp_size (layout));
}

/* The heading, and what solid and hatched mean. */
static void
append_key (Svg        *svg,
            const char *title)
{
  g_autofree char *hatch = g_strdup_printf ("url(#%s)", svg->hatch_id);

  append_text (svg, "font-size=\"15\" font-weight=\"bold\"", LEFT, 22, title);
  if (svg->summarised)
    {
      guint n_documents = cp_layout_get_n_documents (svg->layout);
      g_autofree char *note = g_strdup_printf (
        "colours are ranks; %.0f chunks are too many to draw: each column shows the rank holding "
        "its middle position%s", n_chunk_rows (svg->layout),
        n_documents > MAX_DOCUMENT_BOUNDS ? ", and document bounds are left out" : "");

      append_text (svg, "class=\"summary-note\"", LEFT, 42, note);
      return;
    }
  if (!svg->head_tail)
    {
      append_text (svg, "", LEFT, 42, "colours are ranks; each rank holds one chunk");
      return;
    }
  append_text (svg, "", LEFT, 42, "colours are ranks:");
  append_rect (svg, "class=\"key\" stroke=\"#222\"", LEFT + 120, 31, 22, 14, "#999999", NULL);
  append_text (svg, "", LEFT + 148, 42, "head chunk");
  append_rect (svg, "class=\"key\" stroke=\"#222\"", LEFT + 240, 31, 22, 14, "#999999", NULL);
  append_rect (svg, "class=\"key\"", LEFT + 240, 31, 22, 14, hatch, NULL);
  append_text (svg, "", LEFT + 268, 42, "tail chunk");
}

/**
 * cp_layout_to_svg:
 * @self: a layout
 *
 * Draws the layout as a standalone SVG image: the sequence as a bar in
 * which every rank's chunks have that rank's colour (head chunks solid,
 * tail chunks hatched, packed documents separated and numbered), and
 * below it every rank's causal-attention work ([method@Cp.Layout.get_cost])
 * as a bar. Each chunk is a `rect` of class `chunk` (with `head`, `tail`
 * or `whole`) carrying `data-rank`, `data-document`, `data-start` and
 * `data-length`; each work bar is a `rect` of class `cost` with
 * `data-rank` and `data-cost`. `cpmesh layout --svg` writes this image,
 * and Python shows it for a `Cp.Layout` in a notebook.
 *
 * However large the layout, the image stays readable and about a
 * megabyte at most. Beyond 1024 chunks in all, the sequence bar is 430
 * columns instead, each in the colour of the rank holding its middle
 * position: neighbouring columns of a rank make one `rect` of class
 * `summary` with `data-rank`, `data-start` and `data-length`, and a note
 * in the heading says so. Beyond 256 packed documents their bounds are
 * not drawn. Beyond 128 ranks each work bar, of class `cost-group`,
 * stands for consecutive ranks `data-first-rank` to `data-last-rank`
 * and shows the busiest of them, `data-rank`.
 *
 * Returns: (transfer full): the SVG document, UTF-8
 *
 * Since: 1.0
 */
char *
cp_layout_to_svg (CpLayout *self)
{
  Svg svg = { 0 };
  g_autofree char *title = NULL;
  g_autofree char *fingerprint = NULL;
  char bh[G_ASCII_DTOSTR_BUF_SIZE];

  g_return_val_if_fail (self != NULL, NULL);

  svg.layout = self;
  svg.cp_size = cp_layout_get_cp_size (self);
  svg.seq_len = cp_layout_get_seq_len (self);
  svg.head_tail = cp_layout_get_balance (self) == CP_LOAD_BALANCE_HEAD_TAIL;
  svg.scale = BAR_WIDTH / (double) MAX (svg.seq_len, 1);
  svg.summarised = svg.seq_len > 0 && n_chunk_rows (self) > MAX_DRAWN_CHUNKS;
  svg.ranks_per_row = (svg.cp_size + MAX_COST_ROWS - 1) / MAX_COST_ROWS;
  fingerprint = cp_layout_dup_fingerprint_hex (self);
  g_snprintf (svg.hatch_id, sizeof svg.hatch_id, "cp-tail-%s", fingerprint);
  svg.out = g_string_new (NULL);
  title = describe_layout (self);

  number (bh, "%.0f", COST_TOP + n_cost_rows (&svg) * COST_ROW + 10);
  g_string_append_printf (svg.out,
                          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%s\" "
                          "viewBox=\"0 0 %.0f %s\" font-family=\"sans-serif\" font-size=\"12\">\n"
                          "<title>%s</title>\n"
                          "<defs><pattern id=\"%s\" width=\"6\" height=\"6\" "
                          "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
                          "<rect width=\"3\" height=\"6\" fill=\"#ffffff\" fill-opacity=\"0.6\"/>"
                          "</pattern></defs>\n"
                          "<rect class=\"background\" width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
                          WIDTH, bh, WIDTH, bh, title, svg.hatch_id);
  append_key (&svg, title);
  append_sequence (&svg);
  append_costs (&svg);
  g_string_append (svg.out, "</svg>\n");
  return g_string_free (svg.out, FALSE);
}
