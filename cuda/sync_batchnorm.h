// The fp32 backends' synchronised batch norm (model.bn_group; cuda, cuda-tf32): cuDNN's batch norm
// has no place for a group's sums, so this one is ours (sync_bn.h), NCHW fp32 with the reference
// backend's passes and arithmetic in double where it sums.
#pragma once
#include <memory>

#include "cuda/context.h"
#include "nn/ops.h"

namespace rt::cuda {

// d.sync must be set; d.residual is not (the fp32 backends do not fuse the add).
std::unique_ptr<BatchNormOp<float>> make_sync_batchnorm(const BatchNormDesc& d, CudaContext& ctx);

}  // namespace rt::cuda
