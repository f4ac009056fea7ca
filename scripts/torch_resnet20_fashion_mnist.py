#!/usr/bin/python3
"""PyTorch's figure for configs/resnet20_fashion_mnist.json: the same architecture and recipe under
DistributedDataParallel (gloo, CPU, 2 processes, 1 thread each), one seed.

Recipe (as the config): resnet20 (tests/fixtures/make_fixtures.py's ResNet20, torchvision's
BasicBlock), kaiming_normal fan_out convolutions; batch 128 per rank; pixels / 255 then
(x - 0.2860) / 0.3530; SGD lr 0.05 x world size, momentum 0.9, weight decay 5e-4; warm-up over 0.5
epoch from lr to lr x world size (Horovod's), then cosine to 0 at epoch 5, set before every step
from the fractional epoch; BatchNorm per rank (no SyncBN), rank 0's buffers broadcast each step
(DDP's broadcast_buffers). Prints the test accuracy of rank 0's model after each epoch and a last
line RESULT {json}.

    /usr/bin/python3 scripts/torch_resnet20_fashion_mnist.py [--epochs 5] [--np 2] [--seed 42]
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT.parent / "shared" / "anchors"))
import fmnist  # noqa: E402
from make_fixtures import ResNet20  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def lr_at(epoch, args, world):
    scaled = args.lr * world
    if epoch < args.warmup_epochs:
        return scaled / world * ((world - 1) / args.warmup_epochs * epoch + 1)
    t = min((epoch - args.warmup_epochs) / (args.epochs - args.warmup_epochs), 1.0)
    return scaled * 0.5 * (1 + math.cos(math.pi * t))


def accuracy(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    model.train()
    return correct / x.shape[0]


def worker(rank, world, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    normalize = lambda a: (torch.from_numpy(a.copy()) - MEAN) / STD
    xtr, ytr = fmnist.load("train")
    xte, yte = fmnist.load("test")
    xtr, xte = normalize(xtr), normalize(xte)
    ytr, yte = torch.from_numpy(ytr.copy()), torch.from_numpy(yte.copy())
    net = ResNet20(1, 10)
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    model = DDP(net, broadcast_buffers=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sampler = DistributedSampler(range(xtr.shape[0]), num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    steps_per_epoch = math.ceil(len(sampler) / args.batch)
    history = []
    for epoch in range(args.epochs):
        start = time.time()
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        for step in range(steps_per_epoch):
            idx = order[step * args.batch:(step + 1) * args.batch]
            for group in opt.param_groups:
                group["lr"] = lr_at(epoch + step / steps_per_epoch, args, world)
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
        if rank == 0:
            acc = accuracy(net, xte, yte)
            history.append(acc)
            print(f"epoch {epoch + 1}: test acc {100 * acc:.2f}% ({time.time() - start:.1f} s)", flush=True)
    if rank == 0:
        print("RESULT " + json.dumps({"framework": "pytorch", "torch": torch.__version__, "model": "resnet20",
                                      "ranks": world, "seed": args.seed, "test_accuracy": history}))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--warmup-epochs", type=float, default=0.5)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    mp.spawn(worker, args=(args.np, args), nprocs=args.np)


if __name__ == "__main__":
    main()
