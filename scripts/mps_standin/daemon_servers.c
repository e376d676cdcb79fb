/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The control daemon's servers, its signals and its waits (daemon.c describes the daemon).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

extern char **environ;

/* ------------------------------------------------------------------ servers */

static volatile sig_atomic_t got_term, got_chld;

/* Start a server (this program with --server) with stdio on /dev/null, the daemon's
 * environment and its signal mask from before it blocked anything; its pid, or -1. */
pid_t spawn_server(void)
{
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    char *args[] = {standin_self, "--server", NULL};
    pid_t pid = -1;
    int devnull, rc;

    devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0)
        return -1;
    rc = posix_spawn_file_actions_init(&actions);
    if (rc == 0) {
        for (int fd = 0; fd < 3 && rc == 0; fd++)
            rc = posix_spawn_file_actions_adddup2(&actions, devnull, fd);
        if (rc == 0 && (rc = posix_spawnattr_init(&attr)) == 0) {
            rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
            if (rc == 0)
                rc = posix_spawnattr_setsigmask(&attr, &d.wait_mask);
            if (rc == 0)
                rc = posix_spawn(&pid, standin_self, &actions, &attr, args, environ);
            posix_spawnattr_destroy(&attr);
        }
        posix_spawn_file_actions_destroy(&actions);
    }
    close(devnull);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return pid;
}

static void reap(void)
{
    for (;;) {
        pid_t pid = waitpid(-1, NULL, WNOHANG);
        struct server *server;

        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        server = find_server(pid);
        if (server) {
            drop_server(server);
            log_printf("Server %ld exited", (long)pid);
        }
    }
}

/* Stop the servers, remove the pipe directory's files, record the stop and exit. */
__attribute__((noreturn)) void stop(const char *why)
{
    for (size_t i = 0; i < d.server_count; i++)
        kill(d.servers[i].pid, SIGTERM);
    for (size_t i = 0; i < d.server_count; i++)
        while (waitpid(d.servers[i].pid, NULL, 0) < 0 && errno == EINTR)
            ;
    while (d.server_count)
        drop_server(&d.servers[d.server_count - 1]);
    unlink(d.control);
    unlink(d.pid_file);
    unlink(d.fifo);
    log_printf("Control daemon stopping (%s)", why);
    d.stopped_at = now();
    save();
    _exit(0);
}

void on_signal(int sig)
{
    if (sig == SIGTERM)
        got_term = 1;
    else
        got_chld = 1;
}

/* What the signals that came while the daemon waited ask for. */
static void handle_signals(void)
{
    if (got_chld) {
        got_chld = 0;
        reap();
    }
    if (got_term) {
        got_term = 0;
        if (fault_active("ignore_term")) {
            log_printf("SIGTERM ignored (stand-in fault ignore_term)");
            return;
        }
        stop("SIGTERM");
    }
}

static long long remaining_ms(const struct timespec *deadline)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)(deadline->tv_sec - t.tv_sec) * 1000 +
           (deadline->tv_nsec - t.tv_nsec) / 1000000;
}

/* Wait until fd (or nothing, fd < 0) is ready for events, handling signals meanwhile; 1
 * when ready, 0 after timeout_ms (< 0: none), -1 on error. */
int wait_ready(int fd, short events, int timeout_ms)
{
    struct timespec deadline;

    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms >= 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000;
        }
    }
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        struct timespec left, *limit = NULL;
        int n;

        if (timeout_ms >= 0) {
            long long ms = remaining_ms(&deadline);

            if (ms <= 0)
                return 0;
            left.tv_sec = (time_t)(ms / 1000);
            left.tv_nsec = (long)(ms % 1000) * 1000000;
            limit = &left;
        }
        n = ppoll(&p, 1, limit, &d.wait_mask);
        if (n < 0 && errno != EINTR)
            return -1;
        handle_signals();
        if (n > 0)
            return 1;
    }
}
