#!/usr/bin/env python3
# Uses libcpmesh as someone outside its tree would, following README.md's
# "Using libcpmesh from your own program".
#
#   Installed: `meson install --destdir` into a temporary directory, then
#     the C and Vala examples are built with pkg-config and valac against
#     that copy alone, and the Python and gjs examples run against it with
#     only the variables the README names for a prefix other than /usr.
#   Devenv: the Python and gjs examples run from a directory outside the
#     tree under `meson devenv` and nothing else.
#
# Every program starts from an empty environment and a temporary working
# directory, so neither the build tree nor the source tree can stand in
# for the installed copy.
#
# Usage: test_installed.py MESON BUILD-ROOT SOURCE-ROOT [unittest arguments]
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

MESON = BUILD_ROOT = SOURCE_ROOT = None

# What the examples print: the same four positions per rank in every
# language (rank 0 holds 0, 1, 6, 7 of the head-tail layout of 8 over 2).
C_OUTPUT = "rank 0 holds 0 1 6 7, restored: yes\nrank 1 holds 2 3 4 5, restored: yes\n"
PYTHON_OUTPUT = ("rank 0 holds [0.0, 1.0, 6.0, 7.0], restored: yes\n"
                 "rank 1 holds [2.0, 3.0, 4.0, 5.0], restored: yes\n")
GJS_OUTPUT = C_OUTPUT

# Variables that instrument a run (sanitizer builds preload their runtime
# into interpreters) rather than tell it where to find anything.
INSTRUMENTATION = ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS",
                   "TSAN_OPTIONS", "PYTHONMALLOC", "UCX_MEM_MMAP_HOOK_MODE")

GJS_HELPER_IMPORT = "'../bindings/gjs/cpmesh.js'"


def clean_env(home, instrumented=False, **variables):
    """An environment with nothing from the caller's but instrumentation."""
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "G_DEBUG": "fatal-criticals"}
    if instrumented:
        env.update({k: os.environ[k] for k in INSTRUMENTATION if k in os.environ})
    env.update(variables)
    return env


def compiler_messages(output):
    """The compiler's output less the linker's notes on the sanitizer
    runtime a sanitizer build's library brings in (libasan's own use of
    tmpnam and the like): those are no warning about the program."""
    return "".join(line for line in output.splitlines(keepends=True)
                   if not re.match(r".*/ld: .*lib[a-z]san\.so[.0-9]*: warning: ", line))


def find_one(root, name, required=True):
    """The one file called name under root (None if there is none and it
    is not required: a build without that binding)."""
    found = [os.path.join(d, name) for d, _, files in os.walk(root) if name in files]
    if not found and not required:
        return None
    if len(found) != 1:
        raise AssertionError("expected one %s under %s, found %s" % (name, root, found))
    return found[0]


def staged_pkgconfig_dir(pc_file, destdir, scratch):
    """The directory to put on PKG_CONFIG_PATH for a copy staged under
    destdir.  A relocatable libcpmesh-1.pc (the default) works where it
    lies; one with an absolute prefix (a build directory configured with
    -Dpkgconfig.relocatable=false) names the prefix it was meant for, so
    a copy of it gets that prefix moved under destdir."""
    with open(pc_file, encoding="utf-8") as pc:
        text = pc.read()
    prefix = re.search(r"^prefix=(.*)$", text, re.M).group(1)
    if not prefix.startswith("/"):
        return os.path.dirname(pc_file)
    os.makedirs(scratch, exist_ok=True)
    with open(os.path.join(scratch, os.path.basename(pc_file)), "w", encoding="utf-8") as pc:
        pc.write(text.replace("prefix=" + prefix, "prefix=" + destdir + prefix, 1))
    return scratch


