#!/usr/bin/env bash
# Runs an sbatch script on this machine without Slurm: reads its #SBATCH --nodes,
# --ntasks-per-node and --cpus-per-task (overridable with NODES=, NTASKS_PER_NODE=), exports the
# SLURM_* variables the scripts read, and puts an `srun` on PATH that launches the ranks with
# mpirun (oversubscribed). Used by `make test` to exercise jobs/ end to end.
#   jobs/run-local.sh jobs/cpu_reference.sbatch [DECK] [--section.key=value ...]
set -euo pipefail
script=${1:?usage: run-local.sh SCRIPT [ARGS...]}
shift
opt() { sed -n "s/^#SBATCH --$1=\\(.*\\)/\\1/p" "$script" | head -1; }
export SLURM_JOB_ID=${SLURM_JOB_ID:-local$$}
export SLURM_NNODES=${NODES:-$(opt nodes)}
export SLURM_NTASKS_PER_NODE=${NTASKS_PER_NODE:-$(opt ntasks-per-node)}
export SLURM_CPUS_PER_TASK=${CPUS_PER_TASK:-$(opt cpus-per-task)}
export SLURM_NTASKS=$((SLURM_NNODES * SLURM_NTASKS_PER_NODE))
export SLURM_JOB_NODELIST="localhost"
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
cat > "$shim/srun" <<'SRUN'
#!/usr/bin/env bash
# srun stand-in: drop srun's own options, run the command on SLURM_NTASKS ranks with mpirun.
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
exec mpirun --allow-run-as-root --oversubscribe --quiet -np "$SLURM_NTASKS" "$@"
SRUN
chmod +x "$shim/srun"
export PATH="$shim:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bash "$script" "$@"
