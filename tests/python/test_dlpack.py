# Cp.Tensor <-> PyTorch and numpy through DLPack: the same memory on both
# sides, kept until both are gone, whichever goes first.
#
# The PyTorch tests need Debian's python3-torch; without it the rest runs
# and the script exits 77 (skipped), so a missing PyTorch never passes
# for a tested one.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import gc
import sys
import threading
import unittest
import weakref

import numpy as np

from cptest import Cp, GLib
from test_tensor import TensorErrorMixin

try:
    import torch
except ImportError:
    torch = None

needs_torch = unittest.skipIf(torch is None, 'PyTorch (python3-torch) is not installed')


def collect():
    # Twice: the first pass may only free the wrappers that hold the rest.
    gc.collect()
    gc.collect()


def torch_dtypes():
    """The dtypes both sides have, PyTorch's name first."""
    return [(torch.uint8, Cp.DType.UINT8), (torch.int32, Cp.DType.INT32),
            (torch.int64, Cp.DType.INT64), (torch.float16, Cp.DType.FLOAT16),
            (torch.bfloat16, Cp.DType.BFLOAT16), (torch.float32, Cp.DType.FLOAT32),
            (torch.float64, Cp.DType.FLOAT64)]


def kept_alive_array(values, dtype):
    """A tensor over a numpy array, and a weak reference that tells when
    the array, that is the tensor's memory, is finally freed."""
    array = np.array(values, dtype=dtype)
    return Cp.Tensor.from_numpy(array), weakref.ref(array)


@needs_torch
class TestFromTorch(unittest.TestCase):

    def test_same_memory_every_dtype(self):
        for torch_dtype, cp_dtype in torch_dtypes():
            with self.subTest(dtype=torch_dtype):
                x = torch.arange(12).reshape(3, 4).to(torch_dtype)
                t = Cp.Tensor.from_dlpack(x)
                self.assertEqual(t.get_data_address(), x.data_ptr())
                self.assertEqual(t.get_dtype(), cp_dtype)
                self.assertEqual(t.shape, (3, 4))
                self.assertEqual(t.get_storage().get_kind(), Cp.StorageKind.DLPACK)
                self.assertEqual([t.get_value(i) for i in range(12)], list(range(12)))

    def test_writes_are_seen_both_ways(self):
        for torch_dtype in (torch.float32, torch.int64, torch.bfloat16):
            with self.subTest(dtype=torch_dtype):
                x = torch.zeros(3, 4, dtype=torch_dtype)
                t = Cp.Tensor.from_dlpack(x)
                x[2, 3] = 9
                self.assertEqual(t.get_value(11), 9)
                t.set_value(5, -3)
                self.assertEqual(x[1, 1].item(), -3)
                # A library operation writes straight into PyTorch's memory.
                Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 4, 2).shard_into(
                    Cp.Tensor.from_dlpack(torch.arange(4).to(torch_dtype)), 0, 1,
                    Cp.Tensor.from_dlpack(x[0, :2]))
                self.assertEqual(x[0].tolist(), [1, 2, 0, 0])

    def test_bfloat16_values(self):
        values = [1.5, -2.25, 3.0e38, 1.0e-38]
        x = torch.tensor(values, dtype=torch.bfloat16)
        t = Cp.Tensor.from_dlpack(x)
        self.assertEqual([t.get_value(i) for i in range(4)], x.float().tolist())
        bits = t.numpy()  # uint16 bit patterns over the same bytes
        self.assertEqual(bits.tolist(), [b & 0xFFFF for b in x.view(torch.int16).tolist()])

    def test_freeing_torch_first(self):
        x = torch.arange(1000, dtype=torch.int64)
        t = Cp.Tensor.from_dlpack(x)
        address = x.data_ptr()
        del x
        collect()
        # Reused memory would show other values (and ASan would report it).
        self.assertEqual(t.get_data_address(), address)
        self.assertEqual(t.get_value(999), 999)
        t.set_value(0, 42)
        self.assertEqual(t.numpy()[:3].tolist(), [42, 1, 2])
        del t
        collect()

    def test_freeing_on_another_thread(self):
        # numpy memory under a torch tensor under a Cp tensor: the last
        # reference goes on another thread, and the chain unwinds there.
        array = np.ones(64, dtype=np.float32)
        alive = weakref.ref(array)
        x = torch.from_numpy(array)
        t = Cp.Tensor.from_dlpack(x)
        holder = [t, t.narrow(0, 8, 8)]
        del array, x, t
        collect()
        self.assertIsNotNone(alive())
        thread = threading.Thread(target=holder.clear)
        thread.start()
        thread.join()
        collect()
        self.assertIsNone(alive())

    def test_round_trip_keeps_the_address(self):
        x = torch.arange(6, dtype=torch.float32)
        back = torch.from_dlpack(Cp.Tensor.from_dlpack(x))
        self.assertEqual(back.data_ptr(), x.data_ptr())
        back[2] = 20
        self.assertEqual(x[2].item(), 20)


