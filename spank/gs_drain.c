/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Draining the node from C, for the node faults no Python is left to report: a worker
 * whose core does not load (a broken install, a missing libpython, no memory) and a worker
 * that died before it gave the tasks its word (the OOM killer, a unit that killed its
 * cgroup). Every other failure is sorted and reported by the Python (gpushare.node.faults,
 * gpushare.node.drain), which runs scontrol the same way: GS_SCONTROL, root's all the way
 * up, with a fixed PATH and slurmd's SLURM_CONF only, bounded by timeout=. A drain that
 * cannot be done is logged with why; it never hangs or fails the caller further.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gs_internal.h"

/* scontrol as root may run it: a regular file of root's out of others' reach, and so is
 * every directory above it (gpushare.node.drain checks it with check_root_owned_file). */
static int gs_scontrol_trusted(void)
{
    struct stat st;

    if (lstat(GS_SCONTROL, &st) < 0) {
        slurm_error("gpushare: cannot drain this node: %s: %m", GS_SCONTROL);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        slurm_error("gpushare: cannot drain this node: %s is not a regular file", GS_SCONTROL);
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

int gs_drain_node(const char *why)
{
    char node_arg[256], reason[GS_DRAIN_REASON_MAX + 16], conf[PATH_MAX + 16];
    const char *node = gs_node_name(), *slurm_conf = getenv("SLURM_CONF");
    char *argv[] = {(char *)GS_SCONTROL, "update", node_arg, "State=DRAIN", reason, NULL};
    char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", conf, NULL};
    int null_fd, rc;
    pid_t pid;

    if (!node) {
        slurm_error("gpushare: cannot drain this node (%s): no usable node name", why);
        return -1;
    }
    if (gs_scontrol_trusted() < 0)
        return -1;
    snprintf(node_arg, sizeof(node_arg), "NodeName=%s", node);
    /* The cause first, cut to what `sinfo -R` shows (gpushare.node.drain.fit_reason). */
    snprintf(reason, sizeof(reason), "Reason=" GS_DRAIN_PREFIX "%.*s",
             (int)(GS_DRAIN_REASON_MAX - sizeof(GS_DRAIN_PREFIX) + 1), why);
    if (slurm_conf && *slurm_conf == '/')
        snprintf(conf, sizeof(conf), "SLURM_CONF=%s", slurm_conf);
    else
        envp[1] = NULL;
    pid = fork();
    if (pid < 0) {
        slurm_error("gpushare: cannot drain this node (%s): fork: %m", why);
        return -1;
    }
    if (pid == 0) {
        null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null_fd >= 0) {
            dup2(null_fd, STDIN_FILENO);
            dup2(null_fd, STDOUT_FILENO);
            dup2(null_fd, STDERR_FILENO);
        }
        execve(GS_SCONTROL, argv, envp);
        _exit(127);
    }
    rc = gs_wait_until(pid, gs_now() + gs_timeout);
    if (rc != 0) {
        slurm_error("gpushare: cannot drain this node (%s): %s update failed or did not "
                    "answer within %g s", why, GS_SCONTROL, gs_timeout);
        return -1;
    }
    slurm_error("gpushare: drained this node: %s", why);
    return 0;
}
