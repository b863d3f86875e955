# The ranks of the Python tests, in one place: ranks of a local group on
# threads of this process, and rank processes started with the
# environment a launcher gives them (as tools/harness does for the C
# tests and the cpmesh tool).
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import socket
import subprocess
import threading
import time

from cptest import Cp

__all__ = ['RANK_TIMEOUT_MS', 'free_port_pair', 'join_all', 'local_group', 'rank_environment',
           'run_group', 'run_processes', 'run_ranks']

# Long enough for a loaded 2-core machine, short enough that a broken test
# fails instead of stalling the suite.
RANK_TIMEOUT_MS = 20000

# ---- ranks on threads ----


def join_all(threads, limit_s):
    """Joins threads started as daemons, failing the test when some are
    still running limit_s seconds from now: a wait that never ends then
    fails at the test's own deadline instead of hanging until Meson kills
    the test, and the daemon threads let the process exit."""
    deadline = time.monotonic() + limit_s
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
    running = [thread.name for thread in threads if thread.is_alive()]
    if running:
        raise AssertionError('still running %g s after they started: %s; a wait that should '
                             'have ended did not' % (limit_s, ', '.join(running)))


def run_ranks(meshes, func, timeout_ms=RANK_TIMEOUT_MS, limit_s=None):
    """Calls func(mesh) on one thread per mesh and returns the results in
    rank order. PyGObject releases the GIL inside every C call, so the
    ranks really block in parallel. The first rank's exception, if any,
    is re-raised here after every thread has finished. Each mesh's timeout
    becomes at most timeout_ms (None leaves it); ranks still running after
    limit_s seconds (by default twice that timeout and 10 s) fail the
    test."""
    results = [None] * len(meshes)
    errors = [None] * len(meshes)

    def body(index, mesh):
        try:
            results[index] = func(mesh)
        except BaseException as e:  # handed to the main thread
            errors[index] = e

    for mesh in meshes:
        if timeout_ms is not None:
            mesh.set_timeout_ms(min(mesh.get_timeout_ms(), timeout_ms))
    if limit_s is None:
        limit_s = 2 * (timeout_ms or RANK_TIMEOUT_MS) / 1000 + 10
    threads = [threading.Thread(target=body, args=(i, m), name='rank %d' % i, daemon=True)
               for i, m in enumerate(meshes)]
    for thread in threads:
        thread.start()
    join_all(threads, limit_s)
    for error in errors:
        if error is not None:
            raise error
    return results


def local_group(sizes, names=('cp',)):
    """A local group with a dimension of each name, of the sizes given."""
    return Cp.Mesh.new_local_group(list(names), list(sizes))


def run_group(sizes, func, names=('cp',), **kwargs):
    """run_ranks() on a new local group (see local_group())."""
    return run_ranks(local_group(sizes, names), func, **kwargs)

# ---- ranks as processes ----


def _bindable(port):
    with socket.socket() as probe:
        try:
            probe.bind(('127.0.0.1', port))
            return True
        except OSError:
            return False


def free_port_pair():
    """A free MASTER_PORT whose successor, where rank 0 listens unless
    CPMESH_PORT says otherwise, is free too."""
    while True:
        with socket.socket() as probe:
            probe.bind(('127.0.0.1', 0))
            port = probe.getsockname()[1]
        if port < 65535 and _bindable(port + 1):
            return port


# What a launcher or libcpmesh reads: a rank gets only what it is given.
FOREIGN_PREFIXES = ('CPMESH_', 'UCX_', 'OMPI_', 'SLURM_')
RANK_VARIABLES = ('RANK', 'LOCAL_RANK', 'GROUP_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR',
                  'MASTER_PORT')


def rank_environment(rank=None, world=None, port=None, **settings):
    """The environment `torchrun --standalone` gives worker rank of a
    world of that size on this host, meeting at MASTER_PORT port, and
    nothing of libcpmesh's own or of another launcher's, with settings
    (NAME=VALUE) over it.  Without a rank: a process no launcher
    started."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(FOREIGN_PREFIXES) and name not in RANK_VARIABLES}
    if rank is not None:
        env.update({
            'RANK': str(rank), 'LOCAL_RANK': str(rank), 'GROUP_RANK': '0',
            'WORLD_SIZE': str(world), 'LOCAL_WORLD_SIZE': str(world),
            'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(port),
        })
    env.update(settings)
    return env


def run_processes(argv, environments, timeout_s=90):
    """Starts argv once per environment, all at once, and gives each one's
    (stdout, stderr, exit status) when all have ended; one still running
    timeout_s seconds after it started is killed and fails the test."""
    ranks = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for env in environments]
    try:
        return [rank.communicate(timeout=timeout_s) + (rank.returncode,) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.communicate()
