# Ranks started the way torchrun starts its workers, with PyTorch's own
# store already listening on MASTER_PORT: torchrun's agent holds it
# (TORCHELASTIC_USE_AGENT_STORE=True), and so does rank 0 of a program
# that calls torch.distributed.init_process_group.  The mesh must form
# with no more configuration than torchrun gives.
#
# Skips (exit 77) where PyTorch is not importable, and under the address
# sanitizer's runtime: PyTorch's import there takes minutes and leaves
# allocations LeakSanitizer reports, while the library's side of this case
# runs under the sanitizers in test-ucx (/Cp/Ucx/settings/port).
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import datetime
import os
import sys
import unittest

SKIP = 77

if 'libasan' in os.environ.get('LD_PRELOAD', ''):
    print('# skipped: PyTorch is not run under the address sanitizer')
    sys.exit(SKIP)
try:
    import torch.distributed as dist
except Exception as error:  # not installed, or broken against this numpy
    print('# skipped: PyTorch is not importable: %s' % error)
    sys.exit(SKIP)

from cptest import Cp  # noqa: E402
from ranks import free_port_pair, rank_environment, run_processes  # noqa: E402

RANK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ucx_rank.py')
WORLD = 2


def run_torchrun_ranks(port, store):
    """WORLD ranks with what torchrun gives its workers, and nothing of
    libcpmesh's own."""
    torchrun = {
        'ROLE_NAME': 'default', 'ROLE_WORLD_SIZE': str(WORLD),
        'TORCHELASTIC_USE_AGENT_STORE': 'True', 'TORCHELASTIC_RESTART_COUNT': '0',
        'TORCHELASTIC_MAX_RESTARTS': '0', 'TORCHELASTIC_RUN_ID': 'cpmesh-test',
        'CP_TEST_TORCH_STORE': store,
    }
    # Over UCX by name: on one host the default chain would pick shm.
    environments = [rank_environment(r, WORLD, port, ROLE_RANK=str(r), CPMESH_TRANSPORT='ucx', **torchrun)
                    for r in range(WORLD)]
    return run_processes([sys.executable, RANK_PROGRAM], environments)


@unittest.skipUnless(Cp.HAS_UCX, 'libcpmesh was built without UCX')
class TestTorchrun(unittest.TestCase):

    def check(self, results):
        for rank, (out, err, status) in enumerate(results):
            self.assertEqual(status, 0, 'rank %d: %s%s' % (rank, out, err))
            self.assertIn('rank %d of %d: ok' % (rank, WORLD), out)
            self.assertIn('store: ok', out)

    def test_agent_store_on_master_port(self):
        port = free_port_pair()
        agent = dist.TCPStore('127.0.0.1', port, WORLD + 1, True, datetime.timedelta(seconds=60),
                              wait_for_workers=False)
        self.check(run_torchrun_ranks(port, 'agent'))
        self.assertEqual(agent.get('rank 1'), b'joined')

    def test_program_with_its_own_store(self):
        port = free_port_pair()
        self.check(run_torchrun_ranks(port, 'own'))


if __name__ == '__main__':
    unittest.main()
