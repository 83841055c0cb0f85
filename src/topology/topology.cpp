#include "topology/topology.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "topology/hostlist.hpp"
#include "util/errors.hpp"

namespace meshtrain {

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kNode: return "node";
    case Tier::kRack: return "rack";
    case Tier::kSpine: return "spine";
  }
  return "?";
}

namespace {

struct SwitchLine {
  int line;
  std::vector<std::string> switches, nodes;
};

}  // namespace

Topology Topology::from_slurm_conf(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read topology file (" + std::strerror(errno) + ")");
  Topology t;
  t.source_ = path;
  std::map<std::string, SwitchLine> sw;
  std::vector<std::string> order;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string where = path + ":" + std::to_string(n);
    if (const size_t h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ss(line);
    std::string tok, name;
    SwitchLine s{n, {}, {}};
    bool any = false;
    while (ss >> tok) {
      any = true;
      const size_t eq = tok.find('=');
      if (eq == std::string::npos) throw ConfigError(where + ": malformed token '" + tok + "' (expected Key=Value)");
      const std::string key = tok.substr(0, eq), value = tok.substr(eq + 1);
      try {
        if (key == "SwitchName") name = value;
        else if (key == "Switches") s.switches = expand_hostlist(value);
        else if (key == "Nodes") s.nodes = expand_hostlist(value);
        else if (key != "LinkSpeed" && key != "Level")  // Level: `scontrol show topology` prints it
          throw ConfigError(where + ": unknown key '" + key + "' (SwitchName, Switches, Nodes, LinkSpeed, Level)");
      } catch (const std::invalid_argument& e) {
        throw ConfigError(where + ": malformed hostlist " + e.what());
      }
    }
    if (!any) continue;
    if (name.empty()) throw ConfigError(where + ": line without SwitchName=");
    if (sw.count(name)) throw ConfigError(where + ": switch '" + name + "' defined twice (first on line " + std::to_string(sw[name].line) + ")");
    sw[name] = s;
    order.push_back(name);
  }
  // Every child switch must exist and have one parent; the graph must be a forest.
  std::map<std::string, std::string> parent;
  for (const auto& name : order)
    for (const auto& child : sw[name].switches) {
      const std::string where = path + ":" + std::to_string(sw[name].line);
      if (!sw.count(child)) throw ConfigError(where + ": switch '" + name + "' lists unknown switch '" + child + "'");
      if (parent.count(child))
        throw ConfigError(where + ": switch '" + child + "' is under both '" + parent[child] + "' and '" + name + "'");
      parent[child] = name;
    }
  for (const auto& name : order) {
    std::set<std::string> seen{name};
    for (std::string cur = name; parent.count(cur);) {
      cur = parent[cur];
      if (!seen.insert(cur).second)
        throw ConfigError(path + ":" + std::to_string(sw[name].line) + ": switch '" + name + "' is part of a cycle");
    }
  }
  for (const auto& name : order) {
    const SwitchLine& s = sw[name];
    // A switch above other switches is no rack, even when it lists Nodes= (`scontrol show
    // topology` gives every switch the nodes below it).
    if (s.nodes.empty() || !s.switches.empty()) continue;
    const int64_t idx = int64_t(t.leaves_.size());
    t.leaves_.push_back(name);
    for (const auto& host : s.nodes) {
      auto [it, inserted] = t.leaf_of_.emplace(host, idx);
      if (!inserted)
        throw ConfigError(path + ":" + std::to_string(s.line) + ": node '" + host + "' is under two leaf switches ('" +
                          t.leaves_[size_t(it->second)] + "' and '" + name + "')");
      t.hosts_.push_back(host);
    }
  }
  return t;
}

void Topology::add_slurm_address(const std::string& host, const std::string& addr, const std::string& pattern) {
  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    std::string cur;
    for (char c : s) {
      if (c == '.') v.push_back(cur), cur.clear();
      else cur += c;
    }
    v.push_back(cur);
    return v;
  };
  const auto a = split(addr), p = split(pattern);
  if (a.size() != p.size() || p.back() != "node")
    throw ConfigError("SLURM_TOPOLOGY_ADDR '" + addr + "' does not match SLURM_TOPOLOGY_ADDR_PATTERN '" + pattern + "'");
  source_ = "SLURM_TOPOLOGY_ADDR";
  const std::string leaf = a.size() >= 2 ? a[a.size() - 2] : "";
  int64_t idx = -1;
  for (size_t i = 0; i < leaves_.size(); ++i)
    if (leaves_[i] == leaf) idx = int64_t(i);
  if (idx < 0) idx = int64_t(leaves_.size()), leaves_.push_back(leaf);
  if (leaf_of_.emplace(host, idx).second) hosts_.push_back(host);
}

int64_t Topology::rack_of(const std::string& host) const {
  if (leaf_of_.empty()) return 0;
  auto it = leaf_of_.find(host);
  if (it == leaf_of_.end()) throw ConfigError(source_ + ": node '" + host + "' of this job is not in the topology");
  return it->second;
}

std::string Topology::rack_name(int64_t index) const {
  return index >= 0 && index < int64_t(leaves_.size()) ? leaves_[size_t(index)] : std::string();
}

std::vector<RankPlace> places_from_hosts(const std::vector<std::string>& host_of_rank, const Topology& topo,
                                         int64_t nodes_per_rack) {
  std::map<std::string, int64_t> node_of, next_local;
  std::vector<RankPlace> out;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    const std::string& h = host_of_rank[r];
    auto [it, inserted] = node_of.emplace(h, int64_t(node_of.size()));
    RankPlace p;
    p.rank = int64_t(r);
    p.host = h;
    p.node = it->second;
    p.local_rank = next_local[h]++;
    p.rack = !topo.empty() ? topo.rack_of(h) : nodes_per_rack > 0 ? p.node / nodes_per_rack : 0;
    out.push_back(p);
  }
  return out;
}

std::vector<RankPlace> synthetic_places(int64_t world, int64_t ranks_per_node, int64_t nodes_per_rack,
                                        const Topology& topo, const std::vector<std::string>& hosts) {
  const int64_t nodes = (world + ranks_per_node - 1) / ranks_per_node;
  if (!hosts.empty() && int64_t(hosts.size()) < nodes)
    throw ConfigError(topo.source() + ": " + std::to_string(world) + " ranks at " + std::to_string(ranks_per_node) +
                      " per node need " + std::to_string(nodes) + " nodes, the topology lists " + std::to_string(hosts.size()));
  std::vector<std::string> host_of_rank(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    const int64_t n = r / ranks_per_node;
    char buf[32];
    std::snprintf(buf, sizeof buf, "node%04lld", (long long)n);
    host_of_rank[size_t(r)] = hosts.empty() ? std::string(buf) : hosts[size_t(n)];
  }
  return places_from_hosts(host_of_rank, topo, nodes_per_rack);
}

}  // namespace meshtrain
