// Cp.Layout from gjs: reference layouts, round trips through typed arrays,
// costs and errors.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import * as CpMesh from '../../bindings/gjs/cpmesh.js';
import {assertCase, assertEqual, assertTrue, run} from './harness.js';

const {Cp} = CpMesh;
const HEAD_TAIL = Cp.LoadBalance.HEAD_TAIL;

function indices(layout, rank) {
    // int64 elements come back as BigInt; positions here are small.
    return Array.from(CpMesh.toTypedArray(layout.get_local_indices(rank)), Number);
}

function range(start, end) {
    return Array.from({length: end - start}, (_, i) => start + i);
}

run([
    ['head-tail reference examples (E1)', () => {
        const examples = [
            [1, 4, [[0, 1, 2, 3]]],
            [2, 8, [[0, 1, 6, 7], [2, 3, 4, 5]]],
            [3, 12, [[0, 1, 10, 11], [2, 3, 8, 9], [4, 5, 6, 7]]],
            [4, 16, [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]],
            [8, 32, range(0, 8).map(r => [2 * r, 2 * r + 1, 30 - 2 * r, 31 - 2 * r])],
        ];
        for (const [cp, seq, expected] of examples) {
            const layout = Cp.Layout.new(HEAD_TAIL, seq, cp);
            assertEqual(layout.get_cp_size(), cp, 'cp size');
            for (let r = 0; r < cp; r++)
                assertEqual(indices(layout, r), expected[r], `C=${cp} rank ${r}`);
        }
    }],

    ['every position is on exactly one rank', () => {
        for (const cp of [1, 2, 3, 4, 8]) {
            const seq = 6 * cp;
            const layout = Cp.Layout.new(HEAD_TAIL, seq, cp);
            const held = range(0, cp).flatMap(r => indices(layout, r));
            assertEqual(held.sort((a, b) => a - b), range(0, seq), `C=${cp}`);
        }
    }],

    ['restore indices invert the gathered order (E5)', () => {
        const layout = Cp.Layout.new(HEAD_TAIL, 8, 2);
        const restore = Array.from(CpMesh.toTypedArray(layout.get_restore_indices()), Number);
        assertEqual(restore, [0, 1, 4, 5, 6, 7, 2, 3], 'restore');
    }],

    ['per-document THD partition (E6)', () => {
        const layout = Cp.Layout.new_thd([0, 8, 12], 2);
        assertEqual(layout.get_n_documents(), 2, 'documents');
        assertEqual(indices(layout, 0), [0, 1, 6, 7, 8, 11], 'rank 0');
        assertEqual(indices(layout, 1), [2, 3, 4, 5, 9, 10], 'rank 1');
        const ids = CpMesh.tensorFromTypedArray(
            new Int32Array([101, 102, 103, 104, 105, 106, 0, 0, 201, 202, 203, 0]));
        assertEqual(CpMesh.toTypedArray(layout.shard(ids, 0, 0)), [101, 102, 0, 0, 201, 0], 'ids of rank 0');
    }],

    ['shard and unshard_pieces round trip along every dimension', () => {
        const cp = 4;
        for (let seqDim = 0; seqDim < 3; seqDim++) {
            const shape = [2, 3, 5];
            shape[seqDim] = 16;
            const n = shape.reduce((a, b) => a * b);
            const full = CpMesh.tensorFromTypedArray(Float32Array.from(range(0, n)), shape);
            const layout = Cp.Layout.new(HEAD_TAIL, 16, cp);
            const pieces = range(0, cp).map(r => layout.shard(full, seqDim, r));
            assertEqual(pieces[0].get_dim(seqDim), 4, 'local length');
            const back = layout.unshard_pieces(pieces, seqDim);
            assertTrue(back.equal(full), `round trip along ${seqDim}`);
        }
    }],

    ['shard_backward scatters into zeros (E4)', () => {
        const layout = Cp.Layout.new(HEAD_TAIL, 8, 2);
        const grad = layout.shard_backward(Cp.Tensor.new_full(Cp.DType.FLOAT32, [4], 1), 0, 1);
        assertEqual(CpMesh.toTypedArray(grad), [0, 0, 1, 1, 1, 1, 0, 0], 'gradient');
    }],

    ['head-tail balances the causal cost', () => {
        const ht = Cp.Layout.new(HEAD_TAIL, 8, 2);
        assertEqual([ht.get_cost(0), ht.get_cost(1)], [18, 18], 'head-tail cost');
        assertEqual(ht.get_imbalance(), 1, 'head-tail imbalance');
        const contiguous = Cp.Layout.new(Cp.LoadBalance.CONTIGUOUS, 8, 2);
        assertEqual([contiguous.get_cost(0), contiguous.get_cost(1)], [10, 26], 'contiguous cost');
        assertEqual(contiguous.get_imbalance(), 26 / 18, 'contiguous imbalance');
    }],

    ['layouts compare by value', () => {
        // fingerprint() is a guint64, which a JS Number cannot hold exactly
        // (gjs warns): compare with equal() or the hexadecimal form.
        const a = Cp.Layout.new(HEAD_TAIL, 16, 4);
        assertTrue(a.equal(Cp.Layout.new(HEAD_TAIL, 16, 4)), 'same layout');
        assertTrue(a.dup_fingerprint_hex() === '60d6407a50e9d88e', 'stable hex fingerprint');
        assertTrue(a.equal(Cp.Layout.new_thd([0, 16], 4)), 'one document');
        assertTrue(!a.equal(Cp.Layout.new(Cp.LoadBalance.CONTIGUOUS, 16, 4)), 'other scheme');
    }],

    ['chunks stay apart and the picture is a string', () => {
        const layout = Cp.Layout.new(HEAD_TAIL, 16, 4);
        const chunks = Array.from(CpMesh.toTypedArray(layout.get_chunks(3)), Number);
        assertEqual(chunks, [6, 2, 8, 2], 'rank 3: head 6-7, tail 8-9');
        const svg = layout.to_svg();
        assertTrue(svg.startsWith('<?xml version="1.0" encoding="UTF-8"?>\n<svg '), 'an SVG document');
        assertEqual((svg.match(/class="chunk head"/g) || []).length, 4, 'head chunks');
        assertEqual((svg.match(/class="chunk tail"/g) || []).length, 4, 'tail chunks');
    }],

    ['errors name the length and the divisor', () => {
        const domain = Cp.tensor_error_quark();
        assertCase('CpLayout', 'cp_layout_new head-tail with a length not a multiple of 2·cp_size',
            domain, Cp.TensorError.SHAPE,
            'sequence length 6 is not a non-negative multiple of 4',
            () => Cp.Layout.new(HEAD_TAIL, 6, 2));
        assertCase('CpLayout', 'cp_layout_new_thd with a document not a multiple of 2·cp_size',
            domain, Cp.TensorError.SHAPE,
            'document 1 has padded length 6, not a multiple of 4',
            () => Cp.Layout.new_thd([0, 4, 10], 2));
        const layout = Cp.Layout.new(HEAD_TAIL, 8, 2);
        const wrong = Cp.Tensor.new(Cp.DType.INT64, [2, 10]);
        assertCase('CpLayout', 'cp_layout_shard of a tensor whose sequence length differs from the layout',
            domain, Cp.TensorError.SHAPE,
            'dimension 1 of int64[2, 10] on host has length 10, the layout needs 8',
            () => layout.shard(wrong, 1, 0));
        assertCase('CpLayout', 'cp_layout_unshard_pieces with fewer pieces than cp_size',
            domain, Cp.TensorError.SHAPE, '1 pieces were given for cp_size 2',
            () => layout.unshard_pieces([Cp.Tensor.new(Cp.DType.INT64, [4])], 0));
    }],

    ['lengths, dimensions and ranks must be whole numbers', () => {
        const domain = Cp.tensor_error_quark();
        assertCase('gjs cpmesh.js', 'Cp.Layout.new with a sequence length of 8.5',
            domain, Cp.TensorError.SHAPE, 'Cp.Layout.new: seq_len is 8.5, not a whole number',
            () => Cp.Layout.new(HEAD_TAIL, 8.5, 2));
        assertCase('gjs cpmesh.js', 'Cp.Layout.new_thd with a document bound of NaN',
            domain, Cp.TensorError.SHAPE, 'cu_seqlens_padded [0, 4, NaN]: element 2 is NaN',
            () => Cp.Layout.new_thd([0, 4, NaN], 2));
        const layout = Cp.Layout.new(HEAD_TAIL, 8, 2);
        const t = Cp.Tensor.new(Cp.DType.INT64, [2, 8]);
        assertCase('gjs cpmesh.js', 'Cp.Layout.shard along dimension 1.5',
            domain, Cp.TensorError.SHAPE, 'Cp.Layout.shard: seq_dim is 1.5', () => layout.shard(t, 1.5, 0));
        assertCase('gjs cpmesh.js', 'Cp.Layout.get_local_len of rank 0.5',
            domain, Cp.TensorError.OUT_OF_RANGE, 'rank is 0.5', () => layout.get_local_len(0.5));
        assertEqual(layout.shard(t, -1, 1).get_shape(), [2, 4], 'a negative dimension counts from the last');
    }],
]);
