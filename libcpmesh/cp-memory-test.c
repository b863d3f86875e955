/* cp-memory-test.c: test memory, reachable only through the memory interface
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cp-error.h"
#include "cp-memory-private.h"
#include "cp-sync-private.h"
#include "cp-fault-private.h"

/* CP_DEVICE_KIND_TEST plays a device on a machine without one, as
 * Aravis's fake camera plays a camera.  Each allocation is one memfd
 * mapped twice: the address tensors show is a PROT_NONE mapping, so code
 * above the memory interface that reads or writes it as host memory dies
 * with SIGSEGV at the first byte; this file reaches the same bytes through
 * a second, writable mapping, as a GPU's copy engine reaches its own
 * memory.  Test memory is for tests: allocations are found by a linear
 * search, which is plenty for the few a test holds. */

typedef struct
{
  guint8 *visible; /* PROT_NONE: what tensors show */
  guint8 *shadow;  /* the same pages, readable and writable */
  gsize length;
} Mapping;

static CpMutex mappings_lock = CP_MUTEX_INIT;
static GArray *mappings; /* of Mapping */

static gsize
page_rounded (gsize size)
{
  gsize page = (gsize) sysconf (_SC_PAGESIZE);

  return (MAX (size, 1) + page - 1) / page * page;
}

static void
set_alloc_error (GError     **error,
                 gsize        size,
                 const char  *reason)
{
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY,
               "could not allocate %" G_GSIZE_FORMAT " bytes of test memory: %s", size, reason);
}

/* Maps @fd twice; the file stays alive through its mappings alone. */
static gboolean
map_twice (int      fd,
           Mapping *mapping)
{
  mapping->shadow = mmap (NULL, mapping->length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapping->shadow == MAP_FAILED)
    return FALSE;
  mapping->visible = mmap (NULL, mapping->length, PROT_NONE, MAP_SHARED, fd, 0);
  if (mapping->visible == MAP_FAILED)
    {
      munmap (mapping->shadow, mapping->length);
      return FALSE;
    }
  return TRUE;
}

static void
remember (const Mapping *mapping)
{
  _cp_mutex_lock (&mappings_lock);
  if (mappings == NULL)
    mappings = g_array_new (FALSE, FALSE, sizeof (Mapping));
  g_array_append_vals (mappings, mapping, 1);
  _cp_mutex_unlock (&mappings_lock);
}

/* The byte an allocation that need not be zeroed starts filled with:
 * an output an operation forgets to write then holds garbage (0xa5a5…
 * is a huge integer and a float of about -2.9e-16, never 0 or 1), as
 * device memory may, instead of the zeros of a fresh memfd, which would
 * hide the mistake. */
#define UNZEROED_BYTE 0xa5

/* A fresh memfd is zero-filled, so @zeroed needs no work; otherwise the
 * bytes are made garbage on purpose. */
static gpointer
test_alloc (gsize     size,
            gboolean  zeroed,
            int      *device_id,
            GError  **error)
{
  Mapping mapping = { NULL, NULL, page_rounded (size) };
  int fd;

  *device_id = 0;
  if (_cp_fault_allocation_fails ())
    {
      set_alloc_error (error, size, "an injected fault");
      return NULL;
    }
#ifdef HAVE_MEMFD_CREATE
  fd = memfd_create ("cpmesh-test-memory", MFD_CLOEXEC);
#else
  fd = -1;
  errno = ENOSYS;
#endif
  if (fd < 0 || ftruncate (fd, (off_t) mapping.length) != 0 || !map_twice (fd, &mapping))
    {
      int saved_errno = errno;

      if (fd >= 0)
        close (fd);
      set_alloc_error (error, size, g_strerror (saved_errno));
      return NULL;
    }
  close (fd);
  if (!zeroed)
    memset (mapping.shadow, UNZEROED_BYTE, mapping.length);
  remember (&mapping);
  return mapping.visible;
}

/* The mapping that holds [@address, @address + @extent), or abort: an
 * address that is not test memory handed to test memory's operations is
 * a bug in the caller.
 *
 * An empty view may start just past the end of its mapping, but the
 * kernel address of any tensor is asked with no extent, and mappings are
 * often adjacent: the end of one is then the start of the next.  The
 * mapping that holds @address wins; the one it ends is only a fallback,
 * or a tensor's kernels would compute on the pages after another
 * tensor's. */
static Mapping
find_mapping (gconstpointer address,
              gsize         extent)
{
  const guint8 *start = address;
  Mapping found = { NULL, NULL, 0 };

  _cp_mutex_lock (&mappings_lock);
  for (guint i = 0; mappings != NULL && i < mappings->len; i++)
    {
      Mapping *mapping = &g_array_index (mappings, Mapping, i);

      if (start >= mapping->visible && start < mapping->visible + mapping->length)
        {
          found = *mapping;
          break;
        }
      if (extent == 0 && start == mapping->visible + mapping->length)
        found = *mapping;
    }
  _cp_mutex_unlock (&mappings_lock);
  if (found.visible == NULL || extent > (gsize) (found.visible + found.length - start))
    g_error ("%p (+%" G_GSIZE_FORMAT " bytes) is not test memory", address, extent);
  return found;
}

