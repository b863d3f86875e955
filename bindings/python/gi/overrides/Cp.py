# PyGObject overrides for libcpmesh
#
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Pythonic helpers on top of the introspected Cp namespace.

Tensors exchange memory with numpy without copying:

* ``Cp.Tensor.from_numpy(array)`` wraps the array's buffer (through DLPack);
  the tensor keeps the array alive, and writes through either side are seen
  by the other.
* ``tensor.numpy()`` returns an ndarray over the tensor's current storage;
  the array keeps that storage alive even if a context later swaps the
  tensor's storage when it shards in place.

bfloat16 has no numpy type: such tensors travel as ``uint16`` bit patterns
(``from_numpy(bits, dtype=Cp.DType.BFLOAT16)``), and
``float32_to_bfloat16`` / ``bfloat16_to_float32`` convert.

Tensors exchange memory with PyTorch (and numpy) through DLPack, bfloat16
included:

* ``Cp.Tensor.from_dlpack(obj)`` takes any object with ``__dlpack__`` (a
  ``torch.Tensor``, a numpy array, another ``Cp.Tensor``) or a
  ``"dltensor"`` capsule; the producer's memory is kept until the last
  tensor on it is freed. PyTorch frees it anyway when the producer is
  resized (``resize_()``, ``set_()``): never resize a torch tensor a
  Cp.Tensor views; the tensor checks its producer before each use here and
  raises ``Cp.TensorError.MOVED`` rather than read freed memory.
* ``torch.from_dlpack(tensor)`` and ``numpy.from_dlpack(tensor)`` see the
  tensor's storage; it is kept until they free their side.

