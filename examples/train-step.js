// One context-parallel attention step on 4 in-process ranks, all driven
// from one loop with the _async calls: the job of train-step.c,
// printing the same checksum.  Run with `gjs -m train-step.js`.
//
// SPDX-License-Identifier: LGPL-2.1-or-later
import System from 'system';

import * as CpMesh from '../bindings/gjs/cpmesh.js';

const {Cp} = CpMesh;
const [RANKS, SEQ, HEADS, KV_HEADS, HEAD_DIM] = [4, 250, 4, 2, 16];

// Exact in float32, the same in every language.
function operand(heads, a, b, c, modulus) {
    const values = new Float32Array(heads * SEQ * HEAD_DIM);
    for (let h = 0; h < heads; h++) {
        for (let s = 0; s < SEQ; s++) {
            for (let d = 0; d < HEAD_DIM; d++)
                values[(h * SEQ + s) * HEAD_DIM + d] = ((s * a + h * b + d * c) % modulus - Math.floor(modulus / 2)) / 64;
        }
    }
    return CpMesh.tensorFromTypedArray(values, [1, heads, SEQ, HEAD_DIM]);
}

function loadBatch() {
    const ids = BigInt64Array.from({length: SEQ}, (_, s) => BigInt((s * 7 + 3) % 1000));
    const labels = BigInt64Array.from({length: SEQ}, (_, s) => ids[(s + 1) % SEQ]);
    const batch = new Cp.Batch();
    batch.set('input_ids', CpMesh.tensorFromTypedArray(ids, [1, SEQ]));
    batch.set('labels', CpMesh.tensorFromTypedArray(labels, [1, SEQ]));
    batch.set('q', operand(HEADS, 31, 17, 7, 97));
    batch.set('k', operand(KV_HEADS, 29, 13, 5, 89));
    batch.set('v', operand(KV_HEADS, 23, 11, 3, 83));
    batch.set('dout', operand(HEADS, 19, 5, 13, 79));
    return batch;
}

// Each value in units of 2^-20, rounded down, added as integers (exact in
// a double up to 2^53).
function checksum(tensor) {
    return CpMesh.toTypedArray(tensor).reduce((sum, v) => sum + Math.floor(v * 1048576), 0);
}

async function trainStep(mesh) {
    const batch = loadBatch();
    const batchOptions = new Cp.BatchOptions();
    for (const key of ['q', 'k', 'v', 'dout'])
        batchOptions.add_extra_buffer(key, 2);
    const ctx = await batch.prepare_async(mesh, batchOptions, null);
    const options = new Cp.AttentionOptions();
    options.set_heads(HEADS, KV_HEADS);
    options.set_seq_lens([SEQ]);
    options.set_n_threads(1);
    const attention = Cp.Attention.new(mesh, options);
    const [q, k, v] = ['q', 'k', 'v'].map(key => batch.get(key));
    await ctx.enter_async(null);
    const [out, lse] = await attention.forward_async(q, k, v, null);
    const [dq, dk, dv] = await attention.backward_async(batch.get('dout'), q, k, v, out, lse, null);
    await ctx.exit_async(null);
    let sum = 0;
    for (const local of [out, dq, dk, dv])
        sum += checksum(await mesh.unshard_async(local, 2, null));
    return sum;
}

// Awaited at the top level with no GLib.MainLoop of our own: gjs runs its
// loop until the module settles (a loop run after a top-level await would
// never let the code awaiting the ranks continue; see doc/bindings.md).
try {
    const sums = await Promise.all(Cp.Mesh.new_local_group(['cp'], [RANKS]).map(trainStep));
    print(`train-step: ${RANKS} ranks, ${SEQ} positions padded to 256, checksum ${sums[0]}`);
} catch (e) {
    printerr(e.message);
    System.exit(1);
}
