/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The job's worker: the prolog's and epilog's Python off Slurm's path.
 *
 * Slurm holds a job's first step until the job prolog returns, and the next job on the
 * node until the epilog returns. The Python work (checking the GPUs, starting, joining or
 * stopping the MPS daemon, the job's record) runs instead in a worker forked before Python
 * starts and detached from slurmd (its own session: Slurm kills the prolog's process group
 * when it ends). A per-job lock, <state_dir>/jobs/<id>.lock, taken before the prolog
 * returns and held by the worker until it ends, orders what follows: the job's tasks wait
 * for it in task_init_privileged, bounded, and the epilog waits for it before undoing it.
 * Epilog workers hold a barrier lock per GPU of their job shared (gs_hold_epilog_barrier),
 * and a prolog worker waits for those of its GPUs (gpushare.node.job.wait_for_epilogs,
 * after its GPU check, before the MPS daemon), so a GPU goes to the next job's daemon only
 * once the last one's is stopped. Slurm no longer sees the worker's result, so the worker
 * drains the node itself on a failure (gpushare.node.spank_adapter) and tells the tasks
 * why through the job's record.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gs_internal.h"

/* A task's wait for its prolog's worker: 0.5 ms first, twice as long each time, 10 ms at
 * most: a worker done within its usual tens of ms is seen within a few ms of it, and a
 * task that waits long costs 100 wake-ups a second. */
#define GS_POLL_FIRST_US 500
#define GS_POLL_MAX_US 10000

/* <state_dir>/<dir>/<job id><suffix>, the job's id from Slurm; -1 where it does not fit. */
static int gs_job_path(spank_t sp, const char *dir, const char *suffix, char *path,
                       size_t size)
{
    uint32_t job_id = 0;

    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
        return -1;
    return snprintf(path, size, "%s/%s/%u%s", gs_state_dir, dir, job_id, suffix) >= (int)size
               ? -1 : 0;
}

/* <state_dir>/jobs/<job id><suffix>: the job's record (.json), tasks' word (.env), lock. */
int gs_job_file(spank_t sp, const char *suffix, char *path, size_t size)
{
    return gs_job_path(sp, GS_JOBS_DIR, suffix, path, size);
}

int gs_job_record_exists(spank_t sp)
{
    char path[PATH_MAX + 32];
    struct stat st;

    return gs_job_file(sp, GS_RECORD_SUFFIX, path, sizeof(path)) == 0 && lstat(path, &st) == 0;
}

/* Whether the node's usage sampler left the job a usage file, <state_dir>/usage/<id>.json
 * (gpushare.node.usage.store): the epilog's Python then logs the job's GPU use and removes
 * it (gpushare.node.usage.summary.record_end, called by gpushare.node.job.epilog). */
int gs_job_usage_exists(spank_t sp)
{
    char path[PATH_MAX + 32];
    struct stat st;

    return gs_job_path(sp, GS_USAGE_DIR, ".json", path, sizeof(path)) == 0 &&
           lstat(path, &st) == 0;
}

/*
 * The epilog barrier a prolog worker waits at (gpushare.node.job.wait_for_epilogs names the
 * same files): an epilog worker holds <state_dir>/epilogs.gpu<index>.lock shared for each
 * of its job's GPUs (Slurm's indices, SLURM_JOB_GPUS), or <state_dir>/epilogs.lock when it
 * cannot tell them, from before the epilog returns to Slurm until the worker ends. A
 * prolog worker then waits only for the epilogs of its own GPUs, not for every job that
 * ends on the node at the same time.
 */
int gs_hold_epilog_barrier(int *fds, int max)
{
    char path[PATH_MAX + 64];
    long indices[GS_EPILOG_LOCKS_MAX];
    int count = 0, gpus;

    if (max > GS_EPILOG_LOCKS_MAX)
        max = GS_EPILOG_LOCKS_MAX;
    gpus = gs_parse_gpu_list(getenv("SLURM_JOB_GPUS"), indices, max);

    for (; count < gpus; count++) {
        snprintf(path, sizeof(path), "%s/" GS_GPU_EPILOGS_LOCK_FMT, gs_state_dir,
                 indices[count]);
        if ((fds[count] = gs_open_lock(path, 1)) < 0)
            break;
        (void)flock(fds[count], LOCK_SH); /* prologs hold them only for an instant */
    }
    if (gpus > 0 && count == gpus)
        return count;
    while (count > 0)
        close(fds[--count]);
    /* No GPUs, or not a plain list of indices: the node-wide barrier. */
    snprintf(path, sizeof(path), "%s/" GS_EPILOGS_LOCK, gs_state_dir);
    if ((fds[0] = gs_open_lock(path, 1)) < 0) {
        slurm_error("gpushare: job epilog: cannot open %s: %m; running the epilog in place",
                    path);
        return -1;
    }
    (void)flock(fds[0], LOCK_SH);
    return 1;
}

/* A prolog worker that failed before its Python could say so, or was killed: the tasks
 * fail with ``text`` instead of starting unchecked. An env file already written is left
 * alone, and none is written once the job's epilog has undone the job (it removed the
 * job's lock, which the prolog made first): the tasks are over, and the file would
 * outlive the job. */
void gs_fail_tasks(spank_t sp, const char *text)
{
    char jobs[PATH_MAX], path[PATH_MAX + 32], tmp[PATH_MAX + 64], lock[PATH_MAX + 32];
    int fd;

    if (gs_jobs_dir(jobs, sizeof(jobs)) < 0 ||
        gs_job_file(sp, GS_ENV_SUFFIX, path, sizeof(path)) < 0 ||
        gs_job_file(sp, GS_LOCK_SUFFIX, lock, sizeof(lock)) < 0)
        return;
    if (access(lock, F_OK) < 0) {
        slurm_error("gpushare: %s is gone: the job's epilog has undone the job, so its "
                    "tasks get no word (%s)", lock, text);
        return;
    }
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    if (access(path, F_OK) == 0)
        return;
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (dprintf(fd, "#error=%s\n", text) < 0 || fsync(fd) < 0 || rename(tmp, path) < 0)
        (void)unlink(tmp);
    close(fd);
}

/*
 * The worker outlives slurmd's request: it closes the sockets and pipes it inherited, so
 * that nothing of that request (a connection, a pipe Slurm reads to EOF) stays open, and
 * keeps the files (Slurm's log, the job's locks).
 */
static void gs_close_inherited(void)
{
    struct dirent *entry;
    struct stat st;
    DIR *dir = opendir("/proc/self/fd");
    int fd;

    if (!dir)
        return;
    while ((entry = readdir(dir))) {
        fd = atoi(entry->d_name);
        if (fd <= STDERR_FILENO || fd == dirfd(dir) || fstat(fd, &st) < 0)
            continue;
        if (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode))
            close(fd);
    }
    closedir(dir);
}

