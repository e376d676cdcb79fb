/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The control daemon's commands and the serving of its control socket (daemon.c describes
 * the daemon).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "daemon.h"

#define COMMAND_MAX 4096
#define PEER_TIMEOUT_MS 5000
#define RETRY_MS 200
#define MAX_WORDS (COMMAND_MAX / 2 + 1)

/* ------------------------------------------------------------------ commands */

static int device_index(struct word w, long long *device)
{
    return py_int(w, device) == 0 && *device >= 0 && (size_t)*device < d.device_count ? 0
                                                                                         : -1;
}

static int percentage(struct word w, double *value)
{
    return py_float(w, value) == 0 && *value > 0 && *value <= 100 ? 0 : -1;
}

/* "<digits>M" or "<digits>G", not all zeros: the word as given. */
static int mem_size(struct word w)
{
    int nonzero = 0;

    if (w.n < 2 || (w.p[w.n - 1] != 'M' && w.p[w.n - 1] != 'G'))
        return -1;
    for (size_t i = 0; i + 1 < w.n; i++) {
        if (w.p[i] < '0' || w.p[i] > '9')
            return -1;
        nonzero |= w.p[i] != '0';
    }
    return nonzero ? 0 : -1;
}

static struct server *server_of(struct word w)
{
    long long pid;

    if (py_int(w, &pid) < 0 || pid <= 0 || pid > INT_MAX)
        return NULL;
    return find_server((pid_t)pid);
}

/* Run one command: its output into out, its status; *quit when the daemon is to stop. */
static int handle(const struct word *words, size_t count, struct buf *out, int *quit)
{
    struct word cmd = words[0];
    const struct word *args = words + 1;
    size_t nargs = count - 1;
    struct server *server;
    long long device, uid;
    double value;

    if (word_is(cmd, "quit")) {
        struct faults faults;

        if (faults_read(&faults) == 0) {
            int ignore = faults_has(&faults, "ignore_quit") || faults_has(&faults, "ignore_term");

            faults_free(&faults);
            if (ignore) {
                log_printf("quit ignored (stand-in fault ignore_quit)");
                return 0;
            }
        }
        *quit = 1;
        return 0;
    }
    if (word_is(cmd, "get_server_list")) {
        pid_t *pids = sorted_pids();

        for (size_t i = 0; i < d.server_count; i++)
            buf_printf(out, "%s%ld", i ? "\n" : "", (long)pids[i]);
        free(pids);
        return 0;
    }
    if (word_is(cmd, "start_server") && nargs >= 2 && word_is(args[0], "-uid")) {
        pid_t pid;

        if (py_int(args[1], &uid) < 0) {
            buf_str(out, "Invalid arguments ");
            buf_words(out, args, nargs);
            return 1;
        }
        if (uid != (long long)getuid() && getuid() != 0) {
            buf_printf(out, "Cannot start server for uid %lld: permission denied", uid);
            return 1;
        }
        for (size_t i = 0; i < d.server_count; i++) {
            if (d.servers[i].uid == uid) {
                buf_printf(out, "%ld", (long)d.servers[i].pid);
                return 0;
            }
        }
        pid = spawn_server();
        if (pid < 0) {
            buf_printf(out, "Cannot start server for uid %lld: %s", uid, strerror(errno));
            return 1;
        }
        d.servers = grow(d.servers, d.server_count + 1, sizeof(*d.servers));
        server = &d.servers[d.server_count++];
        server->pid = pid;
        server->uid = uid;
        server->percentage = d.default_percentage;
        pins_copy(&server->pinned, &d.default_pinned);
        log_printf("Starting new server %ld for user %lld", (long)pid, uid);
        buf_printf(out, "%ld", (long)pid);
        return 0;
    }
    if (word_is(cmd, "shutdown_server") && nargs >= 1) {
        int force = 0;

        server = server_of(args[0]);
        if (!server)
            goto not_found;
        for (size_t i = 1; i < nargs; i++)
            force |= word_is(args[i], "-f");
        kill(server->pid, force ? SIGKILL : SIGTERM);
        return 0;
    }
    if (word_is(cmd, "get_client_list") && nargs >= 1) {
        if (!server_of(args[0]))
            goto not_found;
        return 0;
    }
    if (word_is(cmd, "set_default_active_thread_percentage") && nargs == 1) {
        if (percentage(args[0], &value) < 0) {
            buf_str(out, "Invalid percentage ");
            buf_word(out, args[0]);
            return 1;
        }
        d.default_percentage = value;
        buf_printf(out, "%.1f", value);
        return 0;
    }
    if (word_is(cmd, "get_default_active_thread_percentage")) {
        buf_printf(out, "%.1f", d.default_percentage);
        return 0;
    }
    if (word_is(cmd, "set_active_thread_percentage") && nargs == 2) {
        server = server_of(args[0]);
        if (!server || percentage(args[1], &value) < 0)
            goto invalid;
        server->percentage = value;
        buf_printf(out, "%.1f", value);
        return 0;
    }
    if (word_is(cmd, "get_active_thread_percentage") && nargs == 1) {
        server = server_of(args[0]);
        if (!server)
            goto not_found;
        buf_printf(out, "%.1f", server->percentage);
        return 0;
    }
    if (word_is(cmd, "set_default_device_pinned_mem_limit") && nargs == 2) {
        if (device_index(args[0], &device) < 0 || mem_size(args[1]) < 0)
            goto invalid;
        pins_set(&d.default_pinned, device, args[1]);
        return 0;
    }
    if (word_is(cmd, "get_default_device_pinned_mem_limit") && nargs == 1) {
        const char *size;

        if (device_index(args[0], &device) < 0) {
            buf_str(out, "Invalid device ");
            buf_word(out, args[0]);
            return 1;
        }
        size = pins_get(&d.default_pinned, device);
        buf_str(out, size ? size : "0");
        return 0;
    }
    if (word_is(cmd, "set_device_pinned_mem_limit") && nargs == 3) {
        server = server_of(args[0]);
        if (!server || device_index(args[1], &device) < 0 || mem_size(args[2]) < 0)
            goto invalid;
        pins_set(&server->pinned, device, args[2]);
        return 0;
    }
    if (word_is(cmd, "get_device_pinned_mem_limit") && nargs == 2) {
        const char *size;

        server = server_of(args[0]);
        if (!server || device_index(args[1], &device) < 0)
            goto invalid;
        size = pins_get(&server->pinned, device);
        buf_str(out, size ? size : "0");
        return 0;
    }
    if (word_is(cmd, "lsdevice")) {
        for (size_t i = 0; i < d.device_count; i++)
            buf_printf(out, "%s%zu %s", i ? "\n" : "", i, d.devices[i]);
        return 0;
    }
    if (word_is(cmd, "ps")) {
        pid_t *pids = sorted_pids();

        buf_str(out, "PID ID SERVER DEVICE NAMESPACE COMMAND");
        for (size_t i = 0; i < d.server_count; i++)
            buf_printf(out, "\n%ld %zu - - - nvidia-cuda-mps-server", (long)pids[i], i);
        free(pids);
        return 0;
    }
    buf_str(out, "Unknown command: ");
    buf_words(out, words, count);
    return 1;

not_found:
    buf_str(out, "Server ");
    buf_word(out, args[0]);
    buf_str(out, " not found");
    return 1;
invalid:
    buf_str(out, "Invalid arguments ");
    buf_words(out, args, nargs);
    return 1;
}

