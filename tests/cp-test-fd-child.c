/* cp-test-fd-child.c: maps a tensor another process shares through a file
 * descriptor, checks what that process wrote, writes its own pattern and
 * reports it, then waits on stdin so the writer can observe it while this
 * process is still alive.
 *
 * Usage: cp-test-fd-child FD N
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <stdlib.h>

#include <libcpmesh.h>

int
main (int   argc,
      char *argv[])
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) shared = NULL;
  gint64 n;
  gint32 *data;
  int fd;
  int c;

  if (argc != 3)
    return 2;
  fd = atoi (argv[1]);
  n = g_ascii_strtoll (argv[2], NULL, 10);
  shared = cp_tensor_new_from_fd (CP_DTYPE_INT32, &n, 1, fd, 0, &error);
  if (shared == NULL)
    {
      g_printerr ("%s\n", error->message);
      return 3;
    }
  data = cp_tensor_get_data (shared);
  if (data[0] != 1234)
    return 4; /* the parent's write is not visible */
  for (gint64 i = 0; i < n; i++)
    data[i] = (gint32) (i * 3 + 1);
  printf ("written\n");
  fflush (stdout);
  while ((c = getchar ()) != EOF)
    ;
  return 0;
}
