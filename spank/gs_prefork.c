/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * prefork=yes: a worker hands its callback to the node's prefork server, a root process
 * that holds the core imported (gpushare.node.prefork), instead of starting Python itself.
 *
 * The worker stays what Slurm, the tasks and the supervisor know: it holds the job's locks,
 * its supervisor's deadline covers it, and it ends with the callback's result. It only sends
 * the server a snapshot of what the core asks of SPANK (the job's ids, the two options, the
 * plugstack arguments, the environment, the deadline), then logs the lines the server's
 * child sends back as its own and returns that child's result. The child's pid goes into the
 * page the supervisor shares (struct gs_delegate), so a worker killed at its deadline takes
 * the child with it (gs_deadline.c). A child that dies without a result is a killed worker:
 * the worker kills itself the same way, and its supervisor reports it.
 *
 * Anything short of a child that started (no server, a socket that is not root's, a server
 * of other code, a refusal) runs the callback in place, as without prefork=; the first such
 * worker then starts a server for the next ones (gpushare_core_prefork).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "gs_internal.h"

#define GS_FRAME_MAX 65536
#define GS_REQUEST_MAX (1 << 20)

struct gs_delegate *gs_delegate = NULL;

/* A request being built: NUL-terminated fields one after another. */
struct gs_request {
    char *data;
    size_t len, cap;
    int failed;
};

static void gs_field(struct gs_request *req, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void gs_field(struct gs_request *req, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (req->failed)
        return;
    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(req->data + req->len, req->cap - req->len, fmt, ap);
        va_end(ap);
        if (n < 0 || req->len + (size_t)n + 1 > GS_REQUEST_MAX) {
            req->failed = 1;
            return;
        }
        if (req->len + (size_t)n + 1 <= req->cap)
            break;
        size_t cap = req->cap * 2 > req->len + (size_t)n + 1 ? req->cap * 2
                                                              : req->len + (size_t)n + 1;
        char *data = realloc(req->data, cap);
        if (!data) {
            req->failed = 1;
            return;
        }
        req->data = data;
        req->cap = cap;
    }
    req->len += (size_t)n + 1; /* the field's NUL ends it */
}

/* The server's socket, connected, when it is root's and its peer is root: else -1. */
static int gs_prefork_connect(void)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct ucred peer;
    socklen_t size = sizeof(peer);
    struct stat st;
    int fd;

    if (snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/" GS_PREFORK_SOCKET,
                 gs_state_dir) >= (int)sizeof(addr.sun_path))
        return -1;
    if (lstat(addr.sun_path, &st) < 0 || !S_ISSOCK(st.st_mode) || st.st_uid != 0 ||
        (st.st_mode & 077))
        return -1;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) < 0 || peer.uid != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* All of `len` bytes sent (`out`, never raising SIGPIPE) or read: 0, or -1 at an error or
 * the end of the stream first. */
