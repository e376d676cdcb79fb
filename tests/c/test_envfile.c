/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The tasks' environment file's parser (spank/gs_envfile.c) on what
 * JobRecord.to_env_file writes (tests/c/corpus/envfile, argv[1]) and on broken files.
 * links: gs_envfile.c */
#include <stdlib.h>

#include "gs_check.h"
#include "gs_parse.h"

static const char *corpus;

/* What set() was given: "NAME=VALUE\n" each, in order. */
struct seen {
    char text[8192];
    int calls, fail_on;
};

static int record_set(void *ctx, const char *name, const char *value)
{
    struct seen *seen = ctx;
    size_t used = strlen(seen->text);

    if (++seen->calls == seen->fail_on)
        return -1;
    snprintf(seen->text + used, sizeof(seen->text) - used, "%s=%s\n", name, value);
    return 0;
}

static int apply(char *text, struct seen *seen, const char **show, const char **error)
{
    memset(seen->text, 0, sizeof(seen->text));
    seen->calls = 0;
    return gs_env_file_apply(text, record_set, seen, show, error);
}

static void test_rendered_files(void)
{
    struct seen seen = {.fail_on = 0};
    const char *show, *error;
    char *text = gs_slurp(corpus, "rendered-shared");
    char *expect = gs_slurp(corpus, "rendered-shared-no-show");

    CHECK_INT(apply(text, &seen, &show, &error), 0);
    CHECK_STR(seen.text, expect); /* every variable, in the file's order */
    CHECK(show && strncmp(show, "gpushare: job 4711: CUDA_VISIBLE_DEVICES=0, 25%", 47) == 0);
    CHECK(error == NULL);
    free(text);
    free(expect);

    text = gs_slurp(corpus, "rendered-error");
    CHECK_INT(apply(text, &seen, &show, &error), -1);
    CHECK_STR(error, "--gpu-share=150: a share is a whole percent from 1 to 100");
    CHECK_INT(seen.calls, 0);
    free(text);
}

static void test_broken_files(void)
{
    struct seen seen = {.fail_on = 0};
    const char *show, *error;
    char no_newline[] = "A=1\nB=2";
    char missing_equals[] = "A\nB=2\n";
    char bad_names[] = "lower=1\n1A=2\nA-B=3\nA B=4\n=5\n_OK=6\nA1=7\n";
    char repeated[] = "A=1\nA=2\n#show=one\n#show=two\n";
    char error_after[] = "A=1\n#error=refused here\nB=2\n";
    char value_with_equals[] = "A=b=c\nB=\n";
    char crlf[] = "A=1\r\nB=2\r\n";
    char empty[] = "";

    CHECK_INT(apply(no_newline, &seen, &show, &error), 0);
    CHECK_STR(seen.text, "A=1\nB=2\n");
    CHECK_INT(apply(missing_equals, &seen, &show, &error), 0);
    CHECK_STR(seen.text, "B=2\n");
    CHECK_INT(apply(bad_names, &seen, &show, &error), 0);
    CHECK_STR(seen.text, "_OK=6\nA1=7\n");
    CHECK_INT(apply(repeated, &seen, &show, &error), 0);
    CHECK_STR(seen.text, "A=1\nA=2\n");
    CHECK_STR(show, "two");
    /* an #error stops the file there: what came before it is set already */
    CHECK_INT(apply(error_after, &seen, &show, &error), -1);
    CHECK_STR(error, "refused here");
    CHECK_STR(seen.text, "A=1\n");
    CHECK_INT(apply(value_with_equals, &seen, &show, &error), 0);
    CHECK_STR(seen.text, "A=b=c\nB=\n");
    CHECK_INT(apply(crlf, &seen, &show, &error), 0);
    CHECK_STR(seen.text, "A=1\r\nB=2\r\n"); /* the value keeps its \r: the file never has one */
    CHECK_INT(apply(empty, &seen, &show, &error), 0);
    CHECK_INT(seen.calls, 0);
    CHECK(show == NULL && error == NULL);
}

static void test_a_failed_set_names_its_variable(void)
{
    struct seen seen = {.fail_on = 2};
    const char *show, *error;
    char text[] = "A=1\nB=2\nC=3\n";

    CHECK_INT(apply(text, &seen, &show, &error), -2);
    CHECK_STR(error, "B");
}

static void test_names(void)
{
    char long_name[130];

    CHECK(gs_valid_env_name("CUDA_VISIBLE_DEVICES", 20));
    CHECK(gs_valid_env_name("_", 1));
    CHECK(gs_valid_env_name("A1", 2));
    CHECK(!gs_valid_env_name("", 0));
    CHECK(!gs_valid_env_name("1A", 2));
    CHECK(!gs_valid_env_name("a", 1));
    CHECK(!gs_valid_env_name("A-B", 3));
    CHECK(gs_valid_env_name("AB", 1)); /* only len bytes count */
    memset(long_name, 'N', sizeof(long_name));
    CHECK(gs_valid_env_name(long_name, 128));
    CHECK(!gs_valid_env_name(long_name, 129));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s tests/c/corpus/envfile\n", argv[0]);
        return 2;
    }
    corpus = argv[1];
    test_rendered_files();
    test_broken_files();
    test_a_failed_set_names_its_variable();
    test_names();
    return gs_check_done("test_envfile");
}
