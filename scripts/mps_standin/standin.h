/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What the stand-in's front and its daemon share (front.c: the entry, the client, the
 * servers and the faults; daemon.c and the files daemon.h names: the control daemon). See
 * front.c for what the program does.
 */
#ifndef GPUSHARE_MPS_STANDIN_H
#define GPUSHARE_MPS_STANDIN_H

#include <limits.h>
#include <stddef.h>

#define STANDIN_NAME "nvidia-cuda-mps-control stand-in"

/* This program, resolved through /proc/self/exe, and its directory (the faults file's). */
extern char standin_self[PATH_MAX];
extern char standin_dir[PATH_MAX];

/* The active faults: GPUSHARE_STANDIN_FAULT (comma separated) and the "faults" file beside
 * this program (whitespace separated), read afresh by each faults_read. */
struct faults {
    char *text;   /* the names, each NUL-terminated, in one allocation */
    char **names; /* sorted, without duplicates */
    size_t count;
};

int faults_read(struct faults *faults);
int faults_has(const struct faults *faults, const char *name);
void faults_free(struct faults *faults);
/* One fault read afresh: faults_read + faults_has (0 when they cannot be read). */
int fault_active(const char *name);

/* The byte length of the whitespace character (as Python's str.split() knows them: ASCII and
 * Unicode spaces in UTF-8) that starts at p, or 0 when none does. */
size_t space_at(const char *p, const char *end);

/* The daemon's part of the command line (-d, -f, -v, anything but client mode and
 * --server); its exit status. */
int daemon_main(int argc, char **argv);

#endif
