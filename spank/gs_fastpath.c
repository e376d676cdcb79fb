/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The join and leave fast paths: a shared job joined to its user's running daemon in the
 * job prolog, and one that leaves a daemon other jobs keep in the job epilog, both without
 * an interpreter. Any doubt leaves the job to the worker (gs_worker.c).
 */
#define _GNU_SOURCE
#include <dirent.h>
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

/* ---- the epilog's fast leave: a reference dropped without an interpreter ---------- */

/*
 * A daemon's caps are the largest share among its jobs (gpushare.node.mps.limits), and each
 * job referencing it is a file <state_dir>/daemons/<key>.jobs/<job id> holding its share
 * (gpushare.node.mps.record). A job that leaves other jobs on its daemon, one of them with a
 * share at least its own, changes neither the daemon nor its caps: its epilog only has to
 * unlink that file, under the daemon's lock (<key>.lock, as gpushare.node.mps.lock takes
 * it), and the job's own files. That is done here, so the epilog of most jobs on a shared
 * GPU starts no interpreter. Anything else (the daemon's last job, the largest share
 * leaving, a job in no daemon or in several, a record from an earlier release, a lock
 * held past timeout=, any file not as gpushare writes it) is left to the Python worker.
 */

/* A share file's percent (1-100), or -1 for anything gpushare does not write. */
static int gs_read_share(int dir_fd, const char *name)
{
    char *text = gs_read_root_file(dir_fd, name, 16);
    int share = gs_parse_share_text(text);

    free(text);
    return share;
}

/* The one daemon whose <key>.jobs/ holds the job (its key in key[]); -1 for none or several. */
static int gs_daemon_of_job(int store_fd, const char *job, char *key)
{
    char ref[GS_KEY_MAX + 32];
    struct dirent *entry;
    struct stat st;
    int found = 0;
    DIR *dir = gs_dir_stream(store_fd);
    const size_t suffix = strlen(GS_DAEMON_JOBS_SUFFIX);
    size_t len;

    if (!dir)
        return -1;
    while ((entry = readdir(dir))) {
        len = strlen(entry->d_name);
        if (entry->d_name[0] == '.' || len <= suffix || len - suffix >= GS_KEY_MAX ||
            strcmp(entry->d_name + len - suffix, GS_DAEMON_JOBS_SUFFIX) != 0)
            continue;
        snprintf(ref, sizeof(ref), "%s/%s", entry->d_name, job);
        if (fstatat(store_fd, ref, &st, AT_SYMLINK_NOFOLLOW) == 0 && found++ == 0)
            snprintf(key, GS_KEY_MAX, "%.*s", (int)(len - suffix), entry->d_name);
    }
    closedir(dir);
    return found == 1 ? 0 : -1;
}

/* Under the daemon's lock: unlink the job's reference when others stay with a share at
 * least its own. Returns the job's share when done, 0 (and *why) when the worker must. */
