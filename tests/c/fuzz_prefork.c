/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The prefork server's answer as a worker reads it (spank/gs_prefork.c gs_read_frames) on
 * any bytes: frames of any kind and length, cut off anywhere. Only root's server can answer
 * (its socket and its peer are checked), but the reader runs as root in slurmstepd: whatever
 * comes, it stays within its buffer, hands the supervisor no pid it must not kill, and
 * reports a result only from an R frame. gs_prefork.c is included; every call out of it is
 * this file's. links: gs_parse.c */
#include "../../spank/gs_prefork.c"

#include "gs_fuzz.h"

char gs_state_dir[PATH_MAX] = "/nonexistent";
double gs_python_deadline = 0.0;
static int delegated; /* gs_proc_start calls: the pids the reader would hand the supervisor */

const char *gs_getopt(void *sp, const char *name)
{
    (void)sp;
    (void)name;
    return NULL;
}

/* Formatted as the plugin's would be: a payload that is not a string is an ASan report. */
void gs_debug(spank_t sp, const char *fmt, ...)
{
    char line[512];
    va_list ap;

    (void)sp;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
}

void gs_log(int level, const char *msg)
{
    if (level < 0 || level > 255)
        abort();
    (void)strlen(msg);
}

void slurm_error(const char *fmt, ...)
{
    (void)fmt;
    abort(); /* only gs_prefork_call says this, and it is not called here */
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
    (void)sp;
    (void)item;
    return ESPANK_ERROR;
}

/* Every pid "exists" here: what keeps a wrong one from the supervisor is the reader's own
 * check, not /proc. */
int gs_proc_start(long pid, char *out, size_t size)
{
    if (pid <= 1)
        abort();
    delegated++;
    snprintf(out, size, "%ld", pid);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gs_delegate delegate = {0, ""};
    char *payload = malloc(GS_FRAME_MAX + 1);
    int fds[2], rc = 0, started = 0, got;

    if (!payload || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0)
        abort();
    if (size > 150000) /* within the socket's buffer: the write must not wait for the read */
        size = 150000;
    if (size > 0 && send(fds[1], data, size, MSG_NOSIGNAL) != (ssize_t)size)
        abort();
    close(fds[1]);
    gs_delegate = &delegate;
    delegated = 0;
    got = gs_read_frames(fds[0], payload, "task_init", NULL, &rc, &started);
    gs_delegate = NULL;
    close(fds[0]);
    free(payload);
    if (got != GS_FRAMES_RESULT && got != GS_FRAMES_REFUSED && got != GS_FRAMES_ENDED)
        abort();
    if (got == GS_FRAMES_RESULT && !memchr(data, 'R', size))
        abort(); /* a result comes from an R frame only */
    if (size < 5 && (got != GS_FRAMES_ENDED || started))
        abort(); /* no whole header, no frame */
    if (delegate.pid != 0 && (delegate.pid <= 1 || !started || !delegated))
        abort(); /* the supervisor kills this pid at the deadline */
    return 0;
}
