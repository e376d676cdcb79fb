/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Root-safe files, directories and locks: what the C glue opens as root, it opens without
 * following a link, checks the owner and mode of, and writes atomically (the same rules as
 * gpushare.common.safefs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gs_internal.h"

double gs_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}


/*
 * Root runs the code it loads: the core library and everything below pythonpath= must be
 * out of every user's reach. A file or directory is trusted when it is owned by root and
 * not writable by group or others; so must be every directory above it, except that a
 * sticky one (like /tmp) may be writable, since nobody else can replace root's entries.
 */
int gs_untrusted(const struct stat *st, int sticky_ok)
{
    if (st->st_uid != 0)
        return 1;
    if (!(st->st_mode & (S_IWGRP | S_IWOTH)))
        return 0;
    return !(sticky_ok && S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX));
}

int gs_refuse(const char *what, const char *path, const struct stat *st, const char *fix)
{
    slurm_error("gpushare: refusing %s: %s is %s (owner uid %u, mode %04o); %s", what, path,
                st->st_uid != 0 ? "not owned by root" : "writable by group or others",
                (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777), fix);
    return -1;
}

/* Every directory from / down to (and with) the directory of real path `path`. */
int gs_check_parents(const char *what, const char *path)
{
    char dir[PATH_MAX];
    struct stat st;
    char *slash;

    if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
        return -1;
    for (;;) {
        slash = strrchr(dir, '/');
        if (!slash)
            return 0;
        if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
        if (lstat(dir, &st) < 0) {
            slurm_error("gpushare: refusing %s: cannot stat %s: %m", what, dir);
            return -1;
        }
        if (gs_untrusted(&st, 1))
            return gs_refuse(what, dir, &st, "chown root and chmod go-w it, or install "
                             "gpushare elsewhere");
        if (slash == dir)
            return 0;
    }
}

/* Refuse a state directory a user could have placed or can change (as gpushare.state). */
int gs_check_dir(const char *path)
{
    struct stat st;

    if (lstat(path, &st) < 0) {
        slurm_error("gpushare: state directory %s: %m", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
        slurm_error("gpushare: state directory %s must be a real directory owned by uid %d and "
                    "not writable by group/others (owner %d, mode %o); fix it or remove it",
                    path, (int)geteuid(), (int)st.st_uid, (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return 0;
}

/* <state_dir>/jobs, created root-owned (with its parents) when missing, then checked. */
int gs_jobs_dir(char *out, size_t size)
{
    char path[PATH_MAX];

    if (snprintf(path, sizeof(path), "%s", gs_state_dir) >= (int)sizeof(path))
        return -1;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
            slurm_error("gpushare: cannot create %s: %m", path);
            return -1;
        }
        *p = '/';
    }
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
        slurm_error("gpushare: cannot create the state directory %s: %m", path);
        return -1;
    }
    if (gs_check_dir(path) < 0)
        return -1;
    if (snprintf(out, size, "%s/jobs", path) >= (int)size)
        return -1;
    if (mkdir(out, 0700) < 0 && errno != EEXIST) {
        slurm_error("gpushare: cannot create %s: %m", out);
        return -1;
    }
    return gs_check_dir(out);
}

/* Open a root-owned lock file: -1 with errno ENOENT when absent and not created. */
int gs_open_lock(const char *path, int create)
{
    struct stat st;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | (create ? O_CREAT : 0), 0600);

    if (fd < 0)
        return -1;
    if (fd <= STDERR_FILENO) {
        /* slurmstepd's prolog runs with stdin closed; the worker points 0-2 at /dev/null */
        int high = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
        close(fd);
        if (high < 0)
            return -1;
        fd = high;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        slurm_error("gpushare: refusing lock file %s: not a regular file of uid %d", path,
                    (int)geteuid());
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}



/* flock() with a deadline; 0 when taken, -1 when still held by another at the deadline. */
int gs_flock_until(int fd, int operation, double deadline)
{
    while (flock(fd, operation | LOCK_NB) < 0) {
        if (errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        if (gs_now() > deadline)
            return -1;
        usleep(1000);
    }
    return 0;
}


/* The directory name below dir_fd (AT_FDCWD: an absolute path), opened when it is root's
 * and not writable by others, as root made it; -1 otherwise. */
int gs_open_dir_at(int dir_fd, const char *name)
{
    struct stat st;
    int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 022))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* A stream over the entries of the open directory fd, which stays open (closedir() it). */
DIR *gs_dir_stream(int fd)
{
    int copy = dup(fd);
    DIR *dir = copy >= 0 ? fdopendir(copy) : NULL;

    if (!dir && copy >= 0)
        close(copy);
    return dir;
}

/* The lock of daemon key (<key>.lock in the mps directory), taken within timeout= as
 * gpushare.node.mps.lock takes it: on the file that still has that name. -1 when not. */
int gs_lock_daemon(int mps_fd, const char *key)
{
    char name[GS_KEY_MAX + 8];
    struct stat held, named;
    int fd;

    snprintf(name, sizeof(name), "%s.lock", key);
    fd = openat(mps_fd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 && fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && held.st_uid == geteuid() &&
        gs_flock_until(fd, LOCK_EX, gs_now() + gs_timeout) == 0 &&
        fstatat(mps_fd, name, &named, AT_SYMLINK_NOFOLLOW) == 0 && named.st_ino == held.st_ino)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

/* A root-owned regular file below dir_fd, whole, NUL-terminated (free() it); NULL if not. */
char *gs_read_root_file(int dir_fd, const char *name, size_t max)
{
    struct stat st;
    char *text;
    ssize_t got;
    size_t len = 0;
    int fd = openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (size_t)st.st_size >= max || !(text = malloc((size_t)st.st_size + 1))) {
        close(fd);
        return NULL;
    }
    while (len < (size_t)st.st_size &&
           (got = read(fd, text + len, (size_t)st.st_size - len)) > 0)
        len += (size_t)got;
    close(fd);
    text[len] = '\0';
    if (len != (size_t)st.st_size || strlen(text) != len) {
        free(text);
        return NULL;
    }
    return text;
}


/* name below dir_fd replaced with text (a temporary file, renamed), with mode. With
 * no_replace, an existing name is kept and -1 returned. */
int gs_write_mode_at(int dir_fd, const char *name, const char *text, int no_replace,
                     mode_t mode)
{
    char tmp[GS_KEY_MAX + 64];
    size_t len = strlen(text), done = 0;
    ssize_t wrote = 0;
    int fd, rc;

    snprintf(tmp, sizeof(tmp), ".%s.%d.c.tmp", name, (int)getpid());
    (void)unlinkat(dir_fd, tmp, 0);
    fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    while (done < len && (wrote = write(fd, text + done, len - done)) > 0)
        done += (size_t)wrote;
    rc = done == len && fchmod(fd, mode) == 0 && fsync(fd) == 0 ? 0 : -1;
    close(fd);
    if (rc == 0)
        rc = no_replace ? linkat(dir_fd, tmp, dir_fd, name, 0) : renameat(dir_fd, tmp, dir_fd, name);
    (void)unlinkat(dir_fd, tmp, 0);
    return rc;
}

int gs_write_at(int dir_fd, const char *name, const char *text, int no_replace)
{
    return gs_write_mode_at(dir_fd, name, text, no_replace, 0600);
}

