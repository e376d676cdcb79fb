/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * The control daemon's text: growing buffers, the words of a command, JSON as Python's
 * json.dump writes it and numbers as Python's int() and float() read them (daemon.c
 * describes the daemon).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"

/* ------------------------------------------------------------------ text */

static __attribute__((noreturn)) void out_of_memory(void)
{
    static const char text[] = STANDIN_NAME ": out of memory\n";
    ssize_t ignored = write(STDERR_FILENO, text, sizeof(text) - 1);

    (void)ignored;
    _exit(1);
}

void *grow(void *data, size_t count, size_t size)
{
    size_t bytes;
    void *grown;

    if (size && count > SIZE_MAX / size)
        out_of_memory();
    bytes = count * size;
    /* malloc for a new block: gcc's analyzer takes realloc(NULL) for a free of NULL */
    grown = data ? realloc(data, bytes > 0 ? bytes : 1) : malloc(bytes > 0 ? bytes : 1);
    if (!grown)
        out_of_memory();
    return grown;
}

void buf_add(struct buf *b, const char *data, size_t len)
{
    if (len > SIZE_MAX - b->len - 1)
        out_of_memory();
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;

        while (cap < b->len + len + 1)
            cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        b->data = grow(b->data, cap, 1);
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void buf_str(struct buf *b, const char *text)
{
    buf_add(b, text, strlen(text));
}

void buf_vprintf(struct buf *b, const char *fmt, va_list args)
{
    char small[128];
    va_list again;
    int len;

    va_copy(again, args);
    len = vsnprintf(small, sizeof(small), fmt, args);
    if (len >= 0 && (size_t)len < sizeof(small)) {
        buf_add(b, small, (size_t)len);
    } else if (len >= 0) {
        char *big = grow(NULL, (size_t)len + 1, 1);

        vsnprintf(big, (size_t)len + 1, fmt, again);
        buf_add(b, big, (size_t)len);
        free(big);
    }
    va_end(again);
}

__attribute__((format(printf, 2, 3))) void buf_printf(struct buf *b, const char *fmt,
                                                              ...)
{
    va_list args;

    va_start(args, fmt);
    buf_vprintf(b, fmt, args);
    va_end(args);
}

int word_is(struct word w, const char *text)
{
    return w.n == strlen(text) && memcmp(w.p, text, w.n) == 0;
}

void buf_word(struct buf *b, struct word w)
{
    buf_add(b, w.p, w.n);
}

/* The words joined by single spaces, as ' '.join(words). */
void buf_words(struct buf *b, const struct word *words, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (i)
            buf_add(b, " ", 1);
        buf_word(b, words[i]);
    }
}

/* The code point of the valid UTF-8 sequence at p and its length (1..4) in *len; *len 0
 * when p starts none. */
static uint32_t utf8_at(const unsigned char *p, size_t left, size_t *len)
{
    uint32_t code, min;

    *len = 0;
    if (p[0] < 0x80) {
        *len = 1;
        return p[0];
    }
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        *len = 2, code = p[0] & 0x1f, min = 0x80;
    else if (p[0] >= 0xe0 && p[0] <= 0xef)
        *len = 3, code = p[0] & 0x0f, min = 0x800;
    else if (p[0] >= 0xf0 && p[0] <= 0xf4)
        *len = 4, code = p[0] & 0x07, min = 0x10000;
    else
        return 0;
    if (left < *len) {
        *len = 0;
        return 0;
    }
    for (size_t i = 1; i < *len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            *len = 0;
            return 0;
        }
        code = code << 6 | (p[i] & 0x3f);
    }
    if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
        *len = 0;
    return code;
}

/* A JSON string as Python's json.dump writes it (ensure_ascii): printable ASCII as it is,
 * quotes, backslashes and control characters escaped, every other character as \uXXXX
 * (a surrogate pair beyond U+FFFF), and each byte of invalid UTF-8 as the lone surrogate
 * \udcXX that Python decodes it to (surrogateescape, as os.environ reads it). */
