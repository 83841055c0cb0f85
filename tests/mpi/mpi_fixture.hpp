#pragma once
// The Boost.Test global fixture of the MPI unit tests: MPI is initialized before the first test
// case and finalized after the last (BOOST_TEST_GLOBAL_FIXTURE(MpiFixture) in each test file).
#include <boost/test/unit_test.hpp>

#include <memory>

#include "comm/mpi/mpi_communicator.hpp"

namespace meshtrain::testing {

struct MpiFixture {
  MpiFixture() {
    runtime = std::make_unique<MpiRuntime>(&boost::unit_test::framework::master_test_suite().argc,
                                           &boost::unit_test::framework::master_test_suite().argv);
  }
  ~MpiFixture() { runtime.reset(); }
  static inline std::unique_ptr<MpiRuntime> runtime;
};

}  // namespace meshtrain::testing
