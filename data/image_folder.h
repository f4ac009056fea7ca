// The "image_folder" dataset format: torchvision's ImageFolder layout of PNG and JPEG files.
#pragma once

#include <memory>

#include "data/dataset.h"

namespace dptrain::data {

struct DatasetRequest;  // data/registry.h, which lists this format: a forward declaration keeps them acyclic

// Opens <dir>/train or <dir>/test (request.train) laid out as <split>/<class>/<image>: the classes are
// the sub-folders in byte order (label = position), each one's .png, .jpg and .jpeg files (any case)
// in byte order, samples class by class; other files are ignored. Only the paths are kept: read()
// decodes, converts to request.sample_shape's C channels, resizes the shorter side to
// request.resize (when > 0) and center-crops to H x W. Throws dptrain::Error for a layout it cannot
// use: the split missing, no class folders, an empty class, more classes than request.model_classes.
std::unique_ptr<Dataset> open_image_folder(const DatasetRequest& request);

}  // namespace dptrain::data