void json_string(struct buf *b, const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *)text, *end = p + len;

    buf_add(b, "\"", 1);
    while (p < end) {
        const unsigned char *run = p;
        uint32_t code;
        size_t step;

        while (p < end && *p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\')
            p++;
        buf_add(b, (const char *)run, (size_t)(p - run));
        if (p == end)
            break;
        switch (*p) {
        case '"': buf_str(b, "\\\""); break;
        case '\\': buf_str(b, "\\\\"); break;
        case '\b': buf_str(b, "\\b"); break;
        case '\f': buf_str(b, "\\f"); break;
        case '\n': buf_str(b, "\\n"); break;
        case '\r': buf_str(b, "\\r"); break;
        case '\t': buf_str(b, "\\t"); break;
        default:
            code = utf8_at(p, (size_t)(end - p), &step);
            if (step == 0) {
                buf_printf(b, "\\udc%02x", *p);
                break;
            }
            if (code > 0xffff) {
                code -= 0x10000;
                buf_printf(b, "\\u%04x\\u%04x", 0xd800 + (code >> 10), 0xdc00 + (code & 0x3ff));
            } else {
                buf_printf(b, "\\u%04x", code);
            }
            p += step - 1;
            break;
        }
        p++;
    }
    buf_add(b, "\"", 1);
}

void json_cstring(struct buf *b, const char *text)
{
    json_string(b, text, strlen(text));
}

/* A float as Python's repr() writes it: the shortest digits that read back the same,
 * positional from 1e-4 to below 1e16, with ".0" when it would look like an integer. */
void json_float(struct buf *b, double value)
{
    char text[64];
    int digits, exponent;

    if (value != value || value - value != 0) { /* nan, inf: not a value this file holds */
        buf_str(b, value != value ? "NaN" : value > 0 ? "Infinity" : "-Infinity");
        return;
    }
    for (digits = 0; digits < 17; digits++) {
        snprintf(text, sizeof(text), "%.*e", digits, value);
        if (strtod(text, NULL) == value)
            break;
    }
    exponent = atoi(strchr(text, 'e') + 1);
    if (exponent < -4 || exponent >= 16) {
        buf_str(b, text);
        return;
    }
    snprintf(text, sizeof(text), "%.*f", digits > exponent ? digits - exponent : 0, value);
    buf_str(b, text);
    if (!strchr(text, '.'))
        buf_str(b, ".0");
}

/* Python's int() of a word: an optional sign, then decimal digits, single underscores
 * between them. 0 and *out set when it reads; -1 when not (or beyond long long). */
int py_int(struct word w, long long *out)
{
    size_t i = 0;
    int negative = 0, digits = 0;
    unsigned long long value = 0, limit;

    if (i < w.n && (w.p[i] == '+' || w.p[i] == '-'))
        negative = w.p[i++] == '-';
    limit = negative ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX;
    for (; i < w.n; i++) {
        char c = w.p[i];

        if (c == '_' && digits && i + 1 < w.n && w.p[i + 1] >= '0' && w.p[i + 1] <= '9')
            continue;
        if (c < '0' || c > '9')
            return -1;
        if (value > (limit - (unsigned long long)(c - '0')) / 10)
            return -1;
        value = value * 10 + (unsigned long long)(c - '0');
        digits++;
    }
    if (!digits)
        return -1;
    *out = negative ? (long long)(0 - value) : (long long)value;
    return 0;
}

/* Digits with single underscores between them, from p; how many bytes they take (0: none). */
static size_t digit_part(const char *p, const char *end, struct buf *into)
{
    const char *start = p;

    if (p == end || *p < '0' || *p > '9')
        return 0;
    while (p < end) {
        if (*p >= '0' && *p <= '9') {
            buf_add(into, p, 1);
            p++;
        } else if (*p == '_' && p + 1 < end && p[1] >= '0' && p[1] <= '9') {
            p++;
        } else {
            break;
        }
    }
    return (size_t)(p - start);
}

/* Python's float() of a finite decimal word ([sign] digits [. digits] [e [sign] digits],
 * underscores between digits); 0 and *out set when it reads. inf and nan, which Python
 * reads too, are no percentage and are refused here. */
int py_float(struct word w, double *out)
{
    const char *p = w.p, *end = w.p + w.n;
    struct buf clean = {0};
    size_t whole, fraction = 0;
    int ok = 0;

    if (p < end && (*p == '+' || *p == '-'))
        buf_add(&clean, p++, 1);
    whole = digit_part(p, end, &clean);
    p += whole;
    if (p < end && *p == '.') {
        buf_add(&clean, p++, 1);
        fraction = digit_part(p, end, &clean);
        p += fraction;
    }
    if (whole || fraction) {
        ok = 1;
        if (p < end && (*p == 'e' || *p == 'E')) {
            size_t exponent;

            buf_add(&clean, p++, 1);
            if (p < end && (*p == '+' || *p == '-'))
                buf_add(&clean, p++, 1);
            exponent = digit_part(p, end, &clean);
            p += exponent;
            ok = exponent > 0;
        }
        ok = ok && p == end;
    }
    if (ok)
        *out = strtod(clean.data, NULL);
    free(clean.data);
    return ok ? 0 : -1;
}
