/* The floor: a SPANK plugin that does nothing, to compare gpushare's cost against. */
#include <slurm/spank.h>

SPANK_PLUGIN(noop, 1);

int slurm_spank_init(spank_t sp, int ac, char **av) { (void)sp; (void)ac; (void)av; return 0; }
int slurm_spank_job_prolog(spank_t sp, int ac, char **av) { (void)sp; (void)ac; (void)av; return 0; }
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void)sp; (void)ac; (void)av;
    return 0;
}
int slurm_spank_job_epilog(spank_t sp, int ac, char **av) { (void)sp; (void)ac; (void)av; return 0; }
