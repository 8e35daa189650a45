#include "model/softcap_cross_entropy.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::model {

template <typename T>
SoftcapCrossEntropy<T>::SoftcapCrossEntropy(ChunkCrossEntropy<T>& inner, int64_t Vc, double cap)
    : inner_(inner), Vc_(Vc), cap_(static_cast<T>(cap)) {
  check(cap > 0, "final_logit_softcapping must be positive, got {}", cap);
}

template <typename T>
const T* SoftcapCrossEntropy<T>::cap_rows(const T* logits, int64_t rows) {
  const int64_t n = rows * Vc_;
  T* c = capped_.get(n);
  std::copy(logits, logits + n, c);
  ops::logit_softcap_forward(c, n, cap_);
  return c;
}

template <typename T>
double SoftcapCrossEntropy<T>::forward(T* lse, int64_t* count, const T* logits,
                                       const int32_t* labels, int64_t rows) {
  return inner_.forward(lse, count, cap_rows(logits, rows), labels, rows);
}

template <typename T>
void SoftcapCrossEntropy<T>::token_losses(double* out, const T* logits, const T* lse,
                                          const int32_t* labels, int64_t rows) {
  inner_.token_losses(out, cap_rows(logits, rows), lse, labels, rows);
}

template <typename T>
void SoftcapCrossEntropy<T>::backward(T* dlogits, const T* logits, const T* lse,
                                      const int32_t* labels, int64_t rows, T scale) {
  const T* c = cap_rows(logits, rows);
  inner_.backward(dlogits, c, lse, labels, rows, scale);
  ops::logit_softcap_backward(dlogits, c, rows * Vc_, cap_);
}

template class SoftcapCrossEntropy<float>;
template class SoftcapCrossEntropy<double>;

}  // namespace longtron::model
