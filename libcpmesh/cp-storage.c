/* cp-storage.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "cp-error.h"
#include "cp-memory-private.h"
#include "cp-storage-private.h"

/* The file system magic of dma-bufs (linux/magic.h). */
#ifndef DMA_BUF_MAGIC
# define DMA_BUF_MAGIC 0x444d4142
#endif

/**
 * CpStorage:
 *
 * A reference-counted, fixed-size range of bytes that tensors view.
 *
 * Several [class@Cp.Tensor]s can share one storage, and a storage can hold
 * memory the library allocated, the contents of a #GBytes, foreign memory
 * released through a callback, or a file-descriptor mapping that another
 * process can map too ([ctor@Cp.Storage.new_shared]). Which one is a
 * [enum@Cp.StorageKind]; they all behave the same once made.
 *
 * The size and address of a storage never change, so it can be shared
 * between threads; writing the bytes from several threads at once is the
 * caller's business.
 *
 * Since: 1.0
 */

/* What differs between the kinds is how the bytes are given back; how
 * they are moved is the business of the memory that holds them. */
typedef struct
{
  void (*release) (CpStorage *self);
} StorageOps;

struct _CpStorage
{
  gatomicrefcount ref_count;
  guint64 id;
  const StorageOps *vtable;
  const CpMemoryOps *memory; /* NULL: memory this build cannot reach */
  CpStorageKind kind;
  CpDeviceKind device;
  int device_id;
  guint8 *data;
  gsize size;
  gboolean read_only; /* no operation may write the bytes */

  GBytes *bytes;

  CpReleaseFunc release;
  gpointer user_data;
  GDestroyNotify destroy;

  GObject *owner;

  int fd;
  gpointer map_base;
  gsize map_length;
};

G_DEFINE_BOXED_TYPE (CpStorage, cp_storage, cp_storage_ref, cp_storage_unref)

static void
release_owned (CpStorage *self)
{
  self->memory->free (self->device_id, self->data, self->size);
}

static void
release_bytes (CpStorage *self)
{
  g_bytes_unref (self->bytes);
}

static void
release_borrowed (CpStorage *self)
{
  if (self->release != NULL)
    self->release (self->user_data);
  if (self->destroy != NULL)
    self->destroy (self->user_data);
}

static void
release_owner (CpStorage *self)
{
  g_object_unref (self->owner);
}

static void
release_fd (CpStorage *self)
{
  munmap (self->map_base, self->map_length);
  g_close (self->fd, NULL);
}

static const StorageOps owned_ops = { release_owned };
static const StorageOps bytes_ops = { release_bytes };
static const StorageOps borrowed_ops = { release_borrowed };
static const StorageOps owner_ops = { release_owner };
static const StorageOps fd_ops = { release_fd };

/* The id the next storage gets.  64 bits never wrap: a storage a
 * nanosecond would take five centuries. */
static guint64 next_id = 1;

static CpStorage *
storage_alloc (CpStorageKind     kind,
               const StorageOps *vtable,
               gpointer          data,
               gsize             size)
{
  CpStorage *self = g_new0 (CpStorage, 1);

  g_atomic_ref_count_init (&self->ref_count);
  self->id = __atomic_fetch_add (&next_id, 1, __ATOMIC_RELAXED);
  self->kind = kind;
  self->vtable = vtable;
  self->device = CP_DEVICE_KIND_HOST;
  self->memory = &_cp_memory_host_ops;
  self->data = data;
  self->size = size;
  self->fd = -1;
  return self;
}

CpStorage *
_cp_storage_new_on_device (CpDeviceKind   device,
                           gsize          size,
                           gboolean       zeroed,
                           GError       **error)
{
  const CpMemoryOps *memory = _cp_memory_ops_for_kind (device);
  gpointer data;
  int device_id = 0;
  CpStorage *self;

  g_assert (memory != NULL);
  data = memory->alloc (size, zeroed, &device_id, error);
  if (data == NULL)
    return NULL;
  self = storage_alloc (CP_STORAGE_KIND_OWNED, &owned_ops, data, size);
  self->device = device;
  self->device_id = device_id;
  self->memory = memory;
  return self;
}

/**
 * cp_storage_new:
 * @size: the number of bytes
 * @error: return location for a #GError
 *
 * Allocates @size zero-filled bytes of host memory, aligned to 64 bytes.
 *
 * Returns: (transfer full): a new storage, or %NULL with
 *   %CP_TENSOR_ERROR_OUT_OF_MEMORY
 *
 * Since: 1.0
 */
