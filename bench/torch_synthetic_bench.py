"""PyTorch side of bench/synthetic_vs_pytorch.sh: Horovod's pytorch_synthetic_benchmark.py on one
process, with the same flags and output as build/bench/synthetic_benchmark.

torchvision's model (conv1 rebuilt for the input's channel count, as dptrain's model.input_shape
does), SGD lr 0.01 momentum 0.9, one fixed batch of random images and labels, warm-up batches,
then iterations of several batches each; img/sec per iteration, mean +- 1.96 std, and a last line
RESULT {json} with img_per_sec_median.

    /usr/bin/python3 bench/torch_synthetic_bench.py --model resnet18 --input-shape 3,64,64 --threads 1
"""
import argparse
import json
import statistics
import timeit

import torch
import torch.nn.functional as F
import torchvision


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", choices=["resnet18", "resnet34", "resnet50"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--input-shape", default="3,224,224", help="C,H,W")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(42)
    torch.set_num_threads(args.threads)
    shape = [int(v) for v in args.input_shape.split(",")]
    model = getattr(torchvision.models, args.model)(num_classes=args.num_classes)
    if shape[0] != 3:
        model.conv1 = torch.nn.Conv2d(shape[0], 64, 7, 2, 3, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, args.num_classes, (args.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    print(f"Model: {args.model}\nBatch size: {args.batch_size}\n"
          f"Number of CPUs: 1 (threads per process: {args.threads})\nRunning warmup...", flush=True)
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    print("Running benchmark...", flush=True)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        print(f"Iter #{i}: {rates[-1]:.1f} img/sec per CPU", flush=True)
    mean = statistics.fmean(rates)
    spread = 1.96 * statistics.pstdev(rates)
    print(f"Img/sec per CPU: {mean:.1f} +-{spread:.1f}")
    print(f"Total img/sec on 1 CPU(s): {mean:.1f} +-{spread:.1f}")
    print("RESULT " + json.dumps({"bench": "synthetic", "framework": "pytorch", "torch": torch.__version__,
                                  "model": args.model, "batch": args.batch_size, "threads": args.threads,
                                  "input_shape": shape, "img_per_sec": rates, "img_per_sec_mean": mean,
                                  "img_per_sec_median": statistics.median(rates)}))


if __name__ == "__main__":
    main()
