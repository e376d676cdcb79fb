/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The Python core (spank_gpushare_core.so, next to this plugin): loaded with dlopen() only
 * when a job needs it and never inside slurmd, after the library and everything below
 * pythonpath= (the line's, else the package's own directory, GS_DEFAULT_PYTHONPATH) are
 * found out of every user's reach. The SPANK calls the core makes are lent to it through
 * struct gs_host (gs_host.h).
 *
 * A core that cannot be loaded or imported (missing, refused, a broken install, a line
 * whose pythonpath= holds no gpushare) is the node's fault: every GPU job here would meet
 * it, and no Python is left to report it. gs_core_fault drains the node with a reason that
 * names the setting and the path, and requeues a prolog's batch job as Slurm does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gs_host.h"
#include "gs_internal.h"

#define GS_TREE_MAX_ENTRIES 20000

static gs_core_dispatch_f gs_core_dispatch = NULL;
static gs_core_prefork_f gs_core_prefork = NULL;
static int gs_core_failed = 0;

char gs_code_print[17] = "";
int gs_prefork_here = 0;
static uint64_t gs_code_sum;

/* One file's part of gs_code_print: FNV-1a of its name and what stat says of its content,
 * summed over the files (the walk's order does not count). */
static void gs_code_add(const char *path, const struct stat *st)
{
    uint64_t hash = 14695981039346656037ULL;
    uint64_t facts[5] = {(uint64_t)st->st_ino, (uint64_t)st->st_size,
                         (uint64_t)st->st_mtim.tv_sec, (uint64_t)st->st_mtim.tv_nsec,
                         (uint64_t)st->st_mode};
    const unsigned char *byte = (const unsigned char *)path;

    for (; *byte; byte++)
        hash = (hash ^ *byte) * 1099511628211ULL;
    byte = (const unsigned char *)facts;
    for (size_t i = 0; i < sizeof(facts); i++)
        hash = (hash ^ byte[i]) * 1099511628211ULL;
    gs_code_sum += hash;
}

/* Why the core cannot be loaded or imported, the drain's reason without its prefix: the
 * setting and the path first, the cause last (cut first when too long). */
static char gs_core_why[GS_DRAIN_REASON_MAX + 1];

static void gs_core_cannot(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void gs_core_cannot(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(gs_core_why, sizeof(gs_core_why), fmt, ap);
    va_end(ap);
}

static const char *gs_pythonpath_shown(void)
{
    return gs_pythonpath[0] ? gs_pythonpath : "none";
}

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


static const char *gs_tree_what;
static const char *gs_tree_cause; /* why the walk refused, for the drain's reason */
static int gs_tree_entries;

static int gs_tree_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (++gs_tree_entries > GS_TREE_MAX_ENTRIES) {
        slurm_error("gpushare: refusing %s: more than %d entries below it; point "
                    "pythonpath= at a directory holding only gpushare and what it imports",
                    gs_tree_what, GS_TREE_MAX_ENTRIES);
        gs_tree_cause = "refused: too many files below it";
        return -1;
    }
    if (type == FTW_SL || type == FTW_SLN) {
        slurm_error("gpushare: refusing %s: %s is a symbolic link; install real files there",
                    gs_tree_what, path);
        gs_tree_cause = "refused: a symbolic link below it";
        return -1;
    }
    if (type == FTW_NS || type == FTW_DNR) {
        slurm_error("gpushare: refusing %s: cannot read %s", gs_tree_what, path);
        gs_tree_cause = "refused: a file below it cannot be read";
        return -1;
    }
    gs_tree_cause = "refused: a file below it not root's or writable by others";
    if (gs_untrusted(st, 0))
        return gs_refuse(gs_tree_what, path, st, "chown -R root and chmod -R go-w the "
                         "pythonpath= directory");
    gs_code_add(path, st);
    return 0;
}

/* The pythonpath= directory: its parents, itself and everything below it. */
static int gs_check_pythonpath(void)
{
    char real[PATH_MAX];
    int error;

    if (!gs_pythonpath[0])
        return 0;
    if (!realpath(gs_pythonpath, real)) {
        error = errno;
        slurm_error("gpushare: plugstack argument pythonpath=%s: %s (install gpushare's "
                    "Python package there, or fix the path)", gs_pythonpath, strerror(error));
        gs_core_cannot("cannot import its core from pythonpath=%s (%s)", gs_pythonpath,
                       strerror(error));
        return -1;
    }
    gs_tree_what = "pythonpath=";
    gs_tree_entries = 0;
    if (gs_check_parents("pythonpath=", real) < 0) {
        gs_core_cannot("cannot import its core from pythonpath=%s (refused: a directory "
                       "above it not root's or writable by others)", gs_pythonpath);
        return -1;
    }
    gs_tree_cause = "refused";
    if (nftw(real, gs_tree_entry, 16, FTW_PHYS) == 0)
        return 0;
    gs_core_cannot("cannot import its core from pythonpath=%s (%s)", gs_pythonpath,
                   gs_tree_cause);
    return -1;
}

