/* cpmesh-layout.c: cpmesh layout
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "cpmesh-tool.h"

typedef struct
{
  int cp_size;
  gint64 seq_len;
  int balance;           /* an index into cpmesh_balance_names */
  GArray *thd;           /* of gint64: document bounds */
  char *svg_path;
} LayoutOptions;

static void
layout_options_clear (LayoutOptions *options)
{
  g_clear_pointer (&options->thd, g_array_unref);
  g_clear_pointer (&options->svg_path, g_free);
}

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (LayoutOptions, layout_options_clear)

/* Every input comes from the command line, so whatever the library
 * refuses is a usage error: its message names the value. */
static CpLayout *
usage_unless (CpLayout  *layout,
              GError   **error)
{
  if (layout == NULL)
    cpmesh_fail (CPMESH_EXIT_USAGE, "%s", (*error)->message);
  return layout;
}

static CpLayout *
new_thd_layout (LayoutOptions *options,
                CpmeshOption  *entries)
{
  g_autoptr(GError) error = NULL;
  CpLayout *layout;

  if (cpmesh_option_given (entries, "balance"))
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--thd is always per-document head-tail; drop --balance");
      return NULL;
    }
  layout = usage_unless (cp_layout_new_thd ((const gint64 *) options->thd->data, options->thd->len,
                                            options->cp_size, &error), &error);
  if (layout != NULL && cpmesh_option_given (entries, "seq") &&
      options->seq_len != cp_layout_get_seq_len (layout))
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "--seq %" G_GINT64_FORMAT " disagrees with --thd, "
                   "whose documents add up to %" G_GINT64_FORMAT,
                   options->seq_len, cp_layout_get_seq_len (layout));
      g_clear_pointer (&layout, cp_layout_unref);
    }
  return layout;
}

static CpLayout *
new_sequence_layout (LayoutOptions *options,
                     CpmeshOption  *entries)
{
  CpLoadBalance balance = cpmesh_balance_from_index (options->balance);
  g_autoptr(GError) error = NULL;

  if (!cpmesh_option_given (entries, "seq"))
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "give the sequence length with --seq, or documents with --thd");
      return NULL;
    }
  if (balance == CP_LOAD_BALANCE_HEAD_TAIL &&
      !cpmesh_check_divisible ("--seq", options->seq_len, options->cp_size))
    return NULL;
  return usage_unless (cp_layout_new (balance, options->seq_len, options->cp_size, &error), &error);
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

/* Writes the whole of @svg to @fd, which someone else owns: a pipe, a
 * terminal, a FIFO, /dev/null. */
static gboolean
write_to_descriptor (int          fd,
                     const char  *svg,
                     gsize        length,
                     GError     **error)
{
  while (length > 0)
    {
      gssize n = write (fd, svg, length);

      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        {
          int saved = errno;

          g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (saved), "%s",
                       g_strerror (saved));
          return FALSE;
        }
      svg += n;
      length -= (gsize) n;
    }
  return TRUE;
}

/* A file that exists and is not a regular file is written into, never
 * replaced: FIFOs, terminals, /dev/null, /dev/stdout. */
static gboolean
write_into_existing (const char  *path,
                     const char  *svg,
                     GError     **error)
{
  int fd = g_open (path, O_WRONLY | O_NOCTTY | O_CLOEXEC, 0);
  gboolean written;

  if (fd < 0)
    {
      int saved = errno;

      g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (saved),
                   "cannot open %s for writing: %s", path, g_strerror (saved));
      return FALSE;
    }
  written = write_to_descriptor (fd, svg, strlen (svg), error);
  if (close (fd) < 0 && written)
    {
      int saved = errno;

      g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (saved), "%s", g_strerror (saved));
      written = FALSE;
    }
  return written;
}

/* A regular file, new or not, is written whole beside itself and renamed
 * into place, keeping an existing file's permissions; through a symbolic
 * link, the file it points to is the one replaced, not the link. */
static gboolean
replace_regular (const char  *path,
                 const char  *svg,
                 int          mode,
                 GError     **error)
{
  g_autofree char *target = realpath (path, NULL);

  return g_file_set_contents_full (target != NULL ? target : path, svg, -1,
                                   G_FILE_SET_CONTENTS_CONSISTENT, mode, error);
}

