/* cp-host-memory.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cp-error.h"
#include "cp-host-memory-private.h"
#include "cp-sync-private.h"
#include "cp-fault-private.h"

/* Below this size malloc's own arenas already reuse warm memory. */
#define LARGE_BLOCK (1u << 20)
#define BLOCK_GRAIN ((gsize) 64 << 10)
#define ALIGNMENT 64

typedef struct
{
  gpointer data;
  gsize capacity;
} Block;

static CpMutex cache_lock = CP_MUTEX_INIT;
static GQueue cache_blocks = G_QUEUE_INIT; /* of Block*, oldest first */
static gsize cache_bytes;
static gsize cache_limit = G_MAXSIZE; /* G_MAXSIZE: not read yet */

/* A quarter of physical memory, at least 1 GiB: enough for the working
 * set of a training step (an all-gather backward keeps C times the local
 * K/V), bounded so that idle cached pages never crowd out the rest of the
 * machine.  PyTorch's caching allocator keeps everything until asked. */
static guint64
default_cache_mib (void)
{
  long pages = sysconf (_SC_PHYS_PAGES);
  long page_size = sysconf (_SC_PAGESIZE);
  guint64 quarter = pages > 0 && page_size > 0 ? ((guint64) pages * (guint64) page_size) >> 22 : 0;

  return MAX (quarter, 1024);
}

static gsize
read_cache_limit (void)
{
  const char *env = g_getenv ("CPMESH_HOST_CACHE_MB");
  guint64 mib = default_cache_mib ();

  if (env != NULL && !g_ascii_string_to_unsigned (env, 10, 0, 1 << 20, &mib, NULL))
    {
      mib = default_cache_mib ();
      g_warning ("CPMESH_HOST_CACHE_MB=%s is not a number of mebibytes; using %" G_GUINT64_FORMAT,
                 env, mib);
    }
  return (gsize) mib << 20;
}

static gsize
round_to_grain (gsize size)
{
  return (size + BLOCK_GRAIN - 1) & ~(BLOCK_GRAIN - 1);
}

/* Takes the oldest cached block of exactly @capacity bytes: workloads
 * repeat the same shapes, so exact matches are the common case and no
 * memory is wasted on near fits. */
static gpointer
cache_take (gsize capacity)
{
  gpointer data = NULL;

  _cp_mutex_lock (&cache_lock);
  for (GList *l = cache_blocks.head; l != NULL; l = l->next)
    {
      Block *block = l->data;

      if (block->capacity == capacity)
        {
          data = block->data;
          cache_bytes -= block->capacity;
          g_queue_delete_link (&cache_blocks, l);
          g_free (block);
          break;
        }
    }
  _cp_mutex_unlock (&cache_lock);
  return data;
}

static void
unmap_block (gpointer data,
             gsize    capacity)
{
  munmap (data, capacity);
}

static gpointer
map_block (gsize    capacity,
           GError **error)
{
  gpointer data = mmap (NULL, capacity, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

  if (data == MAP_FAILED)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY,
                   "could not allocate %" G_GSIZE_FORMAT " bytes of host memory: %s",
                   capacity, g_strerror (errno));
      return NULL;
    }
#ifdef MADV_HUGEPAGE
  madvise (data, capacity, MADV_HUGEPAGE);
#endif
  return data;
}

static gpointer
alloc_small (gsize     size,
             gboolean  zeroed,
             GError  **error)
{
  gpointer data = NULL;

  if (posix_memalign (&data, ALIGNMENT, MAX (size, 1)) != 0)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY,
                   "could not allocate %" G_GSIZE_FORMAT " bytes of host memory", size);
      return NULL;
    }
  if (zeroed)
    memset (data, 0, size);
  return data;
}

gpointer
_cp_host_alloc (gsize     size,
                gboolean  zeroed,
                GError  **error)
{
  gsize capacity;
  gpointer data;

  if (_cp_fault_allocation_fails ())
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY,
                   "could not allocate %" G_GSIZE_FORMAT " bytes of host memory: an injected fault",
                   size);
      return NULL;
    }
  if (size < LARGE_BLOCK)
    return alloc_small (size, zeroed, error);

  capacity = round_to_grain (size);
  if (capacity < size)
    {
      g_set_error (error, CP_TENSOR_ERROR, CP_TENSOR_ERROR_OUT_OF_MEMORY,
                   "cannot allocate %" G_GSIZE_FORMAT " bytes", size);
      return NULL;
    }
  data = cache_take (capacity);
  if (data == NULL)
    return map_block (capacity, error); /* fresh anonymous pages are zero */
  if (zeroed)
    memset (data, 0, size);
  return data;
}

static void
cache_evict_locked (void)
{
  while (cache_bytes > cache_limit && !g_queue_is_empty (&cache_blocks))
    {
      Block *block = g_queue_pop_head (&cache_blocks);

      cache_bytes -= block->capacity;
      unmap_block (block->data, block->capacity);
      g_free (block);
    }
}

void
_cp_host_free (gpointer data,
               gsize    size)
{
  Block *block;

  if (data == NULL)
    return;
  if (size < LARGE_BLOCK)
    {
      free (data);
      return;
    }

  block = g_new (Block, 1);
  block->data = data;
  block->capacity = round_to_grain (size);

  _cp_mutex_lock (&cache_lock);
  if (cache_limit == G_MAXSIZE)
    cache_limit = read_cache_limit ();
  g_queue_push_tail (&cache_blocks, block);
  cache_bytes += block->capacity;
  cache_evict_locked ();
  _cp_mutex_unlock (&cache_lock);
}
