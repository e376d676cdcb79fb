/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The stand-in's control daemon (-d, -f) and -v; front.c describes the program and its
 * faults.
 *
 * One command per connection on the SOCK_SEQPACKET socket $CUDA_MPS_PIPE_DIRECTORY/control
 * (up to 4096 bytes), one reply "<rc>\n<output>". The tests that drive it are Python, so
 * it reads as Python would: commands split on whitespace as str.split() does, numbers as
 * int() and float() read them (ASCII digits only, where Python also takes other scripts'
 * digits); and standin-state.json is written as json.dump writes it (ensure_ascii).
 *
 * SIGTERM and SIGCHLD are blocked except while the daemon waits (ppoll), so a signal is
 * handled between commands: SIGCHLD reaps the servers, SIGTERM stops the daemon. Every fd
 * the daemon opens is close-on-exec: its servers inherit neither the socket nor the lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

extern char **environ;

#define VERSION_LINE "nvidia-cuda-mps-control stand-in 0.1"
#define COMMAND_MAX 4096
#define BACKLOG 16
#define PEER_TIMEOUT_MS 5000
#define RETRY_MS 200
#define MAX_WORDS (COMMAND_MAX / 2 + 1)

/* ------------------------------------------------------------------ text */

struct buf {
    char *data;
    size_t len, cap;
};

static __attribute__((noreturn)) void out_of_memory(void)
{
    static const char text[] = STANDIN_NAME ": out of memory\n";
    ssize_t ignored = write(STDERR_FILENO, text, sizeof(text) - 1);

    (void)ignored;
    _exit(1);
}

static void *grow(void *data, size_t count, size_t size)
{
    size_t bytes;
    void *grown;

    if (size && count > SIZE_MAX / size)
        out_of_memory();
    bytes = count * size;
    /* malloc for a new block: gcc's analyzer takes realloc(NULL) for a free of NULL */
    grown = data ? realloc(data, bytes > 0 ? bytes : 1) : malloc(bytes > 0 ? bytes : 1);
    if (!grown)
        out_of_memory();
    return grown;
}

static void buf_add(struct buf *b, const char *data, size_t len)
{
    if (len > SIZE_MAX - b->len - 1)
        out_of_memory();
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;

        while (cap < b->len + len + 1)
            cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        b->data = grow(b->data, cap, 1);
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

static void buf_str(struct buf *b, const char *text)
{
    buf_add(b, text, strlen(text));
}

static void buf_vprintf(struct buf *b, const char *fmt, va_list args)
{
    char small[128];
    va_list again;
    int len;

    va_copy(again, args);
    len = vsnprintf(small, sizeof(small), fmt, args);
    if (len >= 0 && (size_t)len < sizeof(small)) {
        buf_add(b, small, (size_t)len);
    } else if (len >= 0) {
        char *big = grow(NULL, (size_t)len + 1, 1);

        vsnprintf(big, (size_t)len + 1, fmt, again);
        buf_add(b, big, (size_t)len);
        free(big);
    }
    va_end(again);
}

static __attribute__((format(printf, 2, 3))) void buf_printf(struct buf *b, const char *fmt,
                                                              ...)
{
    va_list args;

    va_start(args, fmt);
    buf_vprintf(b, fmt, args);
    va_end(args);
}

/* A word of a command: bytes, not NUL-terminated (a command may hold any byte). */
struct word {
    const char *p;
    size_t n;
};

static int word_is(struct word w, const char *text)
{
    return w.n == strlen(text) && memcmp(w.p, text, w.n) == 0;
}

static void buf_word(struct buf *b, struct word w)
{
    buf_add(b, w.p, w.n);
}

/* The words joined by single spaces, as ' '.join(words). */
static void buf_words(struct buf *b, const struct word *words, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (i)
            buf_add(b, " ", 1);
        buf_word(b, words[i]);
    }
}

/* The code point of the valid UTF-8 sequence at p and its length (1..4) in *len; *len 0
 * when p starts none. */
