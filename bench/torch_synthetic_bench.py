"""PyTorch side of bench/synthetic_vs_pytorch.sh: Horovod's pytorch_synthetic_benchmark.py on one
process, with the same flags and output as build/bench/synthetic_benchmark.

torchvision's model (conv1 rebuilt for the input's channel count, as dptrain's model.input_shape
does), SGD lr 0.01 momentum 0.9, one fixed batch of random images and labels, warm-up batches,
then iterations of several batches each; img/sec per iteration, mean +- 1.96 std, and a last line
RESULT {json} with img_per_sec_median. On a GPU (--device cuda) each timed iteration ends with a
synchronisation, so the time covers the work and not only its launch.

    /usr/bin/python3 bench/torch_synthetic_bench.py --model resnet18 --input-shape 3,64,64 --threads 1
    python3 bench/torch_synthetic_bench.py --model resnet50 --batch-size 64 --device cuda
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
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--no-tf32", action="store_true",
                        help="plain fp32 convolutions on a GPU (PyTorch's default allows TF32 in cuDNN)")
    args = parser.parse_args()
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    torch.manual_seed(42)
    torch.set_num_threads(args.threads)
    shape = [int(v) for v in args.input_shape.split(",")]
    model = getattr(torchvision.models, args.model)(num_classes=args.num_classes)
    if shape[0] != 3:
        model.conv1 = torch.nn.Conv2d(shape[0], 64, 7, 2, 3, bias=False)
    device = torch.device(args.device)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(args.batch_size, *shape).to(device)
    target = torch.randint(0, args.num_classes, (args.batch_size,)).to(device)
    unit = "CPU" if args.device == "cpu" else "GPU"

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def timed(batches):
        def run():
            for _ in range(batches):
                benchmark_step()
            if args.device == "cuda":
                torch.cuda.synchronize()
        return timeit.timeit(run, number=1)

    print(f"Model: {args.model}\nBatch size: {args.batch_size}\n"
          f"Number of {unit}s: 1 (threads per process: {args.threads})\nRunning warmup...", flush=True)
    timed(args.num_warmup_batches)
    print("Running benchmark...", flush=True)
    rates = []
    for i in range(args.num_iters):
        seconds = timed(args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        print(f"Iter #{i}: {rates[-1]:.1f} img/sec per {unit}", flush=True)
    mean = statistics.fmean(rates)
    spread = 1.96 * statistics.pstdev(rates)
    print(f"Img/sec per {unit}: {mean:.1f} +-{spread:.1f}")
    print(f"Total img/sec on 1 {unit}(s): {mean:.1f} +-{spread:.1f}")
    print("RESULT " + json.dumps({"bench": "synthetic", "framework": "pytorch", "torch": torch.__version__,
                                  "device": args.device, "tf32": not args.no_tf32,
                                  "model": args.model, "batch": args.batch_size, "threads": args.threads,
                                  "input_shape": shape, "img_per_sec": rates, "img_per_sec_mean": mean,
                                  "img_per_sec_median": statistics.median(rates)}))


if __name__ == "__main__":
    main()
