// `meshtrain layout --deck FILE --world-size N [--topology FILE] [--csv FILE] [--section.key=value ...]`:
// lays out a deck on N simulated ranks (no MPI launch) and prints the layout report, and under
// pipeline parallelism the schedule and every pp rank's stages with their layers.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/deck_args.hpp"
#include "config/deck_parser.hpp"
#include "config/pipeline_plan.hpp"
#include "layout/comm_volume.hpp"
#include "util/errors.hpp"

namespace meshtrain::app {

int cmd_layout(int argc, char** argv) {
  const DeckArgs args = parse_deck_args(argc, argv, {"--topology", "--csv"});
  const std::string& deck = args.deck;
  const int64_t world = args.world_size;
  std::string topo_file = args.values.count("--topology") ? args.values.at("--topology") : "";
  const std::string csv = args.values.count("--csv") ? args.values.at("--csv") : "";
  if (deck.empty() || world < 1)
    throw ConfigError("usage: meshtrain layout --deck FILE --world-size N [--topology FILE] [--csv FILE] [--section.key=value ...]");
  const JobConfig cfg = load_job_config(deck, args.overrides);
  const ParallelDims dims = cfg.validate_layout(world);
  if (topo_file.empty()) topo_file = cfg.topology.file;
  const Topology topo = topo_file.empty() ? Topology() : Topology::from_slurm_conf(topo_file);
  const auto places = synthetic_places(world, cfg.topology.ranks_per_node, cfg.topology.nodes_per_rack, topo, topo.hosts());
  const RankLayout layout(dims, places, cfg.topology.allow_cross_node_tp);
  std::printf("%s: pp %lld × dp_replicate %lld × dp_shard %lld × cp %lld × tp %lld, %lld ranks per node%s\n",
              deck.c_str(), (long long)dims.pp, (long long)dims.dp_replicate, (long long)dims.dp_shard,
              (long long)dims.cp, (long long)dims.tp, (long long)cfg.topology.ranks_per_node,
              topo_file.empty() ? "" : (", topology " + topo_file).c_str());
  std::fputs(layout_report_with_volume(layout, cfg).c_str(), stdout);
  if (dims.ep > 1) {
    const ModelArgs a = cfg.model_args();
    const GroupSpan ep = layout.span(MeshDim::kEP);
    std::printf("experts: ep %lld borrowed from dp_shard × cp = %lld; each ep rank holds %lld of %lld experts, sharded "
                "over efsdp %lld; %lld of %lld ep groups cross nodes\n",
                (long long)dims.ep, (long long)(dims.dp_shard * dims.cp), (long long)(a.num_experts / dims.ep),
                (long long)a.num_experts, (long long)(dims.dp_shard * dims.cp / dims.ep), (long long)ep.cross_node,
                (long long)ep.groups);
  }
  if (dims.pp > 1) {
    const PipelinePlan plan = cfg.pipeline_plan(dims);
    std::printf("pipeline: %s, %lld micro-batches of %lld per round, %d stages\n%s", plan.schedule.name.c_str(),
                (long long)plan.microbatches, (long long)plan.microbatch_size, plan.schedule.num_stages(),
                describe_stage_placement(plan).c_str());
  }
  if (!csv.empty()) {
    const std::string tmp = csv + ".tmp";
    std::ofstream(tmp) << layout_csv(layout);
    if (std::rename(tmp.c_str(), csv.c_str()) != 0) throw std::runtime_error(csv + ": cannot write");
    std::printf("per-rank coordinates and groups written to %s\n", csv.c_str());
  }
  return kExitOk;
}

}  // namespace meshtrain::app
