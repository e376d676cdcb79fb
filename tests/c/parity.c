/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The C side of the parity tests (tests/unit/test_c_parity.py): one request a line on
 * stdin, "<op> <argument in hex>", one answer a line on stdout, so that the Python feeds
 * the C the same vectors as its own rules and compares. Text answers are hex too.
 *   stamp <path>        gs_stamp of stat(path), or "-"
 *   proc_start <text>   gs_parse_proc_start: the start time, or "-"
 *   share <text>        gs_parse_share_text
 *   percent <text>      gs_parse_percent
 *   env_name <text>     gs_valid_env_name
 *   env_file <text>     gs_env_file_apply: "<rc> <show|-> <error|-> <NAME=VALUE\n...>"
 *   node <name>         SLURMD_NODENAME for what follows ("" unsets it)
 *   path <value>        gs_copy_path of a plugstack path argument: the path, or "-"
 *   uuid_list <text>    gs_uuid_list
 * spank/gs_args.c is included for its static gs_copy_path; slurm_error is this file's.
 * links: gs_parse.c gs_envfile.c
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../spank/gs_args.c"
#include "gs_parity.h"
#include "gs_parse.h"

void slurm_error(const char *fmt, ...)
{
    (void)fmt;
}

static void put_hex(const char *text)
{
    if (!text) {
        fputs("-", stdout);
        return;
    }
    if (!*text)
        fputs("=", stdout); /* empty, told apart from none */
    for (; *text; text++)
        printf("%02x", (unsigned char)*text);
}

struct sets {
    char *text;
    size_t len;
};

static int collect(void *ctx, const char *name, const char *value)
{
    struct sets *sets = ctx;
    size_t add = strlen(name) + strlen(value) + 2;

    if (!(sets->text = realloc(sets->text, sets->len + add + 1)))
        abort();
    sets->len += (size_t)sprintf(sets->text + sets->len, "%s=%s\n", name, value);
    return 0;
}

int main(void)
{
    char line[1 << 20];

    while (fgets(line, sizeof(line), stdin)) {
        char *space = strchr(line, ' '), *arg;
        line[strcspn(line, "\n")] = '\0';
        if (!space) {
            puts("?");
            fflush(stdout);
            continue;
        }
        *space = '\0';
        arg = gs_unhex(space + 1);
        if (strcmp(line, "stamp") == 0) {
            struct stat st;
            char out[GS_STAMP_MAX];
            if (stat(arg, &st) == 0) {
                gs_stamp(&st, out, sizeof(out));
                put_hex(out);
            } else {
                put_hex(NULL);
            }
        } else if (strcmp(line, "proc_start") == 0) {
            char out[32];
            put_hex(gs_parse_proc_start(arg, out, sizeof(out)) == 0 ? out : NULL);
        } else if (strcmp(line, "share") == 0) {
            printf("%d", gs_parse_share_text(arg));
        } else if (strcmp(line, "percent") == 0) {
            printf("%d", gs_parse_percent(arg));
        } else if (strcmp(line, "env_name") == 0) {
            printf("%d", gs_valid_env_name(arg, strlen(arg)));
        } else if (strcmp(line, "env_file") == 0) {
            struct sets sets = {NULL, 0};
            const char *show, *error;
            int rc = gs_env_file_apply(arg, collect, &sets, &show, &error);
            printf("%d ", rc);
            put_hex(show);
            putchar(' ');
            put_hex(error);
            putchar(' ');
            put_hex(sets.text ? sets.text : "");
            free(sets.text);
        } else if (strcmp(line, "node") == 0) {
            if (*arg)
                setenv("SLURMD_NODENAME", arg, 1);
            else
                unsetenv("SLURMD_NODENAME");
        } else if (strcmp(line, "uuid_list") == 0) {
            printf("%d", gs_uuid_list(arg));
        } else if (strcmp(line, "path") == 0) {
            static char path[PATH_MAX];
            put_hex(gs_copy_path(path, arg, "state_dir") == 0 ? path : NULL);
        } else {
            fputs("?", stdout);
        }
        putchar('\n');
        fflush(stdout);
        free(arg);
    }
    return 0;
}
