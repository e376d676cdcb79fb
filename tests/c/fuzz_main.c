/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * A driver for the fuzz harnesses where clang's libFuzzer is missing (built with gcc and
 * -fsanitize=address,undefined): it takes libFuzzer's command line (-runs=N, -seed=S,
 * -max_len=N, then corpus directories; other -flags are ignored), runs every corpus file,
 * then N inputs made by mutating them. Given files instead, it runs each once, as libFuzzer
 * does. Each input is a malloc'd block of its exact size, so
 * a read past its end is an ASan report. Deterministic for a seed: a failure reruns the same.
 */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct input {
    uint8_t *data;
    size_t size;
};

static struct input *inputs;
static size_t n_inputs, cap_inputs;
static uint64_t state = 88172645463325252ULL;

static uint64_t next_random(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static size_t below(size_t n)
{
    return n ? (size_t)(next_random() % n) : 0;
}

static void add_input(uint8_t *data, size_t size)
{
    if (n_inputs == cap_inputs) {
        cap_inputs = cap_inputs ? cap_inputs * 2 : 64;
        inputs = realloc(inputs, cap_inputs * sizeof(*inputs));
        if (!inputs) {
            perror("fuzz: realloc");
            exit(2);
        }
    }
    inputs[n_inputs].data = data;
    inputs[n_inputs++].size = size;
}

/* The whole file at path, added to the inputs (those past max_len are cut when mutated). */
static void load_file(const char *path)
{
    FILE *file = fopen(path, "rb");
    struct stat st;
    uint8_t *data;
    size_t size;

    if (!file || fstat(fileno(file), &st) != 0) {
        perror(path);
        exit(2);
    }
    data = malloc((size_t)st.st_size + 1);
    size = data ? fread(data, 1, (size_t)st.st_size, file) : 0;
    fclose(file);
    if (!data) {
        perror("fuzz: malloc");
        exit(2);
    }
    add_input(data, size);
}

static void free_inputs(void)
{
    for (size_t i = 0; i < n_inputs; i++)
        free(inputs[i].data);
    free(inputs);
}

static void load_dir(const char *dir)
{
    char path[4096];
    struct dirent *entry;
    struct stat st;
    DIR *stream = opendir(dir);

    if (!stream) {
        perror(dir);
        exit(2);
    }
    while ((entry = readdir(stream))) {
        snprintf(path, sizeof(path), "%s/%s", dir, entry->d_name);
        if (entry->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode))
            load_file(path);
    }
    closedir(stream);
}

static void run_one(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);

    if (!copy) {
        perror("fuzz: malloc");
        exit(2);
    }
    if (size)
        memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
}

/* Bytes that end or split a line or a field in the formats the harnesses parse. */
static const uint8_t special[] = {'\n', '=', ' ', '\0', '@', '%', '#', '-', ':', ',', 0xff, 0x80};

/* One mutation of buf (size *size, room max) in place. */
static void mutate(uint8_t *buf, size_t *size, size_t max)
{
    size_t at = below(*size + 1), len;
    const struct input *other;

    switch (below(7)) {
    case 0: /* flip a bit */
        if (*size)
            buf[below(*size)] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* overwrite with a special byte */
        if (*size)
            buf[below(*size)] = special[below(sizeof(special))];
        break;
    case 2: /* insert a special or random byte */
        if (*size < max) {
            memmove(buf + at + 1, buf + at, *size - at);
            buf[at] = below(2) ? special[below(sizeof(special))] : (uint8_t)next_random();
            (*size)++;
        }
        break;
    case 3: /* delete a range */
        len = below(*size - at + 1);
        memmove(buf + at, buf + at + len, *size - at - len);
        *size -= len;
        break;
    case 4: /* repeat a range */
        if (*size && at < *size) {
            len = below(*size - at) + 1;
            if (len > max - *size)
                len = max - *size;
            memmove(buf + at + len, buf + at, *size - at);
            (*size) += len;
        }
        break;
    case 5: /* splice in part of another input */
        other = &inputs[below(n_inputs)];
        if (other->size) {
            size_t from = below(other->size);
            len = below(other->size - from) + 1;
            if (len > max - *size)
                len = max - *size;
            memmove(buf + at + len, buf + at, *size - at);
            memcpy(buf + at, other->data + from, len);
            *size += len;
        }
        break;
    default: /* cut short */
        *size = below(*size + 1);
        break;
    }
}

int main(int argc, char **argv)
{
    long runs = 10000;
    size_t max_len = 4096, i;
    int dirs = 0;
    struct stat st;
    uint8_t *buf;

    for (int arg = 1; arg < argc; arg++) {
        if (strncmp(argv[arg], "-runs=", 6) == 0)
            runs = atol(argv[arg] + 6);
        else if (strncmp(argv[arg], "-seed=", 6) == 0)
            state ^= strtoull(argv[arg] + 6, NULL, 10) * 0x9E3779B97F4A7C15ULL;
        else if (strncmp(argv[arg], "-max_len=", 9) == 0)
            max_len = (size_t)atol(argv[arg] + 9);
        else if (argv[arg][0] == '-')
            continue;
        else if (stat(argv[arg], &st) == 0 && S_ISDIR(st.st_mode) && ++dirs)
            load_dir(argv[arg]);
        else
            load_file(argv[arg]);
    }
    for (i = 0; i < n_inputs; i++)
        run_one(inputs[i].data, inputs[i].size);
    if (!dirs) {
        printf("fuzz: %zu inputs, no report\n", n_inputs);
        free_inputs();
        return 0;
    }
    if (!n_inputs) {
        uint8_t *empty = calloc(1, 1);
        if (!empty) {
            perror("fuzz: calloc");
            return 2;
        }
        add_input(empty, 0);
    }
    if (!max_len || !(buf = malloc(max_len))) {
        fprintf(stderr, "fuzz: -max_len must be above 0\n");
        return 2;
    }
    for (long run = 0; run < runs; run++) {
        const struct input *seed = &inputs[below(n_inputs)];
        size_t size = seed->size < max_len ? seed->size : max_len;
        memcpy(buf, seed->data, size);
        for (size_t n = below(4) + 1; n > 0; n--)
            mutate(buf, &size, max_len);
        run_one(buf, size);
    }
    free(buf);
    printf("fuzz: %zu corpus inputs and %ld mutated runs, no report\n", n_inputs, runs);
    free_inputs();
    return 0;
}
