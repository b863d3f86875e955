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
import socket
import subprocess
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

RANK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ucx_rank.py')
WORLD = 2


def bindable(port):
    with socket.socket() as probe:
        try:
            probe.bind(('127.0.0.1', port))
            return True
        except OSError:
            return False


def free_port_pair():
    """A free MASTER_PORT whose successor is free too."""
    while True:
        with socket.socket() as probe:
            probe.bind(('127.0.0.1', 0))
            port = probe.getsockname()[1]
        if port < 65535 and bindable(port + 1):
            return port


def torchrun_environment(rank, port, store):
    """What torchrun gives worker rank of a WORLD-rank job on one host,
    and nothing of libcpmesh's own."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(('CPMESH_', 'UCX_', 'OMPI_', 'SLURM_'))}
    env.update({
        'RANK': str(rank), 'LOCAL_RANK': str(rank), 'GROUP_RANK': '0',
        'ROLE_RANK': str(rank), 'ROLE_NAME': 'default',
        'WORLD_SIZE': str(WORLD), 'LOCAL_WORLD_SIZE': str(WORLD), 'ROLE_WORLD_SIZE': str(WORLD),
        'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(port),
        'TORCHELASTIC_USE_AGENT_STORE': 'True', 'TORCHELASTIC_RESTART_COUNT': '0',
        'TORCHELASTIC_MAX_RESTARTS': '0', 'TORCHELASTIC_RUN_ID': 'cpmesh-test',
        'CP_TEST_TORCH_STORE': store,
    })
    return env


def run_ranks(port, store):
    ranks = [subprocess.Popen([sys.executable, RANK_PROGRAM], env=torchrun_environment(r, port, store),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    return [rank.communicate(timeout=90) + (rank.returncode,) for rank in ranks]


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
        self.check(run_ranks(port, 'agent'))
        self.assertEqual(agent.get('rank 1'), b'joined')

    def test_program_with_its_own_store(self):
        port = free_port_pair()
        self.check(run_ranks(port, 'own'))


if __name__ == '__main__':
    unittest.main()
