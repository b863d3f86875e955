/* cp-thd-options.c
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include "config.h"

#include "cp-enum-types.h"
#include "cp-thd-options.h"

/**
 * CpThdOptions:
 *
 * The options of [method@Cp.Batch.to_thd], the arguments of the reference
 * `make_cp_batch_for_te` besides the batch and the mesh:
 *
 * - [property@Cp.ThdOptions:qkv-format]: only `"thd"` is supported;
 * - [property@Cp.ThdOptions:num-chunks]: split the batch rows into this many
 *   chunks, each converted on its own and stacked;
 * - [property@Cp.ThdOptions:seq-lens-padding-value]: the sentinel that marks
 *   unused entries of `seq_lens` and pads the stacked `cu_seqlens`;
 * - [property@Cp.ThdOptions:padding-mask-rule] and
 *   [property@Cp.ThdOptions:padding-token-id]: how `padding_mask` is made.
 *
 * In Python: `Cp.ThdOptions(num_chunks=2, padding_token_id=99)`.
 *
 * Since: 1.0
 */
struct _CpThdOptions
{
  GObject parent_instance;

  char *qkv_format;
  gint64 padding_token_id;
  int num_chunks;
  gint64 seq_lens_padding_value;
  CpPaddingMaskRule padding_mask_rule;
};

G_DEFINE_FINAL_TYPE (CpThdOptions, cp_thd_options, G_TYPE_OBJECT)

enum {
  PROP_0,
  PROP_QKV_FORMAT,
  PROP_PADDING_TOKEN_ID,
  PROP_NUM_CHUNKS,
  PROP_SEQ_LENS_PADDING_VALUE,
  PROP_PADDING_MASK_RULE,
  N_PROPS
};

static GParamSpec *properties[N_PROPS];

static void
cp_thd_options_finalize (GObject *object)
{
  CpThdOptions *self = (CpThdOptions *) object;

  g_free (self->qkv_format);

  G_OBJECT_CLASS (cp_thd_options_parent_class)->finalize (object);
}

