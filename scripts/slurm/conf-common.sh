# shellcheck shell=bash
# Sourced by start-cluster.sh and start-multinode.sh: the slurm.conf lines both test clusters share.
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
