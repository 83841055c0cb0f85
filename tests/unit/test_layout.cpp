#define BOOST_TEST_MODULE layout
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unistd.h>

#include "layout/comm_volume.hpp"
#include "topology/hostlist.hpp"
#include "util/errors.hpp"
#include "util/rng.hpp"
#include "scratch_dir.hpp"

using namespace meshtrain;

namespace {

std::string write_file(const std::string& text) {
  static int n = 0;
  const auto p = meshtrain::testing::scratch_dir("meshtrain_topo") / ("topology_" + std::to_string(n++) + ".conf");
  std::ofstream(p) << text;
  return p.string();
}

std::string error_of(const std::string& text) {
  try {
    Topology::from_slurm_conf(write_file(text));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

namespace meshtrain {
std::ostream& operator<<(std::ostream& os, Tier t) { return os << tier_name(t); }
}  // namespace meshtrain

namespace {

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

ParallelDims dims(int64_t pp, int64_t rep, int64_t shard, int64_t cp, int64_t tp) {
  ParallelDims d;
  d.pp = pp, d.dp_replicate = rep, d.dp_shard = shard, d.cp = cp, d.tp = tp;
  return d;
}

// Checks the invariants every layout must hold.
void check_invariants(const RankLayout& l) {
  const int64_t w = l.world();
  for (int d = 0; d < kNumMeshDims; ++d) {
    const MeshDim dim = MeshDim(d);
    const GroupSpan s = l.span(dim);
    BOOST_TEST(s.size * s.groups == w);
    std::map<int64_t, std::set<int64_t>> keys;  // the groups partition the world with keys 0..size-1
    for (int64_t r = 0; r < w; ++r) keys[l.color(dim, r)].insert(l.key(dim, r));
    BOOST_TEST(int64_t(keys.size()) == s.groups);
    for (const auto& [c, k] : keys) BOOST_TEST(int64_t(k.size()) == s.size);
  }
  // Pipeline neighbours differ only in the stage.
  for (int64_t r = 0; r < w; ++r) {
    const int64_t next = l.pp_next(r);
    if (next < 0) {
      BOOST_TEST(l.coord(r)[0] == l.dims().pp - 1);
      continue;
    }
    BOOST_TEST(l.pp_prev(next) == r);
    MeshCoord c = l.coord(r);
    ++c[0];
    BOOST_TEST((l.coord(next) == c));
  }
  // Orthogonal single-axis dimensions meet in exactly one rank.
  const MeshDim axes[] = {MeshDim::kPP, MeshDim::kDpReplicate, MeshDim::kDpShard, MeshDim::kCP, MeshDim::kTP};
  const int64_t r0 = w / 3;
  for (MeshDim a : axes)
    for (MeshDim b : axes) {
      if (a == b) continue;
      auto ga = l.group(a, r0), gb = l.group(b, r0);
      std::sort(ga.begin(), ga.end());
      std::sort(gb.begin(), gb.end());
      std::vector<int64_t> both;
      std::set_intersection(ga.begin(), ga.end(), gb.begin(), gb.end(), std::back_inserter(both));
      BOOST_TEST((both == std::vector<int64_t>{r0}));
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(hostlists) {
  BOOST_TEST((expand_hostlist("nid[001-003,020]") == std::vector<std::string>{"nid001", "nid002", "nid003", "nid020"}));
  BOOST_TEST((expand_hostlist("a[1-2]b[7-8],c") == std::vector<std::string>{"a1b7", "a1b8", "a2b7", "a2b8", "c"}));
  BOOST_TEST((expand_hostlist("n[08-10]") == std::vector<std::string>{"n08", "n09", "n10"}));
  BOOST_CHECK_THROW(expand_hostlist("nid[1-3"), std::invalid_argument);
  BOOST_CHECK_THROW(expand_hostlist("nid[5-3]"), std::invalid_argument);
  BOOST_CHECK_THROW(expand_hostlist("nid[a-3]"), std::invalid_argument);
  BOOST_CHECK_THROW(expand_hostlist("nid1]"), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(slurm_topology_conf) {
  const Topology t = Topology::from_slurm_conf(write_file(
      "# two racks under one spine\nSwitchName=s0 Nodes=nid[001-004]\nSwitchName=s1 Nodes=nid[005-008] LinkSpeed=100\n"
      "SwitchName=spine Switches=s[0-1]\n"));
  BOOST_TEST(t.rack_of("nid003") == 0);
  BOOST_TEST(t.rack_of("nid007") == 1);
  BOOST_TEST(t.rack_name(1) == "s1");
  BOOST_TEST(t.hosts().size() == 8u);
  BOOST_CHECK_EXCEPTION(t.rack_of("nid099"), ConfigError, [](const ConfigError& e) { return has(e.what(), "node 'nid099' of this job is not in the topology"); });
  BOOST_TEST(has(error_of("SwitchName=s0 Nodes=n[1-2]\nSwitchName=top Switches=s0,s9\n"), ":2: switch 'top' lists unknown switch 's9'"));
  BOOST_TEST(has(error_of("SwitchName=s0 Nodes=n[1-2]\nSwitchName=s1 Nodes=n[2-3]\n"), ":2: node 'n2' is under two leaf switches"));
  BOOST_TEST(has(error_of("SwitchName=a Switches=b\nSwitchName=b Switches=a\n"), "is part of a cycle"));
  BOOST_TEST(has(error_of("SwitchName=s0 Nodes=n[1-\n"), ":1: malformed hostlist"));
  BOOST_TEST(has(error_of("SwitchName=s0 Nodez=n1\n"), ":1: unknown key 'Nodez'"));
  BOOST_TEST(has(error_of("Nodes=n1\n"), ":1: line without SwitchName="));
  // What `scontrol show topology` prints: Level=, and the upper switch lists every node below it.
  const Topology sc = Topology::from_slurm_conf(write_file(
      "SwitchName=rack1 Level=0 LinkSpeed=1 Nodes=n1,n2\nSwitchName=rack2 Level=0 LinkSpeed=1 Nodes=n3,n4\n"
      "SwitchName=top Level=1 LinkSpeed=1 Nodes=n[1-4] Switches=rack[1-2]\n"));
  BOOST_TEST(sc.rack_of("n2") == 0);
  BOOST_TEST(sc.rack_of("n3") == 1);
  BOOST_TEST(sc.rack_name(1) == "rack2");
  BOOST_TEST(sc.hosts().size() == 4u);
  Topology s;
  s.add_slurm_address("nid001", "spine.tor3.nid001", "switch.switch.node");
  s.add_slurm_address("nid002", "spine.tor4.nid002", "switch.switch.node");
  BOOST_TEST(s.rack_of("nid002") == 1);
  BOOST_CHECK_THROW(s.add_slurm_address("x", "a.b", "switch.switch.node"), ConfigError);
}

BOOST_AUTO_TEST_CASE(tp_innermost_and_inside_nodes) {
  const Topology none;
  const RankLayout l(dims(1, 1, 2, 1, 4), synthetic_places(8, 4, 0, none));
  for (int64_t r = 0; r < 8; ++r) {
    BOOST_TEST(l.coord(r)[4] == r % 4);  // tp fastest
    BOOST_TEST(l.coord(r)[2] == r / 4);
  }
  BOOST_TEST(l.span(MeshDim::kTP).widest == Tier::kNode);
  BOOST_TEST(l.span(MeshDim::kDpShard).cross_node == 4);
  check_invariants(l);
  // tp 4 on 2-rank nodes must be refused unless allowed.
  BOOST_CHECK_EXCEPTION(RankLayout(dims(1, 1, 2, 1, 4), synthetic_places(8, 2, 0, none)), ConfigError,
                        [](const ConfigError& e) { return has(e.what(), "spans nodes node0000 and node0001"); });
  const RankLayout allowed(dims(1, 1, 2, 1, 4), synthetic_places(8, 2, 0, none), true);
  BOOST_TEST(allowed.span(MeshDim::kTP).cross_node == 2);
}

BOOST_AUTO_TEST_CASE(launcher_order_does_not_change_physical_placement) {
  const Topology none;
  auto places = synthetic_places(64, 8, 2, none);
  const RankLayout ref(dims(2, 2, 4, 2, 2), places);
  // Renumber the ranks in a random order: each physical slot must get the same coordinates.
  std::vector<int64_t> perm(64);
  for (int64_t i = 0; i < 64; ++i) perm[size_t(i)] = i;
  for (int64_t i = 63; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(counter_u64(5, 1, uint64_t(i)) % uint64_t(i + 1))]);
  std::vector<RankPlace> shuffled(64);
  for (int64_t r = 0; r < 64; ++r) {
    shuffled[size_t(perm[size_t(r)])] = places[size_t(r)];
    shuffled[size_t(perm[size_t(r)])].rank = perm[size_t(r)];
  }
  const RankLayout l(dims(2, 2, 4, 2, 2), shuffled);
  for (int64_t r = 0; r < 64; ++r) BOOST_TEST((l.coord(perm[size_t(r)]) == ref.coord(r)));
  check_invariants(l);
}

BOOST_AUTO_TEST_CASE(large_layouts_and_tier_counts) {
  const Topology none;
  // 512 ranks, 8 per node, 4 nodes per rack: tp 8 in nodes, dp_shard 4 in a rack, rest across.
  const RankLayout l(dims(2, 8, 4, 1, 8), synthetic_places(512, 8, 4, none));
  check_invariants(l);
  BOOST_TEST(l.span(MeshDim::kTP).widest == Tier::kNode);
  BOOST_TEST(l.span(MeshDim::kDpShard).widest == Tier::kRack);
  BOOST_TEST(l.span(MeshDim::kDpShard).cross_rack == 0);
  BOOST_TEST(l.span(MeshDim::kDpReplicate).cross_rack == l.span(MeshDim::kDpReplicate).groups);
  BOOST_TEST(l.span(MeshDim::kPP).widest == Tier::kSpine);
  const RankLayout big(dims(8, 4, 64, 1, 8), synthetic_places(16384, 8, 32, none));
  BOOST_TEST(big.span(MeshDim::kTP).cross_node == 0);
  BOOST_TEST(big.span(MeshDim::kLoss).size == 256);
  BOOST_CHECK_THROW(RankLayout(dims(1, 1, 3, 1, 1), synthetic_places(4, 1, 0, none)), ConfigError);
}

BOOST_AUTO_TEST_CASE(communication_volume_formulas) {
  JobConfig cfg;  // llama3 debugmodel, fp32, local batch 8, seq 2048
  cfg.training.seq_len = 128;
  const double p = double(cfg.model_args().num_params());
  // DDP over 4 replicas: one all-reduce of fp32 gradients, 2·4·P·3/4 bytes.
  ParallelDims ddp = dims(1, 4, 1, 1, 1);
  auto v = comm_bytes_per_step(cfg, ddp);
  BOOST_TEST(v[size_t(MeshDim::kDpReplicate)] == 2 * 4 * p * 3 / 4);
  BOOST_TEST(v[size_t(MeshDim::kFSDP)] == 0.0);
  // FSDP 4 with bf16 params, fp32 reduce, 2 micro-batches: 2·(2·2 + 4)·P·3/4.
  cfg.training.mixed_precision_param = "bfloat16";
  cfg.training.global_batch_size = 64;
  v = comm_bytes_per_step(cfg, dims(1, 1, 4, 1, 1));
  BOOST_TEST(v[size_t(MeshDim::kFSDP)] == 2 * (2 * 2 + 4) * p * 3 / 4);
  // TP 2: 4 reductions per layer of b·s·h bf16 activations plus one each for the embedding and
  // the output head, all-reduce volume 2·(T−1)/T.
  cfg.training.global_batch_size = -1;
  v = comm_bytes_per_step(cfg, dims(1, 1, 1, 1, 2));
  BOOST_TEST(v[size_t(MeshDim::kTP)] == (4.0 * 6 + 2) * 2 * 0.5 * 8 * 128 * 256 * 2);
  // Full activation checkpointing recomputes every block's forward: 2 more per layer.
  cfg.activation_checkpoint.mode = "full";
  v = comm_bytes_per_step(cfg, dims(1, 1, 1, 1, 2));
  BOOST_TEST(v[size_t(MeshDim::kTP)] == (6.0 * 6 + 2) * 2 * 0.5 * 8 * 128 * 256 * 2);
}
