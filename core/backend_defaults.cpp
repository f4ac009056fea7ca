// The backend table's default fused kernels: the separate kernels in sequence, with scratch buffers
// from the storage cache. A file of its own because it uses Storage, which sits above core/backend.h.
#include "core/backend.h"
#include "core/error.h"
#include "core/storage.h"

namespace dptrain {

void Backend::conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y,
                                  int32_t* argmax, const ConvPoolGeometry& g) {
  DPTRAIN_CHECK(g.conv.fuse_relu, "conv2d_relu_maxpool: the geometry must have fuse_relu set");
  Storage conv_out(sizeof(float) * g.conv.batch * g.conv.out_channels * g.conv.pixels(), device());
  conv2d(x, w, bias, conv_out.as<float>(), g.conv);
  maxpool2d(conv_out.as<float>(), y, argmax, g.pool);
}

void Backend::conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y,
                                           const float* x, const float* w, float* gx, float* gw, float* gbias,
                                           const ConvPoolGeometry& g) {
  // The separate kernels' backward reads the conv output only for ReLU's mask (output > 0), and only
  // where gradient arrives: at the windows' winners, whose output is the pooled value. Scattering y
  // like the gradient gives a tensor that is > 0 exactly there (a sum of copies of one value >= 0),
  // so conv2d_backward's own select runs on the same gradient: the same bits, Inf and NaN included.
  const int64_t conv_elements = g.conv.batch * g.conv.out_channels * g.conv.pixels();
  Storage gconv(sizeof(float) * conv_elements, device()), mask(sizeof(float) * conv_elements, device());
  fill(gconv.as<float>(), conv_elements, 0.0f);
  maxpool2d_backward(gy, argmax, gconv.as<float>(), g.pool);
  fill(mask.as<float>(), conv_elements, 0.0f);
  maxpool2d_backward(y, argmax, mask.as<float>(), g.pool);
  conv2d_backward(gconv.as<float>(), x, w, mask.as<float>(), gx, gw, gbias, g.conv);
}

}  // namespace dptrain
