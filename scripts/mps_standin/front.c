/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Stand-in for nvidia-cuda-mps-control on machines without a GPU (tests and demo only,
 * never shipped). One native program, as NVIDIA's, built from this file and the daemon's
 * (daemon.c and the files daemon.h names):
 *
 *   (no arguments)  client mode: one control command per stdin line, each sent to the
 *                   daemon over $CUDA_MPS_PIPE_DIRECTORY/control (a SOCK_SEQPACKET socket,
 *                   as the real one), replies "<rc>\n<output>"
 *   --server        a server the daemon starts: a process that waits for SIGTERM, as
 *                   nvidia-cuda-mps-server holds no state a test reads
 *   -d, -f, -v      the control daemon, daemonised or in the foreground, and the version
 *                   (daemon.c)
 *
 * The daemon honours CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) and
 * CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps); writes nvidia-cuda-mps-control.pid,
 * control_lock and a "log" FIFO in the pipe directory and control.log in the log directory.
 * For tests it keeps <log dir>/standin-state.json (pid, uid, environment, defaults,
 * servers, commands received, start/stop times) and fails on demand.
 *
 * Faults are read from GPUSHARE_STANDIN_FAULT (comma separated) and from a file "faults"
 * next to this program (whitespace separated; root writes it, so a test can set a fault on
 * a daemon started with a clean environment; a running daemon reads it again on each quit
 * and SIGTERM):
 *
 *   die_start        -d prints an error and exits 1
 *   hang_start       -d never returns and starts nothing
 *   slow_start       -d takes 1.5 s before it starts the daemon
 *   die_after_start  -d returns 0 but the daemon exits at once
 *   ignore_quit      the daemon answers quit but keeps running
 *   ignore_term      the daemon ignores quit and SIGTERM (SIGKILL still works)
 *   hang_client      client mode never returns
 *   no_pid_file      the daemon writes no nvidia-cuda-mps-control.pid
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "standin.h"

#define NOT_RUNNING "Cannot find MPS control daemon process"
#define REPLY_MAX 65536
#define FAULTS_FILE_MAX 65536

char standin_self[PATH_MAX];
char standin_dir[PATH_MAX];

