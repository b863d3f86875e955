// Cp.Tensor from gjs: typed arrays in and out, views, errors.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';
import System from 'system';

import * as CpMesh from '../../bindings/gjs/cpmesh.js';
import {assertCase, assertEqual, assertTrue, run} from './harness.js';

const {Cp} = CpMesh;
const SHAPE = Cp.TensorError.SHAPE;

function values(tensor) {
    return Array.from({length: tensor.get_numel()}, (_, i) => tensor.get_value(i));
}

run([
    ['typed arrays become tensors of the matching dtype', () => {
        const cases = [
            [new Float32Array([1.5, -2, 3, 4, 5, 6]), Cp.DType.FLOAT32],
            [new Float64Array([1e-3, 2, 3, 4, 5, 6]), Cp.DType.FLOAT64],
            [new Int32Array([-1, 2, -3, 4, -5, 6]), Cp.DType.INT32],
            [new Uint8Array([1, 2, 3, 4, 5, 255]), Cp.DType.UINT8],
            [new BigInt64Array([-1n, 2n, 3n, 4n, 5n, 1n << 40n]), Cp.DType.INT64],
        ];
        for (const [array, dtype] of cases) {
            const t = CpMesh.tensorFromTypedArray(array, [2, 3]);
            const name = Cp.dtype_get_name(dtype);
            assertEqual(t.get_dtype(), dtype, `${name} dtype`);
            assertEqual(t.get_shape(), [2, 3], `${name} shape`);
            const back = CpMesh.toTypedArray(t);
            assertTrue(back instanceof array.constructor, `${name} array type`);
            assertEqual(back, array, `${name} elements`);
        }
    }],

    ['the shape defaults to one dimension', () => {
        const t = CpMesh.tensorFromTypedArray(new Int32Array([7, 8, 9]));
        assertEqual(t.describe(), 'int32[3] on host');
    }],

    ['16-bit floats and booleans need an explicit dtype', () => {
        // 0x3F80 is 1.0 in bfloat16, 0x3C00 is 1.0 in IEEE half precision.
        const bf16 = CpMesh.tensorFromTypedArray(new Uint16Array([0x3F80, 0xC020]), [2], Cp.DType.BFLOAT16);
        assertEqual(values(bf16), [1, -2.5], 'bfloat16 values');
        const half = CpMesh.tensorFromTypedArray(new Uint16Array([0x3C00, 0x4000]), [2], Cp.DType.FLOAT16);
        assertEqual(values(half), [1, 2], 'float16 values');
        const bool = CpMesh.tensorFromTypedArray(new Uint8Array([0, 1, 1]), [3], Cp.DType.BOOL);
        assertEqual(bool.get_dtype(), Cp.DType.BOOL, 'bool dtype');
        assertTrue(CpMesh.toTypedArray(bf16) instanceof Uint16Array, 'bfloat16 comes back as bits');
        let threw = false;
        try {
            CpMesh.tensorFromTypedArray(new Int16Array(2));
        } catch (e) {
            threw = e instanceof TypeError && e.message.includes('Int16Array');
        }
        assertTrue(threw, 'Int16Array without a dtype is a TypeError');
    }],

    ['tensorFromTypedArray copies the array', () => {
        const array = new Float32Array([1, 2, 3]);
        const t = CpMesh.tensorFromTypedArray(array);
        array[0] = 100;
        assertEqual(t.get_value(0), 1, 'tensor after the array changed');
    }],

    ['toTypedArray is a view of the tensor', () => {
        const t = Cp.Tensor.new(Cp.DType.INT32, [4]);
        const view = CpMesh.toTypedArray(t);
        t.set_value(2, 42);
        assertEqual(view, [0, 0, 42, 0], 'view after a write through the tensor');
    }],

    ['the view outlives the tensor', () => {
        let view = CpMesh.toTypedArray(Cp.Tensor.new_arange(Cp.DType.FLOAT64, 0, 4, 1));
        System.gc();
        // Same-size allocations would reuse the block had it been freed.
        const others = Array.from({length: 4}, () => Cp.Tensor.new_full(Cp.DType.FLOAT64, [4], -1));
        assertEqual(view, [0, 1, 2, 3], 'view after the tensor was collected');
        assertEqual(others.length, 4, 'other tensors');
    }],

    ['arange, full and copy', () => {
        assertEqual(values(Cp.Tensor.new_arange(Cp.DType.INT64, 0, 10, 3)), [0, 3, 6, 9], 'arange');
        const full = Cp.Tensor.new_full(Cp.DType.UINT8, [2, 2], 300);
        assertEqual(values(full), [255, 255, 255, 255], 'full saturates');
        const copy = full.copy();
        assertTrue(copy.equal(full), 'copy equals');
        assertTrue(copy.get_data_address() !== full.get_data_address(), 'copy has its own memory');
    }],

    ['narrowing the first dimension is a view, an inner one a copy', () => {
        const t = CpMesh.tensorFromTypedArray(new Float32Array([0, 1, 2, 3, 4, 5, 6, 7]), [2, 4]);
        const row = t.narrow(0, 1, 1);
        assertEqual(row.get_data_address(), t.get_data_address() + 16, 'row address');
        row.set_value(0, -4);
        assertEqual(t.get_value(4), -4, 'write through the row');
        const cols = t.narrow(1, 1, 2);
        assertEqual(values(cols), [1, 2, 5, 6], 'columns');
        cols.set_value(0, 99);
        assertEqual(t.get_value(1), 1, 'original after writing the copy');
    }],

    ['errors carry a domain, a code and the values', () => {
        assertCase('CpTensor', 'cp_tensor_new with a dimension of negative size',
            Cp.tensor_error_quark(), SHAPE, 'dimension 1 has negative size -1',
            () => Cp.Tensor.new(Cp.DType.FLOAT32, [2, -1]));
        assertCase('CpTensor', 'cp_tensor_new with 9 dimensions (at most 8)',
            Cp.tensor_error_quark(), SHAPE, 'at most 8 dimensions, 9 were given',
            () => Cp.Tensor.new(Cp.DType.FLOAT32, [1, 1, 1, 1, 1, 1, 1, 1, 1]));
        const bytes = new GLib.Bytes(new Uint8Array(24));
        assertCase('CpTensor', 'cp_tensor_new_from_bytes with fewer bytes than the shape needs',
            Cp.tensor_error_quark(), SHAPE, 'needs 32 bytes, but 24 were given',
            () => Cp.Tensor.new_from_bytes(Cp.DType.FLOAT32, [2, 4], bytes));
        const t = Cp.Tensor.new(Cp.DType.INT32, [2, 4]);
        const e = assertCase('CpTensor', 'cp_tensor_narrow past the end of the dimension',
            Cp.TensorError.quark(), Cp.TensorError.OUT_OF_RANGE,
            '[3, 5) is outside dimension 1 of size 4', () => t.narrow(1, 3, 2));
        assertEqual(e.domain, Cp.tensor_error_quark(), 'domain');
    }],
]);
