/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Draining the node from C, for the node faults no Python is left to report: a worker
 * whose core does not load or import (a broken install, a missing libpython, a pythonpath=
 * without gpushare, no memory) and a worker that died before it gave the tasks its word
 * (the OOM killer, a unit that killed its cgroup); and requeueing the batch job of a
 * prolog whose core does not load, as gpushare.node.drain.requeue_job does. Every other
 * failure is sorted and reported by the Python (gpushare.node.faults,
 * gpushare.node.drain), which runs scontrol the same way: GS_SCONTROL, root's all the way
 * up, with a fixed PATH and slurmd's SLURM_CONF only, bounded by timeout=. A drain or a
 * requeue that cannot be done is logged with why; it never hangs or fails the caller
 * further.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gs_internal.h"

/* The most of `scontrol show config` read (about 10 KiB on a real cluster). */
#define GS_SCONTROL_OUTPUT_MAX (256 * 1024)

/* scontrol as root may run it: a regular file of root's out of others' reach, and so is
 * every directory above it (gpushare.node.drain checks it with check_root_owned_file). */
static int gs_scontrol_trusted(void)
{
    struct stat st;

    if (lstat(GS_SCONTROL, &st) < 0) {
        slurm_error("gpushare: cannot run %s: %m", GS_SCONTROL);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        slurm_error("gpushare: cannot run %s: not a regular file", GS_SCONTROL);
        return -1;
    }
    if (gs_untrusted(&st, 0))
        return gs_refuse("scontrol", GS_SCONTROL, &st, "reinstall Slurm's client");
    return gs_check_parents("scontrol", GS_SCONTROL);
}

/* Wait for `pid` until `deadline`; SIGKILL it then. Its exit status, or -1. */
static int gs_wait_until(pid_t pid, double deadline)
{
    int status = 0;
    pid_t done;

    for (;;) {
        done = waitpid(pid, &status, WNOHANG);
        if (done == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (done < 0 && errno != EINTR)
            return -1;
        if (gs_now() > deadline) {
            (void)kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            return -1;
        }
        usleep(10000);
    }
}

/* Read what fd gives into out (NUL-terminated; what does not fit is read and dropped)
 * until its end or the deadline. */
static void gs_read_until(int fd, char *out, size_t size, double deadline)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    char drop[4096];
    size_t used = 0;
    ssize_t got;
    double left;

    for (;;) {
        left = deadline - gs_now();
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) == 0)
            break;
        if (size - 1 > used)
            got = read(fd, out + used, size - 1 - used);
        else
            got = read(fd, drop, sizeof(drop));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        if (size - 1 > used)
            used += (size_t)got;
    }
    out[used] = '\0';
}

/* Run scontrol with args (argv[0] is set here), bounded by timeout=: its exit status, -1
 * when it could not run or did not answer in time. With out, its output goes there. */
static int gs_scontrol(char **argv, char *out, size_t size)
{
    char conf[PATH_MAX + 16];
    const char *slurm_conf = getenv("SLURM_CONF");
    char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", conf, NULL};
    double deadline = gs_now() + gs_timeout;
    int null_fd, pipe_fd[2] = {-1, -1};
    pid_t pid;

    if (gs_scontrol_trusted() < 0)
        return -1;
    argv[0] = (char *)GS_SCONTROL;
    if (slurm_conf && *slurm_conf == '/')
        snprintf(conf, sizeof(conf), "SLURM_CONF=%s", slurm_conf);
    else
        envp[1] = NULL;
    if (out && pipe2(pipe_fd, O_CLOEXEC) < 0) {
        slurm_error("gpushare: cannot run %s %s: pipe: %m", GS_SCONTROL, argv[1]);
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        slurm_error("gpushare: cannot run %s %s: fork: %m", GS_SCONTROL, argv[1]);
        if (out) {
            close(pipe_fd[0]);
            close(pipe_fd[1]);
        }
        return -1;
    }
    if (pid == 0) {
        null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null_fd >= 0) {
            dup2(null_fd, STDIN_FILENO);
            dup2(out ? pipe_fd[1] : null_fd, STDOUT_FILENO);
            dup2(null_fd, STDERR_FILENO);
        }
        execve(GS_SCONTROL, argv, envp);
        _exit(127);
    }
    if (out) {
        close(pipe_fd[1]);
        gs_read_until(pipe_fd[0], out, size, deadline);
        close(pipe_fd[0]);
    }
    return gs_wait_until(pid, deadline);
}

int gs_drain_node(const char *why)
{
    char node_arg[256], reason[GS_DRAIN_REASON_MAX + 16];
    char *argv[] = {NULL, "update", node_arg, "State=DRAIN", reason, NULL};
    const char *node = gs_node_name();

    if (!node) {
        slurm_error("gpushare: cannot drain this node (%s): no usable node name", why);
        return -1;
    }
    snprintf(node_arg, sizeof(node_arg), "NodeName=%s", node);
    /* The cause first, cut to what `sinfo -R` shows (gpushare.node.drain.fit_reason). */
    snprintf(reason, sizeof(reason), "Reason=" GS_DRAIN_PREFIX "%.*s",
             (int)(GS_DRAIN_REASON_MAX - sizeof(GS_DRAIN_PREFIX) + 1), why);
    if (gs_scontrol(argv, NULL, 0) != 0) {
        slurm_error("gpushare: cannot drain this node (%s): %s update failed or did not "
                    "answer within %g s", why, GS_SCONTROL, gs_timeout);
        return -1;
    }
    slurm_error("gpushare: drained this node: %s", why);
    return 0;
}

/* As gpushare.node.drain.requeue_job: held (requeuehold) unless slurm.conf's
 * SchedulerParameters has nohold_on_prolog_fail; slurmctld itself refuses a job that asked
 * --no-requeue (or runs under JobRequeue=0 without --requeue) and a job that is not a
 * batch job, as it does after its own prolog failures. */
const char *gs_requeue_job(uint32_t job_id)
{
    char job_arg[16], *config, *show[] = {NULL, "show", "config", NULL};
    char *requeue[] = {NULL, "requeuehold", job_arg, NULL};
    int held;

    config = malloc(GS_SCONTROL_OUTPUT_MAX);
    if (!config) {
        slurm_error("gpushare: job %u not requeued: no memory to read Slurm's config", job_id);
        return NULL;
    }
    if (gs_scontrol(show, config, GS_SCONTROL_OUTPUT_MAX) != 0) {
        slurm_error("gpushare: job %u not requeued: %s show config failed or did not answer "
                    "within %g s", job_id, GS_SCONTROL, gs_timeout);
        free(config);
        return NULL;
    }
    held = !gs_nohold_on_prolog_fail(config);
    free(config);
    snprintf(job_arg, sizeof(job_arg), "%u", job_id);
    if (!held)
        requeue[1] = "requeue";
    if (gs_scontrol(requeue, NULL, 0) != 0) {
        slurm_error("gpushare: job %u not requeued: %s %s refused it (--no-requeue, not a "
                    "batch job) or did not answer within %g s", job_id, GS_SCONTROL,
                    requeue[1], gs_timeout);
        return NULL;
    }
    slurm_error("gpushare: job %u %s, as Slurm does after a failing prolog", job_id,
                held ? "requeued and held" : "requeued");
    return held ? "held" : "requeued";
}
