/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * spank_gpushare_core.so: the embedded Python core of the SPANK plugin (cffi embedding).
 *
 * Loaded by spank_gpushare.so with dlopen() only for jobs that use gpushare, so jobs that
 * do not never map libpython. It starts Python isolated (gs_embed.h) and runs each
 * callback in gpushare.node.spank_adapter through the host calls the plugin lends it.
 *
 * This file is #included into the cffi-generated module (spank/build.py).
 */
#include <slurm/spank.h>

#include "embed/gs_embed.h"
#include "gs_host.h"

#define GS_EXPORT __attribute__((visibility("default")))

/* Defined by cffi from build.py's embedding_api (the Python side). */
int gpushare_py_alive(void);
int gpushare_py_dispatch(const char *callback, void *host, int ac, char **av);
void gpushare_py_prefork(const char *state_dir, const char *code, int ac, char **av);

/* Start Python and import the core; 0 when ready, -1 with the reason logged. */
GS_EXPORT int gpushare_core_start(void)
{
    if (gs_python_start("gpushare") < 0)
        return -1;
    if (gpushare_py_alive() != 42) {
        gs_python_failed = 1;
        slurm_error("gpushare: the Python core failed to load (see the traceback above); "
                    "check the pythonpath= argument and that python3-cffi is installed");
        return -1;
    }
    return 0;
}

GS_EXPORT int gpushare_core_dispatch(const char *callback, struct gs_host *host, int ac,
                                     char **av)
{
    return gpushare_py_dispatch(callback, (void *)host, ac, av);
}

/* prefork=yes: fork the node's prefork server off this interpreter (gpushare.node.prefork). */
GS_EXPORT void gpushare_core_prefork(const char *state_dir, const char *code, int ac, char **av)
{
    gpushare_py_prefork(state_dir, code, ac, av);
}
