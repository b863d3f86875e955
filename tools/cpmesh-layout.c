/* cpmesh-layout.c: cpmesh layout
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "cpmesh-tool.h"

typedef struct
{
  int cp_size;
  gint64 seq_len;        /* -1: not given */
  char *balance_name;
  char *thd;
  char *svg_path;
} LayoutOptions;

static void
layout_options_clear (LayoutOptions *options)
{
  g_clear_pointer (&options->balance_name, g_free);
  g_clear_pointer (&options->thd, g_free);
  g_clear_pointer (&options->svg_path, g_free);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (LayoutOptions, layout_options_clear)

/* "0,8,12" → { 0, 8, 12 }. */
static GArray *
parse_bounds (const char *text)
{
  g_auto(GStrv) items = g_strsplit (text, ",", -1);
  g_autoptr(GArray) bounds = g_array_new (FALSE, FALSE, sizeof (gint64));

  for (char **item = items; *item != NULL; item++)
    {
      gint64 value;

      if (!g_ascii_string_to_signed (g_strstrip (*item), 10, G_MININT64, G_MAXINT64, &value, NULL))
        {
          cpmesh_fail (CPMESH_EXIT_USAGE, "--thd: “%s” is not an integer", *item);
          return NULL;
        }
      g_array_append_val (bounds, value);
    }
  return g_steal_pointer (&bounds);
}

static CpLayout *
new_thd_layout (LayoutOptions  *options,
                int            *status)
{
  g_autoptr(GArray) bounds = parse_bounds (options->thd);
  g_autoptr(GError) error = NULL;
  CpLayout *layout;

  *status = CPMESH_EXIT_USAGE;
  if (bounds == NULL)
    return NULL;
  if (options->balance_name != NULL)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--thd is always per-document head-tail; drop --balance");
      return NULL;
    }
  *status = CPMESH_EXIT_FAILED;
  layout = cp_layout_new_thd ((const gint64 *) bounds->data, bounds->len, options->cp_size, &error);
  if (layout == NULL)
    cpmesh_fail_error (error);
  else if (options->seq_len >= 0 && options->seq_len != cp_layout_get_seq_len (layout))
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--seq %" G_GINT64_FORMAT " disagrees with --thd, "
                   "whose documents add up to %" G_GINT64_FORMAT,
                   options->seq_len, cp_layout_get_seq_len (layout));
      g_clear_pointer (&layout, cp_layout_unref);
      *status = CPMESH_EXIT_USAGE;
    }
  return layout;
}

static CpLayout *
new_sequence_layout (LayoutOptions  *options,
                     int            *status)
{
  g_autoptr(GError) error = NULL;
  CpLoadBalance balance = CP_LOAD_BALANCE_HEAD_TAIL;
  CpLayout *layout;

  *status = CPMESH_EXIT_USAGE;
  if (options->seq_len < 0)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "give the sequence length with --seq, or documents with --thd");
      return NULL;
    }
  if (options->balance_name != NULL && !cpmesh_balance_from_name (options->balance_name, &balance))
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--balance must be head-tail or contiguous, not “%s”",
                   options->balance_name);
      return NULL;
    }
  *status = CPMESH_EXIT_FAILED;
  layout = cp_layout_new (balance, options->seq_len, options->cp_size, &error);
  if (layout == NULL)
    cpmesh_fail_error (error);
  return layout;
}

static void
print_heading (CpLayout *layout)
{
  guint n_documents = cp_layout_get_n_documents (layout);
  gint64 seq_len = cp_layout_get_seq_len (layout);
  int cp_size = cp_layout_get_cp_size (layout);

  if (n_documents > 1)
    g_print ("per-document head-tail layout: %u documents, %" G_GINT64_FORMAT
             " positions over %d ranks\n", n_documents, seq_len, cp_size);
  else
    g_print ("%s layout: %" G_GINT64_FORMAT " positions over %d ranks\n",
             cpmesh_balance_name (cp_layout_get_balance (layout)), seq_len, cp_size);
}

