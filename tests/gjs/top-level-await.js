// The pattern doc/bindings.md puts first: await at the top level of the
// module, with no GLib.MainLoop; gjs's own loop runs until it settles.
// test-mesh.js checks that it prints its result and nothing on stderr,
// well past cpmesh.js's grace period.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';

const CpMesh = await import('../../bindings/gjs/cpmesh.js');
const {Cp} = CpMesh;

const meshes = Cp.Mesh.new_local_group(['cp'], [2]);
const results = await Promise.all(meshes.map(m => m.barrier_async(null)));
// Outlive the grace period, so that a false alarm would have printed.
await new Promise(resolve => GLib.timeout_add(GLib.PRIORITY_DEFAULT, CpMesh.DISPATCH_GRACE_MS + 500, () => {
    resolve();
    return GLib.SOURCE_REMOVE;
}));
print(`both ranks: ${results.join(',')}`);