@needs_torch
class TestToTorch(unittest.TestCase):

    def test_same_memory_every_dtype(self):
        for torch_dtype, cp_dtype in torch_dtypes():
            with self.subTest(dtype=cp_dtype):
                t = Cp.Tensor.new_arange(cp_dtype, 0, 12, 1)
                y = torch.from_dlpack(t)
                self.assertEqual(y.data_ptr(), t.get_data_address())
                self.assertEqual(y.dtype, torch_dtype)
                self.assertEqual(tuple(y.shape), (12,))
                self.assertEqual(y.tolist(), list(range(12)))

    def test_writes_are_seen_both_ways(self):
        for cp_dtype in (Cp.DType.FLOAT32, Cp.DType.INT64, Cp.DType.BFLOAT16):
            with self.subTest(dtype=cp_dtype):
                t = Cp.Tensor.new(cp_dtype, [2, 3])
                y = torch.from_dlpack(t)
                y[1, 2] = 7
                self.assertEqual(t.get_value(5), 7)
                t.set_value(1, -4)
                self.assertEqual(y[0, 1].item(), -4)

    def test_device(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [2])
        self.assertEqual(t.__dlpack_device__(), (1, 0))
        self.assertEqual(torch.from_dlpack(t).device, torch.device('cpu'))

    def test_freeing_the_tensor_first(self):
        t, array_alive = kept_alive_array(np.arange(10), np.float32)
        y = torch.from_dlpack(t)
        del t
        collect()
        self.assertIsNotNone(array_alive())
        self.assertEqual(y[9].item(), 9)
        y[0] = 5
        self.assertEqual(array_alive()[0], 5)
        del y
        collect()
        self.assertIsNone(array_alive())

    def test_freeing_torch_first(self):
        t, array_alive = kept_alive_array(np.arange(10), np.int64)
        y = torch.from_dlpack(t)
        y[3] = 30
        del y
        collect()
        self.assertEqual(t.get_value(3), 30)
        del t
        collect()
        self.assertIsNone(array_alive())

    def test_bool_is_refused_by_pytorch_and_released(self):
        # bool goes out as DLPack 0.8's code 6; PyTorch 1.13 does not know
        # it and says so, and the export is given back all the same.
        t, array_alive = kept_alive_array([True, False], np.bool_)
        with self.assertRaises(RuntimeError):
            torch.from_dlpack(t)
        del t
        collect()
        self.assertIsNone(array_alive())


