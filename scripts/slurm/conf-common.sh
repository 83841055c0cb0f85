# shellcheck shell=bash
# Sourced by start-cluster.sh and start-multinode.sh: what both test clusters share — their
# slurm.conf lines and a private munged.

# Starts munged with the key, pid, log and seed files under DIR (DIR/munge/munge.key,
# DIR/run/munged.pid, DIR/log/munged.log) on SOCKET and waits up to 5 s until it answers.
# Status 1 (the reason on stdout) when it does not start or answer.
start_test_munged() {
  local dir=$1 socket=$2 i
  munged --key-file="$dir/munge/munge.key" --socket="$socket" --pid-file="$dir/run/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" </dev/null >/dev/null 2>&1 ||
    { echo "munged did not start"; return 1; }
  for ((i = 0; i < 50; i++)); do munge -S "$socket" -n </dev/null >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "munged does not answer on $socket"
  return 1
}

slurm_test_conf_common() {
  cat <<'CONF'
MailProg=/bin/true
# No cgroups: a container may have none to delegate, and the tests need no confinement.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Trust the node lines over the hardware (more CPUs than cores, placeholder GPUs).
SlurmdParameters=config_overrides
ReturnToService=2
CONF
}
