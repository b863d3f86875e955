/* cpmesh-options.c: the commands of cpmesh, their help and their options
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#include <stdio.h>
#include <math.h>

#include "cpmesh-tool.h"

const char * const cpmesh_backend_names[] = { "local", "ucx", NULL };

/* ---- options ---- */

static CpmeshOption *
find_option (CpmeshOption *options,
             const char   *name)
{
  for (CpmeshOption *option = options; option->long_name != NULL; option++)
    if (g_str_has_prefix (name, "--") ? g_str_equal (name + 2, option->long_name)
                                       : name[1] == option->short_name)
      return option;
  g_assert_not_reached ();
}

static gboolean
bad_value (GError     **error,
           const char  *format,
           ...) G_GNUC_PRINTF (2, 3);

static gboolean
bad_value (GError     **error,
           const char  *format,
           ...)
{
  va_list args;

  va_start (args, format);
  g_propagate_error (error, g_error_new_valist (G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                                                format, args));
  va_end (args);
  return FALSE;
}

/* @text as an integer in [min, max]; @item is the number in a list. */
static gboolean
parse_integer (const CpmeshOption  *option,
               const char          *text,
               const char          *item,
               gint64              *value,
               GError             **error)
{
  g_autofree char *what = g_str_equal (item, text) ? g_strdup_printf ("--%s %s", option->long_name, text)
                                       : g_strdup_printf ("--%s %s: %s", option->long_name, text, item);

  if (!g_ascii_string_to_signed (item, 10, G_MININT64, G_MAXINT64, value, NULL))
    return bad_value (error, "%s is not a whole number", what);
  if (*value < option->min)
    return bad_value (error, "%s must be at least %" G_GINT64_FORMAT, what, option->min);
  if (*value > option->max)
    return bad_value (error, "%s must be at most %" G_GINT64_FORMAT, what, option->max);
  return TRUE;
}

static gboolean
parse_list (const CpmeshOption  *option,
            const char          *text,
            GError             **error)
{
  g_auto(GStrv) items = g_strsplit (text, ",", -1);
  GArray **list = option->value;
  g_autoptr(GArray) values = g_array_new (FALSE, FALSE, sizeof (gint64));

  for (char **item = items; *item != NULL; item++)
    {
      gint64 value;

      if (!parse_integer (option, text, *item, &value, error))
        return FALSE;
      g_array_append_val (values, value);
    }
  g_clear_pointer (list, g_array_unref);
  *list = g_steal_pointer (&values);
  return TRUE;
}

static gboolean
parse_double (const CpmeshOption  *option,
              const char          *text,
              GError             **error)
{
  char *end = NULL;
  double value = g_ascii_strtod (text, &end);

  if (end == text || *end != '\0' || !isfinite (value) ||
      value < (double) option->min || value > (double) option->max)
    return bad_value (error, "--%s %s must be a finite number in [%" G_GINT64_FORMAT ", %"
                      G_GINT64_FORMAT "]", option->long_name, text, option->min, option->max);
  *(double *) option->value = value;
  return TRUE;
}

static gboolean
parse_choice (const CpmeshOption  *option,
              const char          *text,
              GError             **error)
{
  g_autofree char *choices = NULL;

  for (int i = 0; option->choices[i] != NULL; i++)
    if (g_str_equal (text, option->choices[i]))
      {
        *(int *) option->value = i;
        return TRUE;
      }
  choices = g_strjoinv (", ", (char **) option->choices);
  return bad_value (error, "--%s %s: use one of %s", option->long_name, text, choices);
}

static gboolean
replace_string (const CpmeshOption *option,
                const char         *text)
{
  char **value = option->value;

  g_free (*value);
  *value = g_strdup (text);
  return TRUE;
}