Every ``_async`` method (``mesh.all_gather_async(t, 0)``,
``batch.prepare_async(mesh, None)``, ``attention.forward_async(q, k, v)``,
``ctx.enter_async()``…) called without a callback returns an awaitable for
asyncio, as PyGObject 3.50 does for GIO calls; with a callback it is the
plain GIO call. Cancelling the asyncio task cancels the call, which fails
every rank of it with ``Cp.MeshError.CANCELLED`` and breaks the mesh; the
awaiting task then raises CancelledError once the call has ended. ``async
with ctx:`` enters and exits with the async calls.
"""

import ctypes
import functools
import sys
import threading
import weakref

from gi.repository import Gio, GLib, GObject

from .._gi import FunctionInfo
from ..module import get_introspection_module
from ..overrides import override

Cp = get_introspection_module('Cp')

__all__ = []

_NUMPY_NAMES = {
    Cp.DType.BOOL: 'bool',
    Cp.DType.UINT8: 'uint8',
    Cp.DType.INT32: 'int32',
    Cp.DType.INT64: 'int64',
    Cp.DType.FLOAT16: 'float16',
    Cp.DType.BFLOAT16: 'uint16',
    Cp.DType.FLOAT32: 'float32',
    Cp.DType.FLOAT64: 'float64',
}


def _dtype_for(np_dtype, requested):
    import numpy as np

    np_dtype = np.dtype(np_dtype)
    if requested is not None:
        if np.dtype(_NUMPY_NAMES[requested]) != np_dtype:
            raise TypeError('a %s tensor needs a numpy %s array, not %s'
                            % (Cp.dtype_get_name(requested), _NUMPY_NAMES[requested], np_dtype))
        return requested
    for dtype, name in _NUMPY_NAMES.items():
        if dtype != Cp.DType.BFLOAT16 and np.dtype(name) == np_dtype:
            return dtype
    raise TypeError('numpy dtype %s has no Cp.DType (uint16 arrays need dtype=Cp.DType.BFLOAT16)'
                    % np_dtype)


# DLPack's legacy structs (DLPack 0.6), for the deleter and the dtype.
class _DLDevice(ctypes.Structure):
    _fields_ = [('device_type', ctypes.c_int), ('device_id', ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [('code', ctypes.c_uint8), ('bits', ctypes.c_uint8), ('lanes', ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [('data', ctypes.c_void_p), ('device', _DLDevice), ('ndim', ctypes.c_int),
                ('dtype', _DLDataType), ('shape', ctypes.c_void_p), ('strides', ctypes.c_void_p),
                ('byte_offset', ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [('dl_tensor', _DLTensor), ('manager_ctx', ctypes.c_void_p),
                ('deleter', ctypes.c_void_p)]


# The capsule functions, as private prototypes (setting argtypes on
# ctypes.pythonapi's would change them for every other user). PYFUNCTYPE:
# called with the GIL held, and a Python exception they set is raised.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(('PyCapsule_New', ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ('PyCapsule_GetPointer', ctypes.pythonapi))
_capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ('PyCapsule_SetName', ctypes.pythonapi))
_capsule_get_destructor = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(
    ('PyCapsule_GetDestructor', ctypes.pythonapi))
_incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(('Py_IncRef', ctypes.pythonapi))

# A capsule keeps the pointer to its name: these outlive every capsule,
# including those still alive while the interpreter shuts down.
_DLTENSOR = b'dltensor'
_USED_DLTENSOR = b'used_dltensor'
_incref(_DLTENSOR)
_incref(_USED_DLTENSOR)

# libcpmesh's deleters take no Python lock: called through a foreign
# function that releases the GIL.
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_capsule_destructor = None


def _dlpack_capsule_destructor():
    """The destructor of the capsules Cp.Tensor makes: DLPack's rule, call
    the deleter unless a consumer renamed the capsule "used_dltensor".

    It has to be C code. A destructor may run while an exception is in
    flight -- numpy.from_dlpack() drops a capsule it refuses with its error
    set -- and a Python function called through ctypes then turns that
    exception into a SystemError. numpy's capsules have exactly this
    destructor, in C, so it is borrowed from one of them."""
    global _capsule_destructor
    if _capsule_destructor is None:
        import numpy as np

        _capsule_destructor = _capsule_get_destructor(np.empty(0, np.uint8).__dlpack__())
    return _capsule_destructor


def _call_deleter(address):
    deleter = _DLManagedTensor.from_address(address).deleter
    if deleter:
        _DELETER(deleter)(address)


# DLPack's device type for CUDA memory, and the stream libcpmesh asks a
# CUDA producer to order its work before: CUDA's legacy default stream
# (DLPack's 1).  libcpmesh's CUDA operations run on the per-thread
# default stream of whichever thread calls them -- a rank thread, a GTask
# worker, not only the importing thread -- and every per-thread default
# stream waits for the legacy one's earlier work, so a producer that
# makes the legacy stream wait for its own (PyTorch records an event on
# its current stream and makes the given one wait on it) comes before
# every later libcpmesh operation on the memory, on any thread.
_KDLCUDA = 2
_CONSUMER_STREAM = 1


def _dlpack_capsule(obj):
    if type(obj).__name__ == 'PyCapsule':
        return obj
    if not hasattr(obj, '__dlpack__'):
        raise TypeError('from_dlpack() needs an object with __dlpack__() (a torch.Tensor, a numpy '
                        'array, a Cp.Tensor) or a "dltensor" capsule, not %s' % type(obj).__name__)
    # The array API's stream protocol: a consumer of CUDA memory names the
    # stream it will use; a host producer (numpy) takes no stream at all.
    device = obj.__dlpack_device__() if hasattr(obj, '__dlpack_device__') else None
    if device is not None and device[0] == _KDLCUDA:
        return obj.__dlpack__(stream=_CONSUMER_STREAM)
    return obj.__dlpack__()


def _dlpack_stream(tensor, stream):
    """The stream value cp_tensor_prepare_dlpack_stream() takes for a
    __dlpack__(stream=...) argument: an int, or None, which means the
    legacy default stream (1) for CUDA memory and no stream (-1) for
    memory without streams."""
    if stream is None:
        return 1 if tensor.get_device() == Cp.DeviceKind.CUDA else -1
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError('__dlpack__(stream=) takes None or an int (-1: no ordering, 1: the legacy '
                        'default stream, 2: the per-thread default stream, or a cudaStream_t), '
                        'not %s' % type(stream).__name__)
    return stream


def _take_capsule(capsule):
    """The DLManagedTensor of a "dltensor" capsule, taken over: renamed
    "used_dltensor", the capsule leaves the deleter to libcpmesh.

    libcpmesh calls the deleter on whichever thread frees the last tensor
    on the memory, usually without the GIL (PyGObject releases it around
    every call, unref included). DLPack producers' deleters take the GIL
    themselves when they need it (PyTorch's; numpy's since 1.24)."""
    try:
        address = _capsule_get_pointer(capsule, _DLTENSOR)
    except ValueError:
        raise ValueError('not an unused "dltensor" capsule: a capsule gives its tensor once, and '
                         'this one was consumed already or holds something else') from None
    _capsule_set_name(capsule, _USED_DLTENSOR)
    return address


class _ArrayOwner(GObject.Object):
    """Keeps a numpy array alive for as long as a storage views its memory.

    The storage holds a reference on this object and drops it from C when
    the last tensor on the memory goes away; PyGObject then frees the
    wrapper and the array without running any Python code. A release
    callback would run Python code instead, through PyGObject's callback
    trampoline, which prints and clears a pending exception: a temporary
    tensor freed while a call on it raises (``layout.shard(
    Cp.Tensor.from_numpy(a), ...)`` with a bad shape) turned that call's
    GLib.Error into ``SystemError: error return without exception set``."""

    def __init__(self, array):
        GObject.Object.__init__(self)
        self.array = array


class Tensor(Cp.Tensor):

    @classmethod
    def from_numpy(cls, array, dtype=None):
        """Wraps a C-contiguous, writable numpy array without copying it."""
        import numpy as np

        if not isinstance(array, np.ndarray):
            raise TypeError('from_numpy() needs a numpy.ndarray, not %s' % type(array).__name__)
        if not array.flags.c_contiguous:
            raise ValueError('from_numpy() needs a C-contiguous array; '
                             'use numpy.ascontiguousarray() first')
        if not array.flags.writeable:
            raise ValueError('from_numpy() needs a writable array: tensors may be written in place')
        cp_dtype = _dtype_for(array.dtype, dtype)
        storage = Cp.Storage.new_with_owner(array.ctypes.data, array.nbytes, _ArrayOwner(array))
        return Cp.Tensor.new_from_storage(cp_dtype, list(array.shape), storage, 0)

    @classmethod
    def from_dlpack(cls, obj):
        """Wraps the memory of a DLPack producer without copying it.

        obj is a ``torch.Tensor``, a numpy array, any object with
        ``__dlpack__()``, or a ``"dltensor"`` capsule. Writes through either
        side are seen by the other; the producer's memory is kept until the
        last tensor on it is freed. A tensor libcpmesh cannot be — strided,
        an element type it lacks, on another device — raises GLib.Error
        (Cp.TensorError), and nothing is copied.

        Do not resize a PyTorch tensor (``resize_()``, ``set_()``) while a
        Cp.Tensor views it: PyTorch then frees or moves the memory under
        the export, breaking DLPack's lifetime contract, and the Cp.Tensor
        would read freed memory. The tensor returned here keeps the
        PyTorch tensor and checks it before every use through this module
        (its own methods, and the Mesh, Layout, Batch, Context and
        Attention calls given it): once the producer's memory has moved,
        the call raises GLib.Error (``Cp.TensorError.MOVED``) instead of
        touching it. A Cp.Tensor used from C, or through a view made
        outside this module, is not checked; ``.clone()`` a PyTorch tensor
        that must change."""
        address = _take_capsule(_dlpack_capsule(obj))
        return _remember_producer(Cp.Tensor.new_from_dlpack(address), obj)

    def __dlpack__(self, stream=None):
        """A "dltensor" capsule over the tensor's storage, for
        ``torch.from_dlpack()`` and ``numpy.from_dlpack()``.

        stream follows the array API's stream protocol. For CUDA memory:
        None or 1 (CUDA's legacy default stream), 2 (the per-thread default
        stream), any other positive int (a ``cudaStream_t``), or -1 (no
        ordering); work the consumer then puts on its stream comes after
        every libcpmesh operation on the memory. Memory without streams
        (host) takes None or -1 alone. Other values raise GLib.Error
        (Cp.TensorError.OUT_OF_RANGE for 0 or below -1, DEVICE for a
        stream on host memory); a non-int raises TypeError."""
        Cp.Tensor.prepare_dlpack_stream(self, _dlpack_stream(self, stream))
        address = Cp.Tensor.to_dlpack(self)
        try:
            return _capsule_new(address, _DLTENSOR, _dlpack_capsule_destructor())
        except BaseException:
            _call_deleter(address)
            raise

    def __dlpack_device__(self):
        """(DLPack device type, device index): (1, 0) for host memory."""
        device_type, device_id = self.get_dlpack_device()
        return device_type, device_id

    def numpy(self):
        """Returns an ndarray over the tensor's bytes, without copying."""
        import numpy as np

        if self.get_device() != Cp.DeviceKind.HOST:
            raise ValueError('numpy() views host memory, and this tensor is in %s memory; '
                             'bring it over with to_device(Cp.DeviceKind.HOST)'
                             % self.get_device().value_nick)

        np_dtype = np.dtype(_NUMPY_NAMES[self.get_dtype()])
        shape = tuple(self.get_shape())
        nbytes = self.get_nbytes()
        if nbytes == 0:
            return np.zeros(shape, dtype=np_dtype)
        storage = self.get_storage()
        buffer = (ctypes.c_uint8 * nbytes).from_address(self.get_data_address())
        buffer._cp_storage = storage  # keeps the bytes alive as long as the array
        array = np.frombuffer(buffer, dtype=np_dtype).reshape(shape)
        # The bytes of a GBytes may be in a read-only page: a write through
        # the array would crash the process rather than raise.
        if storage.get_read_only():
            array.flags.writeable = False
        return array

    def __array__(self, dtype=None, copy=None):
        # numpy 2 passes copy=; a view is returned unless a copy is asked
        # for or a dtype conversion needs one.
        array = self.numpy()
        if dtype is not None:
            return array.astype(dtype, copy=bool(copy))
        return array.copy() if copy else array

    @property
    def shape(self):
        return tuple(self.get_shape())

    @property
    def dtype(self):
        return self.get_dtype()

    def __len__(self):
        if self.get_n_dims() == 0:
            raise TypeError('len() of a 0-d tensor')
        return self.get_dim(0)

    def __repr__(self):
        return '<Cp.Tensor %s>' % self.describe()


