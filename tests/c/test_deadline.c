/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The supervisor's wait for a killed worker (spank/gs_deadline.c) is bounded: a worker that
 * a kill does not end (stuck in the kernel, uninterruptible) is waited for GS_KILL_WAIT
 * seconds at most; then the fault path runs with the stuck worker named, and the job's
 * lock that the worker still holds is released, so that nothing after it waits on it.
 * A worker's child in the prefork server (prefork=yes), named in the shared page, goes
 * with the worker: at the deadline, and when the worker is killed; never a process that
 * only has its pid.
 * gs_deadline.c is included, with kill() routed through this file: a "stuck" child is one
 * whose SIGKILL and SIGSTOP this file swallows (it ends only when the test kills it for
 * real afterwards). Every other call into the plugin is this file's. links: gs_parse.c */
#include <signal.h>
#include <sys/file.h>
#include <sys/types.h>

static int gs_test_kill(pid_t pid, int sig);
#define kill gs_test_kill
#include "../../spank/gs_deadline.c"
#undef kill

#include <stdarg.h>

#include "gs_check.h"

/* What the stubs answer, set by each test. */
static int swallow; /* SIGKILL and SIGSTOP reach no process: every worker is stuck */
static int fault_path_runs;
static char errors[8192], lock_path[PATH_MAX];

double gs_timeout = 0.01; /* a worker's deadline: 4 x 0.01 + 5 s */
double gs_python_deadline = 0.0;
struct gs_delegate *gs_delegate = NULL;
static pid_t delegate_to_name; /* the worker names it in the shared page, then waits */
static int worker_dies;        /* the worker kills itself instead of waiting */

static int gs_test_kill(pid_t pid, int sig)
{
    if (swallow && (sig == SIGKILL || sig == SIGSTOP))
        return 0;
    return kill(pid, sig);
}

void slurm_error(const char *fmt, ...)
{
    size_t used = strlen(errors);
    va_list ap;

    va_start(ap, fmt);
    if (used + 1 < sizeof(errors)) {
        vsnprintf(errors + used, sizeof(errors) - used - 1, fmt, ap);
        strcat(errors, "\n");
    }
    va_end(ap);
}

double gs_now(void)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

int gs_read_proc_stat(long pid, char *text, size_t size)
{
    char path[64];
    ssize_t got;
    int fd;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    got = read(fd, text, size - 1);
    close(fd);
    if (got < 0)
        return -1;
    text[got] = '\0';
    return 0;
}

int gs_proc_start(long pid, char *out, size_t size)
{
    char text[1024];

    if (gs_read_proc_stat(pid, text, sizeof(text)) < 0)
        return -1;
    return gs_parse_proc_start(text, out, size);
}

int gs_job_file(spank_t sp, const char *suffix, char *path, size_t size)
{
    (void)sp;
    (void)suffix;
    snprintf(path, size, "%s", lock_path);
    return 0;
}

/* The fault path's Python, in its own process: it says it handled the failure. */
int gs_call_python(const char *callback, spank_t sp, int ac, char **av)
{
    (void)callback;
    (void)sp;
    (void)ac;
    (void)av;
    return 0;
}

/* The worker's Python, stuck: a kill is all that would end it. */
int gs_run_worker(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end)
{
    (void)callback;
    (void)sp;
    (void)ac;
    (void)av;
    (void)lock_at_end;
    if (delegate_to_name > 0 && gs_delegate &&
        gs_proc_start(delegate_to_name, gs_delegate->start, sizeof(gs_delegate->start)) == 0)
        gs_delegate->pid = delegate_to_name;
    if (worker_dies)
        raise(SIGKILL);
    for (;;)
        pause();
}

int gs_drain_node(const char *why)
{
    (void)why;
    return 0;
}

void gs_fail_tasks(spank_t sp, const char *text)
{
    (void)sp;
    (void)text;
}

void gs_finish(const char *callback, spank_t sp, const char *lock)
{
    (void)callback;
    (void)sp;
    (void)lock;
    fault_path_runs++; /* gs_finish comes after the fault path, in every case */
}

/* The pid of the worker named in the errors, or 0. */
static pid_t named_worker(void)
{
    const char *at = strstr(errors, "stuck unkillable (pid ");
    return at ? (pid_t)atoi(at + strlen("stuck unkillable (pid ")) : 0;
}

static void end_for_real(pid_t pid)
{
    int status;

    (void)kill(pid, SIGKILL);
    (void)kill(pid, SIGCONT);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
}

/* A process that is not a child of ours, as the prefork server's child is not the
 * supervisor's: its pid, or -1. It runs until killed. */
static pid_t not_our_child(void)
{
    int pipe_fds[2];
    pid_t pid = -1, middle;

    if (pipe(pipe_fds) < 0)
        return -1;
    middle = fork();
    if (middle == 0) {
        pid_t grandchild = fork();

        if (grandchild == 0) {
            int null_fd = open("/dev/null", O_RDWR);

            close(pipe_fds[0]);
            close(pipe_fds[1]);
            /* the test runner reads our output to its end: not through this one */
            dup2(null_fd, STDOUT_FILENO);
            dup2(null_fd, STDERR_FILENO);
            for (;;)
                pause();
        }
        (void)!write(pipe_fds[1], &grandchild, sizeof(grandchild));
        _exit(0);
    }
    close(pipe_fds[1]);
    if (read(pipe_fds[0], &pid, sizeof(pid)) != (ssize_t)sizeof(pid))
        pid = -1;
    close(pipe_fds[0]);
    while (waitpid(middle, NULL, 0) < 0 && errno == EINTR)
        ;
    return pid;
}

