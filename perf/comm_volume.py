#!/usr/bin/env python3
"""perf/comm_volume: checks the bytes that rank 0's gradient, parameter and activation collectives
send per training step (the "comm_bytes" field of metrics.jsonl) against the ring-algorithm volumes
computed here, independently, from the model's shape: DDP, ZeRO-1, ZeRO-2, FSDP (ZeRO-3, also
with gradient accumulation and with fsdp_reshard_after_forward=never), HSDP (2 x N/2) and tensor
parallelism (TP 2 under FSDP, ZeRO-2, HSDP and DDP; TP alone; without sequence parallelism;
without loss parallelism; with activation checkpointing; with uneven vocabulary / FFN splits) and
pipeline parallelism (pp alone; pp 2 under FSDP, DDP, ZeRO-2 and TP 2; 1F1B, GPipe,
Interleaved1F1B, ZBVZeroBubble; two rounds of accumulation) at 4 and 8 ranks, and context
parallelism (cp 2 x FSDP 2 all-gather; cp 4 ring; cp 2 Ulysses under HSDP; cp 2 x TP 2 ring; cp 2
all-gather with full activation checkpointing and accumulation; cp 2 x pp 2 ring) at 4 ranks, and
Mixture of Experts (experts over fsdp; ep 2; ep 2 under HSDP; ep 4 with full activation
checkpointing and accumulation) at 4 ranks.
Every counter must equal its formula exactly; prints a table, writes JSON and exits 1 on any
mismatch (or failed run).

Formulas (4-byte floats; units = embedding, each block, norm + output head; align16(x) = x rounded
up to 16 elements; S_u = sum over the unit's parameters p of align16(ceil(rows_p / N) * row_elems_p)
with N = the fsdp group size; G = sum over all parameters of align16(numel_p); M = gradient
accumulation micro-batches; R = dp_replicate size), bytes per step per rank:
  DDP     dp_replicate all_reduce   2*4*G*(R-1)/R
  ZeRO-1  fsdp reduce_scatter       sum_u 4*S_u*(N-1)                      (once per step)
          fsdp all_gather           sum_u 4*S_u*(N-1)                      (once per step)
  ZeRO-2  fsdp reduce_scatter       M * sum_u 4*S_u*(N-1)
          fsdp all_gather           sum_u 4*S_u*(N-1)                      (once per step)
  FSDP    fsdp all_gather           M * (sum_u + sum_{resharded u}) 4*S_u*(N-1)
          fsdp reduce_scatter       M * sum_u 4*S_u*(N-1)
  HSDP    FSDP's terms over N = dp_shard, plus dp_replicate all_reduce sum_u 2*4*S_u*(R-1)/R
Resharded units: every unit but the one holding the output head (reshard default/always), none
(never). The last step's record is compared (steady state: ZeRO-1/2's parameter all-gathers of
step s complete during step s+1).

Tensor parallelism of degree T (dp_replicate x dp_shard = ranks / T): the terms above apply
unchanged to tp rank 0's local shapes (ceil(rows / T) rows of tok_embeddings, output, wq, wk, wv,
w1, w3; ceil(cols / T) columns of wo, w2; norms, q_norm, k_norm whole), plus on group tp, with
A = 4*b*s*h (one [b*s, h] activation; b = local batch, s = seq_len, h = dim), L blocks, V the
vocabulary, C = blocks recomputed in backward (activation checkpointing none: 0, full: L,
selective k: blocks with index % k == 0), K = 4L + 2 + 2C calls per micro-batch (per block 2 in
forward, 2 in backward; embedding and output head 1 each; 2 per recomputed block), and per call
ag(x) = floor(x*(T-1)/T) (all_gather of output x, reduce_scatter of input x),
ar(x) = floor(2*x*(T-1)/T) (all_reduce of x):
  SP      tp all_gather         M * (K * ag(A) + ag(Z))                (sequence parallelism, default)
          tp reduce_scatter     M * K * ag(A)
  no SP   tp all_reduce         M * K * ar(A)                          (enable_sequence_parallel=false)
          tp all_gather         M * ag(Z)
  both    tp all_reduce       + ar(4*E)                                (once per step, if E > 0)
Pipeline parallelism of degree P (pp layouts, 6 blocks): rank 0 holds pp rank 0's stages, split by
TorchTitan's rule (the embedding and the output head count as one layer each; L + 2 effective
layers over P*v stages, the first stages taking the remainder; loop placement: stages 0, P, 2P, ...;
V placement (ZBVZeroBubble): stages 0 and 2P - 1). The data-parallel and tp terms above then apply to
that rank's units only, with, under pp, every reduction and ZeRO-3 all-gather once per step (M = 1,
no re-gather: gathered parameters stay until the step's last backward), K = 4*L_0 + [embedding] +
[head] + 2*C_0 over the rank's L_0 blocks, and the loss gather only on the last stage. On group pp:
  PP      pp send_recv          M_pp * A_pp * sum over rank 0's stages x of ([x + 1 on another rank]
                                + [x - 1 on another rank])
with M_pp = micro-batches per step (per round times rounds), A_pp = 4*b_mb*s*h / T under sequence
parallelism (the token shard each tp rank exchanges), 4*b_mb*s*h without, b_mb the micro-batch size.
Z = the loss's gathered [T, b*s, 3] floats, 4*T*b*s*3 (vocab-parallel cross-entropy), or the
gathered logits [T, b*s, ceil(V/T)], 4*T*b*s*ceil(V/T) (disable_loss_parallel=true). E = the
elements rank 0 holds of the partial-gradient replicated parameters, all-reduced over tp after
the data-parallel reduction: every attention_norm, ffn_norm and norm weight with SP, every q_norm
and k_norm (Qwen3) always; the whole parameter when dp_shard = 1, else its dim-0 shard
min(ceil(rows / dp_shard), rows) rows (not padded). Validation is off (not counted in a step).

Context parallelism of degree CP (context_parallel_degree): each rank holds s = seq_len / CP tokens
of each of its samples, so every s above (tp's A and Z, pp's A_pp) is seq_len / CP; parameters
shard over fsdp = dp_shard x CP, so N above is dp_shard * CP (FSDP even when dp_shard = 1) and E's
shard is over that N; samples and M still come from dp_replicate x dp_shard. On group cp, per
attention layer and micro-batch, with B_a = 4 (the activation dtype: f32 on the cpu device), the
dK/dV partial sums always f32 (4 bytes), Hq_t = n_heads / T and Hkv_t = n_kv_heads / T the heads
of a tp rank, Dh = head_dim, b the micro-batch's samples (b_mb under pp), KV = 2*b*s*Hkv_t*Dh the
packed K and V elements of one rank, L the rank's blocks and C its recomputed blocks (their
forward, and so its collectives, runs again in backward), M the micro-batches per step (M_pp
under pp), and per call a2a(x) = x*(CP-1)/CP (an all-to-all of x bytes keeps 1/CP of them):
  allgather  cp all_gather      M * (2L + C) * (CP-1)*KV*B_a           (K/V gathered in forward,
                                                                        again in backward)
             cp reduce_scatter  M * L * (CP-1)*KV*4                    (dK/dV back to their owners)
  alltoall   cp send_recv       M * ((2L + C) * (CP-1)*KV*B_a + L * (CP-1)*KV*4)
                                (ring: CP-1 hops of K/V per forward pass; backward CP-1 hops of
                                K/V and CP-1 hops of the dK/dV partial sums)
  ulysses    cp all_to_all      M * (2L + C) * 2 * (a2a(b*s*Hq_t*Dh*B_a) + a2a(b*s*Hkv_t*Dh*B_a))
                                (forward: q, k, v to head shards and the output back; backward:
                                dout to head shards and dq, dk, dv back)

Mixture of Experts (layouts moe-*: 4 blocks, the first dense; 8 experts, top-2, width 48, one
shared expert; [debug] moe_force_load_balance, so the routing is known from the token positions):
a MoE block's unit holds the router gate [E, D], the shared experts' w1 / w3 [n_s*H_e, D] and w2
[D, n_s*H_e], and the routed experts w1 / w3 [E/ep, H_e, D] and w2 [E/ep, D, H_e]. With ep = 1
all of them shard over fsdp as above. With ep > 1 the routed experts form units of their own,
sharded over efsdp = N / ep (the data-parallel terms above over efsdp, their HSDP all-reduce on
dp_replicate), and the rest over fsdp = N. On group ep, per MoE block and micro-batch: the
per-expert counts all_to_all a2a(4*E), and the rows: rank 0 routes token position t's choice j to
expert (t*k + j) % E, held by ep rank expert // (E/ep), so it sends X = b * #{(t, j): owner != 0}
rows to other ranks and, since every rank holds the same positions, receives (and returns)
Y = (ep-1) * b * #{(t, j): owner == 0}; each row is 4*D bytes:
  EP      ep all_to_all         M * L_moe * ((1 + C') * a2a(4*E) + (2 + C') * 4*D*(X + Y))
with C' = 1 when full activation checkpointing recomputes the blocks (their forward exchanges
again), else 0 (backward reuses the forward's counts). The logged tokens per expert
(moe_tokens_per_expert) must equal the same positional routing summed over the step's sequences.

Muon ([optimizer] name = "Muon"; layouts muon-tp, muon-moe-ep): each 2-D hidden weight and each routed expert is
dealt, in model order, to the (shard rank s, tp rank t) of its shard group (fsdp, or efsdp for
routed experts; N_g ranks) x tp (T ranks) with the least Newton-Schulz work so far
(5 * (4 k^2 l + 2 k^3), k/l = min/max of its global [rows, cols]); a matrix one shard rank holds
whole stays with that rank. Per step, rank 0 (s = 0, t = 0) sends, in float32 (4 bytes/element),
with piece_k(x) = the elements of matrix x in shard rank k's dim-0 rows of the tp-local tensor:
  MUON    <g> all_to_all  4 * (sum over x with s(x) != 0 of piece_0(x)        (its rows to the owner)
                               + sum over x with s(x) == 0 of sum_{k != 0} piece_k(x))  (results back)
          tp all_to_all   4 * (sum over tp-split x with s(x) == 0, t(x) != 0 of its tp-local elements
                               + sum over x with s(x) == 0, t(x) == 0 of (T-1) slabs back, a matrix
                               replicated over tp (router, experts) whole: (T-1) * rows * cols)
(the owner of a tp-split matrix receives the others' slabs, assembles and orthogonalizes it).

usage: /usr/bin/python3 perf/comm_volume.py [--ranks 4 8] [--layouts ddp fsdp tp ...] [--variants-ranks 4] [--steps 3]
           [--deck tests/equivalence/tiny.toml] [--decks tiny tied debug qwen3] [--local-batch 2]
           [--data H5] [--out DIR] [--json PATH] [--binary build/bin/meshtrain] [--timeout S]
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from fractions import Fraction

try:
    import tomllib
except ImportError:  # Python < 3.11: the resolved deck's flat `key = scalar` lines suffice
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOAT_BYTES = 4
ALIGN = 16

# name -> (dp_replicate, dp_shard, zero_stage, micro-batches, reshard[, tensor-parallel options]);
# "N" = the rank count. TP options: tp (degree), sp (enable_sequence_parallel, default true),
# loss_parallel (not disable_loss_parallel, default true), ac (activation_checkpoint mode, default
# none), ac_option (selective_ac_option), model ({key: value} --model overrides; tp-uneven: vocabulary
# and FFN hidden units that tp does not divide, tp rank 0 holding the larger chunk). The
# data-parallel degrees of a TP layout multiply to N / tp; tp-only (tp = N) raises n_heads /
# n_kv_heads to tp where tp does not divide them (head_overrides). cp (context_parallel_degree)
# and rotate (context_parallel_rotate_method): the degrees then multiply to N with cp.
# Layouts that change one knob of a base layout of the same family; the base layouts (ddp, zero1,
# zero2, fsdp, hsdp, tp, tp-only, tp-hsdp, pp, pp-fsdp, pp-tp) carry the scaling with N.
VARIANTS = {"ddp-ga2", "zero1-ga2", "zero2-ga2", "fsdp-ga2", "fsdp-never", "hsdp-ga2", "tp-nosp", "tp-noloss", "tp-ga2",
            "tp-zero2", "tp-ddp", "tp-ac", "tp-nosp-sac", "tp-uneven"}

LAYOUTS = {
    "ddp": ("N", 1, None, 1, None),
    "ddp-ga2": ("N", 1, None, 2, None),
    "zero1": (1, "N", 1, 1, None),
    "zero1-ga2": (1, "N", 1, 2, None),
    "zero2": (1, "N", 2, 1, None),
    "zero2-ga2": (1, "N", 2, 2, None),
    "fsdp": (1, "N", 3, 1, None),
    "fsdp-ga2": (1, "N", 3, 2, None),
    "fsdp-never": (1, "N", 3, 1, "never"),
    "hsdp": (2, "N/2", 3, 1, None),
    "hsdp-ga2": (2, "N/2", 3, 2, None),
    "tp": (1, "N/2", 3, 1, None, {"tp": 2}),
    "tp-only": (1, 1, None, 1, None, {"tp": "N"}),
    "tp-nosp": (1, "N/2", 3, 1, None, {"tp": 2, "sp": False}),
    "tp-noloss": (1, "N/2", 3, 1, None, {"tp": 2, "loss_parallel": False}),
    "tp-ga2": (1, "N/2", 3, 2, None, {"tp": 2}),
    "tp-zero2": (1, "N/2", 2, 2, None, {"tp": 2}),
    "tp-hsdp": (2, "N/4", 3, 1, None, {"tp": 2}),
    "tp-ddp": ("N/2", 1, None, 1, None, {"tp": 2}),
    "tp-ac": (1, "N/2", 3, 1, None, {"tp": 2, "ac": "full"}),
    "tp-nosp-sac": (1, "N/2", 3, 1, None, {"tp": 2, "sp": False, "ac": "selective", "ac_option": 2}),
    "tp-uneven": (1, "N/2", 3, 1, None, {"tp": 2, "loss_parallel": False,
                                         "model": {"vocab_size": 515, "ffn_hidden_dim": 250}}),
    # Pipeline layouts: pp degree, schedule, micro-batches per round (micro-batch size 1), 6 blocks;
    # "ranks": the rank counts run (at 8 these would only change the fsdp shard, as pp-fsdp shows).
    "pp": (1, 1, None, 1, None, {"pp": "N", "schedule": "1F1B", "m": "2N"}),
    "pp-fsdp": (1, "N/2", 3, 1, None, {"pp": 2, "schedule": "1F1B", "m": 4}),
    "pp-fsdp-ga2": (1, "N/2", 3, 2, None, {"pp": 2, "schedule": "1F1B", "m": 2, "ranks": (4,)}),
    "pp-ddp": ("N/2", 1, None, 1, None, {"pp": 2, "schedule": "GPipe", "m": 2, "ranks": (4,)}),
    "pp-zero2-il": (1, "N/2", 2, 1, None, {"pp": 2, "schedule": "Interleaved1F1B", "m": 4, "ranks": (4,)}),
    "pp-zbv": (1, "N/2", 3, 1, None, {"pp": 2, "schedule": "ZBVZeroBubble", "m": 4, "ranks": (4,)}),
    "pp-tp": (1, "N/4", 3, 1, None, {"pp": 2, "tp": 2, "schedule": "1F1B", "m": 2}),
    # Context-parallel layouts: cp degree, rotate (context_parallel_rotate_method). cp-ulysses
    # runs under HSDP (2 replicas of fsdp = cp 2); the tiny deck's 2 kv heads divide cp 2.
    "cp-fsdp": (1, 2, 3, 1, None, {"cp": 2, "rotate": "allgather", "ranks": (4,)}),
    "cp-ring": (1, 1, 3, 1, None, {"cp": 4, "rotate": "alltoall", "ranks": (4,)}),
    "cp-ulysses": (2, 1, 3, 1, None, {"cp": 2, "rotate": "ulysses", "ranks": (4,)}),
    "cp-tp": (1, 1, 3, 1, None, {"cp": 2, "tp": 2, "rotate": "alltoall", "ranks": (4,)}),
    "cp-ac-ga2": (1, 2, 3, 2, None, {"cp": 2, "rotate": "allgather", "ac": "full", "ranks": (4,)}),
    "cp-pp": (1, 1, 3, 1, None, {"cp": 2, "pp": 2, "rotate": "alltoall", "schedule": "1F1B", "m": 2,
                                 "ranks": (4,)}),
    # Mixture-of-Experts layouts (MOE_MODEL, round-robin routing): experts over fsdp (ep 1), ep 2
    # with efsdp 2, ep 2 under HSDP, ep 4 with full activation checkpointing and accumulation.
    "moe-fsdp": (1, "N", 3, 1, None, {"moe": True, "ranks": (4,)}),
    "moe-ep": (1, "N", 3, 1, None, {"moe": True, "ep": 2, "ranks": (4,)}),
    "moe-ep-hsdp": (2, "N/2", 3, 1, None, {"moe": True, "ep": 2, "ranks": (4,)}),
    "moe-ep-ac-ga2": (1, "N", 3, 2, None, {"moe": True, "ep": 4, "ac": "full", "ranks": (4,)}),
    # Muon: the matrix exchange over fsdp x tp (uneven FFN split), and over fsdp and efsdp at ep 2.
    "muon-tp": (1, "N/2", 3, 1, None, {"muon": True, "tp": 2, "model": {"ffn_hidden_dim": 250}, "ranks": (4,)}),
    "muon-moe-ep": (1, "N", 3, 1, None, {"muon": True, "moe": True, "ep": 2, "ranks": (4,)}),
}
MOE_MODEL = {"n_layers": 4, "n_dense_layers": 1, "num_experts": 8, "top_k": 2, "moe_inter_dim": 48,
             "num_shared_experts": 1}
PP_LAYERS = 6  # blocks of the pp layouts' model (--model.n_layers), so stages split unevenly


# ---------------------------------------------------------------------------------------------
# Helpers shared with perf/dp_scaling.py
# ---------------------------------------------------------------------------------------------

def sh(cmd, env=None, timeout=None):
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res.stdout


def record_failure(rows, row, err):
    """Prints a failed run's error, stores it in `row` and appends the row to `rows`."""
    print(f"  FAILED: {err}", flush=True)
    row["error"] = err
    rows.append(row)


