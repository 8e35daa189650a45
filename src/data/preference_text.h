// TRL's preference datasets as text (docs/preference.md), one pair a line of a `.jsonl`, tokenized
// into TRL's tokenized columns (data/preference_pairs.h):
//   conversational  {"prompt": [messages], "chosen": [messages], "rejected": [messages]}
//   implicit prompt {"chosen": [conversation], "rejected": [conversation]}: the prompt is the
//                   leading messages both share (TRL's extract_prompt), ending before an answer
//   plain text      {"prompt": "...", "chosen": "...", "rejected": "..."}
// Conversations go through the chat template as `prepare --chat` renders them (the template
// places BOS and the end-of-turn tokens): the prompt is the prompt messages and the assistant's
// generation prefix, each answer the rest of prompt + answer. Plain text is tokenized as TRL's
// DPO data step does: prompt, chosen and rejected each on its own, the tokenizer's BOS (if any)
// before the prompt and its EOS after each answer.
#pragma once
#include <filesystem>
#include <vector>

#include "data/preference_pairs.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace longtron::data {

/// Every pair of a `.jsonl` file in TRL's formats. `chat` (nullptr: none) renders conversations;
/// a conversational line without it is an Error. Throws Error naming the file and line for a
/// line of none of the formats, a conversation the template cannot render, a prompt that does
/// not end with a user message, an implicit prompt that the two conversations do not share, or
/// a pair that encodes to an empty prompt or answer.
std::vector<PairIds> read_preference_text(const std::filesystem::path& file,
                                          const text::Tokenizer& tokenizer,
                                          const text::ChatTemplate* chat);

}  // namespace longtron::data
