/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The job epilog's course (spank/gpushare_spank.c) after a prolog whose worker, or its
 * supervisor, still holds the job's lock when the epilog's wait is over: the node is
 * drained with gpushare's cause, and what the prolog set up is undone all the same (the
 * job's files go with the epilog's worker, or here in C); the epilog fails, so that Slurm
 * drains the node, only when that drain could not be made. gpushare_spank.c is included;
 * every call it makes into the rest of the plugin and into Slurm is this file's, and notes
 * what it was asked. links: gs_parse.c */
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

#include "gs_check.h"
#include "../../spank/gpushare_spank.c"

/* What the stubs answer, set by each test. */
static int lock_held;         /* the prolog's worker holds the job's lock past the wait */
static int drain_fails;       /* scontrol cannot drain the node */
static int record_exists;     /* the prolog wrote the job's record */
static int usage_exists;      /* the usage sampler left the job a usage file */

/* What the epilog did. */
static int drains, detached, finished, in_place, fast_leaves;
static char drained_why[256], detached_lock[256], finished_lock[256];

char gs_state_dir[PATH_MAX] = "/run/gpushare";
double gs_timeout = 2.0;

void slurm_info(const char *fmt, ...) { (void)fmt; }

void slurm_error(const char *fmt, ...) { (void)fmt; }

void gs_debug(spank_t sp, const char *fmt, ...)
{
    (void)sp;
    (void)fmt;
}

spank_context_t spank_context(void) { return S_CTX_JOB_SCRIPT; }

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
    (void)sp;
    (void)opt;
    return ESPANK_SUCCESS;
}

spank_err_t spank_option_getopt(spank_t sp, struct spank_option *opt, char **optarg)
{
    (void)sp;
    (void)opt;
    (void)optarg;
    return ESPANK_ERROR; /* no --gpu-share, no --gpu-mps */
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
    va_list ap;

    (void)sp;
    if (item != S_JOB_ID)
        return ESPANK_ERROR;
    va_start(ap, item);
    *va_arg(ap, uint32_t *) = 42;
    va_end(ap);
    return ESPANK_SUCCESS;
}

double gs_now(void) { return 1000.0; }

double gs_wait_limit(void) { return 24.0; }

static int bad_line; /* the gpushare line of plugstack.conf cannot be parsed */

int gs_parse_args(int ac, char **av)
{
    (void)ac;
    (void)av;
    return bad_line ? -1 : 0;
}

int gs_check_state_dir(int create)
{
    (void)create;
    return 0;
}

int gs_jobs_dir(char *out, size_t size)
{
    snprintf(out, size, "%s/jobs", gs_state_dir);
    return 0;
}

int gs_job_file(spank_t sp, const char *suffix, char *path, size_t size)
{
    (void)sp;
    snprintf(path, size, "%s/jobs/42%s", gs_state_dir, suffix);
    return 0;
}

int gs_open_lock(const char *path, int create)
{
    (void)path;
    (void)create;
    return open("/dev/null", O_RDONLY | O_CLOEXEC); /* the epilog closes what it gets */
}

int gs_flock_until(int fd, int operation, double deadline)
{
    (void)fd;
    (void)operation;
    (void)deadline;
    return lock_held ? -1 : 0;
}

int gs_drain_node(const char *why)
{
    drains++;
    snprintf(drained_why, sizeof(drained_why), "%s", why);
    return drain_fails ? -1 : 0;
}

int gs_job_record_exists(spank_t sp)
{
    (void)sp;
    return record_exists;
}

void gs_finish(const char *callback, spank_t sp, const char *lock)
{
    (void)sp;
    if (strcmp(callback, "job_epilog") == 0 && lock) {
        finished++;
        snprintf(finished_lock, sizeof(finished_lock), "%s", lock);
    }
}

void gs_count_fast(const char *callback, double seconds)
{
    (void)callback;
    (void)seconds;
}

int gs_job_usage_exists(spank_t sp)
{
    (void)sp;
    return usage_exists;
}

int gs_fast_leave(spank_t sp)
{
    (void)sp;
    fast_leaves++;
    return 0; /* the worker must run */
}

int gs_hold_epilog_barrier(int *fds, int max)
{
    (void)fds;
    (void)max;
    return 0; /* held, with nothing for the epilog to close */
}

int gs_call_detached(const char *callback, spank_t sp, int ac, char **av,
                     const char *lock_at_end)
{
    (void)sp;
    (void)ac;
    (void)av;
    if (strcmp(callback, "job_epilog") == 0) {
        detached++;
        snprintf(detached_lock, sizeof(detached_lock), "%s", lock_at_end ? lock_at_end : "");
    }
    return 0; /* Slurm no longer waits for the worker */
}

int gs_in_place(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end)
{
    (void)callback;
    (void)sp;
    (void)ac;
    (void)av;
    (void)lock_at_end;
    in_place++;
    return 0;
}

