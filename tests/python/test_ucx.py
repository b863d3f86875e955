# Cp.Mesh over UCX from Python, in processes of their own.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import sys
import unittest

import numpy as np

from cptest import Cp, GLib, record_error
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
        # Over UCX by name: on one host the default chain would pick shm.
        [(out, err, status)] = run_processes([sys.executable, '-c', ALONE],
                                             [rank_environment(CPMESH_TRANSPORT='ucx')], timeout_s=60)
        self.assertEqual(status, 0, err)
        self.assertEqual(out, 'ucx 0 1 1 [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]\n')


REFUSED = '''
import gi
gi.require_version("Cp", "1")
from gi.repository import Cp, GLib
try:
    Cp.Mesh.new_from_env()
except GLib.Error as error:
    print(error.domain, error.code, ascii(error.message))
'''


@unittest.skipUnless(Cp.HAS_UCX, 'libcpmesh was built without UCX')
class TestBadEnvironment(unittest.TestCase):
    """Values that are not UTF-8, or hold control characters, reach Python
    as a GLib.Error with the value escaped (a message that is not UTF-8
    cannot be converted: PyGObject would raise RuntimeError instead)."""

    def refuse(self, **settings):
        # '\udcff' is the byte 0xff in the child's environment (os.fsencode).
        [(out, err, status)] = run_processes([sys.executable, '-c', REFUSED],
                                             [rank_environment(0, 2, 29500, **settings)], timeout_s=60)
        self.assertEqual(status, 0, err)
        self.assertNotIn('RuntimeError', err)
        return out

    def test_master_addr_not_utf8(self):
        out = self.refuse(MASTER_ADDR='host\udcff')
        self.assertIn('cp-mesh-error-quark %d' % Cp.MeshError.INVALID_TOPOLOGY, out)
        self.assertIn(r'MASTER_ADDR="host\\xff"', out)

    def test_transport_with_escape(self):
        out = self.refuse(CPMESH_TRANSPORT='\x1b[31mu\udce9cx')
        self.assertIn('cp-mesh-error-quark %d' % Cp.MeshError.UNSUPPORTED, out)
        self.assertIn(r'transport "\\x1b[31mu\\xe9cx"', out)


class TestMeshOptions(unittest.TestCase):

    def test_properties(self):
        options = Cp.MeshOptions(rank=1, world_size=2, port=29501, token='secret', timeout_ms=500,
                                 transport='ucx', dim_names=['dp', 'cp'],
                                 dim_sizes=GLib.Variant('ai', [1, 2]))
        self.assertEqual((options.props.rank, options.props.world_size, options.props.port),
                         (1, 2, 29501))
        self.assertEqual((options.props.token, options.props.transport), ('secret', 'ucx'))
        self.assertIsNone(options.props.address)
        self.assertEqual(options.get_dim_names(), ['dp', 'cp'])
        self.assertEqual(options.get_dim_sizes(), [1, 2])
        self.assertEqual(options.props.dim_sizes.unpack(), [1, 2])

    def test_one_rank_over_local(self):
        options = Cp.MeshOptions(transport='local')
        mesh = Cp.Mesh.new_with_options(options)
        piece = Cp.Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        self.assertEqual(mesh.props.backend, 'local')
        self.assertEqual(mesh.all_gather(piece, 0).numpy().tolist(), piece.numpy().tolist())

    def test_unknown_transport(self):
        with self.assertRaises(GLib.Error) as caught:
            Cp.Mesh.new_with_options(Cp.MeshOptions(transport='carrier-pigeon'))
        record_error(self, 'Cp.Mesh.new_with_options', 'name a transport this build does not have',
                     caught.exception)
        self.assertTrue(caught.exception.matches(Cp.mesh_error_quark(), Cp.MeshError.UNSUPPORTED))
        self.assertIn('"carrier-pigeon"', caught.exception.message)
        self.assertIn('local', caught.exception.message)


if __name__ == '__main__':
    unittest.main()
