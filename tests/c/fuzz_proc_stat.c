/* SPDX-License-Identifier: GPL-2.0-or-later */
/* /proc/<pid>/stat's text (spank/gs_parse.c gs_parse_proc_start, gs_parse_proc_parent) on
 * any text, into a buffer of the size the C glue gives it and into a small one.
 * links: gs_parse.c */
#include "gs_fuzz.h"
#include "gs_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = gs_fuzz_text(data, size), *again = gs_fuzz_text(data, size);
    char started[32], small[3];
    long ppid = -1, pgrp = -1;

    if (gs_parse_proc_parent(text, &ppid, &pgrp) == 0 && (ppid < 0 || pgrp < 0))
        abort();

    if (gs_parse_proc_start(text, started, sizeof(started)) == 0 &&
        (strlen(started) >= sizeof(started) || strchr(started, ' ')))
        abort();
    if (gs_parse_proc_start(again, small, sizeof(small)) == 0 && strlen(small) >= sizeof(small))
        abort();
    free(text);
    free(again);
    return 0;
}
