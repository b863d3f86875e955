// test-batch.js: Cp.Batch, Cp.Context and Cp.Attention from gjs.  gjs runs
// JavaScript on one thread; the promisified _async calls let one main loop
// drive every in-process rank, and each rank's values are checked: the
// head-tail pieces exactly, attention against one rank holding the whole
// sequence.  Also the mapping calls, run() with a JavaScript callback,
// options and errors.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import * as CpMesh from '../../bindings/gjs/cpmesh.js';
import {assertCase, assertEqual, assertTrue as assertHolds, run} from './harness.js';

const {Cp} = CpMesh;

function assert(condition, message) {
    assertHolds(condition, message);
}

function row(values) {
    const tensor = Cp.Tensor.new(Cp.DType.INT64, [1, values.length]);
    values.forEach((v, i) => tensor.set_value(i, v));
    return tensor;
}

function testPrepareWithoutMesh() {
    const batch = new Cp.Batch();
    batch.set('input_ids', row([11, 12, 13, 14, 15, 16]));
    batch.set('labels', row([1, 2, 3, 4, 5, 6]));
    assert(batch.get_keys().join(',') === 'input_ids,labels', 'keys in order');
    assert(batch.contains('labels'), 'contains');
    const ctx = batch.prepare(null, null);
    let entered = false;
    ctx.run(c => {
        entered = c.is_entered;
    });
    assert(entered, 'run() enters');
    assert(!ctx.is_entered, 'run() exits');
    assert(batch.get('input_ids').get_dim(1) === 6, 'untouched without a mesh');
}

function testSingleRankMesh() {
    const [mesh] = Cp.Mesh.new_local_group(['cp'], [1]);
    const batch = new Cp.Batch();
    batch.set('input_ids', row([1, 2, 3]));
    batch.set('labels', row([1, 2, 3]));
    const options = new Cp.BatchOptions({rotate_method: Cp.RotateMethod.ALLTOALL});
    const ctx = batch.prepare(mesh, options);
    assert(ctx.get_rotate_method() === Cp.RotateMethod.ALLTOALL, 'rotate method');
    assert(ctx.cp_size === 1, 'cp size 1');
}

// Rejects unless promise rejects with a GLib.Error of (domain, code)
// whose message contains fragment; records the case (what was tried).
async function rejection(promise, what, domain, code, fragment) {
    let error = null;
    try {
        await promise;
    } catch (e) {
        error = e;
    }
    return assertCase('CpBatch', what, domain, code, fragment, () => {
        if (error)
            throw error;
    });
}

function localGroup(size) {
    const meshes = Cp.Mesh.new_local_group(['cp'], [size]);
    meshes.forEach(m => m.set_timeout_ms(20000));
    return meshes;
}

// An unknown rotate method fails on each rank by itself; a batch without
// input_ids on one rank fails every rank, through their agreement.
async function testErrors() {
    const meshes = localGroup(2);
    const batches = meshes.map(() => {
        const batch = new Cp.Batch();
        batch.set('input_ids', row([1, 2, 3]));
        batch.set('labels', row([1, 2, 3]));
        return batch;
    });
    const options = meshes.map(() => new Cp.BatchOptions());
    options.forEach(o => o.set_rotate_method_name('addtoall'));
    await Promise.all(meshes.map((mesh, r) => rejection(batches[r].prepare_async(mesh, options[r], null),
        `prepare_async with an unknown rotate method, rank ${r} of 2`,
        Cp.batch_error_quark(), Cp.BatchError.INVALID_OPTION, 'addtoall')));
    batches.forEach(b => assert(b.get('input_ids').get_dim(1) === 3, 'batch untouched after an error'));

    batches[1].remove('input_ids');
    await Promise.all(meshes.map((mesh, r) => rejection(batches[r].prepare_async(mesh, null, null),
        `prepare_async when rank 1's batch lacks input_ids, rank ${r} of 2`,
        Cp.batch_error_quark(), Cp.BatchError.MISSING_KEY, 'communicator rank 1')));
    assert(batches[0].get('input_ids').get_dim(1) === 3, 'rank 0 untouched after rank 1 failed');
}

// ---- four ranks from one main loop ----

const RANKS = 4;
const REAL = 13;     // tokens; prepare pads them to 16, a multiple of 2·RANKS
const PADDED = 16;
const HEADS = 2, KV_HEADS = 1, DIM = 8;

function smooth(heads, length, seed) {
    const values = new Float32Array(heads * length * DIM);
    for (let h = 0; h < heads; h++) {
        for (let i = 0; i < length * DIM; i++)
            values[h * PADDED * DIM + i] = Math.sin((h * length * DIM + i) * 0.37 + seed) * 0.5;
    }
    return values;
}

// q, k, v and dout over PADDED positions, zero past REAL.
function attentionInputs() {
    return [[HEADS, 1], [KV_HEADS, 2], [KV_HEADS, 3], [HEADS, 4]].map(([heads, seed]) => {
        const padded = new Float32Array(heads * PADDED * DIM);
        const real = smooth(heads, REAL, seed);
        padded.set(real.subarray(0, padded.length));
        return {heads, values: padded};
    });
}

function tensorOf({heads, values}, length = PADDED) {
    const cut = new Float32Array(heads * length * DIM);
    for (let h = 0; h < heads; h++)
        cut.set(values.subarray(h * PADDED * DIM, h * PADDED * DIM + length * DIM), h * length * DIM);
    return CpMesh.tensorFromTypedArray(cut, [1, heads, length, DIM]);
}

