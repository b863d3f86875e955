# Cp.Tensor from Python: constructors, dtypes, views and errors.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import unittest

import numpy as np

from cptest import Cp, GLib, record_error, record_outcome

ALL_DTYPES = [Cp.DType.BOOL, Cp.DType.UINT8, Cp.DType.INT32, Cp.DType.INT64,
              Cp.DType.FLOAT16, Cp.DType.BFLOAT16, Cp.DType.FLOAT32, Cp.DType.FLOAT64]


class TensorErrorMixin:

    def assertTensorError(self, what, code, fragment, func, *args):
        """func(*args) fails with code; the case is recorded as what."""
        with self.assertRaises(GLib.Error) as caught:
            func(*args)
        error = caught.exception
        self.assertTrue(error.matches(Cp.tensor_error_quark(), code),
                        '%s is not %s' % (error, code))
        self.assertEqual(error.domain, 'cp-tensor-error-quark')
        self.assertIn(fragment, error.message)
        record_error(self, 'CpTensor', what, error)

    def assertRejected(self, what, exception, fragment, func, *args):
        """The Python override refuses func(*args) with exception."""
        with self.assertRaisesRegex(exception, fragment) as caught:
            func(*args)
        record_outcome(self, 'CpTensor', what, exception.__name__, str(caught.exception))


class TestConstructors(unittest.TestCase):

    def test_new_is_zero_filled(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [2, 3])
        self.assertEqual(t.get_shape(), [2, 3])
        self.assertEqual(t.shape, (2, 3))
        self.assertEqual(t.get_n_dims(), 2)
        self.assertEqual(t.get_numel(), 6)
        self.assertEqual(t.get_nbytes(), 24)
        self.assertEqual(t.get_device(), Cp.DeviceKind.HOST)
        self.assertEqual(t.props.numel, 6)
        self.assertEqual(t.props.dtype, Cp.DType.FLOAT32)
        self.assertEqual(t.get_data_address() % 64, 0)
        self.assertEqual([t.get_value(i) for i in range(6)], [0.0] * 6)
        self.assertEqual(t.describe(), 'float32[2, 3] on host')
        self.assertEqual(repr(t), '<Cp.Tensor float32[2, 3] on host>')

    def test_scalar(self):
        t = Cp.Tensor.new_full(Cp.DType.INT64, [], 7)
        self.assertEqual(t.get_shape(), [])
        self.assertEqual(t.get_numel(), 1)
        self.assertEqual(t.get_value(0), 7)
        self.assertEqual(t.numpy().shape, ())
        with self.assertRaises(TypeError):
            len(t)

    def test_arange_and_full(self):
        a = Cp.Tensor.new_arange(Cp.DType.INT32, 3, -4, -2)
        self.assertEqual(a.numpy().tolist(), [3, 1, -1, -3])
        f = Cp.Tensor.new_full(Cp.DType.UINT8, [2, 2], 300)
        self.assertEqual(f.numpy().tolist(), [[255, 255], [255, 255]])  # saturates
        h = Cp.Tensor.new_full(Cp.DType.FLOAT16, [3], 0.1)
        self.assertEqual(h.numpy().dtype, np.float16)
        self.assertEqual(h.numpy().tolist(), [np.float16(0.1)] * 3)

    def test_from_bytes_is_a_view(self):
        data = np.arange(4, dtype=np.int32).tobytes()
        gbytes = GLib.Bytes.new(data)
        t = Cp.Tensor.new_from_bytes(Cp.DType.INT32, [2, 2], gbytes)
        self.assertEqual(t.numpy().tolist(), [[0, 1], [2, 3]])
        self.assertEqual(t.get_storage().get_kind(), Cp.StorageKind.BYTES)

    def test_dtype_names_and_sizes(self):
        sizes = [1, 1, 4, 8, 2, 2, 4, 8]
        for dtype, size in zip(ALL_DTYPES, sizes):
            self.assertEqual(Cp.dtype_get_size(dtype), size)
            found, back = Cp.dtype_from_name(Cp.dtype_get_name(dtype))
            self.assertTrue(found)
            self.assertEqual(back, dtype)
        self.assertEqual(Cp.dtype_get_name(Cp.DType.BFLOAT16), 'bfloat16')

    def test_every_dtype_round_trips_numpy(self):
        for dtype in ALL_DTYPES:
            t = Cp.Tensor.new_arange(dtype, 0, 2 if dtype == Cp.DType.BOOL else 6, 1)
            back = Cp.Tensor.from_numpy(t.numpy(), dtype=dtype)
            self.assertTrue(back.equal(t), Cp.dtype_get_name(dtype))
            self.assertEqual(back.get_dtype(), dtype)

    def test_copy_and_equal(self):
        t = Cp.Tensor.new_arange(Cp.DType.FLOAT64, 0, 6, 1)
        c = t.copy()
        self.assertTrue(c.equal(t))
        self.assertNotEqual(c.get_data_address(), t.get_data_address())
        c.set_value(0, -1)
        self.assertFalse(c.equal(t))
        self.assertEqual(t.get_value(0), 0)
        self.assertFalse(t.equal(Cp.Tensor.new_arange(Cp.DType.FLOAT32, 0, 6, 1)))

    def test_requires_grad_notifies(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [1])
        seen = []
        t.connect('notify::requires-grad', lambda obj, pspec: seen.append(obj.props.requires_grad))
        t.set_requires_grad(True)
        t.props.requires_grad = True  # unchanged: no second notification
        self.assertEqual(seen, [True])
        self.assertTrue(t.copy().get_requires_grad())


