# One rank of a two-process mesh started by `cpmesh launch -n 2` (or as
# torchrun starts workers, by test_torchrun.py): joins with
# Cp.Mesh.new_from_env and checks collectives against numpy.
#
# With CP_TEST_TORCH_STORE set, the rank also uses a torch.distributed
# store on MASTER_PORT, as a program calling init_process_group does:
# "agent" joins the one torchrun's agent holds, "own" makes rank 0 hold
# it.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import sys

import gi

gi.require_version("Cp", "1")
from gi.repository import Cp, GLib  # noqa: E402
import numpy as np  # noqa: E402

SKIP = 77


def piece(rank):
    return np.arange(6, dtype=np.float32).reshape(2, 3) * 0.25 + 10 * rank


def torch_store():
    mode = os.environ.get("CP_TEST_TORCH_STORE")
    if not mode:
        return None
    import datetime
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         int(os.environ["WORLD_SIZE"]), mode == "own" and rank == 0,
                         datetime.timedelta(seconds=60), wait_for_workers=False)


def use_store(store, rank, world):
    """Every rank writes its key and reads every other's."""
    store.set("rank %d" % rank, "joined")
    for other in range(world):
        assert store.get("rank %d" % other) == b"joined"
    print("store: ok")


def main():
    if not Cp.HAS_UCX:
        return SKIP
    store = torch_store()
    mesh = Cp.Mesh.new_from_env()
    rank, world = mesh.get_rank(), mesh.get_world_size()
    assert mesh.props.backend == "ucx"
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    assert mesh.props.local_rank == rank

    mine = Cp.Tensor.from_numpy(piece(rank))
    gathered = mesh.all_gather(mine, 0).numpy()
    np.testing.assert_array_equal(gathered, np.concatenate([piece(r) for r in range(world)]))

    mesh.all_reduce(mine, Cp.ReduceOp.SUM)
    np.testing.assert_array_equal(mine.numpy(), sum(piece(r) for r in range(world)))

    try:
        mesh.broadcast(mine, world + 3)
        raise AssertionError("a root outside the mesh was accepted")
    except GLib.Error as error:
        assert error.matches(Cp.TensorError.quark(), Cp.TensorError.OUT_OF_RANGE), error.message
    if store is not None:
        use_store(store, rank, world)
    mesh.barrier()
    print("rank %d of %d: ok" % (rank, world))
    return 0


if __name__ == "__main__":
    sys.exit(main())