CpStorage *
cp_storage_new (gsize    size,
                GError **error)
{
  return _cp_storage_new_on_device (CP_DEVICE_KIND_HOST, size, TRUE, error);
}

/* A memfd of @size bytes sealed so that its size never changes again:
 * every process that maps it touches only pages that exist, since a page
 * past the end of a shrunk file kills the process with SIGBUS.  F_SEAL_SEAL
 * keeps anyone from adding seals (a write seal would break importers). */
static int
create_memfd (gsize    size,
              GError **error)
{
  int fd;

#ifdef HAVE_MEMFD_CREATE
  fd = memfd_create ("cpmesh-tensor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
#else
  fd = -1;
  errno = ENOSYS;
#endif
  if (fd < 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                   "memfd_create failed: %s", g_strerror (errno));
      return -1;
    }
  if (ftruncate (fd, (off_t) size) != 0)
    {
      int saved_errno = errno;

      g_close (fd, NULL);
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY,
                   "cannot size a shared memory file to %" G_GSIZE_FORMAT " bytes: %s",
                   size, g_strerror (saved_errno));
      return -1;
    }
  if (fcntl (fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    {
      int saved_errno = errno;

      g_close (fd, NULL);
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                   "cannot seal a shared memory file against resizing: %s",
                   g_strerror (saved_errno));
      return -1;
    }
  return fd;
}

/* Maps @size bytes at @offset of @fd, taking ownership of @fd.  mmap wants
 * a page-aligned offset, so the mapping starts at the page below @offset. */
static CpStorage *
map_fd (int      fd,
        goffset  offset,
        gsize    size,
        GError **error)
{
  gsize page = (gsize) sysconf (_SC_PAGESIZE);
  gsize slack = (gsize) offset % page;
  gsize length = MAX (size + slack, 1);
  gpointer base;
  CpStorage *self;

  base = mmap (NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset - (goffset) slack);
  if (base == MAP_FAILED)
    {
      int saved_errno = errno;

      g_close (fd, NULL);
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                   "cannot map %" G_GSIZE_FORMAT " bytes at offset %" G_GOFFSET_FORMAT
                   " of fd: %s", size, offset, g_strerror (saved_errno));
      return NULL;
    }
  self = storage_alloc (CP_STORAGE_KIND_FD, &fd_ops, (guint8 *) base + slack, size);
  self->fd = fd;
  self->map_base = base;
  self->map_length = length;
  return self;
}

/**
 * cp_storage_new_shared:
 * @size: the number of bytes
 * @error: return location for a #GError
 *
 * Allocates @size zero-filled bytes in an anonymous memory file (a memfd),
 * so that another process given [method@Cp.Storage.get_fd] can map the same
 * bytes with [ctor@Cp.Storage.new_from_fd] and see every write without a
 * copy.
 *
 * The file is sealed (`F_SEAL_SHRINK`, `F_SEAL_GROW`, `F_SEAL_SEAL`): no
 * holder of the descriptor can change its size, so no process that maps
 * it can be killed by a `SIGBUS` because another one truncated it.
 *
 * Returns: (transfer full): a new storage, or %NULL with an error
 *
 * Since: 1.0
 */
CpStorage *
cp_storage_new_shared (gsize    size,
                       GError **error)
{
  int fd = create_memfd (size, error);

  if (fd < 0)
    return NULL;
  return map_fd (fd, 0, size, error);
}

/**
 * cp_storage_new_from_bytes:
 * @bytes: the bytes to wrap
 *
 * Wraps the contents of @bytes without copying them. The storage keeps a
 * reference on @bytes until it is freed.
 *
 * #GBytes are immutable by contract, and their bytes may be in memory
 * that cannot be written at all (a string constant, a read-only mapping):
 * the storage is read-only ([method@Cp.Storage.get_read_only]). Every
 * operation that would write into a tensor on it — a collective or a
 * receive into it, a `_into` call with it as the output, a DLPack export
 * a consumer could write through — fails with %CP_TENSOR_ERROR_READ_ONLY
 * instead; operations that only read it, and those that give the tensor
 * new memory (sharding it in place when a context enters, padding it in
 * [method@Cp.Batch.prepare]), work as on any tensor. Copy it
 * ([method@Cp.Tensor.copy]) to get a tensor to write into.
 *
 * Returns: (transfer full): a new storage
 *
 * Since: 1.0
 */