Tensor = override(Tensor)
__all__.append('Tensor')


class Layout(Cp.Layout):
    """Shows itself as a picture in IPython and Jupyter: ranks as colours
    over the sequence, tail chunks hatched, each rank's causal work as a
    bar; the same SVG as ``layout.to_svg()`` and ``cpmesh layout --svg``."""

    def _repr_svg_(self):
        return self.to_svg()

    def _repr_html_(self):
        # SVG inline in HTML takes no XML declaration.
        svg = self.to_svg()
        return '<div class="cp-layout">%s</div>' % svg[svg.index('<svg'):]

    def __repr__(self):
        n_documents = self.get_n_documents()
        scheme = ('%d documents' % n_documents if n_documents > 1
                  else self.get_balance().value_nick)
        return '<Cp.Layout %s, %d positions over %d ranks>' % (
            scheme, self.get_seq_len(), self.get_cp_size())


Layout = override(Layout)
__all__.append('Layout')


class Mesh(Cp.Mesh):

    @staticmethod
    def new_local_group(dim_names, dim_sizes=None):
        """One mesh per rank for ranks that are threads of this process.

        Takes ``(["dp", "cp"], [2, 4])`` or a mapping ``{"dp": 2, "cp": 4}``
        (ordered outermost first).
        """
        if dim_sizes is None:
            dims = dict(dim_names)
            dim_names, dim_sizes = list(dims.keys()), list(dims.values())
        return Cp.Mesh.new_local_group(list(dim_names), list(dim_sizes))


