#!/usr/bin/env python3
# Tests of the cpmesh program, run as a user would run it.
#
# Usage: test_cpmesh.py PATH-TO-CPMESH [unittest arguments, e.g. a class]
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'python'))
from layout_svg import assert_picture  # noqa: E402
from reliability import record_outcome  # noqa: E402

CPMESH = None

# What a launcher sets, and the benchmarks' test-only switch: every test
# runs cpmesh without them unless it sets them itself.
CLEARED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                     "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "CPMESH_BENCH_TEST")


def run(*args, timeout=60, env=None):
    environment = {k: v for k, v in os.environ.items() if k not in CLEARED_VARIABLES}
    environment.update(env or {})
    return subprocess.run([CPMESH, *args], capture_output=True, text=True, timeout=timeout,
                          env=environment)


def record_failure(test, what, result):
    """Records a run of cpmesh that failed as it should, with its first
    line of complaint, for doc/reliability.md."""
    message = result.stderr.strip().splitlines()[0] if result.stderr.strip() else ''
    record_outcome(test, 'cpmesh', what, 'exit status %d' % result.returncode, message)


def parse_chunks(text):
    """'doc 0: head 0-1, tail 6-7; doc 1: head 8, tail 11' ->
    [('head', 0, 0, 2), ('tail', 0, 6, 2), ('head', 1, 8, 1), ('tail', 1, 11, 1)]:
    (part, document, start, length); a contiguous rank's '4-7' is a
    'whole' chunk."""
    chunks = []
    for number, document in enumerate(text.split("; ")):
        match = re.fullmatch(r"(?:doc (\d+): )?(.*)", document)
        index = int(match.group(1)) if match.group(1) else number
        for piece in match.group(2).split(", "):
            part, _, span = piece.rpartition(" ")
            first, _, last = span.partition("-")
            chunks.append((part or "whole", index, int(first), int(last or first) - int(first) + 1))
    return chunks


def layout_rows(stdout):
    """rank -> (length, cost, positions, chunks) from the table cpmesh
    layout prints."""
    rows = {}
    for line in stdout.splitlines():
        match = re.match(r"\s*(\d+)\s+(\d+)\s+(\d+)\s+((?:doc|head|\d).*)$", line)
        if match:
            rank, length, cost, text = match.groups()
            chunks = parse_chunks(text)
            positions = {p for _, _, start, n in chunks for p in range(start, start + n)}
            rows[int(rank)] = (int(length), int(cost), positions, chunks)
    return rows


def has_ucx():
    return re.search(r"\n  ucx\s+yes", run("info").stdout) is not None


# A demo and a bench thd of a moment.
SMALL_DEMO = ["--seq", "16", "--heads", "1", "--head-dim", "4"]
SMALL_THD = ["--quick", "--seq", "1024", "--documents", "4"]

# Every command, and the groups of commands.
COMMANDS = (("info",), ("layout",), ("demo",), ("launch",), ("bench", "layout"), ("bench", "mesh"),
            ("bench", "batch"), ("bench", "thd"), ("bench", "attention"))
GROUPS = ((), ("bench",))

# The shared vocabulary: the option as --help shows it, and how its
# description starts, the same in every command that takes it.
VOCABULARY = {
    "cp": ("-C", "Ranks in the context-parallel group"),
    "seq": ("-S", "Sequence length"),
    "batch": ("-b", "Sequences (rows) in the batch"),
    "reps": ("-r", "Timed repetitions of each measurement"),
    "warmup": ("-w", "Untimed repetitions before the timed ones"),
    "quick": ("-q", "Small sizes, seconds rather than minutes"),
    "backend": (None, "Where the ranks run: local, threads of this process, or ucx, processes"),
    "check-targets": (None, "Exit with status 3 when a target is missed"),
}

TAKES = {
    ("info",): set(),
    ("layout",): {"cp", "seq"},
    ("demo",): {"cp", "seq", "batch", "backend"},
    ("launch",): set(),
    ("bench", "layout"): {"cp", "seq", "reps", "quick", "check-targets"},
    ("bench", "mesh"): {"cp", "reps", "quick", "backend", "check-targets"},
    ("bench", "batch"): {"cp", "seq", "batch", "reps", "warmup", "quick", "check-targets"},
    ("bench", "thd"): {"cp", "seq", "batch", "reps", "warmup", "quick", "check-targets"},
    ("bench", "attention"): {"cp", "seq", "reps", "quick", "check-targets"},
}


def help_options(command):
    """long option -> (short option or None, description) from the --help
    of COMMAND."""
    result = run(*command, "--help")
    options = {}
    for line in result.stdout.splitlines():
        match = re.match(r"\s+(?:(-\w), )?--([\w-]+)(?:=\S+)?\s+(.*)$", line)
        if match:
            options[match.group(2)] = (match.group(1), match.group(3))
    return options


# One line per target, the same in every benchmark:
# "target: WHAT: 0.93× ≥ 0.80×: met".
TARGET_LINE = re.compile(r"target: (.+): (n/a|\d+\.\d\d×) (≥|≤) (\d+\.\d\d)×: "
                         r"(met|missed|not judged \(stated for .+\))$")


def target_lines(test, stdout):
    """The verdicts of the target lines of STDOUT, each checked against
    the figures it prints."""
    verdicts = []
    for line in stdout.splitlines():
        if not line.startswith("target"):
            continue
        match = TARGET_LINE.match(line)
        test.assertIsNotNone(match, line)
        _, measured, bound, target, verdict = match.groups()
        if verdict in ("met", "missed") and measured != "n/a":
            value, target = float(measured[:-1]), float(target)
            holds = value >= target if bound == "≥" else value <= target
            # Rounded to two places, equal figures may go either way.
            if value != target:
                test.assertEqual(verdict == "met", holds, line)
        verdicts.append(verdict.split(" (")[0])
    return verdicts


# "cpmesh bench layout: [    1.2 s] round 1 of 4": progress goes to stderr.
def progress_lines(test, command, result):
    prefix = "cpmesh " + " ".join(command) + ": ["
    lines = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    seconds = []
    for line in lines:
        match = re.match(re.escape(prefix) + r"\s*(\d+\.\d) s\] \S.*$", line)
        test.assertIsNotNone(match, line)
        seconds.append(float(match.group(1)))
    test.assertEqual(seconds, sorted(seconds))
    test.assertNotIn(prefix, result.stdout)
    return lines


class Help(unittest.TestCase):
    def test_version(self):
        result = run("--version")
        self.assertEqual(result.returncode, 0, result.stderr)
        match = re.fullmatch(r"cpmesh \(libcpmesh\) (\d+\.\d+\.\d+)\n", result.stdout)
        self.assertIsNotNone(match, result.stdout)
        self.assertTrue(run("info").stdout.startswith("libcpmesh %s\n" % match.group(1)))

    def test_program_help_lists_commands(self):
        result = run("--help")
        self.assertEqual(result.returncode, 0, result.stderr)
        for command in ("info", "layout", "bench", "demo", "launch", "help"):
            self.assertRegex(result.stdout, r"\n  %s\s" % command)
        self.assertIn("--version", result.stdout)

    def test_help_command_is_help_option(self):
        for group in GROUPS:
            with self.subTest(group=group):
                result = run(*group, "help")
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(result.stdout, run(*group, "--help").stdout)
                self.assertIn("Usage:\n  " + " ".join(("cpmesh",) + group), result.stdout)

    def test_help_of_every_command(self):
        for command in COMMANDS + GROUPS[1:]:
            with self.subTest(command=command):
                result = run("help", *command)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn("Usage:\n  cpmesh " + " ".join(command), result.stdout)
                self.assertEqual(result.stdout, run(*command, "--help").stdout)

    def test_help_of_a_command_in_its_group(self):
        result = run("bench", "help", "thd")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, run("bench", "thd", "--help").stdout)

    def test_help_of_no_such_command(self):
        for args, message in ((["help", "frobnicate"], "help: unknown command “frobnicate”"),
                              (["help", "bench", "frobnicate"], "help: unknown command “frobnicate”"),
                              (["help", "layout", "extra"], "help: “layout” has no command “extra”")):
            with self.subTest(args=args):
                result = run(*args)
                self.assertEqual(result.returncode, 2)
                self.assertEqual(result.stdout, "")
                self.assertIn(message, result.stderr)
                record_failure(self, " ".join(args), result)

    def test_layout_help_names_its_options(self):
        result = run("layout", "--help")
        for option in ("--cp", "--seq", "--balance", "--thd", "--svg"):
            self.assertIn(option, result.stdout)