def ensure_data(data, out, binary, ndocs=60, vocab=512):
    """Returns `data` if given, else builds a small token store under `out` (once)."""
    if data:
        if not os.path.exists(data):
            sys.exit(f"--data {data}: no such file")
        return data
    os.makedirs(out, exist_ok=True)
    corpus = os.path.join(out, "corpus")
    store = os.path.join(out, f"tokens_v{vocab}.h5")
    if not os.path.exists(store):
        shutil.rmtree(corpus, ignore_errors=True)
        sh([os.path.join(ROOT, "tests/fixtures/make_corpus.sh"), corpus, str(ndocs)])
        sh([binary, "data", "prepare", "--input", corpus, "--output", store, "--vocab-size", str(vocab)])
    return store


def train(binary, deck, data, out, n, overrides, threads=1, timeout=1800):
    """Runs `meshtrain train` on n ranks; returns (records, summary, error-or-None)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n), binary, "train",
           "--deck", deck, f"--training.dataset={data}", f"--job.dump_folder={out}",
           "--validation.enable=false", "--metrics.log_freq=1"] + list(overrides)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], None, f"timed out after {timeout} s: {' '.join(cmd)}"
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
        return [], None, f"exit {res.returncode}: {' '.join(cmd)}\n{tail}"
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return [], None, f"no {path}"
    recs = [json.loads(l) for l in open(path) if l.strip()]
    steps = [r for r in recs if "step" in r and "loss" in r and r.get("event") is None]
    summary = next((r for r in recs if r.get("event") == "summary"), None)
    return steps, summary, None


def model_shape(binary, deck):
    """The model's shape from `meshtrain model info --deck DECK --json`; exits on failure."""
    return json.loads(sh([binary, "model", "info", "--deck", deck, "--json"]))


