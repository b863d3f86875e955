/* cp-kernel.c: which kernels compute on which device
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-kernel-private.h"

static const struct
{
  CpDeviceKind device;
  const CpKernel *kernel;
} kernels[] = {
  { CP_DEVICE_KIND_HOST, &_cp_kernel_cpu },
  /* Test memory is host memory the CPU kernel reaches through its
   * kernel address (_cp_memory_kernel_address), as a device's kernels
   * reach device memory. */
  { CP_DEVICE_KIND_TEST, &_cp_kernel_cpu },
};

const CpKernel *
_cp_kernel_for_device (CpDeviceKind device)
{
  for (gsize i = 0; i < G_N_ELEMENTS (kernels); i++)
    if (kernels[i].device == device)
      return kernels[i].kernel;
  return NULL;
}
