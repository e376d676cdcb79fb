/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The plugstack arguments (spank/gs_args.c): known keys, the paths C needs with %n, %h and
 * %% expanded, timeout=, the package's default pythonpath=. gs_args.c is included here, so
 * that its static helpers can be called; slurm_error, its one Slurm call, is this file's and
 * keeps the last message.
 * links: gs_parse.c */
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

#include "gs_check.h"
/* As a package's build sets it (spank/build.py --pythonpath): the test header's is "". */
#undef GS_DEFAULT_PYTHONPATH
#define GS_DEFAULT_PYTHONPATH "/usr/share/gpushare/python"
#include "../../spank/gs_args.c"

static char last_error[1024];

void slurm_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

/* gs_parse_args on a fresh process's state: 0 or -1. */
static int parse(int ac, char **av)
{
    gs_args_parsed = gs_args_ok = 0;
    last_error[0] = '\0';
    return gs_parse_args(ac, av);
}

static void test_expand(void)
{
    char out[600], host[256], want[600];

    setenv("SLURMD_NODENAME", "n7", 1);
    CHECK_INT(gs_expand_path(out, sizeof(out), "/run/gs/%n", "state_dir"), 0);
    CHECK_STR(out, "/run/gs/n7");
    CHECK_INT(gs_expand_path(out, sizeof(out), "/run/100%%/%n%n", "state_dir"), 0);
    CHECK_STR(out, "/run/100%/n7n7");
    CHECK_INT(gs_expand_path(out, sizeof(out), "/run/%x", "state_dir"), -1);
    CHECK(strstr(last_error, "only %n (node name), %h (host name) and %% may follow %"));
    CHECK_INT(gs_expand_path(out, sizeof(out), "/run/%", "state_dir"), -1);
    /* a node name that could leave the directory is refused */
    const char *bad_names[] = {"../x", ".hidden", "a/b", "a b", "n\n1"};
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
        setenv("SLURMD_NODENAME", bad_names[i], 1);
        CHECK_INT(gs_expand_path(out, sizeof(out), "/run/%n", "state_dir"), -1);
    }
    /* without SLURMD_NODENAME, %n is the short host name, as %h always is */
    unsetenv("SLURMD_NODENAME");
    CHECK_INT(gethostname(host, sizeof(host) - 1), 0);
    host[sizeof(host) - 1] = '\0';
    host[strcspn(host, ".")] = '\0';
    snprintf(want, sizeof(want), "/s/%s/%s", host, host);
    CHECK_INT(gs_expand_path(out, sizeof(out), "/s/%n/%h", "state_dir"), 0);
    CHECK_STR(out, want);
    /* never past the room given */
    CHECK_INT(gs_expand_path(out, 8, "/1234567", "state_dir"), -1);
    CHECK_INT(gs_expand_path(out, 8, "/123456", "state_dir"), 0);
    setenv("SLURMD_NODENAME", "node-with-a-long-name", 1);
    CHECK_INT(gs_expand_path(out, 16, "/r/%n", "state_dir"), -1);
    CHECK(strstr(last_error, "path too long"));
}

static void test_parse_args(void)
{
    char *good[] = {"state_dir=/run/gpushare/%n", "debug_log=none", "timeout=2.5",
                    "pythonpath=/usr/lib64/gpushare/python", "verify=strict", "show=yes"};
    char *unknown[] = {"state_dir=/run/x", "colour=blue"};
    char *no_equals[] = {"state_dir"};
    char *relative[] = {"state_dir=run/x"};
    char *none_state[] = {"state_dir=none"};
    char *bad_timeout[] = {"timeout=soon"};

    setenv("SLURMD_NODENAME", "n3", 1);
    CHECK_INT(parse(6, good), 0);
    CHECK_STR(gs_state_dir, "/run/gpushare/n3");
    CHECK_STR(gs_debug_log, "");
    CHECK_STR(gs_pythonpath, "/usr/lib64/gpushare/python");
    CHECK(gs_timeout == 2.5);
    CHECK_INT(gs_parse_args(0, NULL), 0); /* parsed once per process: the answer stays */
    CHECK_INT(parse(2, unknown), -1);
    CHECK(strstr(last_error, "unknown plugstack argument 'colour=blue'"));
    CHECK(strstr(last_error, "state_dir="));        /* the keys accepted are listed */
    CHECK_INT(gs_parse_args(2, good), -1);          /* and a refusal stays too */
    CHECK_INT(parse(1, no_equals), -1);
    CHECK_INT(parse(1, relative), -1);
    CHECK(strstr(last_error, "expected an absolute path"));
    CHECK_INT(parse(1, none_state), -1);            /* the state directory cannot be none */
    gs_timeout = 10.0;
    CHECK_INT(parse(1, bad_timeout), 0);            /* Python refuses it, in the worker */
    CHECK(gs_timeout == 10.0);
}

/* A line without pythonpath= takes the package's directory; none, or another, replaces it. */
static void test_default_pythonpath(void)
{
    char *without[] = {"state_dir=/run/x", "timeout=5"};
    char *none[] = {"pythonpath=none"};
    char *other[] = {"pythonpath=/opt/gs/python"};

    CHECK_STR(gs_pythonpath, "/usr/share/gpushare/python");
    CHECK_INT(parse(2, without), 0);
    CHECK_STR(gs_pythonpath, "/usr/share/gpushare/python");
    CHECK_INT(parse(1, other), 0);
    CHECK_STR(gs_pythonpath, "/opt/gs/python");
    CHECK_INT(parse(1, none), 0);
    CHECK_STR(gs_pythonpath, "");
}

/* prefork= is yes unless the line says no (the core's default, config.py, is the same). */
static void test_default_prefork(void)
{
    char *off[] = {"prefork=no"};
    char *on[] = {"prefork=yes"};

    CHECK_INT(gs_prefork, 1);
    CHECK_INT(parse(1, off), 0);
    CHECK_INT(gs_prefork, 0);
    CHECK_INT(parse(1, on), 0);
    CHECK_INT(gs_prefork, 1);
}

int main(void)
{
    test_default_pythonpath(); /* first: the values a fresh process starts with */
    test_default_prefork();
    test_expand();
    test_parse_args();
    return gs_check_done("test_args");
}
