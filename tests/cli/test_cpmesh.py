#!/usr/bin/env python3
# Tests of the cpmesh program, run as a user would run it.
#
# Usage: test_cpmesh.py PATH-TO-CPMESH [unittest arguments, e.g. a class]
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'python'))
from layout_svg import assert_picture  # noqa: E402
from reliability import record_outcome  # noqa: E402

CPMESH = None


def run(*args, timeout=60):
    return subprocess.run([CPMESH, *args], capture_output=True, text=True, timeout=timeout)


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


class Help(unittest.TestCase):
    def test_program_help_lists_commands(self):
        result = run("--help")
        self.assertEqual(result.returncode, 0, result.stderr)
        for command in ("info", "layout", "bench", "demo"):
            self.assertRegex(result.stdout, r"\n  %s\s" % command)

    def test_every_command_has_help(self):
        for command in (["info"], ["layout"], ["bench"], ["bench", "layout"],
                        ["bench", "mesh"], ["demo"]):
            with self.subTest(command=command):
                result = run(*command, "--help")
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn("Usage:\n  cpmesh " + " ".join(command), result.stdout)

    def test_layout_help_names_its_options(self):
        result = run("layout", "--help")
        for option in ("--cp", "--seq", "--balance", "--thd"):
            self.assertIn(option, result.stdout)

    def test_no_command_is_a_usage_error(self):
        result = run()
        self.assertEqual(result.returncode, 2)
        self.assertIn("no command", result.stderr)
        record_failure(self, "no command", result)

    def test_unknown_command_is_a_usage_error(self):
        for args in (["frobnicate"], ["bench", "frobnicate"]):
            with self.subTest(args=args):
                result = run(*args)
                self.assertEqual(result.returncode, 2)
                self.assertIn("unknown command “frobnicate”", result.stderr)
                record_failure(self, "an unknown command or subcommand", result)

    def test_unknown_option_is_a_usage_error(self):
        for args in (["--frobnicate"], ["info", "--frobnicate"], ["layout", "--frobnicate"],
                     ["demo", "--frobnicate"], ["bench", "mesh", "--frobnicate"]):
            with self.subTest(args=args):
                result = run(*args)
                self.assertEqual(result.returncode, 2)
                self.assertIn("--frobnicate", result.stderr)
                record_failure(self, "an unknown option to any command", result)

    def test_stray_argument_is_a_usage_error(self):
        result = run("info", "extra")
        self.assertEqual(result.returncode, 2)
        self.assertIn("unexpected argument “extra”", result.stderr)
        record_failure(self, "stray argument: info extra", result)


