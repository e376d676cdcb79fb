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
 * A killed worker stuck in the kernel (NVML in the driver: uninterruptible sleep) does not
 * die: it is waited for GS_KILL_WAIT seconds at most, and then named in the cause as
 * stuck. It still holds the job's lock (an open file description it shares with the
 * supervisor), so once the failure is handled the supervisor releases that lock for it:
 * the epilog undoes the job at once instead of waiting out its bound on a process that
 * will only die, without running anything more, once the kernel lets it go.
 *
 * The cause names what the worker was doing: the worker writes it at the start of the
 * job's lock file (gpushare.node.phases.doing), and the supervisor writes the whole cause
 * there before the fault path reads it. The supervisor holds the job's lock as the worker
 * did, until the failure is handled: a task or an epilog waiting for the worker meets the
 * failure's word, never a worker that simply vanished. It waits for the worker's deadline
 * and the fault path's bound, gs_wait_limit, and no longer: one deadline, of which every
 * wait after the worker's (the kill, the fault path) takes only the time left, and which
 * the Python of the worker and of the fault path get too (gs_python_deadline).
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
#include <poll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gs_internal.h"

#define GS_RW (PROT_READ | PROT_WRITE)

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

/* The bound of the wait for a killed worker: GS_KILL_WAIT, or less when until is nearer. */
static double gs_kill_until(double until)
{
    double soon = gs_now() + GS_KILL_WAIT;

    return until < soon ? until : soon;
}

/* The worker's child in the prefork server (gs_prefork.c), while it is the same process the
 * worker named: else 0. */
static pid_t gs_live_delegate(void)
{
    char start[sizeof(gs_delegate->start)];
    pid_t pid = gs_delegate ? __atomic_load_n(&gs_delegate->pid, __ATOMIC_ACQUIRE) : 0;

    if (pid <= 1 || gs_proc_start(pid, start, sizeof(start)) < 0 ||
        strcmp(start, gs_delegate->start) != 0)
        return 0;
    return pid;
}

/* Wait until `pid`, not a child of ours, has ended (a zombie has), or until `until`: 0 when
 * it ended. A pidfd says so at once; without one (Linux < 5.3), /proc is looked at. */
static int gs_wait_other(pid_t pid, double until)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd watch = {.fd = fd, .events = POLLIN};
    char text[1024];
    double left;

    for (;;) {
        if (fd < 0 && (gs_read_proc_stat(pid, text, sizeof(text)) < 0 ||
                       strstr(text, ") Z ") || strstr(text, ") X ")))
            return 0;
        left = until - gs_now();
        if (left <= 0)
            break;
        if (fd >= 0) {
            if (poll(&watch, 1, (int)(left * 1000) + 1) > 0) {
                close(fd);
                return 0;
            }
        } else {
            usleep(10000);
        }
    }
    if (fd >= 0)
        close(fd);
    return -1;
}

/* SIGKILL every process whose parent is `parent` or `also` (0: none). */
static void gs_kill_children(pid_t parent, pid_t also)
{
    char text[1024];
    struct dirent *entry;
    long ppid, pgrp, pid;
    DIR *proc;

    if (!(proc = opendir("/proc")))
        return;
    while ((entry = readdir(proc))) {
        if (!isdigit((unsigned char)entry->d_name[0]))
            continue;
        pid = strtol(entry->d_name, NULL, 10);
        if (gs_read_proc_stat(pid, text, sizeof(text)) < 0)
            continue;
        if (gs_parse_proc_parent(text, &ppid, &pgrp) == 0 && pid > 1 &&
            (ppid == parent || (also > 0 && ppid == also)))
            (void)kill((pid_t)pid, SIGKILL);
    }
    closedir(proc);
}

/*
 * End the worker and what it runs: stopped first, so that it starts nothing more and
 * reaps none of its children (their pids stay theirs), then each direct child killed (the
 * commands it runs each lead a session of their own; a process they started stays, as a
 * daemon started is the user's), then the worker's own process group. With prefork=, the
 * worker's child in the prefork server, which runs its callback, goes the same way. 0 when
 * they ended; else the pid of the one still there at gs_kill_until(until): stuck in the
 * kernel, where a kill takes effect only once the kernel lets it go, and then it runs
 * nothing more.
 */
