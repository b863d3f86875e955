# Shard a [batch 2, sequence 8] array over 2 in-process ranks (Python
# threads), gather it back.  Run with Debian's /usr/bin/python3.
import sys
import threading

import gi
import numpy as np

gi.require_version("Cp", "1")
from gi.repository import Cp  # noqa: E402

batch = np.arange(16, dtype=np.float32).reshape(2, 8)
layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2)
lines = [None, None]


def rank_main(mesh):
    rank = mesh.get_rank()
    local = layout.shard(Cp.Tensor.from_numpy(batch), 1, rank)  # no copy in, [2, 4] out
    full = mesh.unshard(local, 1).numpy()                       # all-gather + restore
    lines[rank] = "rank %d holds %s, restored: %s" % (
        rank, local.numpy()[0].tolist(), "yes" if np.array_equal(full, batch) else "no")


threads = [threading.Thread(target=rank_main, args=(mesh,))
           for mesh in Cp.Mesh.new_local_group({"cp": 2})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("\n".join(lines))
sys.exit(0 if all(line.endswith("restored: yes") for line in lines) else 1)
