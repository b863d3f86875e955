// gjs helpers for libcpmesh
//
// SPDX-License-Identifier: LGPL-2.1-or-later
//
// import * as CpMesh from './cpmesh.js';
//
// Promisifies the _async calls, converts tensors to and from typed arrays,
// and refuses integers that gjs would otherwise truncate into another
// dimension or size. gjs runs JavaScript on one thread, so drive in-process
// ranks with the _async calls, or run one rank per process.
//
// Where to await (gjs 1.74): either await at the top level of the program
// and run no GLib.MainLoop at all (gjs's own loop runs until the module
// settles), or start the loop at the top level, before any await, and do
// the awaiting inside an async function started before loop.run(). A loop
// run after an await (at the top level or in an async function) or from a
// .then() callback runs inside gjs's promise job queue, which does not run again until that
// loop returns: every call completes, and no code awaiting it ever
// continues. This module notices that (a call's completion whose
// continuation has not run DISPATCH_GRACE_MS later) and says so on stderr.

import GLib from 'gi://GLib';
import Cp from 'gi://Cp?version=1';

// The integer arguments of every call that takes one, as the JavaScript
// caller passes them (array lengths, callbacks and doubles left out; null
// for an argument that is not an integer). gjs converts a number to a C
// integer by truncation and wrap-around, so a shape of [2, 1.5] would
// become [2, 1], NaN 0, the string '2' 2 and 2^33 a dimension 0: each is
// refused here instead. `int`/`uint` are 32-bit, `int64`/`size`
// 64-bit, taken only up to 2^53 - 1 (a Number holds no more exactly; pass
// a BigInt for more); `[]` is an array of them.
const INTEGER_ARGUMENTS = {
    Tensor: {
        new: [null, 'shape:int64[]'],
        new_full: [null, 'shape:int64[]'],
        new_shared: [null, 'shape:int64[]'],
        new_from_bytes: [null, 'shape:int64[]'],
        new_from_fd: [null, 'shape:int64[]', 'fd:int', 'offset:int64'],
        new_from_storage: [null, 'shape:int64[]', null, 'offset:size'],
        new_borrowed: [null, 'shape:int64[]', null, 'size:size'],
        new_arange: [null, 'start:int64', 'end:int64', 'step:int64'],
        'prototype.narrow': ['dim:int', 'start:int64', 'length:int64'],
        // One dimension may be -1: inferred from the others.
        'prototype.reshape': ['new_shape:int64[]'],
        'prototype.prepare_dlpack_stream': ['stream:int64'],
        'prototype.get_dim': ['dim:int'],
        'prototype.get_value': ['index:int64'],
        'prototype.set_value': ['index:int64'],
    },
    Storage: {
        new: ['size:size'],
        new_shared: ['size:size'],
        new_from_fd: ['fd:int', 'offset:int64', 'size:size'],
        new_borrowed: [null, 'size:size'],
        new_with_owner: [null, 'size:size'],
    },
    Layout: {
        new: [null, 'seq_len:int64', 'cp_size:int'],
        new_thd: ['cu_seqlens_padded:int64[]', 'cp_size:int'],
        new_thd_from_tensor: [null, 'cp_size:int'],
        'prototype.get_chunks': ['rank:int'],
        'prototype.get_cost': ['rank:int'],
        'prototype.get_local_indices': ['rank:int'],
        'prototype.get_local_len': ['rank:int'],
        'prototype.shard': [null, 'seq_dim:int', 'rank:int'],
        'prototype.shard_backward': [null, 'seq_dim:int', 'rank:int'],
        'prototype.shard_into': [null, 'seq_dim:int', 'rank:int'],
        'prototype.unshard_pieces': [null, 'seq_dim:int'],
        'prototype.unshard_pieces_into': [null, 'seq_dim:int'],
    },
    Mesh: {
        new_local_group: [null, 'dim_sizes:int[]'],
        new_ucx: ['rank:int', 'world_size:int', null, 'port:uint', null, null, 'dim_sizes:int[]', 'timeout_ms:uint'],
        'prototype.all_gather': [null, 'dim:int'],
        'prototype.all_gather_async': [null, 'dim:int'],
        'prototype.all_gather_into': [null, 'dim:int'],
        'prototype.all_gather_into_async': [null, 'dim:int'],
        'prototype.all_to_all': [null, 'dim:int'],
        'prototype.all_to_all_async': [null, 'dim:int'],
        'prototype.all_to_all_into': [null, 'dim:int'],
        'prototype.broadcast': [null, 'root:int'],
        'prototype.broadcast_async': [null, 'root:int'],
        'prototype.send': [null, 'dst:int', 'tag:uint'],
        'prototype.send_async': [null, 'dst:int', 'tag:uint'],
        'prototype.recv': [null, 'src:int', 'tag:uint'],
        'prototype.recv_async': [null, 'src:int', 'tag:uint'],
        'prototype.send_recv': [null, 'dst:int', null, 'src:int', 'tag:uint'],
        'prototype.send_recv_async': [null, 'dst:int', null, 'src:int', 'tag:uint'],
        'prototype.set_timeout_ms': ['timeout_ms:uint'],
        'prototype.unshard': [null, 'seq_dim:int'],
        'prototype.unshard_async': [null, 'seq_dim:int'],
        'prototype.unshard_layout': [null, 'seq_dim:int'],
        'prototype.unshard_layout_async': [null, 'seq_dim:int'],
    },
    MeshOptions: {
        'prototype.set_dims': [null, 'dim_sizes:int[]'],
        'prototype.set_port': ['port:uint'],
        'prototype.set_rank': ['rank:int'],
        'prototype.set_timeout_ms': ['timeout_ms:uint'],
        'prototype.set_world_size': ['world_size:int'],
    },
    Batch: {
        'prototype.get_layout': ['chunk:uint'],
        'prototype.pad_documents': ['cp_size:int'],
        'prototype.set_seq_dim': [null, 'seq_dim:int'],
    },
    BatchOptions: {
        'prototype.add_extra_buffer': [null, 'seq_dim:int'],
        'prototype.get_extra_buffer': ['index:uint'],
    },
    Context: {
        'prototype.get_buffer': ['index:uint'],
        'prototype.get_buffer_name': ['index:uint'],
        'prototype.get_buffer_restores': ['index:uint'],
        'prototype.get_buffer_seq_dim': ['index:uint'],
        'prototype.register_buffer': [null, 'seq_dim:int'],
        'prototype.unshard': [null, 'seq_dim:int'],
        'prototype.unshard_async': [null, 'seq_dim:int'],
    },
    AttentionOptions: {
        'prototype.set_cu_seqlens': ['cu_seqlens:int64[]'],
        'prototype.set_cu_seqlens_padded': ['cu_seqlens_padded:int64[]'],
        'prototype.set_heads': ['n_heads:int', 'n_kv_heads:int'],
        'prototype.set_n_threads': ['n_threads:int'],
        'prototype.set_seq_lens': ['seq_lens:int64[]'],
    },
    ThdOptions: {
        'prototype.set_num_chunks': ['num_chunks:int'],
        'prototype.set_padding_token_id': ['padding_token_id:int64'],
        'prototype.set_seq_lens_padding_value': ['value:int64'],
    },
};

