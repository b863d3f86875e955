/* test-tensor.vala: Cp.Tensor from Vala, through the generated VAPI
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

static void test_constructors () {
  try {
    var t = new Cp.Tensor.full (Cp.DType.FLOAT32, { 2, 3 }, 1.5);
    unowned int64[] shape = t.get_shape ();

    assert_cmpint (shape.length, EQ, 2);
    assert_cmpint ((int) shape[0], EQ, 2);
    assert_cmpint ((int) shape[1], EQ, 3);
    assert_cmpint ((int) t.get_numel (), EQ, 6);
    assert_cmpint ((int) t.numel, EQ, 6);
    assert_true (t.dtype == Cp.DType.FLOAT32);
    assert_cmpstr (t.describe (), EQ, "float32[2, 3] on host");
    assert_cmpfloat (t.get_value (5), EQ, 1.5);
    assert_cmpuint ((uint) (t.get_data_address () % 64), EQ, 0);

    var a = new Cp.Tensor.arange (Cp.DType.INT64, 0, 10, 3);
    assert_cmpint ((int) a.get_numel (), EQ, 4);
    assert_cmpfloat (a.get_value (3), EQ, 9);

    var zeros = new Cp.Tensor (Cp.DType.BFLOAT16, { 4 });
    assert_cmpuint ((uint) zeros.get_nbytes (), EQ, 8);
    assert_cmpfloat (zeros.get_value (0), EQ, 0);
    assert_cmpstr (Cp.DType.BFLOAT16.get_name (), EQ, "bfloat16");
  } catch (Error e) {
    assert_no_error (e);
  }
}

/* Vala passes arrays as pointers: a borrowed tensor is the caller's memory. */
static void test_borrowed_is_zero_copy () {
  float[] data = { 1, 2, 3, 4 };
  bool released = false;

  try {
    var t = new Cp.Tensor.borrowed (Cp.DType.FLOAT32, { 2, 2 }, (uintptr) data,
                                    data.length * sizeof (float), () => { released = true; });
    assert_true (t.get_data_address () == (uintptr) data);
    data[3] = 40;
    assert_cmpfloat (t.get_value (3), EQ, 40);
    t.set_value (0, -1);
    assert_cmpfloat (data[0], EQ, -1);
    assert_false (released);
    t = null;
    assert_true (released);
  } catch (Error e) {
    assert_no_error (e);
  }
}

static void test_bytes_view () {
  try {
    var t = new Cp.Tensor.arange (Cp.DType.INT32, 0, 4, 1);
    var bytes = t.dup_bytes ();
    unowned uint8[] data = bytes.get_data ();

    assert_true ((uintptr) data == t.get_data_address ());
    assert_cmpint (data.length, EQ, 16);

    var from_bytes = new Cp.Tensor.from_bytes (Cp.DType.INT32, { 2, 2 }, bytes);
    assert_true (from_bytes.get_data_address () == t.get_data_address ());
    assert_cmpfloat (from_bytes.get_value (3), EQ, 3);
  } catch (Error e) {
    assert_no_error (e);
  }
}

/* CpStorage is a refcounted boxed type: Vala takes and drops references
 * through cp_storage_ref () and cp_storage_unref (). */
static void test_storage_reference () {
  try {
    var t = new Cp.Tensor.full (Cp.DType.INT32, { 4 }, 7);
    Cp.Storage storage = t.get_storage ();
    uintptr address = t.get_data_address ();

    assert_true (storage.get_kind () == Cp.StorageKind.OWNED);
    assert_cmpuint ((uint) storage.get_size (), EQ, 16);
    t = null;
    var again = new Cp.Tensor.from_storage (Cp.DType.INT32, { 2 }, storage, 8);
    assert_true (again.get_data_address () == address + 8);
    assert_cmpfloat (again.get_value (1), EQ, 7);
  } catch (Error e) {
    assert_no_error (e);
  }
}

static void test_narrow () {
  try {
    var t = new Cp.Tensor.arange (Cp.DType.INT32, 0, 8, 1);
    var view = t.narrow (0, 2, 3);

    assert_true (view.get_data_address () == t.get_data_address () + 8);
    view.set_value (0, 100);
    assert_cmpfloat (t.get_value (2), EQ, 100);
  } catch (Error e) {
    assert_no_error (e);
  }
}

static void test_errors () {
  try {
    var t = new Cp.Tensor (Cp.DType.FLOAT32, { 2, -1 });
    assert_null (t);
  } catch (Cp.TensorError.SHAPE e) {
    assert_true ("dimension 1 has negative size -1" in e.message);
    assert_true (e.matches (Cp.TensorError.quark (), Cp.TensorError.SHAPE));
  } catch (Error e) {
    assert_no_error (e);
  }

  try {
    var t = new Cp.Tensor (Cp.DType.INT32, { 2, 4 });
    var n = t.narrow (1, 3, 2);
    assert_null (n);
  } catch (Cp.TensorError.OUT_OF_RANGE e) {
    assert_true ("[3, 5) is outside dimension 1 of size 4" in e.message);
  } catch (Error e) {
    assert_no_error (e);
  }
}

int main (string[] args) {
  Test.init (ref args);
  Test.add_func ("/Cp/Vala/Tensor/new/values", test_constructors);
  Test.add_func ("/Cp/Vala/Tensor/borrowed/zero-copy", test_borrowed_is_zero_copy);
  Test.add_func ("/Cp/Vala/Tensor/dup-bytes/view", test_bytes_view);
  Test.add_func ("/Cp/Vala/Tensor/storage/reference", test_storage_reference);
  Test.add_func ("/Cp/Vala/Tensor/narrow/view", test_narrow);
  Test.add_func ("/Cp/Vala/Tensor/errors/codes", test_errors);
  return Test.run ();
}
