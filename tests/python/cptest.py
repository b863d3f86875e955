# Shared fixtures of the Python tests: the Cp namespace and a runner that
# drives one in-process rank per Python thread.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import threading
import time

import gi

gi.require_version('Cp', '1')
from gi.repository import Cp, GLib  # noqa: E402

from reliability import record_error, record_outcome  # noqa: E402

__all__ = ['Cp', 'GLib', 'join_all', 'record_error', 'record_outcome', 'run_ranks']

# Long enough for a loaded 2-core machine, short enough that a broken test
# fails instead of stalling the suite.
RANK_TIMEOUT_MS = 20000


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
    ranks really block in parallel. An exception on any rank is re-raised
    here, after every thread has finished. Ranks still running after
    limit_s seconds (by default twice the mesh timeout and 10 s) fail the
    test."""
    results = [None] * len(meshes)
    errors = [None] * len(meshes)

    def body(index, mesh):
        try:
            results[index] = func(mesh)
        except BaseException as e:  # handed to the main thread
            errors[index] = e

    for mesh in meshes:
        mesh.set_timeout_ms(min(mesh.get_timeout_ms(), timeout_ms))
    threads = [threading.Thread(target=body, args=(i, m), name='rank %d' % i, daemon=True)
               for i, m in enumerate(meshes)]
    for thread in threads:
        thread.start()
    join_all(threads, limit_s if limit_s is not None else 2 * timeout_ms / 1000 + 10)
    for error in errors:
        if error is not None:
            raise error
    return results
