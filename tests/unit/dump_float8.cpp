// Writes meshtrain's Float8 emulation (tensor/float8.hpp) of a float32 matrix for
// validation/check_float8.py, which compares it bit for bit with an independent NumPy emulation.
// usage: dump_float8 IN.f32 ROWS COLS OUTDIR
//   IN.f32: ROWS × COLS little-endian float32, row-major. Writes into OUTDIR, per format F in
//   e4m3, e5m2: round_F.f32 (float8_round of every element, no scaling) and, per scaling G in
//   tensorwise, rowwise, columnwise and P in 0, 1 (power-of-two scales): fq_F_G_P.f32
//   (float8_fake_quantize) and scale_F_G_P.f32 (its scales).
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/float8.hpp"

using namespace meshtrain;

namespace {

void write(const std::string& path, const std::vector<float>& v) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(v.data(), sizeof(float), v.size(), f) != v.size()) throw std::runtime_error("cannot write " + path);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: dump_float8 IN.f32 ROWS COLS OUTDIR\n");
    return 2;
  }
  const int64_t rows = std::atoll(argv[2]), cols = std::atoll(argv[3]);
  const std::string out = argv[4];
  std::vector<float> x(size_t(rows * cols));
  FILE* f = std::fopen(argv[1], "rb");
  if (!f || std::fread(x.data(), sizeof(float), x.size(), f) != x.size()) {
    std::fprintf(stderr, "dump_float8: cannot read %lld floats from %s\n", (long long)(rows * cols), argv[1]);
    return 1;
  }
  std::fclose(f);
  const std::pair<const char*, Float8Scaling> scalings[] = {
      {"tensorwise", Float8Scaling::kTensorwise}, {"rowwise", Float8Scaling::kRowwise}, {"columnwise", Float8Scaling::kColumnwise}};
  for (const char* name : {"e4m3", "e5m2"}) {
    const Float8Format fmt = parse_float8_format(name);
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = float8_round(x[i], fmt);
    write(out + "/round_" + name + ".f32", r);
    for (const auto& [g, scaling] : scalings)
      for (int p : {0, 1}) {
        std::vector<float> q(x.size()), s(size_t(scaling == Float8Scaling::kTensorwise ? 1
                                                 : scaling == Float8Scaling::kRowwise  ? rows
                                                                                       : cols));
        float8_fake_quantize(x.data(), rows, cols, fmt, scaling, p == 1, q.data(), s.data());
        const std::string tag = std::string(name) + "_" + g + "_" + std::to_string(p);
        write(out + "/fq_" + tag + ".f32", q);
        write(out + "/scale_" + tag + ".f32", s);
      }
  }
  return 0;
}
