# Shared fixtures of the Python tests: the Cp namespace and a runner that
# drives one in-process rank per Python thread.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import threading

import gi

gi.require_version('Cp', '1')
from gi.repository import Cp, GLib  # noqa: E402

from reliability import record_error, record_outcome  # noqa: E402

__all__ = ['Cp', 'GLib', 'record_error', 'record_outcome', 'run_ranks']

# Long enough for a loaded 2-core machine, short enough that a broken test
# fails instead of stalling the suite.
RANK_TIMEOUT_MS = 20000


def run_ranks(meshes, func, timeout_ms=RANK_TIMEOUT_MS):
    """Calls func(mesh) on one thread per mesh and returns the results in
    rank order. PyGObject releases the GIL inside every C call, so the
    ranks really block in parallel. An exception on any rank is re-raised
    here, after every thread has finished."""
    results = [None] * len(meshes)
    errors = [None] * len(meshes)

    def body(index, mesh):
        try:
            results[index] = func(mesh)
        except BaseException as e:  # handed to the main thread
            errors[index] = e

    for mesh in meshes:
        mesh.set_timeout_ms(min(mesh.get_timeout_ms(), timeout_ms))
    threads = [threading.Thread(target=body, args=(i, m)) for i, m in enumerate(meshes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results
