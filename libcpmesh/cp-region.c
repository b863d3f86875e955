/* cp-region.c: the memory a transport moves, named by its storage
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-region-private.h"
#include "cp-storage-private.h"

void
_cp_region_init (CpRegion  *region,
                 CpStorage *storage,
                 gsize      offset,
                 gsize      length)
{
  g_assert (storage != NULL);
  g_assert (offset <= cp_storage_get_size (storage) &&
            length <= cp_storage_get_size (storage) - offset);

  region->storage = cp_storage_ref (storage);
  region->offset = offset;
  region->length = length;
  region->device = cp_storage_get_device (storage);
}

/* Borrowed storage over the buffer, with nothing to release: the caller
 * frees the buffer after clearing the region. */
void
_cp_region_init_host (CpRegion *region,
                      gpointer  address,
                      gsize     length)
{
  g_autoptr(CpStorage) storage = NULL;

  /* An empty buffer may have no address. */
  g_assert (address != NULL || length == 0);
  storage = cp_storage_new_borrowed (GPOINTER_TO_SIZE (address), length, NULL, NULL, NULL);
  _cp_region_init (region, storage, 0, length);
}

void
_cp_region_clear (CpRegion *region)
{
  g_clear_pointer (&region->storage, cp_storage_unref);
  *region = CP_REGION_NONE;
}

gpointer
_cp_region_get_address (const CpRegion *region)
{
  guint8 *data;

  if (region->storage == NULL)
    return NULL;
  data = cp_storage_get_data (region->storage);
  /* An empty GBytes has no data at all: there is nothing to offset. */
  return data != NULL ? data + region->offset : NULL;
}

guint64
_cp_region_get_storage_id (const CpRegion *region)
{
  return region->storage != NULL ? _cp_storage_get_id (region->storage) : 0;
}