static void
cp_thd_options_get_property (GObject    *object,
                             guint       prop_id,
                             GValue     *value,
                             GParamSpec *pspec)
{
  CpThdOptions *self = CP_THD_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_QKV_FORMAT:
      g_value_set_string (value, self->qkv_format);
      break;
    case PROP_PADDING_TOKEN_ID:
      g_value_set_int64 (value, self->padding_token_id);
      break;
    case PROP_NUM_CHUNKS:
      g_value_set_int (value, self->num_chunks);
      break;
    case PROP_SEQ_LENS_PADDING_VALUE:
      g_value_set_int64 (value, self->seq_lens_padding_value);
      break;
    case PROP_PADDING_MASK_RULE:
      g_value_set_enum (value, self->padding_mask_rule);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

static void
cp_thd_options_set_property (GObject      *object,
                             guint         prop_id,
                             const GValue *value,
                             GParamSpec   *pspec)
{
  CpThdOptions *self = CP_THD_OPTIONS (object);

  switch (prop_id)
    {
    case PROP_QKV_FORMAT:
      cp_thd_options_set_qkv_format (self, g_value_get_string (value));
      break;
    case PROP_PADDING_TOKEN_ID:
      cp_thd_options_set_padding_token_id (self, g_value_get_int64 (value));
      break;
    case PROP_NUM_CHUNKS:
      cp_thd_options_set_num_chunks (self, g_value_get_int (value));
      break;
    case PROP_SEQ_LENS_PADDING_VALUE:
      cp_thd_options_set_seq_lens_padding_value (self, g_value_get_int64 (value));
      break;
    case PROP_PADDING_MASK_RULE:
      cp_thd_options_set_padding_mask_rule (self, g_value_get_enum (value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
    }
}

#define RW_FLAGS (G_PARAM_READWRITE | G_PARAM_EXPLICIT_NOTIFY | G_PARAM_STATIC_STRINGS)

static void
cp_thd_options_class_init (CpThdOptionsClass *klass)
{
  GObjectClass *object_class = G_OBJECT_CLASS (klass);

  object_class->finalize = cp_thd_options_finalize;
  object_class->get_property = cp_thd_options_get_property;
  object_class->set_property = cp_thd_options_set_property;

  /**
   * CpThdOptions:qkv-format:
   *
   * The target format. Only `"thd"` is supported; anything else makes
   * [method@Cp.Batch.to_thd] fail with %CP_BATCH_ERROR_UNSUPPORTED_FORMAT.
   *
   * Since: 1.0
   */
  properties[PROP_QKV_FORMAT] =
    g_param_spec_string ("qkv-format", NULL, NULL, "thd", RW_FLAGS);

  /**
   * CpThdOptions:padding-token-id:
   *
   * The token id of padding, used by %CP_PADDING_MASK_RULE_TOKEN_ID.
   *
   * Since: 1.0
   */
  properties[PROP_PADDING_TOKEN_ID] =
    g_param_spec_int64 ("padding-token-id", NULL, NULL, G_MININT64, G_MAXINT64, 0, RW_FLAGS);

  /**
   * CpThdOptions:num-chunks:
   *
   * How many chunks of consecutive batch rows to convert separately; it
   * must divide the batch size. With more than one, every output gains a
   * leading chunk dimension.
   *
   * Since: 1.0
   */
  properties[PROP_NUM_CHUNKS] =
    g_param_spec_int ("num-chunks", NULL, NULL, 1, G_MAXINT, 1, RW_FLAGS);

  /**
   * CpThdOptions:seq-lens-padding-value:
   *
   * The sentinel of unused `seq_lens` entries, and the value that pads the
   * stacked `cu_seqlens` of chunks with fewer documents.
   *
   * Since: 1.0
   */
  properties[PROP_SEQ_LENS_PADDING_VALUE] =
    g_param_spec_int64 ("seq-lens-padding-value", NULL, NULL, G_MININT64, G_MAXINT64, -1000,
                        RW_FLAGS);

  /**
   * CpThdOptions:padding-mask-rule:
   *
   * How `padding_mask` is computed.
   *
   * Since: 1.0
   */
  properties[PROP_PADDING_MASK_RULE] =
    g_param_spec_enum ("padding-mask-rule", NULL, NULL,
                       CP_TYPE_PADDING_MASK_RULE, CP_PADDING_MASK_RULE_LAYOUT, RW_FLAGS);

  g_object_class_install_properties (object_class, N_PROPS, properties);
}

static void
cp_thd_options_init (CpThdOptions *self)
{
  self->qkv_format = g_strdup ("thd");
  self->num_chunks = 1;
  self->seq_lens_padding_value = -1000;
}

/**
 * cp_thd_options_new:
 *
 * Creates options with the reference defaults: format `"thd"`, padding
 * token 0, one chunk, sentinel −1000, padding mask from the layout.
 *
 * Returns: (transfer full): new options
 *
 * Since: 1.0
 */
CpThdOptions *
cp_thd_options_new (void)
{
  return g_object_new (CP_TYPE_THD_OPTIONS, NULL);
}

/**
 * cp_thd_options_get_qkv_format:
 * @self: options
 *
 * Gets [property@Cp.ThdOptions:qkv-format].
 *
 * Returns: the format
 *
 * Since: 1.0
 */
const char *
cp_thd_options_get_qkv_format (CpThdOptions *self)
{
  g_return_val_if_fail (CP_IS_THD_OPTIONS (self), NULL);

  return self->qkv_format;
}

/**
 * cp_thd_options_set_qkv_format:
 * @self: options
 * @qkv_format: the format
 *
 * Sets [property@Cp.ThdOptions:qkv-format].
 *
 * Since: 1.0
 */
void
cp_thd_options_set_qkv_format (CpThdOptions *self,
                               const char   *qkv_format)
{
  g_return_if_fail (CP_IS_THD_OPTIONS (self));
  g_return_if_fail (qkv_format != NULL);

  if (g_strcmp0 (self->qkv_format, qkv_format) == 0)
    return;
  g_free (self->qkv_format);
  self->qkv_format = g_strdup (qkv_format);
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_QKV_FORMAT]);
}

/**
 * cp_thd_options_get_padding_token_id:
 * @self: options
 *
 * Gets [property@Cp.ThdOptions:padding-token-id].
 *
 * Returns: the padding token id
 *
 * Since: 1.0
 */
gint64
cp_thd_options_get_padding_token_id (CpThdOptions *self)
{
  g_return_val_if_fail (CP_IS_THD_OPTIONS (self), 0);

  return self->padding_token_id;
}

/**
 * cp_thd_options_set_padding_token_id:
 * @self: options
 * @padding_token_id: the padding token id
 *
 * Sets [property@Cp.ThdOptions:padding-token-id].
 *
 * Since: 1.0
 */
void
cp_thd_options_set_padding_token_id (CpThdOptions *self,
                                     gint64        padding_token_id)
{
  g_return_if_fail (CP_IS_THD_OPTIONS (self));

  if (self->padding_token_id == padding_token_id)
    return;
  self->padding_token_id = padding_token_id;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_PADDING_TOKEN_ID]);
}

