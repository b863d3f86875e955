/* cp-ucx-address.c: checking a peer's UCX worker address before UCX reads it
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include <math.h>
#include <string.h>

#include "cp-error.h"
#include "cp-ucx-wire-private.h"

/* A worker address is the one blob of a peer that UCX itself parses
 * (ucp_ep_create → ucp_address_unpack).  UCX 1.13 trusts it: a version
 * it does not know is an assertion that aborts the process, lengths are
 * followed past the end of the buffer, a transport entry without a
 * device address hands a NULL device address to the transport (TCP
 * dereferences it), and a device index past 127 overflows an array of
 * wireup's lane selection.  The bootstrap proves who sent a blob, not
 * that it is well formed, so every blob is walked here first, the way
 * src/ucp/wireup/address.c of UCX 1.13 unpacks a worker address
 * (non-unified mode; the unpack flags of ucp_ep_create: worker uuid and
 * name, device, interface and endpoint addresses, system device):
 *
 *   header       version in the low 4 bits: 0 (v1: flags in the high 4
 *                bits) or 1 (v2: flags in the next byte)
 *   uuid         8 bytes, always in v1, with its flag in v2
 *   client id    8 bytes, with its flag
 *   name         a length byte and that many bytes, with the debug flag
 *   devices      0xff alone for none, else until one has the LAST flag:
 *                md index byte (0x80: no transports; v2: 0x7f extends),
 *                device length byte (0x80 LAST, 0x40 paths, 0x20 system
 *                device; v2: 0x1f extends), paths, system device, the
 *                device address, then its transports until LAST:
 *                name checksum (2 bytes), attributes (v1 16 bytes, v2 8),
 *                interface length byte (0x80 LAST, 0x40 endpoint
 *                addresses; v2: 0x3f extends), the interface address
 *
 * Anything else is refused: a version, flag or trailing byte UCX 1.13
 * would not produce, endpoint addresses (a worker address never carries
 * any), more devices or transports than UCX holds, a bandwidth UCX would
 * refuse or that is not a number.  And for a transport this rank has
 * too — the same name checksum — the device and interface addresses
 * must have the lengths this rank's own address gives them, since the
 * transport reads them as its own kind.  The bytes of those addresses
 * are the transport's to read, and are not checked. */

#define VERSION_MASK 0x0f
#define VERSION_V1 0
#define VERSION_V2 1
#define FLAG_DEBUG_INFO 0x01
#define FLAG_WORKER_UUID 0x02
#define FLAG_CLIENT_ID 0x04
#define FLAG_AM_ONLY 0x08
#define NULL_RESOURCE 0xff
#define MD_EMPTY_DEV 0x80
#define MD_MASK_V1 0x1f
#define MD_MASK_V2 0x7f
#define MAX_MDS 64
#define LAST 0x80
#define DEV_NUM_PATHS 0x40
#define DEV_SYS_DEVICE 0x20
#define DEV_LEN_MASK 0x1f
#define IFACE_HAS_EP_ADDR 0x40
#define IFACE_LEN_MASK 0x3f
#define ATTR_SIZE_V1 16
#define ATTR_SIZE_V2 8
#define MAX_RESOURCES 128

typedef struct
{
  const guint8 *data;
  gsize size;
  gsize pos;
  guint version;
  GError **error;
} Reader;

static gboolean
refuse (Reader     *reader,
        const char *format,
        ...) G_GNUC_PRINTF (2, 3);

static gboolean
refuse (Reader     *reader,
        const char *format,
        ...)
{
  va_list args;
  g_autofree char *why = NULL;

  va_start (args, format);
  why = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (reader->error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed UCX worker address of %" G_GSIZE_FORMAT " bytes: %s (at byte %" G_GSIZE_FORMAT ")",
               reader->size, why, reader->pos);
  return FALSE;
}

/* Takes @n bytes, or refuses the address for ending before them. */
static gboolean
take (Reader        *reader,
      gsize          n,
      const char    *what,
      const guint8 **out)
{
  if (reader->size - reader->pos < n)
    return refuse (reader, "it ends inside its %s", what);
  if (out != NULL)
    *out = reader->data + reader->pos;
  reader->pos += n;
  return TRUE;
}

