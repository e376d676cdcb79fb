/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * gpushare SPANK plugin: the C glue in front of the Python core.
 *
 * It does only what must be C:
 *   - the SPANK symbols and the user option table (--gpu-share, --gpu-mps), with the
 *     option values validated here so srun/sbatch never start Python;
 *   - the plugstack arguments checked against the key list generated from
 *     gpushare.node.config at build time (an unknown key refuses to run);
 *   - a fast exit for jobs that do not use gpushare, decided without Python: this file
 *     does not link libpython, and loads the core (spank_gpushare_core.so, next to it)
 *     only when a job needs it, never inside slurmd;
 *   - each task's environment, applied from the root-owned file job_prolog wrote, so no
 *     interpreter ever runs in slurmstepd;
 *   - turning any failure of the core into a logged SPANK error.
 *
 * Built by spank/build.py, which defines GS_CORE_NAME, GS_DEFAULT_STATE_DIR, GS_KNOWN_KEYS
 * and GS_KNOWN_KEYS_TEXT.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "gs_host.h"

#define GS_EXPORT __attribute__((visibility("default")))

GS_EXPORT const char plugin_name[] = "gpushare";
GS_EXPORT const char plugin_type[] = "spank";
GS_EXPORT const unsigned int plugin_version = SLURM_VERSION_NUMBER;
GS_EXPORT const unsigned int spank_plugin_version = 1;

enum { GS_OPT_SHARE = 1, GS_OPT_MPS = 2 };

static int gs_opt_cb(int val, const char *optarg, int remote);

static struct spank_option gs_options[] = {
    {"gpu-share", "percent",
     "[gpushare] Share of one GPU through MPS, 1-100 (% of its SMs; device memory capped "
     "in proportion).",
     1, GS_OPT_SHARE, gs_opt_cb},
    {"gpu-mps", NULL,
     "[gpushare] Run one private MPS daemon over this job's whole GPUs, so its ranks share "
     "them.",
     0, GS_OPT_MPS, gs_opt_cb},
    SPANK_OPTIONS_TABLE_END};

/* Per-process state: options seen by the callbacks, parsed plugstack arguments. */
static int gs_share_percent = 0;
static int gs_private_mps = 0;
static int gs_args_parsed = 0;
static int gs_args_ok = 0;
static char gs_state_dir[PATH_MAX] = GS_DEFAULT_STATE_DIR; /* %n, %h expanded */
static char gs_debug_log[PATH_MAX] = "";
static char gs_pythonpath[PATH_MAX] = "";
static char gs_imex_dir[PATH_MAX] = ""; /* imex_channels=: "" when not checked */
static double gs_timeout = 10.0;         /* timeout=; its range is checked by Python */

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

/* One line per decision, appended to the admin-chosen debug_log (never a symlink). */
static void gs_debug(spank_t sp, const char *fmt, ...)
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
    fd = open(gs_debug_log, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, line, strlen(line)) < 0) {
        /* a debug line is best effort */
    }
    close(fd);
}

static int gs_known_key(const char *key, size_t len)
{
    static const char *known[] = {GS_KNOWN_KEYS, NULL};
    for (int i = 0; known[i]; i++)
        if (strlen(known[i]) == len && strncmp(known[i], key, len) == 0)
            return 1;
    return 0;
}

/*
 * This node's name, as slurmd knows it (slurmd -N gives one host several): slurmd puts it
 * in the environment of the processes it starts. Only a plain host name is accepted.
 */
static const char *gs_node_name(void)
{
    const char *name = getenv("SLURMD_NODENAME");
    static char host[256];

    if (!name || !*name) {
        if (gethostname(host, sizeof(host) - 1) < 0)
            return NULL;
        host[sizeof(host) - 1] = '\0';
        host[strcspn(host, ".")] = '\0';
        name = host;
    }
    if (strlen(name) > 200 || name[0] == '.' || name[strspn(name, "abcdefghijklmnopqrstuvwxyz"
                                                           "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                           "0123456789._-")] != '\0')
        return NULL;
    return name;
}

/* A path argument with %n (node name), %h (short host name) and %% expanded. */
static int gs_expand_path(char *dst, size_t size, const char *value, const char *key)
{
    char host[256];
    size_t used = 0;

    for (const char *p = value; *p; p++) {
        const char *add = NULL;
        char one[2] = {*p, '\0'};

        if (*p == '%' && p[1] == 'n') {
            add = gs_node_name();
        } else if (*p == '%' && p[1] == 'h') {
            if (gethostname(host, sizeof(host) - 1) == 0) {
                host[sizeof(host) - 1] = '\0';
                host[strcspn(host, ".")] = '\0';
                add = host;
            }
        } else if (*p == '%' && p[1] == '%') {
            add = "%";
        } else if (*p == '%') {
            slurm_error("gpushare: plugstack argument %s=%s: only %%n (node name), %%h (host "
                        "name) and %%%% may follow %%", key, value);
            return -1;
        } else {
            add = one;
        }
        if (*p == '%')
            p++;
        if (!add) {
            slurm_error("gpushare: plugstack argument %s=%s: this node's name is unknown or "
                        "not a plain host name", key, value);
            return -1;
        }
        if (used + strlen(add) >= size) {
            slurm_error("gpushare: plugstack argument %s=%s: path too long", key, value);
            return -1;
        }
        memcpy(dst + used, add, strlen(add));
        used += strlen(add);
    }
    dst[used] = '\0';
    return 0;
}

static int gs_copy_path(char *dst, const char *value, const char *key)
{
    if (strcmp(value, "none") == 0 || value[0] == '\0') {
        dst[0] = '\0';
        return 0;
    }
    if (value[0] != '/' || strlen(value) >= PATH_MAX) {
        slurm_error("gpushare: plugstack argument %s=%s: expected an absolute path", key, value);
        return -1;
    }
    return gs_expand_path(dst, PATH_MAX, value, key);
}

/*
 * Parse the plugstack arguments once per process. The key list comes from
 * gpushare.node.config; values other than the two paths C needs are checked by Python.
 */
static int gs_parse_args(int ac, char **av)
{
    if (gs_args_parsed)
        return gs_args_ok ? 0 : -1;
    gs_args_parsed = 1;
    for (int i = 0; i < ac; i++) {
        const char *eq = strchr(av[i], '=');
        if (!eq || !gs_known_key(av[i], (size_t)(eq - av[i]))) {
            slurm_error("gpushare: unknown plugstack argument '%s'; accepted keys: %s "
                        "(fix the gpushare line in plugstack.conf)",
                        av[i], GS_KNOWN_KEYS_TEXT);
            return -1;
        }
        if (strncmp(av[i], "state_dir=", 10) == 0) {
            if (gs_copy_path(gs_state_dir, eq + 1, "state_dir") < 0 || !gs_state_dir[0])
                return -1;
        } else if (strncmp(av[i], "debug_log=", 10) == 0) {
            if (gs_copy_path(gs_debug_log, eq + 1, "debug_log") < 0)
                return -1;
        } else if (strncmp(av[i], "pythonpath=", 11) == 0) {
            if (gs_copy_path(gs_pythonpath, eq + 1, "pythonpath") < 0)
                return -1;
        } else if (strncmp(av[i], "imex_channels=", 14) == 0) {
            if (gs_copy_path(gs_imex_dir, eq + 1, "imex_channels") < 0)
                return -1;
        } else if (strncmp(av[i], "timeout=", 8) == 0) {
            char *end = NULL;
            double value = strtod(eq + 1, &end);
            if (end && *end == '\0' && value >= 0.1 && value <= 600)
                gs_timeout = value;
        }
    }
    gs_args_ok = 1;
    return 0;
}

/* --gpu-share must be a whole percent in 1..100; checked where the user typed it. */
static int gs_parse_share(const char *arg)
{
    char *end = NULL;
    long value;

    if (!arg || !*arg)
        return -1;
    errno = 0;
    value = strtol(arg, &end, 10);
    if (errno || *end != '\0' || value < 1 || value > 100)
        return -1;
    return (int)value;
}

static int gs_opt_cb(int val, const char *optarg, int remote)
{
    if (val == GS_OPT_MPS) {
        gs_private_mps = 1;
        return 0;
    }
    gs_share_percent = gs_parse_share(optarg);
    if (gs_share_percent < 0) {
        slurm_error("gpushare: --gpu-share=%s is invalid: give a whole percent of one GPU "
                    "from 1 to 100, e.g. --gpu-share=25",
                    optarg ? optarg : "");
        gs_share_percent = 0;
        return -1;
    }
    (void)remote;
    return 0;
}

/* ---- the Python core, loaded lazily, never in slurmd ---------------------------- */

static gs_core_dispatch_f gs_core_dispatch = NULL;
static int gs_core_failed = 0;

/* The core lives next to this plugin: <dir of spank_gpushare.so>/GS_CORE_NAME. */
static int gs_core_path(char *path, size_t size)
{
    Dl_info info;
    const char *slash;

    if (!dladdr((void *)&gs_core_path, &info) || !info.dli_fname)
        return -1;
    slash = strrchr(info.dli_fname, '/');
    if (!slash)
        return snprintf(path, size, "%s", GS_CORE_NAME) < (int)size ? 0 : -1;
    return snprintf(path, size, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                    GS_CORE_NAME) < (int)size ? 0 : -1;
}

/*
 * Root runs the code it loads: the core library and everything below pythonpath= must be
 * out of every user's reach. A file or directory is trusted when it is owned by root and
 * not writable by group or others; so must be every directory above it, except that a
 * sticky one (like /tmp) may be writable, since nobody else can replace root's entries.
 */
#define GS_TREE_MAX_ENTRIES 20000

static int gs_untrusted(const struct stat *st, int sticky_ok)
{
    if (st->st_uid != 0)
        return 1;
    if (!(st->st_mode & (S_IWGRP | S_IWOTH)))
        return 0;
    return !(sticky_ok && S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX));
}

static int gs_refuse(const char *what, const char *path, const struct stat *st,
                     const char *fix)
{
    slurm_error("gpushare: refusing %s: %s is %s (owner uid %u, mode %04o); %s", what, path,
                st->st_uid != 0 ? "not owned by root" : "writable by group or others",
                (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777), fix);
    return -1;
}

/* Every directory from / down to (and with) the directory of real path `path`. */
static int gs_check_parents(const char *what, const char *path)
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

static const char *gs_tree_what;
static int gs_tree_entries;

static int gs_tree_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (++gs_tree_entries > GS_TREE_MAX_ENTRIES) {
        slurm_error("gpushare: refusing %s: more than %d entries below it; point "
                    "pythonpath= at a directory holding only gpushare and what it imports",
                    gs_tree_what, GS_TREE_MAX_ENTRIES);
        return -1;
    }
    if (type == FTW_SL || type == FTW_SLN) {
        slurm_error("gpushare: refusing %s: %s is a symbolic link; install real files there",
                    gs_tree_what, path);
        return -1;
    }
    if (type == FTW_NS || type == FTW_DNR) {
        slurm_error("gpushare: refusing %s: cannot read %s", gs_tree_what, path);
        return -1;
    }
    if (gs_untrusted(st, 0))
        return gs_refuse(gs_tree_what, path, st, "chown -R root and chmod -R go-w the "
                         "pythonpath= directory");
    return 0;
}

/* The pythonpath= directory: its parents, itself and everything below it. */
static int gs_check_pythonpath(void)
{
    char real[PATH_MAX];

    if (!gs_pythonpath[0])
        return 0;
    if (!realpath(gs_pythonpath, real)) {
        slurm_error("gpushare: plugstack argument pythonpath=%s: %m (install gpushare's "
                    "Python package there, or fix the path)", gs_pythonpath);
        return -1;
    }
    gs_tree_what = "pythonpath=";
    gs_tree_entries = 0;
    if (gs_check_parents("pythonpath=", real) < 0)
        return -1;
    return nftw(real, gs_tree_entry, 16, FTW_PHYS) == 0 ? 0 : -1;
}

/* The core library that is about to be loaded, and the directories above it. */
static int gs_check_core(const char *path)
{
    char real[PATH_MAX];
    struct stat st;

    if (!realpath(path, real) || stat(real, &st) < 0) {
        slurm_error("gpushare: cannot load the Python core %s: %m (install it next to "
                    "spank_gpushare.so)", path);
        return -1;
    }
    if (gs_untrusted(&st, 0))
        return gs_refuse("the Python core", real, &st, "chown root and chmod go-w it");
    return gs_check_parents("the Python core", real);
}

/* The core library and pythonpath=, checked before anything of them is loaded. */
static int gs_core_trusted(char *path, size_t size)
{
    if (gs_core_path(path, size) < 0) {
        slurm_error("gpushare: cannot find the directory of spank_gpushare.so");
        return -1;
    }
    if (gs_check_core(path) < 0 || gs_check_pythonpath() < 0)
        return -1;
    return 0;
}

static int gs_load_core(spank_t sp)
{
    char path[PATH_MAX];
    gs_core_start_f start;
    void *handle;

    if (gs_core_dispatch)
        return 0;
    if (gs_core_failed)
        return -1;
    if (spank_context() == S_CTX_SLURMD) {
        slurm_error("gpushare: refusing to start Python inside slurmd");
        return -1;
    }
    gs_core_failed = 1; /* until it has loaded */
    if (gs_core_trusted(path, sizeof(path)) < 0)
        return -1;
    /* RTLD_GLOBAL: libpython's symbols must resolve for extension modules. */
    handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
        slurm_error("gpushare: cannot load the Python core %s: %s (install it next to "
                    "spank_gpushare.so)", path, dlerror());
        return -1;
    }
    start = (gs_core_start_f)dlsym(handle, "gpushare_core_start");
    gs_core_dispatch = (gs_core_dispatch_f)dlsym(handle, "gpushare_core_dispatch");
    if (!start || !gs_core_dispatch) {
        slurm_error("gpushare: %s is not gpushare's core (missing symbols)", path);
        gs_core_dispatch = NULL;
        return -1;
    }
    if (start() != 0) {
        gs_core_dispatch = NULL;
        return -1;
    }
    gs_core_failed = 0;
    gs_debug(sp, "python=start");
    return 0;
}

