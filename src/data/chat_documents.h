// A rendered conversation as a tokenized dataset stores it: the sign convention of data/dataset.h.
#pragma once
#include <cstdint>
#include <vector>

#include "text/chat_template.h"

namespace longtron::data {

/// Stored ids of the InternEvo convention: a token that is a loss-carrying target stays positive,
/// any other is stored negated; a loss-carrying id 0 is kStoredLossZero (data/dataset.h), which
/// only a pre-tokenized .jsonl can hold on disk. Never throws.
std::vector<int32_t> to_stored_ids(const text::EncodedConversation& encoded);

}  // namespace longtron::data
