/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * gpushare SPANK plugin (spank_gpushare.so): the SPANK symbols, the option table and what
 * each callback does in each Slurm context. The C glue in front of the Python core.
 *
 * What it does, and why each part must be C:
 *   - the option table (--gpu-share, --gpu-mps), values checked where the user typed them:
 *     srun, sbatch and salloc load this plugin, and must not start Python for it;
 *   - the plugstack arguments (gs_args.c), checked in every context, slurmd's included,
 *     against the key list generated from gpushare.node.config;
 *   - a fast exit for jobs that do not use gpushare: this plugin does not link libpython,
 *     and loads the core (gs_core.c) only when a job needs it, never inside slurmd;
 *   - the job prolog's and epilog's Python moved off Slurm's path into a detached worker
 *     (gs_worker.c), forked before any interpreter starts, with the locks that order a
 *     job's prolog, tasks and epilog;
 *   - the join and leave fast paths (gs_fastpath.c): a job like the one before it set up
 *     and undone without an interpreter, from the ticket Python wrote (gs_ticket.c);
 *   - each task's environment (gs_taskenv.c), applied in slurmstepd from the root-owned
 *     file the prolog wrote: no interpreter, no GIL across slurmstepd's fork();
 *   - root-safe files and locks (gs_safefs.c), the debug log and counters (gs_log.c).
 * Any failure of the core becomes a logged SPANK error.
 *
 * Built by spank/build.py, which compiles every file of the plugin with the same flags and
 * generates the constants shared with Python (GS_KNOWN_KEYS, GS_DEFAULT_STATE_DIR, ...).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "gs_internal.h"

#define GS_EXPORT __attribute__((visibility("default")))

GS_EXPORT const char plugin_name[] = "gpushare";
GS_EXPORT const char plugin_type[] = "spank";
GS_EXPORT const unsigned int plugin_version = SLURM_VERSION_NUMBER;
GS_EXPORT const unsigned int spank_plugin_version = 1;

enum { GS_OPT_SHARE = 1, GS_OPT_MPS = 2 };

static int gs_opt_cb(int val, const char *optarg, int remote);

static struct spank_option gs_options[] = {
    {"gpu-share", "percent",
     "[gpushare] Share of one GPU through MPS, 1-100 (% of its SMs; device memory capped "
     "in proportion).",
     1, GS_OPT_SHARE, gs_opt_cb},
    {"gpu-mps", NULL,
     "[gpushare] Run one private MPS daemon over this job's whole GPUs, so its ranks share "
     "them.",
     0, GS_OPT_MPS, gs_opt_cb},
    SPANK_OPTIONS_TABLE_END};

/* Per-process state: the options seen by the callbacks. */
static int gs_share_percent = 0;
static int gs_private_mps = 0;

static int gs_opt_cb(int val, const char *optarg, int remote)
{
    if (val == GS_OPT_MPS) {
        gs_private_mps = 1;
        return 0;
    }
    gs_share_percent = gs_parse_percent(optarg);
    if (gs_share_percent < 0) {
        slurm_error("gpushare: --gpu-share=%s is invalid: give a whole percent of one GPU "
                    "from 1 to 100, e.g. --gpu-share=25",
                    optarg ? optarg : "");
        gs_share_percent = 0;
        return -1;
    }
    (void)remote;
    return 0;
}

/* Option value as the job carries it: "" for a flag, NULL when not used. */
const char *gs_getopt(void *handle, const char *name)
{
    spank_t sp = (spank_t)handle;
    char *value = NULL;
    for (struct spank_option *opt = gs_options; opt->name; opt++) {
        if (strcmp(opt->name, name) != 0)
            continue;
        if (spank_option_getopt(sp, opt, &value) != ESPANK_SUCCESS)
            return NULL;
        return value ? value : "";
    }
    return NULL;
}

static int gs_env_set(const char *name)
{
    const char *value = getenv(name);
    return value && *value;
}

static int gs_job_options_used(spank_t sp)
{
    return gs_getopt(sp, "gpu-share") != NULL || gs_getopt(sp, "gpu-mps") != NULL;
}

