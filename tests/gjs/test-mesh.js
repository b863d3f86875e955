// Cp.Mesh from gjs. JavaScript runs on one thread, so blocking collectives
// across ranks cannot be driven from here; the promisified barrier_async
// can, each rank's barrier running in a worker thread while the GLib main
// loop waits for the results.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import Gio from 'gi://Gio';
import GLib from 'gi://GLib';

import * as CpMesh from '../../bindings/gjs/cpmesh.js';
import {assertEqual, assertTrue, recordError, recordOutcome, run} from './harness.js';

const {Cp} = CpMesh;

function localGroup(size) {
    const meshes = Cp.Mesh.new_local_group(['cp'], [size]);
    meshes.forEach(m => m.set_timeout_ms(20000));
    return meshes;
}

Gio._promisify(Gio.Subprocess.prototype, 'communicate_utf8_async');

// Runs a gjs program of this directory in a process of its own, with this
// one's environment; resolves to [exit status, stdout, stderr].
async function runProgram(name) {
    const here = GLib.path_get_dirname(GLib.filename_from_uri(import.meta.url)[0]);
    const gjs = GLib.file_read_link('/proc/self/exe');
    const process = Gio.Subprocess.new([gjs, '-m', GLib.build_filenamev([here, name])],
        Gio.SubprocessFlags.STDOUT_PIPE | Gio.SubprocessFlags.STDERR_PIPE);
    const [stdout, stderr] = await process.communicate_utf8_async(null, null);
    return [process.get_exit_status(), stdout, stderr];
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

    ['an _async call with a fractional dimension rejects before it starts', async () => {
        const meshes = localGroup(2);
        const t = CpMesh.tensorFromTypedArray(new Float32Array(4), [2, 2]);
        let error = null;
        try {
            await meshes[0].all_gather_async(t, 0.5, null);
        } catch (e) {
            error = e;
        }
        assertTrue(error?.matches(Cp.tensor_error_quark(), Cp.TensorError.SHAPE),
            `Cp.TensorError.SHAPE: ${error}`);
        assertTrue(error.message.includes('Cp.Mesh.all_gather_async: dim is 0.5, not a whole number'),
            `names the call and the value: ${error.message}`);
        recordError('gjs cpmesh.js', 'Cp.Mesh.all_gather_async along dimension 0.5', error);
        // Nothing started: both ranks still meet at a barrier.
        const results = await Promise.all(meshes.map(m => m.barrier_async(null)));
        assertEqual(results, [true, true], 'barrier after the refusal');
    }],

    ['a main loop nested in gjs\'s job queue is named on stderr while the program waits', async () => {
        const [status, stdout, stderr] = await runProgram('nested-loop.js');
        assertEqual(status, 0, `exit status (stderr: ${stderr})`);
        // The barriers completed at once, yet the code awaiting them ran
        // only when the loop returned: the wait is gjs's, not the mesh's.
        const quit = Number(/loop quit at (\d+) ms/.exec(stdout)?.[1]);
        const continued = Number(/continued at (\d+) ms with true,true/.exec(stdout)?.[1]);
        assertTrue(quit >= CpMesh.DISPATCH_GRACE_MS && continued >= quit,
            `the continuation ran after the loop (${stdout})`);
        const message = stderr.split('\n').find(line => line.startsWith('cpmesh.js:')) ?? '';
        for (const fragment of ['Cp.Mesh.barrier_async() finished', 'has not run',
            'GLib.MainLoop run after an await', 'Await at the top level'])
            assertTrue(message.includes(fragment), `stderr names the cause: "${fragment}" in ${stderr}`);
        recordOutcome('gjs cpmesh.js', 'a GLib.MainLoop run after a top-level await, so no continuation runs',
            'message on stderr', message);
    }],

    ['the patterns that work raise no alarm', async () => {
        const meshes = localGroup(2);
        for (let i = 0; i < 3; i++) {
            // eslint-disable-next-line no-await-in-loop
            await Promise.all(meshes.map(m => m.barrier_async(null)));
        }
        const [status, stdout, stderr] = await runProgram('top-level-await.js');
        assertEqual([status, stdout.trim(), stderr], [0, 'both ranks: true,true', ''], 'top-level await');
    }],
]);