CpStorage *
cp_storage_new_from_bytes (GBytes *bytes)
{
  CpStorage *self;
  gsize size;
  gconstpointer data;

  g_return_val_if_fail (bytes != NULL, NULL);

  data = g_bytes_get_data (bytes, &size);
  self = storage_alloc (CP_STORAGE_KIND_BYTES, &bytes_ops, (gpointer) data, size);
  self->bytes = g_bytes_ref (bytes);
  self->read_only = TRUE;
  return self;
}

/**
 * cp_storage_new_borrowed:
 * @address: the address of the first byte
 * @size: the number of bytes
 * @release: (scope notified) (closure user_data) (destroy destroy) (nullable):
 *   called once when no tensor uses the memory any more
 * @user_data: data for @release
 * @destroy: (nullable): frees @user_data after @release ran
 *
 * Wraps memory that belongs to someone else — a numpy array, a buffer of
 * another library — without copying it. The memory must stay valid until
 * @release is called.
 *
 * Returns: (transfer full): a new storage
 *
 * Since: 1.0
 */
CpStorage *
cp_storage_new_borrowed (guintptr       address,
                         gsize          size,
                         CpReleaseFunc  release,
                         gpointer       user_data,
                         GDestroyNotify destroy)
{
  CpStorage *self;

  g_return_val_if_fail (address != 0 || size == 0, NULL);

  self = storage_alloc (CP_STORAGE_KIND_BORROWED, &borrowed_ops,
                        GSIZE_TO_POINTER (address), size);
  self->release = release;
  self->user_data = user_data;
  self->destroy = destroy;
  return self;
}

CpStorage *
_cp_storage_new_dlpack (CpDeviceKind   device,
                        int            device_id,
                        guintptr       address,
                        gsize          size,
                        CpReleaseFunc  release,
                        gpointer       user_data)
{
  CpStorage *self = cp_storage_new_borrowed (address, size, release, user_data, NULL);

  self->kind = CP_STORAGE_KIND_DLPACK;
  self->device = device;
  self->device_id = device_id;
  self->memory = _cp_memory_ops_for_kind (device);
  return self;
}

int
_cp_storage_get_device_id (CpStorage *self)
{
  return self->device_id;
}

guint64
_cp_storage_get_id (CpStorage *self)
{
  return self->id;
}

const CpMemoryOps *
_cp_storage_get_memory (CpStorage *self)
{
  return self->memory;
}

/**
 * cp_storage_new_with_owner:
 * @address: the address of the first byte
 * @size: the number of bytes
 * @owner: an object that keeps the memory valid for as long as it lives
 *
 * Wraps memory that belongs to @owner without copying it. The storage
 * holds a reference on @owner and drops it when no tensor uses the memory
 * any more; nothing else runs then.
 *
 * This is [ctor@Cp.Storage.new_borrowed] without a callback, for bindings
 * where a callback may not run at every moment the last tensor goes away.
 * A PyGObject callback, for one, prints and drops any Python exception
 * already on its way up when it runs, so a temporary tensor freed while a
 * call raises would turn that error into `SystemError`; the Python
 * override's `Cp.Tensor.from_numpy()` therefore keeps the array alive
 * through an owner object, whose last reference PyGObject drops from C.
 *
 * Returns: (transfer full): a new storage of kind
 *   %CP_STORAGE_KIND_BORROWED
 *
 * Since: 1.0
 */
CpStorage *
cp_storage_new_with_owner (guintptr  address,
                           gsize     size,
                           GObject  *owner)
{
  CpStorage *self;

  g_return_val_if_fail (address != 0 || size == 0, NULL);
  g_return_val_if_fail (G_IS_OBJECT (owner), NULL);

  self = storage_alloc (CP_STORAGE_KIND_BORROWED, &owner_ops, GSIZE_TO_POINTER (address), size);
  self->owner = g_object_ref (owner);
  return self;
}

/* Every access past the end of a mapped file raises SIGBUS, so only a
 * file whose size cannot drop below the mapping is mapped: a memfd sealed
 * against shrinking, or a dma-buf, whose size is fixed for its life. */