Mesh = override(Mesh)
__all__.append('Mesh')


class Batch(Cp.Batch):
    """A training batch that behaves like a dict of tensors.

    ``batch["input_ids"] = tensor``, ``batch["labels"]``, ``"loss_mask" in
    batch``, ``del batch["attention_mask"]``, ``batch.keys()``, ``len(batch)``
    and iteration work as on a dict (keys keep insertion order); a missing
    key raises KeyError.
    """

    def __getitem__(self, key):
        tensor = Cp.Batch.get(self, key)
        if tensor is None:
            raise KeyError(key)
        return tensor

    def __setitem__(self, key, tensor):
        self.set(key, tensor)

    def __delitem__(self, key):
        if not self.remove(key):
            raise KeyError(key)

    def __contains__(self, key):
        return isinstance(key, str) and self.contains(key)

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return self.get_n_keys()

    def get(self, key, default=None):
        tensor = Cp.Batch.get(self, key)
        return default if tensor is None else tensor

    def keys(self):
        return list(self.get_keys() or [])

    def values(self):
        return [self[key] for key in self.keys()]

    def items(self):
        return [(key, self[key]) for key in self.keys()]

    def prepare(self, mesh=None, options=None):
        """The native make_cp_batch_and_ctx: returns the Cp.Context to enter."""
        return Cp.Batch.prepare(self, mesh, options)

    def to_thd(self, mesh=None, options=None):
        """The native make_cp_batch_for_te: returns a new packed (THD) batch."""
        return Cp.Batch.to_thd(self, mesh, options)

    def pad_documents(self, cp_size, options=None):
        """Pads every packed document to a multiple of 2 * cp_size."""
        return Cp.Batch.pad_documents(self, cp_size, options)

    def __repr__(self):
        return '<Cp.Batch %s>' % ', '.join('%s=%s' % (k, t.describe()) for k, t in self.items())


