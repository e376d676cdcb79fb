/* SPDX-License-Identifier: GPL-2.0-or-later */
/* SLURM_JOB_GPUS (spank/gs_parse.c gs_parse_gpu_list) on any text: never more indices than
 * the room given, each 0..99999. CUDA_VISIBLE_DEVICES (gs_uuid_list): 0 or 1, and never for
 * a list of indices. links: gs_parse.c */
#include "gs_fuzz.h"
#include "gs_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = gs_fuzz_text(data, size);
    long *indices = malloc(4 * sizeof(long));
    int count;

    if (!indices)
        abort();
    count = gs_parse_gpu_list(text, indices, 4);
    if (count > 4 || count == 0 || count < -1)
        abort();
    for (int i = 0; i < count; i++)
        if (indices[i] < 0 || indices[i] > 99999)
            abort();
    switch (gs_uuid_list(text)) {
    case 1:
        if (count != -1)
            abort();
        break;
    case 0:
        break;
    default:
        abort();
    }
    free(indices);
    free(text);
    return 0;
}
