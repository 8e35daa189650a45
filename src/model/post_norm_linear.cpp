#include "model/post_norm_linear.h"

namespace longtron::model {

template <typename T>
void PostNormLinear<T>::forward(T* y, const T* x, int64_t N, const Params<T>& params) {
  T* z = z_.get(N * out());
  linear_->forward(z, x, N, params);
  norm_->forward(y, rstd_.get(N), z, N, params);
}

template <typename T>
void PostNormLinear<T>::backward(T* dx, const T* dy, const T* x, int64_t N,
                                 const Params<T>& params, Params<T>* grads, bool accumulate_dx) {
  T* z = z_.get(N * out());
  T* rstd = rstd_.get(N);
  T* dz = dz_.get(N * out());
  linear_->forward(z, x, N, params);
  norm_->forward(dz, rstd, z, N, params);  // the rstd (dz is overwritten next)
  norm_->backward(dz, dy, z, rstd, N, params, grads);
  linear_->backward(dx, dz, x, N, params, grads, accumulate_dx);
}

template class PostNormLinear<float>;
template class PostNormLinear<double>;

}  // namespace longtron::model
