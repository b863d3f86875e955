# Cp.Mesh over UCX from Python, in processes of their own.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import sys
import unittest

from cptest import Cp
from ranks import rank_environment, run_processes

ALONE = '''
import numpy as np
import gi
gi.require_version("Cp", "1")
from gi.repository import Cp
mesh = Cp.Mesh.new_from_env()
piece = Cp.Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
gathered = mesh.all_gather(piece, 0).numpy()
print(mesh.props.backend, mesh.get_rank(), mesh.get_world_size(), mesh.get_dim_size("cp"),
      gathered.tolist())
'''


@unittest.skipUnless(Cp.HAS_UCX, 'libcpmesh was built without UCX')
class TestWithoutLauncher(unittest.TestCase):

    def test_new_from_env_is_one_rank(self):
        [(out, err, status)] = run_processes([sys.executable, '-c', ALONE], [rank_environment()],
                                             timeout_s=60)
        self.assertEqual(status, 0, err)
        self.assertEqual(out, 'ucx 0 1 1 [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]\n')


if __name__ == '__main__':
    unittest.main()
