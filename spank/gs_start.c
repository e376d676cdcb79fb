/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The prolog worker's fast start: a shared job's own daemon, started in C.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gs_internal.h"

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
static int gs_start_holds(const struct gs_ticket_facts *facts, char *text, struct gs_start *st,
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
            if (gs_ticket_condition(facts, word, value, &st->t, &args, why) <= 0)
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
    return args == facts->ac ? 0 : -1;
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
    char name[GS_KEY_MAX + 16], file[32], share[8], stamp[GS_STAMP_MAX], started[32], created[32];
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
int gs_fast_start(spank_t sp, int ac, char **av)
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
    struct gs_ticket_facts facts;
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
    gs_ticket_facts(&facts, sp, ac, av);
    if (gs_start_holds(&facts, filled, &st, &why) < 0)
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
