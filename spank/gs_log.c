/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What the C glue says: one line per decision in the admin's debug_log=, the core's log
 * lines to slurmd's log (lent through struct gs_host), and the counters of the callbacks
 * done without Python (folded by gpushare.node.counters).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "gs_host.h"
#include "gs_internal.h"

static const char *gs_ctx_name(void)
{
    switch (spank_context()) {
    case S_CTX_LOCAL: return "local";
    case S_CTX_REMOTE: return "remote";
    case S_CTX_ALLOCATOR: return "allocator";
    case S_CTX_SLURMD: return "slurmd";
    case S_CTX_JOB_SCRIPT: return "job_script";
    default: return "error";
    }
}

/* debug_log= lines name users' jobs, GPUs and pids: root's, 0640 (readable by the file's
 * group, root or an admin's adm), as gpushare.common.log makes it; a file an earlier release
 * made 0644 is narrowed at the next line. */
#define GS_DEBUG_LOG_MODE 0640
/* counters.json and counters.fast: root's alone, as gpushare.node.counters makes them. */
#define GS_COUNTERS_MODE 0600

/* Take away the bits beyond `mode` from a file of root's opened by `fd` (best effort). */
static void gs_narrow_mode(int fd, const struct stat *st, mode_t mode)
{
    if ((st->st_mode & 07777 & ~mode) && st->st_uid == 0)
        (void)fchmod(fd, st->st_mode & mode);
}

/* debug_log= opened for one line: never through a link, never blocking (a FIFO there must
 * not hang a prolog), and only a regular file of root's; anything else is said once per
 * process in slurmd's log and the line dropped. */
static int gs_open_debug_log(void)
{
    static int refused = 0;
    struct stat st = {0};
    int fd;

    if (refused)
        return -1;
    fd = open(gs_debug_log, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
              GS_DEBUG_LOG_MODE);
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0) {
        gs_narrow_mode(fd, &st, GS_DEBUG_LOG_MODE);
        return fd;
    }
    refused = 1;
    if (fd >= 0) {
        slurm_error("gpushare: refusing debug_log=%s: not a regular file of root's (mode %04o, "
                    "owner uid %d); remove it or point debug_log= elsewhere", gs_debug_log,
                    (unsigned)(st.st_mode & 0170777), (int)st.st_uid);
        close(fd);
    } else {
        slurm_error("gpushare: cannot open debug_log=%s: %m (a symbolic link is refused)",
                    gs_debug_log);
    }
    return -1;
}

/* One line per decision, appended to the admin-chosen debug_log. */
void gs_debug(spank_t sp, const char *fmt, ...)
{
    char line[1024];
    int off, fd;
    uint32_t job_id = 0;
    va_list ap;
    struct timespec now;

    if (!gs_debug_log[0])
        return;
    clock_gettime(CLOCK_REALTIME, &now);
    if (sp)
        (void)spank_get_item(sp, S_JOB_ID, &job_id);
    off = snprintf(line, sizeof(line), "%ld.%06ld pid=%d uid=%d ctx=%s job=%u ",
                   (long)now.tv_sec, now.tv_nsec / 1000L, (int)getpid(), (int)getuid(),
                   gs_ctx_name(), job_id);
    va_start(ap, fmt);
    vsnprintf(line + off, sizeof(line) - off - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    if ((fd = gs_open_debug_log()) < 0)
        return;
    if (write(fd, line, strlen(line)) < 0) {
        /* a debug line is best effort */
    }
    close(fd);
}

/* A line of the core for slurmd's log, at its level (gs_host.h). */
void gs_log(int level, const char *msg)
{
    switch (level) {
    case GS_LOG_ERROR: slurm_error("%s", msg); break;
    case GS_LOG_INFO: slurm_info("%s", msg); break;
    case GS_LOG_VERBOSE: slurm_verbose("%s", msg); break;
    case GS_LOG_USER: slurm_spank_log("%s", msg); break;
    default: slurm_debug("%s", msg); break;
    }
}

/* A prolog or epilog done here is counted as the Python callbacks are
 * (gpushare.node.counters folds counters.fast into counters.json under the same lock): a
 * line "<prolog|epilog> <microseconds>", or "<prolog|epilog> failed <microseconds>" when
 * `callback` is "prolog failed" or "epilog failed". */
void gs_count_fast(const char *callback, double seconds)
{
    char lines[64];
    char path[PATH_MAX + 32];
    int lock_fd, fd, len;
    struct stat st;

    snprintf(lines, sizeof(lines), "%s %ld\n", callback, (long)(seconds * 1e6));
    len = (int)strlen(lines);
    snprintf(path, sizeof(path), "%s/" GS_COUNTERS_FILE, gs_state_dir);
    lock_fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                   GS_COUNTERS_MODE);
    if (lock_fd < 0)
        return;
    if (fstat(lock_fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        gs_flock_until(lock_fd, LOCK_EX, gs_now() + 1.0) == 0) {
        gs_narrow_mode(lock_fd, &st, GS_COUNTERS_MODE);
        snprintf(path, sizeof(path), "%s/" GS_COUNTERS_FAST_FILE, gs_state_dir);
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                  GS_COUNTERS_MODE);
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
            gs_narrow_mode(fd, &st, GS_COUNTERS_MODE);
            if (write(fd, lines, len) != len) {
                /* a count is best effort, as in Python */
            }
        }
        if (fd >= 0)
            close(fd);
    }
    close(lock_fd);
}
