#define BOOST_TEST_MODULE mesh_comms
#include <boost/test/unit_test.hpp>
#include <numeric>

#include "comm/mesh_communicators.hpp"
#include "topology/discovery.hpp"

using namespace meshtrain;

namespace {

struct MpiFixture {
  MpiFixture() { runtime = std::make_unique<MpiRuntime>(&boost::unit_test::framework::master_test_suite().argc,
                                                       &boost::unit_test::framework::master_test_suite().argv); }
  ~MpiFixture() { runtime.reset(); }
  static inline std::unique_ptr<MpiRuntime> runtime;
};

ParallelDims dims(int64_t pp, int64_t rep, int64_t shard, int64_t cp, int64_t tp) {
  ParallelDims d;
  d.pp = pp, d.dp_replicate = rep, d.dp_shard = shard, d.cp = cp, d.tp = tp;
  return d;
}

Tensor host_tensor(CachingAllocator& a, std::vector<float> v) {
  Tensor t = Tensor::empty(&a, {int64_t(v.size())}, DType::kF32, MemCategory::kCommunication);
  std::copy(v.begin(), v.end(), t.f32());
  return t;
}

// Every collective on every dimension against the same result computed serially from the layout.
void check_layout(const ParallelDims& d) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  TopologySection topo_cfg;
  topo_cfg.simulate = true;
  topo_cfg.ranks_per_node = 4;
  topo_cfg.nodes_per_rack = 1;
  const RankLayout layout(d, discover_places(MPI_COMM_WORLD, topo_cfg, Topology()));
  MeshCommunicators comms(world, layout);
  CachingAllocator alloc([](size_t n) { return std::malloc(n); }, [](void* p, size_t) { std::free(p); });
  const int64_t me = world.rank();
  for (int di = 0; di < kNumMeshDims; ++di) {
    const MeshDim dim = MeshDim(di);
    Communicator& c = comms.get(dim);
    const auto group = layout.group(dim, me);
    const int n = int(group.size());
    BOOST_TEST(c.size() == n);
    BOOST_TEST(c.rank() == layout.key(dim, me));
    BOOST_TEST(group[size_t(c.rank())] == me);
    // all_reduce
    Tensor t = host_tensor(alloc, {float(me + 1), float(2 * me), 1.0f});
    c.all_reduce(t, ReduceOp::kSum)->wait();
    float s0 = 0, s1 = 0;
    for (int64_t r : group) s0 += float(r + 1), s1 += float(2 * r);
    BOOST_TEST(t.f32()[0] == s0);
    BOOST_TEST(t.f32()[1] == s1);
    BOOST_TEST(t.f32()[2] == float(n));
    BOOST_TEST(c.bytes_sent()[int(CollectiveKind::kAllReduce)] == 2 * 12 * (n - 1) / n);
    // all_gather: rank order of the group
    Tensor in = host_tensor(alloc, {float(me)});
    Tensor out = host_tensor(alloc, std::vector<float>(size_t(n), -1.0f));
    c.all_gather(in, out)->wait();
    for (int i = 0; i < n; ++i) BOOST_TEST(out.f32()[i] == float(group[size_t(i)]));
    // reduce_scatter: block k of the sum goes to the member with key k
    std::vector<float> v(static_cast<size_t>(2 * n));
    for (int j = 0; j < 2 * n; ++j) v[size_t(j)] = float(me * 100 + j);
    Tensor rs_in = host_tensor(alloc, v), rs_out = host_tensor(alloc, {0, 0});
    c.reduce_scatter(rs_in, rs_out, ReduceOp::kSum)->wait();
    for (int j = 0; j < 2; ++j) {
      float want = 0;
      for (int64_t r : group) want += float(r * 100 + 2 * c.rank() + j);
      BOOST_TEST(rs_out.f32()[j] == want);
    }
    // broadcast from key 0
    Tensor b = host_tensor(alloc, {float(me)});
    c.broadcast(b, 0)->wait();
    BOOST_TEST(b.f32()[0] == float(group[0]));
    // all_to_all: block j of rank i lands as block i of rank j
    std::vector<float> a2a(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) a2a[size_t(j)] = float(me * 10 + j);
    Tensor a_in = host_tensor(alloc, a2a), a_out = host_tensor(alloc, std::vector<float>(size_t(n), -1.0f));
    c.all_to_all(a_in, a_out)->wait();
    for (int i = 0; i < n; ++i) BOOST_TEST(a_out.f32()[i] == float(group[size_t(i)] * 10 + c.rank()));
    // send / recv around the group's ring
    if (n > 1) {
      Tensor snd = host_tensor(alloc, {float(me)}), rcv = host_tensor(alloc, {-1.0f});
      auto rw = c.recv(rcv, (c.rank() + n - 1) % n, 7);
      auto sw = c.send(snd, (c.rank() + 1) % n, 7);
      sw->wait();
      rw->wait();
      BOOST_TEST(rcv.f32()[0] == float(group[size_t((c.rank() + n - 1) % n)]));
    }
    c.barrier();
  }
}

}  // namespace

BOOST_GLOBAL_FIXTURE(MpiFixture);

BOOST_AUTO_TEST_CASE(dp_shard2_tp4) { check_layout(dims(1, 1, 2, 1, 4)); }
BOOST_AUTO_TEST_CASE(dp_shard2_cp2_tp2) { check_layout(dims(1, 1, 2, 2, 2)); }
BOOST_AUTO_TEST_CASE(pp4_dp_shard2) { check_layout(dims(4, 1, 2, 1, 1)); }
BOOST_AUTO_TEST_CASE(pp2_dp_replicate2_dp_shard2) { check_layout(dims(2, 2, 2, 1, 1)); }
BOOST_AUTO_TEST_CASE(dp_shard2_tp2_pp2) { check_layout(dims(2, 1, 2, 1, 2)); }