static void
test_free (int      device_id,
           gpointer address,
           gsize    size)
{
  _cp_mutex_lock (&mappings_lock);
  for (guint i = 0; mappings != NULL && i < mappings->len; i++)
    {
      Mapping *mapping = &g_array_index (mappings, Mapping, i);

      if (mapping->visible == address)
        {
          munmap (mapping->visible, mapping->length);
          munmap (mapping->shadow, mapping->length);
          g_array_remove_index_fast (mappings, i);
          break;
        }
    }
  _cp_mutex_unlock (&mappings_lock);
}

/* The writable twin of @address, checked to hold @extent bytes. */
static guint8 *
shadow_of (gconstpointer address,
           gsize         extent)
{
  Mapping mapping = find_mapping (address, extent);

  return mapping.shadow + ((const guint8 *) address - mapping.visible);
}

static gsize
extent_2d (gsize pitch,
           gsize width,
           gsize height)
{
  return (height - 1) * pitch + width;
}

/* The rules of cudaMemcpy2DAsync, so that code above the memory
 * interface that would pass a CUDA device a pitch it refuses fails here
 * too, on machines without one. */
static gboolean
check_pitches (gsize     dst_pitch,
               gsize     src_pitch,
               gsize     width,
               gsize     height,
               GError  **error)
{
  if (height <= 1 ||
      (dst_pitch >= width && src_pitch >= width &&
       dst_pitch <= CP_MEMORY_TEST_MAX_PITCH && src_pitch <= CP_MEMORY_TEST_MAX_PITCH))
    return TRUE;
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
               "a 2-D copy of %" G_GSIZE_FORMAT " rows of %" G_GSIZE_FORMAT " bytes in test "
               "memory with destination pitch %" G_GSIZE_FORMAT " and source pitch %"
               G_GSIZE_FORMAT ": pitches must lie in [width, %" G_GSIZE_FORMAT "], as a "
               "CUDA device's do", height, width, dst_pitch, src_pitch, CP_MEMORY_TEST_MAX_PITCH);
  return FALSE;
}

/* An injected fault: the copy or fill that a failing device would have
 * refused. */
static gboolean
device_works (const char  *what,
              GError     **error)
{
  if (!_cp_fault_device_fails ())
    return TRUE;
  g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_DEVICE,
               "%s in test memory failed: an injected device fault", what);
  return FALSE;
}

static gboolean
test_copy_2d (int                device_id,
              gpointer           dst,
              gsize              dst_pitch,
              gconstpointer      src,
              gsize              src_pitch,
              gsize              width,
              gsize              height,
              CpMemoryDirection  direction,
              gboolean           streaming,
              GError           **error)
{
  if (width == 0 || height == 0)
    return TRUE;
  if (!check_pitches (dst_pitch, src_pitch, width, height, error) ||
      !device_works ("a copy", error))
    return FALSE;
  if (direction != CP_MEMORY_DEVICE_TO_HOST)
    dst = shadow_of (dst, extent_2d (dst_pitch, width, height));
  if (direction != CP_MEMORY_HOST_TO_DEVICE)
    src = shadow_of (src, extent_2d (src_pitch, width, height));
  return _cp_memory_host_ops.copy_2d (device_id, dst, dst_pitch, src, src_pitch, width, height,
                                      direction, streaming, error);
}

static gboolean
test_fill (int            device_id,
           gpointer       dst,
           gconstpointer  pattern,
           gsize          pattern_size,
           gsize          count,
           GError       **error)
{
  if (count == 0)
    return TRUE;
  if (!device_works ("a fill", error))
    return FALSE;
  return _cp_memory_host_ops.fill (device_id, shadow_of (dst, pattern_size * count), pattern,
                                   pattern_size, count, error);
}

/* Copies complete before they return. */
static gboolean
test_synchronize (int      device_id,
                  GError **error)
{
  return TRUE;
}

static gsize
test_max_pitch (int device_id)
{
  return CP_MEMORY_TEST_MAX_PITCH;
}

/* The CPU kernels compute on test memory through its writable twin. */
static gpointer
test_kernel_address (gpointer address)
{
  return shadow_of (address, 0);
}

const CpMemoryOps _cp_memory_test_ops = {
  .kind = CP_DEVICE_KIND_TEST,
  .name = "test",
  .alloc = test_alloc,
  .free = test_free,
  .max_pitch = test_max_pitch,
  .copy_2d = test_copy_2d,
  .fill = test_fill,
  .synchronize = test_synchronize,
  .kernel_address = test_kernel_address,
};