// Shapes and sizes: a negative value is never meant, whatever C would
// make of it.
const NON_NEGATIVE = new Set(['shape', 'dim_sizes', 'length', 'size', 'seq_len', 'cp_size',
    'cu_seqlens', 'cu_seqlens_padded', 'seq_lens', 'offset', 'world_size']);
// Arguments that are a shape, a dimension or a length: refused as
// Cp.TensorError.SHAPE; every other integer (an index, rank, offset, tag)
// as Cp.TensorError.OUT_OF_RANGE.
const SHAPE_LIKE = new Set(['shape', 'dim_sizes', 'dim', 'seq_dim', 'length', 'size', 'seq_len',
    'cp_size', 'cu_seqlens', 'cu_seqlens_padded', 'seq_lens']);
const RANGES = {
    int: [-(2 ** 31), 2 ** 31 - 1],
    uint: [0, 2 ** 32 - 1],
    int64: [-Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
    size: [0, Number.MAX_SAFE_INTEGER],
};
const BIGINT_RANGES = {
    int: [-(2n ** 31n), 2n ** 31n - 1n],
    uint: [0n, 2n ** 32n - 1n],
    int64: [-(2n ** 63n), 2n ** 63n - 1n],
    size: [0n, 2n ** 64n - 1n],
};

function describeValue(value) {
    if (typeof value === 'string')
        return JSON.stringify(value);
    if (typeof value === 'bigint')
        return `${value}n`;
    return String(value);
}

const C_TYPE_NAMES = {int: 'a 32-bit int', uint: 'a 32-bit unsigned int', int64: 'an int64', size: 'a size'};

// Why value cannot be passed as an integer of type (`int`, `uint`, `int64`,
// `size`), or null when it can.
function integerProblem(value, type, nonNegative) {
    if (typeof value !== 'number' && typeof value !== 'bigint')
        return 'not a number';
    if (typeof value === 'number' && !Number.isInteger(value))
        return 'not a whole number';
    if (nonNegative && value < 0)
        return 'negative';
    const [min, max] = typeof value === 'bigint' ? BIGINT_RANGES[type] : RANGES[type];
    if (typeof value === 'number' && !Number.isSafeInteger(value) && max === Number.MAX_SAFE_INTEGER)
        return 'beyond 2^53 - 1, past which a Number does not hold every integer (pass a BigInt)';
    if (value < min || value > max)
        return `outside the range of ${C_TYPE_NAMES[type]} (${min}..${max})`;
    return null;
}

function integerError(what, name, message) {
    const code = SHAPE_LIKE.has(name) ? Cp.TensorError.SHAPE : Cp.TensorError.OUT_OF_RANGE;
    return new GLib.Error(Cp.tensor_error_quark(), code, `${what}: ${message}`);
}

// 'dim:int' -> {name: 'dim', type: 'int', isArray: false, nonNegative: false}.
function parseSpec(spec) {
    if (spec === null)
        return null;
    const [name, typeSpec] = spec.split(':');
    const isArray = typeSpec.endsWith('[]');
    return {name, type: isArray ? typeSpec.slice(0, -2) : typeSpec, isArray,
        nonNegative: NON_NEGATIVE.has(name)};
}

// Throws a Cp.TensorError naming the call, the argument and the value of
// the first integer argument of args that C would not receive as passed.
function checkIntegers(what, specs, args) {
    const count = Math.min(specs.length, args.length);
    for (let position = 0; position < count; position++) {
        const spec = specs[position];
        if (spec === null)
            continue;
        const {name, type, isArray, nonNegative} = spec;
        const value = args[position];
        if (!isArray) {
            const problem = integerProblem(value, type, nonNegative);
            if (problem)
                throw integerError(what, name, `${name} is ${describeValue(value)}, ${problem}`);
            continue;
        }
        if (value === null || value === undefined)
            continue;
        if (typeof value !== 'object' || typeof value.length !== 'number')
            throw integerError(what, name, `${name} is ${describeValue(value)}, not an array`);
        for (let i = 0; i < value.length; i++) {
            const problem = integerProblem(value[i], type, nonNegative);
            if (problem) {
                const shown = Array.from(value, describeValue).join(', ');
                const element = name === 'shape' ? 'dimension' : 'element';
                throw integerError(what, name,
                    `${name} [${shown}]: ${element} ${i} is ${describeValue(value[i])}, ${problem}`);
            }
        }
    }
}

for (const [typeName, calls] of Object.entries(INTEGER_ARGUMENTS)) {
    for (const [path, specStrings] of Object.entries(calls)) {
        const isMethod = path.startsWith('prototype.');
        const name = isMethod ? path.slice('prototype.'.length) : path;
        const owner = isMethod ? Cp[typeName].prototype : Cp[typeName];
        const original = owner[name];
        if (typeof original !== 'function')
            continue;
        const what = `Cp.${typeName}.${name}`;
        const specs = specStrings.map(parseSpec);
        owner[name] = function (...args) {
            checkIntegers(what, specs, args);
            return original.apply(this, args);
        };
    }
}

// How long after a call completes the code awaiting it may wait for gjs to
// run it before this module says why it does not.
export const DISPATCH_GRACE_MS = 2000;

let watchdogArmed = false;
let watchdogFired = false;

// Called when a call's GIO callback has settled its promise: checks that
// gjs's job queue, which runs the continuation, runs within
// DISPATCH_GRACE_MS. The timer has a low priority, so it fires in an
// iteration with nothing more urgent due: a continuation merely queued
// behind other work is not taken for one that cannot run. One check at a time covers every call,
// since the queue runs in order.
function watchContinuation(what) {
    if (watchdogArmed || watchdogFired)
        return;
    watchdogArmed = true;
    const finished = GLib.get_monotonic_time();
    let timer = GLib.timeout_add(GLib.PRIORITY_LOW, DISPATCH_GRACE_MS, () => {
        timer = 0;
        watchdogArmed = false;
        watchdogFired = true;
        const seconds = ((GLib.get_monotonic_time() - finished) / 1e6).toFixed(1);
        printerr(`cpmesh.js: ${what} finished ${seconds} s ago, but the code awaiting it ` +
            'has not run: gjs runs promise continuations from its job queue, and a ' +
            'GLib.MainLoop run after an await (at the top level of a module or in an ' +
            'async function) or from a .then() callback runs inside that queue, so nothing ' +
            'awaited continues until the loop returns. Await at the top level with no main ' +
            'loop, or start the loop at the top level before the first await (see ' +
            '"JavaScript (gjs)" in doc/bindings.md).');
        return GLib.SOURCE_REMOVE;
    });
    Promise.resolve().then(() => {
        if (timer === 0)
            return;
        watchdogArmed = false;
        GLib.source_remove(timer);
    });
}

// Gio._promisify, plus the watchdog above: `method(...args)` without a
// callback returns a promise of what `finish` returns, with the leading
// `true` of a (skip)ped boolean result dropped; with a callback it is the
// plain GIO call.
function promisify(owner, asyncName, finishName, what) {
    const original = owner[asyncName];
    owner[asyncName] = function (...args) {
        if (typeof args[args.length - 1] === 'function')
            return original.apply(this, args);
        const callStack = new Error().stack;
        return new Promise((resolve, reject) => {
            original.call(this, ...args, (source, result) => {
                try {
                    const finish = source?.[finishName] ? source : owner;
                    let value = finish[finishName](result);
                    if (Array.isArray(value) && value.length > 1 && value[0] === true)
                        value = value.slice(1);
                    resolve(value);
                } catch (error) {
                    error.stack = `${error.stack ?? ''}### Promise created here: ###\n${callStack}`;
                    reject(error);
                }
                watchContinuation(what);
            });
        });
    };
}

// Every call that waits on other ranks: `await mesh.all_gather_async(t, 0,
// null)` resolves to what all_gather() returns; a finish function with
// several outputs resolves to an array of them
// (`const [out, lse] = await attention.forward_async(q, k, v, null)`; the
// blocking call puts a `true` first: `const [, out, lse] =
// attention.forward(q, k, v)`).
const ASYNC_CALLS = new Map([
    ['Mesh', ['barrier', 'all_gather', 'all_gather_into', 'all_to_all', 'all_reduce',
        'broadcast', 'send', 'recv', 'send_recv', 'unshard', 'unshard_layout']],
    ['Batch', ['prepare']],
    ['Context', ['enter', 'exit', 'unshard']],
    ['Attention', ['forward', 'backward']],
]);
for (const [typeName, names] of ASYNC_CALLS) {
    for (const name of names) {
        promisify(Cp[typeName].prototype, `${name}_async`, `${name}_finish`,
            `Cp.${typeName}.${name}_async()`);
    }
}
promisify(Cp.Mesh, 'connect_async', 'connect_finish', 'Cp.Mesh.connect_async()');

const TYPED_ARRAYS = new Map([
    [Cp.DType.BOOL, Uint8Array],
    [Cp.DType.UINT8, Uint8Array],
    [Cp.DType.INT32, Int32Array],
    [Cp.DType.INT64, BigInt64Array],
    [Cp.DType.FLOAT16, Uint16Array],
    [Cp.DType.BFLOAT16, Uint16Array],
    [Cp.DType.FLOAT32, Float32Array],
    [Cp.DType.FLOAT64, Float64Array],
]);

function dtypeOf(array) {
    if (array instanceof Float32Array) return Cp.DType.FLOAT32;
    if (array instanceof Float64Array) return Cp.DType.FLOAT64;
    if (array instanceof Int32Array) return Cp.DType.INT32;
    if (array instanceof BigInt64Array) return Cp.DType.INT64;
    if (array instanceof Uint8Array) return Cp.DType.UINT8;
    throw new TypeError(`no Cp.DType for ${array.constructor.name}; pass one`);
}

/**
 * Makes a tensor holding a copy of a typed array, in memory of its own
 * that every operation may write (a tensor over the GLib.Bytes itself
 * would be read-only, see Cp.Storage.get_read_only).
 *
 * @param {TypedArray} array the elements, row-major
 * @param {number[]} shape the shape; defaults to [array.length]
 * @param {Cp.DType} [dtype] needed for BOOL, FLOAT16 and BFLOAT16
 * @returns {Cp.Tensor}
 */
export function tensorFromTypedArray(array, shape = [array.length], dtype = dtypeOf(array)) {
    const bytes = new GLib.Bytes(new Uint8Array(array.buffer, array.byteOffset, array.byteLength));
    return Cp.Tensor.new_from_bytes(dtype, shape, bytes).copy();
}

/**
 * Views a tensor's elements as a typed array, without copying.
 *
 * @param {Cp.Tensor} tensor a host tensor
 * @returns {TypedArray} a view that keeps the tensor's storage alive
 */
export function toTypedArray(tensor) {
    const bytes = tensor.dup_bytes().toArray();
    const Type = TYPED_ARRAYS.get(tensor.get_dtype());
    return new Type(bytes.buffer, bytes.byteOffset, bytes.byteLength / Type.BYTES_PER_ELEMENT);
}

// For tests: the integer arguments checked, by type and call.
export const _INTEGER_ARGUMENTS = INTEGER_ARGUMENTS;

export {Cp};