static gboolean
take_byte (Reader     *reader,
           const char *what,
           guint8     *value)
{
  const guint8 *at = NULL;

  if (!take (reader, 1, what, &at))
    return FALSE;
  *value = *at;
  return TRUE;
}

/* A value of @mask's bits of @byte; in v2, all of them set means the
 * value is the next byte. */
static gboolean
take_extended (Reader     *reader,
               guint8      byte,
               guint8      mask,
               const char *what,
               guint      *value)
{
  guint8 extended = 0;

  *value = byte & mask;
  if (reader->version == VERSION_V1 || *value != mask)
    return TRUE;
  if (!take_byte (reader, what, &extended))
    return FALSE;
  *value = extended;
  return TRUE;
}

static gboolean
read_header (Reader *reader)
{
  guint8 header = 0, flags = 0, name_length = 0;

  if (!take_byte (reader, "header", &header))
    return FALSE;
  reader->version = header & VERSION_MASK;
  if (reader->version == VERSION_V1)
    flags = header >> 4;
  else if (reader->version != VERSION_V2)
    return refuse (reader, "address version %u, where UCX 1.13 knows 0 and 1", reader->version);
  else if (!take_byte (reader, "flags", &flags))
    return FALSE;
  if ((flags & ~(FLAG_DEBUG_INFO | FLAG_WORKER_UUID | FLAG_CLIENT_ID | FLAG_AM_ONLY)) != 0)
    return refuse (reader, "header flags 0x%02x", flags);
  /* UCX reads a v1 address's worker id whatever its flags say. */
  if ((reader->version == VERSION_V1 || (flags & FLAG_WORKER_UUID)) && !take (reader, 8, "worker id", NULL))
    return FALSE;
  if ((flags & FLAG_CLIENT_ID) && !take (reader, 8, "client id", NULL))
    return FALSE;
  if ((flags & FLAG_DEBUG_INFO) &&
      (!take_byte (reader, "worker name", &name_length) || !take (reader, name_length, "worker name", NULL)))
    return FALSE;
  return TRUE;
}

/* The bandwidth UCX reads of v1 attributes: it refuses one that is not
 * positive; one that is not a number would steer its choice of lanes. */
static gboolean
check_attributes (Reader       *reader,
                  const guint8 *attributes)
{
  gfloat bandwidth;
  guint32 bits;

  if (reader->version != VERSION_V1)
    return TRUE;
  memcpy (&bits, attributes + 4, sizeof bits);
  memcpy (&bandwidth, &bits, sizeof bandwidth);
  if (isfinite (bandwidth) && bandwidth > 0)
    return TRUE;
  return refuse (reader, "a transport's bandwidth is %g", (double) bandwidth);
}

static gboolean
read_transport (Reader             *reader,
                guint               device_length,
                GArray             *entries,
                gboolean           *last)
{
  CpUcxAddressEntry entry = { 0, device_length, 0 };
  const guint8 *checksum = NULL, *attributes = NULL;
  guint8 length_byte = 0;
  guint iface_length = 0;

  if (!take (reader, 2, "transport name checksum", &checksum) ||
      !take (reader, reader->version == VERSION_V1 ? ATTR_SIZE_V1 : ATTR_SIZE_V2, "transport attributes",
             &attributes) ||
      !check_attributes (reader, attributes) ||
      !take_byte (reader, "interface address length", &length_byte) ||
      !take_extended (reader, length_byte, IFACE_LEN_MASK, "interface address length", &iface_length) ||
      !take (reader, iface_length, "interface address", NULL))
    return FALSE;
  if (length_byte & IFACE_HAS_EP_ADDR)
    return refuse (reader, "it carries endpoint addresses, which no worker address has");
  memcpy (&entry.checksum, checksum, sizeof entry.checksum);
  entry.iface_length = iface_length;
  g_array_append_val (entries, entry);
  *last = (length_byte & LAST) != 0;
  return TRUE;
}