Batch = override(Batch)
__all__.append('Batch')


class BatchOptions(Cp.BatchOptions):
    """Options of Batch.prepare().

    ``Cp.BatchOptions(loss_mask=mask, rotate_method="alltoall",
    extra_buffers={"teacher_logits": 1})``: the rotate method may be a
    Cp.RotateMethod or its name; an unknown name is reported by prepare().
    """

    def __init__(self, extra_buffers=None, rotate_method=None, **kwargs):
        Cp.BatchOptions.__init__(self, **kwargs)
        if isinstance(rotate_method, str):
            self.set_rotate_method_name(rotate_method)
        elif rotate_method is not None:
            self.set_rotate_method(rotate_method)
        for key, seq_dim in dict(extra_buffers or {}).items():
            self.add_extra_buffer(key, seq_dim)


BatchOptions = override(BatchOptions)
__all__.append('BatchOptions')


class Context(Cp.Context):
    """A context manager: ``with ctx:`` enters (every rank together) and
    exits, also when the block raises. ``with ctx:`` on a context that is
    entered already raises GLib.Error (``Cp.BatchError.CONTEXT_STATE``)
    before its block runs, and the outer ``with`` stays entered."""

    def __enter__(self):
        # A failed enter raises here, so __exit__ never runs for it.
        self.enter()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.exit()
        return False

    @property
    def buffers(self):
        """The registered tensors, in registration order."""
        return [self.get_buffer(i) for i in range(self.get_n_buffers())]

    @property
    def seq_dims(self):
        """The sequence dimension of each registered buffer."""
        return [self.get_buffer_seq_dim(i) for i in range(self.get_n_buffers())]


Context = override(Context)
__all__.append('Context')


class Attention(Cp.Attention):
    """Context-parallel attention; ``forward_async`` and ``backward_async``
    are awaitable (see the module's documentation)."""


Attention = override(Attention)
__all__.append('Attention')


# ---- awaiting _async calls from asyncio ----
#
# Debian's PyGObject (3.42) cannot await a GTask, and asyncio does not run
# GLib's main context, where a GTask reports.  So the calls are started
# from a daemon thread that runs a GLib main context of its own: each
# call's GTask reports there, and the callback hands the result to the
# asyncio loop with call_soon_threadsafe; the _finish function runs on the
# asyncio thread.  The thread only dispatches: the calls themselves run on
# libcpmesh's workers.

_dispatcher = None
_dispatcher_lock = threading.Lock()


def _dispatcher_context():
    """The main context of the dispatching thread, started on first use."""
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is None:
            context = GLib.MainContext.new()
            running = threading.Event()

            def run():
                # Sources attached before the loop runs wait for it.
                context.push_thread_default()
                loop = GLib.MainLoop.new(context, False)
                running.set()
                loop.run()

            threading.Thread(target=run, name='cpmesh-dispatch', daemon=True).start()
            running.wait()
            _dispatcher = context
    return _dispatcher


def _settle(future, result):
    if not future.done():
        future.set_result(result)


async def _await_call(start, finish, cancellable):
    """Runs start(cancellable, callback) on the dispatching thread and
    returns finish(result) once the call ends. A cancelled await cancels
    the call and waits for it to end before it raises, so that the mesh
    and tensors are free again when the caller gets control back."""
    import asyncio

    loop = asyncio.get_running_loop()
    done = loop.create_future()
    cancellable = cancellable or Gio.Cancellable()

    def on_ready(source, result, *unused):
        try:
            loop.call_soon_threadsafe(_settle, done, result)
        except RuntimeError:  # the asyncio loop was closed: nobody waits
            pass

    def begin(*unused):
        start(cancellable, on_ready)
        return GLib.SOURCE_REMOVE

    _dispatcher_context().invoke_full(GLib.PRIORITY_DEFAULT, begin)
    try:
        result = await asyncio.shield(done)
    except asyncio.CancelledError:
        cancellable.cancel()
        await asyncio.wait([done])
        raise
    return finish(result)