static gboolean
check_fd_cannot_shrink (int                fd,
                        const struct stat *st,
                        GError           **error)
{
  struct statfs fs;
  int seals;

  if (S_ISREG (st->st_mode))
    {
      seals = fcntl (fd, F_GET_SEALS);
      if (seals >= 0 && (seals & F_SEAL_SHRINK) != 0)
        return TRUE;
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_UNSEALED,
                   "fd %d is a file that another holder could shrink under the mapping (%s), "
                   "killing this process with SIGBUS; pass a memfd sealed with F_SEAL_SHRINK "
                   "(memfd_create with MFD_ALLOW_SEALING, then F_ADD_SEALS), as "
                   "cp_storage_new_shared() makes", fd,
                   seals < 0 ? "it is not a memfd, so it cannot be sealed"
                             : "it has no F_SEAL_SHRINK seal");
      return FALSE;
    }
  if (fstatfs (fd, &fs) == 0 && fs.f_type == DMA_BUF_MAGIC)
    return TRUE;
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_UNSEALED,
               "fd %d is neither a memfd nor a dma-buf (file type %#o); only those can be "
               "mapped without the risk of a SIGBUS", fd, (guint) (st->st_mode & S_IFMT));
  return FALSE;
}

/* A descriptor of an open file, not an O_PATH handle (which gives access
 * to neither the bytes nor the seals); its flags in @flags. */
static gboolean
check_fd_handle (int      fd,
                 int     *flags,
                 GError **error)
{
  if (fd < 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_BAD_FD,
                   "fd %d is not a file descriptor: descriptors are 0 or more", fd);
      return FALSE;
    }
  *flags = fcntl (fd, F_GETFL);
  if (*flags < 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_BAD_FD,
                   "fd %d cannot be used: %s", fd, g_strerror (errno));
      return FALSE;
    }
  if ((*flags & O_PATH) != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_BAD_FD,
                   "fd %d was opened with O_PATH: it names a file but gives access neither to "
                   "its bytes nor to its seals, so it cannot be mapped; pass a descriptor opened "
                   "for reading and writing (the one memfd_create returned, or /proc/self/fd/%d "
                   "opened with O_RDWR)", fd, fd);
      return FALSE;
    }
  return TRUE;
}

/* Tensors are written through their mapping, which needs a descriptor
 * opened for reading and writing. */
static gboolean
check_fd_access_mode (int      fd,
                      int      flags,
                      GError **error)
{
  if ((flags & O_ACCMODE) != O_RDWR)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_BAD_FD,
                   "fd %d was opened %s; tensors write through their mapping, which needs a "
                   "descriptor opened for reading and writing (O_RDWR)", fd,
                   (flags & O_ACCMODE) == O_WRONLY ? "write-only (O_WRONLY)" : "read-only (O_RDONLY)");
      return FALSE;
    }
  return TRUE;
}

static gboolean
check_fd (int      fd,
          goffset  offset,
          gsize    size,
          GError **error)
{
  struct stat st;
  int flags;

  if (!check_fd_handle (fd, &flags, error))
    return FALSE;

  if (fstat (fd, &st) != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                   "cannot stat fd %d: %s", fd, g_strerror (errno));
      return FALSE;
    }
  if (!check_fd_cannot_shrink (fd, &st, error) || !check_fd_access_mode (fd, flags, error))
    return FALSE;
  /* Written so that nothing wraps; dma-bufs report no size through
   * fstat, so for them the range only has to fit in a file offset (their
   * mmap checks the rest), which also keeps map_fd's length from
   * wrapping. */
  if (offset < 0 || (guint64) size > (guint64) (G_MAXINT64 - offset) ||
      (S_ISREG (st.st_mode) &&
       ((guint64) size > (guint64) st.st_size || (guint64) offset > (guint64) st.st_size - size)))
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_RANGE,
                   "fd %d holds %" G_GINT64_FORMAT " bytes, but %" G_GSIZE_FORMAT
                   " bytes at offset %" G_GOFFSET_FORMAT " were asked for",
                   fd, (gint64) st.st_size, size, offset);
      return FALSE;
    }
  return TRUE;
}

/**
 * cp_storage_new_from_fd:
 * @fd: a memfd sealed against shrinking, or a dma-buf
 * @offset: where the bytes start in the file
 * @size: the number of bytes
 * @error: return location for a #GError
 *
 * Maps @size bytes at @offset of @fd, shared with every other mapping of
 * the same file: what another process writes there is visible here without
 * a copy. The storage duplicates @fd; the caller keeps its own.
 *
 * A process that touches a mapped page past the end of its file is killed
 * with `SIGBUS`, so @fd must be a file no one can shrink: a memfd with the
 * `F_SEAL_SHRINK` seal (every [ctor@Cp.Storage.new_shared] memfd has it),
 * or a dma-buf, whose size is fixed. Plain files, unsealed memfds and
 * POSIX shared memory (`shm_open`) are refused; seal a memfd made with
 * `MFD_ALLOW_SEALING` before passing it. For a dma-buf, bracketing CPU
 * access with `DMA_BUF_IOCTL_SYNC` is the exporter's contract and the
 * caller's job.
 *
 * Returns: (transfer full): a new storage, or %NULL with
 *   %CP_TENSOR_ERROR_BAD_FD when @fd is negative, closed, an `O_PATH`
 *   handle or not open for reading and writing,
 *   %CP_TENSOR_ERROR_OUT_OF_RANGE when the file is too short, or
 *   %CP_TENSOR_ERROR_UNSEALED when it could shrink
 *
 * Since: 1.0
 */
