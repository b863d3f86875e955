# Helpers shared by the Python tests.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import numpy as np

from cptest import Cp


def T(values, dtype=np.int64):
    """A tensor over a C-contiguous numpy copy of values."""
    return Cp.Tensor.from_numpy(np.ascontiguousarray(np.array(values, dtype=dtype)))