/* ---- SPANK entry points ----------------------------------------------------------- */

GS_EXPORT int slurm_spank_init(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();

    if (ctx == S_CTX_SLURMD) {
        /* Which gpushare this node runs, once in slurmd's log (GS_VERSION: spank/build.py). */
        slurm_info("gpushare %s loaded (built for Slurm %d.%02d.%d)", GS_VERSION,
                   SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER),
                   SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER),
                   SLURM_VERSION_MICRO(SLURM_VERSION_NUMBER));
        /* Report a bad line to slurmd's log, but never start Python or fail slurmd. */
        (void)gs_parse_args(ac, av);
        return 0;
    }
    if (gs_parse_args(ac, av) < 0)
        /* In a prolog's or epilog's process the callback itself says so (gs_bad_line),
         * with gpushare's reason instead of Slurm's bare "Prolog/Epilog error". */
        return ctx == S_CTX_JOB_SCRIPT ? 0 : -1;
    if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) {
        for (struct spank_option *opt = gs_options; opt->name; opt++) {
            if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
                slurm_error("gpushare: cannot register option --%s", opt->name);
                return -1;
            }
        }
    }
    return 0;
}

/* The gpushare line of plugstack.conf cannot be parsed (gs_parse_args logged which
 * argument): the node drains with that cause, named in full in slurmd's log. No state
 * directory is known, so a job's daemon reference stays for the first prolog after the fix
 * (or `gpushare mps --reap`) to give back, as any lost epilog's. */
static int gs_bad_line(void)
{
    return gs_drain_node("bad gpushare line in plugstack.conf (slurmd's log names the "
                         "argument)");
}

GS_EXPORT int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
    char lock[PATH_MAX + 32], env[PATH_MAX + 32], core[PATH_MAX], jobs[PATH_MAX];
    double started = gs_now();
    int fd, rc;

    if (gs_parse_args(ac, av) < 0) {
        (void)gs_bad_line(); /* the job must not start: Slurm's requeue and drain follow */
        return -1;
    }
    gs_debug(sp, "cb=job_prolog begin");
    if (!gs_env_set("SLURM_JOB_GPUS") && !gs_env_set("CUDA_VISIBLE_DEVICES") &&
        !gs_env_set("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") && !gs_job_options_used(sp)) {
        gs_debug(sp, "cb=job_prolog python=skip reason=no-gpu");
        return 0;
    }
    if (gs_jobs_dir(jobs, sizeof(jobs)) < 0 ||
        gs_job_file(sp, GS_LOCK_SUFFIX, lock, sizeof(lock)) < 0 ||
        (fd = gs_open_lock(lock, 1)) < 0) {
        slurm_error("gpushare: job prolog: cannot create the job's lock in %s/" GS_JOBS_DIR
                    ": %m (check plugstack state_dir=)", gs_state_dir);
        return -1;
    }
    if (gs_flock_until(fd, LOCK_EX, gs_now() + gs_wait_limit()) < 0) {
        slurm_error("gpushare: job prolog: %s is held by another process: %m", lock);
        close(fd);
        return -1;
    }
    /* A job id that comes back (a requeued job) starts clean: a tasks' file its earlier
     * run left behind (an epilog lost with slurmd) never reaches this run's tasks. */
    if (gs_job_file(sp, GS_ENV_SUFFIX, env, sizeof(env)) == 0)
        (void)unlink(env);
    if (gs_fast_join(sp, ac, av)) {
        close(fd); /* the tasks have their file: the job's lock is free for its epilog */
        return 0;
    }
    /* What the worker will load is checked here, in Slurm's sight: the node is drained
     * with the setting and the path, and Slurm requeues the batch job for the failure. */
    if (gs_core_trusted(core, sizeof(core)) < 0) {
        gs_count_fast("prolog failed", gs_now() - started); /* no Python ran to count it */
        gs_core_fault("job_prolog", sp, 0);
        close(fd);
        return -1;
    }
    rc = gs_call_detached("job_prolog", sp, ac, av, NULL);
    close(fd);
    return rc;
}

