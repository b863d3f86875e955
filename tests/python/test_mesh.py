# Cp.Mesh from Python: one in-process rank per Python thread.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import time
import unittest

import numpy as np

from cptest import Cp, GLib, record_error
from ranks import run_ranks


def group(size, name='cp'):
    return Cp.Mesh.new_local_group({name: size})


def rank_tensor(mesh, shape, dtype=np.float32):
    """Element i of rank r holds 100*r + i."""
    n = int(np.prod(shape))
    return Cp.Tensor.from_numpy((np.arange(n) + 100 * mesh.get_rank()).astype(dtype).reshape(shape))


def rank_array(rank, shape, dtype=np.float32):
    n = int(np.prod(shape))
    return (np.arange(n) + 100 * rank).astype(dtype).reshape(shape)


class TestProperties(unittest.TestCase):

    def test_import_builds_call_caches(self):
        # Rank threads must never make the first call of a function (see
        # the override's _build_call_caches): importing Cp calls every one
        # with arguments that each must refuse before reaching C.
        import gi.overrides.Cp as override
        self.assertEqual(override._CALLS_NOT_REFUSED, [])
        self.assertGreater(len(list(override._callables())), 150)

    def test_local_group(self):
        meshes = Cp.Mesh.new_local_group(['dp', 'cp'], [2, 3])
        self.assertEqual([m.get_rank() for m in meshes], list(range(6)))
        m = meshes[4]
        self.assertEqual(m.get_world_size(), 6)
        self.assertEqual(m.props.world_size, 6)
        self.assertEqual(m.get_backend(), 'local')
        self.assertEqual(m.get_dim_names(), ['dp', 'cp'])
        self.assertEqual(m.get_dim_sizes(), [2, 3])
        self.assertEqual(m.props.dim_sizes.unpack(), [2, 3])
        self.assertEqual(m.get_dim_size('cp'), 3)
        self.assertEqual(m.get_dim_size('tp'), -1)
        self.assertEqual((m.get_coordinate('dp'), m.get_coordinate('cp')), (1, 1))

    def test_dict_form_matches_lists(self):
        a = Cp.Mesh.new_local_group({'dp': 2, 'cp': 2})
        b = Cp.Mesh.new_local_group(['dp', 'cp'], [2, 2])
        self.assertEqual([m.get_dim_names() for m in a], [m.get_dim_names() for m in b])
        self.assertEqual(a[3].get_coordinate('cp'), 1)

    def test_bad_topology(self):
        with self.assertRaises(GLib.Error) as caught:
            Cp.Mesh.new_local_group({'dp': 2, 'cp': 0})
        self.assertTrue(caught.exception.matches(Cp.mesh_error_quark(), Cp.MeshError.INVALID_TOPOLOGY))
        self.assertIn('size 0', caught.exception.message)
        record_error(self, 'CpMesh', 'cp_mesh_new_local_group with a dimension of size 0',
                     caught.exception)
        with self.assertRaises(GLib.Error) as caught:
            Cp.Mesh.new_local_group(['dp', 'dp'], [1, 2])
        self.assertIn('"dp"', caught.exception.message)
        record_error(self, 'CpMesh', 'cp_mesh_new_local_group with a repeated dimension name',
                     caught.exception)

    def test_timeout_property(self):
        m = group(1)[0]
        seen = []
        m.connect('notify::timeout-ms', lambda *a: seen.append(m.get_timeout_ms()))
        m.props.timeout_ms = 1500
        m.set_timeout_ms(1500)
        self.assertEqual(seen, [1500])


