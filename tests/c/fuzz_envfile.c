/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The tasks' environment file's parser (spank/gs_envfile.c) on any text: every variable
 * it sets has a valid name. links: gs_envfile.c */
#include "gs_fuzz.h"
#include "gs_parse.h"

static int check_set(void *ctx, const char *name, const char *value)
{
    (void)ctx;
    if (!gs_valid_env_name(name, strlen(name)) || !value || strchr(value, '\n'))
        abort();
    return name[0] == 'F' ? -1 : 0; /* and sometimes fail, as spank_setenv may */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *show, *error;
    char *text = gs_fuzz_text(data, size);
    int rc = gs_env_file_apply(text, check_set, NULL, &show, &error);

    if ((rc == 0 && error) || (rc < 0 && !error))
        abort();
    free(text);
    return 0;
}
