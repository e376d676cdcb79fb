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
 *
 * This file starts it; daemon.h names the files that do the rest and declares what they
 * share.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

#define VERSION_LINE "nvidia-cuda-mps-control stand-in 0.1"
#define BACKLOG 16

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