class TestCollectives(unittest.TestCase):

    def test_all_gather_along_every_dim(self):
        shape = [2, 3, 4]
        for dim in (0, 1, 2, -1):
            meshes = group(4)
            results = run_ranks(meshes, lambda m: m.all_gather(rank_tensor(m, shape), dim).numpy())
            expected = np.concatenate([rank_array(r, shape) for r in range(4)], axis=dim)
            for r, got in enumerate(results):
                self.assertTrue(np.array_equal(got, expected), (dim, r))

    def test_all_to_all(self):
        meshes = group(3)
        results = run_ranks(meshes, lambda m: m.all_to_all(rank_tensor(m, [6, 2]), 0).numpy())
        for r, got in enumerate(results):
            # Piece r of every rank, in rank order.
            expected = np.concatenate([rank_array(src, [6, 2])[2 * r:2 * r + 2] for src in range(3)])
            self.assertTrue(np.array_equal(got, expected), r)

    def test_all_to_all_into(self):
        meshes = group(3)

        def exchange(m):
            out = Cp.Tensor.from_numpy(np.zeros([6, 2], np.float32))
            m.all_to_all_into(rank_tensor(m, [6, 2]), 0, out)
            return out.numpy()

        results = run_ranks(meshes, exchange)
        for r, got in enumerate(results):
            expected = np.concatenate([rank_array(src, [6, 2])[2 * r:2 * r + 2] for src in range(3)])
            self.assertTrue(np.array_equal(got, expected), r)

    def test_all_reduce(self):
        for dtype, np_dtype in [(Cp.DType.INT32, np.int32), (Cp.DType.INT64, np.int64),
                                (Cp.DType.FLOAT32, np.float32), (Cp.DType.FLOAT64, np.float64)]:
            for op, fold in [(Cp.ReduceOp.SUM, np.sum), (Cp.ReduceOp.MAX, np.max),
                             (Cp.ReduceOp.MIN, np.min)]:
                def reduce(m):
                    t = Cp.Tensor.from_numpy(np.array([m.get_rank() * 3 - 4, 7, -m.get_rank()],
                                                      dtype=np_dtype))
                    self.assertTrue(m.all_reduce(t, op))
                    return t.numpy().tolist()
                inputs = np.array([[r * 3 - 4, 7, -r] for r in range(4)])
                expected = fold(inputs, axis=0).tolist()
                for got in run_ranks(group(4), reduce):
                    self.assertEqual(got, expected, (dtype, op))

    def test_all_reduce_bfloat16(self):
        def reduce(m):
            bits = Cp.float32_to_bfloat16(np.array([0.5 * (m.get_rank() + 1), -1.0], dtype=np.float32))
            self.assertTrue(m.all_reduce(Cp.Tensor.from_numpy(bits, dtype=Cp.DType.BFLOAT16),
                                         Cp.ReduceOp.SUM))
            return Cp.bfloat16_to_float32(bits).tolist()
        for got in run_ranks(group(2), reduce):
            self.assertEqual(got, [1.5, -2.0])

    def test_broadcast(self):
        def body(m):
            t = rank_tensor(m, [5])
            self.assertTrue(m.broadcast(t, 2))
            return t.numpy().tolist()
        for got in run_ranks(group(3), body):
            self.assertEqual(got, rank_array(2, [5]).tolist())

    def test_send_recv_pair(self):
        def body(m):
            if m.get_rank() == 0:
                self.assertTrue(m.send(Cp.Tensor.new_arange(Cp.DType.INT32, 0, 4, 1), 1, 7))
                return None
            t = Cp.Tensor.new(Cp.DType.INT32, [4])
            self.assertTrue(m.recv(t, 0, 7))
            return t.numpy().tolist()
        self.assertEqual(run_ranks(group(2), body), [None, [0, 1, 2, 3]])

    def test_send_recv_ring(self):
        def body(m):
            n = m.get_world_size()
            r = m.get_rank()
            received = Cp.Tensor.new(Cp.DType.FLOAT32, [3])
            self.assertTrue(m.send_recv(rank_tensor(m, [3]), (r + 1) % n, received, (r - 1) % n, 1))
            return received.numpy().tolist()
        results = run_ranks(group(4), body)
        for r, got in enumerate(results):
            self.assertEqual(got, rank_array((r - 1) % 4, [3]).tolist())

    def test_barrier(self):
        arrived = []

        def body(m):
            if m.get_rank() == 1:
                time.sleep(0.1)
            arrived.append(m.get_rank())
            self.assertTrue(m.barrier())
            return len(arrived)
        # Nobody leaves the barrier before the late rank has arrived.
        self.assertEqual(run_ranks(group(3), body), [3, 3, 3])


class TestSubmesh(unittest.TestCase):

    def test_dp_by_cp(self):
        def body(m):
            cp = m.get_submesh('cp')
            dp = m.get_submesh('dp')
            self.assertEqual(cp.get_world_size(), 2)
            self.assertEqual(dp.get_world_size(), 2)
            self.assertEqual(cp.get_rank(), m.get_coordinate('cp'))
            self.assertIs(m.get_submesh('cp'), cp)
            gathered = cp.all_gather(Cp.Tensor.new_full(Cp.DType.INT32, [1], m.get_rank()), 0)
            total = Cp.Tensor.new_full(Cp.DType.INT32, [1], m.get_rank())
            self.assertTrue(dp.all_reduce(total, Cp.ReduceOp.SUM))
            return gathered.numpy().tolist(), total.get_value(0)
        results = run_ranks(Cp.Mesh.new_local_group({'dp': 2, 'cp': 2}), body)
        # Ranks are row-major: dp group {0,2} and {1,3}, cp group {0,1} and {2,3}.
        self.assertEqual(results, [([0, 1], 2), ([0, 1], 4), ([2, 3], 2), ([2, 3], 4)])

    def test_unknown_dimension(self):
        m = Cp.Mesh.new_local_group({'dp': 1, 'cp': 1})[0]
        with self.assertRaises(GLib.Error) as caught:
            m.get_submesh('tp')
        self.assertTrue(caught.exception.matches(Cp.mesh_error_quark(), Cp.MeshError.INVALID_TOPOLOGY))
        self.assertIn('no dimension "tp"; it has dp, cp', caught.exception.message)
        record_error(self, 'CpMesh', 'cp_mesh_get_submesh of a dimension the mesh does not have',
                     caught.exception)


