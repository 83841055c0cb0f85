#pragma once
/// @file Writes the HDF5 token store (layout: doc/data-format.md), from one process or
/// collectively from every rank of an MPI communicator (parallel HDF5 over MPI-IO).
#include <mpi.h>

#include <functional>
#include <string>

#include "data/corpus_reader.hpp"
#include "data/token_store.hpp"
#include "data/tokenizer.hpp"

namespace meshtrain {

/// Statistics of a written store.
struct TokenStoreSummary {
  int64_t train_docs = 0, validation_docs = 0, train_tokens = 0, validation_tokens = 0, vocab_size = 0;
  int64_t skipped_lines = 0;  ///< bad JSON Lines skipped (--skip-bad-lines), all ranks
  uint64_t input_bytes = 0;   ///< bytes of the inputs (on disk)
};

/// What `meshtrain data prepare` writes: the corpus, the tokenizer, the split, the output.
struct PrepareRequest {
  std::vector<CorpusFile> files;
  CorpusOptions options;
  const Tokenizer* tokenizer = nullptr;
  double validation_fraction = 0.05;
  std::string source_description;  ///< stored as the `source` attribute
  std::string output;
  /// Called now and then while a rank tokenizes: (document bytes encoded so far, bytes of the
  /// rank's share of the inputs on disk).
  std::function<void(uint64_t, uint64_t)> progress;
};

/// Tokenizes the corpus and writes `request.output` through `output.tmp` + rename, so nothing
/// half-written is left on error. With an MPI communicator of P ranks, rank r reads and encodes
/// the documents whose first byte lies in the r-th P-th of the inputs' bytes (for_each_document)
/// and every rank writes its documents' hyperslabs of one file collectively; with MPI_COMM_NULL
/// one process does everything. Document i (global corpus order) goes to the validation split
/// when is_validation_document(i) (at least one document in each split), so the store's
/// datasets are identical for any P. Tokens are uint8, uint16 or uint32: the narrowest unsigned
/// type that holds vocab_size() ids.
/// @throws DataError on every rank (with the message of the lowest rank that failed) when an
///         input is bad, fewer than 2 documents remain, or writing fails.
TokenStoreSummary prepare_token_store(const PrepareRequest& request, MPI_Comm comm);

/// prepare_token_store for documents already in memory, on one process (tests).
/// @throws DataError as prepare_token_store.
TokenStoreSummary write_token_store(const std::string& path, const std::vector<Document>& docs, const Tokenizer& tok,
                                    double validation_fraction, const std::string& source_description);

/// Runs `f` on every rank of `comm` (or alone with MPI_COMM_NULL), then makes the ranks agree:
/// when `f` threw on any rank, every rank throws DataError with the lowest failing rank's
/// message, so no rank is left waiting in a collective. Collective over `comm`.
void run_on_every_rank(MPI_Comm comm, const std::function<void()>& f);

/// True when document `index` goes to the validation split (fraction in [0, 1]):
/// splitmix64(0xD0C5 ^ index) mod 10^6 < fraction * 10^6.
bool is_validation_document(int64_t index, double validation_fraction);

}  // namespace meshtrain