/* After an epilog: the job's lock goes, and so does a note for the tasks that a prolog
 * worker left without a record (it failed before its Python could write one). */
void gs_finish(const char *callback, spank_t sp, const char *lock)
{
    char env[PATH_MAX + 32];

    if (strcmp(callback, "job_epilog") != 0 || !lock)
        return;
    if (!gs_job_record_exists(sp) && gs_job_file(sp, GS_ENV_SUFFIX, env, sizeof(env)) == 0)
        (void)unlink(env);
    (void)unlink(lock);
}

/* In Slurm's sight: a core that cannot load drains the node here, and the -1 makes Slurm
 * requeue a prolog's batch job itself (it keeps the drain's reason). An epilog that cannot
 * hold its barrier runs here too: its Python's waits still take the time left of a
 * worker's deadline. */
int gs_in_place(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end)
{
    int rc;

    gs_python_deadline = gs_now() + gs_worker_deadline();
    rc = gs_call_python(callback, sp, ac, av);
    gs_python_deadline = 0.0;
    if (rc == GS_CORE_IMPORT_FAILED) {
        gs_core_fault(callback, sp, 0);
        rc = -1;
    }
    gs_finish(callback, sp, lock_at_end);
    return rc;
}

/* What a worker does (gs_supervise waits for it): the callback's Python, then the tasks'
 * word if it failed before its Python could give it, then the epilog's lock. */
int gs_run_worker(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end)
{
    int rc;

    gs_prefork_here = gs_prefork;
    rc = gs_call_python(callback, sp, ac, av);

    /* Slurm no longer waits for this worker: the drain and the requeue are its own. */
    if (rc == GS_CORE_IMPORT_FAILED)
        gs_core_fault(callback, sp, 1);
    if (rc != 0 && strcmp(callback, "job_prolog") == 0)
        gs_fail_tasks(sp, "could not set up this job on its node (slurmd's log says why); "
                      "tell your administrator");
    gs_finish(callback, sp, lock_at_end);
    return rc == 0 ? 0 : 1;
}