class TestNumpy(TensorErrorMixin, unittest.TestCase):

    def test_from_numpy_array(self):
        array = np.arange(12, dtype=np.float64).reshape(4, 3)
        alive = weakref.ref(array)
        t = Cp.Tensor.from_dlpack(array)
        self.assertEqual(t.get_data_address(), array.ctypes.data)
        self.assertEqual(t.shape, (4, 3))
        array[3, 2] = -1
        self.assertEqual(t.get_value(11), -1)
        t.set_value(0, 8)
        self.assertEqual(array[0, 0], 8)
        del array
        collect()
        self.assertIsNotNone(alive())
        self.assertEqual(t.get_value(10), 10)
        del t
        collect()
        self.assertIsNone(alive())

    def test_to_numpy(self):
        t = Cp.Tensor.new_arange(Cp.DType.INT32, 0, 6, 1)
        array = np.from_dlpack(t)
        self.assertEqual(array.ctypes.data, t.get_data_address())
        self.assertEqual(array.dtype, np.int32)
        # numpy makes what it imports read-only; the bytes are shared.
        self.assertFalse(array.flags.writeable)
        t.set_value(4, 40)
        self.assertEqual(array[4], 40)
        del t
        collect()
        self.assertEqual(array.tolist(), [0, 1, 2, 3, 40, 5])

    def test_a_capsule_is_taken_once(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [3])
        capsule = t.__dlpack__()
        first = Cp.Tensor.from_dlpack(capsule)
        self.assertEqual(first.get_data_address(), t.get_data_address())
        self.assertRejected('Tensor.from_dlpack of a capsule consumed already', ValueError,
                            'consumed already', Cp.Tensor.from_dlpack, capsule)

    def test_unconsumed_capsules_are_released(self):
        t, alive = kept_alive_array([1, 2, 3], np.int32)
        capsules = [t.__dlpack__() for _ in range(3)]
        del t
        collect()
        self.assertIsNotNone(alive())
        del capsules
        collect()
        self.assertIsNone(alive())

    def test_a_refusing_consumer_keeps_its_exception(self):
        # numpy.from_dlpack drops a capsule it refuses with its error set,
        # so the capsule's destructor runs while that error is in flight;
        # so does a capsule dropped as a call with it fails.
        bits = np.array([0x3F80, 0x4000], dtype=np.uint16)
        alive = weakref.ref(bits)
        t = Cp.Tensor.from_numpy(bits, dtype=Cp.DType.BFLOAT16)
        del bits
        with self.assertRaisesRegex(RuntimeError, 'Unsupported dtype'):
            np.from_dlpack(t)
        with self.assertRaisesRegex(TypeError, 'PyCapsule'):
            int(t.__dlpack__())
        del t
        collect()
        self.assertIsNone(alive())

    def test_refused_layouts_and_types(self):
        self.assertTensorError('Tensor.from_dlpack of a strided numpy array',
                               Cp.TensorError.SHAPE, 'with strides [2]',
                               Cp.Tensor.from_dlpack, np.arange(8, dtype=np.float32)[::2])
        self.assertTensorError('Tensor.from_dlpack of a uint16 numpy array',
                               Cp.TensorError.DTYPE, 'uint16 (code 1, 16 bits, 1 lanes)',
                               Cp.Tensor.from_dlpack, np.zeros(2, dtype=np.uint16))
        self.assertRejected('Tensor.from_dlpack of an object without __dlpack__', TypeError,
                            'needs an object with __dlpack__', Cp.Tensor.from_dlpack, [1, 2])

    @needs_torch
    def test_refused_torch_tensors(self):
        self.assertTensorError('Tensor.from_dlpack of a transposed torch tensor',
                               Cp.TensorError.SHAPE, 'shape [4, 3] with strides [1, 4]',
                               Cp.Tensor.from_dlpack, torch.zeros(3, 4).t())
        self.assertTensorError('Tensor.from_dlpack of a torch int8 tensor',
                               Cp.TensorError.DTYPE, 'int8', Cp.Tensor.from_dlpack,
                               torch.zeros(2, dtype=torch.int8))
        self.assertTensorError('Tensor.from_dlpack of a torch complex64 tensor',
                               Cp.TensorError.DTYPE, 'complex64', Cp.Tensor.from_dlpack,
                               torch.zeros(2, dtype=torch.complex64))


