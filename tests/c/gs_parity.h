/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What the parity programs (tests/c/parity.c, tests/c/parity_fs.c) share: requests come as
 * "<op> <argument in hex>" lines, so that any byte reaches the C as the Python sent it.
 */
#ifndef GS_PARITY_H
#define GS_PARITY_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request's argument, decoded and NUL-terminated (free() it). */
static char *gs_unhex(const char *hex)
{
    size_t len = strlen(hex) / 2;
    char *out = malloc(len + 1);

    if (!out)
        abort();
    for (size_t i = 0; i < len; i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
            abort();
        out[i] = (char)byte;
    }
    out[len] = '\0';
    return out;
}

#endif
