// Module and the layer classes that code outside the registry constructs (Dense, Conv2D, BatchNorm2d,
// ResidualBlock, Sequential, ...), one header per family, gathered here for the code that uses models.
// Every layer is built with the name PyTorch gives it ("3" in a Sequential, "layer2.0.conv1" in a
// torchvision ResNet) and names its tensors "<name>.weight", "<name>.running_mean", ... with PyTorch's
// layouts, so weights and buffers exchange with the equivalent PyTorch model by name.
#pragma once

#include "layers/activation.h"
#include "layers/batchnorm.h"
#include "layers/conv.h"
#include "layers/dense.h"
#include "layers/module_base.h"
#include "layers/pooling.h"
#include "layers/residual.h"
#include "layers/sequential.h"