size_t space_at(const char *p, const char *end)
{
    const unsigned char *s = (const unsigned char *)p;
    size_t left = (size_t)(end - p);

    if (left == 0)
        return 0;
    if (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r') || (s[0] >= 0x1c && s[0] <= 0x1f))
        return 1;
    if (s[0] == 0xc2 && left >= 2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2; /* U+0085, U+00A0 */
    if (left < 3)
        return 0;
    if (s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80)
        return 3; /* U+1680 */
    if (s[0] == 0xe2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3; /* U+2000..U+200A, U+2028, U+2029, U+202F */
    if (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f)
        return 3; /* U+205F */
    if (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80)
        return 3; /* U+3000 */
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Split text[0..len) in place into NUL-terminated words, appended to names. */
static void split_words(char *text, size_t len, int commas, char **names, size_t *count)
{
    char *end = text + len, *p = text;

    while (p < end) {
        size_t gap = commas ? (*p == ',') : space_at(p, end);
        char *word = p;

        if (gap) {
            memset(p, '\0', gap);
            p += gap;
            continue;
        }
        while (p < end && !(commas ? (*p == ',') : space_at(p, end)))
            p++;
        names[(*count)++] = word;
        /* the separator after the word (or the NUL after the text) ends it */
    }
}

int faults_read(struct faults *faults)
{
    const char *env = getenv("GPUSHARE_STANDIN_FAULT");
    size_t env_len = env ? strlen(env) : 0, file_len = 0, count = 0, kept = 0;
    char path[PATH_MAX + 16], *text, **names;
    int fd;

    memset(faults, 0, sizeof(*faults));
    /* the environment's names, a NUL, the file's names, a NUL */
    text = malloc(env_len + 1 + FAULTS_FILE_MAX + 1);
    if (!text)
        return -1;
    if (env_len)
        memcpy(text, env, env_len);
    text[env_len] = '\0';
    snprintf(path, sizeof(path), "%s/faults", standin_dir);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char *into = text + env_len + 1;

        while (file_len < FAULTS_FILE_MAX) {
            ssize_t got = read(fd, into + file_len, FAULTS_FILE_MAX - file_len);

            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                break;
            file_len += (size_t)got;
        }
        close(fd);
    }
    text[env_len + 1 + file_len] = '\0';
    /* at most one name per two bytes (a name and its separator), plus one per part */
    names = malloc(((env_len + file_len) / 2 + 2) * sizeof(*names));
    if (!names) {
        free(text);
        return -1;
    }
    split_words(text, env_len, 1, names, &count);
    split_words(text + env_len + 1, file_len, 0, names, &count);
    qsort(names, count, sizeof(*names), compare_names);
    for (size_t i = 0; i < count; i++)
        if (kept == 0 || strcmp(names[kept - 1], names[i]) != 0)
            names[kept++] = names[i];
    faults->text = text;
    faults->names = names;
    faults->count = kept;
    return 0;
}

int faults_has(const struct faults *faults, const char *name)
{
    for (size_t i = 0; i < faults->count; i++)
        if (strcmp(faults->names[i], name) == 0)
            return 1;
    return 0;
}

void faults_free(struct faults *faults)
{
    free(faults->names);
    free(faults->text);
    memset(faults, 0, sizeof(*faults));
}

int fault_active(const char *name)
{
    struct faults faults;
    int active;

    if (faults_read(&faults) < 0)
        return 0;
    active = faults_has(&faults, name);
    faults_free(&faults);
    return active;
}

/* Send one command; its exit status, -1 when the daemon cannot be reached, -2 when it
 * gave no answer. */
static int send_command(const char *control, const char *line)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval limit = {.tv_sec = 30};
    static char reply[REPLY_MAX + 1];
    ssize_t got;
    char *newline;
    int fd, rc;

    if (strlen(control) >= sizeof(addr.sun_path))
        return -1;
    strcpy(addr.sun_path, control);
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        close(fd);
        return -1;
    }
    if (send(fd, line, strlen(line), MSG_NOSIGNAL) < 0) {
        close(fd);
        return 1;
    }
    do
        got = recv(fd, reply, REPLY_MAX, 0);
    while (got < 0 && errno == EINTR);
    close(fd);
    if (got <= 0)
        return -2;
    reply[got] = '\0';
    rc = atoi(reply);
    newline = strchr(reply, '\n');
    if (newline && newline[1])
        printf("%s\n", newline + 1);
    return rc;
}

static int client(void)
{
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char control[PATH_MAX], *line = NULL;
    size_t size = 0;
    int status = 0;

    if (fault_active("hang_client"))
        for (;;)
            pause();
    snprintf(control, sizeof(control), "%s/control",
             pipe_dir && *pipe_dir ? pipe_dir : "/tmp/nvidia-mps");
    while (getline(&line, &size, stdin) >= 0) {
        char *start = line, *end;
        int rc;

        while (*start == ' ' || *start == '\t')
            start++;
        end = start + strlen(start);
        while (end > start && strchr(" \t\r\n", end[-1]))
            *--end = '\0';
        if (!*start)
            continue;
        rc = send_command(control, start);
        if (rc < 0) {
            if (rc == -1)
                printf("%s\n", NOT_RUNNING);
            status = 1;
            break;
        }
        if (!status)
            status = rc;
    }
    free(line);
    return status;
}

static void server_stop(int sig)
{
    (void)sig;
    _exit(0);
}

/* A server: nothing to do but exist until the daemon stops it. */
static __attribute__((noreturn)) void server(void)
{
    signal(SIGTERM, server_stop);
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    char *slash;

    if (!realpath("/proc/self/exe", standin_self)) {
        perror(STANDIN_NAME ": /proc/self/exe");
        return 1;
    }
    memcpy(standin_dir, standin_self, sizeof(standin_dir));
    slash = strrchr(standin_dir, '/');
    if (slash)
        *slash = '\0';
    if (argc == 1)
        return client();
    if (argc == 2 && strcmp(argv[1], "--server") == 0)
        server();
    return daemon_main(argc, argv);
}
