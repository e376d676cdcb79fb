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
#include <sys/statvfs.h>
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

/*
 * state_dir= is checked as gpushare.common.safefs.open_root_dir checks it, every component
 * from / down, each opened from its parent without following a link: a real directory,
 * root's, not writable by group or others (a sticky one like /tmp may be, above the state
 * directory). The state directory itself is not writable by group or others at all. A
 * directory only root can change stays as checked, so a process checks it once.
 */
static int gs_state_checked = 0;

/* One component (fd, shown as path); leaf: the state directory itself. */
static int gs_check_state_component(int fd, const char *path, int leaf)
{
    struct stat st;
    const char *problem = NULL;

    if (fstat(fd, &st) < 0)
        problem = "not readable";
    else if (!S_ISDIR(st.st_mode))
        problem = "not a directory";
    else if (st.st_uid != 0)
        problem = "not owned by root";
    else if ((st.st_mode & 022) && (leaf || !(st.st_mode & S_ISVTX)))
        problem = "writable by group or others";
    if (!problem)
        return 0;
    slurm_error("gpushare: refusing state_dir=%s: %s is %s (owner uid %d, mode %04o); chown "
                "root and chmod go-w it, or remove it", gs_state_dir, path, problem,
                (int)st.st_uid, (unsigned)(st.st_mode & 07777));
    return -1;
}

int gs_check_state_dir(int create)
{
    char copy[PATH_MAX], shown[PATH_MAX] = "", *name, *next, *save = NULL;
    int fd, child;

    if (gs_state_checked)
        return 0;
    if (snprintf(copy, sizeof(copy), "%s", gs_state_dir) >= (int)sizeof(copy) ||
        (fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -1;
    if (gs_check_state_component(fd, "/", 0) < 0) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    for (name = strtok_r(copy, "/", &save); name; name = next) {
        next = strtok_r(NULL, "/", &save);
        snprintf(shown + strlen(shown), sizeof(shown) - strlen(shown), "/%s", name);
        child = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (child < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, name, 0700) < 0 && errno != EEXIST) {
                slurm_error("gpushare: cannot create %s: %m", shown);
                close(fd);
                return -1;
            }
            child = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (child >= 0)
                (void)fchmod(child, 0755); /* as open_root_dir makes it */
        }
        close(fd);
        if (child < 0) {
            int saved = errno;
            if (saved == ELOOP || saved == ENOTDIR)
                slurm_error("gpushare: refusing state_dir=%s: %s is a symbolic link or not a "
                            "directory; remove it", gs_state_dir, shown);
            else if (saved != ENOENT)
                slurm_error("gpushare: state directory %s: %s: %m", gs_state_dir, shown);
            errno = saved;
            return -1;
        }
        fd = child;
        if (gs_check_state_component(fd, shown, next == NULL) < 0) {
            close(fd);
            errno = EPERM;
            return -1;
        }
    }
    close(fd);
    gs_state_checked = 1;
    return 0;
}

/* <state_dir>/jobs, created root-owned (with the state directory) when missing, checked. */
int gs_jobs_dir(char *out, size_t size)
{
    int fd;

    if (gs_check_state_dir(1) < 0)
        return -1;
    if (snprintf(out, size, "%s/" GS_JOBS_DIR, gs_state_dir) >= (int)size)
        return -1;
    if (mkdir(out, 0700) < 0 && errno != EEXIST) {
        slurm_error("gpushare: cannot create %s: %m", out);
        return -1;
    }
    if ((fd = gs_open_dir_at(AT_FDCWD, out)) < 0) {
        slurm_error("gpushare: refusing %s: not a directory of root's out of others' reach; "
                    "remove it", out);
        return -1;
    }
    close(fd);
    return 0;
}

/* Open a root-owned lock file: -1 with errno ENOENT when absent and not created. */
int gs_open_lock(const char *path, int create)
{
    struct stat st;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (create ? O_CREAT : 0),
                  0600);

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
    int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
                    (st.st_mode & 022))) {
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
int gs_lock_daemon(int store_fd, const char *key)
{
    char name[GS_KEY_MAX + 8];
    struct stat held, named;
    int fd;

    snprintf(name, sizeof(name), "%s.lock", key);
    fd = openat(store_fd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd >= 0 && fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && held.st_uid == geteuid() &&
        gs_flock_until(fd, LOCK_EX, gs_now() + gs_timeout) == 0 &&
        fstatat(store_fd, name, &named, AT_SYMLINK_NOFOLLOW) == 0 && named.st_ino == held.st_ino)
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
    fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                0600);
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

int gs_state_dir_full(void)
{
    struct statvfs space;

    if (statvfs(gs_state_dir, &space) < 0)
        return 0;
    return space.f_bfree == 0 || (space.f_files > 0 && space.f_ffree == 0);
}
