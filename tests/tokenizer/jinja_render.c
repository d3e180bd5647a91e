/*
 * jinja_render - renders one template with many variable sets, for the Python tests that
 * compare the interpreter with jinja2 (tests/python/test_chat_jinja.py).
 *
 *   jinja_render TEMPLATE_FILE < cases.jsonl
 *
 * Each input line is a JSON object of template variables; each output line is a JSON
 * object {"text": "..."} or {"error": "...", "code": N}. One process serves a whole folder
 * of cases, so the tests stay fast.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"
#include "jinja.h"

static char *slurp(FILE *f, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *p = malloc(cap);
    size_t r;
    while (p && (r = fread(p + len, 1, cap - len - 1, f)) > 0) {
        len += r;
        if (len + 1 == cap) p = realloc(p, cap *= 2);
    }
    if (p) p[len] = '\0';
    *n = len;
    return p;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: jinja_render TEMPLATE_FILE < cases.jsonl\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    size_t tn;
    char *tmpl = slurp(f, &tn);
    fclose(f);
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    size_t len = 0;
    int ch;
    for (;;) {
        len = 0;
        while ((ch = getchar()) != EOF && ch != '\n') {
            if (len + 2 >= cap) line = realloc(line, cap *= 2);
            line[len++] = (char)ch;
        }
        if (len == 0 && ch == EOF) break;
        line[len] = '\0';
        cJSON *res = cJSON_CreateObject();
        char *out = NULL;
        size_t olen = 0;
        int rc = fmoe__jinja_render(tmpl, line, &out, &olen);
        if (rc == 0) {
            cJSON_AddStringToObject(res, "text", out);
        } else {
            cJSON_AddStringToObject(res, "error", fmoe_error_detail());
            cJSON_AddNumberToObject(res, "code", rc);
        }
        char *s = cJSON_PrintUnformatted(res);
        puts(s);
        fflush(stdout);
        free(s);
        free(out);
        cJSON_Delete(res);
        if (ch == EOF) break;
    }
    free(line);
    free(tmpl);
    return 0;
}
