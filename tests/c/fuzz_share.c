/* SPDX-License-Identifier: GPL-2.0-or-later */
/* A daemon's share file (spank/gs_parse.c gs_parse_share_text) on any text.
 * links: gs_parse.c */
#include "gs_fuzz.h"
#include "gs_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = gs_fuzz_text(data, size);
    int share = gs_parse_share_text(text);

    if (share != -1 && (share < 1 || share > 100))
        abort();
    free(text);
    return 0;
}