/*
 * The job's prolog worker, or its supervisor, still holds the job's lock when every bound
 * it has is past: a process stuck in the kernel (NVML, the MPS daemon), a node fault. The
 * node is drained for it here, and the epilog still undoes what the prolog set up: an
 * epilog that gave up would leave the job's files and its daemon reference behind, and
 * Slurm's bare "Epilog error" in place of the cause. 0 when drained; -1 when the drain
 * failed, and the epilog fails so that Slurm drains the node.
 */
static int gs_prolog_stuck(spank_t sp)
{
    char why[160];
    uint32_t job_id = 0;

    (void)spank_get_item(sp, S_JOB_ID, &job_id);
    slurm_error("gpushare: job %u: epilog: the job's prolog worker still runs after %g s (a "
                "hung MPS daemon or NVML?); draining the node and undoing the job without it; "
                "see slurmd's log and `gpushare mps` on this node", job_id, gs_wait_limit());
    gs_debug(sp, "cb=job_epilog prolog=stuck");
    snprintf(why, sizeof(why), "prolog worker still ran at the epilog after %g s (job %u; "
             "hung NVML or MPS?)", gs_wait_limit(), job_id);
    return gs_drain_node(why);
}

GS_EXPORT int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
    char lock[PATH_MAX + 32], jobs[PATH_MAX];
    double started = gs_now();
    int fd = -1, barrier[GS_EPILOG_LOCKS_MAX], held, rc, jobs_ok, sampled, undrained = 0;

    if (gs_parse_args(ac, av) < 0)
        return gs_bad_line() == 0 ? 0 : -1; /* drained with the cause, else Slurm drains */
    /* A state directory a user could change is refused (slurmd's log says why). */
    if (gs_check_state_dir(0) < 0 && errno != ENOENT)
        return -1;
    /* The job's prolog worker first: what it set up is what this epilog undoes. */
    if (gs_job_file(sp, GS_LOCK_SUFFIX, lock, sizeof(lock)) == 0)
        fd = gs_open_lock(lock, 0);
    if (fd >= 0 && gs_flock_until(fd, LOCK_EX, gs_now() + gs_wait_limit()) < 0)
        undrained = gs_prolog_stuck(sp) < 0; /* undone below all the same */
    /* A job the usage sampler saw goes to the worker, which logs its GPU use. */
    sampled = gs_job_usage_exists(sp);
    if (!sampled && !gs_job_record_exists(sp) &&
        !gs_env_set("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") && !gs_job_options_used(sp)) {
        if (fd >= 0) {
            /* Its prolog took the lock and was counted (a GPU job that shares nothing). */
            gs_finish("job_epilog", sp, lock);
            gs_count_fast("epilog", gs_now() - started);
            close(fd);
        }
        gs_debug(sp, "cb=job_epilog python=skip reason=no-share");
        return undrained ? -1 : 0;
    }
    jobs_ok = gs_jobs_dir(jobs, sizeof(jobs)) == 0;
    if (jobs_ok && !sampled && gs_fast_leave(sp)) {
        if (fd >= 0) {
            gs_finish("job_epilog", sp, lock);
            close(fd);
        }
        return undrained ? -1 : 0;
    }
    if (!jobs_ok || (held = gs_hold_epilog_barrier(barrier, GS_EPILOG_LOCKS_MAX)) < 0) {
        rc = gs_in_place("job_epilog", sp, ac, av, fd >= 0 ? lock : NULL);
    } else {
        rc = gs_call_detached("job_epilog", sp, ac, av, fd >= 0 ? lock : NULL);
        while (held > 0)
            close(barrier[--held]);
    }
    if (fd >= 0)
        close(fd);
    return undrained ? -1 : rc;
}

GS_EXPORT int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    if (gs_parse_args(ac, av) < 0)
        return -1;
    gs_debug(sp, "cb=task_init_privileged begin");
    return gs_task_env(sp, gs_share_percent || gs_private_mps);
}
