// gjs helpers for libcpmesh
//
// SPDX-License-Identifier: LGPL-2.1-or-later
//
// import * as CpMesh from './cpmesh.js';
//
// Promisifies the _async calls and converts tensors to and from typed
// arrays. gjs runs JavaScript on one thread, so drive in-process ranks with
// the _async calls, or run one rank per process. A GLib.MainLoop run after
// a top-level await of a module never settles promises (it runs inside
// gjs's job queue): start the loop first, or just await at top level.

import GLib from 'gi://GLib';
import Gio from 'gi://Gio';
import Cp from 'gi://Cp?version=1';

// Every call that waits on other ranks: `await mesh.all_gather_async(t, 0,
// null)` resolves to what all_gather() returns; a finish function with
// several outputs resolves to an array of them
// (`const [out, lse] = await attention.forward_async(q, k, v, null)`; the
// blocking call puts a `true` first: `const [, out, lse] =
// attention.forward(q, k, v)`).
const ASYNC_CALLS = new Map([
    [Cp.Mesh.prototype, ['barrier', 'all_gather', 'all_gather_into', 'all_to_all', 'all_reduce',
        'broadcast', 'send', 'recv', 'send_recv', 'unshard', 'unshard_layout']],
    [Cp.Batch.prototype, ['prepare']],
    [Cp.Context.prototype, ['enter', 'exit', 'unshard']],
    [Cp.Attention.prototype, ['forward', 'backward']],
]);
for (const [proto, names] of ASYNC_CALLS) {
    for (const name of names)
        Gio._promisify(proto, `${name}_async`, `${name}_finish`);
}
Gio._promisify(Cp.Mesh, 'connect_async', 'connect_finish');

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

export {Cp};
