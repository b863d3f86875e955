// test-batch.js: Cp.Batch and Cp.Context from gjs.  gjs runs JavaScript on
// one thread, so blocking collectives across in-process ranks cannot be
// driven from here; this checks the bindings on one rank: the mapping
// calls, run() with a JavaScript callback, options and errors.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import Cp from 'gi://Cp?version=1';

import {assertThrowsGError, assertTrue as assertHolds, run} from './harness.js';

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

function testErrors() {
    const [mesh] = Cp.Mesh.new_local_group(['cp'], [2]);
    const batch = new Cp.Batch();
    batch.set('input_ids', row([1, 2, 3]));
    batch.set('labels', row([1, 2, 3]));
    const options = new Cp.BatchOptions();
    options.set_rotate_method_name('addtoall');
    assertThrowsGError(Cp.batch_error_quark(), Cp.BatchError.INVALID_OPTION, 'addtoall',
        () => batch.prepare(mesh, options));
    assert(batch.get('input_ids').get_dim(1) === 3, 'batch untouched after an error');
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
    ['an unknown rotate method is rejected', testErrors],
    ['to_thd with the layout padding mask', testToThd],
]);
