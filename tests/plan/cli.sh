#!/bin/sh
# meshtrain plan's command line: bad input gives one line and status 2 (no --gpus, an unknown
# hardware entry, a --fixed key the planner does not vary, a deck whose own layout is invalid),
# --write-deck writes a deck that validates for the same device count, and --topology's racks
# name the tier a group crosses.
# usage: cli.sh MESHTRAIN SOURCE_DIR OUT_DIR
set -u
B=$1
cd "$2" || exit 1
OUT=$3
D=inputs/llama3_8b_fsdp8.toml
mkdir -p "$OUT"
fails=0
refused() {  # refused "what must appear" args...
  want=$1
  shift
  out=$("$B" plan "$@" 2>&1)
  rc=$?
  if [ $rc -ne 2 ] || ! printf '%s\n' "$out" | grep -q "$want"; then
    echo "FAIL: meshtrain plan $*: status $rc, output: $out"
    fails=$((fails + 1))
  else
    echo "ok: meshtrain plan $* -> $(printf '%s\n' "$out" | head -1)"
  fi
}
refused 'usage: meshtrain plan' --deck $D
refused 'neither a catalog entry' --deck $D --gpus 8 --hardware tpu_v5
refused 'not a key the planner varies' --deck $D --gpus 8 --fixed tp
refused 'global_batch_size: 7 is not divisible' --deck $D --gpus 8 --fixed all --training.global_batch_size=7
refused 'cannot read deck' --deck no_such_deck.toml --gpus 8
if "$B" plan --deck $D --gpus 16 --top 2 --write-deck "$OUT/best16.toml" > /dev/null &&
   "$B" deck check --deck "$OUT/best16.toml" --world-size 16 > /dev/null; then
  echo "ok: --write-deck's deck validates on 16 devices"
else
  echo "FAIL: --write-deck"
  fails=$((fails + 1))
fi
# --topology: groups that leave a rack of 2 nodes are reported on the spine.
if "$B" plan --deck inputs/llama3_70b_tp4_fsdp8.toml --gpus 32 --fixed all \
     --topology inputs/topology/h100_2nodes_per_rack.conf | grep -q 'fsdp@spine'; then
  echo "ok: --topology puts the 32-GPU fsdp group on the spine"
else
  echo "FAIL: --topology"
  fails=$((fails + 1))
fi
[ $fails -eq 0 ] && echo "plan command line ok"
exit $fails