/**
 * cp_thd_options_get_num_chunks:
 * @self: options
 *
 * Gets [property@Cp.ThdOptions:num-chunks].
 *
 * Returns: the number of chunks
 *
 * Since: 1.0
 */
int
cp_thd_options_get_num_chunks (CpThdOptions *self)
{
  g_return_val_if_fail (CP_IS_THD_OPTIONS (self), 1);

  return self->num_chunks;
}

/**
 * cp_thd_options_set_num_chunks:
 * @self: options
 * @num_chunks: at least 1
 *
 * Sets [property@Cp.ThdOptions:num-chunks].
 *
 * Since: 1.0
 */
void
cp_thd_options_set_num_chunks (CpThdOptions *self,
                               int           num_chunks)
{
  g_return_if_fail (CP_IS_THD_OPTIONS (self));
  g_return_if_fail (num_chunks >= 1);

  if (self->num_chunks == num_chunks)
    return;
  self->num_chunks = num_chunks;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_NUM_CHUNKS]);
}

/**
 * cp_thd_options_get_seq_lens_padding_value:
 * @self: options
 *
 * Gets [property@Cp.ThdOptions:seq-lens-padding-value].
 *
 * Returns: the sentinel
 *
 * Since: 1.0
 */
gint64
cp_thd_options_get_seq_lens_padding_value (CpThdOptions *self)
{
  g_return_val_if_fail (CP_IS_THD_OPTIONS (self), -1000);

  return self->seq_lens_padding_value;
}

/**
 * cp_thd_options_set_seq_lens_padding_value:
 * @self: options
 * @value: the sentinel
 *
 * Sets [property@Cp.ThdOptions:seq-lens-padding-value].
 *
 * Since: 1.0
 */
void
cp_thd_options_set_seq_lens_padding_value (CpThdOptions *self,
                                           gint64        value)
{
  g_return_if_fail (CP_IS_THD_OPTIONS (self));

  if (self->seq_lens_padding_value == value)
    return;
  self->seq_lens_padding_value = value;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_SEQ_LENS_PADDING_VALUE]);
}

/**
 * cp_thd_options_get_padding_mask_rule:
 * @self: options
 *
 * Gets [property@Cp.ThdOptions:padding-mask-rule].
 *
 * Returns: the rule
 *
 * Since: 1.0
 */
CpPaddingMaskRule
cp_thd_options_get_padding_mask_rule (CpThdOptions *self)
{
  g_return_val_if_fail (CP_IS_THD_OPTIONS (self), CP_PADDING_MASK_RULE_LAYOUT);

  return self->padding_mask_rule;
}

/**
 * cp_thd_options_set_padding_mask_rule:
 * @self: options
 * @rule: the rule
 *
 * Sets [property@Cp.ThdOptions:padding-mask-rule].
 *
 * Since: 1.0
 */
void
cp_thd_options_set_padding_mask_rule (CpThdOptions      *self,
                                      CpPaddingMaskRule  rule)
{
  g_return_if_fail (CP_IS_THD_OPTIONS (self));
  g_return_if_fail (rule == CP_PADDING_MASK_RULE_LAYOUT || rule == CP_PADDING_MASK_RULE_TOKEN_ID);

  if (self->padding_mask_rule == rule)
    return;
  self->padding_mask_rule = rule;
  g_object_notify_by_pspec (G_OBJECT (self), properties[PROP_PADDING_MASK_RULE]);
}
