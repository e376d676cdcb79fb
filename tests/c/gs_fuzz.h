/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What every fuzz harness shares: the input as the C glue holds a file it read, a
 * NUL-terminated heap copy of exactly its size (+1), so that a read past it is an ASan
 * report. The C glue reads files with read() and ends them with a NUL the same way: a NUL
 * inside a file ends its text there too.
 */
#ifndef GS_FUZZ_H
#define GS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((unused)) static char *gs_fuzz_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);

    if (!text)
        abort();
    memcpy(text, data, size);
    text[size] = '\0';
    return text;
}

#endif