def _awaitable_method(cls, name):
    """cls.<name>_async that returns an awaitable when called without a
    callback, and is the GIO call with one."""
    native = getattr(getattr(Cp, cls.__name__), name + '_async')
    finish = getattr(getattr(Cp, cls.__name__), name + '_finish')
    n_inputs = [a.get_name() for a in native.get_arguments()].index('cancellable')

    def method(self, *args, **kwargs):
        if len(args) > n_inputs + 1 or 'callback' in kwargs:
            return native(self, *args, **kwargs)
        inputs = args[:n_inputs]
        cancellable = args[n_inputs] if len(args) > n_inputs else kwargs.pop('cancellable', None)
        if kwargs:
            raise TypeError('%s_async() got unexpected keyword arguments %s' % (name, sorted(kwargs)))
        return _await_call(lambda c, callback: native(self, *inputs, c, callback),
                           lambda result: finish(self, result), cancellable)

    method.__name__ = name + '_async'
    method.__doc__ = ('%s(...) on a worker thread: awaitable without a callback, the GIO call '
                      'with one.' % name)
    return method


_ASYNC_CALLS = {
    Mesh: ('barrier', 'all_gather', 'all_gather_into', 'all_to_all', 'all_reduce', 'broadcast',
           'send', 'recv', 'send_recv', 'unshard', 'unshard_layout'),
    Batch: ('prepare',),
    Context: ('enter', 'exit', 'unshard'),
    Attention: ('forward', 'backward'),
}

for _cls, _names in _ASYNC_CALLS.items():
    for _name in _names:
        setattr(_cls, _name + '_async', _awaitable_method(_cls, _name))


async def _context_aenter(self):
    await self.enter_async()
    return self


async def _context_aexit(self, exc_type, exc_value, traceback):
    await self.exit_async()
    return False


Context.__aenter__ = _context_aenter
Context.__aexit__ = _context_aexit


# ---- PyTorch producers that move their memory ----
#
# PyTorch frees or moves a tensor's memory on resize_() or set_() even
# while a DLPack export of it is alive, so a Cp.Tensor made by
# from_dlpack() would go on reading freed memory.  The override keeps the
# producer with the tensor (and its views made here) and, before every
# call of this module that is given the tensor, checks that the producer's
# memory is still where it was.

def _torch_memory(obj):
    """Where a torch.Tensor's memory is now: (data_ptr, storage address,
    storage bytes); None for any other producer (numpy refuses to resize an
    array that is exported)."""
    torch = sys.modules.get('torch')
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    storage = obj.untyped_storage() if hasattr(obj, 'untyped_storage') else obj.storage()
    return obj.data_ptr(), storage.data_ptr(), storage.nbytes()


# The producer of each DLPack storage, by the storage's address, so that
# a tensor later made over the same storage (Tensor.new_from_storage)
# is checked too.  Only DLPack storages are looked up, and each import
# replaces the entry of its address.  The entry holds the producer
# weakly: once no one holds the PyTorch tensor, no one can resize it, and
# the entry goes.
_dlpack_producers = {}


def _forget_producer(address, reference):
    if _dlpack_producers.get(address, (None,))[0] is reference:
        del _dlpack_producers[address]


def _remember_producer(tensor, producer):
    memory = _torch_memory(producer)
    address = tensor.get_storage().get_data_address()
    if memory is not None:
        tensor._cp_producer = (producer, memory)
        reference = weakref.ref(producer, lambda r, a=address: _forget_producer(a, r))
        _dlpack_producers[address] = (reference, memory)
    else:
        _dlpack_producers.pop(address, None)
    return tensor


def _producer_of_storage(storage):
    """The (producer, memory) of a DLPack storage of PyTorch's, or None."""
    if storage.get_kind() != Cp.StorageKind.DLPACK:
        return None
    reference, memory = _dlpack_producers.get(storage.get_data_address(), (None, None))
    producer = reference() if reference is not None else None
    return (producer, memory) if producer is not None else None


def _held_producer(tensor):
    return getattr(tensor, '_cp_producer', None)


