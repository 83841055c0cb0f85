#!/usr/bin/env python3
"""The real jobs/*.sbatch scripts on the single-node Slurm test cluster (scripts/slurm/), one
scenario per ctest test. Each submits with sbatch, overriding the scripts' #SBATCH node and task
counts on the command line as a user would, and checks the job's state in `scontrol show job`, its
output file and the run folder:

  cpu_reference  jobs/cpu_reference.sbatch, 4 tasks, 3 steps: ranks started by srun --mpi=pmix join
                 one 4-rank world (a rank without PMIx would come up alone, as a world of 1)
  preemption     `scancel --signal=USR1` (the job steps, as Slurm's --signal does) while it trains:
                 meshtrain saves and exits 4, the script requeues the job, the requeued job resumes
                 from that checkpoint and finishes; losses and final parameters equal an
                 uninterrupted job's bit for bit
  elastic        saved by a 2-task job, resumed by a 3-task job in the same folder
  bad_deck       a deck with a misspelled key fails the job in the script's deck check, before srun,
                 with the key named in the output
  gpu_layout     jobs/gpu_cluster.sbatch and jobs/llama3_1b_gpu.sbatch as written (8 tasks, 8 GPUs of
                 the cluster's placeholder GPUs) print their layout / deck check, then the ranks stop
                 at meshtrain's device check (no CUDA GPU here), status 2

usage: slurm_jobs.py SCENARIO --state FILE --meshtrain BIN --data H5 --out DIR
Exit status 0 all checks passed, 1 a check failed, 77 no test cluster on this machine (skipped).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "checkpoint"))
from slurm_cluster import Cluster  # noqa: E402
from ckpt_common import losses, report, same_final_params  # noqa: E402

DECK = os.path.join(ROOT, "tests", "equivalence", "tiny.toml")
CPU_SCRIPT = os.path.join(ROOT, "jobs", "cpu_reference.sbatch")


def tasks(n):
    """sbatch options for n tasks on the one node (the scripts ask for 2 nodes x 8 or 1 x 8)."""
    return ["--nodes=1", f"--ntasks-per-node={n}"]


def read(path):
    """The text of path, "" when it does not exist (a job that never started writes no output)."""
    return open(path).read() if os.path.exists(path) else ""


def records(folder):
    """The complete records of folder/metrics.jsonl, in file order (a requeued run appends); a
    line the run is still writing (no newline yet) is left out."""
    return [json.loads(line) for line in read(os.path.join(folder, "metrics.jsonl")).split("\n")[:-1]]


def summary(folder):
    """The run's last `summary` record ({} when there is none)."""
    return next((r for r in reversed(records(folder)) if r.get("event") == "summary"), {})


def logged_steps(folder):
    """Steps of the training records of folder/metrics.jsonl, in file order."""
    return [r["step"] for r in records(folder) if "loss" in r]


class Scenario:
    """A scenario's cluster, binary, corpus and output folder (emptied first: the scripts
    append to their output files)."""

    def __init__(self, args):
        self.cluster = Cluster(args.state)
        self.out = os.path.abspath(args.out)
        shutil.rmtree(self.out, ignore_errors=True)
        os.makedirs(self.out)
        self.env = {"MESHTRAIN_BIN": os.path.abspath(args.meshtrain)}
        self.meshtrain = os.path.abspath(args.meshtrain)
        self.data = os.path.abspath(args.data)

    def train_args(self, folder, *overrides, deck=DECK):
        """The scripts' arguments: deck, then overrides for the tiny corpus, run folder and more."""
        return [deck, f"--training.dataset={self.data}", f"--job.dump_folder={folder}"] + list(overrides)

    def submit_cpu(self, name, n, args):
        """cpu_reference.sbatch on n tasks; (job id, output file)."""
        output = os.path.join(self.out, f"{name}.out")
        return self.cluster.submit(CPU_SCRIPT, args, tasks(n), output, env=self.env, chdir=ROOT), output

    def ckpt_writer(self, path):
        """The `written by:` line of `meshtrain ckpt inspect` (writer's rank count and degrees)."""
        out = subprocess.run([self.meshtrain, "ckpt", "inspect", path], capture_output=True, text=True).stdout
        return next((line for line in out.splitlines() if line.startswith("written by:")), "")


def cpu_reference(s):
    """4 tasks, 3 steps through srun --mpi=pmix."""
    run = os.path.join(s.out, "run")
    job_id, output = s.submit_cpu("cpu_reference", 4, s.train_args(run, "--training.steps=3"))
    job = s.cluster.wait(job_id)
    log = read(output)
    checks = [(f"job completed ({job})", job.state == "COMPLETED" and job.exit_code == 0),
              ("deck checked for the allocation's 4 tasks", "valid for 4 ranks" in log),
              ("ranks launched by srun", "srun:" in log and "mpirun" not in log),
              ("one 4-rank world: the layout says 'world 4 ranks' once", log.count("world 4 ranks") == 1),
              ("metrics.jsonl logs steps 1-3", logged_steps(run) == [1, 2, 3]),
              ("summary: dp_replicate 4 (the script's data-parallel degree = SLURM_NTASKS)",
               summary(run).get("dp_replicate") == 4)]
    report(checks, log[-4000:])


