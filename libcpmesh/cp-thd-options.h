/* cp-thd-options.h
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#if !defined(CP_INSIDE) && !defined(CP_COMPILATION)
# error "Only <libcpmesh.h> can be included directly."
#endif

#include <glib-object.h>

#include "cp-types.h"

G_BEGIN_DECLS

/**
 * CpPaddingMaskRule:
 * @CP_PADDING_MASK_RULE_LAYOUT: a position is padding when it lies between
 *   its document's real end and padded end (the default)
 * @CP_PADDING_MASK_RULE_TOKEN_ID: a position is padding when its token id
 *   equals [property@Cp.ThdOptions:padding-token-id], the reference's rule,
 *   which also masks real tokens that share the padding id
 *
 * How [method@Cp.Batch.to_thd] computes `padding_mask`.
 *
 * Since: 1.0
 */
typedef enum
{
  CP_PADDING_MASK_RULE_LAYOUT,
  CP_PADDING_MASK_RULE_TOKEN_ID,
} CpPaddingMaskRule;

#define CP_TYPE_THD_OPTIONS (cp_thd_options_get_type ())

CP_AVAILABLE_IN_ALL
G_DECLARE_FINAL_TYPE (CpThdOptions, cp_thd_options, CP, THD_OPTIONS, GObject)

CP_AVAILABLE_IN_ALL
CpThdOptions      *cp_thd_options_new                       (void) G_GNUC_WARN_UNUSED_RESULT;

CP_AVAILABLE_IN_ALL
const char        *cp_thd_options_get_qkv_format            (CpThdOptions      *self);
CP_AVAILABLE_IN_ALL
void               cp_thd_options_set_qkv_format            (CpThdOptions      *self,
                                                             const char        *qkv_format);
CP_AVAILABLE_IN_ALL
gint64             cp_thd_options_get_padding_token_id      (CpThdOptions      *self);
CP_AVAILABLE_IN_ALL
void               cp_thd_options_set_padding_token_id      (CpThdOptions      *self,
                                                             gint64             padding_token_id);
CP_AVAILABLE_IN_ALL
int                cp_thd_options_get_num_chunks            (CpThdOptions      *self);
CP_AVAILABLE_IN_ALL
void               cp_thd_options_set_num_chunks            (CpThdOptions      *self,
                                                             int                num_chunks);
CP_AVAILABLE_IN_ALL
gint64             cp_thd_options_get_seq_lens_padding_value (CpThdOptions     *self);
CP_AVAILABLE_IN_ALL
void               cp_thd_options_set_seq_lens_padding_value (CpThdOptions     *self,
                                                             gint64             value);
CP_AVAILABLE_IN_ALL
CpPaddingMaskRule  cp_thd_options_get_padding_mask_rule     (CpThdOptions      *self);
CP_AVAILABLE_IN_ALL
void               cp_thd_options_set_padding_mask_rule     (CpThdOptions      *self,
                                                             CpPaddingMaskRule  rule);

G_END_DECLS
