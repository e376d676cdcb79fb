/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Each task's environment, in the task's slurmstepd (task_init_privileged, root): applied
 * from the root-owned file <state_dir>/jobs/<id>.env that the job prolog wrote (its format:
 * gs_envfile.c). Reading it here keeps Python out of slurmstepd entirely: no interpreter
 * start per task, no GIL across slurmstepd's fork(). Also the IMEX channel check.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gs_internal.h"

#define GS_ENV_MAX 65536

static int gs_getenv(spank_t sp, const char *name, char *buf, int len)
{
    return spank_getenv(sp, name, buf, len) == ESPANK_SUCCESS ? 0 : -1;
}

/* Read the root-owned env file; 1 when read, 0 when absent, -1 on an unsafe file. */
static int gs_read_env_file(spank_t sp, char *buf, size_t size)
{
    char path[PATH_MAX + 32];
    uint32_t job_id = 0;
    struct stat st;
    ssize_t n, total = 0;
    int fd;

    if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
        gs_job_file(sp, GS_ENV_SUFFIX, path, sizeof(path)) < 0)
        return -1;
    if (gs_check_state_dir(0) < 0)
        return errno == ENOENT ? 0 : -1; /* no state directory: no gpushare job ran here */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
        (st.st_mode & 0077) || st.st_size >= (off_t)size) {
        slurm_error("gpushare: job %u: refusing %s: not a root-owned 0600 file", job_id, path);
        close(fd);
        return -1;
    }
    while ((n = read(fd, buf + total, size - 1 - total)) > 0)
        total += n;
    close(fd);
    if (n < 0)
        return -1;
    buf[total] = '\0';
    return 1;
}

/*
 * One variable of the file into the task. The file's CUDA_VISIBLE_DEVICES numbers the MPS
 * daemon's devices from 0, as the daemon renumbers them, because Slurm's indices mean
 * nothing to its clients. A list of UUIDs that Slurm gave the task (gres.conf
 * Flags=env_uuid in 26.05, MIG slices) does, the daemon's devices named as they are and
 * any per-task binding kept: the task keeps it (gpushare.node.devices.uuid_list).
 */
static int gs_set_task_env(void *ctx, const char *name, const char *value)
{
    char slurm_devices[4096];

    if (strcmp(name, "CUDA_VISIBLE_DEVICES") == 0 &&
        gs_getenv((spank_t)ctx, name, slurm_devices, sizeof(slurm_devices)) == 0 &&
        gs_uuid_list(slurm_devices)) {
        gs_debug((spank_t)ctx, "cb=task_init_privileged devices=slurm-uuids");
        return 0;
    }
    return spank_setenv((spank_t)ctx, name, value, 1) == ESPANK_SUCCESS ? 0 : -1;
}

static int gs_apply_env_file(spank_t sp, char *text)
{
    uint32_t node_id = 1;
    int task_id = 1;
    const char *show, *error;

    switch (gs_env_file_apply(text, gs_set_task_env, sp, &show, &error)) {
    case -1:
        slurm_spank_log("gpushare: %s", error);
        return -1;
    case -2:
        slurm_error("gpushare: cannot set %s in the task", error);
        return -1;
    default:
        break;
    }
    if (show && spank_get_item(sp, S_JOB_NODEID, &node_id) == ESPANK_SUCCESS &&
        spank_get_item(sp, S_TASK_ID, &task_id) == ESPANK_SUCCESS && node_id == 0 &&
        task_id == 0) {
        if (dprintf(STDERR_FILENO, "%s\n", show) < 0) {
            /* the line is informative only */
        }
    }
    return 0;
}

/*
 * With switch/nvidia_imex, slurmstepd gives each step of a job its IMEX channel device
 * (<dir>/channel<N>) before the tasks start; multi-node NVLink memory sharing fails
 * without one. A GPU task that finds none is stopped here with the reason, instead of
 * failing later inside CUDA.
 */
static int gs_check_imex(spank_t sp)
{
    char gpus[256];
    struct dirent *entry;
    struct stat st;
    DIR *dir;
    int fd, found = 0;

    if (!gs_imex_dir[0])
        return 0;
    if (gs_getenv(sp, "SLURM_JOB_GPUS", gpus, sizeof(gpus)) < 0 &&
        gs_getenv(sp, "CUDA_VISIBLE_DEVICES", gpus, sizeof(gpus)) < 0)
        return 0; /* not a GPU job: no IMEX channel needed */
    fd = open(gs_imex_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir && fd >= 0)
        close(fd);
    while (dir && !found && (entry = readdir(dir))) {
        if (strncmp(entry->d_name, "channel", 7) != 0 || !entry->d_name[7] ||
            entry->d_name[7 + strspn(entry->d_name + 7, "0123456789")] != '\0')
            continue;
        if (fstatat(dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISCHR(st.st_mode))
            found = 1;
    }
    if (dir)
        closedir(dir);
    if (found) {
        gs_debug(sp, "cb=task_init_privileged imex=found");
        return 0;
    }
    slurm_spank_log("gpushare: this GPU job has no IMEX channel in %s, which multi-node "
                    "NVLink needs: the node's Slurm must give each job one (slurm.conf "
                    "SwitchType=switch/nvidia_imex, and the nvidia-caps-imex-channels "
                    "driver device); tell your administrator", gs_imex_dir);
    return -1;
}

/* The task's environment from the job's file, waiting for the prolog's worker when the
 * file is not there yet. asked_to_share: the job used --gpu-share or --gpu-mps. */
int gs_task_env(spank_t sp, int asked_to_share)
{
    static char text[GS_ENV_MAX];
    char buf[16];
    int found;

    if (gs_check_imex(sp) < 0)
        return -1;
    found = gs_read_env_file(sp, text, sizeof(text));
    if (found == 0) {
        if (gs_wait_for_prolog(sp) < 0)
            return -1;
        found = gs_read_env_file(sp, text, sizeof(text));
    }
    if (found < 0)
        return -1;
    if (found == 0) {
        if (asked_to_share ||
            gs_getenv(sp, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", buf, sizeof(buf)) == 0) {
            slurm_spank_log("gpushare: this job asked to share a GPU but its node has no "
                            "gpushare record: the job prolog failed or did not run (the "
                            "plugin must be in plugstack.conf on this node); see slurmd's "
                            "log");
            return -1;
        }
        gs_debug(sp, "cb=task_init_privileged skip reason=no-share");
        return 0;
    }
    if (!text[0]) {
        gs_debug(sp, "cb=task_init_privileged skip reason=no-share");
        return 0;
    }
    gs_debug(sp, "cb=task_init_privileged env-file state_dir=%s", gs_state_dir);
    return gs_apply_env_file(sp, text);
}
