/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * job_submit/gpushare: slurmctld's job_submit plugin running the Python submit rules
 * (gpushare.submit.hook), for sites that prefer them to job_submit.lua.
 *
 * The glue only exports the plugin symbols, starts the embedded Python once (isolated,
 * see gs_embed.h), and turns any Python failure into a logged error plus the configured
 * policy. Strings in job_desc belong to slurmctld's allocator: they are replaced with
 * slurm_xfree()/slurm_xstrdup() (exported by libslurmfull, which slurmctld links).
 *
 * This file is #included into the cffi-generated module (submit_hooks/build.py).
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

extern void slurm_error(const char *fmt, ...);
extern void slurm_info(const char *fmt, ...);
extern void slurm_debug(const char *fmt, ...);
extern char *slurm_xstrdup(const char *str);
extern void slurm_xfree(void **ptr);
extern slurm_conf_t slurm_conf; /* slurmctld's configuration (libslurmfull) */

#include "../spank/embed/gs_embed.h"

#define GS_EXPORT __attribute__((visibility("default")))

GS_EXPORT const char plugin_name[] = "gpushare job_submit plugin";
GS_EXPORT const char plugin_type[] = "job_submit/gpushare";
GS_EXPORT const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* Defined by cffi from build.py's embedding_api (the Python side). */
int gpushare_submit_alive(void);
int gpushare_submit_call(int what, void *job_desc, uint32_t uid, char **err_msg);

enum { GS_INIT = 0, GS_SUBMIT = 1, GS_MODIFY = 2, GS_RELOAD = 3 };

static pthread_mutex_t gs_start_lock = PTHREAD_MUTEX_INITIALIZER;
static int gs_ready = 0;
static time_t gs_conf_seen = 0; /* slurm_conf.last_update when the facts were last read */

static void gs_log(int level, const char *msg)
{
    if (level == 0)
        slurm_error("%s", msg);
    else if (level == 1)
        slurm_info("%s", msg);
    else
        slurm_debug("%s", msg);
}

/* Replace a job_desc string with a copy owned by slurmctld's allocator. */
static void gs_replace_str(char **field, const char *value)
{
    slurm_xfree((void **)field);
    *field = value ? slurm_xstrdup(value) : NULL;
}

static void gs_set_err_msg(char **err_msg, const char *value)
{
    if (!err_msg || !value || !*value)
        return;
    slurm_xfree((void **)err_msg);
    *err_msg = slurm_xstrdup(value);
}

static int gs_start(void)
{
    int rc = 0;

    pthread_mutex_lock(&gs_start_lock);
    if (!gs_ready) {
        if (gs_python_start("job_submit/gpushare") < 0 || gpushare_submit_alive() != 42) {
            slurm_error("job_submit/gpushare: the Python core did not load; jobs pass "
                        "unchanged (is gpushare installed in " GS_PYTHONPATH
                        " and python3-cffi installed?)");
            rc = -1;
        } else {
            gs_ready = 1;
        }
    }
    pthread_mutex_unlock(&gs_start_lock);
    return rc;
}

/*
 * slurmctld (22.05) re-inits job_submit plugins on `scontrol reconfigure` only when the
 * plugin list changed, so the facts are read again when slurm.conf was: re-reading it
 * stamps slurm_conf.last_update. One comparison per request, no I/O.
 */
static void gs_reload_if_reconfigured(void)
{
    time_t stamp = slurm_conf.last_update;

    if (stamp == gs_conf_seen)
        return;
    pthread_mutex_lock(&gs_start_lock);
    if (stamp != gs_conf_seen) {
        gs_conf_seen = stamp;
        (void)gpushare_submit_call(GS_RELOAD, NULL, 0, NULL);
    }
    pthread_mutex_unlock(&gs_start_lock);
}

GS_EXPORT int init(void)
{
    if (gs_start() < 0)
        return SLURM_SUCCESS; /* never keep slurmctld from starting */
    gs_conf_seen = slurm_conf.last_update;
    (void)gpushare_submit_call(GS_INIT, NULL, 0, NULL); /* problems are logged; jobs pass */
    return SLURM_SUCCESS;
}

GS_EXPORT int fini(void)
{
    return SLURM_SUCCESS;
}

GS_EXPORT int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid, char **err_msg)
{
    if (!gs_ready && gs_start() < 0)
        return SLURM_SUCCESS;
    gs_reload_if_reconfigured();
    return gpushare_submit_call(GS_SUBMIT, job_desc, submit_uid, err_msg);
}

GS_EXPORT int job_modify(job_desc_msg_t *job_desc, void *job_ptr, uint32_t modify_uid,
                         char **err_msg)
{
    (void)job_ptr;
    if (!gs_ready && gs_start() < 0)
        return SLURM_SUCCESS;
    gs_reload_if_reconfigured();
    return gpushare_submit_call(GS_MODIFY, job_desc, modify_uid, err_msg);
}