def git_commit():
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def machine():
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def add_run_arguments(p, name):
    """--data, --out, --json, --binary and --timeout, with defaults under perf/out/NAME."""
    p.add_argument("--data", help="token store (default: build a tiny one under --out)")
    p.add_argument("--out", default=os.path.join(ROOT, "perf/out", name))
    p.add_argument("--json", default=os.path.join(ROOT, "perf/out", name + ".json"))
    p.add_argument("--binary", default=os.path.join(ROOT, "build/bin/meshtrain"))
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")


def write_result(path, fields):
    """Writes fields plus date, machine and commit as JSON to path (folders created)."""
    result = {"date": datetime.date.today().isoformat(), "machine": machine(), "commit": git_commit(), **fields}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


# ---------------------------------------------------------------------------------------------
# The reference volumes
# ---------------------------------------------------------------------------------------------

MULTI_STAGE = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


def stage_blocks(num_stages, L, first_less=1, last_less=1):
    """The blocks of each stage: TorchTitan's split of L + first_less + last_less effective layers
    (the embedding and the head weigh first_less / last_less layers) over num_stages, the first
    stages taking the remainder."""
    base, extra = divmod(L + first_less + last_less, num_stages)
    out, start = [], 0
    for i in range(num_stages):
        n = base + (i < extra) - (first_less if i == 0 else 0) - (last_less if i == num_stages - 1 else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def rank0_stages(schedule, P, v):
    """The stages pp rank 0 holds, and the pp rank of a stage (loop or V placement)."""
    if schedule == "ZBVZeroBubble":
        return [0, 2 * P - 1], (lambda x: x if x < P else 2 * P - 1 - x)
    return [c * P for c in range(v)], (lambda x: x % P)


def rank0_units(units, stages, num_stages, blocks):
    """The units (model_units) of pp rank 0's stages."""
    keep = {f"layers.{i}" for x in stages for i in blocks[x]}
    if 0 in stages:
        keep.add("tok_embeddings")
    if num_stages - 1 in stages:
        keep.add("output")
    return [u for u in units if u[0] in keep]


def expected_pp_bytes(stages, num_stages, rank_of, M_pp, b_mb, s, D, T, sp):
    """{("pp", "send_recv"): bytes per step} that pp rank 0 sends (see the docstring)."""
    msg = FLOAT_BYTES * b_mb * s * D // (T if sp and T > 1 else 1)
    sends = sum(int(x + 1 < num_stages and rank_of(x + 1) != 0) + int(x > 0 and rank_of(x - 1) != 0) for x in stages)
    return {("pp", "send_recv"): Fraction(M_pp * msg * sends)} if sends else {}

def align16(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


def ceil_div(a, b):
    return -(-a // b)


def is_moe_layer(m, i):
    """Block i has a Mixture-of-Experts feed-forward (ModelArgs::is_moe_layer)."""
    step = m.get("moe_layer_step", 1)
    return m.get("num_experts", 0) > 0 and i >= m.get("n_dense_layers", 0) and i % step == step - 1


def split_expert_units(units):
    """(units without the routed experts, units of only the routed experts): the two parameter
    sets expert parallelism shards over fsdp and efsdp; empty units dropped from the second."""
    dense = [(n, [(q, sh) for q, sh in ps if ".moe.experts." not in q], h) for n, ps, h in units]
    experts = [(n, [(q, sh) for q, sh in ps if ".moe.experts." in q], h) for n, ps, h in units]
    return dense, [u for u in experts if u[1]]


def muon_matrix(m, name):
    """(global rows, global cols, tp split: 0 rows / 1 columns / None replicated) of a Muon matrix."""
    D, Hq, Hkv = m["dim"], m["n_heads"], m["n_kv_heads"]
    Dh = m.get("head_dim") or D // Hq
    He, ns = m.get("moe_inter_dim", 0), m.get("num_shared_experts", 0)
    leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
    if ".moe.experts." in name:
        return (He, D, None) if leaf in ("w1", "w3") else (D, He, None)
    if ".moe.router." in name:
        return m["num_experts"], D, None
    H = ns * He if ".shared_experts." in name else m["ffn_dim"]
    return {"wq": (Hq * Dh, D, 0), "wk": (Hkv * Dh, D, 0), "wv": (Hkv * Dh, D, 0), "wo": (D, Hq * Dh, 1),
            "w1": (H, D, 0), "w3": (H, D, 0), "w2": (D, H, 1)}[leaf]


def expected_muon_bytes(m, T, N, ep):
    """{(group, "all_to_all"): bytes} rank 0 sends in Muon's matrix exchange per step (see the
    docstring's MUON terms), from an independent re-derivation of the owner dealing."""
    units = model_units(m, T, ep)
    sizes = {"fsdp": N, "efsdp": N // ep if ep > 1 else N}
    load = {g: [0.0] * (n * T) for g, n in sizes.items()}
    out = {}

    def add(group, v):
        if v:
            out[(group, "all_to_all")] = out.get((group, "all_to_all"), Fraction(0)) + FLOAT_BYTES * v

    def rows_of(rows, row_elems, n, k):  # shard rank k's element range of a [rows, ...] tensor
        per = ceil_div(rows, n)
        first = min(rows, k * per)
        return first * row_elems, (min(rows, first + per) - first) * row_elems

    def overlap(a, b):
        return max(0, min(a[0] + a[1], b[0] + b[1]) - max(a[0], b[0]))

    for _, params, _ in units:
        for name, shape in params:
            if len(shape) < 2 or name in ("tok_embeddings.weight", "output.weight"):
                continue
            expert = ".moe.experts." in name
            group = "efsdp" if expert and ep > 1 else "fsdp"
            n = sizes[group]
            R, C, split = muon_matrix(m, name)
            k_, l_ = min(R, C), max(R, C)
            cost = 5 * (4 * k_ * k_ * l_ + 2 * k_ ** 3)
            row_elems = numel(shape[1:])
            mats = [(e * numel(shape[1:]), numel(shape[1:])) for e in range(shape[0])] if expert else [(0, numel(shape))]
            for unit in mats:
                pieces = [overlap(rows_of(shape[0], row_elems, n, k), unit) for k in range(n)]
                whole = [k for k in range(n) if pieces[k] == unit[1]]
                cands = [(s, t) for s in (whole[:1] or range(n)) for t in range(T)]
                s_o, t_o = min(cands, key=lambda st: (load[group][st[0] * T + st[1]], st))
                load[group][s_o * T + t_o] += cost
                if n > 1:
                    add(group, pieces[0] if s_o != 0 else sum(pieces[1:]))
                if T > 1 and s_o == 0:
                    if split is None:
                        add("tp", (T - 1) * R * C if t_o == 0 else 0)
                    elif t_o != 0:
                        add("tp", unit[1])
                    else:
                        ext = R if split == 0 else C
                        add("tp", sum(ceil_div(ext, T) if t < T - 1 else ext - (T - 1) * ceil_div(ext, T)
                                      for t in range(1, T)) * (C if split == 0 else R))
    return out


def expected_ep_bytes(m, ep, M, b, s, recomputed_moe):
    """{("ep", "all_to_all"): bytes} of rank 0 under round-robin routing (see the docstring)."""
    E, k, D = m["num_experts"], m["top_k"], m["dim"]
    per = E // ep
    to_others = sum(1 for t in range(s) for j in range(k) if ((t * k + j) % E) // per != 0)
    to_me = sum(1 for t in range(s) for j in range(k) if ((t * k + j) % E) // per == 0)
    X, Y = b * to_others, (ep - 1) * b * to_me
    L = sum(1 for i in range(m["n_layers"]) if is_moe_layer(m, i))
    rec = 1 if recomputed_moe else 0
    counts = Fraction(FLOAT_BYTES * E * (ep - 1), ep)
    return {("ep", "all_to_all"): M * L * ((1 + rec) * counts + (2 + rec) * FLOAT_BYTES * D * (X + Y))}


def model_units(m, T=1, ep=1):
    """FSDP units in order, each (name, [(param, shape)], holds_output_head), with the shapes tp
    rank 0 holds under tensor parallelism of degree T (and E/ep routed experts of a MoE block): vocabulary rows, wq / wk / wv / w1 / w3 rows
    (column-parallel) split along dim 0, wo / w2 columns (row-parallel) along dim 1, in chunks of
    ceil(extent / T); norms (q_norm and k_norm included) whole."""
    D, L, Hq, Hkv, V = m["dim"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["vocab_size"]
    Dh = m.get("head_dim") or D // Hq
    H = m["ffn_dim"]
    tied = bool(m.get("tie_word_embeddings"))
    Vt, Ht, Qt, KVt = (ceil_div(x, T) for x in (V, H, Hq * Dh, Hkv * Dh))
    units = []
    emb = [("tok_embeddings.weight", (Vt, D))]
    if not tied:
        units.append(("tok_embeddings", emb, False))
    for i in range(L):
        p = f"layers.{i}."
        ps = [(p + "attention_norm.weight", (D,)), (p + "attention.wq.weight", (Qt, D)),
              (p + "attention.wk.weight", (KVt, D)), (p + "attention.wv.weight", (KVt, D)),
              (p + "attention.wo.weight", (D, Qt))]
        if m.get("qk_norm"):
            ps += [(p + "attention.q_norm.weight", (Dh,)), (p + "attention.k_norm.weight", (Dh,))]
        ps += [(p + "ffn_norm.weight", (D,))]
        if is_moe_layer(m, i):  # router, routed experts (this ep rank's), shared experts
            E, He, ns = m["num_experts"], m["moe_inter_dim"], m.get("num_shared_experts", 0)
            El = E // ep
            ps += [(p + "moe.router.gate.weight", (E, D)), (p + "moe.experts.w1", (El, He, D)),
                   (p + "moe.experts.w2", (El, D, He)), (p + "moe.experts.w3", (El, He, D))]
            if ns:
                Hs = ceil_div(ns * He, T)
                ps += [(p + "moe.shared_experts.w1.weight", (Hs, D)), (p + "moe.shared_experts.w2.weight", (D, Hs)),
                       (p + "moe.shared_experts.w3.weight", (Hs, D))]
        else:
            ps += [(p + "feed_forward.w1.weight", (Ht, D)), (p + "feed_forward.w2.weight", (D, Ht)),
                   (p + "feed_forward.w3.weight", (Ht, D))]
        units.append((f"layers.{i}", ps, False))
    head = [("norm.weight", (D,))]
    if tied:
        units.insert(0, ("tok_embeddings+output", emb + head, True))
    else:
        units.append(("output", head + [("output.weight", (Vt, D))], True))
    return units


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def shard_elems(shape, n):
    rows, row_elems = shape[0], numel(shape[1:])
    return -(-rows // n) * row_elems


def unit_shard(unit, n):
    """S_u: elements of one rank's padded shard of the unit over n ranks."""
    return sum(align16(shard_elems(shape, n)) for _, shape in unit[1])


def flat_grad_elems(units):
    """G: the DDP flat gradient buffer (every parameter padded to 16 elements)."""
    return sum(align16(numel(shape)) for u in units for _, shape in u[1])


def expected_bytes(units, R, N, M, zero, reshard):
    """{(group, collective): Fraction bytes per step per rank}; only non-zero entries."""
    exp = {}

    def add(group, coll, v):
        if v:
            exp[(group, coll)] = exp.get((group, coll), Fraction(0)) + Fraction(v)

    if N == 1:  # DDP: no sharding
        G = flat_grad_elems(units)
        add("dp_replicate", "all_reduce", Fraction(2 * FLOAT_BYTES * G * (R - 1), R))
        return exp
    S = [unit_shard(u, N) for u in units]
    one_pass = sum(FLOAT_BYTES * s * (N - 1) for s in S)
    if zero == 1:
        add("fsdp", "reduce_scatter", one_pass)
        add("fsdp", "all_gather", one_pass)
    elif zero == 2:
        add("fsdp", "reduce_scatter", M * one_pass)
        add("fsdp", "all_gather", one_pass)
    else:
        regather = 0 if reshard == "never" else sum(
            FLOAT_BYTES * s * (N - 1) for s, u in zip(S, units) if not u[2])
        add("fsdp", "all_gather", M * (one_pass + regather))
        add("fsdp", "reduce_scatter", M * one_pass)
    add("dp_replicate", "all_reduce", sum(Fraction(2 * FLOAT_BYTES * s * (R - 1), R) for s in S))
    return exp


def partial_grad_elems(units, N, sp):
    """E: elements of the partial-gradient replicated parameters (norms under sequence
    parallelism; q_norm / k_norm always) that rank 0 holds: the whole parameter when N = 1, else
    its rows of the dim-0 shard, min(ceil(rows / N), rows) rows."""
    E = 0
    for u in units:
        for name, shape in u[1]:
            norm = name == "norm.weight" or name.endswith((".attention_norm.weight", ".ffn_norm.weight"))
            qk = name.endswith((".attention.q_norm.weight", ".attention.k_norm.weight"))
            if qk or (sp and norm):
                E += (shape[0] if N == 1 else min(ceil_div(shape[0], N), shape[0])) * numel(shape[1:])
    return E


def checkpointed_blocks(L, ac, ac_option):
    """Blocks whose forward is recomputed in backward: all (full), index % k == 0 (selective k)."""
    if ac == "full":
        return L
    if ac == "selective":
        return sum(1 for i in range(L) if i % int(ac_option) == 0)
    return 0


def expected_tp_bytes(m, units, T, N, M, b, s, sp, loss_parallel, recomputed, blocks=None, ends=2, head=True):
    """{("tp", collective): bytes per step per rank} for tp degree T > 1 (see the docstring).
    blocks / ends / head: the rank's blocks (default all), how many of the embedding and the
    output head it holds, and whether it computes the loss (pipeline stages hold a part)."""
    if T == 1:
        return {}
    D, V = m["dim"], m["vocab_size"]
    L = m["n_layers"] if blocks is None else blocks
    n_tok = b * s
    act = FLOAT_BYTES * n_tok * D                  # one [N_tok, h] activation
    ag_rs = lambda size: size * (T - 1) // T       # all_gather / reduce_scatter, per call
    ar = lambda size: 2 * size * (T - 1) // T      # all_reduce, per call
    calls = 4 * L + ends + 2 * recomputed          # per micro-batch: blocks, embedding + head, recompute
    loss = FLOAT_BYTES * T * n_tok * (3 if loss_parallel else ceil_div(V, T))
    exp = {("tp", "all_gather"): M * ag_rs(loss) if head else 0}
    if sp:
        exp[("tp", "all_gather")] += M * calls * ag_rs(act)
        exp[("tp", "reduce_scatter")] = M * calls * ag_rs(act)
    else:
        exp[("tp", "all_reduce")] = M * calls * ar(act)
    E = partial_grad_elems(units, N, sp)
    if E:
        exp[("tp", "all_reduce")] = exp.get(("tp", "all_reduce"), 0) + ar(FLOAT_BYTES * E)
    return {k: Fraction(v) for k, v in exp.items() if v}


def expected_cp_bytes(m, T, CP, rotate, M, b, s, L, recomputed):
    """{("cp", collective): bytes per step per rank} for cp degree CP > 1 (see the docstring):
    M micro-batches of b samples of s = seq_len / CP local tokens, L attention layers of which
    `recomputed` run their forward again in backward, T the tp degree."""
    if CP == 1:
        return {}
    Hq, Hkv = m["n_heads"], m["n_kv_heads"]
    Dh = m.get("head_dim") or m["dim"] // Hq
    assert Hq % T == 0 and Hkv % T == 0, "tp must divide the heads (head_overrides)"
    Hq_t, Hkv_t = Hq // T, Hkv // T
    B_a, B_g = FLOAT_BYTES, 4                      # activation dtype (f32 on cpu); dK/dV sums (f32 always)
    kv = 2 * b * s * Hkv_t * Dh                    # K and V of one rank, packed
    passes = 2 * L + recomputed                    # forward, backward, recomputed forward
    if rotate == "allgather":
        exp = {("cp", "all_gather"): M * passes * (CP - 1) * kv * B_a,
               ("cp", "reduce_scatter"): M * L * (CP - 1) * kv * B_g}
    elif rotate == "alltoall":
        exp = {("cp", "send_recv"): M * (passes * (CP - 1) * kv * B_a + L * (CP - 1) * kv * B_g)}
    elif rotate == "ulysses":
        a2a = lambda x: Fraction(x * (CP - 1), CP)
        q, k = B_a * b * s * Hq_t * Dh, B_a * b * s * Hkv_t * Dh
        exp = {("cp", "all_to_all"): M * passes * 2 * (a2a(q) + a2a(k))}
    else:
        raise ValueError(f"unknown context_parallel_rotate_method {rotate!r}")
    return {key: Fraction(v) for key, v in exp.items() if v}


def read_deck(path):
    """{section: {key: value}} of a deck (tomllib, or its flat scalar lines without it)."""
    if tomllib:
        with open(path, "rb") as f:
            return tomllib.load(f)
    cfg, sec = {}, None
    for line in open(path):
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            sec = cfg.setdefault(line[1:-1], {})
        elif "=" in line and not line.startswith("#") and sec is not None:
            k, v = (x.strip() for x in line.split("=", 1))
            if v.startswith('"'):
                v = v[1:v.index('"', 1)]
            else:
                v = v.split("#", 1)[0].strip()
                v = {"true": True, "false": False}.get(v, v)
                if isinstance(v, str):
                    v = float(v) if any(c in v for c in ".eE") else int(v)
            sec[k] = v
    return cfg


def resolve(layout, n):
    """(R, S, zero, M, reshard, tp options with the degree resolved) of a layout at n ranks."""
    R, S, zero, M, reshard, *rest = LAYOUTS[layout]
    val = {"N": n, "N/2": n // 2, "N/4": n // 4, "2N": 2 * n, 1: 1, 2: 2, 4: 4}
    tp = dict(rest[0]) if rest else {}
    for k in ("tp", "pp", "cp", "m", "ep"):
        if k in tp:
            tp[k] = val[tp[k]]
    return val[R], val[S], zero, M, reshard, tp


def head_overrides(m, T):
    """--model overrides that make n_heads and n_kv_heads divisible by T (none when they are)."""
    heads, kv, over = m["n_heads"], m["n_kv_heads"], []
    if heads % T:
        heads = T
        over.append(f"--model.n_heads={T}")
    if kv % T or heads % kv:
        over.append(f"--model.n_kv_heads={T}")
    return over


def fmt(v):
    if v is None:
        return "-"
    v = Fraction(v)
    return str(v.numerator) if v.denominator == 1 else f"{float(v):.3f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--variants-ranks", type=int, nargs="+",
                   help="run the variant layouts (one knob changed from a base layout: accumulation, reshard never, "
                        "tp without sp / loss parallel, under ZeRO-2 / DDP, with AC, uneven splits) only at these "
                        "rank counts; the base layouts keep every --ranks (default: variants at every --ranks)")
    p.add_argument("--large-ranks-layouts", nargs="+", choices=list(LAYOUTS),
                   help="at rank counts above the smallest --ranks, run only these layouts (the test suite's "
                        "time: the ones whose group sizes change with the rank count in a way the smaller count "
                        "does not show; default: every layout at every --ranks)")
    p.add_argument("--steps", type=int, default=3, help="steps per run (>= 3: the last one is compared)")
    p.add_argument("--deck", default=os.path.join(ROOT, "tests/equivalence/tiny.toml"))
    p.add_argument("--decks", nargs="+", default=["tiny"], choices=["tiny", "tied", "debug", "qwen3"],
                   help="tiny: --deck; tied: --deck with tie_word_embeddings=true; debug / qwen3: "
                        "inputs/{llama3,qwen3}_debug.toml at batch 1, seq_len 32")
    p.add_argument("--local-batch", type=int, default=2, help="local batch size of --deck runs (M = global / (local x dp))")
    add_run_arguments(p, "comm_volume")
    args = p.parse_args()
    if args.steps < 3:
        p.error("--steps must be >= 3 (steady state)")
    os.makedirs(args.out, exist_ok=True)
    data = ensure_data(args.data, args.out, args.binary)

    # (name, deck, local batch size, further overrides); the volumes do not depend on the batch.
    known = {"tiny": (args.deck, args.local_batch, []),
             "tied": (args.deck, args.local_batch, ["--model.tie_word_embeddings=true"]),
             "debug": (os.path.join(ROOT, "inputs/llama3_debug.toml"), 1, ["--training.seq_len=32"]),
             "qwen3": (os.path.join(ROOT, "inputs/qwen3_debug.toml"), 1, ["--training.seq_len=32"])}
    decks = [(name,) + known[name] for name in args.decks]
    rows, runs, failed = [], [], False
    for deck_name, deck, lbs, deck_over in decks:
        base_model = None
        for n in args.ranks:
            for layout in args.layouts:
                R, S, zero, M, reshard, tp = resolve(layout, n)
                T, P, CP = tp.get("tp", 1), tp.get("pp", 1), tp.get("cp", 1)
                if R * S * T * P * CP != n or ("hsdp" in layout and S < 2) or n not in tp.get("ranks", (n,)):
                    continue
                if args.variants_ranks and layout in VARIANTS and n not in args.variants_ranks:
                    continue
                if args.large_ranks_layouts and n > min(args.ranks) and layout not in args.large_ranks_layouts:
                    continue
                if P > 1 and deck_name != "tiny":
                    continue  # tied embeddings under pp add the embedding-group exchange; not modelled
                local = tp["m"] if P > 1 else lbs  # pp: micro-batches of 1 sample
                over = deck_over + [f"--training.local_batch_size={local}",
                                    f"--parallelism.data_parallel_replicate_degree={R}",
                                    f"--parallelism.data_parallel_shard_degree={S}",
                                    f"--training.steps={args.steps}"]
                over.append(f"--training.global_batch_size={M * local * R * S}")
                if zero is not None:
                    over.append(f"--parallelism.zero_stage={zero}")
                if reshard is not None:
                    over.append(f"--parallelism.fsdp_reshard_after_forward={reshard}")
                if P > 1:
                    over += [f"--parallelism.pipeline_parallel_degree={P}",
                             f"--parallelism.pipeline_parallel_schedule={tp['schedule']}",
                             f"--model.n_layers={PP_LAYERS}"]
                if tp:
                    if T > 1:
                        if base_model is None:
                            base_model = model_shape(args.binary, deck)
                        over += head_overrides(base_model, T) + [f"--parallelism.tensor_parallel_degree={T}"]
                    over += [f"--model.{k}={v}" for k, v in tp.get("model", {}).items()]
                    if not tp.get("sp", True):
                        over.append("--parallelism.enable_sequence_parallel=false")
                    if not tp.get("loss_parallel", True):
                        over.append("--parallelism.disable_loss_parallel=true")
                    if "ac" in tp:
                        over.append(f"--activation_checkpoint.mode={tp['ac']}")
                    if "ac_option" in tp:
                        over.append(f"--activation_checkpoint.selective_ac_option={tp['ac_option']}")
                    if CP > 1:
                        over += [f"--parallelism.context_parallel_degree={CP}",
                                 f"--parallelism.context_parallel_rotate_method={tp['rotate']}"]
                    if tp.get("muon"):
                        over.append("--optimizer.name=Muon")
                    if tp.get("moe"):
                        over += [f"--model.{k}={v}" for k, v in MOE_MODEL.items()]
                        over += ["--debug.moe_force_load_balance=true", "--metrics.moe_histogram_freq=1",
                                 f"--parallelism.expert_parallel_degree={tp.get('ep', 1)}"]
                tag = f"{deck_name}-{layout}-np{n}"
                print(f"running {tag}: {' '.join(over)}", flush=True)
                recs, _, err = train(args.binary, deck, data, os.path.join(args.out, tag), n, over,
                                     timeout=args.timeout)
                run = {"deck": deck_name, "layout": layout, "ranks": n, "dp_replicate": R, "dp_shard": S,
                       "tp": T, "pp": P, "cp": CP, "zero_stage": zero, "micro_batches": M, "reshard": reshard,
                       "overrides": over}
                if err:
                    record_failure(runs, run, err)
                    failed = True
                    continue
                # The model and settings really run (overrides included), from the run's resolved deck.
                resolved = os.path.join(args.out, tag, "deck.resolved.toml")
                m_run = model_shape(args.binary, resolved)
                cfg = read_deck(resolved)
                par, ac = cfg["parallelism"], cfg["activation_checkpoint"]
                T_run = par["tensor_parallel_degree"]
                CP_run, rotate = par["context_parallel_degree"], par["context_parallel_rotate_method"]
                N = S * CP_run  # the fsdp group: parameters shard over dp_shard x cp
                sp, loss_parallel = bool(par["enable_sequence_parallel"]), not par["disable_loss_parallel"]
                b = cfg["training"]["local_batch_size"]
                seq = cfg["training"]["seq_len"] // CP_run  # tokens per sample on this rank
                recomputed = checkpointed_blocks(m_run["n_layers"], ac["mode"], ac["selective_ac_option"])
                EP_run = par.get("expert_parallel_degree", 1)
                units_run = model_units(m_run, T_run, EP_run)
                last = recs[-1]
                counted = {}
                for g, colls in (last.get("comm_bytes") or {}).items():
                    for c, bytes_ in colls.items():
                        counted[(g, c)] = bytes_
                P_run = par["pipeline_parallel_degree"]
                if EP_run > 1:  # experts over efsdp, the rest over fsdp; tokens over ep
                    dense_units, expert_units = split_expert_units(units_run)
                    NE = N // EP_run
                    expected = expected_bytes(dense_units, R, N, M, zero if N > 1 else None, reshard)
                    for (g, c), v in expected_bytes(expert_units, R, NE, M, zero if NE > 1 else None,
                                                    reshard).items():
                        key = ("efsdp" if g == "fsdp" else g, c)
                        expected[key] = expected.get(key, Fraction(0)) + v
                    expected.update(expected_ep_bytes(m_run, EP_run, M, b, seq, ac["mode"] == "full"))
                    units_run = dense_units + expert_units
                elif P_run == 1:
                    expected = expected_bytes(units_run, R, N, M, zero if N > 1 else None, reshard)
                    expected.update(expected_tp_bytes(m_run, units_run, T_run, N, M, b, seq, sp, loss_parallel,
                                                      recomputed))
                    expected.update(expected_cp_bytes(m_run, T_run, CP_run, rotate, M, b, seq, m_run["n_layers"],
                                                      recomputed))
                else:
                    schedule = par.get("pipeline_parallel_schedule", "1F1B")
                    b_mb = par.get("pipeline_parallel_microbatch_size", 1)
                    v = 2 if schedule in MULTI_STAGE else 1
                    num_stages = P_run * v
                    blocks = stage_blocks(num_stages, m_run["n_layers"])
                    stages, rank_of = rank0_stages(schedule, P_run, v)
                    units_run = rank0_units(units_run, stages, num_stages, blocks)
                    mine = [i for x in stages for i in blocks[x]]
                    ends = int(0 in stages) + int(num_stages - 1 in stages)
                    rec = {"full": len(mine), "selective": sum(1 for i in mine if i % int(ac["selective_ac_option"]) == 0),
                           "none": 0}[ac["mode"]]
                    M_pp = M * (b // b_mb)  # rounds x micro-batches per round
                    expected = expected_bytes(units_run, R, N, 1, zero if N > 1 else None, "never")
                    expected.update(expected_tp_bytes(m_run, units_run, T_run, N, M_pp, b_mb, seq, sp, loss_parallel,
                                                      rec, blocks=len(mine), ends=ends,
                                                      head=num_stages - 1 in stages))
                    expected.update(expected_cp_bytes(m_run, T_run, CP_run, rotate, M_pp, b_mb, seq, len(mine), rec))
                    expected.update(expected_pp_bytes(stages, num_stages, rank_of, M_pp, b_mb, seq, m_run["dim"],
                                                      T_run, sp))
                    run.update({"schedule": schedule, "stages_of_pp_rank0": stages,
                                "blocks_of_pp_rank0": mine, "pp_micro_batches": M_pp})
                if tp.get("muon"):
                    expected.update(expected_muon_bytes(m_run, T_run, N, EP_run))
                run.update({"step": last.get("step"), "comm_bytes": last.get("comm_bytes"),
                            "comm_wait_s": last.get("comm_wait_s"), "step_time_s": last.get("step_time_s"),
                            "unit_shard_elems": [unit_shard(u, N) for u in units_run] if N > 1 else None,
                            "flat_grad_elems": flat_grad_elems(units_run)})
                if T_run > 1:
                    run.update({"sequence_parallel": sp, "loss_parallel": loss_parallel,
                                "activation_checkpoint": ac["mode"], "recomputed_blocks": recomputed,
                                "partial_grad_elems": partial_grad_elems(units_run, N, sp)})
                if CP_run > 1:
                    run.update({"rotate_method": rotate, "fsdp": N, "tokens_per_sample": seq})
                if T_run != T:
                    run["error"] = f"the resolved deck has tensor_parallel_degree {T_run}, not {T}"
                    failed = True
                if CP_run != CP:
                    run["error"] = f"the resolved deck has context_parallel_degree {CP_run}, not {CP}"
                    failed = True
                if "comm_bytes" not in last:
                    run["error"] = "no comm_bytes in the last training record"
                    failed = True
                if tp.get("moe"):  # the logged loads equal the positional routing over the step's sequences
                    path = os.path.join(args.out, tag, "metrics.jsonl")
                    hist = [json.loads(l) for l in open(path) if "moe_tokens_per_expert" in l]
                    E, k = m_run["num_experts"], m_run["top_k"]
                    per_seq = [sum(1 for t in range(seq) for j in range(k) if (t * k + j) % E == e) for e in range(E)]
                    seqs = M * b * R * S  # samples per step
                    want = [[float(seqs * c) for c in per_seq]] * sum(
                        1 for i in range(m_run["n_layers"]) if is_moe_layer(m_run, i))
                    got = hist[-1]["moe_tokens_per_expert"] if hist else None
                    ok = got == want
                    failed |= not ok
                    rows.append({"deck": deck_name, "layout": layout, "ranks": n, "group": "moe",
                                 "collective": "tokens/expert", "counted": sum(map(sum, got)) if got else None,
                                 "formula": sum(map(sum, want)), "match": ok})
                    run["moe_tokens_per_expert"] = got
                runs.append(run)
                for key in sorted(set(counted) | set(expected)):
                    c, e = counted.get(key), expected.get(key)
                    ok = c is not None and e is not None and Fraction(str(c)) == e
                    failed |= not ok
                    rows.append({"deck": deck_name, "layout": layout, "ranks": n, "group": key[0],
                                 "collective": key[1], "counted": c,
                                 "formula": (int(e) if e is not None and e.denominator == 1 else
                                             (float(e) if e is not None else None)),
                                 "match": ok})

    hdr = f"{'deck':6} {'layout':12} {'ranks':>5} {'group':13} {'collective':15} {'counted B/step':>15} " \
          f"{'formula B/step':>15} match"
    print()
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['deck']:6} {r['layout']:12} {r['ranks']:5} {r['group']:13} {r['collective']:15} "
              f"{fmt(r['counted']):>15} {fmt(r['formula']):>15} {'yes' if r['match'] else 'NO'}")
    for r in runs:
        if "error" in r:
            print(f"{r['deck']:6} {r['layout']:12} {r['ranks']:5} run error: {r['error'].splitlines()[0]}")
    write_result(args.json, {"steps": args.steps, "rows": rows, "runs": runs, "all_match": not failed})
    print(f"\n{'all counters match' if not failed else 'MISMATCH'}; wrote {args.json}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