static int gs_all(int fd, char *data, size_t len, int out)
{
    while (len > 0) {
        ssize_t n = out ? send(fd, data, len, MSG_NOSIGNAL) : read(fd, data, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* What the core would ask this callback's SPANK handle, and the process's own state. */
static int gs_send_request(int fd, const char *callback, spank_t sp, int ac, char **av,
                           const char *code)
{
    static const char *const options[] = {"gpu-share", "gpu-mps", NULL};
    struct gs_request req = {NULL, 0, 0, 0};
    uint32_t job_id = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    mode_t mask = umask(0);
    int rc;

    umask(mask);
    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
        return -1;
    gs_field(&req, "%s", GS_PREFORK_PROTOCOL);
    gs_field(&req, "%s", callback);
    gs_field(&req, "code=%s", code);
    gs_field(&req, "job_id=%u", job_id);
    gs_field(&req, "uid=%u", (unsigned)uid);
    gs_field(&req, "gid=%u", (unsigned)gid);
    gs_field(&req, "deadline=%.6f", gs_python_deadline);
    gs_field(&req, "umask=%o", (unsigned)mask);
    for (int i = 0; options[i]; i++) {
        const char *value = gs_getopt(sp, options[i]);

        if (value)
            gs_field(&req, "opt.%s=%s", options[i], value);
    }
    for (int i = 0; i < ac; i++)
        gs_field(&req, "arg=%s", av[i]);
    for (char **env = environ; env && *env; env++)
        gs_field(&req, "env=%s", *env);
    gs_field(&req, "%s", "");
    rc = req.failed ? -1 : gs_all(fd, req.data, req.len, 1);
    free(req.data);
    return rc;
}

/* The child's pid, for the supervisor's kill: with its start time, so that a pid used
 * again by another process is never killed. */
static void gs_note_delegate(const char *text)
{
    long pid = strtol(text, NULL, 10);

    if (!gs_delegate || pid <= 1 || (long)(pid_t)pid != pid)
        return; /* never one that pid_t would turn into another, such as 1 */
    if (gs_proc_start(pid, gs_delegate->start, sizeof(gs_delegate->start)) < 0)
        return;
    /* the start time first: the supervisor reads the pid, then the start time */
    __atomic_store_n(&gs_delegate->pid, (pid_t)pid, __ATOMIC_RELEASE);
}

/*
 * The server's answer, frame after frame: a kind byte, a big-endian length of at most
 * GS_FRAME_MAX, the payload (read into `payload`, GS_FRAME_MAX + 1 bytes). P names the
 * child that runs the callback, L is a log line (its level, its text), R the result, N a
 * refusal. GS_FRAMES_RESULT with *rc at R; GS_FRAMES_REFUSED at N; GS_FRAMES_ENDED when the
 * stream ends, or breaks off, first. *started is set once a P came.
 */
enum { GS_FRAMES_RESULT = 0, GS_FRAMES_REFUSED = -1, GS_FRAMES_ENDED = -2 };

static int gs_read_frames(int fd, char *payload, const char *callback, spank_t sp, int *rc,
                          int *started)
{
    char header[5];
    uint32_t len;

    while (gs_all(fd, header, sizeof(header), 0) == 0) {
        len = (uint32_t)(unsigned char)header[1] << 24 | (uint32_t)(unsigned char)header[2] << 16 |
              (uint32_t)(unsigned char)header[3] << 8 | (uint32_t)(unsigned char)header[4];
        if (len > GS_FRAME_MAX || gs_all(fd, payload, len, 0) < 0)
            break;
        payload[len] = '\0';
        if (header[0] == 'P') {
            *started = 1;
            gs_note_delegate(payload);
            gs_debug(sp, "cb=%s prefork child=%s", callback, payload);
        } else if (header[0] == 'L' && len > 0) {
            gs_log((unsigned char)payload[0], payload + 1);
        } else if (header[0] == 'R') {
            *rc = atoi(payload);
            return GS_FRAMES_RESULT;
        } else if (header[0] == 'N') {
            gs_debug(sp, "cb=%s prefork refused: %s", callback, payload);
            return GS_FRAMES_REFUSED;
        }
    }
    return GS_FRAMES_ENDED;
}

/*
 * Run the callback in the prefork server: 0 with *rc when a child of it ran the callback,
 * -1 when none started it (the caller runs it in place). A child that ends without a
 * result kills this worker: its supervisor handles a killed worker.
 */
int gs_prefork_call(const char *callback, spank_t sp, int ac, char **av, const char *code,
                    int *rc)
{
    /* Before the request: once it is sent, a child may run the callback, and this worker
     * must not fall back to running it too. */
    char *payload = malloc(GS_FRAME_MAX + 1);
    int fd = -1, started = 0, got = GS_FRAMES_REFUSED;

    if (!payload)
        return -1;
    if ((fd = gs_prefork_connect()) >= 0 && gs_send_request(fd, callback, sp, ac, av, code) == 0)
        got = gs_read_frames(fd, payload, callback, sp, rc, &started);
    if (fd >= 0)
        close(fd);
    free(payload);
    if (got == GS_FRAMES_ENDED && started) {
        slurm_error("gpushare: %s: its worker in the prefork server (pid %d) ended without a "
                    "result", callback, gs_delegate ? (int)gs_delegate->pid : -1);
        raise(SIGKILL); /* as that worker was: its supervisor reports a killed worker */
    }
    return got == GS_FRAMES_RESULT ? 0 : -1;
}