/* The core library that is about to be loaded, and the directories above it. */
static int gs_check_core(const char *path)
{
    char real[PATH_MAX];
    struct stat st;
    int error, rc;

    if (!realpath(path, real) || stat(real, &st) < 0) {
        error = errno;
        slurm_error("gpushare: cannot load the Python core %s: %s (install it next to "
                    "spank_gpushare.so)", path, strerror(error));
        gs_core_cannot("cannot load its Python core %s (%s)", path, strerror(error));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        slurm_error("gpushare: refusing the Python core: %s is not a regular file (install "
                    "the library there)", real);
        gs_core_cannot("cannot load its Python core %s (not a regular file)", real);
        return -1;
    }
    gs_code_add(real, &st);
    if (gs_untrusted(&st, 0))
        rc = gs_refuse("the Python core", real, &st, "chown root and chmod go-w it");
    else
        rc = gs_check_parents("the Python core", real);
    if (rc < 0)
        gs_core_cannot("cannot load its Python core %s (refused: it or a directory above "
                       "it not root's or writable by others)", real);
    return rc;
}

/* The core library and pythonpath=, checked before anything of them is loaded. */
int gs_core_trusted(char *path, size_t size)
{
    if (gs_core_path(path, size) < 0) {
        slurm_error("gpushare: cannot find the directory of spank_gpushare.so");
        gs_core_cannot("cannot load its Python core (no directory for spank_gpushare.so)");
        return -1;
    }
    gs_code_sum = 0;
    gs_code_print[0] = '\0';
    if (gs_check_core(path) < 0 || gs_check_pythonpath() < 0)
        return -1;
    snprintf(gs_code_print, sizeof(gs_code_print), "%016llx", (unsigned long long)gs_code_sum);
    return 0;
}

/* The core, once loaded: it stays for the process's life (built -z nodelete), even when it
 * failed to start, as Python cannot be unloaded. */
static void *gs_core_handle = NULL;

/* `checked`: the core's path when gs_core_trusted has just walked it in this call (a
 * worker that tried its prefork server first), so the tree is walked once per job. */
static int gs_load_core(spank_t sp, const char *checked)
{
    char path[PATH_MAX];
    gs_core_start_f start;

    if (gs_core_dispatch)
        return 0;
    if (gs_core_failed)
        return -1;
    if (spank_context() == S_CTX_SLURMD) {
        slurm_error("gpushare: refusing to start Python inside slurmd");
        return -1;
    }
    gs_core_failed = 1; /* until it has loaded */
    if (checked)
        snprintf(path, sizeof(path), "%s", checked);
    else if (gs_core_trusted(path, sizeof(path)) < 0)
        return -1;
    /* RTLD_GLOBAL: libpython's symbols must resolve for extension modules. */
    gs_core_handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!gs_core_handle) {
        const char *error = dlerror();

        slurm_error("gpushare: cannot load the Python core %s: %s (install it next to "
                    "spank_gpushare.so)", path, error ? error : "dlopen failed");
        gs_core_cannot("cannot load its Python core %s (%s)", path,
                       error ? error : "dlopen failed");
        return -1;
    }
    start = (gs_core_start_f)dlsym(gs_core_handle, "gpushare_core_start");
    gs_core_dispatch = (gs_core_dispatch_f)dlsym(gs_core_handle, "gpushare_core_dispatch");
    gs_core_prefork = (gs_core_prefork_f)dlsym(gs_core_handle, "gpushare_core_prefork");
    if (!start || !gs_core_dispatch) {
        slurm_error("gpushare: %s is not gpushare's core (missing symbols)", path);
        gs_core_cannot("cannot load its Python core %s (not gpushare's core)", path);
        gs_core_dispatch = NULL;
        return -1;
    }
    if (start() != 0) {
        gs_core_cannot("cannot start its Python core %s (slurmd's log says why)", path);
        gs_core_dispatch = NULL;
        return -1;
    }
    gs_core_failed = 0;
    gs_debug(sp, "python=start");
    return 0;
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


double gs_python_deadline = 0.0;

/*
 * Run one callback in the core; any failure becomes a logged error and a -1, or
 * GS_CORE_IMPORT_FAILED when the core cannot be loaded or imported (the node's fault,
 * gs_core_fault: the caller does what it calls for).
 */