def preemption(s):
    """USR1 to the job steps while training: save, exit 4, requeue, resume, bitwise equal."""
    steps = 300
    common = ["--checkpoint.enable=true", "--checkpoint.interval=100000", f"--training.steps={steps}",
              "--metrics.log_freq=1", "--validation.enable=false"]
    ref, work = os.path.join(s.out, "uninterrupted"), os.path.join(s.out, "preempted")
    ref_id, ref_output = s.submit_cpu("uninterrupted", 2, s.train_args(ref, *common))
    job_id, output = s.submit_cpu("preempted", 2, s.train_args(work, *common))
    # Signal once training is under way (five steps logged), as Slurm would before a time limit.
    job = s.cluster.wait(job_id, until=lambda j: len(logged_steps(work)) >= 5)
    checks = [(f"job running when signalled ({job})", job.state == "RUNNING")]
    if job.state == "RUNNING":
        s.cluster.run("scancel", "--signal=USR1", job_id)
        job = s.cluster.wait(job_id)
    log = read(output)
    stopped = re.search(r"preempted by signal 10 after step (\d+)", log)
    resumed = re.search(r"resumed from \S+/step-(\d+)\.h5", log)
    checks += [
        (f"job completed after one requeue ({job})", job.state == "COMPLETED" and job.exit_code == 0 and job.restarts == 1),
        ("meshtrain saw SIGUSR1 and saved", stopped is not None),
        ("srun reported the ranks' exit status 4", "Exited with exit code 4" in log),
        ("the script requeued the job", f"requeueing job {job_id}" in log and "was requeued (restart 1)" in log),
        ("the requeued job resumed from the step it stopped at",
         stopped is not None and resumed is not None and int(resumed.group(1)) == int(stopped.group(1))
         and 0 < int(stopped.group(1)) < steps),
        (f"every step 1-{steps} logged once", logged_steps(work) == list(range(1, steps + 1)))]
    ref_job = s.cluster.wait(ref_id)
    checks.append((f"uninterrupted job completed ({ref_job})", ref_job.state == "COMPLETED"))
    if ref_job.state == "COMPLETED" and job.state == "COMPLETED":
        a, b = losses(ref), losses(work)
        checks.append(("losses bitwise equal to the uninterrupted job", set(a) == set(b) and all(a[k] == b[k] for k in a)))
        checks.append(("final parameters bitwise equal", same_final_params(ref, work)))
    report(checks, log[-4000:] + read(ref_output)[-1000:])


def elastic(s):
    """Saved by 2 tasks, resumed by 3."""
    run = os.path.join(s.out, "run")
    # Global batch 12 of micro-batches of 1 divides over 2 and 3 data-parallel ranks.
    common = ["--checkpoint.enable=true", "--checkpoint.interval=100000", "--training.local_batch_size=1",
              "--training.global_batch_size=12", "--validation.enable=false"]
    first_id, first_output = s.submit_cpu("two_tasks", 2, s.train_args(run, *common, "--training.steps=6"))
    first = s.cluster.wait(first_id)
    checks = [(f"2-task job completed ({first})", first.state == "COMPLETED")]
    saved = os.path.join(run, "checkpoints", "step-00000006.h5")
    checks.append(("step 6 saved by 2 ranks", ", 2 ranks," in s.ckpt_writer(saved)))
    second_id, second_output = s.submit_cpu("three_tasks", 3, s.train_args(run, *common, "--training.steps=12"))
    second = s.cluster.wait(second_id)
    log = read(second_output)
    checks += [
        (f"3-task job completed ({second})", second.state == "COMPLETED" and second.exit_code == 0),
        ("it resumed from step 6", re.search(r"resumed from \S+/step-00000006\.h5: step 6\b", log) is not None),
        ("on a 3-rank world", "world 3 ranks" in log and summary(run).get("dp_replicate") == 3),
        ("steps 1-6 then 7-12 logged once each", logged_steps(run) == list(range(1, 13))),
        ("step 12 saved by 3 ranks", ", 3 ranks," in s.ckpt_writer(os.path.join(run, "checkpoints", "step-00000012.h5")))]
    report(checks, read(first_output)[-2000:] + log[-4000:])


def bad_deck(s):
    """A misspelled key fails the job in the deck check, before srun."""
    deck = os.path.join(s.out, "misspelled.toml")
    with open(DECK) as f, open(deck, "w") as g:
        g.write(f.read().replace("\nsteps = ", "\nstpes = "))
    run = os.path.join(s.out, "run")
    job_id, output = s.submit_cpu("bad_deck", 2, s.train_args(run, deck=deck))
    job = s.cluster.wait(job_id)
    log = read(output)
    checks = [(f"job failed with meshtrain's bad-input status 2 ({job})", job.state == "FAILED" and job.exit_code == 2),
              ("the output names the deck and the key", deck in log and "stpes" in log),
              ("it stopped in the deck check, before srun started any rank",
               "srun" not in log and "world " not in log and not os.path.exists(run))]
    report(checks, log[-4000:])