function attentionOn(mesh) {
    const options = Cp.AttentionOptions.new();
    options.set_causal(true);
    options.set_heads(HEADS, KV_HEADS);
    options.set_seq_lens([REAL]);
    // No OpenMP team: in a gjs process under ASan, LeakSanitizer (GCC 12)
    // crashes at exit reading the dynamic TLS oneDNN leaves on OpenMP's
    // idle threads, with or without the async calls.
    options.set_n_threads(1);
    return Cp.Attention.new(mesh, options);
}

// Forward and backward over the whole sequence on one rank, with the
// blocking calls.
function referencePass(inputs) {
    const [one] = Cp.Mesh.new_local_group(['cp'], [1]);
    const attention = attentionOn(one);
    const [q, k, v, dout] = inputs.map(i => tensorOf(i));
    // gjs 1.74 hands back the skipped boolean of a blocking call first;
    // Gio._promisify drops it.
    const [, out, lse] = attention.forward(q, k, v);
    const [, dq, dk, dv] = attention.backward(dout, q, k, v, out, lse);
    return [out, lse, dq, dk, dv].map(t => CpMesh.toTypedArray(t));
}

function assertClose(actual, expected, what) {
    assertEqual(actual.length, expected.length, `${what}: length`);
    let largest = 1e-3, worst = 0;
    for (let i = 0; i < expected.length; i++) {
        if (!Number.isFinite(expected[i])) {
            assertEqual(actual[i], expected[i], `${what}[${i}]`);
            continue;
        }
        largest = Math.max(largest, Math.abs(expected[i]));
        worst = Math.max(worst, Math.abs(actual[i] - expected[i]));
    }
    assertHolds(worst <= 1e-5 * largest, `${what}: max error ${worst} against max |ref| ${largest}`);
}

// One rank's step, every call awaited: prepare, enter, forward, backward,
// exit, unshard.
async function rankStep(mesh, inputs) {
    const batch = new Cp.Batch();
    const ids = Array.from({length: REAL}, (_, i) => 1000 + i);
    batch.set('input_ids', row(ids));
    batch.set('labels', row(ids));
    const names = ['q', 'k', 'v', 'dout'];
    const options = new Cp.BatchOptions();
    names.forEach((name, i) => {
        batch.set(name, tensorOf(inputs[i], REAL));
        options.add_extra_buffer(name, 2);
    });
    const ctx = await batch.prepare_async(mesh, options, null);
    await ctx.enter_async(null);
    const localIds = Array.from(CpMesh.toTypedArray(batch.get('input_ids')), Number);
    const attention = attentionOn(mesh);
    const [q, k, v, dout] = names.map(name => batch.get(name));
    const [out, lse] = await attention.forward_async(q, k, v, null);
    const [dq, dk, dv] = await attention.backward_async(dout, q, k, v, out, lse, null);
    await ctx.exit_async(null);
    const full = [];
    for (const tensor of [out, lse, dq, dk, dv])
        // eslint-disable-next-line no-await-in-loop
        full.push(CpMesh.toTypedArray(await ctx.unshard_async(tensor, 2, null)));
    return {localIds, full, entered: ctx.is_entered};
}

async function testFourRanks() {
    const inputs = attentionInputs();
    const expected = referencePass(inputs);
    const meshes = localGroup(RANKS);
    const results = await Promise.all(meshes.map(mesh => rankStep(mesh, inputs)));
    const ids = Array.from({length: PADDED}, (_, i) => i < REAL ? 1000 + i : 0);
    results.forEach(({localIds, full, entered}, r) => {
        // Chunks r and 2·RANKS−1−r of 2·RANKS, two tokens each.
        const tail = 2 * (2 * RANKS - 1 - r);
        assertEqual(localIds, [...ids.slice(2 * r, 2 * r + 2), ...ids.slice(tail, tail + 2)],
            `rank ${r} input_ids`);
        assert(!entered, `rank ${r} exited`);
        ['out', 'lse', 'dq', 'dk', 'dv'].forEach((name, i) =>
            assertClose(full[i], expected[i], `rank ${r} ${name}`));
    });
}

function testToThd() {
    const batch = new Cp.Batch();
    batch.set('input_ids', row([1, 2, 3, 99, 4, 5]));
    batch.set('labels', row([1, 2, 3, 4, 5, 6]));
    batch.set('position_ids', row([0, 1, 2, 0, 0, 1]));
    batch.set('seq_lens', row([3, 2]));
    batch.set('seq_lens_padded', row([4, 2]));
    const options = new Cp.ThdOptions({padding_mask_rule: Cp.PaddingMaskRule.LAYOUT});
    const thd = batch.to_thd(null, options);
    assert(thd.qkv_format === 'thd', 'THD batch');
    const cu = thd.get('cu_seqlens_padded');
    assert([0, 1, 2].map(i => cu.get_value(i)).join(',') === '0,4,6', 'padded bounds');
    assert(thd.get('padding_mask').get_value(3) === 1, 'padding from the layout');
}

run([
    ['prepare without a mesh', testPrepareWithoutMesh],
    ['one-rank mesh keeps the rotate method', testSingleRankMesh],
    ['errors reach every rank', testErrors],
    ['4 ranks from one main loop: prepare, enter, attention, exit, unshard', testFourRanks],
    ['to_thd with the layout padding mask', testToThd],
]);
