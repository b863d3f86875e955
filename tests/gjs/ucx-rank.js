// One rank of a two-process mesh started by `cpmesh launch -n 2`: joins
// with Cp.Mesh.connect_async and meets the other rank with barrier_async,
// all on the main loop, as a gjs program must.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';
import System from 'system';

import * as helpers from '../../bindings/gjs/cpmesh.js';

const SKIP = 77;
const {Cp} = helpers;

async function run() {
    const mesh = await Cp.Mesh.connect_async(null, null);
    const rank = mesh.get_rank();
    if (mesh.backend !== 'ucx' || mesh.get_world_size() !== 2)
        throw new Error(`unexpected mesh: ${mesh.backend}, ${mesh.get_world_size()} ranks`);
    await mesh.barrier_async(null);

    const tensor = helpers.tensorFromTypedArray(new Float32Array([rank + 1, 10 * (rank + 1)]));
    mesh.all_reduce(tensor, Cp.ReduceOp.SUM);
    const sums = Array.from(helpers.toTypedArray(tensor)).join(',');
    if (sums !== '3,30')
        throw new Error(`all_reduce gave ${sums}`);
    await mesh.barrier_async(null);
    print(`rank ${rank}: ok`);
}

if (!Cp.HAS_UCX)
    System.exit(SKIP);

const loop = new GLib.MainLoop(null, false);
let status = 1;
run().then(() => {
    status = 0;
}).catch(error => {
    logError(error);
}).finally(() => loop.quit());
loop.run();
System.exit(status);
