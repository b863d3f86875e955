// Shard a [batch 2, sequence 8] tensor for 2 ranks and put it back together
// with the layout alone: gjs runs JavaScript on one thread, so it does not
// drive several in-process ranks through blocking collectives.
import System from 'system';

import * as CpMesh from '../bindings/gjs/cpmesh.js';

const {Cp} = CpMesh;

const batch = CpMesh.tensorFromTypedArray(Float32Array.from({length: 16}, (_, i) => i), [2, 8]);
const layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2);
const pieces = [0, 1].map(rank => layout.shard(batch, 1, rank));  // [2, 4] each

pieces.forEach((piece, rank) => {
    const row = Array.from(CpMesh.toTypedArray(piece).subarray(0, 4));
    print(`rank ${rank} holds ${row.join(' ')}`);
});
const full = layout.unshard_pieces(pieces, 1);
print(`restored: ${full.equal(batch) ? 'yes' : 'no'}`);
System.exit(full.equal(batch) ? 0 : 1);