/* ---- the SPANK calls the core makes, lent through struct gs_host ------------------ */

static void gs_log(int level, const char *msg)
{
    switch (level) {
    case GS_LOG_ERROR: slurm_error("%s", msg); break;
    case GS_LOG_INFO: slurm_info("%s", msg); break;
    case GS_LOG_VERBOSE: slurm_verbose("%s", msg); break;
    case GS_LOG_USER: slurm_spank_log("%s", msg); break;
    default: slurm_debug("%s", msg); break;
    }
}

static int gs_job_ids(void *handle, uint32_t *job_id, uint32_t *uid, uint32_t *gid)
{
    spank_t sp = (spank_t)handle;
    uid_t u;
    gid_t g;

    if (spank_get_item(sp, S_JOB_ID, job_id) != ESPANK_SUCCESS)
        return -1;
    if (spank_get_item(sp, S_JOB_UID, &u) != ESPANK_SUCCESS)
        return -1;
    if (spank_get_item(sp, S_JOB_GID, &g) != ESPANK_SUCCESS)
        return -1;
    *uid = (uint32_t)u;
    *gid = (uint32_t)g;
    return 0;
}

/* Option value as the job carries it: "" for a flag, NULL when not used. */
static const char *gs_getopt(void *handle, const char *name)
{
    spank_t sp = (spank_t)handle;
    char *value = NULL;
    for (struct spank_option *opt = gs_options; opt->name; opt++) {
        if (strcmp(opt->name, name) != 0)
            continue;
        if (spank_option_getopt(sp, opt, &value) != ESPANK_SUCCESS)
            return NULL;
        return value ? value : "";
    }
    return NULL;
}

/* Run one callback in the core; any failure becomes a logged error and a -1. */
static int gs_call_python(const char *callback, spank_t sp, int ac, char **av)
{
    struct gs_host host = {(void *)sp, gs_log, gs_job_ids, gs_getopt};
    int rc;

    if (gs_load_core(sp) < 0)
        return -1;
    rc = gs_core_dispatch(callback, &host, ac, av);
    gs_debug(sp, "cb=%s python rc=%d", callback, rc);
    return rc;
}

/* ---- the job's worker: the prolog's and epilog's Python off Slurm's path ---------- */
/*
 * Slurm holds a job's first step until the job prolog returns, and the next job on the
 * node until the epilog returns. The Python work (checking the GPUs, starting, joining or
 * stopping the MPS daemon, the job's record) runs instead in a worker forked before Python
 * starts and detached from slurmd (its own session: Slurm kills the prolog's process group
 * when it ends). A per-job lock, <state_dir>/jobs/<id>.lock, taken before the prolog
 * returns and held by the worker until it ends, orders what follows: the job's tasks wait
 * for it in task_init_privileged, bounded, and the epilog waits for it before undoing it.
 * Epilog workers hold a barrier lock per GPU of their job shared (gs_hold_epilog_barrier),
 * and a prolog worker waits for those of its GPUs (gpushare.node.job.wait_for_epilogs,
 * after its GPU check, before the MPS daemon), so a GPU goes to the next job's daemon only
 * once the last one's is stopped. Slurm no longer sees the worker's result, so the worker
 * drains the node itself on a failure (gpushare.node.spank_adapter) and tells the tasks
 * why through the job's record.
 */

/* The longest a task or an epilog waits for a worker: its commands are each bounded by
 * timeout=, and it runs at most a few of them. */
static double gs_wait_limit(void)
{
    return 4 * gs_timeout + 5;
}

static double gs_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

/* Refuse a state directory a user could have placed or can change (as gpushare.state). */
static int gs_check_dir(const char *path)
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
static int gs_jobs_dir(char *out, size_t size)
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
static int gs_open_lock(const char *path, int create)
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

/* <state_dir>/jobs/<job id><suffix>: the job's record (.json), tasks' word (.env), lock. */
static int gs_job_file(spank_t sp, const char *suffix, char *path, size_t size)
{
    uint32_t job_id = 0;

    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
        return -1;
    return snprintf(path, size, "%s/jobs/%u%s", gs_state_dir, job_id, suffix) >= (int)size
               ? -1 : 0;
}

/* flock() with a deadline; 0 when taken, -1 when still held by another at the deadline. */
static int gs_flock_until(int fd, int operation, double deadline)
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

/*
 * The epilog barrier a prolog worker waits at (gpushare.node.job.wait_for_epilogs names the
 * same files): an epilog worker holds <state_dir>/epilogs.gpu<index>.lock shared for each
 * of its job's GPUs (Slurm's indices, SLURM_JOB_GPUS), or <state_dir>/epilogs.lock when it
 * cannot tell them, from before the epilog returns to Slurm until the worker ends. A
 * prolog worker then waits only for the epilogs of its own GPUs, not for every job that
 * ends on the node at the same time.
 */
#define GS_EPILOG_LOCKS_MAX 64

static int gs_hold_epilog_barrier(int *fds, int max)
{
    char path[PATH_MAX + 64], gpus[1024];
    const char *value = getenv("SLURM_JOB_GPUS");
    int count = 0;
    char *token, *save = NULL, *end;
    long index;

    if (value && *value && strlen(value) < sizeof(gpus)) {
        strcpy(gpus, value);
        for (token = strtok_r(gpus, ",", &save); token; token = strtok_r(NULL, ",", &save)) {
            errno = 0;
            index = strtol(token, &end, 10);
            if (errno || *end || end == token || index < 0 || index > 99999 || count == max)
                break;
            snprintf(path, sizeof(path), "%s/epilogs.gpu%ld.lock", gs_state_dir, index);
            if ((fds[count] = gs_open_lock(path, 1)) < 0)
                break;
            (void)flock(fds[count++], LOCK_SH); /* prologs hold them only for an instant */
        }
        if (!token)
            return count;
        while (count > 0)
            close(fds[--count]);
    }
    /* No GPUs, or not a plain list of indices: the node-wide barrier. */
    snprintf(path, sizeof(path), "%s/epilogs.lock", gs_state_dir);
    if ((fds[0] = gs_open_lock(path, 1)) < 0) {
        slurm_error("gpushare: job epilog: cannot open %s: %m; running the epilog in place",
                    path);
        return -1;
    }
    (void)flock(fds[0], LOCK_SH);
    return 1;
}

/* A prolog worker that failed before its Python could say so: the tasks fail with
 * ``text`` instead of starting unchecked. An env file already written is left alone. */
