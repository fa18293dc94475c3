#include "wire/scratch_message.h"

#include <vector>

namespace tally::wire {
namespace {

struct ThreadScratch {
  // capnp::SUGGESTED_FIRST_SEGMENT_WORDS, the default builder's first segment.
  std::vector<capnp::word> words = std::vector<capnp::word>(capnp::SUGGESTED_FIRST_SEGMENT_WORDS);
  bool lent = false;
};

ThreadScratch& threadScratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

}  // namespace

ScratchMessage::ScratchMessage() {
  ThreadScratch& scratch = threadScratch();
  if (scratch.lent) {
    builder_.emplace();
    return;
  }
  scratch.lent = true;
  lent_ = true;
  builder_.emplace(kj::arrayPtr(scratch.words.data(), scratch.words.size()));
}

ScratchMessage::~ScratchMessage() {
  builder_.reset();  // zeroes the scratch words it used
  if (lent_) threadScratch().lent = false;
}

}  // namespace tally::wire
