/* cp-memory-host.c: host memory behind the memory interface
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
#include "cp-fault-private.h"
#include "cp-memory-private.h"
#include "cp-sync-private.h"

/* SSE2 is part of x86-64; other targets copy with memcpy alone. */
#if defined(__x86_64__)
# define HAVE_STREAMING_STORES 1
# include <immintrin.h>
#endif

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

/* The largest last-level cache one core shares on current server parts
 * (an AMD CCX's L3).  sysconf's figure is not used: on AMD it is the
 * whole package's, many times what one core can keep. */
#define STREAMING_THRESHOLD ((gsize) 32 << 20)

#define LINE 64

gboolean
_cp_copy_wants_streaming (gsize total_bytes)
{
#ifdef HAVE_STREAMING_STORES
  return total_bytes >= STREAMING_THRESHOLD;
#else
  return FALSE;
#endif
}

#ifdef HAVE_STREAMING_STORES

/* @dst is 64-byte aligned and @n a multiple of 64. */
static void
stream_lines_sse2 (guint8       *dst,
                   const guint8 *src,
                   gsize         n)
{
  for (gsize i = 0; i < n; i += LINE)
    {
      const __m128i *s = (const __m128i *) (src + i);
      __m128i *d = (__m128i *) (dst + i);
      __m128i a = _mm_loadu_si128 (s), b = _mm_loadu_si128 (s + 1);
      __m128i c = _mm_loadu_si128 (s + 2), e = _mm_loadu_si128 (s + 3);

      _mm_stream_si128 (d, a);
      _mm_stream_si128 (d + 1, b);
      _mm_stream_si128 (d + 2, c);
      _mm_stream_si128 (d + 3, e);
    }
}

/* Wider loads keep more lines in flight: about 20% faster than SSE2 where
 * the CPU has AVX2. */
__attribute__((target ("avx2"))) static void
stream_lines_avx2 (guint8       *dst,
                   const guint8 *src,
                   gsize         n)
{
  for (gsize i = 0; i < n; i += LINE)
    {
      const __m256i *s = (const __m256i *) (src + i);
      __m256i *d = (__m256i *) (dst + i);
      __m256i a = _mm256_loadu_si256 (s), b = _mm256_loadu_si256 (s + 1);

      _mm256_stream_si256 (d, a);
      _mm256_stream_si256 (d + 1, b);
    }
}

typedef void (*StreamFunc) (guint8 *dst, const guint8 *src, gsize n);

static StreamFunc
choose_stream_func (void)
{
  static gsize chosen = 0;

  if (g_once_init_enter (&chosen))
    {
      __builtin_cpu_init ();
      g_once_init_leave (&chosen, __builtin_cpu_supports ("avx2")
                                    ? (gsize) stream_lines_avx2 : (gsize) stream_lines_sse2);
    }
  return (StreamFunc) chosen;
}

/* Ordinary stores up to the first cache line boundary of @dst and after
 * the last whole line; streaming stores in between. */
static void
copy_streaming (guint8       *dst,
                const guint8 *src,
                gsize         n)
{
  gsize head = MIN (n, (LINE - ((guintptr) dst % LINE)) % LINE);
  gsize body = (n - head) / LINE * LINE;

  memcpy (dst, src, head);
  choose_stream_func () (dst + head, src + head, body);
  memcpy (dst + head + body, src + head + body, n - head - body);
  _mm_sfence ();
}

#endif

void
_cp_copy (gpointer      dst,
          gconstpointer src,
          gsize         n,
          gboolean      streaming)
{
  /* Empty tensors may have no data pointer, which memcpy must not see. */
  if (n == 0)
    return;
#ifdef HAVE_STREAMING_STORES
  if (streaming)
    {
      copy_streaming (dst, src, n);
      return;
    }
#endif
  memcpy (dst, src, n);
}

static gboolean
host_copy_2d (int                device_id,
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
  /* Rows that follow each other without a gap are one copy. */
  if (height > 1 && dst_pitch == width && src_pitch == width)
    {
      width *= height;
      height = 1;
    }
  for (gsize row = 0; row < height; row++)
    _cp_copy ((guint8 *) dst + row * dst_pitch, (const guint8 *) src + row * src_pitch, width,
              streaming);
  return TRUE;
}

/* Writes the pattern once, then doubles the filled prefix with memcpy:
 * log2(count) calls instead of one per element.  memcpy needs no
 * alignment. */
static gboolean
host_fill (int            device_id,
           gpointer       dst,
           gconstpointer  pattern,
           gsize          pattern_size,
           gsize          count,
           GError       **error)
{
  guint8 *bytes = dst;
  gsize total = pattern_size * count;
  gsize filled;

  if (total == 0)
    return TRUE;
  memcpy (bytes, pattern, pattern_size);
  for (filled = pattern_size; filled < total; filled *= 2)
    memcpy (bytes + filled, bytes, MIN (filled, total - filled));
  return TRUE;
}

static gboolean
host_synchronize (int      device_id,
                  GError **error)
{
  return TRUE;
}

static gpointer
host_alloc (gsize     size,
            gboolean  zeroed,
            int      *device_id,
            GError  **error)
{
  *device_id = 0;
  return _cp_host_alloc (size, zeroed, error);
}

static void
host_free (int      device_id,
           gpointer address,
           gsize    size)
{
  _cp_host_free (address, size);
}

const CpMemoryOps _cp_memory_host_ops = {
  .kind = CP_DEVICE_KIND_HOST,
  .name = "host",
  .alloc = host_alloc,
  .free = host_free,
  .copy_2d = host_copy_2d,
  .fill = host_fill,
  .synchronize = host_synchronize,
};
