/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The join ticket's parser (spank/gs_ticket.c) on the tickets the Python core renders
 * (tests/c/corpus/ticket, argv[1]): one holds on the node that gs_facts.h describes, and
 * each change to one of its conditions breaks it for that condition's reason.
 * links: gs_ticket.c gs_parse.c */
#include <stdlib.h>

#include "gs_check.h"
#include "gs_facts.h"
#include "gs_parse.h"

static const char *corpus;

/* gs_ticket_holds on the rendered ticket `name` with `from` replaced by `to` (the first
 * time it occurs; to NULL: unchanged): its result, *why, and the ticket in *t. */
static int holds_changed(const char *name, const char *from, const char *to,
                         const struct gs_ticket_facts *facts, struct gs_ticket *t,
                         const char **why, char **text)
{
    char *original = gs_slurp(corpus, name), *at;

    *text = original;
    if (to && (at = strstr(original, from))) {
        size_t head = (size_t)(at - original);
        *text = malloc(strlen(original) + strlen(to) + 1);
        memcpy(*text, original, head);
        strcpy(*text + head, to);
        strcat(*text, at + strlen(from));
        free(original);
    } else if (to) {
        fprintf(stderr, "%s holds no \"%s\"\n", name, from);
        CHECK(0);
    }
    return gs_ticket_holds(facts, *text, t, why);
}

static void check_refused(const char *from, const char *to, const char *want_why)
{
    struct gs_ticket_facts facts = gs_test_facts();
    struct gs_ticket t;
    const char *why = NULL;
    char *text;

    CHECK_INT(holds_changed("rendered-join", from, to, &facts, &t, &why, &text), -1);
    if (strcmp(why ? why : "", want_why) != 0)
        fprintf(stderr, "  changing \"%s\" to \"%s\"\n", from, to);
    CHECK_STR(why, want_why);
    free(text);
}

