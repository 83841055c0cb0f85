#pragma once
/// @file Preemption: Slurm (`sbatch --signal=USR1@SECONDS`, or a scancel / time-limit SIGTERM)
/// asks a job to stop. The handlers only record the request; the trainer acts on it at the next
/// step boundary, where every rank agrees (one all-reduce), saves a checkpoint and exits with
/// kExitPreempted so the job script can requeue.
namespace meshtrain {

/// Installs handlers for SIGTERM and SIGUSR1 that record a stop request (async-signal-safe:
/// they set a flag). Call once per process, after MPI_Init.
void install_preemption_handlers();

/// Whether this process received SIGTERM or SIGUSR1 since install_preemption_handlers().
bool preemption_requested();

/// The signal number received (0 when none).
int preemption_signal();

}  // namespace meshtrain