static gboolean
parse_value (const char  *name,
             const char  *text,
             gpointer     data,
             GError     **error)
{
  CpmeshOption *option = find_option (data, name);
  gint64 value;

  option->given = TRUE;
  switch (option->kind)
    {
    case CPMESH_VALUE_FLAG:
      *(gboolean *) option->value = TRUE;
      return TRUE;
    case CPMESH_VALUE_INT:
      if (!parse_integer (option, text, text, &value, error))
        return FALSE;
      *(int *) option->value = (int) value;
      return TRUE;
    case CPMESH_VALUE_INT64:
      return parse_integer (option, text, text, option->value, error);
    case CPMESH_VALUE_INT64_LIST:
      return parse_list (option, text, error);
    case CPMESH_VALUE_DOUBLE:
      return parse_double (option, text, error);
    case CPMESH_VALUE_CHOICE:
      return parse_choice (option, text, error);
    case CPMESH_VALUE_STRING:
    case CPMESH_VALUE_FILENAME:
      return replace_string (option, text);
    default:
      g_assert_not_reached ();
    }
}

/* Every option goes through parse_value (), so that each is checked and
 * marked as given the same way. */
static GOptionEntry *
option_entries (CpmeshOption *options)
{
  gsize n = 0;
  GOptionEntry *entries;

  while (options[n].long_name != NULL)
    n++;
  entries = g_new0 (GOptionEntry, n + 1);
  for (gsize i = 0; i < n; i++)
    {
      int flags = options[i].kind == CPMESH_VALUE_FLAG ? G_OPTION_FLAG_NO_ARG :
                  options[i].kind == CPMESH_VALUE_FILENAME ? G_OPTION_FLAG_FILENAME : 0;

      entries[i] = (GOptionEntry) { options[i].long_name, options[i].short_name, flags,
                                    G_OPTION_ARG_CALLBACK, (gpointer) parse_value,
                                    options[i].description, options[i].arg_description };
    }
  return entries;
}

gboolean
cpmesh_parse_options (const char     *summary,
                      CpmeshOption   *options,
                      const char     *arguments,
                      int            *argc,
                      char         ***argv)
{
  g_autoptr(GOptionContext) context = g_option_context_new (arguments);
  g_autofree GOptionEntry *entries = option_entries (options);
  GOptionGroup *group = g_option_group_new ("options", "Options", "Show the options",
                                            options, NULL);
  g_autoptr(GError) error = NULL;

  g_option_group_add_entries (group, entries);
  g_option_context_set_main_group (context, group);
  g_option_context_set_summary (context, summary);
  /* A command's own arguments, and their options, follow the first one. */
  g_option_context_set_strict_posix (context, arguments != NULL);
  if (!g_option_context_parse (context, argc, argv, &error))
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "%s", error->message);
      return FALSE;
    }
  if (arguments == NULL && *argc > 1)
    {
      cpmesh_fail (CPMESH_EXIT_USAGE, "unexpected argument “%s”", (*argv)[1]);
      return FALSE;
    }
  return TRUE;
}

gboolean
cpmesh_option_given (const CpmeshOption *options,
                     const char         *long_name)
{
  for (const CpmeshOption *option = options; option->long_name != NULL; option++)
    if (g_str_equal (option->long_name, long_name))
      return option->given;
  g_assert_not_reached ();
}

gboolean
cpmesh_check_divisible (const char *option,
                        gint64      seq_len,
                        int         cp_size)
{
  if (seq_len % (2 * (gint64) cp_size) == 0)
    return TRUE;
  cpmesh_fail (CPMESH_EXIT_USAGE, "%s %" G_GINT64_FORMAT " is not a multiple of 2·C = %d "
               "(--cp %d): head-tail cuts the sequence into 2·C equal chunks", option, seq_len,
               2 * cp_size, cp_size);
  return FALSE;
}

/* ---- commands ---- */

static void
append_commands (GString             *text,
                 const CpmeshCommand *group)
{
  for (gsize i = 0; i < group->n_commands; i++)
    g_string_append_printf (text, "  %-9s %s\n", group->commands[i].name,
                            group->commands[i].summary);
  g_string_append_printf (text, "  %-9s %s\n", "help", "Show the help of a command: help COMMAND");
}

static char *
describe_commands (const CpmeshCommand *group)
{
  GString *text = g_string_new ("Commands:\n");

  append_commands (text, group);
  g_string_append_printf (text, "\nRun “%s help COMMAND” or “%s COMMAND --help” for the "
                          "options of a command.", g_get_prgname (), g_get_prgname ());
  return g_string_free (text, FALSE);
}

