#define BOOST_TEST_MODULE data
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include <hdf5.h>

#include "data/corpus_reader.hpp"
#include "data/loader.hpp"
#include "data/sentencepiece_tokenizer.hpp"
#include "data/stats.hpp"
#include "data/token_store_writer.hpp"
#include "util/errors.hpp"
#include "scratch_dir.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

fs::path tmp_dir() {
  return meshtrain::testing::scratch_dir("meshtrain_test_data");
}

std::vector<Document> synthetic_docs(int n) {
  const char* words[] = {"the", "jury", "said", "election", "river", "money", "house", "council", "storm", "road",
                         "was", "fair", "closed", "empty", "yesterday", "city", "mayor", "reported", "found", "plan"};
  std::vector<Document> docs;
  uint64_t s = 1;
  for (int d = 0; d < n; ++d) {
    std::string text;
    for (int sent = 0; sent < 30; ++sent) {
      for (int w = 0; w < 8; ++w) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        text += std::string(words[(s >> 33) % 20]) + (w == 7 ? ".\n" : " ");
      }
    }
    docs.push_back({"doc" + std::to_string(d), text});
  }
  return docs;
}

const SentencePieceTokenizer& tokenizer() {
  static const auto tok = SentencePieceTokenizer::train(synthetic_docs(40), 320);
  return *tok;
}

std::string store_path() {
  static const std::string p = [] {
    const std::string path = (tmp_dir() / "store.h5").string();
    write_token_store(path, synthetic_docs(40), tokenizer(), 0.1, "synthetic");
    return path;
  }();
  return p;
}

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(tokenizer_round_trip) {
  const SentencePieceTokenizer& tok = tokenizer();
  BOOST_TEST(tok.vocab_size() <= 320);
  const auto ids = tok.encode_document("the jury said the river was closed.");
  BOOST_TEST(ids.back() == tok.eos_id());
  BOOST_TEST(tok.decode(std::vector<int32_t>(ids.begin(), ids.end() - 1)) == "the jury said the river was closed.");
  const auto odd = tok.encode_document("zebra ünïcode");  // unseen characters: byte fallback
  BOOST_TEST(tok.decode(std::vector<int32_t>(odd.begin(), odd.end() - 1)) == "zebra ünïcode");
  const auto again = SentencePieceTokenizer::from_model_bytes(tok.model_bytes(), "memory");
  BOOST_TEST(again->encode_document("the storm") == tok.encode_document("the storm"));
  BOOST_CHECK_THROW(SentencePieceTokenizer::from_model_bytes("garbage", "x.model"), DataError);
}

BOOST_AUTO_TEST_CASE(store_round_trip_and_dtype) {
  const TokenStore s(store_path());
  BOOST_TEST(s.vocab_size() == tokenizer().vocab_size());
  const auto& tr = s.split("train");
  const auto& va = s.split("validation");
  BOOST_TEST(tr.doc_offsets.size() + va.doc_offsets.size() - 2 == 40u);
  BOOST_TEST(va.doc_offsets.size() >= 2u);
  BOOST_TEST(tr.tokens[tr.doc_offsets[1] - 1] == tokenizer().eos_id());
  BOOST_TEST(s.tokenizer_model() == tokenizer().model_bytes());
  hid_t f = H5Fopen(store_path().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "/train/tokens", H5P_DEFAULT);
  hid_t t = H5Dget_type(ds);
  BOOST_TEST(H5Tget_size(t) == 2u);  // uint16 for a small vocabulary
  H5Tclose(t);
  H5Dclose(ds);
  H5Fclose(f);
  BOOST_TEST(unigram_entropy(va, s.vocab_size()) > 0.0);
  BOOST_TEST(unigram_entropy(va, s.vocab_size()) < std::log(double(s.vocab_size())));
  BOOST_CHECK_THROW(s.split("test"), DataError);
}

BOOST_AUTO_TEST_CASE(loader_order_is_seeded_disjoint_and_covers_an_epoch) {
  const TokenStore s(store_path());
  const auto& tr = s.split("train");
  const int64_t T = 16;
  DataLoader a(tr, T, 3), b(tr, T, 3), c(tr, T, 4);
  const int64_t n = a.num_samples();
  BOOST_TEST(n == (int64_t(tr.tokens.size()) - 1) / T);
  std::vector<int32_t> x(size_t(n * (T + 1))), y(x.size()), z(x.size());
  a.fetch(0, n, x.data());
  b.fetch(0, n, y.data());
  c.fetch(0, n, z.data());
  BOOST_TEST(x == y);  // same seed, same order
  BOOST_TEST(x != z);  // another seed, another order
  // An epoch visits every sample start once: collect first tokens' positions via content.
  std::multiset<std::vector<int32_t>> seen, all;
  for (int64_t i = 0; i < n; ++i) {
    seen.insert(std::vector<int32_t>(x.begin() + i * (T + 1), x.begin() + (i + 1) * (T + 1)));
    all.insert(std::vector<int32_t>(tr.tokens.begin() + i * T, tr.tokens.begin() + i * T + T + 1));
  }
  BOOST_TEST((seen == all));
  // Samples are seq_len + 1 consecutive tokens.
  DataLoader seq(tr, T, 3, false);
  std::vector<int32_t> one(size_t(T + 1));
  seq.fetch(2, 1, one.data());
  BOOST_TEST(std::equal(one.begin(), one.end(), tr.tokens.begin() + 2 * T));
}

