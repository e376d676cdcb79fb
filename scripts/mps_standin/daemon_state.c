/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The control daemon's state: the servers and their pins, control.log and
 * standin-state.json (daemon.c describes the daemon).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

extern char **environ;

/* ------------------------------------------------------------------ state */

struct daemon_state d = {.lock_fd = -1, .listen_fd = -1, .stopped_at = -1};

double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *pins_get(const struct pins *pins, long long device)
{
    for (size_t i = 0; i < pins->count; i++)
        if (pins->items[i].device == device)
            return pins->items[i].size;
    return NULL;
}

void pins_set(struct pins *pins, long long device, struct word size)
{
    char *copy = grow(NULL, size.n + 1, 1);

    memcpy(copy, size.p, size.n);
    copy[size.n] = '\0';
    for (size_t i = 0; i < pins->count; i++) {
        if (pins->items[i].device == device) {
            free(pins->items[i].size);
            pins->items[i].size = copy;
            return;
        }
    }
    pins->items = grow(pins->items, pins->count + 1, sizeof(*pins->items));
    pins->items[pins->count++] = (struct pin){device, copy};
}

void pins_copy(struct pins *into, const struct pins *from)
{
    into->items = NULL;
    into->count = 0;
    for (size_t i = 0; i < from->count; i++)
        pins_set(into, from->items[i].device,
                 (struct word){from->items[i].size, strlen(from->items[i].size)});
}

static void pins_free(struct pins *pins)
{
    for (size_t i = 0; i < pins->count; i++)
        free(pins->items[i].size);
    free(pins->items);
    pins->items = NULL;
    pins->count = 0;
}

static void json_pins(struct buf *b, const struct pins *pins)
{
    buf_add(b, "{", 1);
    for (size_t i = 0; i < pins->count; i++) {
        buf_printf(b, "%s\"%lld\": ", i ? ", " : "", pins->items[i].device);
        json_cstring(b, pins->items[i].size);
    }
    buf_add(b, "}", 1);
}

struct server *find_server(pid_t pid)
{
    for (size_t i = 0; i < d.server_count; i++)
        if (d.servers[i].pid == pid)
            return &d.servers[i];
    return NULL;
}

void drop_server(struct server *server)
{
    size_t index = (size_t)(server - d.servers);

    pins_free(&server->pinned);
    memmove(server, server + 1, (d.server_count - index - 1) * sizeof(*server));
    d.server_count--;
}

static int compare_pids(const void *a, const void *b)
{
    pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;

    return (x > y) - (x < y);
}

/* The servers' pids, ascending (the caller frees them). */
pid_t *sorted_pids(void)
{
    pid_t *pids = grow(NULL, d.server_count, sizeof(*pids));

    for (size_t i = 0; i < d.server_count; i++)
        pids[i] = d.servers[i].pid;
    qsort(pids, d.server_count, sizeof(*pids), compare_pids);
    return pids;
}

/* Write all of data to fd; 0, or -1 with errno. */
int write_all(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t done = write(fd, data, len);

        if (done < 0 && errno == EINTR)
            continue;
        if (done < 0)
            return -1;
        data += done;
        len -= (size_t)done;
    }
    return 0;
}

/* A line in control.log: "[YYYY-mm-dd HH:MM:SS] " and the text (at best: no one to tell). */
void log_line(const char *text, size_t len)
{
    struct buf line = {0};
    char stamp[64];
    time_t t = time(NULL);
    struct tm tm;
    int fd;

    if (!localtime_r(&t, &tm) || !strftime(stamp, sizeof(stamp), "[%Y-%m-%d %H:%M:%S] ", &tm))
        stamp[0] = '\0';
    buf_str(&line, stamp);
    buf_add(&line, text, len);
    buf_add(&line, "\n", 1);
    fd = open(d.control_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) {
        if (write_all(fd, line.data, line.len) < 0) {
            /* nothing to do: the log is for people */
        }
        close(fd);
    }
    free(line.data);
}

