#!/usr/bin/env python3
"""jobs/ on a real multi-node Slurm cluster of network namespaces (scripts/slurm/start-multinode.sh):
4 nodes in 2 racks, Open MPI over TCP between them.

Scenarios (one per ctest test):
  placement  jobs/cpu_reference.sbatch on 4 nodes x 2 tasks with tp 2 x FSDP 4: the layout sees 4
             nodes in 2 racks; every rank's host and rack (layout.csv) are where srun put it and
             what SLURM_TOPOLOGY_ADDR says; tp groups stay inside nodes; the losses equal the same
             layout run on one host (mpirun); `meshtrain layout --topology` with the topology
             `scontrol show topology` reports gives the placement the job used.
  node_kill  a `--no-kill` job (28 steps, checkpoint every 10) loses every process of one node
             mid-run: the job completes its steps on the other 3 nodes inside the same allocation
             (no requeue), and its losses after the relaunch equal a run resumed from the same
             checkpoint on 6 ranks (<= 1e-5).
  link_cut   the same with the node's link cut (no process dies): the ranks stop within the
             deadline ([comm] train_timeout_seconds) naming the group, no meshtrain process is
             left on the cut node, and the job recovers as in node_kill.
Each failure scenario prints the time from the failure to the first step trained again and the
steps lost. The node is restored afterwards (scripts/slurm/multinode-node.sh restore).
Exit 77 (SKIPPED) when the cluster could not start here (the state file says why).

usage: cluster_jobs.py SCENARIO --state FILE --meshtrain BIN --data H5 --out DIR
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM = os.path.join(ROOT, "scripts", "slurm")
DECK = os.path.join(ROOT, "tests", "equivalence", "tiny.toml")
# [comm] train_timeout_seconds of the failure runs: under the test cluster's SlurmdTimeout (10 s),
# so that the surviving ranks' watchdog stops them (naming the group) before Slurm can declare the
# cut-off node down and end the step itself — with both at 10 s that race went to Slurm at times
# (no watchdog line in the log). Steps take about 0.5 s here, and the first step after a (re)start
# has no deadline, so 5 s cannot fire on a healthy run.
TIMEOUT_S = 5
STEPS = 28  # of the failure runs: killed at step 15 or later, resumed at step 10


def state(path):
    try:
        return dict(l.strip().split("=", 1) for l in open(path) if "=" in l)
    except OSError:
        return {"status": "skip", "reason": f"{path}: no cluster state (the fixture did not run)"}


def sh(cmd, env, check=True, **kw):
    return subprocess.run(cmd, env=env, check=check, text=True, capture_output=True, **kw)


class Cluster:
    def __init__(self, st):
        self.env = dict(os.environ, SLURM_CONF=st["SLURM_CONF"], PATH=os.environ["PATH"] + ":/usr/sbin:/sbin")
        self.jobs = []

    def submit(self, args, out):
        os.makedirs(out, exist_ok=True)
        r = sh(["sbatch", "--parsable", f"--output={out}/job-%j.out", *args], self.env, cwd=ROOT)
        job = r.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job, os.path.join(out, f"job-{job}.out")

    def job_field(self, job, key):
        r = sh(["scontrol", "show", "job", job], self.env, check=False)
        m = re.search(rf"\b{key}=(\S+)", r.stdout)
        return m.group(1) if m else ""

    def wait(self, job, limit):
        end = time.time() + limit
        while time.time() < end:
            if sh(["squeue", "-h", "-j", job], self.env, check=False).stdout.strip() == "":
                return self.job_field(job, "JobState")
            time.sleep(0.5)
        return "TIMEOUT"

    def cancel_all(self):
        for j in self.jobs:
            sh(["scancel", j], self.env, check=False)


def losses(metrics):
    """step -> loss, the last record of each step (a relaunch repeats the steps after its checkpoint)."""
    out = {}
    for line in open(metrics):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            out[r["step"]] = r["loss"]
    return out


def compare(a, b, steps, what):
    worst = max(abs(a[s] - b[s]) for s in steps)
    print(f"{what}: {len(steps)} steps, max |loss difference| {worst:.2e}")
    return worst <= 1e-5


def mpirun(meshtrain, np_, args, env=None):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(np_), meshtrain, "train",
           "--deck", DECK, *args]
    r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        sys.exit(f"mpirun -np {np_} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def placement(a, cl, st):
    out = os.path.join(a.out, "placement")
    shutil.rmtree(out, ignore_errors=True)
    train = [f"--training.dataset={a.data}", "--training.steps=4", "--training.global_batch_size=16",
             "--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=-1",
             "--parallelism.data_parallel_replicate_degree=1", "--validation.enable=false"]
    job, log = cl.submit(["--nodes=4", "--ntasks-per-node=2", "jobs/cpu_reference.sbatch", DECK, *train,
                          f"--job.dump_folder={out}/run"], out)
    result = cl.wait(job, 120)
    text = open(log).read() if os.path.exists(log) else ""
    ok = result == "COMPLETED"
    print(f"job {job}: {result}")
    ok &= "world 8 ranks, 4 node(s), 2 rack(s)" in text
    print("layout report: 'world 8 ranks, 4 node(s), 2 rack(s)'", "seen" if ok else "MISSING")
    # Where srun puts 8 tasks on these 4 nodes (block distribution), and what Slurm says of each.
    probe = sh(["srun", "--nodes=4", "--ntasks-per-node=2", "sh", "-c",
                'echo "$SLURM_PROCID $(hostname) $SLURM_TOPOLOGY_ADDR"'], cl.env).stdout.split("\n")
    where = {int(p.split()[0]): (p.split()[1], p.split()[2]) for p in probe if p.strip()}
    rows = list(csv.DictReader(open(f"{out}/run/layout.csv")))
    rack_names = {}
    for r in rows:
        host, addr = where[int(r["rank"])]
        rack = addr.split(".")[-2]  # top.rackR.node
        same = r["host"] == host and addr.endswith("." + host) and rack_names.setdefault(r["rack"], rack) == rack
        if not same:
            print(f"rank {r['rank']}: layout says {r['host']} rack {r['rack']}, Slurm says {host} {addr}")
            ok = False
    ok &= len(set(rack_names.values())) == 2 and len({r["host"] for r in rows}) == 4
    tp_hosts = {}
    for r in rows:
        tp_hosts.setdefault(r["tp_group"], set()).add(r["host"])
    ok &= all(len(h) == 1 for h in tp_hosts.values())
    print(f"ranks on hosts/racks as SLURM_TOPOLOGY_ADDR says: racks {sorted(set(rack_names.values()))}; "
          f"tp groups inside one node: {all(len(h) == 1 for h in tp_hosts.values())}")
    mpirun(a.meshtrain, 8, [*train, f"--job.dump_folder={out}/onehost"])
    one, multi = losses(f"{out}/onehost/metrics.jsonl"), losses(f"{out}/run/metrics.jsonl")
    ok &= compare(multi, one, sorted(one), "4 nodes against one host, tp 2 x FSDP 4")
    topo = f"{out}/scontrol_topology.txt"
    open(topo, "w").write(sh(["scontrol", "show", "topology"], cl.env).stdout)
    r = subprocess.run([a.meshtrain, "layout", "--deck", DECK, "--world-size", "8", "--topology", topo,
                        "--topology.ranks_per_node=2", *train, "--csv", f"{out}/predicted.csv"],
                       text=True, capture_output=True, cwd=ROOT)
    same = r.returncode == 0 and list(csv.DictReader(open(f"{out}/predicted.csv"))) == rows
    print(f"meshtrain layout --topology (scontrol show topology) gives the job's placement: {same}")
    if not (ok and same):
        dump_failure(cl, log)
    return ok and same


def dump_failure(cl, log):
    """What a failed job leaves: its log's tail (Open MPI prints a crashed rank's backtrace there)
    and each node's slurmd lines about tasks that died by a signal."""
    text = open(log).read() if os.path.exists(log) else "(no job log)"
    print(f"--- {log} (last 60 lines)")
    print("\n".join(text.splitlines()[-60:]))
    logs = os.path.join(os.path.dirname(cl.env["SLURM_CONF"]), "..", "log")
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        if name.startswith("slurmd-"):
            lines = [l for l in open(os.path.join(logs, name), errors="replace") if "died by signal" in l]
            for l in lines[-3:]:
                print(f"--- {name}: {l.rstrip()}")