def startup_relaunch(s):
    """A rank that dies in start-up (SIGSEGV before training, as Open MPI 4.1's TCP start-up race
    kills one) is launched again once on the same nodes; one that dies every time fails the job."""
    checks, logs = [], ""
    for name, crashes, want_state in (("once", 1, "COMPLETED"), ("always", 99, "FAILED")):
        marks = os.path.join(s.out, name + ".marks")
        wrapper = os.path.join(s.out, name + "-meshtrain.sh")
        with open(wrapper, "w") as f:
            # Task 1 of a train step dies by SIGSEGV before MPI_Init (task 0 then waits in MPI_Init
        # until srun ends it MESHTRAIN_SRUN_WAIT s later; the default is 60) while it has crashed fewer than `crashes` times.
            f.write(f"""#!/bin/bash
if [ "$1" = train ] && [ "${{SLURM_PROCID:-}}" = 1 ] && [ "$(cat {marks} 2>/dev/null | wc -l)" -lt {crashes} ]; then
  echo crash >> {marks}; kill -SEGV $$
fi
exec {s.meshtrain} "$@"
""")
        os.chmod(wrapper, 0o755)
        run = os.path.join(s.out, name)
        output = os.path.join(s.out, name + ".out")
        job_id = s.cluster.submit(CPU_SCRIPT, s.train_args(run, "--training.steps=3"), tasks(2), output,
                                  env=dict(s.env, MESHTRAIN_BIN=wrapper, MESHTRAIN_SRUN_WAIT="3",
                                           MESHTRAIN_NODE_DOWN_WAIT="2"), chdir=ROOT)
        job = s.cluster.wait(job_id)
        log = read(output)
        logs += log[-2500:]
        relaunched = log.count("start-up failure: the step failed")
        checks += [(f"{name}: job {want_state} ({job})", job.state == want_state),
                   (f"{name}: srun saw task 1 die by SIGSEGV", "task 1: Segmentation fault" in log),
                   (f"{name}: the step was launched again once (got {relaunched})", relaunched == 1)]
        if crashes == 1:
            checks += [("once: the second launch trained steps 1-3", logged_steps(run) == [1, 2, 3])]
        else:
            checks += [("always: then the job stopped, not relaunched again",
                        "not a node failure, not relaunched" in log and not logged_steps(run))]
    report(checks, logs)


def srun_tasks(log):
    """Task ids in srun's end-of-task lines ("srun: error: node: tasks 1-3,5: Exited with exit code 2",
    "...: tasks 1-7: Terminated"): every task srun started and saw end abnormally."""
    ids = set()
    for ranges in re.findall(r"srun: error: \S+: tasks? ([0-9,-]+): ", log):
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            ids.update(range(int(lo), int(hi or lo) + 1))
    return ids


def gpu_layout(s):
    """The GPU scripts as written: layout / deck check, then meshtrain's device check stops the ranks."""
    # No --gpus override: the cluster's placeholder GPUs grant the scripts' own requests. A
    # corpus that does not exist keeps a machine with real GPUs from starting to train.
    missing = os.path.join(s.out, "no-such-corpus.h5")
    env = dict(s.env, TOPOLOGY_CONF=os.path.join(ROOT, "inputs", "topology", "h100_2nodes_per_rack.conf"))
    checks, logs = [], ""
    for script, first_step in (("gpu_cluster.sbatch", "world 8 ranks"), ("llama3_1b_gpu.sbatch", "valid for 8 ranks")):
        output = os.path.join(s.out, script + ".out")
        # 12 CPUs per task as written would need 96 CPUs; the test node has 8.
        job_id = s.cluster.submit(os.path.join(ROOT, "jobs", script), ["", f"--training.dataset={missing}"],
                                  ["--cpus-per-task=1"], output, env=env, chdir=ROOT)
        job = s.cluster.wait(job_id)
        log = read(output)
        logs += log[-3000:]
        stop = re.search(r'\[training\] device: "cuda" but|no-such-corpus\.h5', log)
        checks += [(f"{script}: job failed with status 2 ({job})", job.state == "FAILED" and job.exit_code == 2),
                   (f"{script}: its first step printed '{first_step}'", first_step in log),
                   (f"{script}: srun started tasks 0-7, which ended (got {sorted(srun_tasks(log))})",
                    srun_tasks(log) == set(range(8))),
                   (f"{script}: a rank stopped with status 2 in meshtrain's preflight (the device check; the "
                    "missing corpus where a GPU is visible)",
                    stop is not None and re.search(r"srun: error: \S+: tasks? [0-9,-]+: Exited with exit code 2", log) is not None)]
    report(checks, logs)


SCENARIOS = {f.__name__: f for f in (cpu_reference, preemption, elastic, bad_deck, startup_relaunch, gpu_layout)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--state", required=True, help="the slurm_cluster fixture's state file")
    p.add_argument("--meshtrain", required=True)
    p.add_argument("--data", required=True, help="token store (the tiny_corpus fixture's tiny.h5)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    t0 = time.monotonic()
    SCENARIOS[args.scenario](Scenario(args))
    print(f"{args.scenario}: {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
