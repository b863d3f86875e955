// Cp.Mesh from gjs. JavaScript runs on one thread, so blocking collectives
// across ranks cannot be driven from here; the promisified barrier_async
// can, each rank's barrier running in a worker thread while the GLib main
// loop waits for the results.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import * as CpMesh from '../../bindings/gjs/cpmesh.js';
import {assertEqual, assertTrue, run} from './harness.js';

const {Cp} = CpMesh;

function localGroup(size) {
    const meshes = Cp.Mesh.new_local_group(['cp'], [size]);
    meshes.forEach(m => m.set_timeout_ms(20000));
    return meshes;
}

run([
    ['a local group has one mesh per rank', () => {
        const meshes = Cp.Mesh.new_local_group(['dp', 'cp'], [2, 2]);
        assertEqual(meshes.map(m => m.get_rank()), [0, 1, 2, 3], 'ranks');
        const m = meshes[3];
        assertEqual(m.world_size, 4, 'world-size property');
        assertEqual(m.get_backend(), 'local', 'backend');
        assertEqual(m.get_dim_names(), ['dp', 'cp'], 'dimension names');
        assertEqual(m.get_dim_sizes(), [2, 2], 'dimension sizes');
        const cp = m.get_submesh('cp');
        assertEqual([cp.get_rank(), cp.get_world_size()], [1, 2], 'cp submesh');
    }],

    ['barrier_async resolves on every rank', async () => {
        const meshes = localGroup(3);
        const results = await Promise.all(meshes.map(m => m.barrier_async(null)));
        assertEqual(results, [true, true, true], 'barrier results');
    }],

    ['barrier_async rejects with TIMED_OUT when a rank never arrives', async () => {
        const meshes = localGroup(2);
        meshes[0].set_timeout_ms(200);
        let error = null;
        try {
            await meshes[0].barrier_async(null);
        } catch (e) {
            error = e;
        }
        assertTrue(error !== null, 'the barrier failed');
        assertTrue(error.matches(Cp.mesh_error_quark(), Cp.MeshError.TIMED_OUT), `TIMED_OUT: ${error}`);
        assertTrue(error.message.includes('1 (mesh rank 1)'), `names the missing rank: ${error.message}`);
    }],

    ['a single rank runs collectives synchronously', () => {
        const [m] = localGroup(1);
        const t = CpMesh.tensorFromTypedArray(new Float32Array([1, 2, 3, 4]));
        assertEqual(CpMesh.toTypedArray(m.all_gather(t, 0)), [1, 2, 3, 4], 'all_gather');
        assertTrue(m.all_reduce(t, Cp.ReduceOp.SUM), 'all_reduce');
        assertEqual(CpMesh.toTypedArray(t), [1, 2, 3, 4], 'after all_reduce');
        assertTrue(m.unshard(t, 0).equal(t), 'unshard of one rank');
    }],
]);
