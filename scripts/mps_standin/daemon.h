/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What the control daemon's files share (daemon.c describes the daemon):
 *
 *   daemon_text.c      buffers, command words, JSON as json.dump writes it, numbers as
 *                      Python's int() and float() read them
 *   daemon_state.c     the daemon's state, the servers' pins, control.log and
 *                      standin-state.json
 *   daemon_servers.c   the servers, the signals and the waits
 *   daemon_commands.c  the commands and the serving of the control socket
 *   daemon.c           the start: paths, devices, the socket and daemon_main
 */
#ifndef GPUSHARE_MPS_STANDIN_DAEMON_H
#define GPUSHARE_MPS_STANDIN_DAEMON_H

#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>

#include "standin.h"

/* -------------------------------------------------------------- text (daemon_text.c) */

struct buf {
    char *data;
    size_t len, cap;
};

/* A word of a command: bytes, not NUL-terminated (a command may hold any byte). */
struct word {
    const char *p;
    size_t n;
};

void *grow(void *data, size_t count, size_t size);
void buf_add(struct buf *b, const char *data, size_t len);
void buf_str(struct buf *b, const char *text);
void buf_vprintf(struct buf *b, const char *fmt, va_list args);
__attribute__((format(printf, 2, 3))) void buf_printf(struct buf *b, const char *fmt, ...);
int word_is(struct word w, const char *text);
void buf_word(struct buf *b, struct word w);
void buf_words(struct buf *b, const struct word *words, size_t count);
void json_string(struct buf *b, const char *text, size_t len);
void json_cstring(struct buf *b, const char *text);
void json_float(struct buf *b, double value);
int py_int(struct word w, long long *out);
int py_float(struct word w, double *out);

/* ------------------------------------------------------------ state (daemon_state.c) */

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

struct daemon_state {
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
};

/* The daemon's one state, defined in daemon_state.c. */
extern struct daemon_state d;

double now(void);
const char *pins_get(const struct pins *pins, long long device);
void pins_set(struct pins *pins, long long device, struct word size);
void pins_copy(struct pins *into, const struct pins *from);
struct server *find_server(pid_t pid);
void drop_server(struct server *server);
pid_t *sorted_pids(void);
int write_all(int fd, const char *data, size_t len);
void log_line(const char *text, size_t len);
__attribute__((format(printf, 1, 2))) void log_printf(const char *fmt, ...);
void save(void);

/* -------------------------------------------------------- servers (daemon_servers.c) */

pid_t spawn_server(void);
__attribute__((noreturn)) void stop(const char *why);
void on_signal(int sig);
int wait_ready(int fd, short events, int timeout_ms);

/* ------------------------------------------------------ commands (daemon_commands.c) */

__attribute__((noreturn)) void serve(void);

#endif
