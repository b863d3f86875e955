# One context-parallel attention step on 4 in-process ranks (Python
# threads): the job of train-step.c, printing the same checksum.  Run with
# Debian's /usr/bin/python3.
#
# SPDX-License-Identifier: LGPL-2.1-or-later
import sys
import threading

import gi
import numpy as np

gi.require_version("Cp", "1")
from gi.repository import Cp  # noqa: E402

RANKS, SEQ, HEADS, KV_HEADS, HEAD_DIM = 4, 250, 4, 2, 16


def operand(heads, a, b, c, modulus):
    """Exact in float32, the same in every language."""
    h, s, d = np.meshgrid(np.arange(heads), np.arange(SEQ), np.arange(HEAD_DIM), indexing="ij")
    values = ((s * a + h * b + d * c) % modulus - modulus // 2) / 64.0
    return values.astype(np.float32).reshape(1, heads, SEQ, HEAD_DIM)


def load_batch():
    ids = (np.arange(SEQ, dtype=np.int64) * 7 + 3) % 1000
    batch = Cp.Batch()
    batch["input_ids"] = Cp.Tensor.from_numpy(ids.reshape(1, SEQ))
    batch["labels"] = Cp.Tensor.from_numpy(np.roll(ids, -1).reshape(1, SEQ))
    batch["q"] = Cp.Tensor.from_numpy(operand(HEADS, 31, 17, 7, 97))
    batch["k"] = Cp.Tensor.from_numpy(operand(KV_HEADS, 29, 13, 5, 89))
    batch["v"] = Cp.Tensor.from_numpy(operand(KV_HEADS, 23, 11, 3, 83))
    batch["dout"] = Cp.Tensor.from_numpy(operand(HEADS, 19, 5, 13, 79))
    return batch


def checksum(tensor):
    """Each value in units of 2**-20, rounded down, added as integers."""
    return int(np.floor(tensor.numpy().astype(np.float64) * 1048576.0).astype(np.int64).sum())


def train_step(mesh, results):
    batch = load_batch()
    ctx = batch.prepare(mesh, Cp.BatchOptions(extra_buffers={"q": 2, "k": 2, "v": 2, "dout": 2}))
    options = Cp.AttentionOptions.new()
    options.set_heads(HEADS, KV_HEADS)
    options.set_seq_lens([SEQ])
    options.set_n_threads(1)
    attention = Cp.Attention.new(mesh, options)
    with ctx:
        q, k, v = batch["q"], batch["k"], batch["v"]
        out, lse = attention.forward(q, k, v)
        dq, dk, dv = attention.backward(batch["dout"], q, k, v, out, lse)
    results[mesh.get_rank()] = sum(checksum(mesh.unshard(t, 2)) for t in (out, dq, dk, dv))


results = [None] * RANKS
errors = []


def rank_main(mesh):
    try:
        train_step(mesh, results)
    except Exception as error:  # every rank fails alike; report each
        errors.append("rank %d: %s" % (mesh.get_rank(), error))


threads = [threading.Thread(target=rank_main, args=(mesh,))
           for mesh in Cp.Mesh.new_local_group({"cp": RANKS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
if errors:
    sys.exit("\n".join(errors))
print("train-step: %d ranks, %d positions padded to 256, checksum %d" % (RANKS, SEQ, results[0]))
