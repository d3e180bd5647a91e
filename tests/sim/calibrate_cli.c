/*
 * calibrate_cli.c - `fmoe calibrate` as a standalone program, built from cmd/cmd_calibrate.c,
 * so that tests/python/test_calibrate.py can run the command before (and independently of)
 * its registration in cmd/main.c. Same arguments, same output, same exit codes.
 */
#include "../../cmd/cmd_common.h"

int cmd_calibrate(int argc, char **argv);

int main(int argc, char **argv) {
    cmd_install_log_sink(0);
    return cmd_calibrate(argc, argv);
}