/* The prolog's side of the plugin, which the epilog never calls. */
int gs_fast_join(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    return 0;
}

int gs_core_trusted(char *path, size_t size)
{
    (void)path;
    (void)size;
    return 0;
}

int gs_task_env(spank_t sp, int asked_to_share)
{
    (void)sp;
    (void)asked_to_share;
    return 0;
}

static int starts(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

/* One epilog of job 42: its return code, after the stubs were set. */
static int epilog(int held, int drain_failing, int recorded, int shared)
{
    lock_held = held;
    drain_fails = drain_failing;
    record_exists = recorded;
    drains = detached = finished = in_place = fast_leaves = 0;
    drained_why[0] = detached_lock[0] = finished_lock[0] = '\0';
    if (shared)
        setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25", 1);
    else
        unsetenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    return slurm_spank_job_epilog(NULL, 0, NULL);
}

static void test_a_finished_prolog(void)
{
    CHECK_INT(epilog(0, 0, 1, 1), 0);
    CHECK_INT(drains, 0);
    CHECK_INT(detached, 1);
    CHECK_STR(detached_lock, "/run/gpushare/jobs/42.lock");
}

static void test_a_stuck_prolog_worker_is_drained_for_and_its_job_undone(void)
{
    /* A shared job whose prolog wrote its record: the epilog's worker still undoes it (its
     * daemon reference, its record, the job's lock), and Slurm sees no failure. */
    CHECK_INT(epilog(1, 0, 1, 1), 0);
    CHECK_INT(drains, 1);
    CHECK(starts(drained_why, "prolog worker still ran at the epilog after 24 s (job 42; "));
    CHECK(strlen(drained_why) + strlen("gpushare: ") <= 100); /* what sinfo -R shows */
    CHECK_INT(detached, 1);
    CHECK_STR(detached_lock, "/run/gpushare/jobs/42.lock");
    CHECK_INT(in_place, 0);
    /* A job that shares nothing, its prolog stuck before any record: its files go here. */
    CHECK_INT(epilog(1, 0, 0, 0), 0);
    CHECK_INT(drains, 1);
    CHECK_INT(finished, 1);
    CHECK_STR(finished_lock, "/run/gpushare/jobs/42.lock");
    CHECK_INT(detached, 0);
}

static void test_a_drain_that_cannot_be_made_is_left_to_slurm(void)
{
    CHECK_INT(epilog(1, 1, 1, 1), -1);
    CHECK_INT(drains, 1);
    CHECK_INT(detached, 1); /* undone all the same */
    CHECK_INT(epilog(1, 1, 0, 0), -1);
    CHECK_INT(finished, 1);
}

/* The usage sampler's file of the job sends its epilog to the worker, which logs the job's
 * GPU use: also a job that shares nothing, and never by the fast leave. */
static void test_a_sampled_job_goes_to_the_worker(void)
{
    usage_exists = 0;
    CHECK_INT(epilog(0, 0, 0, 0), 0);
    CHECK_INT(detached, 0); /* a GPU job that shares nothing: no interpreter */
    CHECK_INT(epilog(0, 0, 1, 1), 0);
    CHECK_INT(fast_leaves, 1);
    usage_exists = 1;
    CHECK_INT(epilog(0, 0, 0, 0), 0);
    CHECK_INT(detached, 1);
    CHECK_STR(detached_lock, "/run/gpushare/jobs/42.lock");
    CHECK_INT(epilog(0, 0, 1, 1), 0);
    CHECK_INT(fast_leaves, 0);
    CHECK_INT(detached, 1);
    usage_exists = 0;
}

/* A line the plugin cannot parse: the node drains with gpushare's cause and the epilog
 * succeeds, so Slurm's bare "Epilog error" does not replace it; nothing else is touched. */
static void test_a_bad_plugstack_line_drains_with_its_cause(void)
{
    bad_line = 1;
    CHECK_INT(epilog(0, 0, 1, 1), 0);
    CHECK_INT(drains, 1);
    CHECK(starts(drained_why, "bad gpushare line in plugstack.conf"));
    CHECK(strlen(drained_why) + strlen("gpushare: ") <= 100); /* what sinfo -R shows */
    CHECK_INT(detached + finished + in_place + fast_leaves, 0);
    CHECK_INT(epilog(0, 1, 1, 1), -1); /* no drain made: Slurm's own */
    bad_line = 0;
}

int main(void)
{
    test_a_bad_plugstack_line_drains_with_its_cause();
    test_a_sampled_job_goes_to_the_worker();
    test_a_finished_prolog();
    test_a_stuck_prolog_worker_is_drained_for_and_its_job_undone();
    test_a_drain_that_cannot_be_made_is_left_to_slurm();
    return gs_check_done("test_epilog");
}