static void test_rendered_tickets_hold(void)
{
    const char *names[] = {"rendered-join", "rendered-join-no-show", "rendered-join-no-files"};
    struct gs_ticket_facts facts = gs_test_facts();

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        struct gs_ticket t;
        const char *why = NULL;
        char *text;
        CHECK_INT(holds_changed(names[i], "", NULL, &facts, &t, &why, &text), 0);
        CHECK_STR(t.key, "u1001-GPU-3a2b-0000-1111-2222-333344440003");
        CHECK_STR(t.record_stamp, "25 1201 811 1700000001000000000");
        CHECK_INT(t.share, 25);
        CHECK(t.record && strstr(t.record, "\"job_id\": @GPUSHARE_JOB_ID@") != NULL);
        CHECK(t.env && strncmp(t.env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\n", 37) == 0);
        CHECK(t.record && strstr(t.record, "--env") == NULL);
        free(text);
    }
}

static void test_each_condition_refuses_for_its_reason(void)
{
    check_refused("gpushare-ticket 1", "gpushare-ticket 2", "format");
    check_refused("until 1700000060.250000", "until 1699999999.5", "expired");
    check_refused("until 1700000060.250000", "until 1700000000", "expired"); /* not before */
    check_refused("until 1700000060.250000", "until soon", "expired");
    check_refused("until 1700000060.250000", "until nan", "expired");
    check_refused("uid 1001", "uid 1002", "user");
    check_refused("uid 1001", "uid 01001x", "user");
    check_refused("uid 1001", "uid 4294968297", "user"); /* 1001 + 2^32 */
    check_refused("gid 1001", "gid 0", "user");
    check_refused("share 25", "share 0", "format");
    check_refused("share 25", "share 101", "format");
    check_refused("arg show=yes", "arg show=no", "plugstack");
    check_refused("arg show=yes\n", "", "plugstack");                       /* one fewer */
    check_refused("arg show=yes\n", "arg show=yes\narg plan=/x\n", "plugstack"); /* one more */
    check_refused("env SLURM_JOB_GPUS=3", "env SLURM_JOB_GPUS=4", "environment");
    check_refused("env SLURM_JOB_GPUS=3", "env SLURM_JOB_GPUS", "environment");
    check_refused("opt gpu-share=25", "opt gpu-share=50", "options");
    check_refused("opt gpu-share=25", "noopt gpu-share", "options");
    check_refused("noopt gpu-mps", "opt gpu-mps=", "options");
    check_refused("file 2049 131075 412 ", "file 2049 131075 413 ", "files");
    check_refused("file 2049 131075 412 1699999000123456789 /etc/slurm/gres.conf",
                  "file 2049 131075 412 1699999000123456789 etc/slurm/gres.conf", "files");
    check_refused("nofile /etc/gpushare/plan.yaml", "nofile /etc/slurm/gres.conf", "files");
    check_refused("nofile /etc/gpushare/plan.yaml", "nofile etc/x", "files");
    check_refused("daemon 4242 987654", "daemon 4242 987655", "daemon");
    check_refused("daemon 4242 987654", "daemon 4243 987654", "daemon");
    check_refused("daemon 4242 987654", "daemon 1 987654", "daemon");
    check_refused("key u1001-", "key ../u1001-", "format");
    check_refused("key u1001-", "key .u1001-", "format");
    check_refused("record 25 ", "surprise 25 ", "format"); /* a word this glue does not know */
    check_refused("\n--env\n", "\n--nv\n", "format");
    check_refused("share 25\n", "share\n", "format");       /* a word without a value */
    check_refused("share 25\n", "", "format");              /* no share */
    check_refused("key u1001-GPU-3a2b-0000-1111-2222-333344440003\n", "", "format");
    check_refused("record 25 1201 811 1700000001000000000\n", "", "format");
}

static void test_the_environment_line_holds_when_the_job_has_the_same_environment(void)
{
    /* an unset variable equals an empty one: env HOME= holds where HOME is unset */
    struct gs_ticket_facts facts = gs_test_facts();
    struct gs_ticket t;
    const char *why;
    char *text;

    CHECK_INT(holds_changed("rendered-join", "env SLURMD_NODENAME=n1\n",
                            "env SLURMD_NODENAME=n1\nenv HOME=\n", &facts, &t, &why, &text), 0);
    free(text);
}

static void test_lines(void)
{
    char text[] = "word value with spaces\n--record\nnovalue\nlast x";
    char *at = text, *word, *value;

    CHECK_INT(gs_ticket_line(&at, &word, &value), 1);
    CHECK_STR(word, "word");
    CHECK_STR(value, "value with spaces");
    CHECK_INT(gs_ticket_line(&at, &word, &value), 1);
    CHECK_STR(word, "--record");
    CHECK_STR(value, "");
    CHECK_INT(gs_ticket_line(&at, &word, &value), -1);
    CHECK_INT(gs_ticket_line(&at, &word, &value), 1);
    CHECK_STR(value, "x");
    CHECK(at == NULL);
    CHECK_INT(gs_ticket_line(&at, &word, &value), 0);
}

static void test_fill(void)
{
    struct gs_mark marks[] = {{GS_JOB_ID_MARK, "4712"}, {GS_CREATED_MARK, "1700000100.5"}};
    char *out;

    out = gs_fill("job @GPUSHARE_JOB_ID@ at @GPUSHARE_CREATED@, @GPUSHARE_JOB_ID@", marks, 2);
    CHECK_STR(out, "job 4712 at 1700000100.5, 4712");
    free(out);
    out = gs_fill("a@b @GPUSHARE_JOB_ID @@GPUSHARE_JOB_ID@@", marks, 2);
    CHECK_STR(out, "a@b @GPUSHARE_JOB_ID @4712@");
    free(out);
    out = gs_fill("", marks, 2);
    CHECK_STR(out, "");
    free(out);
    /* a value longer than its mark, at every '@' of the text */
    struct gs_mark long_mark[] = {{"@X@", "0123456789012345678901234567890123456789"}};
    out = gs_fill("@X@@X@@X@@", long_mark, 1);
    CHECK_STR(out, "0123456789012345678901234567890123456789"
                   "0123456789012345678901234567890123456789"
                   "0123456789012345678901234567890123456789@");
    free(out);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s tests/c/corpus/ticket\n", argv[0]);
        return 2;
    }
    corpus = argv[1];
    test_rendered_tickets_hold();
    test_each_condition_refuses_for_its_reason();
    test_the_environment_line_holds_when_the_job_has_the_same_environment();
    test_lines();
    test_fill();
    return gs_check_done("test_ticket");
}