class Vocabulary(unittest.TestCase):
    """-C/--cp, -S/--seq, -b/--batch, -r/--reps, … mean the same in every
    command that takes them."""

    def test_help_spells_every_option_alike(self):
        for command in COMMANDS:
            options = help_options(command)
            for name, (short, description) in VOCABULARY.items():
                with self.subTest(command=command, option=name):
                    if name not in TAKES[command]:
                        self.assertNotIn(name, options)
                        continue
                    self.assertIn(name, options)
                    self.assertEqual(options[name][0], short)
                    self.assertTrue(options[name][1].startswith(description), options[name][1])

    def test_no_other_words_for_them(self):
        for command in COMMANDS:
            options = help_options(command)
            with self.subTest(command=command):
                for old in ("ranks", "iterations", "rows"):
                    self.assertNotIn(old, options)
                # -n is launch's alone: the number of processes it starts.
                shorts = {short for short, _ in options.values()}
                self.assertEqual("-n" in shorts, command == ("launch",))

    def assert_same_meaning(self, spellings, cases):
        """Runs each case, (command, arguments, what stdout then says), with
        each spelling of the option."""
        for command, args, says in cases:
            for option in spellings:
                with self.subTest(command=command, option=option):
                    result = run(*command, *option, *args)
                    self.assertEqual(result.returncode, 0, result.stderr)
                    self.assertIn(says, result.stdout)

    def test_cp_is_the_number_of_ranks(self):
        self.assert_same_meaning((["-C", "2"], ["--cp", "2"]), (
            (["layout"], ["--seq", "8"], "8 positions over 2 ranks"),
            (["demo"], SMALL_DEMO, "cpmesh demo: 2 ranks on threads"),
            (["bench", "layout"], ["--quick", "--seq", "64", "--reps", "1"], "head-tail over 2 ranks"),
            (["bench", "mesh"], ["--quick", "--mib", "1", "--reps", "1"], "mesh of 2 ranks"),
            (["bench", "batch"], ["--quick", "--seq", "64"], "bench batch: 2 in-process ranks"),
            (["bench", "thd"], SMALL_THD, "bench thd: 2 in-process ranks")))

    def test_seq_is_the_sequence_length(self):
        self.assert_same_meaning((["-S", "40"], ["--seq", "40"]), (
            (["layout"], ["--cp", "2"], "head-tail layout: 40 positions over 2 ranks"),
            (["demo"], ["--cp", "3", "--heads", "1", "--head-dim", "4"], "40 positions padded to 42"),
            (["bench", "layout"], ["--quick", "--reps", "1"], "float32[4, 40, 1024]"),
            (["bench", "batch"], ["--quick", "-C", "2"], "position_ids [8, 40] int64"),
            (["bench", "thd"], ["--quick", "-C", "2", "--documents", "2"],
             "position_ids [8, 40] int64")))

    def test_reps_is_the_number_of_timed_repetitions(self):
        self.assert_same_meaning((["-r", "2"], ["--reps", "2"]), (
            (["bench", "layout"], ["--quick", "--seq", "64"], "best of 2 passes"),
            (["bench", "mesh"], ["--quick", "--mib", "1"], "best of 2 passes"),
            (["bench", "batch"], ["--quick", "--seq", "64"], "(median of 2;"),
            (["bench", "thd"], SMALL_THD, "(median of 2)")))

    def test_batch_is_the_number_of_rows(self):
        self.assert_same_meaning((["-b", "3"], ["--batch", "3"]), (
            (["demo"], ["--cp", "2", "--seq", "8", "--heads", "1", "--head-dim", "4"],
             "input_ids and labels int64[3, 8]"),
            (["bench", "batch"], ["--quick", "--seq", "64"], "position_ids [3, 64] int64"),
            (["bench", "thd"], SMALL_THD, "position_ids [3, 1024] int64")))


# Usage errors, every command: (what, arguments, what stderr says).
USAGE_ERRORS = (
    ("an unknown option to the program", ["--frobnicate"], "Unknown option --frobnicate"),
    ("no command", [], "no command given; the commands are:\n  info "),
    ("bench: no command", ["bench"], "no command given; the commands are:\n  layout "),
    ("an unknown command", ["frobnicate"], "unknown command “frobnicate”"),
    ("an unknown command of bench", ["bench", "frobnicate"], "unknown command “frobnicate”"),
    ("info: an unknown option", ["info", "--frobnicate"], "Unknown option --frobnicate"),
    ("info: a stray argument", ["info", "extra"], "unexpected argument “extra”"),
    ("layout: an unknown option", ["layout", "--frobnicate"], "Unknown option --frobnicate"),
    ("layout: --cp that is not a number", ["layout", "--cp", "four"],
     "--cp four is not a whole number"),
    ("layout: --cp 0", ["layout", "--cp", "0", "--seq", "16"], "--cp 0 must be at least 1"),
    ("layout: --seq negative", ["layout", "--seq", "-8"], "--seq -8 must be at least 1"),
    ("layout: --seq not a multiple of 2·C", ["layout", "--cp", "2", "--seq", "6"],
     "--seq 6 is not a multiple of 2·C = 4 (--cp 2)"),
    ("layout: neither --seq nor --thd", ["layout", "--cp", "4"],
     "give the sequence length with --seq, or documents with --thd"),
    ("layout: --balance with an unknown name", ["layout", "--seq", "16", "--balance", "zigzag"],
     "--balance zigzag: use one of head-tail, contiguous"),
    ("layout: --thd with a bound that is not a number", ["layout", "--cp", "2", "--thd", "0,x"],
     "--thd 0,x: x is not a whole number"),
    ("layout: --thd with --balance", ["layout", "--cp", "2", "--thd", "0,8", "--balance",
                                      "contiguous"], "--thd is always per-document head-tail"),
    ("layout: --thd with another --seq", ["layout", "--cp", "2", "--thd", "0,8", "--seq", "16"],
     "--seq 16 disagrees with --thd, whose documents add up to 8"),
    ("demo: an unknown option", ["demo", "--frobnicate"], "Unknown option --frobnicate"),
    ("demo: --cp 0", ["demo", "--cp", "0"], "--cp 0 must be at least 1"),
    ("demo: --seq 0", ["demo", "--seq", "0"], "--seq 0 must be at least 1"),
    ("demo: --heads negative", ["demo", "--heads", "-1"], "--heads -1 must be at least 1"),
    ("demo: --rotate names no rotate method", ["demo", "--rotate", "addtoall"],
     "--rotate addtoall: use one of allgather, alltoall, ring"),
    ("demo: --backend names no backend", ["demo", "--backend", "tcp"],
     "--backend tcp: use one of local, ucx"),
    ("demo: --cp with --backend ucx", ["demo", "--backend", "ucx", "--cp", "2"],
     "--cp goes with --backend local: over UCX the launcher sets the number of ranks"),
    ("launch: an unknown option", ["launch", "--frobnicate", "-n", "2", "--", "true"],
     "Unknown option --frobnicate"),
    ("launch: no -n", ["launch", "--", "true"], "give the number of ranks with -n N"),
    ("launch: -n 0", ["launch", "-n", "0", "--", "true"], "--nproc 0 must be at least 1"),
    ("launch: -n that is not a number", ["launch", "-n", "two", "--", "true"],
     "--nproc two is not a whole number"),
    ("launch: --port out of range", ["launch", "-n", "2", "--port", "70000", "--", "true"],
     "--port 70000 must be at most 65534"),
    ("launch: no program", ["launch", "-n", "2"], "give the program to start after --"),
    ("bench layout: an unknown option", ["bench", "layout", "--frobnicate"],
     "Unknown option --frobnicate"),
    ("bench layout: --reps that is not a number", ["bench", "layout", "--reps", "x"],
     "--reps x is not a whole number"),
    ("bench layout: --reps 0", ["bench", "layout", "--reps", "0"], "--reps 0 must be at least 1"),
    ("bench layout: --cp 0", ["bench", "layout", "--cp", "0"], "--cp 0 must be at least 1"),
    ("bench layout: --seq not a multiple of 2·C", ["bench", "layout", "--seq", "100"],
     "--seq 100 is not a multiple of 2·C = 8 (--cp 4)"),
    ("bench layout: --cp that does not divide the default --seq", ["bench", "layout", "--cp", "3"],
     "--seq 16384 is not a multiple of 2·C = 6 (--cp 3)"),
    ("bench layout: --check-targets at sizes without targets",
     ["bench", "layout", "--quick", "--check-targets"], "--check-targets: the targets are stated for"),
    ("bench mesh: an unknown option", ["bench", "mesh", "--frobnicate"],
     "Unknown option --frobnicate"),
    ("bench mesh: --cp negative", ["bench", "mesh", "--cp", "-1"], "--cp -1 must be at least 1"),
    ("bench mesh: --mib 0", ["bench", "mesh", "--mib", "0"], "--mib 0 must be at least 1"),
    ("bench mesh: --backend names no backend", ["bench", "mesh", "--backend", "tcp"],
     "--backend tcp: use one of local, ucx, shm"),
    ("bench mesh: --no-perftest without --backend ucx", ["bench", "mesh", "--no-perftest"],
     "--no-perftest goes with --backend ucx or shm"),
    ("bench mesh: --rounds 0", ["bench", "mesh", "--backend", "shm", "--rounds", "0"],
     "--rounds 0 must be at least 1"),
    ("bench mesh: --attention-seq not a multiple of 2·C",
     ["bench", "mesh", "--backend", "shm", "--cp", "3", "--attention-seq", "100"],
     "--attention-seq 100 is not a multiple of 2·C = 6 (--cp 3)"),
    ("bench mesh: --check-targets at sizes without targets",
     ["bench", "mesh", "--quick", "--check-targets"], "--check-targets: the targets are stated for"),
    ("bench batch: an unknown option", ["bench", "batch", "--frobnicate"],
     "Unknown option --frobnicate"),
    ("bench batch: --vocab that is not a number", ["bench", "batch", "--vocab", "x"],
     "--vocab x is not a whole number"),
    ("bench batch: --batch 0", ["bench", "batch", "--batch", "0"], "--batch 0 must be at least 1"),
    ("bench batch: --warmup negative", ["bench", "batch", "--warmup", "-1"],
     "--warmup -1 must be at least 0"),
    ("bench batch: --seq not a multiple of 2·C", ["bench", "batch", "--seq", "1001"],
     "--seq 1001 is not a multiple of 2·C = 8 (--cp 4)"),
    ("bench batch: --check-targets at sizes without targets",
     ["bench", "batch", "--quick", "--check-targets"], "--check-targets: the targets are stated for"),
    ("bench thd: an unknown option", ["bench", "thd", "--frobnicate"], "Unknown option --frobnicate"),
    ("bench thd: --batch that is not a number", ["bench", "thd", "--batch", "eight"],
     "--batch eight is not a whole number"),
    ("bench thd: --documents 0", ["bench", "thd", "--documents", "0"],
     "--documents 0 must be at least 1"),
    ("bench thd: --reps negative", ["bench", "thd", "--reps", "-3"], "--reps -3 must be at least 1"),
    ("bench thd: --seq not a multiple of 2·C", ["bench", "thd", "--seq", "100"],
     "--seq 100 is not a multiple of 2·C = 8 (--cp 4)"),
    ("bench thd: --seq too short for --documents", ["bench", "thd", "--seq", "64"],
     "--seq 64 has no room for --documents 64 of at least 2·C = 8 positions each"),
    ("bench attention: an unknown option", ["bench", "attention", "--frobnicate"],
     "Unknown option --frobnicate"),
    ("bench attention: --seq that is not a number", ["bench", "attention", "--seq", "abc"],
     "--seq abc is not a whole number"),
    ("bench attention: --seq negative", ["bench", "attention", "--seq", "1024,-8"],
     "--seq 1024,-8: -8 must be at least 1"),
    ("bench attention: --cp-seq not a multiple of 2·C", ["bench", "attention", "--cp-seq", "100"],
     "--cp-seq 100 is not a multiple of 2·C = 8 (--cp 4)"),
    ("bench attention: --reps 0", ["bench", "attention", "--reps", "0"],
     "--reps 0 must be at least 1"),
    ("bench attention: --tolerance negative", ["bench", "attention", "--tolerance", "-1"],
     "--tolerance -1 must be a finite number in [0, 1000000]"),
    ("bench attention: --check-targets at sizes without targets",
     ["bench", "attention", "--quick", "--check-targets"], "--check-targets: the targets are stated for"),
)