class TestBFloat16(unittest.TestCase):

    def test_helpers_round_to_nearest_even(self):
        values = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, np.inf], dtype=np.float32)
        bits = Cp.float32_to_bfloat16(values)
        self.assertEqual(bits.dtype, np.uint16)
        self.assertEqual(bits.tolist(), [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80])
        self.assertEqual(Cp.bfloat16_to_float32(bits).tolist(),
                         [1.0, 1.0, 1 + 2 ** -6, -2.5, np.inf])
        self.assertTrue(np.isnan(Cp.bfloat16_to_float32(Cp.float32_to_bfloat16(np.float32('nan')))))

    def test_helpers_agree_with_the_library(self):
        for value in [1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.14159, -1e-3, 65504.0]:
            t = Cp.Tensor.new_full(Cp.DType.BFLOAT16, [1], value)
            expected = Cp.float32_to_bfloat16(np.array([value], dtype=np.float32))
            self.assertEqual(t.numpy().tolist(), expected.tolist(), value)

    def test_tensor_from_bits(self):
        values = np.array([0.5, -3.0, 1024.0, 7.0], dtype=np.float32)
        bits = Cp.float32_to_bfloat16(values)
        t = Cp.Tensor.from_numpy(bits, dtype=Cp.DType.BFLOAT16)
        self.assertEqual(t.get_dtype(), Cp.DType.BFLOAT16)
        self.assertEqual([t.get_value(i) for i in range(4)], values.tolist())
        t.set_value(1, 2.0)
        self.assertEqual(Cp.bfloat16_to_float32(bits)[1], 2.0)

    def test_uint16_needs_an_explicit_dtype(self):
        with self.assertRaisesRegex(TypeError, 'BFLOAT16'):
            Cp.Tensor.from_numpy(np.zeros(4, dtype=np.uint16))
        with self.assertRaisesRegex(TypeError, 'numpy uint16 array, not float32'):
            Cp.Tensor.from_numpy(np.zeros(4, dtype=np.float32), dtype=Cp.DType.BFLOAT16)


class TestNarrow(unittest.TestCase):

    def test_leading_dimension_is_a_view(self):
        t = Cp.Tensor.new_arange(Cp.DType.INT64, 0, 12, 1)
        rows = Cp.Tensor.from_numpy(t.numpy().reshape(3, 4))
        view = rows.narrow(0, 1, 2)
        self.assertEqual(view.get_shape(), [2, 4])
        self.assertEqual(view.get_data_address(), rows.get_data_address() + 4 * 8)
        self.assertEqual(view.get_storage_offset(), 32)
        view.set_value(0, -5)
        self.assertEqual(rows.get_value(4), -5)

    def test_inner_dimension_is_a_copy(self):
        rows = Cp.Tensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
        cols = rows.narrow(1, 1, 2)
        self.assertEqual(cols.numpy().tolist(), [[1, 2], [5, 6], [9, 10]])
        self.assertNotEqual(cols.get_storage().get_data_address(),
                            rows.get_storage().get_data_address())
        cols.set_value(0, 100)
        self.assertEqual(rows.get_value(1), 1)

    def test_inner_dimension_after_unit_dimensions_is_a_view(self):
        rows = Cp.Tensor.from_numpy(np.arange(8, dtype=np.int32).reshape(1, 8))
        view = rows.narrow(-1, 2, 3)
        self.assertEqual(view.numpy().tolist(), [[2, 3, 4]])
        self.assertEqual(view.get_data_address(), rows.get_data_address() + 8)


