/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Front end of the nvidia-cuda-mps-control stand-in (tests and demo only, never shipped).
 *
 * The real nvidia-cuda-mps-control is a small C program, and the plugin runs it in client
 * mode for every job that joins or leaves a daemon. This front end answers client mode
 * itself (no arguments: one control command per stdin line, each sent to the daemon over
 * $CUDA_MPS_PIPE_DIRECTORY/control, replies "<rc>\n<output>"), so a benchmark pays what the
 * real client costs, not a Python start. It is also the servers the daemon starts
 * (--server: a process that waits for SIGTERM, as nvidia-cuda-mps-server holds no state a
 * test reads). Every other command line (-d, -f, -v) is handed to standin.py beside it,
 * exec'd with this program as argv[0]: the daemon then shows this program's path in its
 * command line, as the real one does, which is how the plugin recognises it.
 *
 * Faults read here: hang_client (from GPUSHARE_STANDIN_FAULT or the "faults" file beside
 * this program, as standin.py reads them).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define PYTHON "/usr/bin/python3"
#define NOT_RUNNING "Cannot find MPS control daemon process"
#define REPLY_MAX 65536

static char self_dir[PATH_MAX];

static int has_word(const char *text, const char *word, const char *separators)
{
    size_t len = strlen(word);

    for (const char *p = text; (p = strstr(p, word)) != NULL; p += len) {
        int starts = p == text || strchr(separators, p[-1]);
        int ends = p[len] == '\0' || strchr(separators, p[len]);
        if (starts && ends)
            return 1;
    }
    return 0;
}

static int fault_active(const char *name)
{
    const char *env = getenv("GPUSHARE_STANDIN_FAULT");
    char path[PATH_MAX + 16], text[4096];
    FILE *file;
    size_t got;

    if (env && has_word(env, name, ","))
        return 1;
    snprintf(path, sizeof(path), "%s/faults", self_dir);
    file = fopen(path, "r");
    if (!file)
        return 0;
    got = fread(text, 1, sizeof(text) - 1, file);
    fclose(file);
    text[got] = '\0';
    return has_word(text, name, " \t\r\n");
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
    if (send(fd, line, strlen(line), 0) < 0) {
        close(fd);
        return 1;
    }
    got = recv(fd, reply, REPLY_MAX, 0);
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
    char self[PATH_MAX], script[PATH_MAX + 16];
    char **args;

    if (!realpath("/proc/self/exe", self)) {
        perror("nvidia-cuda-mps-control stand-in: /proc/self/exe");
        return 1;
    }
    snprintf(self_dir, sizeof(self_dir), "%s", self);
    *strrchr(self_dir, '/') = '\0';
    if (argc == 1)
        return client();
    if (argc == 2 && strcmp(argv[1], "--server") == 0)
        server();

    snprintf(script, sizeof(script), "%s/standin.py", self_dir);
    /* -I -S: the stand-in stands for a native program; Python's site start-up is not its */
    args = calloc((size_t)argc + 4, sizeof(*args));
    if (!args)
        return 1;
    args[0] = self;
    args[1] = "-I";
    args[2] = "-S";
    args[3] = script;
    for (int i = 1; i < argc; i++)
        args[i + 3] = argv[i];
    execv(PYTHON, args);
    fprintf(stderr, "nvidia-cuda-mps-control stand-in: cannot run %s: %s\n", PYTHON,
            strerror(errno));
    return 1;
}
