#include "lockstep/runtime/cuda/ops/amp.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/amp.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf,
                 const Tensor& inv_scale) {
  check_device("amp_unscale_", found_inf.device(), {&inv_scale});
  DeviceGuard guard(found_inf.device().index);
  const cudaStream_t stream = stream_of(found_inf);
  for (const Tensor& g : grads) {
    check_device("amp_unscale_", found_inf.device(), {&g});
    LOCKSTEP_CUDA_CHECK(kernels::amp_unscale(elementwise_args<1>(g.shape(), {&g}),
                                             found_inf.data_ptr<float>(),
                                             inv_scale.data_ptr<float>(), stream));
  }
}

void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval) {
  check_device("amp_update_scale_", scale.device(), {&growth_tracker, &found_inf});
  DeviceGuard guard(scale.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::amp_update_scale(
      scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(), found_inf.data_ptr<float>(),
      growth_factor, backoff_factor, growth_interval, stream_of(scale)));
}

}  // namespace lockstep::runtime::cuda