class Usage(unittest.TestCase):
    """A wrong command line exits 2 in every command, says what is wrong
    and where to look, and does nothing else."""

    def test_usage_errors(self):
        for what, args, message in USAGE_ERRORS:
            with self.subTest(args=args):
                result = run(*args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stdout, "")
                self.assertIn(message, result.stderr)
                self.assertRegex(result.stderr, r"\nRun “cpmesh[\w ]*--help” for usage\.\n$")
                record_failure(self, what, result)

    def test_a_group_without_a_command_lists_them(self):
        for group, names in (([], ("info", "layout", "bench", "demo", "launch", "help")),
                             (["bench"], ("layout", "mesh", "batch", "thd", "attention", "help"))):
            with self.subTest(group=group):
                result = run(*group)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stdout, "")
                listed = re.findall(r"^  (\w+) ", result.stderr, re.MULTILINE)
                self.assertEqual(tuple(listed), names)
                self.assertEqual(run(*group, "--help").stdout.count("\n  " + names[0] + " "), 1)

    def test_every_command_has_a_case_of_each_kind(self):
        everyone = {" ".join(command) for command in COMMANDS}
        kinds = {
            "a bad option": (r"an unknown option", everyone),
            "a bad value": (r"not a number|names no|unknown name", everyone - {"info"}),
            "zero or a negative value": (r" 0$|negative", everyone - {"info"}),
            # demo pads its sequence, as prepare does; mesh and launch have none.
            "a sequence not a multiple of 2·C": (r"not a multiple of 2·C", everyone - {
                "info", "demo", "launch", "bench mesh"}),
        }
        for kind, (pattern, expected) in kinds.items():
            covered = {what.split(":")[0] for what, _, _ in USAGE_ERRORS if re.search(pattern, what)}
            with self.subTest(kind=kind):
                self.assertLessEqual(expected, covered)

    def test_ucx_options_over_ucx(self):
        # Checked whether or not UCX is built in: a usage error either way.
        for args in (["--backend", "ucx", "--mib", "2"], ["--backend", "ucx", "--cp", "1"]):
            with self.subTest(args=args):
                result = run("bench", "mesh", *args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stdout, "")
                record_failure(self, "bench mesh " + " ".join(args), result)


class Info(unittest.TestCase):
    def setUp(self):
        self.result = run("info")
        self.assertEqual(self.result.returncode, 0, self.result.stderr)

    def test_version(self):
        self.assertRegex(self.result.stdout, r"^libcpmesh \d+\.\d+\.\d+\n")

    def test_backends(self):
        self.assertRegex(self.result.stdout, r"\n  local\s+yes\s")
        self.assertRegex(self.result.stdout, r"\n  ucx\s+(yes|no)\s")
        # shm is always built; where it cannot run, the line says why.
        self.assertRegex(self.result.stdout, r"\n  shm\s+(yes\s[^;\n]*|no\s.*; unusable here: .+)\n")
        self.assertRegex(self.result.stdout,
                         r"\n  cuda\s+(yes|no|built with CUDA; no driver:|built with CUDA; no device:)\s")

    def transports(self, stdout):
        match = re.search(r"\ntransports \(CPMESH_TRANSPORT names one; [^\n]*\):\n((?:  [^\n]*\n)+)", stdout)
        self.assertIsNotNone(match, stdout)
        return match.group(1)

    def test_transports(self):
        section = self.transports(self.result.stdout)
        self.assertRegex(section, r"^  shm\s+(yes|no)\s")
        self.assertRegex(section, r"\n  local\s+yes\s")
        self.assertRegex(section, r"\n  default chain: shm, (ucx, )?local; [^\n]*several[^\n]*\n$")

    def test_transport_unusable_here(self):
        """A transport that cannot run here says so, and why."""
        if not re.search(r"\n  ucx\s+yes\s", self.result.stdout):
            self.skipTest("built without UCX")
        result = run("info", env={"UCX_UNIFIED_MODE": "y"})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(self.transports(result.stdout), r"\n?  ucx\s+no\s+[^\n]*: UCX_UNIFIED_MODE=y: ")

    def test_cpu_features(self):
        for feature in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"):
            self.assertRegex(self.result.stdout, r"\n  %s\s+(yes|no|unknown)\n" % feature)

    def test_online_cpus(self):
        match = re.search(r"\nonline cpus: (\d+)\n", self.result.stdout)
        self.assertIsNotNone(match)
        self.assertGreaterEqual(int(match.group(1)), 1)

    def test_cuda(self):
        if re.search(r"\n  cuda\s+no\s", self.result.stdout):
            self.assertIn("\ncuda: not built in\n", self.result.stdout)
            return
        version = r"(none \(0\)|\d+\.\d+ \(\d+\))"
        self.assertRegex(self.result.stdout, r"\ncuda runtime: \d+\.\d+ \(\d+\)\n")
        self.assertRegex(self.result.stdout, r"\ncuda driver: %s\n" % version)
        devices = re.search(r"\ncuda devices: (\d+)( \((.*)\))?\n", self.result.stdout)
        self.assertIsNotNone(devices)
        if int(devices.group(1)) == 0:
            self.assertIn("no CUDA device", devices.group(3))
        if "cuda driver: none (0)" in self.result.stdout:
            self.assertEqual(int(devices.group(1)), 0)
        # The backend line says whether CUDA can run here, and why not.
        if "cuda driver: none (0)" in self.result.stdout:
            said = "built with CUDA; no driver:"
        elif int(devices.group(1)) == 0:
            said = "built with CUDA; no device:"
        else:
            said = "yes"
        self.assertRegex(self.result.stdout, r"\n  cuda   %s CUDA device memory" % re.escape(said))

    def test_gpu_libraries(self):
        """NCCL, cuDNN and NVRTC: the copy found, or why none, and
        CPMESH_GPU_LIBRARY_PATH decides where to look."""
        if re.search(r"\n  cuda\s+no\s", self.result.stdout):
            return
        for name in ("nccl", "cudnn", "nvrtc"):
            self.assertRegex(self.result.stdout,
                             r"\n%s: (none \(.+\)|\d+\.\d+(\.\d+)? at /\S+)\n" % name)
        with tempfile.TemporaryDirectory() as empty:
            result = run("info", env={"CPMESH_GPU_LIBRARY_PATH": empty})
        self.assertEqual(result.returncode, 0, result.stderr)
        for name, soname in (("nccl", "libnccl.so.2"), ("cudnn", "libcudnn.so.9")):
            self.assertIn("\n%s: none (%s is in none of the directories CPMESH_GPU_LIBRARY_PATH "
                          "names (%s))\n" % (name, soname, empty), result.stdout)
        toolkit = "/usr/local/cuda/lib64"
        if not os.path.exists(os.path.join(toolkit, "libnccl.so.2")):
            return
        result = run("info", env={"CPMESH_GPU_LIBRARY_PATH": toolkit})
        self.assertRegex(result.stdout, r"\nnccl: 2\.\d+\.\d+ at %s/libnccl\.so\.2\n" % toolkit)


