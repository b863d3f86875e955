# Cp.Mesh over UCX from Python, in processes of their own.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import subprocess
import sys
import unittest

from cptest import Cp

# The variables a launcher sets; without them a process is a mesh of one.
LAUNCHER_VARIABLES = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'OMPI_COMM_WORLD_RANK',
                      'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK', 'SLURM_PROCID',
                      'SLURM_NTASKS', 'SLURM_LOCALID', 'CPMESH_MESH_DIMS')

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
        env = {name: value for name, value in os.environ.items() if name not in LAUNCHER_VARIABLES}
        result = subprocess.run([sys.executable, '-c', ALONE], env=env, capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, 'ucx 0 1 1 [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]\n')


if __name__ == '__main__':
    unittest.main()