def _tensor_over_storage(function):
    """Tensor.new_from_storage: a tensor over a DLPack storage of
    PyTorch's keeps its producer, as the tensor first made over it does."""
    @functools.wraps(function)
    def new_from_storage(dtype, shape, storage, *args, **kwargs):
        tensor = function(dtype, shape, storage, *args, **kwargs)
        held = _producer_of_storage(storage)
        if held is not None:
            _check_producer_of(tensor, held)
            tensor._cp_producer = held
        return tensor
    return new_from_storage


def _check_producer(tensor):
    """Raises GLib.Error (Cp.TensorError.MOVED) when the PyTorch tensor
    behind @tensor has moved or freed the memory @tensor views."""
    held = _held_producer(tensor)
    if held is not None:
        _check_producer_of(tensor, held)


def _check_producer_of(tensor, held):
    producer, (data, storage, nbytes) = held
    now_data, now_storage, now_nbytes = _torch_memory(producer)
    if now_data == data and now_storage == storage and now_nbytes >= nbytes:
        return
    raise GLib.Error.new_literal(
        Cp.tensor_error_quark(),
        'the PyTorch tensor that %s views through DLPack has moved its memory since '
        'Cp.Tensor.from_dlpack() (data_ptr %#x, storage of %d bytes at %#x; now data_ptr %#x, '
        '%d bytes at %#x): a resize_() or set_() freed what this tensor reads. Keep a PyTorch '
        'tensor unchanged in size while a Cp.Tensor views it, or .clone() it first'
        % (tensor.describe(), data, nbytes, storage, now_data, now_nbytes, now_storage),
        int(Cp.TensorError.MOVED))


def _check_producers(values):
    for value in values:
        if isinstance(value, Cp.Tensor):
            _check_producer(value)
        elif isinstance(value, Cp.BatchOptions) and value.get_loss_mask() is not None:
            _check_producer(value.get_loss_mask())
        elif isinstance(value, (list, tuple)):
            _check_producers(value)


def _checking_producers(function):
    """@function, first checking the producer of every tensor it is given."""
    @functools.wraps(function)
    def method(*args, **kwargs):
        _check_producers(args)
        _check_producers(kwargs.values())
        return function(*args, **kwargs)
    return method


def _keeping_producer(function):
    """A Tensor method returning a view: the view keeps the producer."""
    @functools.wraps(function)
    def method(self, *args, **kwargs):
        _check_producer(self)
        result = function(self, *args, **kwargs)
        held = _held_producer(self)
        if (held is not None and isinstance(result, Cp.Tensor) and
                result.get_storage().get_data_address() == self.get_storage().get_data_address()):
            result._cp_producer = held
        return result
    return method


def _batch_checking_producers(function):
    """A Batch method: the tensors it holds are checked too."""
    @functools.wraps(function)
    def method(self, *args, **kwargs):
        _check_producers(self.values())
        _check_producers(args)
        return function(self, *args, **kwargs)
    return method


def _context_checking_producers(function):
    """A Context method: its registered buffers are checked too."""
    @functools.wraps(function)
    def method(self, *args, **kwargs):
        _check_producers(self.buffers)
        _check_producers(args)
        return function(self, *args, **kwargs)
    return method


_PRODUCER_CHECKS = {
    Tensor: (_checking_producers, ('copy', 'to_device', 'get_value', 'set_value', 'equal',
                                   'dup_bytes', 'to_dlpack', 'numpy', '__dlpack__', '__array__')),
    Mesh: (_checking_producers, ('all_gather', 'all_gather_into', 'all_to_all',
                                 'all_to_all_into', 'all_reduce',
                                 'broadcast', 'send', 'recv', 'send_recv', 'unshard',
                                 'unshard_layout')),
    Layout: (_checking_producers, ('new_thd_from_tensor', 'shard', 'shard_into', 'shard_backward',
                                   'unshard_pieces', 'unshard_pieces_into')),
    Attention: (_checking_producers, ('forward', 'backward')),
    Batch: (_batch_checking_producers, ('prepare', 'to_thd', 'pad_documents')),
    Context: (_context_checking_producers, ('enter', 'unshard', 'register_buffer')),
}

for _cls, (_wrap, _names) in _PRODUCER_CHECKS.items():
    for _name in _names:
        setattr(_cls, _name, _wrap(getattr(_cls, _name)))
        if hasattr(_cls, _name + '_async'):
            setattr(_cls, _name + '_async', _wrap(getattr(_cls, _name + '_async')))
for _name in ('narrow', 'reshape'):
    setattr(Tensor, _name, _keeping_producer(getattr(Tensor, _name)))
