/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * What crosses the files of the SPANK plugin's C glue (spank_gpushare.so). Every name here
 * is hidden (-fvisibility=hidden, spank/exports.map): only the SPANK symbols of
 * gpushare_spank.c leave the plugin. The pure parsers, which a test program can link
 * without Slurm, are declared apart in gs_parse.h.
 */
#ifndef GS_INTERNAL_H
#define GS_INTERNAL_H

#include <dirent.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <slurm/spank.h>

#include "gs_parse.h"

/* ---- gs_args.c: the plugstack arguments, parsed once per process ------------------- */
extern char gs_state_dir[PATH_MAX]; /* state_dir=, %n and %h expanded */
extern char gs_debug_log[PATH_MAX]; /* debug_log=: "" when none */
extern char gs_pythonpath[PATH_MAX]; /* pythonpath=, else GS_DEFAULT_PYTHONPATH; "" if none */
extern char gs_imex_dir[PATH_MAX]; /* imex_channels=: "" when not checked */
extern double gs_timeout;          /* timeout=; its range is checked by Python */
extern int gs_prefork;             /* prefork=yes */
int gs_parse_args(int ac, char **av);
const char *gs_node_name(void); /* NULL when not a plain host name */

/* ---- gpushare_spank.c: the options ------------------------------------------------- */
const char *gs_getopt(void *sp, const char *name);

/* ---- gs_log.c: the debug log, slurmd's log for the core, the counters --------------- */
void gs_debug(spank_t sp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gs_log(int level, const char *msg);
void gs_count_fast(const char *callback, double seconds);

/* ---- gs_safefs.c: root-safe files, directories and locks --------------------------- */
double gs_now(void);
int gs_untrusted(const struct stat *st, int sticky_ok);
int gs_refuse(const char *what, const char *path, const struct stat *st, const char *fix);
int gs_check_parents(const char *what, const char *path);
int gs_check_state_dir(int create);
/* Whether state_dir='s file system has no block or inode left, even for root. */
int gs_state_dir_full(void);
int gs_jobs_dir(char *out, size_t size);
int gs_open_lock(const char *path, int create);
int gs_flock_until(int fd, int operation, double deadline);
int gs_open_dir_at(int dir_fd, const char *name);
DIR *gs_dir_stream(int fd);
char *gs_read_root_file(int dir_fd, const char *name, size_t max);
int gs_write_mode_at(int dir_fd, const char *name, const char *text, int no_replace,
                     mode_t mode);
int gs_write_at(int dir_fd, const char *name, const char *text, int no_replace);
int gs_lock_daemon(int store_fd, const char *key);

/* ---- gs_drain.c: draining the node for a fault no Python can report ---------------- */
int gs_drain_node(const char *why);
/* Requeue a job whose prolog failed here as Slurm does: "held", "requeued", or NULL when
 * slurmctld would not (--no-requeue, not a batch job) or could not be asked. */
const char *gs_requeue_job(uint32_t job_id);

/* ---- gs_core.c: the Python core, loaded lazily, never in slurmd --------------------- */
int gs_core_trusted(char *path, size_t size);
/* What gs_core_trusted saw of the core and of everything below pythonpath= (names, inodes,
 * sizes, times), as hex: the prefork server runs only for the code it was born with. */
extern char gs_code_print[17];
/* Set in a detached worker with prefork=yes: gs_call_python tries the prefork server. */
extern int gs_prefork_here;
/* The deadline (gs_now's clock) gs_call_python hands the Python in this process: its waits
 * take the time left until then (gpushare.node.phases). 0: its own, from timeout=. */
extern double gs_python_deadline;
/* 0, -1, or GS_CORE_IMPORT_FAILED when the core cannot be loaded or imported. */
int gs_call_python(const char *callback, spank_t sp, int ac, char **av);
void gs_core_fault(const char *callback, spank_t sp, int requeue);

/* ---- gs_deadline.c: a worker's one deadline, its supervisor ------------------------- */
double gs_worker_deadline(void);
double gs_wait_limit(void);
int gs_supervise(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end);
int gs_no_worker(const char *callback, spank_t sp, const char *lock_at_end, const char *cause);

/* ---- gs_worker.c: the detached worker, the job's lock, the epilog barrier ---------- */
#define GS_EPILOG_LOCKS_MAX 64 /* the most GPUs an epilog holds the barrier of */
void gs_fail_tasks(spank_t sp, const char *text);
int gs_run_worker(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end);
int gs_job_file(spank_t sp, const char *suffix, char *path, size_t size);
int gs_job_record_exists(spank_t sp);
int gs_job_usage_exists(spank_t sp);
int gs_hold_epilog_barrier(int *fds, int max);
void gs_finish(const char *callback, spank_t sp, const char *lock);
int gs_in_place(const char *callback, spank_t sp, int ac, char **av, const char *lock_at_end);
int gs_call_detached(const char *callback, spank_t sp, int ac, char **av,
                     const char *lock_at_end);
int gs_wait_for_prolog(spank_t sp);

/* ---- gs_prefork.c: a worker's callback run by the node's prefork server ------------- */
/* The prefork server's child that runs a worker's callback, in a page the worker shares
 * with its supervisor, which kills that child with the worker. pid 0: none. */
struct gs_delegate {
    pid_t pid; /* written and read with __atomic, after and before start */
    char start[32]; /* its start time (/proc/<pid>/stat), against a pid used again */
};
extern struct gs_delegate *gs_delegate;
int gs_prefork_call(const char *callback, spank_t sp, int ac, char **av, const char *code,
                    int *rc);

/* ---- gs_fastpath.c: join and leave without an interpreter -------------------------- */
/* /proc/<pid>/stat's text into text (NUL-terminated, at most size - 1 bytes): 0, or -1. */
int gs_read_proc_stat(long pid, char *text, size_t size);
int gs_fast_join(spank_t sp, int ac, char **av);
int gs_fast_leave(spank_t sp);
/* What a ticket's use holds open: the daemon records' and the tickets' directories, then the
 * jobs directory and the daemon's lock. */
struct gs_ticket_fds {
    int store, tickets, jobs, lock;
};
int gs_ticket_job(spank_t sp, char job[16], uint32_t *uid, char gpus[48], const char **share);
char *gs_read_ticket(struct gs_ticket_fds *fds, const char *name);
int gs_ticket_lock(struct gs_ticket_fds *fds, const char *key);
void gs_ticket_close(struct gs_ticket_fds *fds);
void gs_ticket_facts(struct gs_ticket_facts *facts, spank_t sp, int ac, char **av);
int gs_proc_start(long pid, char *out, size_t size);

/* ---- gs_taskenv.c: the task's environment, the IMEX check -------------------------- */
int gs_task_env(spank_t sp, int asked_to_share);

#endif
