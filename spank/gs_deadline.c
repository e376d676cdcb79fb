/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * A worker's one deadline: its supervisor.
 *
 * The worker runs a prolog's or epilog's Python off Slurm's path (gs_worker.c). Each of its
 * commands is bounded by timeout=, its own waits by its deadline (gpushare.node.phases),
 * but an NVML call has no bound, and nothing inside a process can promise that the process
 * ends. So a process without Python supervises it: it forks the worker, waits for it until
 * gpushare.node.job.worker_deadline, and then stops it and the commands it runs, kills
 * them, and hands the failure to the Python's node-fault path in a fresh process
 * (gpushare.node.spank_adapter.worker_lost: drain the node with the cause, requeue a
 * prolog's batch job as Slurm does after a failing prolog, tell its tasks), itself bounded.
 * If that fails too, it drains the node and fails the tasks from C. A worker killed by a
 * signal (the OOM killer) is handled the same way.
 *
 * The cause names what the worker was doing: the worker writes it at the start of the
 * job's lock file (gpushare.node.phases.doing), and the supervisor writes the whole cause
 * there before the fault path reads it. The supervisor holds the job's lock as the worker
 * did, until the failure is handled: a task or an epilog waiting for the worker meets the
 * failure's word, never a worker that simply vanished. It waits for the worker's deadline
 * and the fault path's bound, gs_wait_limit, and no longer.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gs_internal.h"

double gs_worker_deadline(void)
{
    return GS_WORKER_DEADLINE_TIMEOUTS * gs_timeout + GS_WORKER_DEADLINE_MARGIN;
}

/* What the fault path may take: a drain, the scheduler's parameters and a requeue. */
static double gs_fault_limit(void)
{
    return GS_FAULT_TIMEOUTS * gs_timeout + GS_WORKER_DEADLINE_MARGIN;
}

double gs_wait_limit(void)
{
    return gs_worker_deadline() + gs_fault_limit();
}

/* Wait for child pid until deadline, with SIGCHLD blocked: 0 when it ended (*status),
 * 1 when the deadline passed first, -1 when it cannot be waited for. */
static int gs_wait_child(pid_t pid, double deadline, int *status)
{
    sigset_t chld;
    struct timespec left;
    double seconds;
    pid_t done;

    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    for (;;) {
        done = waitpid(pid, status, WNOHANG);
        if (done == pid)
            return 0;
        if (done < 0 && errno != EINTR)
            return -1;
        seconds = deadline - gs_now();
        if (seconds <= 0)
            return 1;
        left.tv_sec = (time_t)seconds;
        left.tv_nsec = (long)((seconds - (double)left.tv_sec) * 1e9);
        (void)sigtimedwait(&chld, NULL, &left);
    }
}

/*
 * End the worker and what it runs: stopped first, so that it starts nothing more and
 * reaps none of its children (their pids stay theirs), then each direct child killed (the
 * commands it runs each lead a session of their own; a process they started stays, as a
 * daemon started is the user's), then the worker's own process group.
 */
static void gs_kill_worker(pid_t worker)
{
    char text[1024];
    struct dirent *entry;
    long ppid, pgrp, pid;
    DIR *proc;
    int status;

    (void)kill(-worker, SIGSTOP);
    (void)kill(worker, SIGSTOP);
    if ((proc = opendir("/proc"))) {
        while ((entry = readdir(proc))) {
            if (!isdigit((unsigned char)entry->d_name[0]))
                continue;
            pid = strtol(entry->d_name, NULL, 10);
            if (gs_read_proc_stat(pid, text, sizeof(text)) < 0)
                continue;
            if (gs_parse_proc_parent(text, &ppid, &pgrp) == 0 && ppid == worker && pid > 1)
                (void)kill((pid_t)pid, SIGKILL);
        }
        closedir(proc);
    }
    (void)kill(-worker, SIGKILL);
    (void)kill(worker, SIGKILL);
    while (waitpid(worker, &status, 0) < 0 && errno == EINTR)
        ;
}

/* The job's lock file, where the worker says what it does: opened O_NOFOLLOW|O_NONBLOCK,
 * a regular file of root's with one link, or -1. */
static int gs_open_board(spank_t sp, int flags)
{
    char path[PATH_MAX + 32];
    struct stat st;
    int fd;

    if (gs_job_file(sp, GS_LOCK_SUFFIX, path, sizeof(path)) < 0)
        return -1;
    fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
                    st.st_nlink != 1)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* What the worker last said it does, as printable text ("" when it said nothing). */
static void gs_read_board(spank_t sp, char *out, size_t size)
{
    char text[GS_BOARD_SIZE + 1];
    ssize_t got = -1;
    size_t n = 0;
    int fd = gs_open_board(sp, O_RDONLY);

    if (fd >= 0) {
        got = pread(fd, text, GS_BOARD_SIZE, 0);
        close(fd);
    }
    for (ssize_t i = 0; i < got && n + 1 < size; i++)
        out[n++] = isprint((unsigned char)text[i]) ? text[i] : ' ';
    while (n > 0 && out[n - 1] == ' ')
        n--;
    out[n] = '\0';
}

static void gs_write_board(spank_t sp, const char *text)
{
    char padded[GS_BOARD_SIZE];
    size_t n = strnlen(text, sizeof(padded));
    int fd = gs_open_board(sp, O_WRONLY);

    if (fd < 0)
        return;
    memcpy(padded, text, n);
    memset(padded + n, ' ', sizeof(padded) - n);
    if (pwrite(fd, padded, sizeof(padded), 0) < 0)
        slurm_error("gpushare: cannot note why the worker failed: %m");
    close(fd);
}

/* Hand the failure to the Python's fault path in a process of its own, bounded; 0 when it
 * says it handled it. */
static int gs_fault_path(const char *callback, spank_t sp, int ac, char **av,
                         const sigset_t *mask)
{
    char name[64];
    pid_t pid;
    int status = 0, rc;

    snprintf(name, sizeof(name), "%s_worker_lost", callback);
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        (void)setpgid(0, 0);
        sigprocmask(SIG_SETMASK, mask, NULL);
        _exit(gs_call_python(name, sp, ac, av) == 0 ? 0 : 1);
    }
    rc = gs_wait_child(pid, gs_now() + gs_fault_limit(), &status);
    if (rc == 1)
        gs_kill_worker(pid);
    return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int gs_supervise(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end)
{
    char doing[GS_BOARD_SIZE + 1], why[GS_BOARD_SIZE + 1], task_text[GS_BOARD_SIZE + 96];
    const char *what = strcmp(callback, "job_prolog") == 0 ? "prolog" : "epilog";
    double limit = gs_worker_deadline(), deadline = gs_now() + limit;
    sigset_t chld, mask;
    int status = 0, rc;
    pid_t worker;

    /* Children are waited for here: never reaped behind our back (SIGCHLD ignored). */
    (void)signal(SIGCHLD, SIG_DFL);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &mask);
    worker = fork();
    if (worker < 0) {
        slurm_error("gpushare: cannot fork the %s worker: %m; running it without a deadline",
                    callback);
        sigprocmask(SIG_SETMASK, &mask, NULL);
        return gs_run_worker(callback, sp, ac, av, lock_at_end);
    }
    if (worker == 0) {
        (void)setpgid(0, 0);
        sigprocmask(SIG_SETMASK, &mask, NULL);
        _exit(gs_run_worker(callback, sp, ac, av, lock_at_end));
    }
    rc = gs_wait_child(worker, deadline, &status);
    if (rc == 0 && !WIFSIGNALED(status))
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;

    gs_read_board(sp, doing, sizeof(doing));
    if (rc != 0) {
        gs_kill_worker(worker);
        snprintf(why, sizeof(why), "%s worker timed out after %g s%s%.96s", what, limit,
                 *doing ? " while " : "", doing);
    } else {
        snprintf(why, sizeof(why), "%s worker killed by signal %d (OOM?)%s%.96s",
                 what, WTERMSIG(status), *doing ? " while " : "", doing);
    }
    slurm_error("gpushare: %s: %s; the node is drained", callback, why);
    gs_write_board(sp, why);
    if (gs_fault_path(callback, sp, ac, av, &mask) < 0) {
        slurm_error("gpushare: %s: the fault path did not finish within %g s; draining the "
                    "node from C", callback, gs_fault_limit());
        (void)gs_drain_node(why);
        if (strcmp(callback, "job_prolog") == 0) {
            snprintf(task_text, sizeof(task_text), "could not set up this job on its node: "
                     "%s. The node was drained; submit the job again", why);
            gs_fail_tasks(sp, task_text);
        }
    }
    gs_finish(callback, sp, lock_at_end);
    return 1;
}
