"""Helpers for the real-Slurm tests: the cluster the ctest fixture started (its state file), job
submission with sbatch, job state from `scontrol show job` (the test cluster keeps no accounting
database, so there is no sacct), and cancelling every job a test submitted when it fails.

Exit status 77 (ctest SKIP_RETURN_CODE) when the fixture could not start a cluster here, with
its reason on stdout."""
import atexit
import os
import re
import signal
import subprocess
import sys
import time

SKIP = 77
# States after which a job will not run again (a requeued job passes through PENDING instead).
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED"}


class Job:
    """One `scontrol show job` record: state (e.g. "COMPLETED"), restarts (requeue count),
    exit_code (the batch script's exit status), signal (the signal that ended it, 0 if none)."""

    def __init__(self, record):
        def field(key):
            m = re.search(rf"(?:^|\s){key}=(\S+)", record)
            if not m:
                raise RuntimeError(f"scontrol show job: no {key}= in: {record.strip()}")
            return m.group(1)
        self.state = field("JobState")
        self.restarts = int(field("Restarts"))
        self.exit_code, self.signal = (int(v) for v in field("ExitCode").split(":"))

    def __repr__(self):
        return f"{self.state} (exit code {self.exit_code}, signal {self.signal}, restarts {self.restarts})"


class Cluster:
    """The test cluster named by the fixture's state file (key=value lines written by
    scripts/slurm/start-cluster.sh). Construction exits 77 when that file says the cluster could
    not start here, and fails when it is missing or says the start failed. Every job submitted
    through it is cancelled when the test exits before the job finished (a failed check, an
    exception, ctest's timeout signal)."""

    def __init__(self, state_file):
        if not os.path.exists(state_file):
            print(f"FAIL {state_file}: no cluster state (the slurm_cluster fixture did not run)")
            sys.exit(1)
        state = dict(line.rstrip("\n").split("=", 1) for line in open(state_file) if "=" in line)
        if state.get("status") == "skip":
            print(f"SKIPPED: no Slurm test cluster on this machine: {state.get('reason', '?')}")
            sys.exit(SKIP)
        if state.get("status") != "up":
            print(f"FAIL {state_file}: cluster status '{state.get('status')}': {state.get('reason', '')}")
            sys.exit(1)
        self.partition = state["partition"]
        # Only our SLURM_CONF: a test run from inside a site allocation must not inherit its job.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        self.env["SLURM_CONF"] = state["SLURM_CONF"]
        self.env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        self.jobs = []
        atexit.register(self.cancel_unfinished)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    def run(self, *cmd):
        """Runs a Slurm client command against the test cluster; its stdout (raises on failure)."""
        res = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def submit(self, script, args, options, output, env=None, chdir="."):
        """sbatch `options` SCRIPT ARGS with stdout and stderr to `output` and cwd `chdir`;
        `env` adds variables to the job's environment (sbatch exports ours). Returns the job id."""
        out = subprocess.run(["sbatch", "--parsable", f"--partition={self.partition}", f"--output={output}",
                              f"--chdir={chdir}"] + options + [script] + args,
                             env=dict(self.env, **(env or {})), capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch {script}: exit {out.returncode}: {out.stderr.strip()}")
        job_id = out.stdout.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def job(self, job_id):
        """The job's current record (Job)."""
        return Job(self.run("scontrol", "show", "job", "--oneliner", job_id))

    def wait(self, job_id, until=None, limit_s=300):
        """Polls the job until it reached a final state (or until(job) holds); returns its Job.
        limit_s only keeps a hung cluster from hanging the test: it raises, it asserts nothing."""
        deadline = time.monotonic() + limit_s
        while True:
            job = self.job(job_id)
            if job.state in FINAL_STATES or (until and until(job)):
                return job
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} still {job} after {limit_s} s")
            time.sleep(0.2)

    def cancel_unfinished(self):
        """scancel every submitted job not yet in a final state (at exit)."""
        for job_id in self.jobs:
            try:
                if self.job(job_id).state not in FINAL_STATES:
                    print(f"cancelling job {job_id}")
                    subprocess.run(["scancel", job_id], env=self.env)
            except RuntimeError:
                pass  # already purged from the controller