static pid_t gs_kill_worker(pid_t worker, double until)
{
    pid_t delegate = gs_live_delegate();
    int status;

    (void)kill(-worker, SIGSTOP);
    (void)kill(worker, SIGSTOP);
    if (delegate)
        (void)kill(delegate, SIGSTOP);
    gs_kill_children(worker, delegate);
    (void)kill(-worker, SIGKILL);
    (void)kill(worker, SIGKILL);
    if (delegate)
        (void)kill(delegate, SIGKILL);
    if (gs_wait_child(worker, gs_kill_until(until), &status) != 0) {
        slurm_error("gpushare: worker %d does not die when killed: stuck in the kernel (a "
                    "driver call?); going on without it", (int)worker);
        return worker;
    }
    if (delegate && gs_wait_other(delegate, gs_kill_until(until)) != 0) {
        slurm_error("gpushare: worker %d (in the prefork server) does not die when killed: "
                    "stuck in the kernel (a driver call?); going on without it",
                    (int)delegate);
        return delegate;
    }
    return 0;
}

/* A worker that died by a signal while its child in the prefork server runs on: that child
 * goes too, and what it runs; 0 when nothing of it is left at gs_kill_until(until). */
static pid_t gs_kill_delegate(double until)
{
    pid_t delegate = gs_live_delegate();

    if (!delegate)
        return 0;
    (void)kill(delegate, SIGSTOP);
    gs_kill_children(delegate, 0);
    (void)kill(delegate, SIGKILL);
    if (gs_wait_other(delegate, gs_kill_until(until)) == 0)
        return 0;
    slurm_error("gpushare: worker %d (in the prefork server) does not die when killed: "
                "stuck in the kernel (a driver call?); going on without it", (int)delegate);
    return delegate;
}

/* Release the job's lock that a stuck worker holds: the lock belongs to the open file
 * description the supervisor shares with it (inherited), so the supervisor's descriptor
 * unlocks it for both. Only what is the job's lock file, by device and inode. */
static void gs_release_job_lock(spank_t sp)
{
    char path[PATH_MAX + 32];
    struct stat want, st;
    struct dirent *entry;
    DIR *fds;
    int fd;

    if (gs_job_file(sp, GS_LOCK_SUFFIX, path, sizeof(path)) < 0 || stat(path, &want) < 0)
        return; /* an epilog's lock, already removed: no one waits on it */
    if (!(fds = opendir("/proc/self/fd"))) {
        slurm_error("gpushare: cannot release %s for a stuck worker: /proc/self/fd: %m", path);
        return;
    }
    while ((entry = readdir(fds))) {
        fd = atoi(entry->d_name);
        if (fd <= STDERR_FILENO || fd == dirfd(fds) || fstat(fd, &st) < 0)
            continue;
        if (st.st_dev == want.st_dev && st.st_ino == want.st_ino && flock(fd, LOCK_UN) < 0)
            slurm_error("gpushare: cannot release %s for a stuck worker: %m", path);
    }
    closedir(fds);
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

/* Hand the failure to the Python's fault path in a process of its own, bounded by until
 * (the supervisor's one deadline); 0 when it says it handled it. */
static int gs_fault_path(const char *callback, spank_t sp, int ac, char **av,
                         const sigset_t *mask, double until)
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
        gs_python_deadline = until;
        _exit(gs_call_python(name, sp, ac, av) == 0 ? 0 : 1);
    }
    rc = gs_wait_child(pid, until, &status);
    if (rc == 1)
        (void)gs_kill_worker(pid, until);
    return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* No worker could be forked: no Python runs without its deadline (it would run in Slurm's
 * prolog or epilog process, unbounded). A node fault, failed from C: the node is drained
 * with the cause, a prolog's tasks are told; 1, the worker's failure. */
