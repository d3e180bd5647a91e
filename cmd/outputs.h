/*
 * outputs.h - the check that no command writes over a file it reads. It runs in one place,
 * at the end of cmd_options_parse, for every command: the option tables say which values
 * are inputs and which are outputs (cmd_option.io), positional arguments are inputs, and
 * every output is compared with every input by device and inode before any work.
 */
#ifndef FMOE_CMD_OUTPUTS_H
#define FMOE_CMD_OUTPUTS_H

#include "options.h"

/* Checks one OUTPUT against INPUTS. OUTPUT is refused when it is one of INPUTS (the same
 * device and inode, so a hard link or another path to the file counts; an input that is a
 * directory, such as a model directory, stands for every file directly in it, a shard of a
 * split GGUF model for every shard of it (fmoe_gguf_split_path: the names fmoe_gguf_open
 * reads), and a pattern naming no file for each file it matches, as simulate --trace expands
 * it), when
 * OUTPUT.partial is one of them (the writer replaces its partial), and when OUTPUT exists
 * and is not a regular file (a directory, /dev/null). NULL entries of INPUTS are skipped;
 * "-" (standard output) is never refused. Prints one line, "fmoe CMD: output is an input
 * (OUTPUT)", "fmoe CMD: OUTPUT: is a directory" or "fmoe CMD: OUTPUT: exists and is not a
 * regular file". Then OUTPUT's folder must exist and be writable, so that a run fails at
 * once and not after its work: "fmoe CMD: OUTPUT: cannot create: No such file or
 * directory", like the create would say. @return 0, CMD_EXIT_USAGE, or CMD_EXIT_FAILURE
 * (the folder). */
int cmd_check_output(const char *cmd, const char *output, const char *const *inputs,
                     int ninputs);

/* Every output of a parsed command against every input: the values of the rows of
 * spec->options marked CMD_IO_OUTPUT or CMD_IO_OUTPUT_OF_PARTIAL against those marked
 * CMD_IO_INPUT or CMD_IO_MODEL (a CMD_IO_MODEL row left empty stands for the bundled model)
 * and the positional arguments POSITIONAL[0..npos), each with cmd_check_output.
 * cmd_options_parse calls it; base NULL (a command without options) checks nothing.
 * @return 0, CMD_EXIT_USAGE or CMD_EXIT_FAILURE (printed). */
int cmd_check_outputs(const cmd_spec *spec, const void *base, char *const *positional,
                      int npos);

#endif
