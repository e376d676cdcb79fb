/* SPDX-License-Identifier: GPL-2.0-or-later */
/* The small parsers of spank/gs_parse.c: --gpu-share, a share file, /proc stat, a stamp,
 * a GPU list. links: gs_parse.c */
#include <limits.h>
#include <sys/stat.h>

#include "gs_check.h"
#include "gs_parse.h"

static void test_percent(void)
{
    CHECK_INT(gs_parse_percent("25"), 25);
    CHECK_INT(gs_parse_percent("1"), 1);
    CHECK_INT(gs_parse_percent("100"), 100);
    CHECK_INT(gs_parse_percent("007"), 7);
    const char *refused[] = {NULL, "", "0", "101", "-5", "25%", "25 ", "2.5", "0x19",
                             "99999999999999999999999", "+", "1e2", "+25", " 25", "\t25"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        CHECK_INT(gs_parse_percent(refused[i]), -1);
}

static void test_share_text(void)
{
    CHECK_INT(gs_parse_share_text("25\n"), 25);
    CHECK_INT(gs_parse_share_text("100"), 100);
    CHECK_INT(gs_parse_share_text("1\n"), 1);
    const char *refused[] = {NULL, "", "\n", "0\n", "101\n", "25\n\n", "25x\n", "x25",
                             "25 \n", "99999999999999999999999\n", "-1\n"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        CHECK_INT(gs_parse_share_text(refused[i]), -1);
}

static void test_proc_start(void)
{
    char out[32], small[4];
    char typical[] = "4242 (nvidia-cuda-mps) S 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 20 "
                     "0 1 0 987654 1064960 172\n";
    char tricky_name[] = "4242 (a) S 1 2 3 (b)) S 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 "
                         "20 0 1 0 555 1064960 172\n";
    char zombie[] = "4242 (x) Z 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 20 0 1 0 987654 1\n";
    char dead[] = "4242 (x) X 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 20 0 1 0 987654 1\n";
    char short_line[] = "4242 (x) S 1 2 3\n";
    char no_paren[] = "4242 x S 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 20 0 1 0 987654\n";
    char last[] = "4242 (x) S 1 4242 4242 0 -1 4194560 96 0 0 0 1 2 0 0 20 0 1 0 987654";
    char long_field[] = "1 (x) S 1 1 1 0 -1 1 1 0 0 0 1 2 0 0 20 0 1 0 123456789012 1\n";

    CHECK_INT(gs_parse_proc_start(typical, out, sizeof(out)), 0);
    CHECK_STR(out, "987654");
    /* the name ends at the last ')': a process cannot fake its start time by its name */
    CHECK_INT(gs_parse_proc_start(tricky_name, out, sizeof(out)), 0);
    CHECK_STR(out, "555");
    CHECK_INT(gs_parse_proc_start(zombie, out, sizeof(out)), -1);
    CHECK_INT(gs_parse_proc_start(dead, out, sizeof(out)), -1);
    CHECK_INT(gs_parse_proc_start(short_line, out, sizeof(out)), -1);
    CHECK_INT(gs_parse_proc_start(no_paren, out, sizeof(out)), -1);
    CHECK_INT(gs_parse_proc_start(last, out, sizeof(out)), 0);
    CHECK_STR(out, "987654");
    /* a field longer than the buffer is refused, never cut */
    CHECK_INT(gs_parse_proc_start(long_field, small, sizeof(small)), -1);
}

static void test_proc_parent(void)
{
    long ppid = 0, pgrp = 0;

    CHECK_INT(gs_parse_proc_parent("4243 (nvidia-cuda-mps) S 4242 4243 4243 0 -1\n", &ppid,
                                   &pgrp), 0);
    CHECK_INT((int)ppid, 4242);
    CHECK_INT((int)pgrp, 4243);
    /* the name ends at the last ')': a process cannot name another parent by its name */
    CHECK_INT(gs_parse_proc_parent("7 (a) S 1 1 (b)) S 99 7 7 0\n", &ppid, &pgrp), 0);
    CHECK_INT((int)ppid, 99);
    CHECK_INT((int)pgrp, 7);
    CHECK_INT(gs_parse_proc_parent("7 (x) Z 1 7 7 0\n", &ppid, &pgrp), 0); /* zombies too */
    CHECK_INT(gs_parse_proc_parent("7 (x) S 1\n", &ppid, &pgrp), -1);
    CHECK_INT(gs_parse_proc_parent("7 x S 1 7 7\n", &ppid, &pgrp), -1);
    CHECK_INT(gs_parse_proc_parent("7 (x) S -1 7 7\n", &ppid, &pgrp), -1);
    CHECK_INT(gs_parse_proc_parent("7 (x) S a b c\n", &ppid, &pgrp), -1);
    CHECK_INT(gs_parse_proc_parent("", &ppid, &pgrp), -1);
}

static void test_stamp(void)
{
    struct stat st;
    char out[GS_STAMP_MAX];

    memset(&st, 0, sizeof(st));
    st.st_dev = 2049;
    st.st_ino = 131075;
    st.st_size = 412;
    st.st_mtim.tv_sec = 1699999000;
    st.st_mtim.tv_nsec = 123456789;
    gs_stamp(&st, out, sizeof(out));
    CHECK_STR(out, "2049 131075 412 1699999000123456789");
    st.st_dev = (dev_t)-1;
    st.st_ino = (ino_t)-1;
    st.st_size = LLONG_MAX;
    gs_stamp(&st, out, sizeof(out));
    CHECK_STR(out, "18446744073709551615 18446744073709551615 9223372036854775807 "
                   "1699999000123456789");
}

static void test_gpu_list(void)
{
    long indices[64];
    char list[512];
    int at = 0;

    CHECK_INT(gs_parse_gpu_list("3", indices, 64), 1);
    CHECK_INT(indices[0], 3);
    CHECK_INT(gs_parse_gpu_list("0,1,17", indices, 64), 3);
    CHECK_INT(indices[2], 17);
    CHECK_INT(gs_parse_gpu_list("99999", indices, 64), 1);
    const char *refused[] = {NULL, "", ",", "0,", ",0", "0,,1", "-1", "0, 1", "0-3", "100000",
                             " 1", "1 ", "a", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        CHECK_INT(gs_parse_gpu_list(refused[i], indices, 64), -1);
    for (int i = 0; i < 64; i++)
        at += snprintf(list + at, sizeof(list) - (size_t)at, "%s%d", i ? "," : "", i);
    CHECK_INT(gs_parse_gpu_list(list, indices, 64), 64);
    CHECK_INT(indices[63], 63);
    snprintf(list + at, sizeof(list) - (size_t)at, ",64");
    CHECK_INT(gs_parse_gpu_list(list, indices, 64), -1); /* never past max */
}

static void test_uuid_list(void)
{
    const char *uuids[] = {"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
                           "GPU-a,GPU-b", "MIG-5c5b9cc6-2b5e-5d3a-9c4d-0c2c7b1e2f10",
                           "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0", "GPU-a,MIG-b"};
    const char *not_uuids[] = {NULL, "", "0", "0,1", "GPU-a,1", "1,GPU-a", "GPU-", "MIG-",
                               "GPU-a,", ",GPU-a", "GPU-a,,GPU-b", "gpu-a", " GPU-a",
                               "NoDevFiles", "GPU-a,MIG-"};

    for (size_t i = 0; i < sizeof(uuids) / sizeof(uuids[0]); i++)
        CHECK_INT(gs_uuid_list(uuids[i]), 1);
    for (size_t i = 0; i < sizeof(not_uuids) / sizeof(not_uuids[0]); i++)
        CHECK_INT(gs_uuid_list(not_uuids[i]), 0);
}

static void test_nohold_on_prolog_fail(void)
{
    const char *nohold[] = {
        "SchedulerParameters     = nohold_on_prolog_fail\n",
        "SLURM_VERSION = 22.05.8\nSchedulerParameters = bf_continue,nohold_on_prolog_fail\n"
        "SchedulerTimeSlice = 30 sec\n",
        "SchedulerParameters=nohold_on_prolog_fail,bf_interval=30",
        "A = b\r\nSchedulerParameters\t= x,nohold_on_prolog_fail\r\n"};
    const char *held[] = {
        "", "SchedulerParameters     = (null)\n", "SchedulerParameters = bf_continue\n",
        "SchedulerParameters = xnohold_on_prolog_fail\n",
        "SchedulerParameters = nohold_on_prolog_fail_x\n",
        "SchedulerParameters = bf_continue\nComment = nohold_on_prolog_fail\n",
        "SchedulerParametersX = nohold_on_prolog_fail\n",
        "# SchedulerParameters = nohold_on_prolog_fail\n",
        "SchedulerType = sched/backfill nohold_on_prolog_fail\n"};

    for (size_t i = 0; i < sizeof(nohold) / sizeof(nohold[0]); i++)
        CHECK_INT(gs_nohold_on_prolog_fail(nohold[i]), 1);
    for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
        CHECK_INT(gs_nohold_on_prolog_fail(held[i]), 0);
}

int main(void)
{
    test_percent();
    test_share_text();
    test_proc_start();
    test_proc_parent();
    test_stamp();
    test_gpu_list();
    test_uuid_list();
    test_nohold_on_prolog_fail();
    return gs_check_done("test_parse");
}
