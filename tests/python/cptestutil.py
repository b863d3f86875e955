# Helpers shared by the Python tests.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import threading
import traceback

import numpy as np

from cptest import Cp, join_all


def T(values, dtype=np.int64):
    """A tensor over a C-contiguous numpy copy of values."""
    return Cp.Tensor.from_numpy(np.ascontiguousarray(np.array(values, dtype=dtype)))


def run_ranks(sizes, func, names=('cp',)):
    """Runs func(mesh) on one thread per rank of a local group and re-raises
    the first failure on the calling thread."""
    meshes = Cp.Mesh.new_local_group(list(names), list(sizes))
    failures = []

    def body(mesh):
        mesh.set_timeout_ms(20000)
        try:
            func(mesh)
        except BaseException:  # noqa: B902 - reported on the calling thread
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=body, args=(mesh,), name='rank %d' % mesh.get_rank(), daemon=True)
               for mesh in meshes]
    for thread in threads:
        thread.start()
    join_all(threads, 50)
    if failures:
        raise AssertionError(failures[0])