class TestErrors(TensorErrorMixin, unittest.TestCase):

    def test_bad_shapes(self):
        self.assertTensorError('cp_tensor_new with a dimension of negative size',
                               Cp.TensorError.SHAPE, 'dimension 1 has negative size -1',
                               Cp.Tensor.new, Cp.DType.FLOAT32, [2, -1])
        self.assertTensorError('cp_tensor_new with 9 dimensions (at most 8)',
                               Cp.TensorError.SHAPE, 'at most 8 dimensions, 9 were given',
                               Cp.Tensor.new, Cp.DType.FLOAT32, [1] * 9)
        self.assertTensorError('cp_tensor_new whose element count × size overflows 64 bits',
                               Cp.TensorError.SHAPE, 'overflows',
                               Cp.Tensor.new, Cp.DType.FLOAT64, [2 ** 40, 2 ** 40])

    def test_bytes_of_the_wrong_size(self):
        gbytes = GLib.Bytes.new(bytes(24))
        self.assertTensorError('cp_tensor_new_from_bytes with fewer bytes than the shape needs',
                               Cp.TensorError.SHAPE,
                               'a float32 tensor of shape [2, 4] needs 32 bytes, but 24 were given',
                               Cp.Tensor.new_from_bytes, Cp.DType.FLOAT32, [2, 4], gbytes)

    def test_narrow_out_of_range(self):
        t = Cp.Tensor.new(Cp.DType.INT32, [2, 4])
        self.assertTensorError('cp_tensor_narrow past the end of the dimension',
                               Cp.TensorError.OUT_OF_RANGE,
                               '[3, 5) is outside dimension 1 of size 4',
                               t.narrow, 1, 3, 2)
        self.assertTensorError('cp_tensor_narrow of a dimension that does not exist',
                               Cp.TensorError.SHAPE, 'dimension 2 does not exist in int32[2, 4]',
                               t.narrow, 2, 0, 1)

    def test_arange_step_zero(self):
        self.assertTensorError('cp_tensor_new_arange with step 0',
                               Cp.TensorError.OUT_OF_RANGE, 'step must not be zero',
                               Cp.Tensor.new_arange, Cp.DType.INT32, 0, 4, 0)

    def test_to_cuda_without_cuda(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [2])
        self.assertIs(t.to_device(Cp.DeviceKind.HOST), t)
        if not Cp.HAS_CUDA:
            self.assertTensorError('cp_tensor_to_device to CUDA in a build without CUDA',
                                   Cp.TensorError.DEVICE, 'no CUDA support',
                                   t.to_device, Cp.DeviceKind.CUDA)

    def test_test_memory_round_trip(self):
        t = Cp.Tensor.new_arange(Cp.DType.FLOAT32, 0, 6, 1)
        moved = t.to_device(Cp.DeviceKind.TEST)
        self.assertEqual(moved.get_device(), Cp.DeviceKind.TEST)
        self.assertEqual([moved.get_value(i) for i in range(6)], [0, 1, 2, 3, 4, 5])
        moved.set_value(2, -1)
        back = moved.to_device(Cp.DeviceKind.HOST)
        self.assertEqual(back.get_device(), Cp.DeviceKind.HOST)
        self.assertEqual(back.numpy().tolist(), [0, 1, -1, 3, 4, 5])
        with self.assertRaisesRegex(ValueError, 'in test memory'):
            moved.numpy()

    def test_misaligned_numpy_memory(self):
        raw = np.zeros(17, dtype=np.uint8)
        shifted = raw[1:].view(np.float32)  # numpy allows an unaligned view
        self.assertFalse(shifted.flags.aligned)
        self.assertTensorError('Tensor.from_numpy of an array not aligned to its element size',
                               Cp.TensorError.MISALIGNED, 'float32 elements need 4-byte alignment',
                               Cp.Tensor.from_numpy, shifted)

    def test_override_rejects_arrays_it_cannot_share(self):
        self.assertRejected('Tensor.from_numpy of a strided (not C-contiguous) array',
                            ValueError, 'C-contiguous',
                            Cp.Tensor.from_numpy, np.zeros((4, 4), dtype=np.float32)[:, 1])
        frozen = np.zeros(4, dtype=np.float32)
        frozen.flags.writeable = False
        self.assertRejected('Tensor.from_numpy of a read-only array',
                            ValueError, 'writable', Cp.Tensor.from_numpy, frozen)
        self.assertRejected('Tensor.from_numpy of something that is not an array',
                            TypeError, 'numpy.ndarray, not list', Cp.Tensor.from_numpy, [1.0, 2.0])
        self.assertRejected('Tensor.from_numpy of a numpy dtype with no Cp.DType',
                            TypeError, 'int16 has no Cp.DType',
                            Cp.Tensor.from_numpy, np.zeros(2, dtype=np.int16))