static uint32_t utf8_at(const unsigned char *p, size_t left, size_t *len)
{
    uint32_t code, min;

    *len = 0;
    if (p[0] < 0x80) {
        *len = 1;
        return p[0];
    }
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        *len = 2, code = p[0] & 0x1f, min = 0x80;
    else if (p[0] >= 0xe0 && p[0] <= 0xef)
        *len = 3, code = p[0] & 0x0f, min = 0x800;
    else if (p[0] >= 0xf0 && p[0] <= 0xf4)
        *len = 4, code = p[0] & 0x07, min = 0x10000;
    else
        return 0;
    if (left < *len) {
        *len = 0;
        return 0;
    }
    for (size_t i = 1; i < *len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            *len = 0;
            return 0;
        }
        code = code << 6 | (p[i] & 0x3f);
    }
    if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
        *len = 0;
    return code;
}

/* A JSON string as Python's json.dump writes it (ensure_ascii): printable ASCII as it is,
 * quotes, backslashes and control characters escaped, every other character as \uXXXX
 * (a surrogate pair beyond U+FFFF), and each byte of invalid UTF-8 as the lone surrogate
 * \udcXX that Python decodes it to (surrogateescape, as os.environ reads it). */
static void json_string(struct buf *b, const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *)text, *end = p + len;

    buf_add(b, "\"", 1);
    while (p < end) {
        const unsigned char *run = p;
        uint32_t code;
        size_t step;

        while (p < end && *p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\')
            p++;
        buf_add(b, (const char *)run, (size_t)(p - run));
        if (p == end)
            break;
        switch (*p) {
        case '"': buf_str(b, "\\\""); break;
        case '\\': buf_str(b, "\\\\"); break;
        case '\b': buf_str(b, "\\b"); break;
        case '\f': buf_str(b, "\\f"); break;
        case '\n': buf_str(b, "\\n"); break;
        case '\r': buf_str(b, "\\r"); break;
        case '\t': buf_str(b, "\\t"); break;
        default:
            code = utf8_at(p, (size_t)(end - p), &step);
            if (step == 0) {
                buf_printf(b, "\\udc%02x", *p);
                break;
            }
            if (code > 0xffff) {
                code -= 0x10000;
                buf_printf(b, "\\u%04x\\u%04x", 0xd800 + (code >> 10), 0xdc00 + (code & 0x3ff));
            } else {
                buf_printf(b, "\\u%04x", code);
            }
            p += step - 1;
            break;
        }
        p++;
    }
    buf_add(b, "\"", 1);
}

static void json_cstring(struct buf *b, const char *text)
{
    json_string(b, text, strlen(text));
}

/* A float as Python's repr() writes it: the shortest digits that read back the same,
 * positional from 1e-4 to below 1e16, with ".0" when it would look like an integer. */
static void json_float(struct buf *b, double value)
{
    char text[64];
    int digits, exponent;

    if (value != value || value - value != 0) { /* nan, inf: not a value this file holds */
        buf_str(b, value != value ? "NaN" : value > 0 ? "Infinity" : "-Infinity");
        return;
    }
    for (digits = 0; digits < 17; digits++) {
        snprintf(text, sizeof(text), "%.*e", digits, value);
        if (strtod(text, NULL) == value)
            break;
    }
    exponent = atoi(strchr(text, 'e') + 1);
    if (exponent < -4 || exponent >= 16) {
        buf_str(b, text);
        return;
    }
    snprintf(text, sizeof(text), "%.*f", digits > exponent ? digits - exponent : 0, value);
    buf_str(b, text);
    if (!strchr(text, '.'))
        buf_str(b, ".0");
}

/* Python's int() of a word: an optional sign, then decimal digits, single underscores
 * between them. 0 and *out set when it reads; -1 when not (or beyond long long). */
