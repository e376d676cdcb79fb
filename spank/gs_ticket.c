/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The join ticket's parser (gpushare.node.ticket renders it): pure, so that it can be
 * unit-tested and fuzzed. Every condition that needs the system (a file's stamp, a live
 * process, the job's options) is asked through struct gs_ticket_facts; nothing here calls
 * SPANK or does I/O.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gs_parse.h"

#define GS_KEY_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"

int gs_ticket_line(char **at, char **word, char **value)
{
    char *line = *at, *next;

    if (!line || !*line)
        return 0;
    if ((next = strchr(line, '\n')))
        *next++ = '\0';
    *at = next;
    *word = line;
    if (strncmp(line, "--", 2) == 0) {
        *value = line + strlen(line);
        return 1;
    }
    if (!(*value = strchr(line, ' ')))
        return -1;
    *(*value)++ = '\0';
    return 1;
}

/* "<stamp> <path>" (the stamp has four fields): whether the file is still the one the
 * ticket saw. */
static int gs_file_unchanged(const struct gs_ticket_facts *facts, const char *value)
{
    char now[GS_STAMP_MAX];
    const char *path = value;

    for (int fields = 0; fields < 4 && path; fields++)
        path = strchr(path, ' ') ? strchr(path, ' ') + 1 : NULL;
    if (!path || *path != '/' || facts->stamp(facts->ctx, path, now, sizeof(now)) < 0)
        return 0;
    return strlen(now) == (size_t)(path - 1 - value) &&
           strncmp(value, now, (size_t)(path - 1 - value)) == 0;
}

/* "<pid> <start time>": whether that process still runs. */
static int gs_same_process(const struct gs_ticket_facts *facts, const char *value)
{
    char started[32], *rest;
    long pid;

    errno = 0;
    pid = strtol(value, &rest, 10);
    return !errno && rest != value && *rest == ' ' && pid > 1 &&
           facts->proc_start(facts->ctx, pid, started, sizeof(started)) == 0 &&
           strcmp(rest + 1, started) == 0;
}

/* A plain decimal id equal to want. */
static int gs_same_id(const char *value, uint32_t want)
{
    char *end;
    unsigned long id;

    if (!*value || strspn(value, "0123456789") != strlen(value) || strlen(value) > 10)
        return 0;
    errno = 0;
    id = strtoul(value, &end, 10);
    return !errno && id == want;
}

int gs_ticket_condition(const struct gs_ticket_facts *facts, const char *word, char *value,
                        struct gs_ticket *t, int *args, const char **why)
{
    if (strcmp(word, "key") == 0) {
        *why = "format";
        if (strlen(value) >= GS_KEY_MAX || !*value || value[0] == '.' ||
            strspn(value, GS_KEY_CHARS) != strlen(value))
            return -1;
        snprintf(t->key, sizeof(t->key), "%s", value);
    } else if (strcmp(word, "until") == 0) {
        char *end;
        double until = strtod(value, &end);
        *why = "expired";
        if (end == value || *end || !(facts->now < until))
            return -1;
    } else if (strcmp(word, "uid") == 0 || strcmp(word, "gid") == 0) {
        *why = "user";
        if (!gs_same_id(value, word[0] == 'u' ? facts->uid : facts->gid))
            return -1;
    } else if (strcmp(word, "share") == 0) {
        *why = "format";
        if ((t->share = gs_parse_percent(value)) < 0)
            return -1;
    } else if (strcmp(word, "arg") == 0) {
        *why = "plugstack";
        if (*args >= facts->ac || strcmp(facts->av[(*args)++], value) != 0)
            return -1;
    } else if (strcmp(word, "env") == 0) {
        char *eq = strchr(value, '=');
        const char *have;
        *why = "environment";
        if (!eq)
            return -1;
        *eq = '\0';
        have = facts->getenv(facts->ctx, value);
        if (strcmp(have ? have : "", eq + 1) != 0)
            return -1;
    } else if (strcmp(word, "opt") == 0 || strcmp(word, "noopt") == 0) {
        char *eq = word[0] == 'o' ? strchr(value, '=') : NULL;
        const char *have;
        *why = "options";
        if (word[0] == 'o' && !eq)
            return -1;
        if (eq)
            *eq = '\0';
        have = facts->getopt(facts->ctx, value);
        if (eq ? !have || strcmp(have, eq + 1) != 0 : have != NULL)
            return -1;
    } else if (strcmp(word, "file") == 0) {
        *why = "files";
        if (!gs_file_unchanged(facts, value))
            return -1;
    } else if (strcmp(word, "nofile") == 0) {
        *why = "files";
        if (*value != '/' || !facts->absent(facts->ctx, value))
            return -1;
    } else {
        return 0;
    }
    return 1;
}

int gs_ticket_holds(const struct gs_ticket_facts *facts, char *text, struct gs_ticket *t,
                    const char **why)
{
    char *at, *word, *value;
    const size_t head = strlen(GS_TICKET_FORMAT "\n");
    int args = 0, rc;

    memset(t, 0, sizeof(*t));
    *why = "format";
    if (strncmp(text, GS_TICKET_FORMAT "\n", head) != 0)
        return -1;
    for (at = text + head; (rc = gs_ticket_line(&at, &word, &value)) > 0;) {
        if (strcmp(word, "--record") == 0) {
            *why = "format";
            t->record = at;
            if (!at || !(value = strstr(at, "\n--env\n")))
                return -1;
            *value = '\0';
            t->env = value + 7;
            break;
        }
        if ((rc = gs_ticket_condition(facts, word, value, t, &args, why)) < 0)
            return -1;
        if (rc > 0)
            continue;
        *why = "daemon";
        if (strcmp(word, "daemon") == 0) {
            if (!gs_same_process(facts, value))
                return -1;
        } else if (strcmp(word, "record") == 0) {
            snprintf(t->record_stamp, sizeof(t->record_stamp), "%s", value);
        } else {
            *why = "format";
            return -1; /* a line this glue does not know: a newer worker's ticket */
        }
    }
    *why = "format";
    if (rc < 0 || !t->record || !t->key[0] || !t->record_stamp[0] || t->share < 1 ||
        t->share > 100)
        return -1;
    *why = "plugstack";
    return args == facts->ac ? 0 : -1;
}

char *gs_fill(const char *text, const struct gs_mark *marks, int n)
{
    size_t size = strlen(text) + 1, at_signs = 0, longest = 0;
    const char *at;
    char *out, *to;
    int i;

    for (i = 0; i < n; i++)
        if (strlen(marks[i].value) > longest)
            longest = strlen(marks[i].value);
    for (at = text; (at = strchr(at, '@')); at++)
        at_signs++;
    size += at_signs * longest;
    if (!(out = malloc(size)))
        return NULL;
    for (to = out, at = text; *at;) {
        for (i = 0; *at == '@' && i < n; i++)
            if (strncmp(at, marks[i].mark, strlen(marks[i].mark)) == 0)
                break;
        if (*at != '@' || i == n) {
            *to++ = *at++;
            continue;
        }
        to = stpcpy(to, marks[i].value);
        at += strlen(marks[i].mark);
    }
    *to = '\0';
    return out;
}
