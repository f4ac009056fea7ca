#!/usr/bin/python3
"""Loads a dptrain checkpoint into the equivalent torch.nn.Sequential and evaluates it on the test set.

    /usr/bin/python3 scripts/checkpoint_to_pytorch.py CHECKPOINT [--data-dir DIR] [--save MODEL.pt]

The model is rebuilt from the resolved config stored in the checkpoint's metadata; its weights are
the checkpoint's tensors under their PyTorch names ("{i}.weight", "{i}.bias"), loaded with
load_state_dict(strict=True). Prints one line: "pytorch: test loss L, accuracy A% (N of M correct)".
Needs Debian's python3-torch and python3-numpy (hence /usr/bin/python3); reads safetensors itself,
so the safetensors package is not needed.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

OPTIMIZER_PREFIX = "optimizer."
DTYPES = {"F32": np.float32, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + header_len])
    metadata = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors, metadata


def build_sequential(model_config):
    """The torch.nn.Sequential that layers/build.cpp builds from the same model config."""
    shape = list(model_config["input_shape"])
    layers = []
    for spec in model_config["layers"]:
        kind = spec["type"]
        if kind == "dense":
            layers.append(nn.Linear(shape[0], spec["out_features"], bias=spec.get("bias", True)))
            shape = [spec["out_features"]]
        elif kind == "conv2d":
            k, s, p = spec["kernel"], spec.get("stride", 1), spec.get("padding", 0)
            layers.append(nn.Conv2d(shape[0], spec["out_channels"], k, stride=s, padding=p, bias=spec.get("bias", True)))
            shape = [spec["out_channels"], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif kind == "maxpool2d":
            k = spec.get("kernel", 2)
            s = spec.get("stride", k)
            layers.append(nn.MaxPool2d(k, stride=s))
            shape = [shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1]
        elif kind == "flatten":
            layers.append(nn.Flatten())
            shape = [int(np.prod(shape))]
        elif kind == "dropout":
            layers.append(nn.Dropout(spec.get("p", 0.5)))
        else:
            layers.append({"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[kind]())
    return nn.Sequential(*layers)


def read_idx(directory, name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rb") as f:
                blob = f.read()
            ndim = blob[3]
            dims = struct.unpack(">" + "I" * ndim, blob[4 : 4 + 4 * ndim])
            return np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    sys.exit(f"checkpoint_to_pytorch: {directory}: no {name} (or {name}.gz)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--data-dir", help="IDX directory (default: data.dir of the stored config)")
    parser.add_argument("--save", help="also write the model's state_dict here with torch.save")
    args = parser.parse_args()

    tensors, metadata = read_safetensors(args.checkpoint)
    config = json.loads(metadata["config"])
    model = build_sequential(config["model"])
    weights = {k: v for k, v in tensors.items() if not k.startswith(OPTIMIZER_PREFIX)}
    model.load_state_dict(weights, strict=True)
    model.eval()
    if args.save:
        torch.save(model.state_dict(), args.save)

    data = config["data"]
    directory = args.data_dir or data["dir"]
    images = read_idx(directory, "t10k-images-idx3-ubyte")
    labels = read_idx(directory, "t10k-labels-idx1-ubyte")
    limit = data.get("max_test_samples", 0)
    if limit:
        images, labels = images[:limit], labels[:limit]
    # torchvision's ToTensor + Normalize, in its operation order.
    x = (torch.from_numpy(images.astype(np.float32)).div(255.0).unsqueeze(1) - data["mean"]) / data["std"]
    y = torch.from_numpy(labels.astype(np.int64))
    with torch.no_grad():
        logits = torch.cat([model(x[i : i + 1000]) for i in range(0, len(x), 1000)])
    loss = nn.functional.cross_entropy(logits, y).item()
    correct = int((logits.argmax(1) == y).sum())
    print(f"pytorch: test loss {loss:.4f}, accuracy {100 * correct / len(y):.2f}% ({correct} of {len(y)} correct)")


if __name__ == "__main__":
    main()