class Layout(unittest.TestCase):
    def test_head_tail_matches_e1(self):
        result = run("layout", "--cp", "4", "--seq", "16")
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = layout_rows(result.stdout)
        self.assertEqual(rows[0][2], {0, 1, 14, 15})
        self.assertEqual(rows[1][2], {2, 3, 12, 13})
        self.assertEqual(rows[2][2], {4, 5, 10, 11})
        self.assertEqual(rows[3][2], {6, 7, 8, 9})
        # Rank 3's chunks touch; the view keeps its head and tail apart.
        self.assertRegex(result.stdout, r"\n   0 .*  head 0-1, tail 14-15\n")
        self.assertRegex(result.stdout, r"\n   3 .*  head 6-7, tail 8-9\n")
        self.assertEqual(rows[3][3], [("head", 0, 6, 2), ("tail", 0, 8, 2)])
        # Causal cost of rank 0: keys seen by positions 0, 1, 14, 15.
        self.assertEqual([rows[r][1] for r in range(4)], [34, 34, 34, 34])
        self.assertEqual([rows[r][0] for r in range(4)], [4, 4, 4, 4])

    def test_imbalance_head_tail_against_contiguous(self):
        # Contiguous: rank costs 10, 26, 42, 58 against a mean of 34.
        result = run("layout", "--cp", "4", "--seq", "16")
        self.assertIn("imbalance (max/mean causal cost): head-tail 1.00, contiguous 1.71",
                      result.stdout)
        # Long sequences approach (2C - 1) / C.
        result = run("layout", "--cp", "4", "--seq", "16384")
        self.assertIn("head-tail 1.00, contiguous 1.75", result.stdout)

    def test_contiguous_balance(self):
        result = run("layout", "--cp", "4", "--seq", "16", "--balance", "contiguous")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("contiguous layout: 16 positions over 4 ranks", result.stdout)
        rows = layout_rows(result.stdout)
        self.assertEqual(rows[3][2], {12, 13, 14, 15})
        self.assertEqual([rows[r][1] for r in range(4)], [10, 26, 42, 58])

    def test_thd_documents(self):
        result = run("layout", "--cp", "2", "--thd", "0,8,12")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("2 documents, 12 positions over 2 ranks", result.stdout)
        rows = layout_rows(result.stdout)
        self.assertEqual(rows[0][2], {0, 1, 6, 7, 8, 11})
        self.assertEqual(rows[1][2], {2, 3, 4, 5, 9, 10})
        self.assertIn("doc 0: head 0-1, tail 6-7; doc 1: head 8, tail 11", result.stdout)
        self.assertIn("doc 0: head 2-3, tail 4-5; doc 1: head 9, tail 10", result.stdout)
        self.assertIn("imbalance (max/mean causal cost): 1.00", result.stdout)

    def test_single_rank_still_has_two_chunks(self):
        result = run("layout", "--cp", "1", "--seq", "8")
        self.assertEqual(layout_rows(result.stdout)[0][3], [("head", 0, 0, 4), ("tail", 0, 4, 4)])

    def assert_svg(self, args, n_documents=1):
        """cpmesh layout ARGS --svg FILE: the picture shows what the table
        says, rank by rank."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "layout.svg")
            result = run("layout", *args, "--svg", path)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertTrue(result.stdout.endswith("picture: %s\n" % path))
            rows = layout_rows(result.stdout)
            with open(path, encoding="utf-8") as svg:
                picture = assert_picture(self, svg.read(), {r: row[3] for r, row in rows.items()},
                                         [rows[r][1] for r in sorted(rows)], n_documents)
        return rows, picture

    def test_svg_head_tail(self):
        rows, picture = self.assert_svg(["--cp", "4", "--seq", "16"])
        self.assertEqual(len(picture["chunks"]), 8)
        self.assertEqual(len(picture["hatches"]), 4)

    def test_svg_contiguous(self):
        rows, picture = self.assert_svg(["--cp", "4", "--seq", "16", "--balance", "contiguous"])
        self.assertEqual([row[1] for _, row in sorted(rows.items())], [10, 26, 42, 58])
        self.assertEqual(picture["hatches"], set())

    def test_svg_documents(self):
        rows, picture = self.assert_svg(["--cp", "2", "--thd", "0,8,24,32"], n_documents=3)
        self.assertEqual(rows[0][3][:2], [("head", 0, 0, 2), ("tail", 0, 6, 2)])
        self.assertEqual({c["document"] for c in picture["chunks"]}, {0, 1, 2})

    def test_svg_unwritable(self):
        result = run("layout", "--cp", "2", "--seq", "8", "--svg", "/nonexistent/layout.svg")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, "")
        self.assertIn("--svg", result.stderr)
        self.assertIn("/nonexistent/layout.svg", result.stderr)
        record_failure(self, "layout --svg into a directory that does not exist", result)

    def svg_into(self, path, **kwargs):
        result = run("layout", "--cp", "2", "--seq", "8", "--svg", path, **kwargs)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def assert_is_svg(self, text):
        self.assertTrue(text.startswith("<?xml"), text[:80])
        self.assertTrue(text.endswith("</svg>\n"), text[-80:])

    def test_svg_through_a_symbolic_link(self):
        # The file the link points to gets the picture; the link stays.
        with tempfile.TemporaryDirectory() as tmp:
            target, link = os.path.join(tmp, "target.svg"), os.path.join(tmp, "link.svg")
            with open(target, "w") as old:
                old.write("old")
            os.chmod(target, 0o640)
            os.symlink("target.svg", link)
            self.svg_into(link)
            self.assertTrue(os.path.islink(link))
            self.assertEqual(os.readlink(link), "target.svg")
            with open(target) as svg:
                self.assert_is_svg(svg.read())
            self.assertEqual(os.stat(target).st_mode & 0o777, 0o640)
            self.assertEqual(sorted(os.listdir(tmp)), ["link.svg", "target.svg"])

    def test_svg_into_a_fifo(self):
        # A FIFO is written into, as a shell's > would, and stays a FIFO.
        with tempfile.TemporaryDirectory() as tmp:
            fifo = os.path.join(tmp, "picture")
            os.mkfifo(fifo)
            received = []
            reader = threading.Thread(target=lambda: received.append(open(fifo).read()), daemon=True)
            reader.start()
            self.svg_into(fifo, timeout=30)
            reader.join(30)
            self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
            self.assert_is_svg(received[0])

    def test_svg_to_standard_output(self):
        # A link to a descriptor, as /dev/stdout is: the pipe gets the
        # picture, before the table, and the link stays.
        with tempfile.TemporaryDirectory() as tmp:
            link = os.path.join(tmp, "stdout")
            os.symlink("/proc/self/fd/1", link)
            result = self.svg_into(link)
            self.assertTrue(os.path.islink(link))
            picture, _, table = result.stdout.partition("</svg>\n")
            self.assert_is_svg(picture + "</svg>\n")
            self.assertIn("head-tail layout: 8 positions over 2 ranks", table)

    def test_svg_to_standard_output_in_a_file(self):
        # The shell sent stdout to a file: the picture and then the table
        # go into it, the same file.
        with tempfile.TemporaryDirectory() as tmp:
            link, out = os.path.join(tmp, "stdout"), os.path.join(tmp, "out.txt")
            os.symlink("/proc/self/fd/1", link)
            with open(out, "w") as stdout:
                inode = os.fstat(stdout.fileno()).st_ino
                environment = {k: v for k, v in os.environ.items() if k not in CLEARED_VARIABLES}
                status = subprocess.run([CPMESH, "layout", "--cp", "2", "--seq", "8", "--svg", link],
                                        stdout=stdout, env=environment, timeout=60).returncode
            self.assertEqual(status, 0)
            self.assertEqual(os.stat(out).st_ino, inode)
            self.assertTrue(os.path.islink(link))
            with open(out) as written:
                picture, _, table = written.read().partition("</svg>\n")
            self.assert_is_svg(picture + "</svg>\n")
            self.assertTrue(table.startswith("head-tail layout: 8 positions over 2 ranks\n"), table)

    def test_svg_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            dangling = os.path.join(tmp, "dangling.svg")
            os.symlink("nowhere/picture.svg", dangling)
            for what, path, message in (
                    ("a directory", tmp, "%s is a directory; give a file name in it" % tmp),
                    ("a symbolic link to nothing", dangling,
                     "%s is a symbolic link to a file that does not exist" % dangling)):
                with self.subTest(what=what):
                    result = run("layout", "--cp", "2", "--seq", "8", "--svg", path)
                    self.assertEqual(result.returncode, 1, result.stderr)
                    self.assertEqual(result.stdout, "")
                    self.assertIn("cpmesh layout: --svg: " + message, result.stderr)
                    record_failure(self, "layout --svg naming %s" % what, result)
            self.assertTrue(os.path.isdir(tmp))
            self.assertTrue(os.path.islink(dangling))
            self.assertEqual(sorted(os.listdir(tmp)), ["dangling.svg"])

    def test_svg_of_a_large_layout_is_bounded(self):
        # 8192 documents over 64 ranks: a picture of summarised chunks.
        bounds = ",".join(str(128 * d) for d in range(8193))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "layout.svg")
            result = run("layout", "--cp", "64", "--thd", bounds, "--svg", path, timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertLess(os.path.getsize(path), 256 * 1024)
            with open(path, encoding="utf-8") as svg:
                self.assertIn("1048576 chunks are too many to draw", svg.read())

    def test_short_options_are_the_long_ones(self):
        self.assertEqual(run("layout", "-C", "2", "-S", "8").stdout,
                         run("layout", "--cp", "2", "--seq", "8").stdout)

    def test_thd_document_not_a_multiple(self):
        # Every value comes from the command line: what the library
        # refuses is a usage error, with the library's message.
        result = run("layout", "--cp", "4", "--thd", "0,8,12")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stdout, "")
        self.assertIn("document 1 has padded length 4, not a multiple of 8", result.stderr)
        record_failure(self, "layout --thd with a document not a multiple of 2·cp", result)

    def test_thd_bounds_that_decrease(self):
        result = run("layout", "--cp", "2", "--thd", "0,8,4")
        self.assertEqual(result.returncode, 2)
        self.assertIn("decreases at entry 2: 4 after 8", result.stderr)
        record_failure(self, "layout --thd with bounds that decrease", result)


# The variables by which each launcher says a process is one of several
# ranks, as cp_mesh_new_from_env() reads them.
LAUNCHER_ENVIRONMENTS = (
    ("torchrun or cpmesh launch", {"RANK": "1", "WORLD_SIZE": "4"}, "WORLD_SIZE=4"),
    ("Open MPI", {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
     "OMPI_COMM_WORLD_SIZE=2"),
    ("Slurm", {"SLURM_PROCID": "2", "SLURM_NTASKS": "3"}, "SLURM_NTASKS=3"),
    ("a rank without a world size", {"RANK": "1"}, "RANK=1"),
)

class Demo(unittest.TestCase):
    def test_demo_passes(self):
        result = run("demo")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("4090 positions padded to 4096", result.stdout)
        self.assertIn("rank 0: head 0-511, tail 3584-4095", result.stdout)
        self.assertIn("rank 3: head 1536-2047, tail 2048-2559", result.stdout)
        self.assertRegex(result.stdout, r"max \|error\| against single-rank attention on the "
                         r"full sequence: out \S+, dq \S+, dk \S+, dv \S+\n")
        self.assertRegex(result.stdout, r"\nPASS: all 4 ranks .* bit-exactly\n$")
        for rank in range(4):
            self.assertRegex(result.stdout, r"\n\s+%d(\s+\d+\.\d+){6}\s+ok\n" % rank)
        # It says what it is doing while it works: first the reference.
        lines = progress_lines(self, ["demo"], result)
        self.assertEqual(len(lines), 2)
        self.assertIn("single-rank attention on the full sequence", lines[0])
        self.assertTrue(lines[1].endswith("4 ranks"))

    def test_demo_alltoall_and_other_sizes(self):
        result = run("demo", "--cp", "3", "--batch", "2", "--seq", "10", "--heads", "2",
                     "--head-dim", "8", "--rotate", "alltoall")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("10 positions padded to 12", result.stdout)
        self.assertIn("rank 2: head 4-5, tail 6-7", result.stdout)
        self.assertIn("alltoall rotation", result.stdout)
        self.assertIn("PASS: all 3 ranks", result.stdout)

    def test_ring_is_alltoall(self):
        # The help calls alltoall the ring: both names are accepted.
        self.assertIn("ring", run("demo", "--help").stdout)
        result = run("demo", "--cp", "2", "--rotate", "ring", *SMALL_DEMO)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("alltoall rotation", result.stdout)
        self.assertIn("PASS: all 2 ranks", result.stdout)

    def test_refuses_under_a_launcher_without_backend(self):
        # N processes would each run a whole demo of their own and print
        # PASS: the user must say which demo they meant.
        for launcher, env, found in LAUNCHER_ENVIRONMENTS:
            with self.subTest(launcher=launcher):
                result = run("demo", *SMALL_DEMO, env=env)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                self.assertEqual(result.stdout, "")
                self.assertIn("a launcher started this process as one of several ranks (%s), but "
                              "no --backend was given: add --backend ucx" % found, result.stderr)
                record_failure(self, "demo without --backend under %s" % launcher, result)

    def test_a_world_of_one_is_no_launcher(self):
        result = run("demo", "--cp", "2", *SMALL_DEMO, env={"RANK": "0", "WORLD_SIZE": "1"})
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("PASS: all 2 ranks", result.stdout)

    def test_backend_local_under_a_launcher(self):
        result = run("demo", "--cp", "2", "--backend", "local", *SMALL_DEMO,
                     env={"RANK": "0", "WORLD_SIZE": "2"})
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("PASS: all 2 ranks", result.stdout)


class Launch(unittest.TestCase):
    """cpmesh launch starts ranks the way torchrun --standalone does."""

    def test_demo_over_ucx(self):
        if not has_ucx():
            self.skipTest("libcpmesh was built without UCX")
        result = run("launch", "-n", "2", "--", CPMESH, "demo", "--backend", "ucx", "--seq", "512")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("[rank 0] cpmesh demo: 2 ranks in processes of their own, over UCX",
                      result.stdout)
        for rank in range(2):
            self.assertIn("[rank %d] PASS: rank %d of 2" % (rank, rank), result.stdout)
            self.assertRegex(result.stdout, r"\[rank %d\] max \|error\| against single-rank" % rank)

    def test_demo_over_ucx_without_launcher(self):
        """A UCX rank that no launcher started is a mesh of one rank."""
        if not has_ucx():
            self.skipTest("libcpmesh was built without UCX")
        launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "SLURM_PROCID", "SLURM_NTASKS")
        env = {name: value for name, value in os.environ.items() if name not in launcher}
        result = subprocess.run([CPMESH, "demo", "--backend", "ucx", "--seq", "512"],
                                capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("  rank 0: head 0-255, tail 256-511\n", result.stdout)
        self.assertIn("PASS: rank 0 of 1 matched single-rank attention", result.stdout)

    def test_demo_without_backend(self):
        result = run("launch", "-n", "2", "--", CPMESH, "demo", *SMALL_DEMO)
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertNotIn("PASS", result.stdout)
        self.assertRegex(result.stderr, r"\[rank \d\] cpmesh demo: a launcher started this process "
                         r"as one of several ranks \(WORLD_SIZE=2\), but no --backend was given: "
                         r"add --backend ucx")
        self.assertIn("exited with status 2; stopping the other ranks", result.stderr)

    def test_environment(self):
        result = run("launch", "-n", "2", "--port", "29613", "--", "sh", "-c",
                     'echo "$RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_ADDR/$MASTER_PORT/${CPMESH_TOKEN:+token}"')
        self.assertEqual(result.returncode, 0, result.stderr)
        for rank in range(2):
            self.assertIn("[rank %d] %d/2/%d/127.0.0.1/29613/token" % (rank, rank, rank),
                          result.stdout.splitlines())

    def test_options_after_the_program_are_its_own(self):
        result = run("launch", "-n", "1", "--", "sh", "-c", 'printf "%s\\n" "$*"', "sh", "-n", "--cp")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "[rank 0] -n --cp\n")

    def test_failing_rank_stops_the_others(self):
        result = run("launch", "-n", "3", "--grace", "1", "--", "sh", "-c",
                     'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 30')
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("rank 1 exited with status 3; stopping the other ranks", result.stderr)

    def test_program_that_cannot_start(self):
        result = run("launch", "-n", "2", "--", "/nonexistent/program")
        self.assertEqual(result.returncode, 127, result.stderr)
        self.assertIn("cpmesh launch: cannot start /nonexistent/program", result.stderr)
        self.assertNotIn("CRITICAL", result.stderr)
        record_failure(self, "launch of a program that does not exist", result)


def start(*args, env=None, **popen):
    """cpmesh ARGS, running, as run() would start it."""
    environment = {k: v for k, v in os.environ.items() if k not in CLEARED_VARIABLES}
    environment.update(env or {})
    return subprocess.Popen([CPMESH, *args], env=environment, **popen)


def process_alive(pid):
    """Whether PID is a process that has not ended (a zombie has)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open, or between the open and the read.
        return False


