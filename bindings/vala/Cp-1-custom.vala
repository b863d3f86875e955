/* Declarations vapigen cannot derive from Cp-1.gir as they should be: the
 * calls taking a zero-terminated string array, which the C API takes as
 * `const char * const *`. The `type` makes Vala cast its `gchar **` to
 * that, so the C compiler does not warn (see Cp-1.metadata).
 *
 * And the getters of a zero-terminated string array, which the C API
 * returns as `const char * const *`: Vala keeps such a result in a
 * `gchar **` of its own to measure it, which no declaration can make
 * const, so `get_keys ()` and `get_dim_names ()` call the `dup_`
 * functions, whose `char **` copy Vala owns and frees.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

namespace Cp {
	public sealed class Batch : GLib.Object {
		[CCode (array_length = false, array_null_terminated = true, cname = "cp_batch_dup_keys")]
		[Version (since = "1.0")]
		public string[] get_keys ();
	}

	public sealed class Mesh : GLib.Object {
		[CCode (array_length = false, array_null_terminated = true, cname = "cp_mesh_dup_dim_names")]
		[Version (since = "1.0")]
		public string[] get_dim_names ();
		[CCode (cname = "cp_mesh_new_local_group")]
		[Version (since = "1.0")]
		public static GLib.List<Cp.Mesh> new_local_group ([CCode (array_length = false, array_null_terminated = true, type = "const char* const*")] string[] dim_names, [CCode (array_length_cname = "n_dims", array_length_pos = 2.1, array_length_type = "gsize")] int[] dim_sizes) throws GLib.Error;
		[CCode (cname = "cp_mesh_new_ucx", has_construct_function = false)]
		[Version (since = "1.0")]
		public Mesh.ucx (int rank, int world_size, string? address, uint port, string? token, [CCode (array_length = false, array_null_terminated = true, type = "const char* const*")] string[]? dim_names, [CCode (array_length_cname = "n_dims", array_length_pos = 7.5, array_length_type = "gsize")] int[]? dim_sizes, uint timeout_ms) throws GLib.Error;
		[CCode (cname = "cp_mesh_connect_async", finish_name = "cp_mesh_connect_finish")]
		[Version (since = "1.0")]
		public static async Cp.Mesh connect_async ([CCode (array_length = false, array_null_terminated = true, type = "const char* const*")] string[]? environment, GLib.Cancellable? cancellable) throws GLib.Error;
	}

	public sealed class MeshOptions : GLib.Object {
		[CCode (array_length = false, array_null_terminated = true, cname = "cp_mesh_options_dup_dim_names")]
		[Version (since = "1.0")]
		public string[]? get_dim_names ();
		[CCode (cname = "cp_mesh_options_set_dims")]
		[Version (since = "1.0")]
		public void set_dims ([CCode (array_length = false, array_null_terminated = true, type = "const char* const*")] string[]? dim_names, [CCode (array_length_cname = "n_dims", array_length_pos = 2.1, array_length_type = "gsize")] int[]? dim_sizes);
	}
}