/* Send one message on a non-blocking socket, waiting up to PEER_TIMEOUT_MS for room. */
static void send_reply(int conn, const char *data, size_t len)
{
    for (;;) {
        ssize_t sent = send(conn, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (sent >= 0 || (errno != EAGAIN && errno != EINTR))
            return;
        if (errno == EAGAIN && wait_ready(conn, POLLOUT, PEER_TIMEOUT_MS) != 1)
            return;
    }
}

/* One connection: one command, one reply. */
static void serve_one(int conn)
{
    char message[COMMAND_MAX];
    struct word words[MAX_WORDS];
    struct buf reply = {0}, out = {0};
    const char *start, *end;
    size_t count = 0;
    ssize_t got;
    int rc, quit = 0;

    if (wait_ready(conn, POLLIN, PEER_TIMEOUT_MS) != 1)
        goto done;
    do
        got = recv(conn, message, sizeof(message), MSG_DONTWAIT);
    while (got < 0 && errno == EINTR);
    if (got <= 0)
        goto done;
    /* the line, stripped of whitespace, and its words */
    start = message;
    end = message + got;
    for (const char *p = start; p < end;) {
        size_t space = space_at(p, end);
        const char *word = p;

        if (space) {
            p += space;
            continue;
        }
        while (p < end && !space_at(p, end))
            p++;
        if (count == 0)
            start = word;
        words[count++] = (struct word){word, (size_t)(p - word)};
    }
    if (count == 0)
        goto done;
    end = words[count - 1].p + words[count - 1].n;
    d.commands = grow(d.commands, d.command_count + 1, sizeof(*d.commands));
    d.commands[d.command_count] = (struct buf){0};
    buf_add(&d.commands[d.command_count++], start, (size_t)(end - start));
    {
        struct buf line = {0};

        buf_str(&line, "User command: ");
        buf_add(&line, start, (size_t)(end - start));
        log_line(line.data, line.len);
        free(line.data);
    }
    rc = handle(words, count, &out, &quit);
    save();
    buf_printf(&reply, "%d\n", rc);
    if (out.len)
        buf_add(&reply, out.data, out.len);
    send_reply(conn, reply.data, reply.len);
done:
    free(out.data);
    free(reply.data);
    close(conn);
    if (quit)
        stop("quit");
}

__attribute__((noreturn)) void serve(void)
{
    for (;;) {
        int conn;

        if (wait_ready(d.listen_fd, POLLIN, -1) != 1) {
            wait_ready(-1, 0, RETRY_MS);
            continue;
        }
        conn = accept4(d.listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (conn < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                wait_ready(-1, 0, RETRY_MS); /* out of fds or memory: not a busy loop */
            continue;
        }
        serve_one(conn);
    }
}
