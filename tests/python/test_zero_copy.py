# numpy <-> Cp.Tensor without copying, both ways, and who keeps what alive.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import gc
import unittest
import weakref

import numpy as np

from cptest import Cp


def collect():
    # Twice: the first pass may only free the wrappers that hold the rest.
    gc.collect()
    gc.collect()


class TestNumpyToTensor(unittest.TestCase):

    def test_same_address(self):
        array = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        t = Cp.Tensor.from_numpy(array)
        self.assertEqual(t.get_data_address(), array.ctypes.data)
        self.assertEqual(t.get_shape(), [2, 3, 4])
        self.assertEqual(t.get_dtype(), Cp.DType.FLOAT32)
        self.assertEqual(t.get_storage().get_kind(), Cp.StorageKind.BORROWED)

    def test_large_array_is_not_copied(self):
        array = np.zeros(16 << 20, dtype=np.float32)  # 64 MiB
        t = Cp.Tensor.from_numpy(array)
        self.assertEqual(t.get_data_address(), array.ctypes.data)
        self.assertEqual(t.get_nbytes(), array.nbytes)

    def test_numpy_writes_are_seen_by_the_tensor(self):
        array = np.zeros((3, 4), dtype=np.int64)
        t = Cp.Tensor.from_numpy(array)
        array[1, 2] = 42
        array[2, 3] = -7
        self.assertEqual(t.get_value(6), 42)
        self.assertEqual(t.get_value(11), -7)

    def test_tensor_writes_are_seen_by_numpy(self):
        array = np.zeros(8, dtype=np.float64)
        t = Cp.Tensor.from_numpy(array)
        t.set_value(5, 2.5)
        self.assertEqual(array[5], 2.5)

    def test_library_writes_are_seen_by_numpy(self):
        # A layout shard_into fills numpy memory the caller owns.
        layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2)
        src = Cp.Tensor.from_numpy(np.arange(8, dtype=np.int32))
        out_array = np.full(4, -1, dtype=np.int32)
        layout.shard_into(src, 0, 1, Cp.Tensor.from_numpy(out_array))
        self.assertEqual(out_array.tolist(), [2, 3, 4, 5])

    def test_the_tensor_keeps_the_array_alive(self):
        array = np.arange(4, dtype=np.float32)
        alive = weakref.ref(array)
        t = Cp.Tensor.from_numpy(array)
        del array
        collect()
        self.assertIsNotNone(alive())
        self.assertEqual([t.get_value(i) for i in range(4)], [0, 1, 2, 3])
        del t
        collect()
        self.assertIsNone(alive())

    def test_a_shared_view_keeps_the_array_alive(self):
        array = np.arange(6, dtype=np.int32)
        alive = weakref.ref(array)
        view = Cp.Tensor.from_numpy(array).narrow(0, 2, 3)
        del array
        collect()
        self.assertIsNotNone(alive())
        self.assertEqual(view.numpy().tolist(), [2, 3, 4])
        del view
        collect()
        self.assertIsNone(alive())

    def test_release_keeps_an_exception_in_flight(self):
        # A call that fails with a temporary tensor as its argument frees
        # the tensor, and the array with it, while its error propagates:
        # that error, not a SystemError, reaches the caller.
        for np_dtype, dtype in ((np.float64, None), (np.bool_, None), (np.uint16, Cp.DType.BFLOAT16)):
            with self.subTest(dtype=np_dtype):
                array = np.zeros(3, dtype=np_dtype)
                alive = weakref.ref(array)
                with self.assertRaisesRegex(TypeError, 'Must be number'):
                    Cp.Tensor.from_numpy(array, dtype).narrow('one', 0, 1)
                del array
                collect()
                self.assertIsNone(alive())

    def test_bool_and_bfloat16_are_shared(self):
        flags = np.array([True, False, True])
        bits = Cp.float32_to_bfloat16(np.array([1.5, -2.0], dtype=np.float32))
        as_bool = Cp.Tensor.from_numpy(flags)
        as_bfloat16 = Cp.Tensor.from_numpy(bits, dtype=Cp.DType.BFLOAT16)
        self.assertEqual(as_bool.get_data_address(), flags.ctypes.data)
        self.assertEqual(as_bool.get_dtype(), Cp.DType.BOOL)
        self.assertEqual(as_bfloat16.get_data_address(), bits.ctypes.data)
        self.assertEqual(as_bfloat16.get_dtype(), Cp.DType.BFLOAT16)
        self.assertEqual([as_bfloat16.get_value(i) for i in range(2)], [1.5, -2.0])
        as_bool.set_value(1, 1)
        self.assertEqual(flags.tolist(), [True, True, True])


class TestTensorToNumpy(unittest.TestCase):

    def test_same_address(self):
        t = Cp.Tensor.new_arange(Cp.DType.INT32, 0, 12, 1)
        array = t.numpy()
        self.assertEqual(array.ctypes.data, t.get_data_address())
        self.assertEqual(array.dtype, np.int32)
        self.assertEqual(array.tolist(), list(range(12)))

    def test_numpy_writes_are_seen_by_the_tensor(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [2, 2])
        t.numpy()[1, 0] = 3.5
        self.assertEqual(t.get_value(2), 3.5)

    def test_tensor_writes_are_seen_by_numpy(self):
        t = Cp.Tensor.new(Cp.DType.UINT8, [4])
        array = t.numpy()
        t.set_value(3, 200)
        self.assertEqual(array[3], 200)

    def test_round_trip_shares_one_buffer(self):
        array = np.arange(10, dtype=np.float64)
        back = Cp.Tensor.from_numpy(array).numpy()
        self.assertTrue(np.shares_memory(array, back))
        back[0] = 99
        self.assertEqual(array[0], 99)

    def test_view_keeps_owned_storage_alive(self):
        t = Cp.Tensor.new_full(Cp.DType.FLOAT32, [1024], 7.0)
        array = t.numpy()
        address = t.get_data_address()
        del t
        collect()
        # Freed host blocks are recycled for allocations of the same size:
        # had the storage died with the tensor, these would overwrite it.
        others = [Cp.Tensor.new_full(Cp.DType.FLOAT32, [1024], -1.0) for _ in range(4)]
        self.assertNotIn(address, [o.get_data_address() for o in others])
        self.assertTrue((array == 7.0).all())

    def test_view_keeps_borrowed_array_alive(self):
        source = np.arange(5, dtype=np.int64)
        alive = weakref.ref(source)
        view = Cp.Tensor.from_numpy(source).numpy()
        del source
        collect()
        self.assertIsNotNone(alive())
        self.assertEqual(view.tolist(), [0, 1, 2, 3, 4])
        del view
        collect()
        self.assertIsNone(alive())

    def test_array_protocol(self):
        t = Cp.Tensor.new_arange(Cp.DType.INT64, 0, 4, 1)
        self.assertEqual(np.asarray(t).tolist(), [0, 1, 2, 3])
        self.assertEqual(np.asarray(t).ctypes.data, t.get_data_address())
        self.assertEqual(np.asarray(t, dtype=np.float32).dtype, np.float32)
        copied = np.array(t)
        self.assertNotEqual(copied.ctypes.data, t.get_data_address())
        self.assertEqual(t.__array__(copy=True).tolist(), [0, 1, 2, 3])
        self.assertNotEqual(t.__array__(copy=True).ctypes.data, t.get_data_address())

    def test_empty_tensor(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [0, 3])
        self.assertEqual(t.numpy().shape, (0, 3))


if __name__ == '__main__':
    unittest.main(verbosity=2)
