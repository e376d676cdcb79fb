/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The join ticket's parser (spank/gs_ticket.c) on any text, then, for a ticket that holds
 * on the node of gs_facts.h, what the C glue does next: fill the marks of its record and
 * environment and apply that environment. links: gs_ticket.c gs_parse.c gs_envfile.c */
#include "gs_facts.h"
#include "gs_fuzz.h"
#include "gs_parse.h"

static int ignore_set(void *ctx, const char *name, const char *value)
{
    (void)ctx;
    return name[0] && value ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gs_ticket_facts facts = gs_test_facts();
    struct gs_mark marks[] = {{GS_JOB_ID_MARK, "4294967294"},
                              {GS_CREATED_MARK, "1700000100.123456"}};
    struct gs_ticket t;
    const char *why = NULL, *show, *error;
    char *text = gs_fuzz_text(data, size);

    if (gs_ticket_holds(&facts, text, &t, &why) == 0) {
        char *record = gs_fill(t.record, marks, 2), *env = gs_fill(t.env, marks, 2);
        if (!record || !env || strlen(t.key) >= GS_KEY_MAX || t.share < 1 || t.share > 100)
            abort();
        gs_env_file_apply(env, ignore_set, NULL, &show, &error);
        free(record);
        free(env);
    } else if (!why) {
        abort(); /* a refusal always says why */
    }
    free(text);
    return 0;
}