static gboolean
read_device (Reader   *reader,
             guint     index,
             GArray   *entries,
             gboolean *last)
{
  guint8 md_byte = 0, length_byte = 0, paths = 1, system_device = 0;
  guint md_index = 0, device_length = 0;
  gboolean last_transport = FALSE;

  if (index >= MAX_RESOURCES)
    return refuse (reader, "more than %d devices", MAX_RESOURCES);
  if (!take_byte (reader, "memory domain", &md_byte) ||
      !take_extended (reader, md_byte, reader->version == VERSION_V1 ? MD_MASK_V1 : MD_MASK_V2,
                      "memory domain", &md_index))
    return FALSE;
  if (md_index >= MAX_MDS)
    return refuse (reader, "memory domain %u, where UCX has at most %d", md_index, MAX_MDS);
  if (!take_byte (reader, "device address length", &length_byte) ||
      !take_extended (reader, length_byte, DEV_LEN_MASK, "device address length", &device_length) ||
      ((length_byte & DEV_NUM_PATHS) && !take_byte (reader, "number of paths", &paths)) ||
      ((length_byte & DEV_SYS_DEVICE) && !take_byte (reader, "system device", &system_device)) ||
      !take (reader, device_length, "device address", NULL))
    return FALSE;
  if (paths == 0)
    return refuse (reader, "a device of 0 paths");
  *last = (length_byte & LAST) != 0;
  if (md_byte & MD_EMPTY_DEV)
    return TRUE;
  while (!last_transport)
    {
      if (entries->len >= MAX_RESOURCES)
        return refuse (reader, "more than %d transports", MAX_RESOURCES);
      if (!read_transport (reader, device_length, entries, &last_transport))
        return FALSE;
    }
  return TRUE;
}

GArray *
_cp_ucx_address_parse (const guint8  *data,
                       gsize          size,
                       GError       **error)
{
  Reader reader = { data, size, 0, 0, error };
  g_autoptr(GArray) entries = g_array_new (FALSE, FALSE, sizeof (CpUcxAddressEntry));
  gboolean last = FALSE;
  guint8 first = 0;

  if (!read_header (&reader))
    return NULL;
  if (!take_byte (&reader, "first device", &first))
    return NULL;
  if (first != NULL_RESOURCE)
    {
      reader.pos--;
      for (guint index = 0; !last; index++)
        if (!read_device (&reader, index, entries, &last))
          return NULL;
    }
  if (reader.pos != size)
    {
      refuse (&reader, "%" G_GSIZE_FORMAT " bytes follow its end", size - reader.pos);
      return NULL;
    }
  return g_steal_pointer (&entries);
}

static gboolean
same_kind (const CpUcxAddressEntry *a,
           const CpUcxAddressEntry *b)
{
  return a->device_length == b->device_length && a->iface_length == b->iface_length;
}

/* A transport of @peer that this rank has too must have a form of it
 * that this rank's address has. */
static const CpUcxAddressEntry *
find_stranger_form (GArray *peer,
                    GArray *own)
{
  for (guint i = 0; i < peer->len; i++)
    {
      const CpUcxAddressEntry *theirs = &g_array_index (peer, CpUcxAddressEntry, i);
      gboolean known = FALSE, matched = FALSE;

      for (guint j = 0; j < own->len; j++)
        {
          const CpUcxAddressEntry *ours = &g_array_index (own, CpUcxAddressEntry, j);

          if (ours->checksum != theirs->checksum)
            continue;
          known = TRUE;
          matched |= same_kind (ours, theirs);
        }
      if (known && !matched)
        return theirs;
    }
  return NULL;
}

gboolean
_cp_ucx_address_check (GBytes  *address,
                       GBytes  *own,
                       GError **error)
{
  gsize size = 0, own_size = 0;
  const guint8 *data = g_bytes_get_data (address, &size);
  const guint8 *own_data = g_bytes_get_data (own, &own_size);
  g_autoptr(GArray) theirs = _cp_ucx_address_parse (data, size, error);
  g_autoptr(GArray) ours = NULL;
  const CpUcxAddressEntry *stranger;

  if (theirs == NULL)
    return FALSE;
  ours = _cp_ucx_address_parse (own_data, own_size, NULL);
  g_return_val_if_fail (ours != NULL, FALSE);
  stranger = find_stranger_form (theirs, ours);
  if (stranger == NULL)
    return TRUE;
  g_set_error (error, CP_MESH_ERROR, CP_MESH_ERROR_TRANSPORT,
               "a malformed UCX worker address of %" G_GSIZE_FORMAT " bytes: its transport with name "
               "checksum 0x%04x has a device address of %u bytes and an interface address of %u, "
               "which this rank's UCX never gives that transport", size, stranger->checksum,
               stranger->device_length, stranger->iface_length);
  return FALSE;
}