class Info(unittest.TestCase):
    def setUp(self):
        self.result = run("info")
        self.assertEqual(self.result.returncode, 0, self.result.stderr)

    def test_version(self):
        self.assertRegex(self.result.stdout, r"^libcpmesh \d+\.\d+\.\d+\n")

    def test_backends(self):
        self.assertRegex(self.result.stdout, r"\n  local\s+yes\s")
        self.assertRegex(self.result.stdout, r"\n  ucx\s+(yes|no)\s")
        self.assertRegex(self.result.stdout, r"\n  cuda\s+(yes|no)\s")

    def test_cpu_features(self):
        for feature in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"):
            self.assertRegex(self.result.stdout, r"\n  %s\s+(yes|no|unknown)\n" % feature)

    def test_online_cpus(self):
        match = re.search(r"\nonline cpus: (\d+)\n", self.result.stdout)
        self.assertIsNotNone(match)
        self.assertGreaterEqual(int(match.group(1)), 1)


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

    def test_length_not_a_multiple_names_length_and_divisor(self):
        result = run("layout", "--cp", "2", "--seq", "6")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, "")
        self.assertRegex(result.stderr, r"\b6\b")
        self.assertRegex(result.stderr, r"multiple of 4\b")
        record_failure(self, "layout --seq not a multiple of 2·cp", result)

    def test_thd_document_not_a_multiple(self):
        result = run("layout", "--cp", "4", "--thd", "0,8,12")
        self.assertEqual(result.returncode, 1)
        self.assertIn("document 1 has padded length 4, not a multiple of 8", result.stderr)
        record_failure(self, "layout --thd with a document not a multiple of 2·cp", result)

    def test_bad_cp_size(self):
        result = run("layout", "--cp", "0", "--seq", "16")
        self.assertEqual(result.returncode, 1)
        self.assertIn("cp_size 0", result.stderr)
        record_failure(self, "layout --cp 0", result)

    def test_usage_errors(self):
        for what, args in (("layout without --seq or --thd", ["--cp", "4"]),
                           ("layout --balance with an unknown name",
                            ["--seq", "16", "--balance", "zigzag"]),
                           ("layout --thd with a bound that is not a number",
                            ["--cp", "2", "--thd", "0,x"]),
                           ("layout --thd with --balance contiguous",
                            ["--cp", "2", "--thd", "0,8", "--balance", "contiguous"]),
                           ("layout --thd with --seq", ["--cp", "2", "--thd", "0,8", "--seq", "16"]),
                           ("layout --cp that is not a number", ["--cp", "four"])):
            with self.subTest(args=args):
                result = run("layout", *args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn("cpmesh layout --help", result.stderr)
                record_failure(self, what, result)


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

    def test_demo_ring_and_other_sizes(self):
        result = run("demo", "--ranks", "3", "--batch", "2", "--seq", "10", "--heads", "2",
                     "--head-dim", "8", "--rotate", "alltoall")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("10 positions padded to 12", result.stdout)
        self.assertIn("rank 2: head 4-5, tail 6-7", result.stdout)
        self.assertIn("alltoall rotation", result.stdout)
        self.assertIn("PASS: all 3 ranks", result.stdout)

    def test_demo_bad_rotate_method(self):
        result = run("demo", "--rotate", "addtoall")
        self.assertEqual(result.returncode, 2)
        self.assertIn("--rotate must be allgather or alltoall, not \"addtoall\"", result.stderr)
        record_failure(self, "demo --rotate names no rotate method", result)


def has_ucx():
    return re.search(r"\n  ucx\s+yes", run("info").stdout) is not None


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

    def test_environment(self):
        result = run("launch", "-n", "2", "--port", "29613", "--", "sh", "-c",
                     'echo "$RANK/$WORLD_SIZE/$LOCAL_RANK/$MASTER_ADDR/$MASTER_PORT/${CPMESH_TOKEN:+token}"')
        self.assertEqual(result.returncode, 0, result.stderr)
        for rank in range(2):
            self.assertIn("[rank %d] %d/2/%d/127.0.0.1/29613/token" % (rank, rank, rank),
                          result.stdout.splitlines())

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

    def test_usage_errors(self):
        for args in (["launch"], ["launch", "-n", "0", "--", "true"], ["launch", "-n", "2"]):
            result = run(*args)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn("usage: cpmesh launch -n N", result.stderr)


class Bench(unittest.TestCase):
    """The benchmarks run, verify their data and report every row; their
    figures are not judged here: the benchmarks print each against its
    target for whoever runs them on a quiet machine."""

    def test_layout_quick(self):
        result = run("bench", "layout", "--quick", "--reps", "1")
        self.assertEqual(result.returncode, 0, result.stderr)
        for row in ("memcpy, 1 thread", "shard (cp_layout_shard)", "shard_into",
                    "unshard (cp_layout_unshard_pieces)", "unshard_into"):
            self.assertIn("\n" + row, result.stdout)
        self.assertIn("round trip verified bit-exact", result.stdout)

    def test_mesh_quick(self):
        result = run("bench", "mesh", "--quick", "--reps", "1", "--mib", "1")
        self.assertEqual(result.returncode, 0, result.stderr)
        for row in ("memcpy, N threads", "all_gather (allocating)", "all_gather_into",
                    "all_reduce SUM"):
            self.assertIn("\n" + row, result.stdout)
        self.assertIn("all_gather output verified", result.stdout)

    def test_bad_options(self):
        result = run("bench", "mesh", "--ranks", "0")
        self.assertEqual(result.returncode, 2)
        record_failure(self, "bench mesh --ranks 0", result)

    def test_attention_quick(self):
        result = run("bench", "attention", "--quick", timeout=110)
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        # The checks come before any figure, and every row is reported.
        self.assertLess(out.index("Every element checked against float64 first: float32 S=256"),
                        out.index("matmul 2048"))
        for row in ("| float32  |   1024 |", "| bfloat16 |   1024 |", "| allgather |", "| ring      |"):
            self.assertIn(row, out)
        for case in ("float32 S=1024", "bfloat16 S=1024", "C=2 allgather float32 S=1024",
                     "C=2 ring float32 S=1024"):
            self.assertRegex(out, re.escape(case) + r": float64 at \d+ query rows, max error/tolerance "
                             r"out [^,]+/[^,]+, lse .*; later runs bit-identical: 1")

    def test_attention_wrong_results(self):
        # A tolerance of 0 makes float32 rounding a wrong result.
        result = run("bench", "attention", "--quick", "--tolerance", "0", timeout=110)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("float32 S=256: wrong results, no speed printed: max error against float64",
                      result.stderr)
        self.assertRegex(result.stderr, r"max error/tolerance: out [0-9.e+-]+/0, lse")
        self.assertNotIn("GF/s", result.stdout)
        self.assertNotIn("matmul", result.stdout)
        record_failure(self, "bench attention whose results miss the tolerance against float64",
                       result)

    def test_attention_bad_options(self):
        for args, message in ((["--seq", "abc"], "--seq: "),
                              (["--seq", "-8"], "--seq: "),
                              (["--cp", "4", "--cp-seq", "100"], "--cp-seq 100 must be a positive multiple of 2·C = 8"),
                              (["--reps", "0"], "must be at least 1"),
                              (["--tolerance", "-1"], "--tolerance -1 must be a finite number")):
            result = run("bench", "attention", "--no-torch", *args)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn(message, result.stderr)
            record_failure(self, "bench attention " + " ".join(args), result)


if __name__ == "__main__":
    CPMESH = sys.argv.pop(1)
    unittest.main(verbosity=2)
