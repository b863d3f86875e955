// Shard a [batch 2, sequence 8] tensor over 2 in-process ranks and gather
// it back. gjs runs JavaScript on one thread, so the two ranks' _async
// calls run together from one loop: await them at the top level, with no
// GLib.MainLoop of your own, and gjs runs its loop until they settle.
import System from 'system';

import * as CpMesh from '../bindings/gjs/cpmesh.js';

const {Cp} = CpMesh;

const batch = CpMesh.tensorFromTypedArray(Float32Array.from({length: 16}, (_, i) => i), [2, 8]);
const layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2);
const meshes = Cp.Mesh.new_local_group(['cp'], [2]);
const pieces = meshes.map(mesh => layout.shard(batch, 1, mesh.get_rank()));   // [2, 4] each
const full = await Promise.all(meshes.map((mesh, rank) =>
    mesh.unshard_async(pieces[rank], 1, null)));                              // all-gather + restore

let failed = 0;
pieces.forEach((piece, rank) => {
    const row = Array.from(CpMesh.toTypedArray(piece).subarray(0, 4)).join(' ');
    const restored = full[rank].equal(batch);
    failed += restored ? 0 : 1;
    print(`rank ${rank} holds ${row}, restored: ${restored ? 'yes' : 'no'}`);
});
System.exit(failed);
