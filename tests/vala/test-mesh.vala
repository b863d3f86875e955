/* test-mesh.vala: a small threaded Cp.Mesh run from Vala
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

const int64 SEQ = 16;

/* Each rank shards the same full tensor along the sequence of its cp group,
 * unshards it back, and sums its rank over the whole mesh. */
static bool run_rank (Cp.Mesh mesh) {
  try {
    unowned Cp.Mesh cp = mesh.get_submesh ("cp");
    var layout = new Cp.Layout (Cp.LoadBalance.HEAD_TAIL, SEQ, cp.get_world_size ());
    var full = new Cp.Tensor.arange (Cp.DType.INT32, 0, SEQ, 1);
    var local = layout.shard (full, 0, cp.get_rank ());
    var back = cp.unshard (local, 0);
    assert_true (back.equal (full));

    var total = new Cp.Tensor.full (Cp.DType.INT64, { 1 }, mesh.get_rank ());
    mesh.all_reduce (total, Cp.ReduceOp.SUM);
    assert_cmpfloat (total.get_value (0), EQ, 0 + 1 + 2 + 3);
    return mesh.barrier ();
  } catch (Error e) {
    assert_no_error (e);
    return false;
  }
}

static Thread<bool> start_rank (Cp.Mesh mesh) {
  return new Thread<bool> ("rank %d".printf (mesh.get_rank ()), () => run_rank (mesh));
}

static void test_threads () {
  try {
    var meshes = Cp.Mesh.new_local_group ({ "dp", "cp" }, { 2, 2 });
    Thread<bool>[] threads = {};

    assert_cmpuint (meshes.length (), EQ, 4);
    foreach (unowned Cp.Mesh mesh in meshes) {
      mesh.timeout_ms = 20000;
      threads += start_rank (mesh);
    }
    foreach (var thread in threads)
      assert_true (thread.join ());
  } catch (Error e) {
    assert_no_error (e);
  }
}

static int timeout_returned = 0;

/* Aborts the program if the barrier that must time out has not returned
 * @seconds from now (times $CP_TEST_TIME_FACTOR, which valgrind's setup
 * raises): a wait that never ends fails at the test's own deadline, not
 * when Meson kills the program. */
static void abort_if_still_waiting (uint seconds) {
  seconds *= uint.max (1, (uint) uint64.parse (Environment.get_variable ("CP_TEST_TIME_FACTOR") ?? "1"));
  new Thread<bool> ("watchdog", () => {
    Thread.usleep ((ulong) seconds * 1000000);
    if (AtomicInt.get (ref timeout_returned) == 0)
      error ("still waiting %u s after the barrier started: a wait that should have ended did not", seconds);
    return true;
  });
}

static void test_timeout () {
  try {
    var meshes = Cp.Mesh.new_local_group ({ "cp" }, { 2 });
    unowned Cp.Mesh first = meshes.data;

    first.set_timeout_ms (200);
    abort_if_still_waiting (10);
    first.barrier ();
    assert_not_reached ();
  } catch (Cp.MeshError.TIMED_OUT e) {
    AtomicInt.set (ref timeout_returned, 1);
    assert_true ("1 (mesh rank 1)" in e.message);
  } catch (Error e) {
    assert_no_error (e);
  }
}

static async bool barrier_all (List<Cp.Mesh> meshes) throws Error {
  bool ok = true;
  int pending = 0;

  foreach (unowned Cp.Mesh mesh in meshes) {
    pending++;
    mesh.barrier_async.begin (null, (obj, res) => {
      try {
        ok &= mesh.barrier_async.end (res);
      } catch (Error e) {
        assert_no_error (e);
      }
      if (--pending == 0)
        barrier_all.callback ();
    });
  }
  yield;
  return ok;
}

static void test_barrier_async () {
  try {
    var meshes = Cp.Mesh.new_local_group ({ "cp" }, { 3 });
    var loop = new MainLoop ();
    bool result = false;

    barrier_all.begin (meshes, (obj, res) => {
      try {
        result = barrier_all.end (res);
      } catch (Error e) {
        assert_no_error (e);
      }
      loop.quit ();
    });
    loop.run ();
    assert_true (result);
  } catch (Error e) {
    assert_no_error (e);
  }
}

int main (string[] args) {
  Test.init (ref args);
  Test.add_func ("/Cp/Vala/Mesh/threads/shard-unshard-reduce", test_threads);
  Test.add_func ("/Cp/Vala/Mesh/timeout/missing-rank", test_timeout);
  Test.add_func ("/Cp/Vala/Mesh/barrier/async", test_barrier_async);
  return Test.run ();
}
