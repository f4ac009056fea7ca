#!/usr/bin/env python3
"""PyTorch eager on a GPU, the baseline of bench/gpu_vs_pytorch.sh: the MNIST CNN and MLP of
configs/mnist.json and configs/mnist_mlp.json, Adam lr 1e-3, cross entropy, real MNIST (IDX, raw or
.gz) in host memory, each batch gathered, pinned (PyTorch's caching pinned allocator, as a DataLoader
with pin_memory=True) and copied to the GPU without blocking, as the trainer uploads its batches.

  throughput: --warmup untimed steps, then --reps timed repetitions of --steps steps each; prints
              samples/s per repetition and their median.
  epochs:     --epochs full shuffled epochs with the test accuracy after each; prints the wall time.
Ends with one "RESULT {json}" line.
"""
import argparse
import gzip
import json
import os
import statistics
import time

import numpy as np
import torch
import torch.nn as nn


def read_idx(directory, stem):
    for name, opener in ((stem, open), (stem + ".gz", gzip.open)):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with opener(path, "rb") as f:
                data = f.read()
            dims = data[3]
            shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
            return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)
    raise SystemExit(f"torch_gpu_bench: {directory}/{stem}[.gz] not found")


def load(directory, train):
    prefix = "train" if train else "t10k"
    images = read_idx(directory, f"{prefix}-images-idx3-ubyte").astype(np.float32) / 255.0
    labels = read_idx(directory, f"{prefix}-labels-idx1-ubyte").astype(np.int64)
    x = torch.from_numpy((images - 0.1307) / 0.3081).unsqueeze(1)
    return x, torch.from_numpy(labels)


def make_model(name):
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 64), nn.ReLU(), nn.Linear(64, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--epochs", type=int, default=0, help="train this many epochs instead of timing steps")
    args = p.parse_args()

    # Plain fp32, as the trainer's default: no TF32 tensor cores.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    torch.manual_seed(0)
    x, y = load(args.data, True)
    model = make_model(args.model).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    n = x.shape[0]

    def step(index):
        xb = x[index].pin_memory().to(device, non_blocking=True)
        yb = y[index].pin_memory().to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss

    if args.epochs:
        tx, ty = load(args.data, False)
        start = time.perf_counter()
        accuracies = []
        for epoch in range(args.epochs):
            order = torch.randperm(n)
            for first in range(0, n, args.batch):
                step(order[first:first + args.batch])
            model.eval()
            with torch.no_grad():
                correct = sum((model(tx[i:i + 1000].to(device)).argmax(1) == ty[i:i + 1000].to(device)).sum().item()
                              for i in range(0, tx.shape[0], 1000))
            model.train()
            accuracies.append(correct / tx.shape[0])
            print(f"epoch {epoch + 1}: test accuracy {100 * accuracies[-1]:.2f}%", flush=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        print(f"{args.epochs} epochs in {seconds:.1f} s")
        print("RESULT " + json.dumps({"bench": "torch_gpu_epochs", "model": args.model, "batch": args.batch,
                                      "seconds": seconds, "test_accuracy": accuracies}))
        return

    g = torch.Generator().manual_seed(1)
    for _ in range(args.warmup):
        step(torch.randint(0, n, (args.batch,), generator=g))
    torch.cuda.synchronize()
    rates = []
    for rep in range(args.reps):
        start = time.perf_counter()
        for _ in range(args.steps):
            step(torch.randint(0, n, (args.batch,), generator=g))
        torch.cuda.synchronize()
        rates.append(args.steps * args.batch / (time.perf_counter() - start))
        print(f"rep {rep}: {rates[-1]:.0f} samples/s", flush=True)
    print("RESULT " + json.dumps({"bench": "torch_gpu", "model": args.model, "batch": args.batch,
                                  "samples_per_sec": statistics.median(rates), "by_rep": rates}))


if __name__ == "__main__":
    main()
