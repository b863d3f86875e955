// The pitfall doc/bindings.md warns of, on purpose: a GLib.MainLoop run
// after a top-level await runs inside gjs's promise job queue. Both ranks'
// barriers complete at once, yet nothing awaiting them runs until the loop
// returns; cpmesh.js says why on stderr. The loop ends itself after
// cpmesh.js's grace period and a margin, so that test-mesh.js can read
// what this program printed and in which order.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';
import System from 'system';

const CpMesh = await import('../../bindings/gjs/cpmesh.js');
const {Cp} = CpMesh;

const meshes = Cp.Mesh.new_local_group(['cp'], [2]);
meshes.forEach(m => m.set_timeout_ms(20000));
const loop = new GLib.MainLoop(null, false);
const started = GLib.get_monotonic_time();
const elapsedMs = () => Math.round((GLib.get_monotonic_time() - started) / 1000);

const continued = Promise.all(meshes.map(m => m.barrier_async(null))).then(results => {
    print(`continued at ${elapsedMs()} ms with ${results.join(',')}`);
});
// At the watchdog's own low priority: on a machine too busy to run either
// timer in time, both become due together and both run.
GLib.timeout_add(GLib.PRIORITY_LOW, CpMesh.DISPATCH_GRACE_MS + 2000, () => {
    print(`loop quit at ${elapsedMs()} ms`);
    loop.quit();
    return GLib.SOURCE_REMOVE;
});
loop.run();
// Only now, with this job's loop gone, does the queue run again.
await continued;
System.exit(0);