static void
print_ranks (CpLayout *layout)
{
  g_print ("rank  %10s  %14s  positions, chunk by chunk\n", "length", "causal cost");
  for (int r = 0; r < cp_layout_get_cp_size (layout); r++)
    {
      g_autofree char *positions = cpmesh_format_positions (layout, r);

      g_print ("%4d  %10" G_GINT64_FORMAT "  %14.0f  %s\n", r, cp_layout_get_local_len (layout, r),
               cp_layout_get_cost (layout, r), positions);
    }
}

static void
print_imbalance_of (CpLoadBalance  balance,
                    gint64         seq_len,
                    int            cp_size)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpLayout) layout = cp_layout_new (balance, seq_len, cp_size, &error);

  if (layout != NULL)
    g_print ("%s %.2f", cpmesh_balance_name (balance), cp_layout_get_imbalance (layout));
  else
    g_print ("%s n/a (%s)", cpmesh_balance_name (balance), error->message);
}

/* Head-tail against contiguous for one sequence of this length; packed
 * documents only have their own layout, which is the one printed. */
static void
print_imbalance (CpLayout *layout)
{
  g_print ("imbalance (max/mean causal cost): ");
  if (cp_layout_get_n_documents (layout) > 1)
    g_print ("%.2f\n", cp_layout_get_imbalance (layout));
  else
    {
      print_imbalance_of (CP_LOAD_BALANCE_HEAD_TAIL, cp_layout_get_seq_len (layout),
                          cp_layout_get_cp_size (layout));
      g_print (", ");
      print_imbalance_of (CP_LOAD_BALANCE_CONTIGUOUS, cp_layout_get_seq_len (layout),
                          cp_layout_get_cp_size (layout));
      g_print ("\n");
    }
}

/* The picture cp_layout_to_svg() draws, the same as Python's. */
static gboolean
write_svg (CpLayout   *layout,
           const char *path)
{
  g_autofree char *svg = cp_layout_to_svg (layout);
  g_autoptr(GError) error = NULL;

  if (!g_file_set_contents (path, svg, -1, &error))
    {
      cpmesh_fail (CPMESH_EXIT_FAILED, "--svg: %s", error->message);
      return FALSE;
    }
  return TRUE;
}

int
cpmesh_layout (int    argc,
               char **argv)
{
  g_auto(LayoutOptions) options = { .cp_size = 4, .seq_len = -1 };
  const GOptionEntry entries[] = {
    { "cp", 'c', 0, G_OPTION_ARG_INT, &options.cp_size, "Ranks in the context-parallel group (default 4)", "C" },
    { "seq", 's', 0, G_OPTION_ARG_INT64, &options.seq_len, "Global sequence length", "S" },
    { "balance", 'b', 0, G_OPTION_ARG_STRING, &options.balance_name,
      "head-tail (default) or contiguous", "SCHEME" },
    { "thd", 't', 0, G_OPTION_ARG_STRING, &options.thd,
      "Packed documents: cumulative padded lengths, e.g. 0,8,12", "BOUNDS" },
    { "svg", 0, 0, G_OPTION_ARG_FILENAME, &options.svg_path,
      "Also draw the layout as an SVG image: ranks as colours over the sequence, "
      "tail chunks hatched, each rank's causal cost as a bar", "FILE" },
    G_OPTION_ENTRY_NULL
  };
  g_autoptr(CpLayout) layout = NULL;
  int status;

  if (!cpmesh_parse_options ("Show which global sequence positions each rank holds, chunk by "
                             "chunk, the causal attention cost of each rank, and how head-tail "
                             "and contiguous layouts balance that cost.", entries, argc, argv))
    return CPMESH_EXIT_USAGE;

  layout = options.thd != NULL ? new_thd_layout (&options, &status)
                               : new_sequence_layout (&options, &status);
  if (layout == NULL)
    return status;
  if (options.svg_path != NULL && !write_svg (layout, options.svg_path))
    return CPMESH_EXIT_FAILED;
  print_heading (layout);
  print_ranks (layout);
  print_imbalance (layout);
  if (options.svg_path != NULL)
    g_print ("picture: %s\n", options.svg_path);
  return 0;
}