static void gs_fail_tasks(spank_t sp, const char *text)
{
    char jobs[PATH_MAX], path[PATH_MAX + 32], tmp[PATH_MAX + 64];
    int fd;

    if (gs_jobs_dir(jobs, sizeof(jobs)) < 0 || gs_job_file(sp, ".env", path, sizeof(path)) < 0)
        return;
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    if (access(path, F_OK) == 0)
        return;
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (dprintf(fd, "#error=%s\n", text) < 0 || fsync(fd) < 0 || rename(tmp, path) < 0)
        (void)unlink(tmp);
    close(fd);
}

/*
 * The worker outlives slurmd's request: it closes the sockets and pipes it inherited, so
 * that nothing of that request (a connection, a pipe Slurm reads to EOF) stays open, and
 * keeps the files (Slurm's log, the job's locks).
 */
static void gs_close_inherited(void)
{
    struct dirent *entry;
    struct stat st;
    DIR *dir = opendir("/proc/self/fd");
    int fd;

    if (!dir)
        return;
    while ((entry = readdir(dir))) {
        fd = atoi(entry->d_name);
        if (fd <= STDERR_FILENO || fd == dirfd(dir) || fstat(fd, &st) < 0)
            continue;
        if (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode))
            close(fd);
    }
    closedir(dir);
}

static int gs_job_record_exists(spank_t sp);
static int gs_fast_start(spank_t sp, int ac, char **av);

/* After an epilog: the job's lock goes, and so does a note for the tasks that a prolog
 * worker left without a record (it failed before its Python could write one). */
static void gs_finish(const char *callback, spank_t sp, const char *lock)
{
    char env[PATH_MAX + 32];

    if (strcmp(callback, "job_epilog") != 0 || !lock)
        return;
    if (!gs_job_record_exists(sp) && gs_job_file(sp, ".env", env, sizeof(env)) == 0)
        (void)unlink(env);
    (void)unlink(lock);
}

static int gs_in_place(const char *callback, spank_t sp, int ac, char **av,
                       const char *lock_at_end)
{
    int rc = gs_call_python(callback, sp, ac, av);
    gs_finish(callback, sp, lock_at_end);
    return rc;
}

/* Run the callback's Python in a detached worker; it inherits the locks the caller holds
 * (opened O_CLOEXEC: the MPS daemons it starts do not). */
static int gs_call_detached(const char *callback, spank_t sp, int ac, char **av,
                            const char *lock_at_end)
{
    pid_t child, worker;
    int status = 0, rc, null_fd;

    child = fork();
    if (child < 0) {
        slurm_error("gpushare: cannot fork the %s worker: %m; running it in place", callback);
        return gs_in_place(callback, sp, ac, av, lock_at_end);
    }
    if (child == 0) {
        if (setsid() < 0)
            _exit(1);
        worker = fork();
        if (worker != 0)
            _exit(worker < 0 ? 1 : 0);
        gs_close_inherited();
        /* Nothing of Slurm's pipes stays open: Slurm reads the prolog's output to EOF. */
        null_fd = open("/dev/null", O_RDWR);
        if (null_fd >= 0) {
            dup2(null_fd, STDIN_FILENO);
            dup2(null_fd, STDOUT_FILENO);
            dup2(null_fd, STDERR_FILENO);
            if (null_fd > STDERR_FILENO)
                close(null_fd);
        }
        if (strcmp(callback, "job_prolog") == 0 && gs_fast_start(sp, ac, av))
            _exit(0);
        rc = gs_call_python(callback, sp, ac, av);
        if (rc != 0 && strcmp(callback, "job_prolog") == 0)
            gs_fail_tasks(sp, "could not set up this job on its node (slurmd's log "
                          "says why); tell your administrator");
        gs_finish(callback, sp, lock_at_end);
        _exit(rc == 0 ? 0 : 1);
    }
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        slurm_error("gpushare: cannot start the %s worker; running it in place", callback);
        return gs_in_place(callback, sp, ac, av, lock_at_end);
    }
    gs_debug(sp, "cb=%s detached", callback);
    return 0;
}

/* ---- the fast path: does this job use gpushare at all? ---------------------------- */

static int gs_job_record_exists(spank_t sp)
{
    char path[PATH_MAX + 32];
    struct stat st;

    return gs_job_file(sp, ".json", path, sizeof(path)) == 0 && lstat(path, &st) == 0;
}

static int gs_getenv(spank_t sp, const char *name, char *buf, int len)
{
    return spank_getenv(sp, name, buf, len) == ESPANK_SUCCESS ? 0 : -1;
}

static int gs_env_set(const char *name)
{
    const char *value = getenv(name);
    return value && *value;
}

static int gs_job_options_used(spank_t sp)
{
    return gs_getopt(sp, "gpu-share") != NULL || gs_getopt(sp, "gpu-mps") != NULL;
}

/* ---- the epilog's fast leave: a reference dropped without an interpreter ---------- */

/*
 * A daemon's caps are the largest share among its jobs (gpushare.node.mps.limits), and each
 * job referencing it is a file <state_dir>/mps/<key>.jobs/<job id> holding its share
 * (gpushare.node.mps.record). A job that leaves other jobs on its daemon, one of them with a
 * share at least its own, changes neither the daemon nor its caps: its epilog only has to
 * unlink that file, under the daemon's lock (<key>.lock, as gpushare.node.mps.lock takes
 * it), and the job's own files. That is done here, so the epilog of most jobs on a shared
 * GPU starts no interpreter. Anything else (the daemon's last job, the largest share
 * leaving, a job in no daemon or in several, a record from an earlier release, a lock
 * held past timeout=, any file not as gpushare writes it) is left to the Python worker.
 */
#define GS_KEY_MAX 256

/* The directory name below dir_fd (AT_FDCWD: an absolute path), opened when it is root's
 * and not writable by others, as root made it; -1 otherwise. */
static int gs_open_dir_at(int dir_fd, const char *name)
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
static DIR *gs_dir_stream(int fd)
{
    int copy = dup(fd);
    DIR *dir = copy >= 0 ? fdopendir(copy) : NULL;

    if (!dir && copy >= 0)
        close(copy);
    return dir;
}

/* The lock of daemon key (<key>.lock in the mps directory), taken within timeout= as
 * gpushare.node.mps.lock takes it: on the file that still has that name. -1 when not. */
static int gs_lock_daemon(int mps_fd, const char *key)
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
static char *gs_read_root_file(int dir_fd, const char *name, size_t max)
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

/* A share file's percent (1-100), or -1 for anything gpushare does not write. */
static int gs_read_share(int dir_fd, const char *name)
{
    char *text = gs_read_root_file(dir_fd, name, 16), *end;
    long share;

    if (!text)
        return -1;
    errno = 0;
    share = strtol(text, &end, 10);
    if (errno || end == text || (*end && strcmp(end, "\n") != 0) || share < 1 || share > 100)
        share = -1;
    free(text);
    return (int)share;
}

/* The one daemon whose <key>.jobs/ holds the job (its key in key[]); -1 for none or several. */
static int gs_daemon_of_job(int mps_fd, const char *job, char *key)
{
    char ref[GS_KEY_MAX + 32];
    struct dirent *entry;
    struct stat st;
    int found = 0;
    DIR *dir = gs_dir_stream(mps_fd);
    size_t len;

    if (!dir)
        return -1;
    while ((entry = readdir(dir))) {
        len = strlen(entry->d_name);
        if (entry->d_name[0] == '.' || len <= 5 || len - 5 >= GS_KEY_MAX ||
            strcmp(entry->d_name + len - 5, ".jobs") != 0)
            continue;
        snprintf(ref, sizeof(ref), "%s/%s", entry->d_name, job);
        if (fstatat(mps_fd, ref, &st, AT_SYMLINK_NOFOLLOW) == 0 && found++ == 0)
            snprintf(key, GS_KEY_MAX, "%.*s", (int)(len - 5), entry->d_name);
    }
    closedir(dir);
    return found == 1 ? 0 : -1;
}

/* Under the daemon's lock: unlink the job's reference when others stay with a share at
 * least its own. Returns the job's share when done, 0 (and *why) when the worker must. */