__attribute__((format(printf, 1, 2))) void log_printf(const char *fmt, ...)
{
    struct buf text = {0};
    va_list args;

    va_start(args, fmt);
    buf_vprintf(&text, fmt, args);
    va_end(args);
    log_line(text.data ? text.data : "", text.len);
    free(text.data);
}

/* standin-state.json, as json.dump(state) writes it, through a temporary file and rename. */
void save(void)
{
    struct buf s = {0};
    gid_t *groups = NULL;
    int group_count = getgroups(0, NULL), fd, failed;

    if (group_count > 0) {
        groups = grow(NULL, (size_t)group_count, sizeof(*groups));
        group_count = getgroups(group_count, groups);
    }
    buf_printf(&s, "{\"pid\": %ld, \"uid\": %lu, \"gid\": %lu, \"groups\": [", (long)d.pid,
               (unsigned long)getuid(), (unsigned long)getgid());
    for (int i = 0; i < group_count; i++)
        buf_printf(&s, "%s%lu", i ? ", " : "", (unsigned long)groups[i]);
    free(groups);
    buf_str(&s, "], \"argv\": [");
    json_cstring(&s, standin_self);
    for (int i = 1; i < d.argc; i++) {
        buf_str(&s, ", ");
        json_cstring(&s, d.argv[i]);
    }
    buf_str(&s, "], \"env\": {");
    /* as os.environ: entries with a "=", the first of a name wins */
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t name_len;
        int seen = 0;

        if (!eq)
            continue;
        name_len = (size_t)(eq - *e);
        for (char **before = environ; before < e && !seen; before++)
            seen = strncmp(*before, *e, name_len + 1) == 0;
        if (seen)
            continue;
        if (s.data[s.len - 1] != '{')
            buf_str(&s, ", ");
        json_string(&s, *e, name_len);
        buf_str(&s, ": ");
        json_cstring(&s, eq + 1);
    }
    buf_str(&s, "}, \"devices\": [");
    for (size_t i = 0; i < d.device_count; i++) {
        if (i)
            buf_str(&s, ", ");
        json_cstring(&s, d.devices[i]);
    }
    buf_str(&s, "], \"faults\": [");
    for (size_t i = 0; i < d.faults.count; i++) {
        if (i)
            buf_str(&s, ", ");
        json_cstring(&s, d.faults.names[i]);
    }
    buf_str(&s, "], \"default_active_thread_percentage\": ");
    json_float(&s, d.default_percentage);
    buf_str(&s, ", \"default_device_pinned_mem_limit\": ");
    json_pins(&s, &d.default_pinned);
    buf_str(&s, ", \"servers\": {");
    for (size_t i = 0; i < d.server_count; i++) {
        const struct server *server = &d.servers[i];

        buf_printf(&s, "%s\"%ld\": {\"uid\": %lld, \"active_thread_percentage\": ",
                   i ? ", " : "", (long)server->pid, server->uid);
        json_float(&s, server->percentage);
        buf_str(&s, ", \"pinned\": ");
        json_pins(&s, &server->pinned);
        buf_str(&s, "}");
    }
    buf_str(&s, "}, \"commands\": [");
    for (size_t i = 0; i < d.command_count; i++) {
        if (i)
            buf_str(&s, ", ");
        json_string(&s, d.commands[i].data, d.commands[i].len);
    }
    buf_str(&s, "], \"started_at\": ");
    json_float(&s, d.started_at);
    buf_str(&s, ", \"stopped_at\": ");
    if (d.stopped_at < 0)
        buf_str(&s, "null");
    else
        json_float(&s, d.stopped_at);
    buf_str(&s, "}");

    fd = open(d.state_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    failed = fd < 0 || write_all(fd, s.data, s.len) < 0;
    if (fd >= 0 && close(fd) < 0)
        failed = 1;
    if (failed || rename(d.state_tmp, d.state_file) < 0)
        unlink(d.state_tmp); /* the tests that read it will say what is missing */
    free(s.data);
}