CpStorage *
cp_storage_new_from_fd (int      fd,
                        goffset  offset,
                        gsize    size,
                        GError **error)
{
  int own_fd;

  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!check_fd (fd, offset, size, error))
    return NULL;
  own_fd = fcntl (fd, F_DUPFD_CLOEXEC, 3);
  if (own_fd < 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_FAILED,
                   "cannot duplicate fd %d: %s", fd, g_strerror (errno));
      return NULL;
    }
  return map_fd (own_fd, offset, size, error);
}

/**
 * cp_storage_ref:
 * @self: a storage
 *
 * Takes a reference on @self.
 *
 * Returns: (transfer full): @self
 *
 * Since: 1.0
 */
CpStorage *
cp_storage_ref (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, NULL);

  g_atomic_ref_count_inc (&self->ref_count);
  return self;
}

/**
 * cp_storage_unref:
 * @self: (transfer full): a storage
 *
 * Drops a reference on @self, giving the bytes back when it was the last.
 *
 * Since: 1.0
 */
void
cp_storage_unref (CpStorage *self)
{
  g_return_if_fail (self != NULL);

  if (!g_atomic_ref_count_dec (&self->ref_count))
    return;
  self->vtable->release (self);
  g_free (self);
}

/**
 * cp_storage_get_size:
 * @self: a storage
 *
 * Gets the number of bytes of @self.
 *
 * Returns: the size in bytes
 *
 * Since: 1.0
 */
gsize
cp_storage_get_size (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, 0);

  return self->size;
}

/**
 * cp_storage_get_kind:
 * @self: a storage
 *
 * Tells where the bytes of @self come from.
 *
 * Returns: the kind of storage
 *
 * Since: 1.0
 */
CpStorageKind
cp_storage_get_kind (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, CP_STORAGE_KIND_OWNED);

  return self->kind;
}

/**
 * cp_storage_get_device:
 * @self: a storage
 *
 * Tells which kind of memory holds the bytes of @self.
 *
 * Returns: the device kind
 *
 * Since: 1.0
 */
CpDeviceKind
cp_storage_get_device (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, CP_DEVICE_KIND_HOST);

  return self->device;
}

/**
 * cp_storage_get_data_address:
 * @self: a storage
 *
 * Gets the address of the first byte, as an integer that bindings can pass
 * to numpy, ctypes or a device API. The address is valid while @self is.
 *
 * Returns: the address
 *
 * Since: 1.0
 */
guintptr
cp_storage_get_data_address (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, 0);

  return GPOINTER_TO_SIZE (self->data);
}

/**
 * cp_storage_get_data: (skip)
 * @self: a storage
 *
 * Gets a pointer to the first byte, for C callers.
 *
 * Returns: (transfer none): the bytes
 *
 * Since: 1.0
 */
gpointer
cp_storage_get_data (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, NULL);

  return self->data;
}

/**
 * cp_storage_get_fd:
 * @self: a storage
 *
 * Gets the file descriptor behind a %CP_STORAGE_KIND_FD storage. It stays
 * owned by @self: duplicate it to keep it, or pass it to a child process
 * (for example with g_subprocess_launcher_take_fd() after dup()).
 *
 * Returns: the file descriptor, or -1 when the storage has none
 *
 * Since: 1.0
 */
int
cp_storage_get_fd (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, -1);

  return self->fd;
}

/**
 * cp_storage_get_read_only:
 * @self: a storage
 *
 * Tells whether the bytes of @self may only be read: those of a #GBytes
 * ([ctor@Cp.Storage.new_from_bytes]). Operations that would write them
 * fail with %CP_TENSOR_ERROR_READ_ONLY.
 *
 * Returns: %TRUE when no operation may write the bytes
 *
 * Since: 1.0
 */
gboolean
cp_storage_get_read_only (CpStorage *self)
{
  g_return_val_if_fail (self != NULL, FALSE);

  return self->read_only;
}
