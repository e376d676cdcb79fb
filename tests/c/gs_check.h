/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The C unit tests' harness: CHECK(cond) and CHECK_STR(got, want) report the file, line and
 * values of a failed check and count it; gs_check_done() is main's return value (1 when
 * any check failed). A test file is one main() calling its test functions: no framework,
 * so the tests build wherever the plugin builds.
 */
#ifndef GS_CHECK_H
#define GS_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gs_checks_run = 0;
static int gs_checks_failed = 0;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        gs_checks_run++;                                                                   \
        if (!(cond)) {                                                                     \
            gs_checks_failed++;                                                            \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);       \
        }                                                                                  \
    } while (0)

#define CHECK_INT(got, want)                                                               \
    do {                                                                                   \
        long long gs_got_ = (long long)(got), gs_want_ = (long long)(want);                \
        gs_checks_run++;                                                                   \
        if (gs_got_ != gs_want_) {                                                         \
            gs_checks_failed++;                                                            \
            fprintf(stderr, "%s:%d: %s is %lld, want %lld\n", __FILE__, __LINE__, #got,    \
                    gs_got_, gs_want_);                                                    \
        }                                                                                  \
    } while (0)

#define CHECK_STR(got, want)                                                               \
    do {                                                                                   \
        const char *gs_got_ = (got), *gs_want_ = (want);                                   \
        gs_checks_run++;                                                                   \
        if (!gs_got_ || !gs_want_ ? gs_got_ != gs_want_ : strcmp(gs_got_, gs_want_) != 0) { \
            gs_checks_failed++;                                                            \
            fprintf(stderr, "%s:%d: %s is \"%s\", want \"%s\"\n", __FILE__, __LINE__, #got, \
                    gs_got_ ? gs_got_ : "(null)", gs_want_ ? gs_want_ : "(null)");         \
        }                                                                                  \
    } while (0)

/* The file dir/name's text, NUL-terminated (free() it): a test's input from the committed
 * corpus, which argv[1] names. Exits when it cannot be read: a test without its input must
 * not pass. */
__attribute__((unused)) static char *gs_slurp(const char *dir, const char *name)
{
    char path[4096];
    FILE *file;
    char *text;
    long size;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (!(file = fopen(path, "rb")) || fseek(file, 0, SEEK_END) != 0 || (size = ftell(file)) < 0 ||
        fseek(file, 0, SEEK_SET) != 0 || !(text = malloc((size_t)size + 1)) ||
        fread(text, 1, (size_t)size, file) != (size_t)size) {
        perror(path);
        exit(2);
    }
    fclose(file);
    text[size] = '\0';
    return text;
}

/* main's exit status: 0 when every check held; prints the count either way. */
static int gs_check_done(const char *name)
{
    fprintf(stderr, "%s: %d checks, %d failed\n", name, gs_checks_run, gs_checks_failed);
    return gs_checks_failed ? 1 : (gs_checks_run ? 0 : 2);
}

#endif