/* The options of a group: --help, and --version for the program. */
static GOptionContext *
group_context (const CpmeshCommand *group,
               gboolean            *version)
{
  GOptionContext *context = g_option_context_new ("COMMAND [OPTION…]");
  g_autofree char *description = describe_commands (group);
  const GOptionEntry entries[] = {
    { "version", 0, 0, G_OPTION_ARG_NONE, version, "Show the version of cpmesh and exit", NULL },
    G_OPTION_ENTRY_NULL
  };

  g_option_context_set_summary (context, group->about);
  g_option_context_set_description (context, description);
  if (version != NULL)
    g_option_context_add_main_entries (context, entries, NULL);
  /* Stop at the command name: what follows are the command's options. */
  g_option_context_set_strict_posix (context, TRUE);
  return context;
}

static const CpmeshCommand *
find_command (const CpmeshCommand *group,
              const char          *name)
{
  for (gsize i = 0; i < group->n_commands; i++)
    if (g_str_equal (group->commands[i].name, name))
      return &group->commands[i];
  return NULL;
}

/* From here on, messages and usage lines name "cpmesh … @command". */
static void
enter_command (const CpmeshCommand *command)
{
  g_autofree char *program = g_strdup_printf ("%s %s", g_get_prgname (), command->name);

  g_set_prgname (program);
}

static int run_group (const CpmeshCommand  *group,
                      gboolean              top,
                      int                   argc,
                      char                **argv);

/* `help WORDS…`: the help of the group or command the words name, as its
 * --help prints it. */
static int
show_help (const CpmeshCommand  *group,
           gboolean              top,
           int                   n_words,
           char                **words)
{
  const CpmeshCommand *command;
  char *help_argv[3] = { NULL, (char *) "--help", NULL };
  gboolean version = FALSE;

  if (n_words == 0)
    {
      g_autoptr(GOptionContext) context = group_context (group, top ? &version : NULL);
      g_autofree char *help = g_option_context_get_help (context, TRUE, NULL);

      fputs (help, stdout);
      return 0;
    }
  command = find_command (group, words[0]);
  if (command == NULL)
    return cpmesh_fail (CPMESH_EXIT_USAGE, "help: unknown command “%s”", words[0]);
  if (command->run == NULL)
    {
      enter_command (command);
      return show_help (command, FALSE, n_words - 1, words + 1);
    }
  if (n_words > 1)
    return cpmesh_fail (CPMESH_EXIT_USAGE, "help: “%s” has no command “%s”", words[0], words[1]);
  enter_command (command);
  help_argv[0] = (char *) command->name;
  return command->run (2, help_argv);
}

static int
run_group (const CpmeshCommand  *group,
           gboolean              top,
           int                   argc,
           char                **argv)
{
  gboolean version = FALSE;
  g_autoptr(GOptionContext) context = group_context (group, top ? &version : NULL);
  g_autoptr(GError) error = NULL;
  const CpmeshCommand *command;

  if (!g_option_context_parse (context, &argc, &argv, &error))
    return cpmesh_fail (CPMESH_EXIT_USAGE, "%s", error->message);
  if (version)
    {
      g_print ("%s (libcpmesh) %s\n", g_get_prgname (), CP_VERSION_S);
      return 0;
    }
  if (argc < 2)
    {
      /* A usage error like any other, which names what there is. */
      g_autoptr(GString) commands = g_string_new (NULL);

      append_commands (commands, group);
      g_string_truncate (commands, commands->len - 1);
      return cpmesh_fail (CPMESH_EXIT_USAGE, "no command given; the commands are:\n%s",
                          commands->str);
    }
  if (g_str_equal (argv[1], "help"))
    return show_help (group, top, argc - 2, argv + 2);
  command = find_command (group, argv[1]);
  if (command == NULL)
    return cpmesh_fail (CPMESH_EXIT_USAGE, "unknown command “%s”", argv[1]);
  enter_command (command);
  if (command->run == NULL)
    return run_group (command, FALSE, argc - 1, argv + 1);
  return command->run (argc - 1, argv + 1);
}

int
cpmesh_main (const CpmeshCommand  *program,
             int                   argc,
             char                **argv)
{
  g_set_prgname (program->name);
  cpmesh_progress_start ();
  return run_group (program, TRUE, argc, argv);
}