static int py_int(struct word w, long long *out)
{
    size_t i = 0;
    int negative = 0, digits = 0;
    unsigned long long value = 0, limit;

    if (i < w.n && (w.p[i] == '+' || w.p[i] == '-'))
        negative = w.p[i++] == '-';
    limit = negative ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX;
    for (; i < w.n; i++) {
        char c = w.p[i];

        if (c == '_' && digits && i + 1 < w.n && w.p[i + 1] >= '0' && w.p[i + 1] <= '9')
            continue;
        if (c < '0' || c > '9')
            return -1;
        if (value > (limit - (unsigned long long)(c - '0')) / 10)
            return -1;
        value = value * 10 + (unsigned long long)(c - '0');
        digits++;
    }
    if (!digits)
        return -1;
    *out = negative ? (long long)(0 - value) : (long long)value;
    return 0;
}

/* Digits with single underscores between them, from p; how many bytes they take (0: none). */
static size_t digit_part(const char *p, const char *end, struct buf *into)
{
    const char *start = p;

    if (p == end || *p < '0' || *p > '9')
        return 0;
    while (p < end) {
        if (*p >= '0' && *p <= '9') {
            buf_add(into, p, 1);
            p++;
        } else if (*p == '_' && p + 1 < end && p[1] >= '0' && p[1] <= '9') {
            p++;
        } else {
            break;
        }
    }
    return (size_t)(p - start);
}

/* Python's float() of a finite decimal word ([sign] digits [. digits] [e [sign] digits],
 * underscores between digits); 0 and *out set when it reads. inf and nan, which Python
 * reads too, are no percentage and are refused here. */
