#!/usr/bin/env python3
# Runs the train-step example of every language given on the command line
# (each argument one command, its words separated by spaces) and fails
# unless they all succeed and print the same line.
#
# SPDX-License-Identifier: LGPL-2.1-or-later
import re
import subprocess
import sys

lines = {}
for command in sys.argv[1:]:
    result = subprocess.run(command.split(" "), capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        sys.exit("%s failed (%d):\n%s%s" % (command, result.returncode, result.stdout, result.stderr))
    lines[command] = result.stdout
    print("%s: %s" % (command, result.stdout.strip()))
first = next(iter(lines.values()))
if not re.fullmatch(r"train-step: 4 ranks, 250 positions padded to 256, checksum -?\d+\n", first):
    sys.exit("unexpected output: %r" % first)
different = [command for command, line in lines.items() if line != first]
sys.exit("checksums differ: %s" % ", ".join(different) if different else 0)