def wait_for(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def read_pids(path):
    try:
        with open(path) as pids:
            return [int(word) for word in pids.read().split()]
    except FileNotFoundError:
        return []


def read_until(pipe, wanted, seconds=10):
    """What PIPE gives until WANTED has come or SECONDS have passed; PIPE
    is left non-blocking."""
    os.set_blocking(pipe.fileno(), False)
    seen = b""
    deadline = time.monotonic() + seconds
    while wanted not in seen and time.monotonic() < deadline:
        seen += pipe.read1(4096) or b""
        time.sleep(0.02)
    return seen


def status_kib(pid, field):
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


# Each rank starts a child in the background, one in a session of its
# own (setsid), and waits: every pid goes to the file $1.
DETACHING_RANK = ('sleep 300 & echo $! >> "$1"; '
                  'setsid sh -c \'echo $$ >> "$1"; exec sleep 300\' sh "$1" & '
                  'echo $$ >> "$1"; wait')


class LaunchProcesses(unittest.TestCase):
    """Nothing a launch started outlives it, however it ends."""

    def start_detaching(self, tmp, n):
        pids = os.path.join(tmp, "pids")
        launcher = start("launch", "-n", str(n), "--", "sh", "-c", DETACHING_RANK, "sh", pids,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(launcher.kill)
        self.assertTrue(wait_for(lambda: len(read_pids(pids)) == 3 * n, 20), read_pids(pids))
        return launcher, read_pids(pids)

    def assert_all_gone(self, pids):
        wait_for(lambda: not any(process_alive(p) for p in pids), 10)
        survivors = [p for p in pids if process_alive(p)]
        for pid in survivors:
            os.kill(pid, 9)
        self.assertEqual(survivors, [], "processes of the launch that outlived it")

    def test_sigkill_of_the_launcher(self):
        with tempfile.TemporaryDirectory() as tmp:
            launcher, pids = self.start_detaching(tmp, 2)
            launcher.kill()
            launcher.wait(10)
            self.assert_all_gone(pids)
            record_outcome(self, "cpmesh", "launch killed by SIGKILL, its ranks with children "
                           "in the background and in sessions of their own", "killed",
                           "%d processes of 2 ranks, none left" % len(pids))

    def test_sigterm_of_the_launcher(self):
        with tempfile.TemporaryDirectory() as tmp:
            launcher, pids = self.start_detaching(tmp, 2)
            launcher.terminate()
            self.assertEqual(launcher.wait(20), 128 + 15)
            self.assert_all_gone(pids)

    def test_what_a_rank_leaves_behind(self):
        # The rank exits at once; the children it left, one holding its
        # output pipe, go with it, and the launch ends without waiting.
        with tempfile.TemporaryDirectory() as tmp:
            pids = os.path.join(tmp, "pids")
            began = time.monotonic()
            result = run("launch", "-n", "1", "--", "sh", "-c",
                         'sleep 300 & echo $! >> "$1"; setsid sleep 300 & echo $! >> "$1"', "sh",
                         pids, timeout=30)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertLess(time.monotonic() - began, 10)
            self.assertEqual(len(read_pids(pids)), 2)
            self.assert_all_gone(read_pids(pids))

    def test_a_rank_that_ignores_sigterm(self):
        # After the grace period the rank and its child are killed, the
        # child in a session of its own too.
        with tempfile.TemporaryDirectory() as tmp:
            pids = os.path.join(tmp, "pids")
            began = time.monotonic()
            result = run("launch", "-n", "2", "--grace", "1", "--", "sh", "-c",
                         'if [ "$RANK" = 1 ]; then while [ ! -s "$1" ]; do sleep 0.05; done; exit 3; '
                         'fi; trap "" TERM; setsid sh -c \'trap "" TERM; echo $$ >> "$1"; '
                         'while :; do sleep 1; done\' sh "$1" & while :; do sleep 1; done', "sh", pids,
                         timeout=60)
            self.assertEqual(result.returncode, 3, result.stderr)
            self.assertLess(time.monotonic() - began, 15)
            self.assertEqual(len(read_pids(pids)), 1)
            self.assert_all_gone(read_pids(pids))

    def test_a_rank_killed_by_a_signal(self):
        result = run("launch", "-n", "1", "--", "sh", "-c", 'kill -9 $$')
        self.assertEqual(result.returncode, 128 + 9, result.stderr)
        self.assertIn("rank 0 was killed by signal 9", result.stderr)


class LaunchOutput(unittest.TestCase):
    """What the ranks print comes out as it comes, each line named by its
    rank, in bounded memory."""

    def test_long_line_without_newline(self):
        size = 256 << 20
        launcher = start("launch", "-n", "1", "--", "sh", "-c",
                         'head -c %d /dev/zero | tr "\\0" x; exec sleep 30' % size,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.addCleanup(launcher.kill)
        head = launcher.stdout.read(9)
        self.assertEqual(head, b"[rank 0] ")
        received = 0
        while received < size:
            block = launcher.stdout.read1(1 << 20)
            self.assertTrue(block, "the output ended after %d bytes" % received)
            self.assertEqual(block.count(b"x"), len(block), "more than the line came out")
            received += len(block)
        self.assertEqual(received, size)
        # The whole line went through, and the launcher never held much
        # of it: its peak memory is that of a launcher at rest.
        peak = status_kib(launcher.pid, "VmHWM")
        self.assertLess(peak, 48 * 1024, "the launcher's peak RSS is %d KiB" % peak)
        record_outcome(self, "cpmesh", "launch of a rank printing a 256 MiB line without a newline",
                       "passed through", "launcher peak RSS %d MiB" % (peak // 1024))
        launcher.kill()

    def test_progress_bar_before_the_rank_ends(self):
        with tempfile.TemporaryDirectory() as tmp:
            go = os.path.join(tmp, "go")
            launcher = start("launch", "-n", "1", "--", "sh", "-c",
                             'printf "\\r 10%%|#  |"; printf "\\r 20%%|## |"; '
                             'while [ ! -e "$1" ]; do sleep 0.05; done; printf "\\r100%%|###|\\n"',
                             "sh", go, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.addCleanup(launcher.kill)
            # What a terminal would show while the rank still runs.
            seen = read_until(launcher.stdout, b"20%|## |")
            self.assertEqual(seen, b"\r[rank 0]  10%|#  |\r[rank 0]  20%|## |")
            self.assertIsNone(launcher.poll())
            open(go, "w").close()
            os.set_blocking(launcher.stdout.fileno(), True)
            rest = launcher.stdout.read()
            self.assertEqual(launcher.wait(20), 0)
            self.assertEqual(rest, b"\r[rank 0] 100%|###|\n")

    def test_partial_line_is_shown(self):
        # A prompt without an end of line shows, and the rest of its line
        # follows it without a second prefix.
        with tempfile.TemporaryDirectory() as tmp:
            go = os.path.join(tmp, "go")
            launcher = start("launch", "-n", "1", "--", "sh", "-c",
                             'printf "answer? "; while [ ! -e "$1" ]; do sleep 0.05; done; echo 42',
                             "sh", go, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.addCleanup(launcher.kill)
            seen = read_until(launcher.stdout, b"answer? ")
            self.assertEqual(seen, b"[rank 0] answer? ")
            open(go, "w").close()
            os.set_blocking(launcher.stdout.fileno(), True)
            self.assertEqual(launcher.stdout.read(), b"42\n")
            self.assertEqual(launcher.wait(20), 0)

    def test_lines_of_two_ranks_stay_apart(self):
        # Rank 1 starts a line and waits; rank 0's line comes below it,
        # and the rest of rank 1's line is named again.
        with tempfile.TemporaryDirectory() as tmp:
            go = os.path.join(tmp, "go")
            result = run("launch", "-n", "2", "--", "sh", "-c",
                         'if [ "$RANK" = 1 ]; then printf "half"; sleep 0.5; touch "$1"; '
                         'sleep 0.5; echo " and half"; else while [ ! -e "$1" ]; do sleep 0.05; '
                         'done; echo "rank zero"; fi', "sh", go)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(result.stdout, "[rank 1] half\n[rank 0] rank zero\n[rank 1]  and half\n")

    def test_demo_tables_do_not_interleave(self):
        if not has_ucx():
            self.skipTest("libcpmesh was built without UCX")
        result = run("launch", "-n", "4", "--", CPMESH, "demo", "--backend", "ucx", "--seq", "512")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        lines = result.stdout.splitlines()
        for rank in range(4):
            prefix = "[rank %d] " % rank
            start = lines.index(prefix + "rank    prepare      enter  attention       exit     "
                                         "gather     verify  (ms)")
            block = lines[start:start + 4]
            self.assertTrue(all(line.startswith(prefix) for line in block), "\n".join(lines))
            self.assertRegex(block[1], r"^\[rank %d\]\s+%d(\s+\d+\.\d+){6}\s+ok$" % (rank, rank))
            self.assertTrue(block[3].startswith(prefix + "PASS: rank %d of 4" % rank))


# Each benchmark at sizes of a second or less, and how it says that it
# checked its results.
QUICK_BENCHES = (
    (["bench", "layout"], ["--quick", "--reps", "1"],
     "every piece holds its rank's positions; the round trip is bit-exact"),
    (["bench", "mesh"], ["--quick", "--reps", "1", "--mib", "1"],
     "every rank's all_gather and all_reduce output checked"),
    (["bench", "batch"], ["--quick"],
     "every rank's buffers checked while entered, and position ids after exit"),
    (["bench", "thd"], ["--quick"], "every rank's tokens of every document checked"),
)

SPEED = re.compile(r"GB/s|GF/s|ms \(median|× memcpy")


def quick_ucx_bench():
    return (["bench", "mesh"], ["--backend", "ucx", "--quick", "--cp", "2", "--rounds", "2"],
            "every rank's all_gather, all_reduce and all_to_all output checked")


class Bench(unittest.TestCase):
    """The benchmarks run, check their results before printing any speed,
    print every target in one format, and say what they are doing; their
    figures are not judged here."""

    def benches(self):
        return QUICK_BENCHES + ((quick_ucx_bench(),) if has_ucx() else ())

    def test_quick_runs(self):
        for command, args, checked in self.benches():
            with self.subTest(command=command):
                result = run(*command, *args)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn(checked, result.stdout)
                # The check comes first, then figures, then the targets.
                self.assertLess(result.stdout.index(checked), SPEED.search(result.stdout).start())
                verdicts = target_lines(self, result.stdout)
                self.assertTrue(verdicts)
                self.assertEqual(set(verdicts), {"not judged"})
                self.assertTrue(progress_lines(self, command, result))

    def test_rows_of_layout_and_mesh(self):
        result = run("bench", "layout", "--quick", "--reps", "1")
        for row in ("memcpy, 1 thread", "shard (cp_layout_shard)", "shard_into",
                    "unshard (cp_layout_unshard_pieces)", "unshard_into"):
            self.assertIn("\n" + row, result.stdout)
        self.assertIn("target: unshard_into (reused output) against memcpy, 1 thread: ", result.stdout)
        result = run("bench", "mesh", "--quick", "--reps", "1", "--mib", "1")
        for row in ("memcpy, N threads", "all_gather (allocating)", "all_gather_into",
                    "all_reduce SUM"):
            self.assertIn("\n" + row, result.stdout)
        self.assertIn("target: all_gather_into (reused output) against memcpy, N threads: ",
                      result.stdout)

    def test_wrong_results_print_no_speed(self):
        # The test-only switch alters one value of each result before the
        # benchmark checks it.
        for command, args, checked in self.benches():
            with self.subTest(command=command):
                result = run(*command, *args, env={"CPMESH_BENCH_TEST": "corrupt-result"})
                self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
                self.assertRegex(result.stderr, r"cpmesh %s: wrong results, no speed printed: "
                                 r"\S" % " ".join(command))
                self.assertIsNone(SPEED.search(result.stdout), result.stdout)
                self.assertNotIn("target:", result.stdout)
                self.assertNotIn(checked, result.stdout)
                backend = ["--backend", "ucx"] if "ucx" in args else []
                record_failure(self, "%s whose result is wrong" % " ".join(command + backend), result)

    def test_wrong_result_messages(self):
        for command, args, message in (
                (["bench", "layout"], ["--quick"], "shard_into: rank 0's local position 0 of row 0 "
                                                   "(dim 1) is not global position 0"),
                (["bench", "mesh"], ["--quick", "--mib", "1"], "on rank 0: element 0 is 1000, not 0 "
                                                                "from rank 0's piece"),
                (["bench", "batch"], ["--quick"], "input_ids: rank 0's local position 0 of row 0 "
                                                  "(dim 1) is not global position 0"),
                (["bench", "thd"], ["--quick"], "input_ids: rank 0's token 0 is not token 0 of the "
                                                "packed rows (document 0 of row 0)")):
            with self.subTest(command=command):
                result = run(*command, *args, env={"CPMESH_BENCH_TEST": "corrupt-result"})
                self.assertIn(message, result.stderr)

    def test_missed_targets_and_check_targets(self):
        # Unreachable targets are judged at any size: printed as missed,
        # exit 0, and with --check-targets exit 3.
        for command, args, _ in QUICK_BENCHES:
            env = {"CPMESH_BENCH_TEST": "unreachable-targets"}
            with self.subTest(command=command):
                result = run(*command, *args, env=env)
                self.assertEqual(result.returncode, 0, result.stderr)
                verdicts = target_lines(self, result.stdout)
                self.assertTrue(verdicts)
                self.assertEqual(set(verdicts), {"missed"})
                result = run(*command, *args, "--check-targets", env=env)
                self.assertEqual(result.returncode, 3, result.stderr)
                self.assertIn("cpmesh %s: %d of %d targets missed (--check-targets)"
                              % (" ".join(command), len(verdicts), len(verdicts)), result.stderr)
                record_failure(self, "%s --check-targets with a missed target" % " ".join(command),
                               result)

    def test_target_lines_at_the_default_sizes(self):
        # The smallest benchmark whose default sizes are the targets' own:
        # each target is met or missed, never left unjudged.
        result = run("bench", "thd", "--reps", "2", "--warmup", "0")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(target_lines(self, result.stdout), (["met"], ["missed"]))
        result = run("bench", "thd", "--reps", "2", "--warmup", "0", "--check-targets")
        self.assertIn(result.returncode, (0, 3), result.stderr)
        self.assertEqual(result.returncode == 3, target_lines(self, result.stdout) == ["missed"])

    def test_target_line_format(self):
        for line, verdict in (
                ("target: shard against memcpy, 1 thread: 0.93× ≥ 0.80×: met", "met"),
                ("target: step against memcpy: 1.71× ≤ 1.50×: missed", "missed"),
                ("target: all_gather busbw: n/a ≥ 0.70×: not judged (stated for the default sizes)",
                 "not judged")):
            self.assertEqual(target_lines(self, line), [verdict])
        with self.assertRaises(AssertionError):
            target_lines(self, "target: shard: 0.93× ≥ 0.80×: missed")


class BenchMeshProcesses(unittest.TestCase):
    """bench mesh over processes at its smallest: the structure of its
    report (every case, Open MPI's column or why it is empty, the bound,
    failure and attention sections, the targets), never its figures."""

    ARGS = ["--quick", "--cp", "2", "--rounds", "2", "--reps", "2", "--attention-seq", "64"]
    CHECKED = "every rank's all_gather, all_reduce and all_to_all output checked"
    NUMBER = r"\d+\.\d+"
    SPREAD = r"(\d+\.\d+) \[(\d+\.\d+)–(\d+\.\d+)\]"

    def setUp(self):
        if not has_ucx():
            self.skipTest("this libcpmesh has no UCX")

    def bench(self, *args, env=None):
        result = run("bench", "mesh", "--backend", "ucx", *self.ARGS, *args, timeout=110, env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def assert_ratio(self, ratio, numerator, denominator):
        """RATIO is NUMERATOR / DENOMINATOR, each printed to two places."""
        ratio, numerator, denominator = float(ratio), float(numerator), float(denominator)
        low = (numerator - 0.005) / (denominator + 0.005) - 0.005
        high = (numerator + 0.005) / max(denominator - 0.005, 1e-9) + 0.005
        self.assertTrue(low <= ratio <= high, (ratio, numerator, denominator))

    def assert_spread(self, median, low, high):
        self.assertLessEqual(float(low), float(median))
        self.assertLessEqual(float(median), float(high))

    def case_rows(self, out):
        """(collective, busbw spread, max/min, Open MPI cells, memcpy,
        copies, bound, ours/bound) of each row of the table."""
        rows = {}
        for line in out.splitlines():
            match = re.match(r"\| 2 \| (\w+) +\|  1 MiB \| +%s \| %s +\| +(%s) \| (.*?) +\| +(\S+) \| "
                             r"(.*?) +\| +(%s) \| +(%s) \| +(%s) \| +(%s) \|$"
                             % (self.NUMBER, self.SPREAD, self.NUMBER, self.NUMBER, self.NUMBER,
                                self.NUMBER, self.NUMBER), line)
            if match:
                rows[match.group(1)] = match.groups()[1:]
        return rows

    def test_report(self):
        result = self.bench()
        out = result.stdout
        self.assertTrue(out.startswith("cpmesh bench mesh --backend ucx: processes on this host"))
        self.assertLess(out.index(self.CHECKED), SPEED.search(out).start())
        with_mpi = re.search(r"^Open MPI: Open MPI v\S+.* -np 2 \S+ -c SCRIPT$", out, re.MULTILINE)
        if not with_mpi:
            self.assertRegex(out, r"\nOpen MPI: not measured: .*\(Debian: .*\); the benchmark "
                                  r"installs nothing\n")
        rows = self.case_rows(out)
        self.assertEqual(set(rows), {"all_gather", "all_reduce", "all_to_all"}, out)
        for collective, (median, low, high, spread, theirs, their_spread, versus,
                         copy, copies, bound, share) in rows.items():
            with self.subTest(collective=collective):
                self.assert_spread(median, low, high)
                self.assert_ratio(spread, high, low)
                self.assert_ratio(bound, copy, copies)
                self.assertGreater(float(share), 0)
                if with_mpi:
                    self.assert_spread(*re.fullmatch(self.SPREAD, theirs).groups())
                    self.assert_spread(*re.fullmatch(self.SPREAD, versus).groups())
                    float(their_spread)
                else:
                    self.assertEqual((theirs, their_spread, versus), ("-", "-", "-"))
        # UCX copies twice through its shared-memory FIFO; all_reduce adds
        # the copy of its scratch result (N/(2(N−1)) = 1 of the bus bytes).
        self.assertEqual([rows[c][8] for c in ("all_gather", "all_reduce", "all_to_all")],
                         ["2.00", "3.00", "2.00"])
        self.assertRegex(out, r"\n  2 processes over ucx: %s s\n  2 threads of one process: %s s\n"
                              r"  processes / threads: %s\n  K/V bytes copied per ring step over "
                              r"processes: [1-9]\d* \(the most any rank's ring reported"
                              % (self.SPREAD, self.SPREAD, self.SPREAD))
        failures = re.findall(r"^  run (\d): rank (\d) killed; survivors: (%s) s \(([\w-]+)\); "
                              r"teardown at most \d+ ms$" % self.NUMBER, out, re.MULTILINE)
        self.assertEqual([(run, victim) for run, victim, _, _ in failures], [("1", "1"), ("2", "0")])
        for _, _, seconds, code in failures:
            self.assertIn(code, ("peer-lost", "timed-out"))
            self.assertGreater(float(seconds), 0)
        self.assertRegex(out, r"\n  every survivor: %s s over 2 errors; the last survivor of each "
                              r"run: %s s over 2 runs\n" % (self.SPREAD, self.SPREAD))
        verdicts = target_lines(self, out)
        self.assertEqual(set(verdicts), {"not judged"})
        self.assertEqual(len(verdicts), 2 * 3 + 2)
        for what in ("N=2 all_reduce 1 MiB: busbw against Open MPI's", "N=2 all_to_all 1 MiB: "
                     "busbw max/min over the rounds", "failure: seconds until every survivor's error",
                     "attention: wall time over processes against threads"):
            self.assertIn("\ntarget: " + what, out)
        lines = progress_lines(self, ["bench", "mesh"], result)
        self.assertEqual(any("Open MPI" in line for line in lines), bool(with_mpi))

    def test_without_open_mpi(self):
        # No mpirun on PATH: said, the columns left empty, the rest as
        # before.  Nothing else of the quick run looks at PATH.
        with tempfile.TemporaryDirectory() as empty:
            result = self.bench("--no-failure", "--no-attention", env={"PATH": empty})
        out = result.stdout
        said = re.search(r"^Open MPI: (.*)$", out, re.MULTILINE).group(1)
        self.assertEqual(said, "not measured: mpirun is not on PATH (Debian: openmpi-bin); the "
                               "benchmark installs nothing")
        self.assertIn(self.CHECKED + "\n", out)
        rows = self.case_rows(out)
        self.assertEqual(len(rows), 3, out)
        for row in rows.values():
            self.assertEqual((row[4], row[5], row[6]), ("-", "-", "-"))
        self.assertNotIn("failure:", out)
        self.assertNotIn("ring attention", out)
        self.assertIn("n/a ≥ 1.00×", out)
        record_outcome(self, "cpmesh", "bench mesh over processes without mpirun",
                       "Open MPI not measured, exit status 0", said)

    def test_shm_is_never_replaced(self):
        # Where the library has no shm transport the benchmark says so and
        # measures nothing; where it has one, the report names it.
        result = run("bench", "mesh", "--backend", "shm", *self.ARGS, "--no-mpi", "--no-failure",
                     timeout=110)
        if result.returncode == 0:
            self.assertTrue(result.stdout.startswith("cpmesh bench mesh --backend shm: "))
            self.assertEqual([row[8] for row in self.case_rows(result.stdout).values()],
                             ["1.00"] * 3)
            # The ring reads every peer's K/V where it lies.
            self.assertIn("  K/V bytes copied per ring step over processes: 0 (", result.stdout)
            return
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertRegex(result.stderr, r"cpmesh bench mesh: --backend shm: the ranks cannot run "
                                        r"over shm, and the benchmark measures no other: \S")
        record_failure(self, "bench mesh --backend shm where the library cannot run shm", result)


class BenchAttention(unittest.TestCase):
    """bench attention in seconds: one sequence of 256 positions."""

    ARGS = ["--quick", "--seq", "256", "--cp-seq", "256"]

    def test_quick(self):
        result = run("bench", "attention", *self.ARGS, timeout=110)
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        # The checks come before any figure, and every row is reported.
        self.assertLess(out.index("Every element checked against float64 first: float32 S=256"),
                        out.index("matmul 2048"))
        for row in ("| float32  |    256 |", "| bfloat16 |    256 |", "| allgather |", "| ring      |"):
            self.assertIn(row, out)
        self.assertIn("C = 2 ranks in one process", out)
        for case in ("float32 S=256", "bfloat16 S=256", "C=2 allgather float32 S=256",
                     "C=2 ring float32 S=256"):
            self.assertRegex(out, re.escape(case) + r": float64 at \d+ query rows, max error/tolerance "
                             r"out [^,]+/[^,]+, lse .*; later runs bit-identical: 1")
        self.assertEqual(target_lines(self, out), ["not judged"] * 6)
        for what in ("float32 S=256: forward + backward against matmul",
                     "ring: rank CPU imbalance, max over mean", "ring: CPU time against 1 rank"):
            self.assertIn("target: " + what, out)
        lines = progress_lines(self, ["bench", "attention"], result)
        self.assertIn("C=2 ring float32 S=256: run 2 of 2", lines[-1])

    def test_wrong_results(self):
        for how, args in (("a tolerance of 0", ["--tolerance", "0"]),
                          ("a corrupted result", [])):
            env = {} if args else {"CPMESH_BENCH_TEST": "corrupt-result"}
            with self.subTest(how=how):
                result = run("bench", "attention", *self.ARGS, *args, env=env, timeout=110)
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertIn("cpmesh bench attention: wrong results, no speed printed: float32 "
                              "S=256: max error against float64", result.stderr)
                self.assertRegex(result.stderr, r"max error/tolerance: out [0-9.e+-]+/[0-9.e+-]+, lse")
                self.assertNotIn("GF/s", result.stdout)
                self.assertNotIn("matmul", result.stdout)
                self.assertNotIn("target:", result.stdout)
                record_failure(self, "bench attention with %s" % how, result)

    # The PyTorch reference at one small size, one run.
    TORCH_ARGS = ["--seq", "256", "--cp", "1", "--reps", "1"]

    def torch_line(self, result):
        self.assertEqual(result.returncode, 0, result.stderr)
        return re.search(r"^PyTorch reference: (.*)$", result.stdout, re.MULTILINE).group(1)

    def test_torch_interpreter_from_the_environment(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake = os.path.join(tmp, "python")
            with open(fake, "w") as script:
                script.write('#!/bin/sh\ncase "$2" in *__version__*) echo 9.9.9 ;; *) echo 0.5 ;; esac\n')
            os.chmod(fake, 0o755)
            result = run("bench", "attention", *self.TORCH_ARGS, env={"CPMESH_PYTHON": fake},
                         timeout=110)
            self.assertTrue(self.torch_line(result).startswith("torch 9.9.9 from %s; " % fake))
            missing = os.path.join(tmp, "no-such-python")
            result = run("bench", "attention", *self.TORCH_ARGS, env={"CPMESH_PYTHON": missing},
                         timeout=110)
            said = self.torch_line(result)
            self.assertEqual(said, "skipped (%s cannot import torch; set CPMESH_PYTHON to an "
                                   "interpreter that can)" % missing)
            record_outcome(self, "cpmesh", "bench attention with CPMESH_PYTHON that cannot "
                           "import torch", "skipped, exit status 0", said)

    def test_torch_interpreter_is_not_the_one_on_path(self):
        # A python3 first on PATH (a pyenv shim) is never asked; the
        # interpreter the build found is, and is named.
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "asked")
            with open(os.path.join(tmp, "python3"), "w") as shim:
                shim.write('#!/bin/sh\ntouch "%s"\nexit 1\n' % marker)
            os.chmod(os.path.join(tmp, "python3"), 0o755)
            result = run("bench", "attention", *self.TORCH_ARGS, timeout=110,
                         env={"PATH": tmp + os.pathsep + os.environ["PATH"]})
            said = self.torch_line(result)
            self.assertFalse(os.path.exists(marker))
            self.assertRegex(said, r"^(torch \S+ from /\S+; |skipped \(/\S+ cannot import torch)")
            self.assertIn(sys.executable, said)

    def test_quick_says_why_torch_is_skipped(self):
        result = run("bench", "attention", *self.ARGS, timeout=110)
        self.assertEqual(self.torch_line(result), "skipped (--quick)")

    def test_missed_targets(self):
        result = run("bench", "attention", *self.ARGS, "--check-targets", timeout=110,
                     env={"CPMESH_BENCH_TEST": "unreachable-targets"})
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertEqual(target_lines(self, result.stdout), ["missed"] * 6)
        self.assertIn("6 of 6 targets missed (--check-targets)", result.stderr)


if __name__ == "__main__":
    CPMESH = sys.argv.pop(1)
    unittest.main(verbosity=2)