int gs_no_worker(const char *callback, spank_t sp, const char *lock_at_end, const char *cause)
{
    char why[128], task_text[256];
    const char *what = strcmp(callback, "job_prolog") == 0 ? "prolog" : "epilog";

    snprintf(why, sizeof(why), "cannot fork the %s worker: %s", what, cause);
    slurm_error("gpushare: %s: %s; no Python runs without its deadline: the node is drained",
                callback, why);
    (void)gs_drain_node(why);
    if (strcmp(callback, "job_prolog") == 0) {
        snprintf(task_text, sizeof(task_text), "could not set up this job on its node: %s. "
                 "The node was drained; submit the job again", why);
        gs_fail_tasks(sp, task_text);
    }
    gs_finish(callback, sp, lock_at_end);
    return 1;
}

int gs_supervise(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end)
{
    char doing[GS_BOARD_SIZE + 1], why[GS_BOARD_SIZE + 1], task_text[GS_BOARD_SIZE + 96];
    const char *what = strcmp(callback, "job_prolog") == 0 ? "prolog" : "epilog";
    double started = gs_now(), limit = gs_worker_deadline(), deadline = started + limit;
    double until = started + gs_wait_limit(); /* the supervisor's own, one deadline */
    sigset_t chld, mask;
    int status = 0, rc;
    pid_t worker, stuck = 0;

    /* Children are waited for here: never reaped behind our back (SIGCHLD ignored). */
    (void)signal(SIGCHLD, SIG_DFL);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &mask);
    /* Where a worker with prefork= names its child in the prefork server (gs_prefork.c). */
    /* an anonymous mapping takes fd -1, which cppcheck's mmap() model does not know */
    /* cppcheck-suppress invalidFunctionArg */
    gs_delegate = mmap(NULL, sizeof(*gs_delegate), GS_RW, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (gs_delegate == MAP_FAILED)
        gs_delegate = NULL;
    worker = fork();
    if (worker < 0) {
        sigprocmask(SIG_SETMASK, &mask, NULL);
        return gs_no_worker(callback, sp, lock_at_end, strerror(errno));
    }
    if (worker == 0) {
        (void)setpgid(0, 0);
        sigprocmask(SIG_SETMASK, &mask, NULL);
        gs_python_deadline = deadline;
        _exit(gs_run_worker(callback, sp, ac, av, lock_at_end));
    }
    rc = gs_wait_child(worker, deadline, &status);
    if (rc == 0 && !WIFSIGNALED(status))
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;

    gs_read_board(sp, doing, sizeof(doing));
    stuck = rc != 0 ? gs_kill_worker(worker, until) : gs_kill_delegate(until);
    if (gs_delegate)
        gs_delegate->pid = 0; /* dealt with: the fault path's own kill is of its own */
    if (rc != 0 && stuck) {
        /* The cause and the pid first: a drain reason keeps only its first 90 bytes. */
        snprintf(why, sizeof(why), "%s worker stuck unkillable (pid %d) after %g s%s%.80s",
                 what, (int)stuck, limit, *doing ? " while " : "", doing);
    } else if (rc != 0) {
        snprintf(why, sizeof(why), "%s worker timed out after %g s%s%.96s", what, limit,
                 *doing ? " while " : "", doing);
    } else {
        snprintf(why, sizeof(why), "%s worker killed by signal %d (OOM?)%s%.96s",
                 what, WTERMSIG(status), *doing ? " while " : "", doing);
    }
    slurm_error("gpushare: %s: %s; the node is drained", callback, why);
    gs_write_board(sp, why);
    /* A supervisor held up past its own deadline (stopped, a stalled machine) is waited for
     * by no one any more (the tasks and the epilog gave up): its report still gets the
     * fault path's own bound. */
    if (until <= gs_now())
        until = gs_now() + gs_fault_limit();
    if (gs_fault_path(callback, sp, ac, av, &mask, until) < 0) {
        slurm_error("gpushare: %s: the fault path did not finish within the %g s the worker "
                    "and it have; draining the node from C", callback, gs_wait_limit());
        (void)gs_drain_node(why);
        if (strcmp(callback, "job_prolog") == 0) {
            snprintf(task_text, sizeof(task_text), "could not set up this job on its node: "
                     "%s. The node was drained; submit the job again", why);
            gs_fail_tasks(sp, task_text);
        }
    }
    gs_finish(callback, sp, lock_at_end);
    if (stuck)
        gs_release_job_lock(sp);
    return 1;
}
