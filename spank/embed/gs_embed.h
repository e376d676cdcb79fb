/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * Starting the embedded Python, shared by the SPANK plugin and the job_submit plugin.
 *
 * Slurm dlopen()s plugins RTLD_LOCAL, so libpython is promoted to RTLD_GLOBAL first (or
 * extension modules such as _cffi_backend cannot resolve it). The interpreter is isolated
 * from the process environment (PYTHONHOME, PYTHONPATH, user site), installs no signal
 * handlers (srun/slurmstepd/slurmctld own theirs), writes no bytecode, and gives the GIL
 * back at once: cffi takes it per call. Its module path is fixed at build time to the one
 * the isolated interpreter computes, and `site` is not run: no .pth file or sitecustomize
 * executes inside slurmstepd or slurmctld (and each start is shorter). Python is never
 * finalised: a daemon's plugin may be unloaded, but its interpreter stays until the
 * process ends.
 *
 * The including file defines GS_LIBPYTHON, GS_PYTHONHOME and GS_MODULE_PATHS (wide string
 * literals, comma separated): embedbuild.python_defines() gives them.
 */
#ifndef GS_EMBED_H
#define GS_EMBED_H

#include <dlfcn.h>
#include <wchar.h>

static int gs_python_failed = 0;
static const wchar_t *const gs_module_paths[] = {GS_MODULE_PATHS, NULL};

/* 0 when Python is ready (started now or before), -1 with an error logged otherwise. */
static int gs_python_start(const char *who)
{
    PyStatus status;
    PyConfig config;

    if (Py_IsInitialized())
        return 0;
    if (gs_python_failed)
        return -1;
    /* promoted for the process's life: the handle is never closed */
    /* cppcheck-suppress leakReturnValNotUsed */
    if (!dlopen(GS_LIBPYTHON, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL))
        slurm_error("%s: could not make %s global: %s", who, GS_LIBPYTHON, dlerror());

    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;
    config.write_bytecode = 0;
    config.parse_argv = 0;
    config.site_import = 0;
    config.module_search_paths_set = 1;
    status = PyConfig_SetBytesString(&config, &config.home, GS_PYTHONHOME);
    for (int i = 0; gs_module_paths[i] && !PyStatus_Exception(status); i++)
        status = PyWideStringList_Append(&config.module_search_paths, gs_module_paths[i]);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        gs_python_failed = 1;
        slurm_error("%s: cannot start the embedded Python (home %s): %s", who, GS_PYTHONHOME,
                    status.err_msg ? status.err_msg : "unknown error");
        return -1;
    }
    PyEval_SaveThread();
    return 0;
}

#endif
