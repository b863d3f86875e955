# Builds Vala programs against the build tree's VAPI with plain valac, as
# a user would, and fails when valac or the C compiler it runs prints
# anything: the VAPI once made every program warn about
# `const char * const *` (Meson hides that, compiling Vala's C with -w).
#
# Usage: test_quiet_build.py VALAC VAPIDIR PKG-CONFIG-DIR SOURCE-ROOT
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import re
import subprocess
import sys
import tempfile
import unittest

VALAC, VAPIDIR, PKG_CONFIG_DIR, SOURCE_ROOT = sys.argv[1:5]
del sys.argv[1:5]


# What a sanitizer build preloads into the programs it tests: valac and
# the C compiler it runs are not under test, and leak under it.
INSTRUMENTATION = ('LD_PRELOAD', 'ASAN_OPTIONS', 'LSAN_OPTIONS', 'UBSAN_OPTIONS',
                   'TSAN_OPTIONS', 'PYTHONMALLOC')


def compiler_messages(output):
    """The compiler's output less the linker's notes on the sanitizer
    runtime a sanitizer build's library brings in (libasan's own use of
    tmpnam and the like): those are no warning about the program."""
    return ''.join(line for line in output.splitlines(keepends=True)
                   if not re.match(r'.*/ld: .*lib[a-z]san\.so[.0-9]*: warning: ', line))


class QuietBuild(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.env = dict(os.environ, PKG_CONFIG_PATH=PKG_CONFIG_DIR)
        self.build_env = {k: v for k, v in self.env.items() if k not in INSTRUMENTATION}

    def build(self, relative_path, *flags):
        """Compiles one program with valac; returns its path."""
        source = os.path.join(SOURCE_ROOT, relative_path)
        program = os.path.join(self.tmp.name, os.path.splitext(os.path.basename(source))[0])
        result = subprocess.run(
            [VALAC, '--vapidir', VAPIDIR, '--pkg', 'libcpmesh-1', *flags, '-o', program, source],
            cwd=self.tmp.name, env=self.build_env, capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(compiler_messages(result.stdout + result.stderr), '',
                         f'valac {relative_path} printed')
        return program

    def test_every_const_array_call_compiles_quietly(self):
        program = self.build('tests/vala/const-arrays.vala')
        result = subprocess.run([program], env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[:9], ['mesh: dp,cp 2 1', 'options: dp,cp 2 3',
                                     'names: dp,cp 2, dp,cp 2, unset',
                                     'key: input_ids', 'key: labels', 'keys: 2 labels',
                                     'shape: 2 [2, 3]', 'attention: 8 12 4', 'ucx: refused'])
        self.assertRegex(lines[9], r'^connect: ')

    def test_examples_compile_quietly(self):
        self.build('examples/example.vala')
        self.build('examples/train-step.vala', '-X', '-lm')


if __name__ == '__main__':
    unittest.main()
