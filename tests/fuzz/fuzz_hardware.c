/*
 * fuzz_hardware.c - fuzz target for the hardware profile JSON parser (fmoe_hardware_parse,
 * the parser behind fmoe_hardware_load and --hardware FILE, sim/hardware.c).
 * Invariants: a failure carries a detail; a success has a positive copy bandwidth,
 * finite non-negative costs, and writes back as JSON that parses again to the same link
 * (the inputs in crashes/hardware/ once came back with device fields 0, which the parser
 * refused).
 * Build and run: tests/fuzz/README.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "fmoe/hardware.h"

static void fail(const char *what) {
    fprintf(stderr, "fuzz_hardware: %s (%s)\n", what, fmoe_error_detail());
    abort();
}

static int ok_cost(const fmoe_linear_cost *c) {
    return !c->present || (isfinite(c->base_s) && isfinite(c->per_token_s) &&
                           isfinite(c->per_token_context_s));
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *json = malloc(size ? size : 1); /* exact size, not terminated */
    if (!json) return 0;
    memcpy(json, data, size);
    fmoe_hardware_profile p;
    fmoe_error_clear();
    int rc = fmoe_hardware_parse(json, size, "fuzz.json", &p);
    free(json);
    if (rc < 0) {
        if (!fmoe_error_detail()[0]) fail("error without a detail");
        return 0;
    }
    if (!(p.beta_bytes_per_s > 0) || !isfinite(p.beta_bytes_per_s) || !(p.alpha_s >= 0) ||
        !isfinite(p.alpha_s) || !ok_cost(&p.attention) || !ok_cost(&p.expert) ||
        !ok_cost(&p.head) || !ok_cost(&p.host_expert))
        fail("accepted a profile out of range");
    if (!memchr(p.name, 0, sizeof p.name) || !memchr(p.source, 0, sizeof p.source))
        fail("unterminated string");
    char *back = NULL;
    if (fmoe_hardware_to_json(&p, &back) < 0) fail("cannot write the profile back");
    fmoe_hardware_profile again;
    if (fmoe_hardware_parse(back, strlen(back), "back.json", &again) < 0)
        fail("the profile written back does not parse");
    free(back);
    if (again.beta_bytes_per_s != p.beta_bytes_per_s || again.alpha_s != p.alpha_s)
        fail("the link changed on the way back");
    return 0;
}
