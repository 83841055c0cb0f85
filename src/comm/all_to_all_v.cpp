// Argument rules of Communicator::all_to_all_v, shared by the MPI, NCCL and staged backends.
#include <stdexcept>
#include <string>

#include "comm/communicator.hpp"

namespace meshtrain {

int64_t all_to_all_v_row_elems(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                               const std::vector<int64_t>& recv_rows, int size) {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("all_to_all_v: " + what); };
  if (int(send_rows.size()) != size || int(recv_rows.size()) != size)
    fail(std::to_string(send_rows.size()) + " send and " + std::to_string(recv_rows.size()) + " receive counts for " +
         std::to_string(size) + " ranks");
  if (in.dtype() != out.dtype()) fail("in and out must have one dtype");
  if (in.ndim() < 1 || out.ndim() < 1) fail("in and out need a row dimension");
  const int64_t row = in.dim(0) ? in.numel() / in.dim(0) : shape_numel(Shape(in.shape().begin() + 1, in.shape().end()));
  const int64_t out_row =
      out.dim(0) ? out.numel() / out.dim(0) : shape_numel(Shape(out.shape().begin() + 1, out.shape().end()));
  if (row != out_row)
    fail("rows of " + std::to_string(row) + " and " + std::to_string(out_row) + " elements (in " +
         shape_str(in.shape()) + ", out " + shape_str(out.shape()) + ")");
  int64_t sent = 0, received = 0;
  for (int i = 0; i < size; ++i) {
    if (send_rows[size_t(i)] < 0 || recv_rows[size_t(i)] < 0) fail("negative row count for rank " + std::to_string(i));
    sent += send_rows[size_t(i)];
    received += recv_rows[size_t(i)];
  }
  if (sent != in.dim(0) || received != out.dim(0))
    fail("counts total " + std::to_string(sent) + " sent / " + std::to_string(received) + " received rows, tensors " +
         shape_str(in.shape()) + " / " + shape_str(out.shape()));
  return row;
}

}  // namespace meshtrain
