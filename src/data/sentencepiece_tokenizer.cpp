#include "data/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "util/errors.hpp"

namespace meshtrain {

namespace {

// Feeds the corpus to the trainer line by line without a temporary file.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<Document>& docs) : docs_(docs) { advance(); }
  bool done() const override { return doc_ >= docs_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (doc_ < docs_.size()) {
      const std::string& t = docs_[doc_].text;
      if (pos_ >= t.size()) {
        ++doc_, pos_ = 0;
        continue;
      }
      size_t end = t.find('\n', pos_);
      if (end == std::string::npos) end = t.size();
      line_ = t.substr(pos_, end - pos_);
      pos_ = end + 1;
      if (line_.find_first_not_of(" \t\r") != std::string::npos) return;
    }
  }
  const std::vector<Document>& docs_;
  size_t doc_ = 0, pos_ = 0;
  std::string line_;
};

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::train(const std::vector<Document>& docs, int64_t vocab_size) {
  if (vocab_size < 300 || vocab_size > 1000000)
    throw DataError("--vocab-size " + std::to_string(vocab_size) + " is out of range [300, 1000000] (byte fallback needs 259 pieces)");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},          {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},      {"character_coverage", "1.0"},
      {"hard_vocab_limit", "false"},  {"num_threads", "2"},
      {"max_sentence_length", "65536"}, {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "false"}, {"unk_id", "0"}, {"bos_id", "1"}, {"eos_id", "2"}, {"pad_id", "-1"},
      {"minloglevel", "2"}};
  LineIterator it(docs);
  std::unique_ptr<SentencePieceTokenizer> tok(new SentencePieceTokenizer());
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &tok->model_);
  if (!st.ok()) throw DataError("SentencePiece training failed: " + st.ToString());
  const auto ls = tok->sp_->LoadFromSerializedProto(tok->model_);
  if (!ls.ok()) throw DataError("SentencePiece model load failed: " + ls.ToString());
  return tok;
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_model_bytes(const std::string& bytes,
                                                                                const std::string& source) {
  std::unique_ptr<SentencePieceTokenizer> tok(new SentencePieceTokenizer());
  tok->model_ = bytes;
  const auto st = tok->sp_->LoadFromSerializedProto(bytes);
  if (!st.ok()) throw DataError(source + ": not a SentencePiece model (" + st.ToString() + ")");
  return tok;
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto st = sp_->Encode(std::string(text), &ids);
  if (!st.ok()) throw DataError("SentencePiece encode failed: " + st.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  const auto st = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  if (!st.ok()) throw DataError("SentencePiece decode failed: " + st.ToString());
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t SentencePieceTokenizer::eos_id() const { return sp_->eos_id(); }
int32_t SentencePieceTokenizer::bos_id() const { return sp_->bos_id(); }

}  // namespace meshtrain