static int gs_drop_reference(int store_fd, const char *key, const char *job, const char **why)
{
    char name[GS_KEY_MAX + 16];
    struct dirent *entry;
    struct stat st;
    int own, share, others = 0, largest = 0, jobs_fd;
    DIR *dir;

    *why = "no-record";
    snprintf(name, sizeof(name), "%s.json", key);
    if (fstatat(store_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
        return 0;
    *why = "jobs-unreadable";
    snprintf(name, sizeof(name), "%s" GS_DAEMON_JOBS_SUFFIX, key);
    if ((jobs_fd = gs_open_dir_at(store_fd, name)) < 0)
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

/* 1 when the job left its daemon here (its files gone too), 0 when the worker must run. */
int gs_fast_leave(spank_t sp)
{
    char path[PATH_MAX + 32], key[GS_KEY_MAX], job[16];
    uint32_t job_id = 0;
    double started = gs_now();
    int store_fd, lock_fd, share = 0;
    const char *why = "lock";

    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
        return 0;
    snprintf(job, sizeof(job), "%u", job_id);
    snprintf(path, sizeof(path), "%s/" GS_DAEMONS_DIR, gs_state_dir);
    store_fd = gs_check_state_dir(0) == 0 ? gs_open_dir_at(AT_FDCWD, path) : -1;
    if (store_fd < 0 || gs_daemon_of_job(store_fd, job, key) < 0) {
        if (store_fd >= 0)
            close(store_fd);
        gs_debug(sp, "cb=job_epilog fast=no reason=no-single-daemon");
        return 0;
    }
    if ((lock_fd = gs_lock_daemon(store_fd, key)) >= 0) {
        share = gs_drop_reference(store_fd, key, job, &why);
        close(lock_fd);
    }
    close(store_fd);
    if (!share) {
        gs_debug(sp, "cb=job_epilog fast=no reason=%s daemon=%s", why, key);
        return 0;
    }
    /* As gpushare.node.state.JobStore.remove: the tasks' file, then the record. */
    if (gs_job_file(sp, GS_ENV_SUFFIX, path, sizeof(path)) == 0)
        (void)unlink(path);
    if (gs_job_file(sp, GS_RECORD_SUFFIX, path, sizeof(path)) == 0)
        (void)unlink(path);
    gs_count_fast("epilog", gs_now() - started);
    gs_debug(sp, "cb=job_epilog python=skip reason=left-daemon daemon=%s share=%d", key, share);
    return 1;
}

/* ---- the prolog's fast join: a job joined to its user's running daemon ------------- */

/*
 * A shared job whose user runs a daemon on the job's GPU with caps that cover its share
 * needs nothing decided: its reference, record and task environment are the previous such
 * job's with its own id. The worker of that job left a join ticket saying under which
 * conditions this holds and what to write (gpushare.node.ticket describes the format and
 * every condition). Here the ticket <state_dir>/daemons/tickets/u<uid>.g<gpus>.s<share> is
 * used only if every one of its conditions holds; under the daemon's lock the job's record,
 * its reference <key>.jobs/<job id> and last its tasks' environment file are written. Any
 * doubt leaves the job to the worker, which checks the GPU and writes a new ticket.
 */

int gs_read_proc_stat(long pid, char *text, size_t size)
{
    char path[64];
    ssize_t len;
    int fd;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if ((fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)) < 0)
        return -1;
    len = read(fd, text, size - 1);
    close(fd);
    if (len <= 0)
        return -1;
    text[len] = '\0';
    return 0;
}

/* A live process's start time (/proc/<pid>/stat field 22) into out; -1 for none or a
 * zombie, which serves nobody. */
int gs_proc_start(long pid, char *out, size_t size)
{
    char stat_text[1024];

    if (pid <= 1 || gs_read_proc_stat(pid, stat_text, sizeof(stat_text)) < 0)
        return -1;
    return gs_parse_proc_start(stat_text, out, size);
}

/* The conditions of a ticket as this job and node meet them (struct gs_ticket_facts). */
static const char *gs_facts_getenv(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

static int gs_facts_stamp(void *ctx, const char *path, char *out, size_t size)
{
    struct stat st;

    (void)ctx;
    if (stat(path, &st) < 0)
        return -1;
    gs_stamp(&st, out, size);
    return 0;
}

static int gs_facts_absent(void *ctx, const char *path)
{
    struct stat st;

    (void)ctx;
    return stat(path, &st) < 0 && errno == ENOENT;
}

static int gs_facts_proc_start(void *ctx, long pid, char *out, size_t size)
{
    (void)ctx;
    return gs_proc_start(pid, out, size);
}

void gs_ticket_facts(struct gs_ticket_facts *facts, spank_t sp, int ac, char **av)
{
    struct timespec now;
    uid_t uid = (uid_t)-1;
    gid_t gid = (gid_t)-1;

    clock_gettime(CLOCK_REALTIME, &now);
    /* Unknown ids are -1, which no ticket names (Python renders them as they are). */
    (void)spank_get_item(sp, S_JOB_UID, &uid);
    (void)spank_get_item(sp, S_JOB_GID, &gid);
    *facts = (struct gs_ticket_facts){
        .ctx = sp, .now = now.tv_sec + now.tv_nsec / 1e9, .uid = (uint32_t)uid,
        .gid = (uint32_t)gid, .ac = ac, .av = av, .getenv = gs_facts_getenv,
        .getopt = gs_getopt, .stamp = gs_facts_stamp, .absent = gs_facts_absent,
        .proc_start = gs_facts_proc_start};
}

/* Under the daemon's lock: the record, the reference, the tasks' file; undone on failure. */
static int gs_join_locked(int store_fd, int jobs_fd, const struct gs_ticket *t, const char *job,
                          const char **why)
{
    char name[GS_KEY_MAX + 16], now_stamp[GS_STAMP_MAX], created[32], file[32], share[8];
    struct stat st;
    struct timespec now;
    char *record = NULL, *env = NULL;
    int refs_fd = -1, rc = -1;
    const struct gs_mark marks[] = {{GS_JOB_ID_MARK, job}, {GS_CREATED_MARK, created}};

    *why = "daemon-changed";
    snprintf(name, sizeof(name), "%s.json", t->key);
    if (fstatat(store_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -1;
    gs_stamp(&st, now_stamp, sizeof(now_stamp));
    if (strcmp(now_stamp, t->record_stamp) != 0)
        return -1;
    *why = "write";
    snprintf(name, sizeof(name), "%s" GS_DAEMON_JOBS_SUFFIX, t->key);
    refs_fd = gs_open_dir_at(store_fd, name);
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(created, sizeof(created), "%ld.%06ld", (long)now.tv_sec, now.tv_nsec / 1000L);
    record = gs_fill(t->record, marks, 2);
    env = gs_fill(t->env, marks, 2);
    snprintf(file, sizeof(file), "%s" GS_RECORD_SUFFIX, job);
    snprintf(share, sizeof(share), "%d\n", t->share);
    if (refs_fd < 0 || !record || !env ||
        gs_write_at(jobs_fd, file, record, 0) < 0)
        goto out;
    if (gs_write_at(refs_fd, job, share, 1) < 0) {
        (void)unlinkat(jobs_fd, file, 0);
        goto out;
    }
    snprintf(file, sizeof(file), "%s" GS_ENV_SUFFIX, job);
    if (gs_write_at(jobs_fd, file, env, 0) < 0) {
        (void)unlinkat(refs_fd, job, 0);
        snprintf(file, sizeof(file), "%s" GS_RECORD_SUFFIX, job);
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
int gs_ticket_job(spank_t sp, char job[16], uint32_t *uid, char gpus[48], const char **share)
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

/* The root-owned ticket name of the state directory, whole (free() it); NULL if not. */
char *gs_read_ticket(struct gs_ticket_fds *fds, const char *name)
{
    char path[PATH_MAX + 32];

    fds->store = fds->tickets = fds->jobs = fds->lock = -1;
    snprintf(path, sizeof(path), "%s/" GS_DAEMONS_DIR, gs_state_dir);
    if (gs_check_state_dir(0) < 0 || (fds->store = gs_open_dir_at(AT_FDCWD, path)) < 0 ||
        (fds->tickets = gs_open_dir_at(fds->store, GS_TICKETS_DIR)) < 0)
        return NULL;
    return gs_read_root_file(fds->tickets, name, GS_TICKET_MAX);
}

/* The jobs directory opened and daemon key's lock taken; -1 when not. */
int gs_ticket_lock(struct gs_ticket_fds *fds, const char *key)
{
    char path[PATH_MAX + 32];

    snprintf(path, sizeof(path), "%s/" GS_JOBS_DIR, gs_state_dir);
    if ((fds->jobs = gs_open_dir_at(AT_FDCWD, path)) < 0 ||
        (fds->lock = gs_lock_daemon(fds->store, key)) < 0)
        return -1;
    return 0;
}

/* The lock given back first, then the directories closed. */
void gs_ticket_close(struct gs_ticket_fds *fds)
{
    int *each[] = {&fds->lock, &fds->jobs, &fds->tickets, &fds->store};

    for (size_t i = 0; i < sizeof(each) / sizeof(each[0]); i++)
        if (*each[i] >= 0) {
            close(*each[i]);
            *each[i] = -1;
        }
}

/* 1 when the job was joined to its daemon here, 0 when the worker must set it up. */
int gs_fast_join(spank_t sp, int ac, char **av)
{
    char name[96], job[16], gpus[48];
    const char *why = "no-ticket", *share;
    struct gs_ticket ticket;
    struct gs_ticket_facts facts;
    struct gs_ticket_fds fds;
    uint32_t uid = 0;
    double started = gs_now();
    int joined = 0;
    char *text;

    /* The ticket's name, as gpushare.node.ticket.name makes it. */
    if (gs_ticket_job(sp, job, &uid, gpus, &share) < 0)
        return 0;
    gs_ticket_facts(&facts, sp, ac, av);
    snprintf(name, sizeof(name), GS_TICKET_NAME_FMT, uid, gpus, share);
    if (!(text = gs_read_ticket(&fds, name)) ||
        gs_ticket_holds(&facts, text, &ticket, &why) < 0)
        goto out;
    why = "lock";
    if (gs_ticket_lock(&fds, ticket.key) < 0)
        goto out;
    joined = gs_join_locked(fds.store, fds.jobs, &ticket, job, &why) == 0;
out:
    gs_ticket_close(&fds);
    if (!joined) {
        gs_debug(sp, "cb=job_prolog fast=no reason=%s", why);
        free(text);
        return 0;
    }
    gs_count_fast("prolog", gs_now() - started);
    gs_debug(sp, "cb=job_prolog python=skip reason=joined daemon=%s share=%d", ticket.key,
             ticket.share);
    slurm_info("gpushare: job %s: shared MPS, %d%% of GPU %s, daemon %s (joined by the "
               "plugin)", job, ticket.share, gpus, ticket.key);
    free(text);
    return 1;
}

