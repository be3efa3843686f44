// Sequence packing: first-fit-decreasing bins of documents, each packed row remembering its
// document lengths so positions restart and attention stays inside each document.
#pragma once
#include <cstdint>
#include <vector>

#include "text/dataset.h"

namespace qlora {

// Bins (lists of indices into `lengths`) of at most `capacity` tokens each, by first-fit
// decreasing. Equal lengths are ordered by a seeded shuffle, so the result depends only on
// (lengths, capacity, seed). Every length must be in [1, capacity].
std::vector<std::vector<int64_t>> pack_ffd(const std::vector<int64_t>& lengths, int64_t capacity, uint64_t seed);

struct PackStats {
  int64_t documents = 0, rows = 0, tokens = 0, capacity = 0;
  double efficiency() const { return rows ? double(tokens) / double(rows * capacity) : 0.0; }
};

// Documents -> packed rows (ids/labels concatenated, doc_lens set). The first label of every
// document is kNoLoss, so after the causal shift no target crosses from one document into the next.
std::vector<Example> pack_examples(const std::vector<Example>& docs, int64_t capacity, uint64_t seed,
                                   PackStats* stats);

}  // namespace qlora