class TestTemporaries(unittest.TestCase):
    """A failing call whose arguments are temporaries -- tensors made inside
    the call expression, which the interpreter frees while the call's
    GLib.Error is on its way up -- raises that GLib.Error, with its domain
    and code, every time, and prints nothing."""

    RUNS = 30

    def setUp(self):
        self.layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2)
        self.mesh = Cp.Mesh.new_local_group(['cp'], [1])[0]
        self.entered = Cp.Context.new(None, Cp.RotateMethod.ALLGATHER)
        self.entered.enter()

    def tearDown(self):
        self.entered.exit()

    @staticmethod
    def tmp(shape=(2, 6), dtype=np.float32):
        return Cp.Tensor.from_numpy(np.zeros(shape, dtype))

    def cases(self):
        tmp, layout, mesh = self.tmp, self.layout, self.mesh
        tensor, batch = Cp.tensor_error_quark(), Cp.batch_error_quark()
        cases = [
            (lambda: layout.shard(tmp(), 1, 0), tensor, Cp.TensorError.SHAPE),
            (lambda: layout.shard(tmp(), 4, 0), tensor, Cp.TensorError.SHAPE),
            (lambda: layout.shard_backward(tmp(), 1, 0), tensor, Cp.TensorError.SHAPE),
            (lambda: layout.unshard_pieces([tmp((2, 4)), tmp((2, 3))], 1), tensor, Cp.TensorError.SHAPE),
            (lambda: tmp().narrow(1, 5, 4), tensor, Cp.TensorError.OUT_OF_RANGE),
            (lambda: tmp().narrow(0, 0, 1).narrow(1, 5, 4), tensor, Cp.TensorError.OUT_OF_RANGE),
            (lambda: layout.shard(Cp.Tensor.from_numpy(tmp().numpy()), 1, 0), tensor, Cp.TensorError.SHAPE),
            (lambda: Cp.Tensor.new_from_storage(Cp.DType.FLOAT32, [100], tmp().get_storage(), 0),
             tensor, Cp.TensorError.OUT_OF_RANGE),
            (lambda: Cp.Layout.new_thd_from_tensor(tmp((3,)), 2), tensor, Cp.TensorError.DTYPE),
            (lambda: mesh.all_gather(tmp(), 5), tensor, Cp.TensorError.SHAPE),
            (lambda: mesh.broadcast(tmp(), 3), tensor, Cp.TensorError.OUT_OF_RANGE),
            (lambda: self.entered.register_buffer(tmp(), 1, True), batch, Cp.BatchError.CONTEXT_STATE),
        ]
        if not Cp.HAS_CUDA:
            cases.append((lambda: tmp().to_device(Cp.DeviceKind.CUDA), tensor, Cp.TensorError.DEVICE))
        return cases

    def test_every_failure_is_a_glib_error(self):
        read_end, write_end = os.pipe()
        saved = os.dup(2)
        os.dup2(write_end, 2)
        try:
            for call, domain, code in self.cases():
                for _ in range(self.RUNS):
                    with self.assertRaises(GLib.Error) as caught:
                        call()
                    self.assertTrue(caught.exception.matches(domain, code), caught.exception)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(write_end)
        with os.fdopen(read_end) as printed:
            self.assertEqual(printed.read(), '')


