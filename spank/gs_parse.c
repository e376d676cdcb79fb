/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The small pure parsers of the C glue: a --gpu-share value, a share file, a /proc stat
 * line, a file's stamp, a job's GPU list, whether a device list names UUIDs and whether
 * Slurm holds a job whose prolog failed. No SPANK, no I/O (gs_parse.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gs_parse.h"

int gs_parse_percent(const char *arg)
{
    char *end = NULL;
    long value;

    /* ASCII digits only, as the Python's check on the node: strtol alone would take
     * " 25" and "+25" */
    if (!arg || !*arg || strspn(arg, "0123456789") != strlen(arg))
        return -1;
    errno = 0;
    value = strtol(arg, &end, 10);
    if (errno || *end != '\0' || value < 1 || value > 100)
        return -1;
    return (int)value;
}

int gs_parse_share_text(const char *text)
{
    char *end;
    long share;

    if (!text)
        return -1;
    errno = 0;
    share = strtol(text, &end, 10);
    if (errno || end == text || (*end && strcmp(end, "\n") != 0) || share < 1 || share > 100)
        return -1;
    return (int)share;
}

int gs_parse_proc_start(char *stat_text, char *out, size_t size)
{
    char *fields, *field, *save = NULL;
    int index = 3;

    if (!(fields = strrchr(stat_text, ')')))
        return -1;
    for (field = strtok_r(fields + 1, " ", &save); field; field = strtok_r(NULL, " ", &save)) {
        if (index == 3 && (*field == 'Z' || *field == 'X'))
            return -1;
        if (index++ == 22)
            return snprintf(out, size, "%s", field) < (int)size ? 0 : -1;
    }
    return -1;
}

int gs_parse_proc_parent(const char *stat_text, long *ppid, long *pgrp)
{
    const char *fields = strrchr(stat_text, ')');
    char state;

    if (!fields || sscanf(fields + 1, " %c %ld %ld", &state, ppid, pgrp) != 3 || *ppid < 0 ||
        *pgrp < 0)
        return -1;
    return 0;
}

void gs_stamp(const struct stat *st, char *out, size_t size)
{
    snprintf(out, size, "%llu %llu %lld %lld", (unsigned long long)st->st_dev,
             (unsigned long long)st->st_ino, (long long)st->st_size,
             (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec);
}

int gs_parse_gpu_list(const char *value, long *indices, int max)
{
    const char *at = value;
    char *end;
    int count = 0;

    if (!value || !*value)
        return -1;
    for (;;) {
        if (*at < '0' || *at > '9' || count == max)
            return -1;
        errno = 0;
        indices[count] = strtol(at, &end, 10);
        if (errno || indices[count] > 99999)
            return -1;
        count++;
        if (*end == '\0')
            return count;
        if (*end != ',')
            return -1;
        at = end + 1;
    }
}

int gs_uuid_list(const char *value)
{
    const char *at = value;

    if (!value || !*value)
        return 0;
    for (;;) {
        size_t len = strcspn(at, ",");
        if (len <= 4 || (strncmp(at, "GPU-", 4) != 0 && strncmp(at, "MIG-", 4) != 0))
            return 0;
        if (at[len] == '\0')
            return 1;
        at += len + 1;
    }
}

static int gs_word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
}

int gs_nohold_on_prolog_fail(const char *config)
{
    static const char key[] = "SchedulerParameters", word[] = "nohold_on_prolog_fail";
    const char *line = config, *end, *at;

    for (; line && *line; line = *end ? end + 1 : end) {
        end = line + strcspn(line, "\n");
        if (strncmp(line, key, sizeof(key) - 1) != 0)
            continue;
        at = line + sizeof(key) - 1;
        at += strspn(at, " \t");
        if (*at != '=')
            continue;
        for (at++; (at = strstr(at, word)) && at < end; at += sizeof(word) - 1) {
            const char *after = at + sizeof(word) - 1;
            if (!gs_word_char(at[-1]) && (after >= end || !gs_word_char(*after)))
                return 1;
        }
    }
    return 0;
}
