/* SPDX-License-Identifier: GPL-2.0-or-later */
/* --gpu-share's value (spank/gs_parse.c gs_parse_percent) on any text. links: gs_parse.c */
#include "gs_fuzz.h"
#include "gs_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = gs_fuzz_text(data, size);
    int percent = gs_parse_percent(text);

    if (percent != -1 && (percent < 1 || percent > 100))
        abort();
    free(text);
    return 0;
}