Tensor.new_from_storage = staticmethod(_tensor_over_storage(Cp.Tensor.new_from_storage))


# ---- Indices and ranks out of range ----
#
# The C API takes an index, a dimension or a rank out of range in these
# getters as a programmer error: a critical and a default value (0, None).
# Python code expects an exception, and a default value would be read as
# data, so the override checks first and raises GLib.Error
# (Cp.TensorError.OUT_OF_RANGE, or READ_ONLY for a write into read-only
# memory).

def _out_of_range(message):
    return GLib.Error.new_literal(Cp.tensor_error_quark(), message, int(Cp.TensorError.OUT_OF_RANGE))


def _checking_first_argument(bounds, message):
    """A method whose first argument must lie in bounds(self) = (low, high),
    high excluded; message(name, self, value, low, high) says why not."""
    def wrap(function):
        @functools.wraps(function)
        def method(self, value, *args, **kwargs):
            low, high = bounds(self)
            if not low <= value < high:
                raise _out_of_range(message(function.__name__, self, value, low, high))
            return function(self, value, *args, **kwargs)
        return method
    return wrap


_checking_index = _checking_first_argument(
    lambda t: (0, t.get_numel()),
    lambda name, t, index, low, high: '%s: index %d is outside %s, which holds %d elements (0 to %d)'
    % (name, index, t.describe(), high, high - 1))
_checking_dim = _checking_first_argument(
    lambda t: (-t.get_n_dims(), t.get_n_dims()),
    lambda name, t, dim, low, high: '%s: dimension %d does not exist in %s, which has %d (%d to %d)'
    % (name, dim, t.describe(), high, low, high - 1))
_checking_rank = _checking_first_argument(
    lambda layout: (0, layout.get_cp_size()),
    lambda name, layout, rank, low, high: '%s: rank %d is outside a layout of %d ranks (0 to %d)'
    % (name, rank, high, high - 1))


def _checking_writable(function):
    @functools.wraps(function)
    def method(self, *args, **kwargs):
        if self.get_storage().get_read_only():
            raise GLib.Error.new_literal(
                Cp.tensor_error_quark(),
                '%s: %s is over read-only memory' % (function.__name__, self.describe()),
                int(Cp.TensorError.READ_ONLY))
        return function(self, *args, **kwargs)
    return method


for _name in ('get_value', 'set_value'):
    setattr(Tensor, _name, _checking_index(getattr(Tensor, _name)))
Tensor.set_value = _checking_writable(Tensor.set_value)
Tensor.get_dim = _checking_dim(Tensor.get_dim)
for _name in ('get_local_len', 'get_local_indices', 'get_chunks', 'get_cost'):
    setattr(Layout, _name, _checking_rank(getattr(Layout, _name)))


def float32_to_bfloat16(array):
    """bfloat16 bit patterns (uint16) of a float32 array, rounded to nearest even."""
    import numpy as np

    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(array, dtype=np.float32))
    out = rounded.astype(np.uint16)
    out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def bfloat16_to_float32(bits):
    """float32 values of bfloat16 bit patterns (a uint16 array)."""
    import numpy as np

    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


__all__ += ['float32_to_bfloat16', 'bfloat16_to_float32']


def _callables():
    """Every function and method of the namespace, as PyGObject wraps them."""
    for name in dir(Cp):
        value = getattr(Cp, name)
        if isinstance(value, FunctionInfo):
            yield value
        elif isinstance(value, type):
            yield from (v for v in vars(value).values() if isinstance(v, FunctionInfo))


def _build_call_caches():
    """PyGObject builds a function's argument cache on its first call, and
    building it may run Python code (it imports the wrappers of the types
    involved, from any namespace), so another thread may run in the middle.
    When two rank threads make the first call of one function together,
    both build a cache and one of them leaks. So every function is called
    once here, on the importing thread, with arguments no function accepts
    (64 plain objects): the cache is built, then the call fails with
    TypeError on the argument count or on the first argument's type,
    before anything reaches C. About 15 ms for the whole namespace.

    Returns the functions that did not fail so (tests assert that none)."""
    not_an_argument = object()
    invoked = []
    for function in _callables():
        try:
            function(*(not_an_argument,) * 64)
        except TypeError:
            continue
        invoked.append(function.get_name())
    return invoked


_CALLS_NOT_REFUSED = _build_call_caches()
