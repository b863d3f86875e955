/* cp-test-fd-child.c: maps a tensor another process shares through a file
 * descriptor, checks what that process wrote, writes its own pattern and
 * reports it, then waits on stdin so the writer can observe it while this
 * process is still alive.
 *
 * Usage: cp-test-fd-child FD N
 *        cp-test-fd-child FD N truncate
 *
 * With "truncate" it plays the hostile holder instead: it tries to shrink
 * the file to nothing, reports "shrunk" or "refused: EPERM" (or the text
 * of another errno), and waits on stdin.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libcpmesh.h>

static void
wait_for_eof (void)
{
  int c;

  while ((c = getchar ()) != EOF)
    ;
}

static int
try_to_shrink (int fd)
{
  if (ftruncate (fd, 0) == 0)
    printf ("shrunk\n");
  else
    printf ("refused: %s\n", errno == EPERM ? "EPERM" : strerror (errno));
  fflush (stdout);
  wait_for_eof ();
  return 0;
}

int
main (int   argc,
      char *argv[])
{
  g_autoptr(GError) error = NULL;
  g_autoptr(CpTensor) shared = NULL;
  gint64 n;
  gint32 *data;
  int fd;

  if (argc != 3 && !(argc == 4 && strcmp (argv[3], "truncate") == 0))
    return 2;
  fd = atoi (argv[1]);
  if (argc == 4)
    return try_to_shrink (fd);
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
  wait_for_eof ();
  return 0;
}