class TestReshape(TensorErrorMixin, unittest.TestCase):

    def test_view_shares_memory(self):
        array = np.arange(24, dtype=np.int32)
        t = Cp.Tensor.from_numpy(array)
        view = t.reshape([2, -1, 4])
        self.assertEqual(view.shape, (2, 3, 4))
        self.assertEqual(view.get_data_address(), t.get_data_address())
        array[23] = -5
        self.assertEqual(view.numpy()[1, 2, 3], -5)
        np.testing.assert_array_equal(view.numpy(), array.reshape(2, 3, 4))
        self.assertEqual(view.reshape([-1]).shape, (24,))

    def test_errors(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [2, 3, 4])
        self.assertTensorError('Tensor.reshape to a shape of another element count',
                               Cp.TensorError.SHAPE,
                               'a tensor of shape [2, 3, 4] (24 elements) cannot be reshaped to [5, 5]',
                               t.reshape, [5, 5])
        self.assertTensorError('Tensor.reshape with two dimensions of -1', Cp.TensorError.SHAPE,
                               'has -1 in dimensions 0 and 1', t.reshape, [-1, -1])


class TestOutOfRange(TensorErrorMixin, unittest.TestCase):
    """Indices, dimensions and ranks the C API takes as programmer errors
    (a critical and a default value) raise GLib.Error in Python."""

    def test_indices_and_dimensions(self):
        t = Cp.Tensor.from_numpy(np.arange(4, dtype=np.float32))
        for index in (4, 99, -1):
            self.assertTensorError('Tensor.get_value at index %d of 4 elements' % index,
                                   Cp.TensorError.OUT_OF_RANGE,
                                   'get_value: index %d is outside float32[4]' % index,
                                   t.get_value, index)
        self.assertTensorError('Tensor.set_value at index 4 of 4 elements', Cp.TensorError.OUT_OF_RANGE,
                               'set_value: index 4 is outside', t.set_value, 4, 1.0)
        self.assertTensorError('Tensor.get_dim of dimension 3 of a 1-d tensor',
                               Cp.TensorError.OUT_OF_RANGE, 'dimension 3 does not exist', t.get_dim, 3)
        self.assertEqual(t.get_value(3), 3.0)
        self.assertEqual(t.get_dim(-1), 4)

    def test_set_value_into_read_only_memory(self):
        t = Cp.Tensor.new_from_bytes(Cp.DType.FLOAT32, [1], GLib.Bytes.new(b'\0\0\0\0'))
        self.assertTensorError('Tensor.set_value into a tensor over GLib.Bytes', Cp.TensorError.READ_ONLY,
                               'set_value: float32[1] on host is over read-only memory',
                               t.set_value, 0, 1.0)
        self.assertEqual(t.get_value(0), 0.0)

    def test_ranks_of_a_layout(self):
        layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2)
        for name in ('get_local_len', 'get_local_indices', 'get_chunks', 'get_cost'):
            for rank in (2, -1):
                self.assertTensorError('Layout.%s of rank %d of 2' % (name, rank),
                                       Cp.TensorError.OUT_OF_RANGE,
                                       'rank %d is outside a layout of 2 ranks' % rank,
                                       getattr(layout, name), rank)
        self.assertEqual(layout.get_local_len(1), 4)


class TestReadOnly(TensorErrorMixin, unittest.TestCase):
    """A tensor over GLib.Bytes is read-only: its numpy view cannot be
    written, and every call that would write it raises GLib.Error."""

    def setUp(self):
        self.bytes = GLib.Bytes.new(np.arange(4, dtype=np.float32).tobytes())
        self.tensor = Cp.Tensor.new_from_bytes(Cp.DType.FLOAT32, [4], self.bytes)

    def test_numpy_view_is_read_only(self):
        array = self.tensor.numpy()
        self.assertFalse(array.flags.writeable)
        with self.assertRaises(ValueError):
            array[0] = 9
        self.assertTrue(self.tensor.get_storage().get_read_only())
        np.testing.assert_array_equal(array, [0, 1, 2, 3])

    def test_writers_refuse(self):
        mesh = Cp.Mesh.new_local_group(['cp'], [1])[0]
        self.assertTensorError('Mesh.all_reduce into a tensor over GLib.Bytes',
                               Cp.TensorError.READ_ONLY, 'all_reduce: the tensor (float32[4] on host)',
                               mesh.all_reduce, self.tensor, Cp.ReduceOp.SUM)
        self.assertTensorError('numpy.from_dlpack of a tensor over GLib.Bytes',
                               Cp.TensorError.READ_ONLY, 'to_dlpack: the tensor', np.from_dlpack,
                               self.tensor)
        out = self.tensor.copy()
        out.set_value(0, 7)
        self.assertEqual(out.numpy().tolist(), [7, 1, 2, 3])
        self.assertEqual(self.tensor.numpy().tolist(), [0, 1, 2, 3])


if __name__ == '__main__':
    unittest.main(verbosity=2)
