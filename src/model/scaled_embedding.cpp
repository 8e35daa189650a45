#include "model/scaled_embedding.h"

#include "model/params.h"
#include "ops/threads.h"

namespace longtron::model {

template <typename T>
void ScaledEmbedding<T>::forward(T* x, const int32_t* ids, int64_t N, const Params<T>& params) {
  inner_->forward(x, ids, N, params);
  const int64_t n = N * H_;
#pragma omp parallel for simd schedule(static) if (n > kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) x[i] *= scale_;
}

template <typename T>
void ScaledEmbedding<T>::backward(const T* dx, const int32_t* ids, int64_t N, Params<T>* grads) {
  if (grads == nullptr) return;
  const int64_t n = N * H_;
  T* scaled = dx_.get(n);
#pragma omp parallel for simd schedule(static) if (n > kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) scaled[i] = dx[i] * scale_;
  inner_->backward(scaled, ids, N, grads);
}

template class ScaledEmbedding<float>;
template class ScaledEmbedding<double>;

}  // namespace longtron::model
