/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The pure parsers of the C glue: the join ticket (gs_ticket.c), the tasks' environment
 * file (gs_envfile.c) and the small files and fields root reads (gs_parse.c). None of them
 * calls SPANK or does I/O: what they check against comes in as data and callbacks, so a
 * test program or a fuzzer links them without Slurm. Nothing here includes <slurm/spank.h>.
 */
#ifndef GS_PARSE_H
#define GS_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* The names shared with the Python (GS_TICKET_FORMAT, the marks, ...) come from the header
 * spank/build.py generates; a test build writes it with `spank/build.py --header PATH`
 * and compiles with -include PATH. */
#ifndef GS_CONSTANTS_H
#error "compile with -include the header that spank/build.py --header writes"
#endif

#define GS_KEY_MAX 256           /* a daemon key, as gpushare.node.mps.record writes it */
#define GS_TICKET_MAX (64 * 1024) /* the largest ticket read */
#define GS_STAMP_MAX 96

/* ---- gs_parse.c ---------------------------------------------------------------------- */

/* --gpu-share's value: a whole percent 1..100, or -1. */
int gs_parse_percent(const char *arg);
/* A share file's text ("<1-100>" and at most one newline): the percent, or -1. */
int gs_parse_share_text(const char *text);
/* /proc/<pid>/stat's text (changed in place): its start time (field 22) into out; -1 for
 * none, a zombie or a dead process. */
int gs_parse_proc_start(char *stat_text, char *out, size_t size);
/* /proc/<pid>/stat's text: its parent (field 4) and process group (field 5) into ppid and
 * pgrp; -1 when the text does not read so. */
int gs_parse_proc_parent(const char *stat_text, long *ppid, long *pgrp);
/* "<dev> <ino> <size> <mtime in ns>", as gpushare.node.ticket.stamp prints a stat. */
void gs_stamp(const struct stat *st, char *out, size_t size);
/* SLURM_JOB_GPUS as a list of indices (0..99999) into indices: their count, or -1 when it
 * is not a plain list or holds more than max. */
int gs_parse_gpu_list(const char *value, long *indices, int max);
/* Whether a CUDA_VISIBLE_DEVICES value names its devices by UUID only ("GPU-..." or
 * "MIG-..." items, as Slurm 26.05's gres.conf Flags=env_uuid and MIG slices write it): an
 * MPS client may keep such a list, an index list is renumbered by the daemon. 1 or 0. */
int gs_uuid_list(const char *value);
/* `scontrol show config`'s text: whether its SchedulerParameters holds
 * nohold_on_prolog_fail (a job whose prolog failed is requeued without a hold), as
 * gpushare.node.drain.requeue_job reads it. 1 or 0. */
int gs_nohold_on_prolog_fail(const char *config);

/* ---- gs_ticket.c: the join ticket (gpushare.node.ticket describes its format) -------- */

/* What a ticket is checked against: the job's ids, arguments and options, the clock, and
 * the file system and /proc behind callbacks, each given ctx. */
struct gs_ticket_facts {
    void *ctx;
    double now; /* seconds since the epoch */
    uint32_t uid, gid;
    int ac;
    char **av;
    const char *(*getenv)(void *ctx, const char *name);
    /* an option's value: "" for a flag, NULL when the job does not use it */
    const char *(*getopt)(void *ctx, const char *name);
    /* a file's stamp (gs_stamp) into out: 0, or -1 when it cannot be stat()ed */
    int (*stamp)(void *ctx, const char *path, char *out, size_t size);
    /* 1 when absent (ENOENT), 0 otherwise */
    int (*absent)(void *ctx, const char *path);
    /* a live process's start time into out: 0, or -1 */
    int (*proc_start)(void *ctx, long pid, char *out, size_t size);
};

struct gs_ticket {
    char key[GS_KEY_MAX];
    char record_stamp[GS_STAMP_MAX];
    int share;
    const char *record; /* the job record with its marks */
    const char *env;    /* the tasks' environment file */
};

/* The next "word value" line of a ticket's text at *at (split in place, *at moved past
 * it): 1 with word and value, 0 at the end, -1 for a line without a value. A line that
 * starts a section ("--record") comes back as its word with an empty value. */
int gs_ticket_line(char **at, char **word, char **value);
/* One condition line, split into word and value (changed in place): 1 when it holds, -1
 * (and *why) when it does not, 0 when the word is not a condition. *args counts the "arg"
 * lines seen. */
int gs_ticket_condition(const struct gs_ticket_facts *facts, const char *word, char *value,
                        struct gs_ticket *t, int *args, const char **why);
/* Check every condition of a join ticket's text (split in place): 0 when they all hold,
 * -1 and *why (a word for the debug log) when not. */
int gs_ticket_holds(const struct gs_ticket_facts *facts, char *text, struct gs_ticket *t,
                    const char **why);

struct gs_mark {
    const char *mark, *value;
};
/* text with each of the n marks replaced by its value (free() it); NULL without memory. */
char *gs_fill(const char *text, const struct gs_mark *marks, int n);

/* ---- gs_envfile.c: the tasks' environment file (gpushare.node.state.JobRecord) ------- */

/* Whether name (len bytes) is a variable name the file may set. */
int gs_valid_env_name(const char *name, size_t len);
/* Apply text (changed in place): set() for each "KEY=VALUE" line with a valid name, in
 * order; *show the "#show=" text or NULL. 0 when done; -1 with *error the "#error=" text
 * (the job's request was refused); -2 when set() fails (*error the variable's name). */
int gs_env_file_apply(char *text, int (*set)(void *ctx, const char *name, const char *value),
                      void *ctx, const char **show, const char **error);

#endif
