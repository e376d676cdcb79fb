/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What the SPANK plugin lends the Python core for one callback: the SPANK handle and the
 * few SPANK calls the core makes. The plugin (no libpython) loads the core
 * (spank_gpushare_core.so, libpython) only when a job uses gpushare, and passes this.
 */
#ifndef GS_HOST_H
#define GS_HOST_H

#include <stdint.h>

/* Log levels of gs_host.log; gpushare.common.log maps Python's levels onto them. */
enum { GS_LOG_ERROR = 0, GS_LOG_INFO = 1, GS_LOG_VERBOSE = 2, GS_LOG_DEBUG = 3, GS_LOG_USER = 4 };

/* The core's cffi cdef is this declaration, read from here by spank/build.py: keep it
 * plain C declarations, with no comments or macros inside the braces. deadline: when the
 * C glue kills the process that runs the callback (CLOCK_MONOTONIC seconds, Python's
 * time.monotonic), 0 for none; every wait of the Python takes only the time left. */
struct gs_host {
    void *sp;
    void (*log)(int level, const char *msg);
    int (*job_ids)(void *sp, uint32_t *job_id, uint32_t *uid, uint32_t *gid);
    const char *(*getopt)(void *sp, const char *name);
    double deadline;
};

/* Exported by the core. */
typedef int (*gs_core_start_f)(void);
typedef int (*gs_core_dispatch_f)(const char *callback, struct gs_host *host, int ac, char **av);
typedef void (*gs_core_prefork_f)(const char *state_dir, const char *code, int ac, char **av);

#endif
