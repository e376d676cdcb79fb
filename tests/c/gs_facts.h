/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The node the ticket tests and the ticket fuzzer see (struct gs_ticket_facts): the job,
 * plugstack line, environment, files and daemon that tests/c/make_corpus.py renders its
 * join tickets for, so that a rendered ticket holds here and each change to it can be
 * shown to break exactly one condition.
 */
#ifndef GS_FACTS_H
#define GS_FACTS_H

#include <stdio.h>
#include <string.h>

#include "gs_parse.h"

static char *gs_test_args[] = {"pythonpath=/usr/lib64/gpushare/python",
                               "state_dir=/run/gpushare/%n", "verify_reuse=60", "show=yes"};

static const char *const gs_test_env[][2] = {
    {"SLURM_JOB_GPUS", "3"},
    {"CUDA_VISIBLE_DEVICES", "3"},
    {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"},
    {"SLURM_CONF", "/etc/slurm/slurm.conf"},
    {"SLURMD_NODENAME", "n1"},
};

/* path, stamp: the files that exist; every other path is absent */
static const char *const gs_test_files[][2] = {
    {"/etc/slurm/gres.conf", "2049 131075 412 1699999000123456789"},
    {"/run/gpushare/n1/slurm-checked", "25 17 0 1700000000000000000"},
};

static const char *gs_test_getenv(void *ctx, const char *name)
{
    (void)ctx;
    for (size_t i = 0; i < sizeof(gs_test_env) / sizeof(gs_test_env[0]); i++)
        if (strcmp(gs_test_env[i][0], name) == 0)
            return gs_test_env[i][1];
    return NULL;
}

static const char *gs_test_getopt(void *ctx, const char *name)
{
    (void)ctx;
    return strcmp(name, "gpu-share") == 0 ? "25" : NULL;
}

static int gs_test_stamp(void *ctx, const char *path, char *out, size_t size)
{
    (void)ctx;
    for (size_t i = 0; i < sizeof(gs_test_files) / sizeof(gs_test_files[0]); i++)
        if (strcmp(gs_test_files[i][0], path) == 0)
            return snprintf(out, size, "%s", gs_test_files[i][1]) < (int)size ? 0 : -1;
    return -1;
}

static int gs_test_absent(void *ctx, const char *path)
{
    char stamp[GS_STAMP_MAX];
    return gs_test_stamp(ctx, path, stamp, sizeof(stamp)) < 0;
}

static int gs_test_proc_start(void *ctx, long pid, char *out, size_t size)
{
    (void)ctx;
    if (pid != 4242)
        return -1;
    return snprintf(out, size, "987654") < (int)size ? 0 : -1;
}

/* The facts of job 4711 of uid 1001 at 1700000000 (the rendered tickets hold until
 * 1700000060.25). */
static struct gs_ticket_facts gs_test_facts(void)
{
    struct gs_ticket_facts facts = {
        .ctx = NULL, .now = 1700000000.0, .uid = 1001, .gid = 1001,
        .ac = (int)(sizeof(gs_test_args) / sizeof(gs_test_args[0])), .av = gs_test_args,
        .getenv = gs_test_getenv, .getopt = gs_test_getopt, .stamp = gs_test_stamp,
        .absent = gs_test_absent, .proc_start = gs_test_proc_start};
    return facts;
}

#endif