int gs_call_python(const char *callback, spank_t sp, int ac, char **av)
{
    struct gs_host host = {(void *)sp, gs_log, gs_job_ids, gs_getopt, gs_python_deadline};
    char path[PATH_MAX];
    const char *checked = NULL;
    double started = gs_now();
    int rc = GS_CORE_IMPORT_FAILED;

    /* prefork=yes: the server runs it, for the code checked now, when it is there; no
     * pythonpath= leaves nothing to check the server's code against. */
    if (gs_prefork_here && gs_pythonpath[0] && !gs_core_dispatch && !gs_core_failed) {
        if (gs_core_trusted(path, sizeof(path)) < 0) {
            gs_core_failed = 1; /* the walk said why; gs_load_core must not walk again */
        } else {
            checked = path;
            if (gs_prefork_call(callback, sp, ac, av, gs_code_print, &rc) == 0) {
                gs_debug(sp, "cb=%s prefork rc=%d", callback, rc);
                return rc == GS_CORE_IMPORT_FAILED ? -1 : rc;
            }
        }
    }
    if (gs_load_core(sp, checked) == 0) {
        if (gs_prefork_here && gs_pythonpath[0] && gs_code_print[0] && gs_core_prefork) {
            /* for the next workers: forked off this interpreter before it runs a job */
            gs_core_prefork(gs_state_dir, gs_code_print, ac, av);
            gs_prefork_here = 0;
        }
        rc = gs_core_dispatch(callback, &host, ac, av);
        gs_debug(sp, "cb=%s python rc=%d", callback, rc);
        if (rc != GS_CORE_IMPORT_FAILED)
            return rc;
        gs_core_cannot("cannot import its core from pythonpath=%s", gs_pythonpath_shown());
        slurm_error("gpushare: %s: cannot import gpushare from pythonpath=%s (the traceback "
                    "above says why): install gpushare's Python there, or fix the plugstack "
                    "line's pythonpath=", callback, gs_pythonpath_shown());
    }
    /* No Python ran to count the callback: counted here, as failed. */
    if (strcmp(callback, "job_prolog") == 0 || strcmp(callback, "job_epilog") == 0)
        gs_count_fast(callback[4] == 'p' ? "prolog failed" : "epilog failed",
                      gs_now() - started);
    return GS_CORE_IMPORT_FAILED;
}

/*
 * The core cannot be loaded or imported: a node fault no Python is left to report, which
 * every GPU job here would meet. The node is drained with why (the setting and the path);
 * with `requeue` (a prolog's detached worker: Slurm no longer waits for it), the batch job
 * is requeued as Slurm requeues one after a failing prolog (held unless
 * nohold_on_prolog_fail, never against --no-requeue), and its tasks are told. A prolog
 * that fails in Slurm's sight leaves the requeue to Slurm, which keeps this drain's reason.
 */
void gs_core_fault(const char *callback, spank_t sp, int requeue)
{
    char node_why[GS_DRAIN_REASON_MAX + 64], text[GS_DRAIN_REASON_MAX + 512];
    const char *node = gs_node_name(), *done = NULL;
    uint32_t job_id = 0;

    if (spank_context() == S_CTX_SLURMD || (strcmp(callback, "job_prolog") != 0 &&
                                            strcmp(callback, "job_epilog") != 0))
        return;
    if (!gs_core_why[0])
        gs_core_cannot("cannot load its Python core (slurmd's log says why)");
    slurm_error("gpushare: %s: %s: the node's fault; draining it", callback, gs_core_why);
    (void)gs_drain_node(gs_core_why);
    if (!requeue || strcmp(callback, "job_prolog") != 0)
        return;
    (void)spank_get_item(sp, S_JOB_ID, &job_id);
    if (job_id)
        done = gs_requeue_job(job_id);
    snprintf(node_why, sizeof(node_why), "node %s: gpushare %s", node ? node : "?",
             gs_core_why);
    if (done && strcmp(done, "held") == 0)
        snprintf(text, sizeof(text), "could not set up this job on %s. The node was drained; "
                 "the job was requeued and held, as Slurm holds a job whose prolog failed: "
                 "`scontrol release %u` runs it on another node", node_why, job_id);
    else if (done)
        snprintf(text, sizeof(text), "could not set up this job on %s. The node was drained; "
                 "the job was requeued to run on another node", node_why);
    else
        snprintf(text, sizeof(text), "could not set up this job on %s. The node was drained; "
                 "submit the job again", node_why);
    gs_fail_tasks(sp, text);
}