class UserProgram(unittest.TestCase):
    """Runs commands in a temporary directory, outside every tree."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="cpmesh-user-")
        cls.work = os.path.join(cls.tmp, "work")
        os.mkdir(cls.work)
        for name in ("example.c", "example.vala", "example.py", "example.js",
                     "train-step.c", "train-step.vala", "train-step.py", "train-step.js",
                     "torch-roundtrip.py"):
            shutil.copy(os.path.join(SOURCE_ROOT, "examples", name), cls.work)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_in_work(self, args, env, timeout=120):
        result = subprocess.run(args, cwd=self.work, env=env, capture_output=True,
                                text=True, timeout=timeout)
        self.assertEqual(result.returncode, 0,
                         "%s failed (%d):\n%s%s" % (" ".join(args), result.returncode,
                                                   result.stdout, result.stderr))
        return result

    def assert_outside_trees(self, text):
        for tree in (BUILD_ROOT, SOURCE_ROOT):
            self.assertNotIn(tree, text, "a path into the build or source tree was used")


class Installed(UserProgram):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.destdir = os.path.join(cls.tmp, "root")
        subprocess.run([MESON, "install", "-C", BUILD_ROOT, "--destdir", cls.destdir,
                        "--no-rebuild", "--quiet"],
                       env=clean_env(cls.tmp), check=True, capture_output=True, text=True,
                       timeout=300)
        cls.libdir = os.path.dirname(find_one(cls.destdir, "libcpmesh-1.so.0"))
        cls.pkgconfig_dir = staged_pkgconfig_dir(find_one(cls.destdir, "libcpmesh-1.pc"),
                                                 cls.destdir, os.path.join(cls.tmp, "pkgconfig"))
        cls.include_dir = os.path.dirname(find_one(cls.destdir, "libcpmesh.h"))

    def pkg_config(self, *args):
        env = clean_env(self.tmp, PKG_CONFIG_PATH=self.pkgconfig_dir)
        return self.run_in_work(["pkg-config", *args, "libcpmesh-1"], env).stdout.strip()

    def user_env(self):
        """The variables README.md names for a prefix whose typelib, library
        and Python directory the system does not search (/usr/local), here
        pointing into the staged copy."""
        variables = {
            "GI_TYPELIB_PATH": os.path.dirname(find_one(self.destdir, "Cp-1.typelib")),
            "LD_LIBRARY_PATH": self.libdir,
        }
        override = find_one(self.destdir, "Cp.py", required=False)
        if override is not None:  # <dir>/gi/overrides/Cp.py
            variables["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(override)))
        return clean_env(self.tmp, instrumented=True, **variables)

    def require_python_override(self):
        if find_one(self.destdir, "Cp.py", required=False) is None:
            self.skipTest("built without the Python override (no python3-gi)")

    def test_installed_headers_include_only_installed_headers(self):
        for name in sorted(os.listdir(self.include_dir)):
            with open(os.path.join(self.include_dir, name), encoding="utf-8") as header:
                for included in re.findall(r'^\s*#\s*include\s+"([^"]+)"', header.read(), re.M):
                    with self.subTest(header=name, include=included):
                        self.assertTrue(os.path.isfile(os.path.join(self.include_dir, included)),
                                        "%s includes %s, which is not installed" % (name, included))

    def test_pkg_config_points_into_the_installed_copy(self):
        flags = self.pkg_config("--cflags", "--libs")
        self.assertIn("-lcpmesh-1", flags)
        self.assert_outside_trees(flags)
        include = re.search(r"-I(\S*libcpmesh-1)\b", flags).group(1)
        self.assertEqual(os.path.realpath(include), os.path.realpath(self.include_dir))

    def test_c_example_builds_with_pkg_config(self):
        flags = self.pkg_config("--cflags", "--libs").split()
        self.run_in_work(["cc", "-o", "example-c", "example.c", *flags], clean_env(self.tmp))
        self.assert_loads_installed_library("./example-c")
        result = self.run_in_work(["./example-c"], self.user_env())
        self.assertEqual(result.stdout, C_OUTPUT)

    def test_vala_example_builds_with_valac(self):
        vapi = find_one(self.destdir, "libcpmesh-1.vapi", required=False)
        if vapi is None:
            self.skipTest("built without the Vala API")
        # valac looks in vala/vapi under every $XDG_DATA_DIRS directory,
        # /usr/local/share and /usr/share by default: with the staged
        # prefix's share/ there, `--pkg libcpmesh-1` finds the VAPI, and
        # its .deps brings in gio-2.0. Nothing may be printed: the VAPI
        # gives the C API's const arrays their C types.
        vapidir = os.path.dirname(vapi)
        self.assertTrue(vapidir.endswith(os.path.join("share", "vala", "vapi")), vapidir)
        env = clean_env(self.tmp, PKG_CONFIG_PATH=self.pkgconfig_dir,
                        XDG_DATA_DIRS=os.path.dirname(os.path.dirname(vapidir)))
        result = self.run_in_work(["valac", "--pkg", "libcpmesh-1", "-o", "example-vala", "example.vala"], env)
        self.assertEqual(compiler_messages(result.stdout + result.stderr), "", "valac printed warnings")
        self.assert_loads_installed_library("./example-vala")
        result = self.run_in_work(["./example-vala"], self.user_env())
        self.assertEqual(result.stdout, C_OUTPUT)

    def test_python_example_runs(self):
        self.require_python_override()
        python = "/usr/bin/python3"
        result = self.run_in_work([python, "example.py"], self.user_env())
        self.assertEqual(result.stdout, PYTHON_OUTPUT)
        # The override, typelib and library it used are the installed ones.
        probe = ("import gi; gi.require_version('Cp', '1'); from gi.repository import Cp, GIRepository; "
                 "import gi.overrides.Cp as o; print(o.__file__); "
                 "print(GIRepository.Repository.get_default().get_typelib_path('Cp')); "
                 "print(next(l.split()[-1] for l in open('/proc/self/maps') if 'libcpmesh-1' in l))")
        lines = self.run_in_work([python, "-c", probe], self.user_env()).stdout.split()
        for path in lines:
            self.assertTrue(os.path.realpath(path).startswith(os.path.realpath(self.destdir)),
                            "%s is not in the installed copy" % path)

    def test_torch_tensor_goes_in_and_out_without_a_copy(self):
        self.require_python_override()
        if "libasan" in os.environ.get("LD_PRELOAD", ""):
            # Importing PyTorch under AddressSanitizer takes minutes; the
            # python-dlpack test checks the exchange there.
            self.skipTest("PyTorch under AddressSanitizer")
        result = subprocess.run(["/usr/bin/python3", "torch-roundtrip.py"], cwd=self.work,
                                env=self.user_env(), capture_output=True, text=True, timeout=300)
        if result.returncode == 77:
            self.skipTest("PyTorch is not installed")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "x shared: True\npiece shared: True\n"
                         "rank 0 holds [8.0, 9.0, 14.0, 15.0] torch.bfloat16\n")

    def test_python_example_runs_in_a_venv_with_system_site_packages(self):
        self.require_python_override()
        venv = os.path.join(self.tmp, "venv")
        self.run_in_work(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                          "--without-pip", venv], clean_env(self.tmp))
        result = self.run_in_work([os.path.join(venv, "bin", "python"), "example.py"],
                                  self.user_env())
        self.assertEqual(result.stdout, PYTHON_OUTPUT)

    def test_a_venv_without_system_site_packages_has_no_gi(self):
        # Why README.md asks for --system-site-packages: PyGObject is
        # Debian's python3-gi, in the system's site directory.
        venv = os.path.join(self.tmp, "bare-venv")
        self.run_in_work(["/usr/bin/python3", "-m", "venv", "--without-pip", venv],
                         clean_env(self.tmp))
        result = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import gi"],
                                cwd=self.work, env=clean_env(self.tmp), capture_output=True,
                                text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("No module named 'gi'", result.stderr)

    def gjs_program(self, name):
        """gjs, with @name importing the helper from the installed copy."""
        gjs = shutil.which("gjs", path="/usr/bin:/bin")
        if gjs is None:
            self.skipTest("gjs is not installed")
        # The README's import for an installed copy: the helper by its
        # installed location, which pkg-config names.
        helper = os.path.join(self.pkg_config("--variable=gjsmoduledir"), "cpmesh.js")
        self.assertTrue(os.path.isfile(helper), helper)
        path = os.path.join(self.work, name)
        with open(path, encoding="utf-8") as source:
            program = source.read()
        self.assertEqual(program.count(GJS_HELPER_IMPORT), 1)
        with open(path, "w", encoding="utf-8") as out:
            out.write(program.replace(GJS_HELPER_IMPORT, "'file://%s'" % os.path.realpath(helper)))
        return gjs

    def test_gjs_example_runs(self):
        gjs = self.gjs_program("example.js")
        result = self.run_in_work([gjs, "-m", "example.js"], self.user_env())
        self.assertEqual(result.stdout, GJS_OUTPUT)

    def test_train_step_prints_one_checksum_in_every_language(self):
        """The same training step from C, Vala, Python and gjs (4 ranks
        driven from one main loop), built and run against the installed
        copy, prints the same line."""
        self.require_python_override()
        vapi = find_one(self.destdir, "libcpmesh-1.vapi", required=False)
        if vapi is None:
            self.skipTest("built without the Vala API")
        flags = self.pkg_config("--cflags", "--libs").split()
        self.run_in_work(["cc", "-o", "train-step-c", "train-step.c", *flags, "-lm"], clean_env(self.tmp))
        built = self.run_in_work(["valac", "--vapidir", os.path.dirname(vapi), "--pkg", "libcpmesh-1",
                                  "-X", "-lm", "-o", "train-step-vala", "train-step.vala"],
                                 clean_env(self.tmp, PKG_CONFIG_PATH=self.pkgconfig_dir))
        self.assertEqual(compiler_messages(built.stdout + built.stderr), "", "valac printed warnings")
        gjs = self.gjs_program("train-step.js")
        lines = {}
        for language, command in (("C", ["./train-step-c"]), ("Vala", ["./train-step-vala"]),
                                  ("Python", ["/usr/bin/python3", "train-step.py"]),
                                  ("gjs", [gjs, "-m", "train-step.js"])):
            lines[language] = self.run_in_work(command, self.user_env(), timeout=300).stdout
        self.assertRegex(lines["C"], r"^train-step: 4 ranks, 250 positions padded to 256, checksum -?\d+\n$")
        for language, line in lines.items():
            self.assertEqual(line, lines["C"], language)

    def assert_loads_installed_library(self, program):
        """The dynamic linker resolves libcpmesh to the installed copy."""
        env = self.user_env()
        env["LD_TRACE_LOADED_OBJECTS"] = "1"
        result = self.run_in_work([program], env)
        line = next(line for line in result.stdout.splitlines() if "libcpmesh-1.so" in line)
        self.assertIn(os.path.realpath(self.libdir), os.path.realpath(line.split("=>")[1].split()[0]))


class Devenv(UserProgram):
    """`meson devenv -C build -w . PROGRAM` from a directory outside the
    tree, nothing else set."""

    def devenv(self, *command, instrumented=True):
        return self.run_in_work([MESON, "devenv", "-C", BUILD_ROOT, "-w", ".", *command],
                                clean_env(self.tmp, instrumented=instrumented))

    def require_gi(self):
        if subprocess.run(["/usr/bin/python3", "-c", "import gi"], env=clean_env(self.tmp),
                          capture_output=True).returncode != 0:
            self.skipTest("/usr/bin/python3 has no gi (python3-gi)")

    def test_c_example_builds_with_pkg_config(self):
        # Meson puts libcpmesh-1-uninstalled.pc on PKG_CONFIG_PATH.  The
        # compiler runs without a sanitizer build's preloaded runtime.
        self.devenv("sh", "-c", "cc -o example-c example.c $(pkg-config --cflags --libs libcpmesh-1)",
                    instrumented=False)
        result = self.devenv("./example-c")
        self.assertEqual(result.stdout, C_OUTPUT)

    def test_python_example_runs(self):
        self.require_gi()
        result = self.devenv("/usr/bin/python3", "example.py")
        self.assertEqual(result.stdout, PYTHON_OUTPUT)

    def test_python_override_is_the_source_tree_one(self):
        self.require_gi()
        result = self.devenv("/usr/bin/python3", "-c",
                             "import gi; gi.require_version('Cp', '1'); from gi.repository import Cp; "
                             "import gi.overrides.Cp as o; print(o.__file__)")
        self.assertEqual(os.path.realpath(result.stdout.strip()),
                         os.path.realpath(os.path.join(SOURCE_ROOT, "bindings", "python", "gi",
                                                       "overrides", "Cp.py")))

    def test_gjs_example_runs(self):
        if shutil.which("gjs", path="/usr/bin:/bin") is None:
            self.skipTest("gjs is not installed")
        # The example imports the helper relative to its own file, so it
        # runs in place, from any working directory.
        result = self.devenv("gjs", "-m", os.path.join(SOURCE_ROOT, "examples", "example.js"))
        self.assertEqual(result.stdout, GJS_OUTPUT)


if __name__ == "__main__":
    MESON, BUILD_ROOT, SOURCE_ROOT = sys.argv[1:4]
    BUILD_ROOT = os.path.realpath(BUILD_ROOT)
    SOURCE_ROOT = os.path.realpath(SOURCE_ROOT)
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:], verbosity=2)
