/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The tasks' environment file's parser, pure: <state_dir>/jobs/<id>.env as
 * gpushare.node.state.JobRecord.to_env_file writes it. "KEY=VALUE" lines, plus
 * "#error=<text>" (the job's request was refused) and "#show=<text>" (the line the user
 * reads). gs_taskenv.c reads the file and hands each variable to spank_setenv.
 */
#define _GNU_SOURCE
#include <string.h>

#include "gs_parse.h"

int gs_valid_env_name(const char *name, size_t len)
{
    if (len == 0 || len > 128)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9')))
            return 0;
    }
    return 1;
}

int gs_env_file_apply(char *text, int (*set)(void *ctx, const char *name, const char *value),
                      void *ctx, const char **show, const char **error)
{
    char *save = NULL;

    *show = NULL;
    *error = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = '\0';
        if (strcmp(line, "#error") == 0) {
            *error = eq + 1;
            return -1;
        }
        if (strcmp(line, "#show") == 0) {
            *show = eq + 1;
            continue;
        }
        if (!gs_valid_env_name(line, strlen(line)))
            continue;
        if (set(ctx, line, eq + 1) != 0) {
            *error = line;
            return -2;
        }
    }
    return 0;
}
