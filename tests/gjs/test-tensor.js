// Cp.Tensor from gjs: typed arrays in and out, views, errors.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';
import System from 'system';

import * as CpMesh from '../../bindings/gjs/cpmesh.js';
import {assertCase, assertEqual, assertTrue, run} from './harness.js';

const {Cp} = CpMesh;
const SHAPE = Cp.TensorError.SHAPE;

// The gjs module's own refusals, recorded under one subject.
const MODULE = 'gjs cpmesh.js';

// Where GI_TYPELIB_PATH's Cp-1.typelib was built, the Cp-1.gir beside it,
// or null (an installed typelib has no GIR beside it).
function findGir() {
    for (const dir of (GLib.getenv('GI_TYPELIB_PATH') ?? '').split(':')) {
        const path = GLib.build_filenamev([dir, 'Cp-1.gir']);
        if (dir && GLib.file_test(path, GLib.FileTest.EXISTS))
            return path;
    }
    return null;
}

const GIR_INTEGERS = {gint: 'int', guint: 'uint', gint64: 'int64', gsize: 'size', guint64: 'size'};

// "Type.method" -> the integer arguments as the JavaScript caller passes
// them, in the module's notation ('dim:int', 'shape:int64[]', null), for
// every callable of the GIR that takes an integer. Array lengths,
// closures, destroy notifiers and out arguments are left out, as gjs
// leaves them out.
function girIntegerArguments(gir) {
    const calls = {};
    const types = gir.split(/<(?:class|record|interface) name="/).slice(1);
    for (const typeChunk of types) {
        const typeName = /^(\w+)"/.exec(typeChunk)[1];
        const callables = typeChunk.matchAll(
            /<(method|constructor|function) name="(\w+)"[^>]*>([\s\S]*?)<\/\1>/g);
        for (const [, kind, name, body] of callables) {
            const params = [...body.matchAll(/<parameter name="(\w+)"([^>]*)>([\s\S]*?)<\/parameter>/g)];
            const hidden = new Set();
            for (const [, , attrs, inner] of params) {
                for (const [, index] of `${attrs} ${inner}`.matchAll(/(?:length|closure|destroy)="(\d+)"/g))
                    hidden.add(Number(index));
            }
            const visible = params.filter(([, , attrs], i) =>
                !hidden.has(i) && !/direction="out"/.test(attrs));
            const specs = visible.map(([, param, , inner]) => {
                const isArray = /<array/.test(inner);
                const type = GIR_INTEGERS[/<type name="(\w+)"/.exec(inner)?.[1]];
                return type ? `${param}:${type}${isArray ? '[]' : ''}` : null;
            });
            while (specs.length > 0 && specs[specs.length - 1] === null)
                specs.pop();
            if (specs.length > 0)
                calls[`${typeName}.${kind === 'method' ? 'prototype.' : ''}${name}`] = specs;
        }
    }
    return calls;
}

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

    ['dimensions that are not whole, non-negative numbers below 2^53 are refused', () => {
        const bad = [[1.5, 'not a whole number'], [NaN, 'not a whole number'],
            [Infinity, 'not a whole number'], [-1, 'negative'], [2 ** 53, 'beyond 2^53 - 1'],
            ['2', 'not a number']];
        for (const [value, why] of bad) {
            const shown = typeof value === 'string' ? '"2"' : String(value);
            assertCase(MODULE, `Cp.Tensor.new with a dimension of ${shown}`,
                Cp.tensor_error_quark(), SHAPE, `shape [2, ${shown}]: dimension 1 is ${shown}, ${why}`,
                () => Cp.Tensor.new(Cp.DType.FLOAT32, [2, value]));
        }
        assertCase(MODULE, 'tensorFromTypedArray with a shape of [1.5]',
            Cp.tensor_error_quark(), SHAPE, 'Cp.Tensor.new_from_bytes: shape [1.5]: dimension 0 is 1.5',
            () => CpMesh.tensorFromTypedArray(new Float32Array(2), [1.5]));
        assertCase(MODULE, 'Cp.Tensor.new_full with a dimension of NaN',
            Cp.tensor_error_quark(), SHAPE, 'dimension 0 is NaN',
            () => Cp.Tensor.new_full(Cp.DType.FLOAT32, [NaN], 1));
        const t = Cp.Tensor.new(Cp.DType.INT32, [2, 4]);
        assertCase(MODULE, 'Cp.Tensor.narrow along dimension 0.5',
            Cp.tensor_error_quark(), SHAPE, 'Cp.Tensor.narrow: dim is 0.5, not a whole number',
            () => t.narrow(0.5, 0, 1));
        assertCase(MODULE, 'Cp.Tensor.narrow of length 1.5',
            Cp.tensor_error_quark(), SHAPE, 'length is 1.5, not a whole number', () => t.narrow(1, 0, 1.5));
        assertCase(MODULE, 'Cp.Tensor.narrow from start NaN',
            Cp.tensor_error_quark(), Cp.TensorError.OUT_OF_RANGE, 'start is NaN, not a whole number',
            () => t.narrow(1, NaN, 1));
        assertCase(MODULE, 'Cp.Tensor.narrow along dimension 2^33 (a 32-bit int would wrap to 0)',
            Cp.tensor_error_quark(), SHAPE, 'dim is 8589934592, outside the range of a 32-bit int',
            () => t.narrow(2 ** 33, 0, 1));
        assertCase(MODULE, 'Cp.Tensor.get_dim of dimension 1.7',
            Cp.tensor_error_quark(), SHAPE, 'dim is 1.7', () => t.get_dim(1.7));
        assertCase(MODULE, 'Cp.Tensor.get_value at index Infinity',
            Cp.tensor_error_quark(), Cp.TensorError.OUT_OF_RANGE, 'index is Infinity', () => t.get_value(Infinity));
    }],

    ['whole numbers, BigInts and negative dimension indices still pass', () => {
        assertEqual(Cp.Tensor.new(Cp.DType.FLOAT32, [2n, 3n]).get_shape(), [2, 3], 'BigInt shape');
        assertEqual(Cp.Tensor.new(Cp.DType.FLOAT32, new Int32Array([1, 0, 2])).get_shape(), [1, 0, 2],
            'typed-array shape, with an empty dimension');
        const t = Cp.Tensor.new_arange(Cp.DType.INT32, 0, 8, 1).narrow(-1, 2, 3);
        assertEqual(values(t), [2, 3, 4], 'narrow along dimension -1');
        assertEqual(t.get_dim(-1), 3, 'get_dim(-1)');
    }],

    ['every integer argument in the GIR is checked', () => {
        const path = findGir();
        if (path === null) {
            print('# no Cp-1.gir beside the typelib; nothing to compare');
            return;
        }
        const gir = new TextDecoder().decode(GLib.file_get_contents(path)[1]);
        const expected = girIntegerArguments(gir);
        const checked = {};
        for (const [typeName, calls] of Object.entries(CpMesh._INTEGER_ARGUMENTS)) {
            for (const [call, specs] of Object.entries(calls))
                checked[`${typeName}.${call}`] = specs;
        }
        assertTrue(Object.keys(expected).length > 50, `the GIR has integer arguments (${path})`);
        for (const call of Object.keys(checked))
            assertTrue(call in expected, `${call}, which cpmesh.js checks, takes integers in the GIR`);
        for (const [call, specs] of Object.entries(expected))
            assertEqual(String(checked[call]), String(specs), `the integer arguments cpmesh.js checks for ${call}`);
    }],
]);
