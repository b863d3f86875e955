/* cpmesh-util.c: messages and formatting shared by the cpmesh commands
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <string.h>

#include "cpmesh-tool.h"

static int G_GNUC_PRINTF (2, 0)
vfail (int          status,
       const char  *format,
       va_list      args)
{
  g_autofree char *message = g_strdup_vprintf (format, args);

  fprintf (stderr, "%s: %s\n", g_get_prgname (), message);
  if (status == CPMESH_EXIT_USAGE)
    fprintf (stderr, "Run “%s --help” for usage.\n", g_get_prgname ());
  return status;
}

int
cpmesh_fail (int          status,
             const char  *format,
             ...)
{
  va_list args;

  va_start (args, format);
  status = vfail (status, format, args);
  va_end (args);
  return status;
}

int
cpmesh_fail_error (GError *error)
{
  return cpmesh_fail (CPMESH_EXIT_FAILED, "%s", error->message);
}

const char * const cpmesh_balance_names[] = { "head-tail", "contiguous", NULL };

CpLoadBalance
cpmesh_balance_from_index (int index)
{
  return index == 1 ? CP_LOAD_BALANCE_CONTIGUOUS : CP_LOAD_BALANCE_HEAD_TAIL;
}

const char *
cpmesh_balance_name (CpLoadBalance balance)
{
  return cpmesh_balance_names[balance == CP_LOAD_BALANCE_CONTIGUOUS];
}

static gint64 program_started;

void
cpmesh_progress_start (void)
{
  program_started = g_get_monotonic_time ();
}

void
cpmesh_progress (const char *format,
                 ...)
{
  g_autofree char *message = NULL;
  va_list args;

  va_start (args, format);
  message = g_strdup_vprintf (format, args);
  va_end (args);
  fprintf (stderr, "%s: [%7.1f s] %s\n", g_get_prgname (),
           (double) (g_get_monotonic_time () - program_started) / G_USEC_PER_SEC, message);
  fflush (stderr);
}

/* The launchers cp_mesh_new_from_env () reads, in its order: a rank
 * variable and a world-size variable each. */
static const char * const launcher_variables[][2] = {
  { "RANK", "WORLD_SIZE" },
  { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
  { "SLURM_PROCID", "SLURM_NTASKS" },
};

/* A world size that is not a number counts as more than one rank: the
 * launcher's mesh would not form, and running alone would hide that. */
gboolean
cpmesh_launched_as_rank (char **description)
{
  for (gsize i = 0; i < G_N_ELEMENTS (launcher_variables); i++)
    {
      const char *rank = g_getenv (launcher_variables[i][0]);
      const char *world = g_getenv (launcher_variables[i][1]);
      gint64 size = 0;

      if (rank == NULL && world == NULL)
        continue;
      if (world != NULL && g_ascii_string_to_signed (world, 10, 0, G_MAXINT64, &size, NULL) &&
          size <= 1)
        return FALSE;
      *description = world != NULL ? g_strdup_printf ("%s=%s", launcher_variables[i][1], world)
                                   : g_strdup_printf ("%s=%s", launcher_variables[i][0], rank);
      return TRUE;
    }
  return FALSE;
}

static void
append_range (GString *text,
              gint64   first,
              gint64   last)
{
  if (first == last)
    g_string_append_printf (text, "%" G_GINT64_FORMAT, first);
  else
    g_string_append_printf (text, "%" G_GINT64_FORMAT "-%" G_GINT64_FORMAT, first, last);
}

/* Starts the text of chunk @row: a head-tail rank's tail chunk follows
 * its head chunk of the same document, anything else starts anew. */
static void
append_chunk_prefix (GString  *text,
                     gint64    row,
                     gboolean  head_tail,
                     gboolean  documents)
{
  if (head_tail && row % 2 == 1)
    {
      g_string_append (text, ", tail ");
      return;
    }
  if (text->len > 0)
    g_string_append (text, "; ");
  if (documents)
    g_string_append_printf (text, "doc %" G_GINT64_FORMAT ": ", row / 2);
  if (head_tail)
    g_string_append (text, "head ");
}

char *
cpmesh_format_positions (CpLayout *layout,
                         int       rank)
{
  g_autoptr(CpTensor) chunks = cp_layout_get_chunks (layout, rank);
  const gint64 *rows = cp_tensor_get_data (chunks);
  gint64 n_rows = cp_tensor_get_dim (chunks, 0);
  gboolean head_tail = cp_layout_get_balance (layout) == CP_LOAD_BALANCE_HEAD_TAIL;
  gboolean documents = cp_layout_get_n_documents (layout) > 1;
  GString *text;

  if (n_rows > CPMESH_MAX_LISTED_CHUNKS)
    return g_strdup_printf ("(%" G_GINT64_FORMAT " chunks, too many to list)", n_rows);
  text = g_string_new (NULL);
  for (gint64 i = 0; i < n_rows; i++)
    if (rows[2 * i + 1] > 0)  /* an empty document gives empty chunks */
      {
        append_chunk_prefix (text, i, head_tail, documents);
        append_range (text, rows[2 * i], rows[2 * i] + rows[2 * i + 1] - 1);
      }
  if (text->len == 0)
    g_string_append (text, "(none)");
  return g_string_free (text, FALSE);
}

double
cpmesh_now_seconds (void)
{
  return (double) g_get_monotonic_time () / G_USEC_PER_SEC;
}

CpTensor *
cpmesh_pad_sequence (CpTensor  *tensor,
                     int        dim,
                     gint64     length,
                     double     value,
                     GError   **error)
{
  guint n_dims;
  const gint64 *shape = cp_tensor_get_shape (tensor, &n_dims);
  gint64 padded_shape[CP_TENSOR_MAX_DIMS];
  gsize outer = 1;
  gsize row = cp_dtype_get_size (cp_tensor_get_dtype (tensor));
  CpTensor *padded;

  g_assert ((guint) dim < n_dims && length >= shape[dim]);
  memcpy (padded_shape, shape, n_dims * sizeof (gint64));
  padded_shape[dim] = length;
  padded = cp_tensor_new_full (cp_tensor_get_dtype (tensor), padded_shape, n_dims, value, error);
  if (padded == NULL)
    return NULL;
  for (int d = 0; d < dim; d++)
    outer *= (gsize) shape[d];
  for (guint d = (guint) dim + 1; d < n_dims; d++)
    row *= (gsize) shape[d];
  /* Each outer block copies its shape[dim] rows to the front of its
   * length rows. */
  for (gsize o = 0; o < outer; o++)
    memcpy ((guint8 *) cp_tensor_get_data (padded) + o * (gsize) length * row,
            (const guint8 *) cp_tensor_get_data (tensor) + o * (gsize) shape[dim] * row,
            (gsize) shape[dim] * row);
  return padded;
}