/* The program's own stdout or stderr, if @existing is the file one of
 * them is open on (`--svg /dev/stdout`), else -1: written through the
 * descriptor, the picture goes where the shell sends the rest, at its
 * offset, whatever the file is. */
static int
own_descriptor (const GStatBuf *existing)
{
  for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++)
    {
      GStatBuf open_file;

      if (fstat (fd, &open_file) == 0 && open_file.st_dev == existing->st_dev &&
          open_file.st_ino == existing->st_ino)
        return fd;
    }
  return -1;
}

/* What writing the picture to @path means depends on what @path is;
 * NULL when it can be written, otherwise why not. */
static char *
why_not_written (const char *path)
{
  GStatBuf link, target;

  if (g_lstat (path, &link) < 0)
    return NULL;
  if (g_stat (path, &target) < 0)
    return g_strdup_printf ("%s is a symbolic link to a file that does not exist; give the file "
                            "itself", path);
  if (S_ISDIR (target.st_mode))
    return g_strdup_printf ("%s is a directory; give a file name in it", path);
  if (S_ISBLK (target.st_mode))
    return g_strdup_printf ("%s is a block device; a picture goes to a file, a pipe or a "
                            "terminal", path);
  return NULL;
}

/* The picture cp_layout_to_svg() draws, the same as Python's. */
static gboolean
write_svg (CpLayout   *layout,
           const char *path)
{
  g_autofree char *svg = cp_layout_to_svg (layout);
  g_autofree char *refused = why_not_written (path);
  g_autoptr(GError) error = NULL;
  GStatBuf existing;
  gboolean written;

  if (refused != NULL)
    {
      cpmesh_fail (CPMESH_EXIT_FAILED, "--svg: %s", refused);
      return FALSE;
    }
  if (g_stat (path, &existing) < 0)
    written = replace_regular (path, svg, 0666, &error);
  else if (own_descriptor (&existing) >= 0)
    {
      fflush (NULL);
      written = write_to_descriptor (own_descriptor (&existing), svg, strlen (svg), &error);
    }
  else if (S_ISREG (existing.st_mode))
    written = replace_regular (path, svg, (int) (existing.st_mode & 07777), &error);
  else
    written = write_into_existing (path, svg, &error);
  if (!written)
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
  g_auto(LayoutOptions) options = { .cp_size = 4 };
  CpmeshOption entries[] = {
    CPMESH_OPTION_CP (&options.cp_size, " (default 4)"),
    CPMESH_OPTION_SEQ (&options.seq_len, ", a multiple of 2·C for head-tail"),
    { "balance", 0, CPMESH_VALUE_CHOICE, &options.balance, "head-tail (default) or contiguous",
      "SCHEME", 0, 0, cpmesh_balance_names, FALSE },
    { "thd", 't', CPMESH_VALUE_INT64_LIST, &options.thd,
      "Packed documents: cumulative padded lengths, e.g. 0,8,12", "BOUNDS", 0, G_MAXINT32,
      NULL, FALSE },
    { "svg", 0, CPMESH_VALUE_FILENAME, &options.svg_path,
      "Also draw the layout as an SVG image: ranks as colours over the sequence, "
      "tail chunks hatched, each rank's causal cost as a bar.  A regular FILE is replaced "
      "whole (through a link, the file it points to); a FIFO, pipe or terminal is written "
      "into", "FILE", 0, 0, NULL, FALSE },
    CPMESH_OPTION_END
  };
  g_autoptr(CpLayout) layout = NULL;

  if (!cpmesh_parse_options ("Show which global sequence positions each rank holds, chunk by "
                             "chunk, the causal attention cost of each rank, and how head-tail "
                             "and contiguous layouts balance that cost.",
                             entries, NULL, &argc, &argv))
    return CPMESH_EXIT_USAGE;

  layout = options.thd != NULL ? new_thd_layout (&options, entries)
                               : new_sequence_layout (&options, entries);
  if (layout == NULL)
    return CPMESH_EXIT_USAGE;
  if (options.svg_path != NULL && !write_svg (layout, options.svg_path))
    return CPMESH_EXIT_FAILED;
  print_heading (layout);
  print_ranks (layout);
  print_imbalance (layout);
  if (options.svg_path != NULL)
    g_print ("picture: %s\n", options.svg_path);
  return 0;
}