class _Capsule:
    """Hands numpy.from_dlpack() a capsule made already."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        return self.capsule


class _CudaProducer:
    """Says its memory is on CUDA device 0 and records the stream it is
    asked for; hands over a host array's capsule, which is all a machine
    without a GPU can import."""

    def __init__(self, array):
        self.array = array
        self.streams = []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.array.__dlpack__()


class _HostProducer:
    """A host producer whose __dlpack__ takes no argument at all: a
    consumer of host memory has no stream to name, and must not pass one."""

    def __init__(self, array):
        self.array = array
        self.calls = 0

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self):
        self.calls += 1
        return self.array.__dlpack__()


class TestStreamProtocol(TensorErrorMixin, unittest.TestCase):
    """The array API's __dlpack__(stream=...) both ways."""

    def test_host_export_takes_no_stream(self):
        t = Cp.Tensor.from_numpy(np.arange(4, dtype=np.float32))
        for stream in (None, -1):
            with self.subTest(stream=stream):
                view = np.from_dlpack(_Capsule(t.__dlpack__(stream)))
                self.assertEqual(view.tolist(), [0.0, 1.0, 2.0, 3.0])

    def test_host_export_refuses_streams(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [1])
        for stream in (1, 2, 0x7f0000001000):
            with self.subTest(stream=stream):
                self.assertTensorError('Tensor.__dlpack__ of host memory with stream %#x' % stream,
                                       Cp.TensorError.DEVICE,
                                       'DLPack stream %d for a tensor in host memory, which has no '
                                       'streams' % stream, t.__dlpack__, stream)
        for stream in (0, -2):
            with self.subTest(stream=stream):
                self.assertTensorError('Tensor.__dlpack__ with stream %d' % stream,
                                       Cp.TensorError.OUT_OF_RANGE,
                                       'DLPack stream %d for a tensor in host memory: a stream is -1'
                                       % stream, t.__dlpack__, stream)

    def test_export_refuses_non_int_streams(self):
        t = Cp.Tensor.new(Cp.DType.FLOAT32, [1])
        for stream in ('1', 1.0, True):
            with self.subTest(stream=stream):
                self.assertRejected('Tensor.__dlpack__ with stream=%r' % (stream,), TypeError,
                                    r'takes None or an int .* not %s' % type(stream).__name__,
                                    t.__dlpack__, stream)

    def test_cuda_import_names_the_consumer_stream(self):
        # The legacy default stream (1), which every per-thread default
        # stream libcpmesh works on waits for.
        producer = _CudaProducer(np.arange(3, dtype=np.float32))
        t = Cp.Tensor.from_dlpack(producer)
        self.assertEqual(producer.streams, [1])
        self.assertEqual(t.get_data_address(), producer.array.ctypes.data)

    def test_host_import_passes_no_stream(self):
        producer = _HostProducer(np.arange(3, dtype=np.int64))
        t = Cp.Tensor.from_dlpack(producer)
        self.assertEqual(producer.calls, 1)
        self.assertEqual(t.get_value(2), 2)

    @needs_torch
    def test_torch_round_trip_host(self):
        # torch.from_dlpack asks a CPU producer for no stream.
        t = Cp.Tensor.from_numpy(np.arange(6, dtype=np.float32))
        x = torch.from_dlpack(t)
        self.assertEqual(x.tolist(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        back = Cp.Tensor.from_dlpack(x)
        self.assertEqual(back.get_data_address(), t.get_data_address())


@needs_torch
class TestTorchMovesMemory(TensorErrorMixin, unittest.TestCase):
    """PyTorch frees a tensor's memory on resize_() or set_() even while a
    DLPack export of it lives: the override notices before using a tensor
    whose producer did, and raises instead of reading freed memory."""

    def assertMoved(self, what, func, *args):
        self.assertTensorError(what, Cp.TensorError.MOVED,
                               'has moved its memory since Cp.Tensor.from_dlpack()', func, *args)

    def test_resize_is_caught_before_use(self):
        x = torch.arange(8, dtype=torch.float32)
        t = Cp.Tensor.from_dlpack(x)
        view = t.reshape([2, 4])
        piece = t.narrow(0, 2, 2)
        layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2)
        mesh = Cp.Mesh.new_local_group(['cp'], [1])[0]
        np.testing.assert_array_equal(t.copy().numpy(), np.arange(8))
        x.resize_(1 << 20)  # reallocates: the memory t viewed is freed
        self.assertMoved('Tensor.copy of a tensor whose PyTorch producer was resized', t.copy)
        self.assertMoved('Tensor.numpy of a view whose PyTorch producer was resized', view.numpy)
        self.assertMoved('Tensor.get_value of a narrowed view after resize_', piece.get_value, 0)
        self.assertMoved('Layout.shard of a tensor whose PyTorch producer was resized',
                         layout.shard, t, 0, 0)
        self.assertMoved('Mesh.all_reduce of a tensor whose PyTorch producer was resized',
                         mesh.all_reduce, t, Cp.ReduceOp.SUM)
        batch = Cp.Batch()
        batch['input_ids'] = t
        self.assertMoved('Batch.prepare of a batch holding a tensor whose producer was resized',
                         batch.prepare, mesh)

    def test_every_tensor_over_the_storage_is_caught(self):
        # A tensor made over the same storage, and a layout read from the
        # tensor itself, are checked as the tensor is.
        x = torch.arange(8, dtype=torch.int64) * 2
        t = Cp.Tensor.from_dlpack(x)
        again = Cp.Tensor.new_from_storage(Cp.DType.INT64, [4], t.get_storage(), 0)
        x.resize_(1 << 20)
        self.assertMoved('Tensor.numpy of a tensor made over the storage of a PyTorch producer '
                         'that was resized', again.numpy)
        self.assertMoved('Layout.new_thd_from_tensor of a tensor whose PyTorch producer was '
                         'resized', Cp.Layout.new_thd_from_tensor, t, 2)

    def test_loss_mask_in_options_is_caught(self):
        mask = torch.ones(1, 8, dtype=torch.float32)
        options = Cp.BatchOptions()
        options.set_loss_mask(Cp.Tensor.from_dlpack(mask))
        batch = Cp.Batch()
        batch['input_ids'] = Cp.Tensor.from_numpy(np.arange(8, dtype=np.int64).reshape(1, 8))
        batch['labels'] = Cp.Tensor.from_numpy(np.arange(8, dtype=np.int64).reshape(1, 8))
        mask.resize_(1 << 20)
        mesh = Cp.Mesh.new_local_group(['cp'], [1])[0]
        self.assertMoved('Batch.prepare with a loss mask whose PyTorch producer was resized',
                         batch.prepare, mesh, options)

    def test_set_is_caught(self):
        x = torch.arange(4, dtype=torch.int64)
        t = Cp.Tensor.from_dlpack(x)
        x.set_(torch.zeros(3, dtype=torch.int64))
        self.assertMoved('Tensor.copy of a tensor whose PyTorch producer was set_() to other '
                         'memory', t.copy)

    def test_memory_that_stays_is_used(self):
        # Shrinking keeps the storage: nothing moved, nothing is refused.
        x = torch.arange(8, dtype=torch.float32)
        t = Cp.Tensor.from_dlpack(x)
        x.resize_(2)
        x[0] = 5
        np.testing.assert_array_equal(t.copy().numpy(), [5, 1, 2, 3, 4, 5, 6, 7])


if __name__ == '__main__':
    outcome = unittest.main(verbosity=2, exit=False).result
    if not outcome.wasSuccessful():
        sys.exit(1)
    if torch is None:
        print('PyTorch is not installed: its tests were skipped', file=sys.stderr)
        sys.exit(77)
