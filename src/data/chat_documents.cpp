#include "data/chat_documents.h"

#include "data/dataset.h"

namespace longtron::data {

std::vector<int32_t> to_stored_ids(const text::EncodedConversation& encoded) {
  std::vector<int32_t> stored(encoded.ids.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    const int32_t id = encoded.ids[i];
    // Position 0 is no target, so its sign is free: stored negative like every no-loss token.
    const bool loss = i > 0 && encoded.loss[i];
    stored[i] = loss ? (id == 0 ? kStoredLossZero : id) : -id;
  }
  return stored;
}

}  // namespace longtron::data