static int py_float(struct word w, double *out)
{
    const char *p = w.p, *end = w.p + w.n;
    struct buf clean = {0};
    size_t whole, fraction = 0;
    int ok = 0;

    if (p < end && (*p == '+' || *p == '-'))
        buf_add(&clean, p++, 1);
    whole = digit_part(p, end, &clean);
    p += whole;
    if (p < end && *p == '.') {
        buf_add(&clean, p++, 1);
        fraction = digit_part(p, end, &clean);
        p += fraction;
    }
    if (whole || fraction) {
        ok = 1;
        if (p < end && (*p == 'e' || *p == 'E')) {
            size_t exponent;

            buf_add(&clean, p++, 1);
            if (p < end && (*p == '+' || *p == '-'))
                buf_add(&clean, p++, 1);
            exponent = digit_part(p, end, &clean);
            p += exponent;
            ok = exponent > 0;
        }
        ok = ok && p == end;
    }
    if (ok)
        *out = strtod(clean.data, NULL);
    free(clean.data);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ state */

struct pin {
    long long device;
    char *size;
};

/* A device -> size map in insertion order (as a Python dict keeps it). */
struct pins {
    struct pin *items;
    size_t count;
};

struct server {
    pid_t pid;
    long long uid;
    double percentage;
    struct pins pinned;
};

static struct {
    char pipe_dir[PATH_MAX], log_dir[PATH_MAX];
    char control[PATH_MAX], pending[PATH_MAX], pid_file[PATH_MAX], lock_file[PATH_MAX];
    char fifo[PATH_MAX], control_log[PATH_MAX], state_file[PATH_MAX], state_tmp[PATH_MAX];
    char **devices;
    size_t device_count;
    int argc;
    char **argv;
    struct faults faults;
    double default_percentage;
    struct pins default_pinned;
    struct server *servers;
    size_t server_count;
    struct buf *commands;
    size_t command_count;
    double started_at, stopped_at; /* stopped_at < 0: not stopped */
    pid_t pid;
    int lock_fd, listen_fd;
    sigset_t wait_mask; /* the mask while waiting: SIGTERM and SIGCHLD let through */
} d = {.lock_fd = -1, .listen_fd = -1, .stopped_at = -1};

static volatile sig_atomic_t got_term, got_chld;

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *pins_get(const struct pins *pins, long long device)
{
    for (size_t i = 0; i < pins->count; i++)
        if (pins->items[i].device == device)
            return pins->items[i].size;
    return NULL;
}

static void pins_set(struct pins *pins, long long device, struct word size)
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

static void pins_copy(struct pins *into, const struct pins *from)
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

static struct server *find_server(pid_t pid)
{
    for (size_t i = 0; i < d.server_count; i++)
        if (d.servers[i].pid == pid)
            return &d.servers[i];
    return NULL;
}

static void drop_server(struct server *server)
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
static pid_t *sorted_pids(void)
{
    pid_t *pids = grow(NULL, d.server_count, sizeof(*pids));

    for (size_t i = 0; i < d.server_count; i++)
        pids[i] = d.servers[i].pid;
    qsort(pids, d.server_count, sizeof(*pids), compare_pids);
    return pids;
}

/* Write all of data to fd; 0, or -1 with errno. */
static int write_all(int fd, const char *data, size_t len)
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
static void log_line(const char *text, size_t len)
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

static __attribute__((format(printf, 1, 2))) void log_printf(const char *fmt, ...)
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
static void save(void)
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

/* ------------------------------------------------------------------ servers */

/* Start a server (this program with --server) with stdio on /dev/null, the daemon's
 * environment and its signal mask from before it blocked anything; its pid, or -1. */
static pid_t spawn_server(void)
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
static __attribute__((noreturn)) void stop(const char *why)
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

static void on_signal(int sig)
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
static int wait_ready(int fd, short events, int timeout_ms)
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

static __attribute__((noreturn)) void serve(void)
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

/* ------------------------------------------------------------------ start */

static __attribute__((noreturn, format(printf, 1, 2))) void fail(const char *fmt, ...)
{
    va_list args;

    fputs(STANDIN_NAME ": ", stderr);
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fputc('\n', stderr);
    exit(1);
}

/* dir/name as os.path.join writes it, or fail. */
static void join(char *into, const char *dir, const char *name)
{
    size_t len = strlen(dir);
    int n = snprintf(into, PATH_MAX, "%s%s%s", dir, len && dir[len - 1] == '/' ? "" : "/", name);

    if (n < 0 || n >= PATH_MAX)
        fail("path too long: %s/%s", dir, name);
}

static void resolve_paths(void)
{
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    const char *log_dir = getenv("CUDA_MPS_LOG_DIRECTORY");

    if (snprintf(d.pipe_dir, PATH_MAX, "%s", pipe_dir && *pipe_dir ? pipe_dir
                                                                     : "/tmp/nvidia-mps")
        >= PATH_MAX)
        fail("CUDA_MPS_PIPE_DIRECTORY too long");
    if (snprintf(d.log_dir, PATH_MAX, "%s", log_dir && *log_dir ? log_dir
                                                                 : "/var/log/nvidia-mps")
        >= PATH_MAX)
        fail("CUDA_MPS_LOG_DIRECTORY too long");
    join(d.control, d.pipe_dir, "control");
    join(d.pending, d.pipe_dir, "control.new");
    join(d.pid_file, d.pipe_dir, "nvidia-cuda-mps-control.pid");
    join(d.lock_file, d.pipe_dir, "control_lock");
    join(d.fifo, d.pipe_dir, "log");
    join(d.control_log, d.log_dir, "control.log");
    join(d.state_file, d.log_dir, "standin-state.json");
    join(d.state_tmp, d.log_dir, "standin-state.json.tmp");
}

static char *device_text;

/* CUDA_VISIBLE_DEVICES split on commas, each stripped, empty ones dropped; unset: one. */
static void read_devices(void)
{
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    char *copy, *p, *end;

    if (!visible) {
        d.devices = grow(NULL, 1, sizeof(*d.devices));
        d.devices[0] = "GPU-standin-0";
        d.device_count = 1;
        return;
    }
    /* kept for the daemon's life: d.devices point into it */
    copy = device_text = grow(NULL, strlen(visible) + 1, 1);
    strcpy(copy, visible);
    d.devices = grow(NULL, strlen(visible) / 2 + 1, sizeof(*d.devices));
    for (p = copy;; p = end + 1) {
        char *item = p, *last, *keep;

        end = strchr(p, ',');
        if (end)
            *end = '\0';
        last = item + strlen(item);
        while (item < last && space_at(item, last))
            item += space_at(item, last);
        /* trailing whitespace: cut after the last byte that is not part of any */
        keep = item;
        for (char *q = item; q < last;) {
            size_t space = space_at(q, last);

            if (space) {
                q += space;
            } else {
                q++;
                keep = q;
            }
        }
        *keep = '\0';
        if (*item)
            d.devices[d.device_count++] = item;
        if (!end)
            break;
    }
}

/* mkdir -p, as os.makedirs(exist_ok=True); 0 or -1 with errno. */
static int make_dirs(const char *path)
{
    char partial[PATH_MAX];
    size_t len = strlen(path);
    struct stat st;

    if (len >= sizeof(partial)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(partial, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (partial[i] != '/' && partial[i] != '\0')
            continue;
        if (partial[i - 1] == '/')
            continue;
        partial[i] = '\0';
        if (mkdir(partial, 0777) < 0 && errno != EEXIST)
            return -1;
        if (i < len)
            partial[i] = '/';
    }
    if (stat(path, &st) < 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = EEXIST;
        return -1;
    }
    return 0;
}

/* True when a live daemon holds this pipe directory's control_lock. */
static int daemon_in_use(void)
{
    int fd = open(d.lock_file, O_RDWR | O_CLOEXEC), busy;

    if (fd < 0)
        return 0;
    while ((busy = flock(fd, LOCK_EX | LOCK_NB)) < 0 && errno == EINTR)
        ;
    close(fd);
    return busy < 0;
}

static void setup(void)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct sigaction action = {.sa_handler = on_signal, .sa_flags = SA_NOCLDSTOP};
    sigset_t blocked;
    char line[32];
    int fd, locked, n;

    if (make_dirs(d.pipe_dir) < 0)
        fail("cannot create %s: %s", d.pipe_dir, strerror(errno));
    if (make_dirs(d.log_dir) < 0)
        fail("cannot create %s: %s", d.log_dir, strerror(errno));
    d.lock_fd = open(d.lock_file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d.lock_fd < 0)
        fail("cannot open %s: %s", d.lock_file, strerror(errno));
    while ((locked = flock(d.lock_fd, LOCK_EX | LOCK_NB)) < 0 && errno == EINTR)
        ;
    if (locked < 0) {
        fputs("An instance of this daemon is already running\n", stderr);
        exit(1);
    }
    if (unlink(d.control) < 0 && errno != ENOENT)
        fail("cannot remove %s: %s", d.control, strerror(errno));
    /* The control socket appears last, and already listening: a client that sees it also
     * finds the pid file and the log pipe, and its connect is never refused. */
    if (unlink(d.pending) < 0 && errno != ENOENT)
        fail("cannot remove %s: %s", d.pending, strerror(errno));
    if (strlen(d.pending) >= sizeof(addr.sun_path))
        fail("AF_UNIX path too long: %s", d.pending);
    strcpy(addr.sun_path, d.pending);
    d.listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (d.listen_fd < 0)
        fail("socket: %s", strerror(errno));
    if (bind(d.listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        fail("cannot bind %s: %s", d.pending, strerror(errno));
    if (listen(d.listen_fd, BACKLOG) < 0)
        fail("cannot listen on %s: %s", d.pending, strerror(errno));
    if (mkfifo(d.fifo, 0600) < 0 && errno != EEXIST)
        fail("cannot create %s: %s", d.fifo, strerror(errno));
    if (!faults_has(&d.faults, "no_pid_file")) {
        n = snprintf(line, sizeof(line), "%ld\n", (long)d.pid);
        fd = open(d.pid_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0 || write_all(fd, line, (size_t)n) < 0 || close(fd) < 0)
            fail("cannot write %s: %s", d.pid_file, strerror(errno));
    }
    /* SIGTERM and SIGCHLD wait for ppoll; the mask before is the servers' and ppoll's */
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &blocked, &d.wait_mask) < 0)
        fail("sigprocmask: %s", strerror(errno));
    sigdelset(&d.wait_mask, SIGTERM);
    sigdelset(&d.wait_mask, SIGCHLD);
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGTERM, &action, NULL) < 0 || sigaction(SIGCHLD, &action, NULL) < 0)
        fail("sigaction: %s", strerror(errno));
    {
        struct buf text = {0};

        buf_printf(&text, "Control daemon started, pid %ld, devices ", (long)d.pid);
        for (size_t i = 0; i < d.device_count; i++) {
            if (i)
                buf_str(&text, ",");
            buf_str(&text, d.devices[i]);
        }
        log_line(text.data, text.len);
        free(text.data);
    }
    save();
    if (rename(d.pending, d.control) < 0)
        fail("cannot rename %s: %s", d.pending, strerror(errno));
}