static int gone(pid_t pid)
{
    char text[1024];

    /* X: being reaped (where a parent reaps orphans, as pid 1 of a test root does) */
    return gs_read_proc_stat(pid, text, sizeof(text)) < 0 || strstr(text, ") Z ") != NULL ||
           strstr(text, ") X ") != NULL;
}

static void test_a_killable_worker_is_reaped(void)
{
    pid_t child = fork();

    if (child == 0)
        for (;;)
            pause();
    swallow = 0;
    CHECK_INT(gs_kill_worker(child, gs_now() + 30.0), 0);
    CHECK(waitpid(child, NULL, WNOHANG) < 0 && errno == ECHILD); /* reaped */
}

static void test_an_unkillable_worker_is_waited_for_with_a_bound(void)
{
    pid_t child = fork();

    if (child == 0)
        for (;;)
            pause();
    swallow = 1;
    errors[0] = '\0';
    /* The bound is GS_KILL_WAIT, even with far more time left to the deadline. */
    CHECK_INT(gs_kill_worker(child, gs_now() + 3600.0), child);
    CHECK(strstr(errors, "does not die when killed") != NULL);
    CHECK(waitpid(child, NULL, WNOHANG) == 0); /* still there */
    /* With the deadline already past, no wait at all. */
    CHECK_INT(gs_kill_worker(child, gs_now() - 1.0), child);
    swallow = 0;
    end_for_real(child);
}

static void test_a_stuck_worker_is_a_fault_and_leaves_the_jobs_lock_free(void)
{
    char dir[] = "/tmp/gs-test-deadline-XXXXXX";
    int held, other, rc;
    pid_t worker;

    CHECK(mkdtemp(dir) != NULL);
    snprintf(lock_path, sizeof(lock_path), "%s/42.lock", dir);
    held = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    CHECK(held >= 0 && flock(held, LOCK_EX) == 0); /* the prolog's, inherited by both */
    swallow = 1;
    errors[0] = '\0';
    fault_path_runs = 0;
    rc = gs_supervise("job_prolog", NULL, 0, NULL, NULL);
    swallow = 0;
    CHECK_INT(rc, 1);
    CHECK_INT(fault_path_runs, 1);
    worker = named_worker();
    CHECK(worker > 0);
    CHECK(strstr(errors, "job_prolog: prolog worker stuck unkillable (pid ") != NULL);
    CHECK(strstr(errors, "fault path did not finish") == NULL);
    /* The stuck worker still holds its descriptor of the lock, but not the lock. */
    CHECK(worker > 0 && waitpid(worker, NULL, WNOHANG) == 0);
    other = open(lock_path, O_RDWR | O_CLOEXEC);
    CHECK(other >= 0 && flock(other, LOCK_EX | LOCK_NB) == 0);
    if (worker > 0)
        end_for_real(worker);
    close(other);
    close(held);
    unlink(lock_path);
    rmdir(dir);
}

/* At the deadline the worker's child in the prefork server is killed with it; a killed
 * worker's is too. */
static void test_the_workers_child_in_the_prefork_server_goes_with_it(void)
{
    char dir[] = "/tmp/gs-test-deadline-XXXXXX";

    CHECK(mkdtemp(dir) != NULL);
    snprintf(lock_path, sizeof(lock_path), "%s/43.lock", dir);
    for (worker_dies = 0; worker_dies <= 1; worker_dies++) {
        delegate_to_name = not_our_child();
        CHECK(delegate_to_name > 0);
        swallow = 0;
        errors[0] = '\0';
        CHECK_INT(gs_supervise("job_prolog", NULL, 0, NULL, NULL), 1);
        CHECK(strstr(errors, worker_dies ? "killed by signal 9" : "timed out") != NULL);
        CHECK(gs_wait_other(delegate_to_name, gs_now() + 10.0) == 0);
        CHECK(gone(delegate_to_name));
        (void)kill(delegate_to_name, SIGKILL); /* whatever the checks said */
    }
    worker_dies = 0;
    delegate_to_name = 0;
    rmdir(dir);
}

/* A pid the page names is killed only while it is the process the worker named: one that
 * ended and whose pid came back to another process (another start time) is left alone. */
static void test_a_pid_used_again_is_never_killed(void)
{
    static struct gs_delegate page;
    pid_t other = not_our_child();

    CHECK(other > 0);
    gs_delegate = &page;
    page.pid = other;
    snprintf(page.start, sizeof(page.start), "1");
    CHECK_INT(gs_kill_delegate(gs_now() + 1.0), 0);
    CHECK(!gone(other));
    CHECK(gs_proc_start(other, page.start, sizeof(page.start)) == 0);
    CHECK_INT(gs_kill_delegate(gs_now() + 10.0), 0);
    CHECK(gone(other));
    (void)kill(other, SIGKILL); /* whatever the checks said */
    gs_delegate = NULL;
}

int main(void)
{
    sigset_t chld;

    (void)signal(SIGCHLD, SIG_DFL);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL); /* as the supervisor has it */
    test_a_killable_worker_is_reaped();
    test_an_unkillable_worker_is_waited_for_with_a_bound();
    test_a_stuck_worker_is_a_fault_and_leaves_the_jobs_lock_free();
    test_the_workers_child_in_the_prefork_server_goes_with_it();
    test_a_pid_used_again_is_never_killed();
    return gs_check_done("test_deadline");
}