static int gs_drop_reference(int mps_fd, const char *key, const char *job, const char **why)
{
    char name[GS_KEY_MAX + 16];
    struct dirent *entry;
    struct stat st;
    int own, share, others = 0, largest = 0, jobs_fd;
    DIR *dir;

    *why = "no-record";
    snprintf(name, sizeof(name), "%s.json", key);
    if (fstatat(mps_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
        return 0;
    *why = "jobs-unreadable";
    snprintf(name, sizeof(name), "%s.jobs", key);
    if ((jobs_fd = gs_open_dir_at(mps_fd, name)) < 0)
        return 0;
    if ((own = gs_read_share(jobs_fd, job)) < 0 || !(dir = gs_dir_stream(jobs_fd))) {
        close(jobs_fd);
        return 0;
    }
    while ((entry = readdir(dir))) {
        if (entry->d_name[0] == '.' || strcmp(entry->d_name, job) == 0)
            continue; /* ".", "..", a temporary file of a write in progress, this job */
        if (strspn(entry->d_name, "0123456789") != strlen(entry->d_name) ||
            (share = gs_read_share(jobs_fd, entry->d_name)) < 0) {
            others = 0; /* not as gpushare writes it: the worker says what is wrong */
            break;
        }
        others++;
        if (share > largest)
            largest = share;
    }
    closedir(dir);
    *why = others == 0 ? "last-job" : largest < own ? "largest-share" : "unlink-failed";
    if (others == 0 || largest < own || unlinkat(jobs_fd, job, 0) < 0)
        own = 0;
    close(jobs_fd);
    return own;
}

/* A prolog or epilog done here is counted as the Python callbacks are
 * (gpushare.node.counters folds counters.fast into counters.json under the same lock): a
 * line "<prolog|epilog> <microseconds>", and "note <counter>" for what it did. */
static void gs_count_lines(const char *lines)
{
    char path[PATH_MAX + 32];
    int lock_fd, fd, len = (int)strlen(lines);
    struct stat st;

    snprintf(path, sizeof(path), "%s/counters.json", gs_state_dir);
    lock_fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (lock_fd < 0)
        return;
    if (fstat(lock_fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        gs_flock_until(lock_fd, LOCK_EX, gs_now() + 1.0) == 0) {
        snprintf(path, sizeof(path), "%s/counters.fast", gs_state_dir);
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) {
            if (write(fd, lines, len) != len) {
                /* a count is best effort, as in Python */
            }
            close(fd);
        }
    }
    close(lock_fd);
}

/* One callback done here, with "note <counter>" lines (gpushare.node.counters.FAST_NOTES)
 * after it. */
static void gs_count_fast(const char *callback, double seconds, const char *notes)
{
    char lines[160];

    snprintf(lines, sizeof(lines), "%s %ld\n%s", callback, (long)(seconds * 1e6), notes);
    gs_count_lines(lines);
}

/* 1 when the job left its daemon here (its files gone too), 0 when the worker must run. */
static int gs_fast_leave(spank_t sp)
{
    char path[PATH_MAX + 32], key[GS_KEY_MAX], job[16];
    uint32_t job_id = 0;
    double started = gs_now();
    int mps_fd, lock_fd, share = 0;
    const char *why = "lock";

    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
        return 0;
    snprintf(job, sizeof(job), "%u", job_id);
    snprintf(path, sizeof(path), "%s/mps", gs_state_dir);
    mps_fd = gs_open_dir_at(AT_FDCWD, path);
    if (mps_fd < 0 || gs_daemon_of_job(mps_fd, job, key) < 0) {
        if (mps_fd >= 0)
            close(mps_fd);
        gs_debug(sp, "cb=job_epilog fast=no reason=no-single-daemon");
        return 0;
    }
    if ((lock_fd = gs_lock_daemon(mps_fd, key)) >= 0) {
        share = gs_drop_reference(mps_fd, key, job, &why);
        close(lock_fd);
    }
    close(mps_fd);
    if (!share) {
        gs_debug(sp, "cb=job_epilog fast=no reason=%s daemon=%s", why, key);
        return 0;
    }
    /* As gpushare.node.state.JobStore.remove: the tasks' file, then the record. */
    if (gs_job_file(sp, ".env", path, sizeof(path)) == 0)
        (void)unlink(path);
    if (gs_job_file(sp, ".json", path, sizeof(path)) == 0)
        (void)unlink(path);
    gs_count_fast("epilog", gs_now() - started, "");
    gs_debug(sp, "cb=job_epilog python=skip reason=left-daemon daemon=%s share=%d", key, share);
    return 1;
}

/* ---- the prolog's fast join: a job joined to its user's running daemon ------------- */

/*
 * A shared job whose user runs a daemon on the job's GPU with caps that cover its share
 * needs nothing decided: its reference, record and task environment are the previous such
 * job's with its own id. The worker of that job left a join ticket saying under which
 * conditions this holds and what to write (gpushare.node.ticket describes the format and
 * every condition). Here the ticket <state_dir>/mps/tickets/u<uid>.g<gpus>.s<share> is
 * used only if every one of its conditions holds; under the daemon's lock the job's record,
 * its reference <key>.jobs/<job id> and last its tasks' environment file are written. Any
 * doubt leaves the job to the worker, which checks the GPU and writes a new ticket.
 */
#define GS_TICKET_MAX (64 * 1024)
#define GS_JOB_ID_MARK "@GPUSHARE_JOB_ID@"
#define GS_CREATED_MARK "@GPUSHARE_CREATED@"

/* "<dev> <ino> <size> <mtime in ns>", as gpushare.node.ticket.stamp prints a stat. */
static void gs_stamp(const struct stat *st, char *out, size_t size)
{
    snprintf(out, size, "%llu %llu %lld %lld", (unsigned long long)st->st_dev,
             (unsigned long long)st->st_ino, (long long)st->st_size,
             (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec);
}

/* "<stamp> <path>": whether the file is still the one the ticket saw. */
static int gs_file_unchanged(const char *value)
{
    char now[96];
    struct stat st;
    const char *path = value;

    for (int fields = 0; fields < 4 && path; fields++)
        path = strchr(path, ' ') ? strchr(path, ' ') + 1 : NULL;
    if (!path || *path != '/' || stat(path, &st) < 0)
        return 0;
    gs_stamp(&st, now, sizeof(now));
    return strncmp(value, now, (size_t)(path - 1 - value)) == 0 &&
           strlen(now) == (size_t)(path - 1 - value);
}

/* A live process's start time (/proc/<pid>/stat field 22) into out; -1 for none or a
 * zombie, which serves nobody. */
static int gs_proc_start(long pid, char *out, size_t size)
{
    char path[64], stat_text[1024], *fields, *field, *save = NULL;
    ssize_t len;
    int fd, index = 3;

    if (pid <= 1)
        return -1;
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    len = read(fd, stat_text, sizeof(stat_text) - 1);
    close(fd);
    if (len <= 0)
        return -1;
    stat_text[len] = '\0';
    if (!(fields = strrchr(stat_text, ')')))
        return -1;
    for (field = strtok_r(fields + 1, " ", &save); field; field = strtok_r(NULL, " ", &save)) {
        if (index == 3 && (*field == 'Z' || *field == 'X'))
            return -1;
        if (index++ == 22)
            return snprintf(out, size, "%s", field) < (int)size ? 0 : -1;
    }
    return -1;
}

/* "<pid> <start time>": whether that process still runs. */
static int gs_same_process(const char *value)
{
    char started[32], *rest;
    long pid = strtol(value, &rest, 10);

    return *rest == ' ' && gs_proc_start(pid, started, sizeof(started)) == 0 &&
           strcmp(rest + 1, started) == 0;
}

struct gs_ticket {
    char key[GS_KEY_MAX];
    char record_stamp[96];
    int share;
    const char *record; /* the job record with its marks */
    const char *env;    /* the tasks' environment file */
};

/* One condition line of a ticket (either kind), split into word and value: 1 when it
 * holds, -1 (and *why) when it does not, 0 when the word is not a condition. */
static int gs_condition(spank_t sp, int ac, char **av, const char *word, char *value,
                        struct gs_ticket *t, int *args, const char **why)
{
    uint32_t uid = 0, gid = 0;
    struct timespec now;

    if (strcmp(word, "key") == 0) {
        *why = "format";
        if (strlen(value) >= GS_KEY_MAX || !*value || value[0] == '.' ||
            strspn(value, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                          "0123456789._-") != strlen(value))
            return -1;
        snprintf(t->key, sizeof(t->key), "%s", value);
    } else if (strcmp(word, "until") == 0) {
        *why = "expired";
        clock_gettime(CLOCK_REALTIME, &now);
        if (now.tv_sec + now.tv_nsec / 1e9 >= strtod(value, NULL))
            return -1;
    } else if (strcmp(word, "uid") == 0 || strcmp(word, "gid") == 0) {
        *why = "user";
        if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS ||
            strspn(value, "0123456789") != strlen(value) || !*value ||
            strtoul(value, NULL, 10) != (word[0] == 'u' ? uid : gid))
            return -1;
    } else if (strcmp(word, "share") == 0) {
        t->share = atoi(value);
    } else if (strcmp(word, "arg") == 0) {
        *why = "plugstack";
        if (*args >= ac || strcmp(av[(*args)++], value) != 0)
            return -1;
    } else if (strcmp(word, "env") == 0) {
        char *eq = strchr(value, '=');
        const char *have;
        *why = "environment";
        if (!eq)
            return -1;
        *eq = '\0';
        have = getenv(value);
        if (strcmp(have ? have : "", eq + 1) != 0)
            return -1;
    } else if (strcmp(word, "opt") == 0 || strcmp(word, "noopt") == 0) {
        char *eq = word[0] == 'o' ? strchr(value, '=') : NULL;
        const char *have;
        *why = "options";
        if (word[0] == 'o' && !eq)
            return -1;
        if (eq)
            *eq = '\0';
        have = gs_getopt(sp, value);
        if (eq ? !have || strcmp(have, eq + 1) != 0 : have != NULL)
            return -1;
    } else if (strcmp(word, "file") == 0) {
        *why = "files";
        if (!gs_file_unchanged(value))
            return -1;
    } else if (strcmp(word, "nofile") == 0) {
        struct stat st;
        *why = "files";
        if (stat(value, &st) == 0 || errno != ENOENT)
            return -1;
    } else {
        return 0;
    }
    return 1;
}

/* The next "word value" line of a ticket's text at *at (split in place, *at moved past
 * it): 1 with word and value, 0 at the end, -1 for a line without a value. A line that
 * starts a section ("--record") comes back as its word with an empty value. */
static int gs_ticket_line(char **at, char **word, char **value)
{
    char *line = *at, *next;

    if (!line || !*line)
        return 0;
    if ((next = strchr(line, '\n')))
        *next++ = '\0';
    *at = next;
    *word = line;
    if (strncmp(line, "--", 2) == 0) {
        *value = line + strlen(line);
        return 1;
    }
    if (!(*value = strchr(line, ' ')))
        return -1;
    *(*value)++ = '\0';
    return 1;
}

/* Check every condition of the ticket's text (it is split in place); 0 when they hold. */
static int gs_ticket_holds(spank_t sp, int ac, char **av, char *text, struct gs_ticket *t,
                           const char **why)
{
    char *at, *word, *value;
    int args = 0, rc;

    memset(t, 0, sizeof(*t));
    *why = "format";
    if (strncmp(text, "gpushare-ticket 1\n", 18) != 0)
        return -1;
    for (at = text + 18; (rc = gs_ticket_line(&at, &word, &value)) > 0;) {
        if (strcmp(word, "--record") == 0) {
            t->record = at;
            if (!at || !(value = strstr(at, "\n--env\n")))
                return -1;
            *value = '\0';
            t->env = value + 7;
            break;
        }
        if ((rc = gs_condition(sp, ac, av, word, value, t, &args, why)) < 0)
            return -1;
        if (rc > 0)
            continue;
        *why = "daemon";
        if (strcmp(word, "daemon") == 0) {
            if (!gs_same_process(value))
                return -1;
        } else if (strcmp(word, "record") == 0) {
            snprintf(t->record_stamp, sizeof(t->record_stamp), "%s", value);
        } else {
            *why = "format";
            return -1; /* a line this glue does not know: a newer worker's ticket */
        }
    }
    *why = "format";
    if (rc < 0 || !t->record || !t->key[0] || !t->record_stamp[0] || t->share < 1 ||
        t->share > 100)
        return -1;
    *why = "plugstack";
    return args == ac ? 0 : -1;
}

struct gs_mark {
    const char *mark, *value;
};

/* text with each of the n marks replaced by its value (free() it). */
static char *gs_fill(const char *text, const struct gs_mark *marks, int n)
{
    size_t size = strlen(text) + 1, at_signs = 0, longest = 0;
    const char *at;
    char *out, *to;
    int i;

    for (i = 0; i < n; i++)
        if (strlen(marks[i].value) > longest)
            longest = strlen(marks[i].value);
    for (at = text; (at = strchr(at, '@')); at++)
        at_signs++;
    size += at_signs * longest;
    if (!(out = malloc(size)))
        return NULL;
    for (to = out, at = text; *at;) {
        for (i = 0; *at == '@' && i < n; i++)
            if (strncmp(at, marks[i].mark, strlen(marks[i].mark)) == 0)
                break;
        if (*at != '@' || i == n) {
            *to++ = *at++;
            continue;
        }
        to = stpcpy(to, marks[i].value);
        at += strlen(marks[i].mark);
    }
    *to = '\0';
    return out;
}

/* name below dir_fd replaced with text (a temporary file, renamed), with mode. With
 * no_replace, an existing name is kept and -1 returned. */
static int gs_write_mode_at(int dir_fd, const char *name, const char *text, int no_replace,
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

static int gs_write_at(int dir_fd, const char *name, const char *text, int no_replace)
{
    return gs_write_mode_at(dir_fd, name, text, no_replace, 0600);
}

/* Under the daemon's lock: the record, the reference, the tasks' file; undone on failure. */
static int gs_join_locked(int mps_fd, int jobs_fd, const struct gs_ticket *t, const char *job,
                          const char **why)
{
    char name[GS_KEY_MAX + 16], now_stamp[96], created[32], file[32], share[8];
    struct stat st;
    struct timespec now;
    char *record = NULL, *env = NULL;
    int refs_fd = -1, rc = -1;
    const struct gs_mark marks[] = {{GS_JOB_ID_MARK, job}, {GS_CREATED_MARK, created}};

    *why = "daemon-changed";
    snprintf(name, sizeof(name), "%s.json", t->key);
    if (fstatat(mps_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -1;
    gs_stamp(&st, now_stamp, sizeof(now_stamp));
    if (strcmp(now_stamp, t->record_stamp) != 0)
        return -1;
    *why = "write";
    snprintf(name, sizeof(name), "%s.jobs", t->key);
    refs_fd = gs_open_dir_at(mps_fd, name);
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(created, sizeof(created), "%ld.%06ld", (long)now.tv_sec, now.tv_nsec / 1000L);
    record = gs_fill(t->record, marks, 2);
    env = gs_fill(t->env, marks, 2);
    snprintf(file, sizeof(file), "%s.json", job);
    snprintf(share, sizeof(share), "%d\n", t->share);
    if (refs_fd < 0 || !record || !env ||
        gs_write_at(jobs_fd, file, record, 0) < 0)
        goto out;
    if (gs_write_at(refs_fd, job, share, 1) < 0) {
        (void)unlinkat(jobs_fd, file, 0);
        goto out;
    }
    snprintf(file, sizeof(file), "%s.env", job);
    if (gs_write_at(jobs_fd, file, env, 0) < 0) {
        (void)unlinkat(refs_fd, job, 0);
        snprintf(file, sizeof(file), "%s.json", job);
        (void)unlinkat(jobs_fd, file, 0);
        goto out;
    }
    rc = 0;
out:
    free(record);
    free(env);
    if (refs_fd >= 0)
        close(refs_fd);
    return rc;
}

/* A shared job a ticket could serve: its id, its user (not root) and its GPUs (Slurm's
 * indices joined by '_') and share as a ticket's name holds them. -1 for any other job. */
static int gs_ticket_job(spank_t sp, char job[16], uint32_t *uid, char gpus[48],
                         const char **share)
{
    const char *slurm_gpus = getenv("SLURM_JOB_GPUS");
    uint32_t job_id = 0;

    *share = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if (!*share || !**share || strlen(*share) > 3 ||
        strspn(*share, "0123456789") != strlen(*share) || !slurm_gpus || !*slurm_gpus ||
        strlen(slurm_gpus) >= 48 || strspn(slurm_gpus, "0123456789,") != strlen(slurm_gpus) ||
        gs_getopt(sp, "gpu-mps") || spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_UID, uid) != ESPANK_SUCCESS || *uid == 0)
        return -1;
    snprintf(gpus, 48, "%s", slurm_gpus);
    for (char *c = gpus; *c; c++)
        if (*c == ',')
            *c = '_';
    snprintf(job, 16, "%u", job_id);
    return 0;
}

/* What a ticket's use holds open: the mps and tickets directories, then the jobs directory
 * and the daemon's lock. */
struct gs_ticket_fds {
    int mps, tickets, jobs, lock;
};

/* The root-owned ticket name of the state directory, whole (free() it); NULL if not. */
static char *gs_read_ticket(struct gs_ticket_fds *fds, const char *name)
{
    char path[PATH_MAX + 32];

    fds->mps = fds->tickets = fds->jobs = fds->lock = -1;
    snprintf(path, sizeof(path), "%s/mps", gs_state_dir);
    if ((fds->mps = gs_open_dir_at(AT_FDCWD, path)) < 0 ||
        (fds->tickets = gs_open_dir_at(fds->mps, "tickets")) < 0)
        return NULL;
    return gs_read_root_file(fds->tickets, name, GS_TICKET_MAX);
}

/* The jobs directory opened and daemon key's lock taken; -1 when not. */
static int gs_ticket_lock(struct gs_ticket_fds *fds, const char *key)
{
    char path[PATH_MAX + 32];

    snprintf(path, sizeof(path), "%s/jobs", gs_state_dir);
    if ((fds->jobs = gs_open_dir_at(AT_FDCWD, path)) < 0 ||
        (fds->lock = gs_lock_daemon(fds->mps, key)) < 0)
        return -1;
    return 0;
}

/* The lock given back first, then the directories closed. */
static void gs_ticket_close(struct gs_ticket_fds *fds)
{
    int *each[] = {&fds->lock, &fds->jobs, &fds->tickets, &fds->mps};

    for (size_t i = 0; i < sizeof(each) / sizeof(each[0]); i++)
        if (*each[i] >= 0) {
            close(*each[i]);
            *each[i] = -1;
        }
}

/* 1 when the job was joined to its daemon here, 0 when the worker must set it up. */
static int gs_fast_join(spank_t sp, int ac, char **av)
{
    char name[96], job[16], gpus[48];
    const char *why = "no-ticket", *share;
    struct gs_ticket ticket;
    struct gs_ticket_fds fds;
    uint32_t uid = 0;
    double started = gs_now();
    int joined = 0;
    char *text;

    /* The ticket's name, as gpushare.node.ticket.name makes it. */
    if (gs_ticket_job(sp, job, &uid, gpus, &share) < 0)
        return 0;
    snprintf(name, sizeof(name), "u%u.g%s.s%s", uid, gpus, share);
    if (!(text = gs_read_ticket(&fds, name)) ||
        gs_ticket_holds(sp, ac, av, text, &ticket, &why) < 0)
        goto out;
    why = "lock";
    if (gs_ticket_lock(&fds, ticket.key) < 0)
        goto out;
    joined = gs_join_locked(fds.mps, fds.jobs, &ticket, job, &why) == 0;
out:
    gs_ticket_close(&fds);
    if (!joined) {
        gs_debug(sp, "cb=job_prolog fast=no reason=%s", why);
        free(text);
        return 0;
    }
    gs_count_fast("prolog", gs_now() - started, "");
    gs_debug(sp, "cb=job_prolog python=skip reason=joined daemon=%s share=%d", ticket.key,
             ticket.share);
    slurm_info("gpushare: job %s: shared MPS, %d%% of GPU %s, daemon %s (joined by the "
               "plugin)", job, ticket.share, gpus, ticket.key);
    free(text);
    return 1;
}

/* ---- the prolog worker's fast start: a shared job's own daemon, started in C ------ */

/*
 * The first shared job of a user on a GPU needs a daemon of its own, and the decisions
 * that make it (the GPU check, the share, the daemon's environment and caps) are those of
 * any shared job with the same share on the same GPU moments ago, whoever its user. After
 * each shared prolog its worker leaves a start ticket, <state_dir>/mps/tickets/
 * start.g<gpus>.s<share> (gpushare.node.ticket.render_start): the join ticket's conditions
 * with the user left open, the recipe (program, the daemon's and the control command's
 * environments, the cap commands) and the records to write. The prolog's worker, before it
 * loads Python, uses one when every condition holds, no epilog runs on the job's GPUs and
 * the user has no daemon there: under the daemon's lock it writes the job's reference and
 * the daemon's record as acquire() does before a start, makes the daemon's directories,
 * runs "<program> -d" as the user, waits for its control socket, tells it its caps, and
 * writes the daemon's record, the job's record, its tasks' environment and a join ticket
 * for the user's next job. Each step is bounded by timeout=. Anything else, or any failure,
 * goes to the Python worker. After a failure the job's reference stays on the daemon's
 * record as written before the start (no pid), so the worker's acquire() stops whatever was
 * started and starts it again, saying what goes wrong; and were the worker to fail before
 * that, the job's epilog stops it.
 */
#define GS_START_LIST_MAX 16
#define GS_START_INPUT_MAX 4000 /* cap commands: written to the pipe before the exec */
#define GS_UID_MARK "@GPUSHARE_UID@"
#define GS_GID_MARK "@GPUSHARE_GID@"
#define GS_PID_MARK "@GPUSHARE_DAEMON_PID@"
#define GS_STARTED_MARK "@GPUSHARE_STARTED@"
#define GS_PID_FILE "nvidia-cuda-mps-control.pid"

struct gs_start {
    struct gs_ticket t; /* key, share; record and env: the job's sections */
    const char *program, *pipe_dir;
    char *daemon_env[GS_START_LIST_MAX + 1], *client_env[GS_START_LIST_MAX + 1];
    char caps[GS_START_INPUT_MAX];
    const char *before, *started;
    size_t conditions_len; /* the condition lines: the join ticket's, too */
};

/* Split the start ticket's text in place and check its conditions; 0 when they hold. */
static int gs_start_holds(spank_t sp, int ac, char **av, char *text, struct gs_start *st,
                          const char **why)
{
    char *at, *word, *value, *end;
    size_t caps_len = 0;
    int args = 0, daemon_envs = 0, client_envs = 0, recipe = 0, rc;
    const size_t head = strlen("gpushare-start 1\n");

    memset(st, 0, sizeof(*st));
    *why = "format";
    if (strncmp(text, "gpushare-start 1\n", head) != 0 || !(end = strstr(text, "\n--recipe\n")))
        return -1;
    st->conditions_len = (size_t)(end + 1 - (text + head));
    for (at = text + head; (rc = gs_ticket_line(&at, &word, &value)) > 0;) {
        if (strcmp(word, "--recipe") == 0) {
            recipe = 1;
        } else if (!recipe) {
            if (gs_condition(sp, ac, av, word, value, &st->t, &args, why) <= 0)
                return -1;
        } else if (strcmp(word, "program") == 0 && *value == '/') {
            st->program = value;
        } else if (strcmp(word, "daemon-env") == 0 && strchr(value, '=') &&
                   daemon_envs < GS_START_LIST_MAX) {
            st->daemon_env[daemon_envs++] = value;
            if (strncmp(value, "CUDA_MPS_PIPE_DIRECTORY=", 24) == 0)
                st->pipe_dir = value + 24;
        } else if (strcmp(word, "client-env") == 0 && strchr(value, '=') &&
                   client_envs < GS_START_LIST_MAX) {
            st->client_env[client_envs++] = value;
        } else if (strcmp(word, "caps") == 0 &&
                   caps_len + strlen(value) + 2 < sizeof(st->caps)) {
            caps_len += (size_t)sprintf(st->caps + caps_len, "%s\n", value);
        } else if (strcmp(word, "--daemon-record") == 0) {
            st->before = at;
            break;
        } else {
            *why = "format";
            return -1; /* a line this glue does not know: a newer worker's ticket */
        }
    }
    *why = "format";
    if (rc < 0 || !st->before || !st->program || !st->pipe_dir || !caps_len ||
        !st->t.key[0] || st->t.share < 1 || st->t.share > 100)
        return -1;
    if (!(end = strstr(st->before, "\n--started-record\n")))
        return -1;
    *end = '\0';
    st->started = end + 18;
    if (!(end = strstr(st->started, "\n--record\n")))
        return -1;
    *end = '\0';
    st->t.record = end + 10;
    if (!(end = strstr(st->t.record, "\n--env\n")))
        return -1;
    *end = '\0';
    st->t.env = end + 7;
    *why = "plugstack";
    return args == ac ? 0 : -1;
}

/* Whether the lock file at path is free (absent, or taken and given back at once). */
static int gs_lock_free(const char *path)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), free_now;

    if (fd < 0)
        return errno == ENOENT;
    free_now = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd);
    return free_now;
}

/* No epilog runs on the node as a whole or on the job's GPUs (the barrier
 * gpushare.node.job.wait_for_epilogs waits at): 0 when none of those locks is held. */
static int gs_no_epilog_running(const char *gpus)
{
    char path[PATH_MAX + 64], list[48], *token, *save = NULL;

    snprintf(path, sizeof(path), "%s/epilogs.lock", gs_state_dir);
    if (!gs_lock_free(path))
        return -1;
    snprintf(list, sizeof(list), "%s", gpus);
    for (token = strtok_r(list, "_", &save); token; token = strtok_r(NULL, "_", &save)) {
        snprintf(path, sizeof(path), "%s/epilogs.gpu%ld.lock", gs_state_dir,
                 strtol(token, NULL, 10));
        if (!gs_lock_free(path))
            return -1;
    }
    return 0;
}

/* A program root may hand to users: a root-owned regular file out of others' reach, and
 * so is every directory above it (as gpushare.common.safefs.check_root_owned_file). */
static int gs_program_trusted(const char *program)
{
    char real[PATH_MAX], *slash;
    struct stat st;

    if (!realpath(program, real) || stat(real, &st) < 0 || !S_ISREG(st.st_mode) ||
        gs_untrusted(&st, 0))
        return -1;
    while ((slash = strrchr(real, '/'))) {
        if (slash == real)
            slash[1] = '\0';
        else
            *slash = '\0';
        if (lstat(real, &st) < 0 || gs_untrusted(&st, 1))
            return -1;
        if (slash == real)
            return 0;
    }
    return -1;
}

/* In a child about to exec: every descriptor but 0-2 closed. */
static void gs_close_above_stderr(void)
{
    struct dirent *entry;
    DIR *dir = opendir("/proc/self/fd");
    int fd;

    if (!dir) {
        for (fd = STDERR_FILENO + 1; fd < 1024; fd++)
            close(fd);
        return;
    }
    while ((entry = readdir(dir)))
        if ((fd = atoi(entry->d_name)) > STDERR_FILENO && fd != dirfd(dir))
            close(fd);
    closedir(dir);
}

/* Run program (argv: itself and arg, if any) as uid/gid with exactly env, input on its
 * stdin, no other descriptors, in a session of its own, from /. Its exit status within
 * timeout=, or -1 (its session killed). */
static int gs_run_as(const char *program, const char *arg, char **env, uid_t uid, gid_t gid,
                     const char *input)
{
    char *argv[] = {(char *)program, (char *)arg, NULL};
    int in[2], status = 0, null_fd;
    double deadline = gs_now() + gs_timeout;
    useconds_t pause = 200;
    pid_t pid, done;

    if (pipe2(in, O_CLOEXEC) < 0)
        return -1;
    if (input && write(in[1], input, strlen(input)) != (ssize_t)strlen(input)) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    close(in[1]);
    if ((pid = fork()) < 0) {
        close(in[0]);
        return -1;
    }
    if (pid == 0) {
        null_fd = open("/dev/null", O_RDWR);
        if (null_fd < 0 || dup2(in[0], STDIN_FILENO) < 0 || dup2(null_fd, STDOUT_FILENO) < 0 ||
            dup2(null_fd, STDERR_FILENO) < 0)
            _exit(126);
        gs_close_above_stderr();
        if (setsid() < 0 || chdir("/") < 0 || setgroups(0, NULL) < 0 ||
            setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0 || getuid() != uid)
            _exit(126);
        execve(program, argv, env);
        _exit(127);
    }
    close(in[0]);
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 || (done < 0 && errno == EINTR)) {
        if (gs_now() > deadline) {
            (void)kill(-pid, SIGKILL);
            (void)kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            return -1;
        }
        usleep(pause);
        pause = pause < 5000 ? pause * 2 : pause;
    }
    return done == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The user's directory name below key_fd, made fresh, root's until handed to uid/gid. */
static int gs_make_user_dir(int key_fd, const char *name, uid_t uid, gid_t gid)
{
    struct stat st;
    int fd, rc = -1;

    if (mkdirat(key_fd, name, 0700) < 0)
        return -1;
    fd = openat(key_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == 0 && !(st.st_mode & 077) &&
        fchown(fd, uid, gid) == 0 && fchmod(fd, 0700) == 0)
        rc = 0;
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Whether pid is the user's MPS daemon of pipe_dir running program (as
 * gpushare.node.mps.procscan.ProcScan.is_ours). */
static int gs_is_daemon(long pid, uid_t uid, const char *pipe_dir, const char *program)
{
    char path[64], exe[PATH_MAX], real[PATH_MAX], text[16384], want[PATH_MAX + 32];
    const char *uid_line;
    ssize_t len, at;
    int fd;

    snprintf(path, sizeof(path), "/proc/%ld/status", pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    len = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (len <= 0)
        return 0;
    text[len] = '\0';
    if (!(uid_line = strstr(text, "\nUid:")) || strtoul(uid_line + 5, NULL, 10) != uid)
        return 0;
    snprintf(path, sizeof(path), "/proc/%ld/exe", pid);
    if ((len = readlink(path, exe, sizeof(exe) - 1)) <= 0)
        return 0;
    exe[len] = '\0';
    if (strcmp(exe, program) != 0 && (!realpath(program, real) || strcmp(exe, real) != 0))
        return 0;
    snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    len = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (len <= 0)
        return 0;
    text[len] = '\0';
    snprintf(want, sizeof(want), "CUDA_MPS_PIPE_DIRECTORY=%s", pipe_dir);
    for (at = 0; at < len; at += (ssize_t)strlen(text + at) + 1)
        if (strcmp(text + at, want) == 0)
            return 1;
    return 0;
}

/* The daemon's pid from its pid file in the user's pipe directory, once /proc confirms
 * it; its start time into started. -1 when not (yet) known. */
static long gs_daemon_pid(int pipe_fd, const struct gs_start *st, uid_t uid, char *started,
                          size_t size)
{
    char text[32], *end;
    struct stat info;
    ssize_t len;
    long pid;
    int fd = openat(pipe_fd, GS_PID_FILE, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

    if (fd < 0)
        return -1;
    len = fstat(fd, &info) == 0 && S_ISREG(info.st_mode) ? read(fd, text, sizeof(text) - 1)
                                                          : -1;
    close(fd);
    if (len <= 0)
        return -1;
    text[len] = '\0';
    pid = strtol(text, &end, 10);
    if (end == text || (*end && strcmp(end, "\n") != 0) ||
        !gs_is_daemon(pid, uid, st->pipe_dir, st->program) ||
        gs_proc_start(pid, started, size) < 0)
        return -1;
    return pid;
}

/* Start the daemon with its caps (lock held, its directories made): its pid, or -1. */
static long gs_start_daemon(int key_fd, struct gs_start *st, uid_t uid, gid_t gid,
                            char *started, size_t size, const char **why)
{
    struct stat info;
    double deadline;
    useconds_t pause = 200;
    long pid = -1;
    int pipe_fd;

    *why = "daemon-start";
    if (gs_run_as(st->program, "-d", st->daemon_env, uid, gid, NULL) != 0)
        return -1;
    *why = "daemon-socket";
    pipe_fd = openat(key_fd, "pipe", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (pipe_fd < 0 || fstat(pipe_fd, &info) < 0 || info.st_uid != uid) {
        if (pipe_fd >= 0)
            close(pipe_fd);
        return -1;
    }
    deadline = gs_now() + gs_timeout;
    while (fstatat(pipe_fd, "control", &info, AT_SYMLINK_NOFOLLOW) < 0 && gs_now() < deadline) {
        usleep(pause);
        pause = pause < 20000 ? pause * 2 : pause;
    }
    /* Listening, with its pid file written (or the worker looks through /proc for it). */
    *why = "daemon-pid";
    if (fstatat(pipe_fd, "control", &info, AT_SYMLINK_NOFOLLOW) == 0)
        pid = gs_daemon_pid(pipe_fd, st, uid, started, size);
    close(pipe_fd);
    if (pid < 0)
        return -1;
    *why = "caps";
    return gs_run_as(st->program, NULL, st->client_env, uid, gid, st->caps) == 0 ? pid : -1;
}

/* The join ticket of the started daemon: the start ticket's conditions (the user filled
 * in), the daemon and its record's stamp, the job's sections with the pid filled in. */
static char *gs_join_text(const char *conditions, size_t len, const char *daemon,
                          const char *stamp, const char *record, const char *env)
{
    size_t size = len + strlen(daemon) + strlen(stamp) + strlen(record) + strlen(env) + 96;
    char *text = malloc(size);

    if (text)
        snprintf(text, size, "gpushare-ticket 1\n%.*sdaemon %s\nrecord %s\n--record\n%s\n"
                 "--env\n%s", (int)len, conditions, daemon, stamp, record, env);
    return text;
}

/* Under the daemon's lock, its key free: start it and write what a start writes. 0 when
 * done; -1 (and *why) when the worker must, with nothing of this job left behind. */
static int gs_start_locked(int mps_fd, int jobs_fd, int tickets_fd, struct gs_start *st,
                           const char *conditions, const char *job, const char *ticket_name,
                           uid_t uid, gid_t gid, const char **why)
{
    char name[GS_KEY_MAX + 16], file[32], share[8], stamp[96], started[32], created[32];
    char pid_text[24], daemon[64], started_at[32];
    struct timespec now;
    struct stat info;
    char *record = NULL, *env = NULL, *daemon_record = NULL, *join_record = NULL;
    char *join = NULL;
    int refs_fd = -1, key_fd = -1, rc = -1, wrote_record = 0;
    long pid;

    *why = "write";
    snprintf(name, sizeof(name), "%s.jobs", st->t.key);
    if (mkdirat(mps_fd, name, 0700) < 0 || (refs_fd = gs_open_dir_at(mps_fd, name)) < 0)
        goto out;
    snprintf(share, sizeof(share), "%d\n", st->t.share);
    snprintf(name, sizeof(name), "%s.json", st->t.key);
    if (gs_write_at(refs_fd, job, share, 1) < 0 ||
        gs_write_mode_at(mps_fd, name, st->before, 0, 0644) < 0)
        goto out;
    *why = "directories";
    if (mkdirat(mps_fd, st->t.key, 0755) < 0 ||
        (key_fd = openat(mps_fd, st->t.key, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fstat(key_fd, &info) < 0 || info.st_uid != 0 || fchmod(key_fd, 0755) < 0 ||
        gs_make_user_dir(key_fd, "pipe", uid, gid) < 0 ||
        gs_make_user_dir(key_fd, "log", uid, gid) < 0)
        goto out;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(started_at, sizeof(started_at), "%ld.%06ld", (long)now.tv_sec,
             now.tv_nsec / 1000L);
    if ((pid = gs_start_daemon(key_fd, st, uid, gid, started, sizeof(started), why)) < 0)
        goto out;
    *why = "write";
    snprintf(pid_text, sizeof(pid_text), "%ld", pid);
    snprintf(daemon, sizeof(daemon), "%ld %s", pid, started);
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(created, sizeof(created), "%ld.%06ld", (long)now.tv_sec, now.tv_nsec / 1000L);
    {
        const struct gs_mark daemon_marks[] = {{GS_PID_MARK, pid_text},
                                               {GS_STARTED_MARK, started_at}};
        const struct gs_mark job_marks[] = {{GS_JOB_ID_MARK, job}, {GS_CREATED_MARK, created},
                                            {GS_PID_MARK, pid_text}};
        daemon_record = gs_fill(st->started, daemon_marks, 2);
        record = gs_fill(st->t.record, job_marks, 3);
        env = gs_fill(st->t.env, job_marks, 3);
        join_record = gs_fill(st->t.record, job_marks + 2, 1);
    }
    if (!daemon_record || !record || !env || !join_record ||
        gs_write_mode_at(mps_fd, name, daemon_record, 0, 0644) < 0 ||
        fstatat(mps_fd, name, &info, AT_SYMLINK_NOFOLLOW) < 0)
        goto out;
    gs_stamp(&info, stamp, sizeof(stamp));
    snprintf(file, sizeof(file), "%s.json", job);
    if (gs_write_at(jobs_fd, file, record, 0) < 0)
        goto out;
    wrote_record = 1;
    snprintf(file, sizeof(file), "%s.env", job);
    if (gs_write_at(jobs_fd, file, env, 0) < 0)
        goto out;
    rc = 0;
    /* Only saves the user's next job its worker: a ticket not written costs nothing. */
    {
        const struct gs_mark env_marks[] = {{GS_PID_MARK, pid_text}};
        char *join_env = gs_fill(st->t.env, env_marks, 1);
        join = join_env ? gs_join_text(conditions, st->conditions_len, daemon, stamp,
                                       join_record, join_env) : NULL;
        if (join)
            (void)gs_write_at(tickets_fd, ticket_name, join, 0);
        free(join_env);
    }
out:
    if (rc < 0) {
        /* The job's reference stays, on a record without a daemon until the start is done:
         * the worker's acquire() ends what runs and starts it again, and should the worker
         * fail first, the job's epilog does (its release() finds the reference). */
        if (wrote_record) {
            snprintf(file, sizeof(file), "%s.json", job);
            (void)unlinkat(jobs_fd, file, 0);
        }
    }
    free(record);
    free(env);
    free(daemon_record);
    free(join_record);
    free(join);
    if (key_fd >= 0)
        close(key_fd);
    if (refs_fd >= 0)
        close(refs_fd);
    return rc;
}

/* 1 when the job's daemon was started here, 0 when the Python worker must set it up. */
static int gs_fast_start(spank_t sp, int ac, char **av)
{
    char path[PATH_MAX + 32], name[96], join_name[96], job[16], gpus[48], ids[2][16];
    char pipe_dir[PATH_MAX + GS_KEY_MAX + 16];
    const char *why = "no-ticket", *share;
    const char *const leftovers[] = {".json", "", ".jobs"}; /* record, directories, jobs */
    struct gs_start st;
    struct stat info;
    uint32_t uid = 0, gid = 0;
    double began = gs_now();
    struct gs_ticket_fds fds;
    int started = 0;
    char *text, *filled = NULL, *conditions = NULL;

    /* The ticket's name, as gpushare.node.ticket.start_name makes it. */
    if (gs_ticket_job(sp, job, &uid, gpus, &share) < 0 ||
        spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
        return 0;
    snprintf(name, sizeof(name), "start.g%s.s%s", gpus, share);
    snprintf(join_name, sizeof(join_name), "u%u.g%s.s%s", uid, gpus, share);
    snprintf(ids[0], sizeof(ids[0]), "%u", uid);
    snprintf(ids[1], sizeof(ids[1]), "%u", gid);
    if (!(text = gs_read_ticket(&fds, name)))
        goto out;
    {
        const struct gs_mark user_marks[] = {{GS_UID_MARK, ids[0]}, {GS_GID_MARK, ids[1]}};
        why = "memory";
        if (!(filled = gs_fill(text, user_marks, 2)) || !(conditions = strdup(filled)))
            goto out;
    }
    if (gs_start_holds(sp, ac, av, filled, &st, &why) < 0)
        goto out;
    /* The daemon the ticket describes is this user's, in its directory of the state dir. */
    why = "ticket";
    snprintf(path, sizeof(path), "u%u-", uid);
    snprintf(pipe_dir, sizeof(pipe_dir), "%s/mps/%s/pipe", gs_state_dir, st.t.key);
    if (strncmp(st.t.key, path, strlen(path)) != 0 || strcmp(st.pipe_dir, pipe_dir) != 0 ||
        gs_program_trusted(st.program) < 0)
        goto out;
    why = "epilogs";
    if (gs_no_epilog_running(gpus) < 0)
        goto out;
    why = "lock";
    if (gs_ticket_lock(&fds, st.t.key) < 0)
        goto out;
    /* A daemon of the user's there, or what is left of one: the worker's to deal with. */
    why = "daemon-exists";
    for (size_t i = 0; i < sizeof(leftovers) / sizeof(leftovers[0]); i++) {
        snprintf(path, sizeof(path), "%s%s", st.t.key, leftovers[i]);
        if (fstatat(fds.mps, path, &info, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
            goto out;
    }
    started = gs_start_locked(fds.mps, fds.jobs, fds.tickets, &st,
                              conditions + strlen("gpushare-start 1\n"), job, join_name, uid,
                              gid, &why) == 0;
out:
    gs_ticket_close(&fds);
    free(text);
    free(filled);
    free(conditions);
    if (!started) {
        gs_debug(sp, "cb=job_prolog start=no reason=%s", why);
        return 0;
    }
    gs_count_fast("prolog", gs_now() - began, "note mps_daemon_starts\n");
    gs_debug(sp, "cb=job_prolog python=skip reason=started daemon=%s share=%d ms=%.1f",
             st.t.key, st.t.share, (gs_now() - began) * 1e3);
    slurm_info("gpushare: job %s: shared MPS, %d%% of GPU %s, daemon %s (started by the "
               "plugin)", job, st.t.share, gpus, st.t.key);
    return 1;
}

/* ---- SPANK entry points ----------------------------------------------------------- */

GS_EXPORT int slurm_spank_init(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();

    if (ctx == S_CTX_SLURMD) {
        /* Which gpushare this node runs, once in slurmd's log (GS_VERSION: spank/build.py). */
        slurm_info("gpushare %s loaded (built for Slurm %d.%02d.%d)", GS_VERSION,
                   SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER),
                   SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER),
                   SLURM_VERSION_MICRO(SLURM_VERSION_NUMBER));
        /* Report a bad line to slurmd's log, but never start Python or fail slurmd. */
        (void)gs_parse_args(ac, av);
        return 0;
    }
    if (gs_parse_args(ac, av) < 0)
        return -1;
    if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) {
        for (struct spank_option *opt = gs_options; opt->name; opt++) {
            if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
                slurm_error("gpushare: cannot register option --%s", opt->name);
                return -1;
            }
        }
    }
    return 0;
}

GS_EXPORT int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
    char lock[PATH_MAX + 32], core[PATH_MAX], jobs[PATH_MAX];
    int fd, rc;

    if (gs_parse_args(ac, av) < 0)
        return -1;
    gs_debug(sp, "cb=job_prolog begin");
    if (!gs_env_set("SLURM_JOB_GPUS") && !gs_env_set("CUDA_VISIBLE_DEVICES") &&
        !gs_env_set("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") && !gs_job_options_used(sp)) {
        gs_debug(sp, "cb=job_prolog python=skip reason=no-gpu");
        return 0;
    }
    if (gs_jobs_dir(jobs, sizeof(jobs)) < 0 || gs_job_file(sp, ".lock", lock, sizeof(lock)) < 0 ||
        (fd = gs_open_lock(lock, 1)) < 0) {
        slurm_error("gpushare: job prolog: cannot create the job's lock in %s/jobs: %m "
                    "(check plugstack state_dir=)", gs_state_dir);
        return -1;
    }
    if (gs_flock_until(fd, LOCK_EX, gs_now() + gs_wait_limit()) < 0) {
        slurm_error("gpushare: job prolog: %s is held by another process: %m", lock);
        close(fd);
        return -1;
    }
    if (gs_fast_join(sp, ac, av)) {
        close(fd); /* the tasks have their file: the job's lock is free for its epilog */
        return 0;
    }
    /* What the worker will load is checked here, so that Slurm drains the node for it. */
    if (gs_core_trusted(core, sizeof(core)) < 0) {
        close(fd);
        return -1;
    }
    rc = gs_call_detached("job_prolog", sp, ac, av, NULL);
    close(fd);
    return rc;
}

GS_EXPORT int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
    char lock[PATH_MAX + 32], jobs[PATH_MAX];
    int fd = -1, barrier[GS_EPILOG_LOCKS_MAX], held, rc, jobs_ok;

    if (gs_parse_args(ac, av) < 0)
        return -1;
    /* The job's prolog worker first: what it set up is what this epilog undoes. */
    if (gs_job_file(sp, ".lock", lock, sizeof(lock)) == 0)
        fd = gs_open_lock(lock, 0);
    if (fd >= 0 && gs_flock_until(fd, LOCK_EX, gs_now() + gs_wait_limit()) < 0) {
        slurm_error("gpushare: job epilog: the job's prolog worker still runs after %g s (a "
                    "hung MPS daemon or NVML?); see slurmd's log and `gpushare mps` on this "
                    "node", gs_wait_limit());
        close(fd);
        return -1;
    }
    if (!gs_job_record_exists(sp) && !gs_env_set("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") &&
        !gs_job_options_used(sp)) {
        if (fd >= 0) {
            gs_finish("job_epilog", sp, lock);
            close(fd);
        }
        gs_debug(sp, "cb=job_epilog python=skip reason=no-share");
        return 0;
    }
    jobs_ok = gs_jobs_dir(jobs, sizeof(jobs)) == 0;
    if (jobs_ok && gs_fast_leave(sp)) {
        if (fd >= 0) {
            gs_finish("job_epilog", sp, lock);
            close(fd);
        }
        return 0;
    }
    if (!jobs_ok || (held = gs_hold_epilog_barrier(barrier, GS_EPILOG_LOCKS_MAX)) < 0) {
        rc = gs_in_place("job_epilog", sp, ac, av, fd >= 0 ? lock : NULL);
    } else {
        rc = gs_call_detached("job_epilog", sp, ac, av, fd >= 0 ? lock : NULL);
        while (held > 0)
            close(barrier[--held]);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/*
 * The task's environment comes from <state_dir>/jobs/<id>.env, written by job_prolog:
 * "KEY=VALUE" lines, plus "#error=<text>" (the job's request was refused) and
 * "#show=<text>" (the line the user reads). Reading it here keeps Python out of
 * slurmstepd entirely: no interpreter start per task, no GIL across slurmstepd's fork().
 */
#define GS_ENV_MAX 65536

static int gs_valid_env_name(const char *name, size_t len)
{
    if (len == 0 || len > 128)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9')))
            return 0;
    }
    return 1;
}

/* Read the root-owned env file; 1 when read, 0 when absent, -1 on an unsafe file. */
static int gs_read_env_file(spank_t sp, char *buf, size_t size)
{
    char path[PATH_MAX + 32];
    uint32_t job_id = 0;
    struct stat st;
    ssize_t n, total = 0;
    int fd;

    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
        gs_job_file(sp, ".env", path, sizeof(path)) < 0)
        return -1;
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
        (st.st_mode & 0077) || st.st_size >= (off_t)size) {
        slurm_error("gpushare: job %u: refusing %s: not a root-owned 0600 file", job_id, path);
        close(fd);
        return -1;
    }
    while ((n = read(fd, buf + total, size - 1 - total)) > 0)
        total += n;
    close(fd);
    if (n < 0)
        return -1;
    buf[total] = '\0';
    return 1;
}

static int gs_apply_env_file(spank_t sp, char *text)
{
    uint32_t node_id = 1;
    int task_id = 1;
    const char *show = NULL;
    char *save = NULL;

    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = '\0';
        if (strcmp(line, "#error") == 0) {
            slurm_spank_log("gpushare: %s", eq + 1);
            return -1;
        }
        if (strcmp(line, "#show") == 0) {
            show = eq + 1;
            continue;
        }
        if (!gs_valid_env_name(line, strlen(line)))
            continue;
        if (spank_setenv(sp, line, eq + 1, 1) != ESPANK_SUCCESS) {
            slurm_error("gpushare: cannot set %s in the task", line);
            return -1;
        }
    }
    if (show && spank_get_item(sp, S_JOB_NODEID, &node_id) == ESPANK_SUCCESS &&
        spank_get_item(sp, S_TASK_ID, &task_id) == ESPANK_SUCCESS && node_id == 0 &&
        task_id == 0) {
        if (dprintf(STDERR_FILENO, "%s\n", show) < 0) {
            /* the line is informative only */
        }
    }
    return 0;
}

/*
 * With switch/nvidia_imex, slurmstepd gives each step of a job its IMEX channel device
 * (<dir>/channel<N>) before the tasks start; multi-node NVLink memory sharing fails
 * without one. A GPU task that finds none is stopped here with the reason, instead of
 * failing later inside CUDA.
 */
static int gs_check_imex(spank_t sp)
{
    char gpus[256];
    struct dirent *entry;
    struct stat st;
    DIR *dir;
    int fd, found = 0;

    if (!gs_imex_dir[0])
        return 0;
    if (gs_getenv(sp, "SLURM_JOB_GPUS", gpus, sizeof(gpus)) < 0 &&
        gs_getenv(sp, "CUDA_VISIBLE_DEVICES", gpus, sizeof(gpus)) < 0)
        return 0; /* not a GPU job: no IMEX channel needed */
    fd = open(gs_imex_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir && fd >= 0)
        close(fd);
    while (dir && !found && (entry = readdir(dir))) {
        if (strncmp(entry->d_name, "channel", 7) != 0 || !entry->d_name[7] ||
            entry->d_name[7 + strspn(entry->d_name + 7, "0123456789")] != '\0')
            continue;
        if (fstatat(dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISCHR(st.st_mode))
            found = 1;
    }
    if (dir)
        closedir(dir);
    if (found) {
        gs_debug(sp, "cb=task_init_privileged imex=found");
        return 0;
    }
    slurm_spank_log("gpushare: this GPU job has no IMEX channel in %s, which multi-node "
                    "NVLink needs: the node's Slurm must give each job one (slurm.conf "
                    "SwitchType=switch/nvidia_imex, and the nvidia-caps-imex-channels "
                    "driver device); tell your administrator", gs_imex_dir);
    return -1;
}

/*
 * The job's prolog worker may still run when its first task starts: wait for its result
 * (the env file, or the lock given back), bounded. No lock: no worker (no GPUs, or a prolog
 * of an older gpushare), nothing to wait for.
 */
static int gs_wait_for_prolog(spank_t sp)
{
    char lock[PATH_MAX + 32], env[PATH_MAX + 32];
    double deadline = gs_now() + gs_wait_limit();
    int fd, waited = 0;

    if (gs_job_file(sp, ".lock", lock, sizeof(lock)) < 0 ||
        gs_job_file(sp, ".env", env, sizeof(env)) < 0 || (fd = gs_open_lock(lock, 0)) < 0)
        return 0;
    while (access(env, F_OK) < 0 && flock(fd, LOCK_SH | LOCK_NB) < 0) {
        if (gs_now() > deadline) {
            close(fd);
            slurm_spank_log("gpushare: this job's set-up on the node (GPU check, MPS daemon) "
                            "did not finish within %g s; tell your administrator (slurmd's "
                            "log says why)", gs_wait_limit());
            return -1;
        }
        waited++;
        usleep(500);
    }
    close(fd);
    gs_debug(sp, "cb=task_init_privileged prolog=done waited=%d", waited);
    if (access(env, F_OK) < 0) {
        /* Every worker that ends leaves the tasks its word (empty when nothing is shared). */
        slurm_spank_log("gpushare: this job's set-up on the node ended without a result (its "
                        "worker was killed?); tell your administrator (slurmd's log may say "
                        "why)");
        return -1;
    }
    return 0;
}

GS_EXPORT int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    static char text[GS_ENV_MAX];
    char buf[16];
    int found;

    if (gs_parse_args(ac, av) < 0)
        return -1;
    gs_debug(sp, "cb=task_init_privileged begin");
    if (gs_check_imex(sp) < 0)
        return -1;
    found = gs_read_env_file(sp, text, sizeof(text));
    if (found == 0) {
        if (gs_wait_for_prolog(sp) < 0)
            return -1;
        found = gs_read_env_file(sp, text, sizeof(text));
    }
    if (found < 0)
        return -1;
    if (found == 0) {
        if (gs_share_percent || gs_private_mps ||
            gs_getenv(sp, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", buf, sizeof(buf)) == 0) {
            slurm_spank_log("gpushare: this job asked to share a GPU but its node has no "
                            "gpushare record: the job prolog failed or did not run (the "
                            "plugin must be in plugstack.conf on this node); see slurmd's "
                            "log");
            return -1;
        }
        gs_debug(sp, "cb=task_init_privileged skip reason=no-share");
        return 0;
    }
    if (!text[0]) {
        gs_debug(sp, "cb=task_init_privileged skip reason=no-share");
        return 0;
    }
    gs_debug(sp, "cb=task_init_privileged env-file state_dir=%s", gs_state_dir);
    return gs_apply_env_file(sp, text);
}