static void sleep_ms(long ms)
{
    struct timespec left = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};

    while (nanosleep(&left, &left) < 0 && errno == EINTR)
        ;
}

/* Daemonise: fork, setsid, fork, stdio on /dev/null, umask 077. Returns in the daemon
 * only; the caller's process exits 0 at once. */
static void daemonise(void)
{
    pid_t pid = fork();
    int devnull;

    if (pid < 0)
        fail("fork: %s", strerror(errno));
    if (pid > 0)
        exit(0);
    if (setsid() < 0)
        _exit(1);
    pid = fork();
    if (pid < 0)
        _exit(1);
    if (pid > 0)
        _exit(0);
    devnull = open("/dev/null", O_RDWR);
    if (devnull < 0)
        _exit(1);
    for (int fd = 0; fd < 3; fd++)
        if (dup2(devnull, fd) < 0)
            _exit(1);
    if (devnull > 2)
        close(devnull);
    umask(077);
}

static int start(int background, int argc, char **argv)
{
    struct faults active;

    if (faults_read(&active) < 0)
        fail("out of memory");
    if (faults_has(&active, "die_start")) {
        fputs("An error occurred while starting the control daemon "
              "(stand-in fault die_start)\n", stderr);
        return 1;
    }
    if (faults_has(&active, "hang_start"))
        for (;;)
            pause();
    if (faults_has(&active, "slow_start"))
        sleep_ms(1500);
    resolve_paths();
    if (daemon_in_use()) {
        fputs("An instance of this daemon is already running\n", stderr);
        return 1;
    }
    if (background)
        daemonise();
    if (faults_has(&active, "die_after_start")) {
        /* As NVIDIA's daemon does when a GPU cannot be used: a line in control.log, then
         * exit. */
        static const char line[] = "[stand-in] Failed to start the control daemon: no "
                                   "usable GPU (stand-in fault die_after_start)\n";
        int fd = open(d.control_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);

        if (fd >= 0) {
            if (write_all(fd, line, sizeof(line) - 1) < 0) {
                /* exiting 1 all the same */
            }
            close(fd);
        }
        _exit(1);
    }
    faults_free(&active);
    if (faults_read(&d.faults) < 0)
        fail("out of memory");
    d.pid = getpid();
    d.argc = argc;
    d.argv = argv;
    read_devices();
    d.default_percentage = 100.0;
    d.started_at = now();
    setup();
    serve();
}

int daemon_main(int argc, char **argv)
{
    int daemon = 0, foreground = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0) {
            puts(VERSION_LINE);
            return 0;
        }
        daemon |= strcmp(argv[i], "-d") == 0;
        foreground |= strcmp(argv[i], "-f") == 0;
    }
    if (daemon || foreground)
        return start(daemon, argc, argv);
    fprintf(stderr, "Unknown option %s; client mode takes no arguments\n", argv[1]);
    return 1;
}