/* Run the callback's Python in a detached worker; it inherits the locks the caller holds
 * (opened O_CLOEXEC: the MPS daemons it starts do not). When no worker can be forked, no
 * Python runs: the node fault is failed from C (gs_no_worker), and Slurm, told the prolog
 * or epilog failed, drains the node too and requeues a prolog's batch job. */
int gs_call_detached(const char *callback, spank_t sp, int ac, char **av,
                     const char *lock_at_end)
{
    pid_t child, supervisor;
    int status = 0, null_fd;

    child = fork();
    if (child < 0) /* no Python in Slurm's process without a deadline */
        return gs_no_worker(callback, sp, lock_at_end, strerror(errno)) ? -1 : 0;
    if (child == 0) {
        if (setsid() < 0)
            _exit(1);
        supervisor = fork();
        if (supervisor != 0)
            _exit(supervisor < 0 ? 1 : 0);
        gs_close_inherited();
        /* Nothing of Slurm's pipes stays open: Slurm reads the prolog's output to EOF. */
        null_fd = open("/dev/null", O_RDWR);
        if (null_fd >= 0) {
            dup2(null_fd, STDIN_FILENO);
            dup2(null_fd, STDOUT_FILENO);
            dup2(null_fd, STDERR_FILENO);
            if (null_fd > STDERR_FILENO)
                close(null_fd);
        }
        _exit(gs_supervise(callback, sp, ac, av, lock_at_end));
    }
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return gs_no_worker(callback, sp, lock_at_end, "its session or second fork failed") ?
                   -1 : 0;
    gs_debug(sp, "cb=%s detached", callback);
    return 0;
}

/*
 * The job's prolog worker may still run when its first task starts: wait for its result
 * (the env file, or the lock given back), bounded. No lock: no worker (no GPUs, or a prolog
 * of an older gpushare), nothing to wait for.
 */
int gs_wait_for_prolog(spank_t sp)
{
    char lock[PATH_MAX + 32], env[PATH_MAX + 32];
    double deadline = gs_now() + gs_wait_limit();
    useconds_t pause = GS_POLL_FIRST_US;
    int fd, waited = 0;

    if (gs_check_state_dir(0) < 0 || gs_job_file(sp, GS_LOCK_SUFFIX, lock, sizeof(lock)) < 0 ||
        gs_job_file(sp, GS_ENV_SUFFIX, env, sizeof(env)) < 0 || (fd = gs_open_lock(lock, 0)) < 0)
        return 0;
    while (access(env, F_OK) < 0 && flock(fd, LOCK_SH | LOCK_NB) < 0) {
        if (gs_now() > deadline) {
            close(fd);
            slurm_spank_log("gpushare: this job's set-up on the node (GPU check, MPS daemon) "
                            "did not finish within %g s; tell your administrator (slurmd's "
                            "log says why)", gs_wait_limit());
            return -1;
        }
        waited++;
        usleep(pause); /* a prolog done at once is seen at once, a slow one costs no CPU */
        pause = pause * 2 > GS_POLL_MAX_US ? GS_POLL_MAX_US : pause * 2;
    }
    close(fd);
    gs_debug(sp, "cb=task_init_privileged prolog=done waited=%d", waited);
    if (access(env, F_OK) < 0 && gs_state_dir_full()) {
        /* The worker found state_dir= full and drained the node for it, but could not even
         * write the tasks its word: say the same, not "killed". */
        snprintf(lock, sizeof(lock), GS_STATE_DIR_FULL_FMT, gs_state_dir);
        slurm_spank_log("gpushare: this job's set-up on the node failed: no space left in "
                        "state_dir= %s; tell your administrator", gs_state_dir);
        (void)gs_drain_node(lock);
        return -1;
    }
    if (access(env, F_OK) < 0) {
        /* Every worker that ends leaves the tasks its word (empty when nothing is shared). */
        slurm_spank_log("gpushare: this job's set-up on the node ended without a result (its "
                        "worker was killed?); tell your administrator (slurmd's log may say "
                        "why)");
        /* Root's worker, out of the job's reach, died: a node fault (memory, a unit that
         * killed it), and the next GPU job here would meet it too. */
        (void)gs_drain_node("a job's set-up worker was killed (OOM?); see slurmd's log");
        return -1;
    }
    return 0;
}
