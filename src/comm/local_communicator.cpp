// The one-rank communicator (Marian's fake single-process communicator): every collective of a
// group of one is the identity or a copy, so the single-process code path is the distributed one
// with size() == 1.
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"

namespace longtron::comm {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::shared_ptr<Communicator> split(int color, int /*key*/) override {
    check(color >= 0, "communicator: split color must be >= 0, got {}", color);
    return std::make_shared<LocalCommunicator>();
  }

 protected:
  Work do_issue(const Op& op, const void* send, void* recv,
                const std::vector<int64_t>* counts) override {
    int64_t n = counts ? (*counts)[0] : op.count;
    // all_reduce and broadcast are in place; gathers/scatters/all_to_all of one rank copy (the
    // _v forms: the one chunk, counts[0]).
    if (send != recv && n > 0) std::memmove(recv, send, size_t(n * dtype_size(op.dtype)));
    return Work();
  }
  std::vector<int64_t> gather_check_words(const std::vector<int64_t>& words) override {
    return words;
  }
};

}  // namespace

CommPtr make_local_communicator() { return std::make_shared<LocalCommunicator>(); }

}  // namespace longtron::comm