class TestFailures(unittest.TestCase):

    def test_missing_rank_times_out(self):
        def body(m):
            m.set_timeout_ms(300)
            if m.get_rank() == 2:
                return None  # never arrives
            start = time.monotonic()
            try:
                m.all_gather(Cp.Tensor.new(Cp.DType.FLOAT32, [4]), 0)
            except GLib.Error as e:
                return e, time.monotonic() - start
            return 'no error', 0
        results = run_ranks(group(3), body, limit_s=10)
        for error, waited in results[:2]:
            self.assertIsInstance(error, GLib.Error)
            self.assertTrue(error.matches(Cp.mesh_error_quark(), Cp.MeshError.TIMED_OUT))
            self.assertIn('2 (mesh rank 2)', error.message)
            self.assertGreaterEqual(waited, 0.25)
            self.assertLess(waited, 10)
            record_error(self, 'CpMesh', 'a collective one rank never joins, within the timeout',
                         error)

    def _disagree(self, body):
        def guarded(m):
            try:
                body(m)
            except GLib.Error as e:
                return e
            return None
        errors = run_ranks(group(2), guarded)
        self.assertTrue(all(isinstance(e, GLib.Error) for e in errors), errors)
        return errors

    def test_shape_disagreement_fails_on_every_rank(self):
        def body(m):
            t = Cp.Tensor.from_numpy(np.arange(4 + m.get_rank(), dtype=np.int32))
            m.all_gather(t, 0)
        for e in self._disagree(body):
            self.assertTrue(e.matches(Cp.tensor_error_quark(), Cp.TensorError.SHAPE))
            self.assertIn('rank 0 passed int32[4], rank 1 passed int32[5]', e.message)
            record_error(self, 'CpMesh', 'a collective whose ranks pass different shapes', e)

    def test_dtype_disagreement_fails_on_every_rank(self):
        def body(m):
            m.all_gather(Cp.Tensor.new(Cp.DType.INT32 if m.get_rank() == 0 else Cp.DType.INT64, [4]), 0)
        for e in self._disagree(body):
            self.assertTrue(e.matches(Cp.tensor_error_quark(), Cp.TensorError.DTYPE))
            record_error(self, 'CpMesh', 'a collective whose ranks pass different dtypes', e)

    def test_operation_disagreement_fails_on_every_rank(self):
        def body(m):
            t = Cp.Tensor.new(Cp.DType.INT32, [4])
            if m.get_rank() == 0:
                m.all_gather(t, 0)
            else:
                m.all_reduce(t, Cp.ReduceOp.SUM)
        for e in self._disagree(body):
            self.assertTrue(e.matches(Cp.mesh_error_quark(), Cp.MeshError.INVALID_TOPOLOGY))
            self.assertIn('rank 0 called all_gather, rank 1 called all_reduce', e.message)
            record_error(self, 'CpMesh', 'ranks that call different collectives at the same step', e)

    def test_disagreement_leaves_the_tensor_untouched(self):
        def body(m):
            t = Cp.Tensor.from_numpy(np.arange(4 + m.get_rank(), dtype=np.float32))
            try:
                m.all_reduce(t, Cp.ReduceOp.SUM)
            except GLib.Error:
                return t.numpy().tolist()
        self.assertEqual(run_ranks(group(2), body), [[0, 1, 2, 3], [0, 1, 2, 3, 4]])


class TestUnshard(unittest.TestCase):

    # SEED-SEMANTICS E5: logits [B, 4, V] per rank, C = 2.
    def test_reference_example(self):
        full = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)
        layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2)

        def body(m):
            local = layout.shard(Cp.Tensor.from_numpy(full), 1, m.get_rank())
            return m.unshard(local, 1).numpy()
        for got in run_ranks(group(2), body):
            self.assertTrue(np.array_equal(got, full))

    def test_round_trip_on_the_cp_submesh(self):
        full = np.arange(4 * 16, dtype=np.int64).reshape(4, 16)

        def body(m):
            cp = m.get_submesh('cp')
            layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 16, cp.get_world_size())
            local = layout.shard(Cp.Tensor.from_numpy(full), -1, cp.get_rank())
            return cp.unshard(local, -1).numpy()
        for got in run_ranks(Cp.Mesh.new_local_group({'dp': 2, 'cp': 4}), body):
            self.assertTrue(np.array_equal(got, full))

    def test_thd_layout(self):
        ids = np.array([101, 102, 103, 104, 105, 106, 0, 0, 201, 202, 203, 0], dtype=np.int64)
        layout = Cp.Layout.new_thd([0, 8, 12], 2)

        def body(m):
            local = layout.shard(Cp.Tensor.from_numpy(ids), 0, m.get_rank())
            return m.unshard_layout(local, 0, layout).numpy()
        for got in run_ranks(group(2), body):
            self.assertEqual(got.tolist(), ids.tolist())

    def test_odd_local_length(self):
        def body(m):
            try:
                m.unshard(Cp.Tensor.new(Cp.DType.FLOAT32, [3]), 0)
            except GLib.Error as e:
                return e
        for error in run_ranks(group(2), body):
            self.assertTrue(error.matches(Cp.tensor_error_quark(), Cp.TensorError.SHAPE))
            record_error(self, 'CpMesh', 'cp_mesh_unshard of a local length not divisible by 2',
                         error)


if __name__ == '__main__':
    unittest.main(verbosity=2)
