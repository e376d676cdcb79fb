/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The C side of the filesystem parity tests (tests/unit/test_c_parity_fs.py), spoken as
 * tests/c/parity.c speaks: one request a line on stdin, "<op> <argument in hex>", where the
 * argument's fields are separated by tabs, one answer a line on stdout. An answer that
 * can fail is "<rc> <errno> <the last slurm_error, hex, or ->".
 *   state_dir <dir>\t<create>       gs_check_state_dir(create) with state_dir=dir
 *   core <path>                     gs_check_core: the core's file, then gs_check_parents
 *   write <dir>\t<name>\t<mode, octal>\t<no_replace>\t<text>
 *                                   gs_write_mode_at below dir
 *   timeout <seconds>               timeout= for what follows
 *   lock <mps dir>\t<key>           gs_lock_daemon: the lock's descriptor (held), or -1
 *   unlock <descriptor>             the lock given back
 *   drop <mps dir>\t<key>\t<job>    gs_daemon_of_job, then under gs_lock_daemon
 *                                   gs_drop_reference: "<key or -> <share> <why>"
 * spank/gs_safefs.c, gs_fastpath.c and gs_core.c are included for their static functions
 * and state; what else they call of the plugin and of Slurm is stubbed here.
 * links: gs_parse.c gs_ticket.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../spank/gs_core.c"
#include "../../spank/gs_fastpath.c"
#include "../../spank/gs_safefs.c"
#include "gs_parity.h"

char gs_state_dir[PATH_MAX] = GS_DEFAULT_STATE_DIR;
char gs_debug_log[PATH_MAX] = "";
char gs_pythonpath[PATH_MAX] = "";
char gs_imex_dir[PATH_MAX] = "";
double gs_timeout = GS_DEFAULT_TIMEOUT;

static char last_error[4096];

void slurm_error(const char *fmt, ...)
{
    va_list args;

    va_start(args, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, args);
    va_end(args);
}

void slurm_info(const char *fmt, ...)
{
    (void)fmt;
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
    (void)sp;
    (void)item;
    return ESPANK_ERROR;
}

spank_context_t spank_context(void)
{
    return S_CTX_JOB_SCRIPT;
}

void gs_debug(spank_t sp, const char *fmt, ...)
{
    (void)sp;
    (void)fmt;
}

void gs_log(int level, const char *msg)
{
    (void)level;
    (void)msg;
}

void gs_count_fast(const char *callback, double seconds)
{
    (void)callback;
    (void)seconds;
}

const char *gs_getopt(void *sp, const char *name)
{
    (void)sp;
    (void)name;
    return NULL;
}

int gs_job_file(spank_t sp, const char *suffix, char *path, size_t size)
{
    (void)sp;
    (void)suffix;
    (void)path;
    (void)size;
    return -1;
}

int gs_drain_node(const char *why)
{
    (void)why;
    return -1;
}

const char *gs_requeue_job(uint32_t job_id)
{
    (void)job_id;
    return NULL;
}

void gs_fail_tasks(spank_t sp, const char *text)
{
    (void)sp;
    (void)text;
}

const char *gs_node_name(void)
{
    return NULL;
}

/* No prefork server here: every callback runs in place. */
int gs_prefork_call(const char *callback, spank_t sp, int ac, char **av, const char *code,
                    int *rc)
{
    (void)callback;
    (void)sp;
    (void)ac;
    (void)av;
    (void)code;
    (void)rc;
    return -1;
}

/* The next tab-separated field of *at ("" when none is left). */
static char *field(char **at)
{
    char *start = *at, *tab = strchr(start, '\t');

    if (tab) {
        *tab = '\0';
        *at = tab + 1;
    } else {
        *at = start + strlen(start);
    }
    return start;
}

/* "<rc> <errno> <last slurm_error in hex, or ->" */
static void verdict(int rc, int err)
{
    printf("%d %d ", rc, rc < 0 ? err : 0);
    if (!last_error[0])
        fputs("-", stdout);
    for (const char *c = last_error; *c; c++)
        printf("%02x", (unsigned char)*c);
}

static int open_dir(const char *path)
{
    return open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static void drop(char *at)
{
    char *dir = field(&at), *key_in = field(&at), *job = field(&at), key[GS_KEY_MAX] = "";
    const char *why = "lock";
    int store_fd = open_dir(dir), lock_fd, share = 0;

    if (store_fd < 0 || gs_daemon_of_job(store_fd, job, key) < 0) {
        printf("- 0 no-single-daemon");
    } else if (strcmp(key, key_in) != 0) {
        printf("%s 0 other-daemon", key);
    } else {
        if ((lock_fd = gs_lock_daemon(store_fd, key)) >= 0) {
            share = gs_drop_reference(store_fd, key, job, &why);
            close(lock_fd);
        }
        printf("%s %d %s", key, share, share ? "dropped" : why);
    }
    if (store_fd >= 0)
        close(store_fd);
}

int main(void)
{
    static char line[1 << 20];

    while (fgets(line, sizeof(line), stdin)) {
        char *space = strchr(line, ' '), *arg, *at;
        int rc, fd;

        line[strcspn(line, "\n")] = '\0';
        if (!space) {
            puts("?");
            fflush(stdout);
            continue;
        }
        *space = '\0';
        at = arg = gs_unhex(space + 1);
        last_error[0] = '\0';
        errno = 0;
        if (strcmp(line, "state_dir") == 0) {
            snprintf(gs_state_dir, sizeof(gs_state_dir), "%s", field(&at));
            gs_state_checked = 0; /* each request is a fresh process's first check */
            rc = gs_check_state_dir(atoi(field(&at)));
            verdict(rc, errno);
        } else if (strcmp(line, "core") == 0) {
            rc = gs_check_core(arg);
            verdict(rc, errno);
        } else if (strcmp(line, "write") == 0) {
            char *dir = field(&at), *name = field(&at), *mode = field(&at);
            int no_replace = atoi(field(&at));
            if ((fd = open_dir(dir)) < 0) {
                verdict(-1, errno);
            } else {
                rc = gs_write_mode_at(fd, name, at, no_replace, (mode_t)strtol(mode, NULL, 8));
                verdict(rc, errno);
                close(fd);
            }
        } else if (strcmp(line, "timeout") == 0) {
            gs_timeout = atof(arg);
        } else if (strcmp(line, "lock") == 0) {
            char *dir = field(&at);
            if ((fd = open_dir(dir)) < 0) {
                printf("-1");
            } else {
                printf("%d", gs_lock_daemon(fd, at));
                close(fd);
            }
        } else if (strcmp(line, "unlock") == 0) {
            printf("%d", close(atoi(arg)));
        } else if (strcmp(line, "drop") == 0) {
            drop(arg);
        } else {
            fputs("?", stdout);
        }
        putchar('\n');
        fflush(stdout);
        free(arg);
    }
    return 0;
}