def failure(a, cl, st, how):
    out = os.path.join(a.out, how)
    shutil.rmtree(out, ignore_errors=True)
    train = [f"--training.dataset={a.data}", f"--training.steps={STEPS}", "--training.global_batch_size=48",
             "--training.seq_len=64", "--model.dim=128", "--model.n_layers=4", "--checkpoint.enable=true",
             "--checkpoint.interval=10", f"--comm.train_timeout_seconds={TIMEOUT_S}", "--validation.enable=false"]
    job, log = cl.submit(["--no-kill", "--nodes=4", "--ntasks-per-node=2", "jobs/cpu_reference.sbatch", DECK, *train,
                          f"--job.dump_folder={out}/run"], out)
    metrics = f"{out}/run/metrics.jsonl"
    end = time.time() + 120
    ended = False
    while time.time() < end and (not os.path.exists(metrics) or len(losses(metrics)) < 15):
        # A step that ended before the failure was injected is the job's own failure: say so now,
        # not after the deadline.
        if ended or (os.path.exists(log) and "not a node failure, not relaunched" in open(log).read()):
            break
        ended = cl.wait(job, 0.01) != "TIMEOUT"
        time.sleep(0.2)
    trained = max(losses(metrics), default=0) if os.path.exists(metrics) else 0
    if trained < 15:
        print(f"the job did not reach step 15 ({trained} steps); job {job}: {cl.job_field(job, 'JobState')}")
        dump_failure(cl, log)
        sys.exit(1)
    victim = 3
    t_fail = time.time()
    subprocess.run([f"{SLURM}/multinode-node.sh", "kill" if how == "node_kill" else "cut", str(victim)], check=True)
    node = f"mtmn-n{victim}"
    # The cut-off node's ranks must have stopped (their watchdog fires after TIMEOUT_S) by 20 s
    # later: looked at then, whether the relaunched job is still running or has already ended.
    leftover_at = t_fail + TIMEOUT_S + 20

    def meshtrain_left():
        return [p for p in sh(["ip", "netns", "pids", node], cl.env).stdout.split()
                if open(f"/proc/{p}/comm").read().strip() == "meshtrain"]

    leftover, t_again = None, None
    while time.time() < t_fail + 240 and cl.wait(job, 0.01) == "TIMEOUT":
        text = open(metrics).read()
        if t_again is None and text.count('"step":11,') >= 2:
            t_again = time.time() - t_fail
        if how == "link_cut" and leftover is None and time.time() > leftover_at:
            leftover = meshtrain_left()
        time.sleep(0.2)
    if how == "link_cut" and leftover is None:  # the job ended first
        time.sleep(max(0.0, leftover_at - time.time()))
        leftover = meshtrain_left()
    result = cl.job_field(job, "JobState")
    restarts = cl.job_field(job, "Restarts")
    text = open(log).read()
    print(f"job {job}: {result}, Restarts={restarts}")
    for line in text.splitlines():
        if line.startswith("node failure") or "watchdog" in line or line.startswith("resumed from"):
            print("  " + line)
    ok = result == "COMPLETED" and restarts == "0" and f"node failure: lost {node}" in text
    ok &= "resumed from" in text and "step-00000010.h5" in text
    if how == "link_cut":
        named = re.search(rf"watchdog: .+? on dimension '\w+' group \d+ .* did not complete within {TIMEOUT_S} s", text) is not None
        print(f"ranks stopped within the deadline naming the group: {named}; meshtrain processes left on {node}: "
              f"{leftover if leftover is not None else 'not checked'}")
        ok &= named and leftover == []
    # The reference: the step-10 checkpoint resumed on 6 ranks of one host.
    ref = f"{out}/reference"
    os.makedirs(f"{ref}/checkpoints")
    shutil.copy(f"{out}/run/checkpoints/step-00000010.h5", f"{ref}/checkpoints/")
    open(f"{ref}/checkpoints/latest", "w").write("step-00000010.h5")
    mpirun(a.meshtrain, 6, [*train, "--training.local_batch_size=2", "--parallelism.data_parallel_replicate_degree=6",
                            f"--job.dump_folder={ref}"])
    ok &= compare(losses(metrics), losses(f"{ref}/metrics.jsonl"), range(11, STEPS + 1),
                  f"steps 11-{STEPS} after the relaunch against a 6-rank resume of the same checkpoint")
    print(f"failure to training again: {t_again:.1f} s (measured from the {how.replace('_', ' ')}); "
          f"steps lost: {trained - 10} (trained to step {trained} before, resumed at the step-10 checkpoint; "
          f"interval 10)" if t_again else "training again: not seen")
    ok &= t_again is not None and trained - 10 <= 10
    r = subprocess.run([f"{SLURM}/multinode-node.sh", "restore", str(victim)], text=True, capture_output=True)
    print(f"node {node} restored: {r.returncode == 0}")
    if not ok:
        dump_failure(cl, log)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["placement", "node_kill", "link_cut"])
    ap.add_argument("--state", required=True)
    ap.add_argument("--meshtrain", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    st = state(a.state)
    if st.get("status") != "up":
        print(f"SKIPPED: {st.get('reason', 'the multi-node cluster is not up')}")
        sys.exit(77)
    cl = Cluster(st)
    try:
        ok = placement(a, cl, st) if a.scenario == "placement" else failure(a, cl, st, a.scenario)
    finally:
        cl.cancel_all()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
