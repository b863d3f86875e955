/* cpmesh-launch-keeper.c: the process between cpmesh launch and each rank
 *
 * A rank's program may start processes of its own, and those may leave
 * its process group and session (setsid) or be orphaned (double forks);
 * and the launcher may die by SIGKILL, which it cannot catch.  So each
 * rank runs under a keeper: a child of the launcher that never executes
 * anything, marked as a subreaper so that every process the rank starts,
 * however it detaches, stays its descendant.  The keeper
 *
 *  - leads the rank's process group (the launcher's SIGTERM reaches the
 *    rank through it, the keeper ignores it);
 *  - asks the kernel for a signal when the launcher dies
 *    (PR_SET_PDEATHSIG), and then kills all its descendants;
 *  - kills what the rank left behind when the rank exits, and exits as
 *    the rank did (the same status, or the same signal);
 *  - kills everything at once on CPMESH_KEEPER_KILL_NOW, which the
 *    launcher sends where it would otherwise send SIGKILL.
 *
 * The rank's program also gets SIGKILL as its parent-death signal, so
 * that it dies with its keeper even if the keeper is killed by SIGKILL.
 * Only then (keeper and launcher killed by SIGKILL alike) can processes
 * the rank started outlive the launch: no process is left to find them.
 *
 * Everything here runs in a child forked from a multi-threaded process,
 * so only async-signal-safe calls are made: no malloc, no stdio, no GLib.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpmesh-launch-keeper.h"

/* The signals the keeper waits for instead of handling them. */
static void
keeper_signals (sigset_t *set)
{
  sigemptyset (set);
  sigaddset (set, SIGCHLD);
  sigaddset (set, SIGHUP);    /* the launcher died (the parent-death signal) */
  sigaddset (set, SIGTERM);   /* for the rank, which is in the same group */
  sigaddset (set, SIGINT);
  sigaddset (set, SIGQUIT);
  sigaddset (set, CPMESH_KEEPER_KILL_NOW);
}

static void
say (const char *message)
{
  ssize_t ignored = write (STDERR_FILENO, message, strlen (message));

  (void) ignored;
}

/* Sends @signum to every pid listed in the calling thread's children
 * file; returns how many were listed, or -1 when the file cannot be read
 * (a kernel without CONFIG_PROC_CHILDREN). */
static int
signal_children (int signum)
{
  char buffer[4096];
  int fd = open ("/proc/thread-self/children", O_RDONLY | O_CLOEXEC);
  pid_t pid = 0;
  int listed = 0;
  ssize_t n;

  if (fd < 0)
    return -1;
  /* "12 34 56 ": a number may straddle two reads. */
  while ((n = read (fd, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR))
    for (ssize_t i = 0; i < n; i++)
      if (buffer[i] >= '0' && buffer[i] <= '9')
        pid = pid * 10 + (buffer[i] - '0');
      else if (pid > 0)
        {
          kill (pid, signum);
          listed++;
          pid = 0;
        }
  if (pid > 0)
    {
      kill (pid, signum);
      listed++;
    }
  close (fd);
  return listed;
}

void
cpmesh_kill_descendants (pid_t  watched,
                         int   *watched_status)
{
  /* A killed process's children become the subreaper's children before
   * it can be reaped, so each round finds the next generation. */
  for (;;)
    {
      int status;
      pid_t pid;

      if (signal_children (SIGKILL) < 0)
        {
          /* Without the children file only the process group is known. */
          if (watched > 0)
            kill (-watched, SIGKILL);
        }
      pid = waitpid (-1, &status, __WALL);
      if (pid < 0 && errno == EINTR)
        continue;
      if (pid < 0)
        return;
      if (pid == watched && watched_status != NULL)
        *watched_status = status;
    }
}

/* The keeper holds no descriptor of its own: the rank's output pipes
 * close when the rank and its processes are done with them, and GLib's
 * report pipe closes when the program has been executed. */
static void
drop_descriptors (void)
{
  int null = open ("/dev/null", O_RDWR | O_CLOEXEC);

  if (null >= 0)
    {
      dup2 (null, STDIN_FILENO);
      dup2 (null, STDOUT_FILENO);
      dup2 (null, STDERR_FILENO);
    }
#ifdef SYS_close_range
  if (syscall (SYS_close_range, 3u, ~0u, 0u) == 0)
    return;
#endif
  for (int fd = 3; fd < 65536; fd++)
    close (fd);
}

/* Exits as the rank did: with its status, or killed by its signal (no
 * second core dump). */
G_GNUC_NORETURN static void
exit_as (int status)
{
  if (WIFSIGNALED (status))
    {
      int signum = WTERMSIG (status);
      struct sigaction action = { .sa_handler = SIG_DFL };
      sigset_t set;

      prctl (PR_SET_DUMPABLE, 0);
      sigaction (signum, &action, NULL);
      sigemptyset (&set);
      sigaddset (&set, signum);
      sigprocmask (SIG_UNBLOCK, &set, NULL);
      kill (getpid (), signum);
      _exit (128 + signum);
    }
  _exit (WIFEXITED (status) ? WEXITSTATUS (status) : 1);
}

/* The keeper's life: it waits until the rank exits, the launcher dies
 * or the launcher wants everything killed; then it kills what is left. */
G_GNUC_NORETURN static void
keep (pid_t launcher,
      pid_t program)
{
  const struct timespec poll = { 1, 0 };
  int status = 0;
  sigset_t set;

  keeper_signals (&set);
  for (;;)
    {
      siginfo_t info;
      int signum = sigtimedwait (&set, &info, &poll);
      gboolean exited = FALSE;
      pid_t pid;
      int reaped;

      /* Reaps the rank, and any orphan of its that ended meanwhile. */
      while ((pid = waitpid (-1, &reaped, WNOHANG | __WALL)) > 0)
        if (pid == program)
          {
            status = reaped;
            exited = TRUE;
          }
      /* The parent-death signal may have fired before it was asked for;
       * the launcher's pid tells in any case. */
      if (exited || signum == CPMESH_KEEPER_KILL_NOW || getppid () != launcher)
        break;
    }
  cpmesh_kill_descendants (program, &status);
  exit_as (status);
}

void
cpmesh_keeper_child_setup (gpointer user_data)
{
  const CpmeshKeeper *keeper = user_data;
  pid_t self = getpid ();
  sigset_t caught, before;
  pid_t program;

  setpgid (0, 0);
  prctl (PR_SET_CHILD_SUBREAPER, 1);
  prctl (PR_SET_PDEATHSIG, SIGHUP);
  keeper_signals (&caught);
  sigprocmask (SIG_BLOCK, &caught, &before);
  program = fork ();
  if (program == 0)
    {
      /* The rank's program: dies with its keeper, whatever kills it. */
      sigprocmask (SIG_SETMASK, &before, NULL);
      prctl (PR_SET_PDEATHSIG, SIGKILL);
      if (getppid () != self)
        _exit (128 + SIGKILL);
      return;
    }
  if (program < 0)
    {
      say ("cpmesh launch: cannot fork the rank's process\n");
      _exit (127);
    }
  drop_descriptors ();
  keep (keeper->launcher, program);
}