BOOST_AUTO_TEST_CASE(cursor_resplits_over_any_dp_degree) {
  const TokenStore s(store_path());
  const int64_t T = 8, global = 8;
  // The samples of 3 global batches are the same set whatever dp × local × accumulation is.
  auto consumed = [&](int64_t dp, int64_t local) {
    DataLoader l(s.split("train"), T, 9);
    std::multiset<std::vector<int32_t>> out;
    std::vector<int32_t> buf(size_t(local * (T + 1)));
    for (int step = 0; step < 3; ++step) {
      for (int64_t m = 0; m < global / (local * dp); ++m)
        for (int64_t r = 0; r < dp; ++r) {
          l.micro_batch(m, r, dp, local, buf.data());
          for (int64_t i = 0; i < local; ++i)
            out.insert(std::vector<int32_t>(buf.begin() + i * (T + 1), buf.begin() + (i + 1) * (T + 1)));
        }
      l.advance(global);
    }
    BOOST_TEST(l.cursor() == 3 * global);
    return out;
  };
  const auto ref = consumed(1, 2);
  BOOST_TEST(ref.size() == 24u);
  BOOST_TEST((consumed(2, 2) == ref));
  BOOST_TEST((consumed(4, 2) == ref));
  BOOST_TEST((consumed(8, 1) == ref));
}

BOOST_AUTO_TEST_CASE(bad_stores_name_the_file) {
  const std::string missing = (tmp_dir() / "nope.h5").string();
  BOOST_CHECK_EXCEPTION(TokenStore{missing}, DataError, [&](const DataError& e) { return has(e.what(), missing); });
  const std::string junk = (tmp_dir() / "junk.h5").string();
  std::ofstream(junk) << "not hdf5";
  BOOST_CHECK_EXCEPTION(TokenStore{junk}, DataError, [&](const DataError& e) { return has(e.what(), "not an HDF5 file"); });
  // A truncated copy of a real store.
  const std::string trunc = (tmp_dir() / "trunc.h5").string();
  fs::copy_file(store_path(), trunc, fs::copy_options::overwrite_existing);
  fs::resize_file(trunc, fs::file_size(trunc) / 2);
  BOOST_CHECK_THROW(TokenStore{trunc}, DataError);
  // A token id outside the vocabulary.
  const std::string bad = (tmp_dir() / "bad_ids.h5").string();
  fs::copy_file(store_path(), bad, fs::copy_options::overwrite_existing);
  hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t a = H5Aopen(f, "vocab_size", H5P_DEFAULT);
  const int64_t tiny = 5;
  H5Awrite(a, H5T_NATIVE_INT64, &tiny);
  H5Aclose(a);
  H5Fclose(f);
  BOOST_CHECK_EXCEPTION(TokenStore{bad}, DataError, [](const DataError& e) { return has(e.what(), "outside the vocabulary [0, 5)"); });
  BOOST_CHECK_THROW(DataLoader(TokenStore(store_path()).split("validation"), 1000000, 1), DataError);
}

BOOST_AUTO_TEST_CASE(corpus_reader_rules) {
  const fs::path d = tmp_dir() / "corpus";
  fs::create_directories(d);
  std::ofstream(d / "b.txt") << "second";
  std::ofstream(d / "a.txt") << "first";
  std::ofstream(d / "empty.txt") << "  \n";
  const auto docs = read_corpus({d.string()});
  BOOST_TEST(docs.size() == 2u);
  BOOST_TEST(docs[0].text == "first");  // sorted by name, empty documents dropped
  std::ofstream(d / "c.txt", std::ios::binary) << "bad \xC3\x28 utf8";
  BOOST_CHECK_EXCEPTION(read_corpus({d.string()}), DataError,
                        [](const DataError& e) { return has(e.what(), "c.txt: byte 4 is not valid UTF-8"); });
  BOOST_CHECK_THROW(read_corpus({(d / "missing").string()}), DataError);
  BOOST_TEST(!is_validation_document(0, 0.0));
  BOOST_TEST(is_validation_document(0, 1.0));
}
