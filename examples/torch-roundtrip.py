# A PyTorch tensor into libcpmesh and back, without a copy either way:
# shard a bfloat16 [batch 2, sequence 8] tensor for rank 0 of 2 and hand
# the piece to PyTorch.  Run with Debian's /usr/bin/python3 and
# python3-torch.
#
# SPDX-License-Identifier: LGPL-2.1-or-later
import sys

import gi

try:
    import torch
except ImportError:
    sys.exit(77)  # skipped: PyTorch is not installed

gi.require_version("Cp", "1")
from gi.repository import Cp  # noqa: E402

x = torch.arange(16, dtype=torch.bfloat16).reshape(2, 8)
t = Cp.Tensor.from_dlpack(x)                      # the same memory as x
layout = Cp.Layout.new(Cp.LoadBalance.HEAD_TAIL, 8, 2)
local = layout.shard(t, 1, 0)                     # [2, 4], in libcpmesh's memory
piece = torch.from_dlpack(local)                  # the same memory as local
t.set_value(0, 42.0)                              # seen by x
print("x shared:", t.get_data_address() == x.data_ptr() and x[0, 0].item() == 42.0)
print("piece shared:", piece.data_ptr() == local.get_data_address())
print("rank 0 holds", piece[1].tolist(), piece.dtype)
