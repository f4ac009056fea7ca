#!/usr/bin/env python3
"""Alpha-beta model of data-parallel step time: fitted here, checked against the sweep, extrapolated.

    python3 scripts/scaling_model.py --results runs/scaling/results.jsonl --allreduce runs/scaling/allreduce.txt
                                     [--cores N] [--csv OUT.csv] [--link-gbit 25] [--link-latency-us 5]
                                     [--resnet-compute-ms 250]

Allreduce of n bytes on N ranks, ring algorithm:  t(n, N) = 2(N-1) alpha + 2(N-1)/N * n / B.
alpha (latency) and B (bandwidth) are fitted to the 2-rank measurements of bench/allreduce_bench
(our reducer, fp32), by least squares on relative error. fp16 compression moves n/2 bytes and adds a
conversion cost per fp32 byte, fitted the same way.

Step time at N ranks, per-rank batch fixed: data + compute + optimizer, plus the communication that
does not overlap. On the machine the sweep ran on, the local terms are those measured in the N-rank
run itself: ranks there share cores, caches and memory bandwidth, which slows compute by a factor the
network model cannot know (here 10-20% at 2 ranks on 2 cores, 2x when oversubscribed), so the
prediction tests the communication term. For a cluster (the extrapolation), one rank per host, the
local terms are the 1-rank run's. The communication that does not overlap:
  - overlap off: every bucket's allreduce after backward, one after another;
  - overlap on: bucket i becomes ready when backward has produced its share of the gradient bytes
    (backward time x bytes so far / all bytes); allreduces run one at a time in bucket order; the
    last bucket is reduced after backward (as the reducer does). Exposed = end of the last allreduce
    - end of backward.
Efficiency = step time at 1 rank / step time at N.
Only the Python standard library is used.
"""
import argparse
import csv
import json
import math
import sys

RESNET50_PARAMETERS = 25.6e6


def read_results(path, bench):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("RESULT "):
                line = line[len("RESULT "):]
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("bench") == bench:
                rows.append(r)
    return rows


def fit_line(points):
    """a, b minimising sum(((a + b x - y) / y)^2): every size counts, not just the largest."""
    s_ww = s_wx = s_wxx = s_wy = s_wxy = 0.0
    for x, y in points:
        w = 1.0 / (y * y)
        s_ww += w
        s_wx += w * x
        s_wxx += w * x * x
        s_wy += w * y
        s_wxy += w * x * y
    det = s_ww * s_wxx - s_wx * s_wx
    a = (s_wy * s_wxx - s_wx * s_wxy) / det
    b = (s_ww * s_wxy - s_wx * s_wy) / det
    return max(a, 0.0), max(b, 1e-15)


class Link:
    """alpha (s), bandwidth (bytes/s) and the fp16 conversion cost (s per fp32 byte)."""

    def __init__(self, alpha, bandwidth, conversion):
        self.alpha, self.bandwidth, self.conversion = alpha, bandwidth, conversion

    def allreduce(self, nbytes, ranks, fp16=False):
        if ranks == 1:
            return 0.0
        moved = nbytes / 2 if fp16 else nbytes
        t = 2 * (ranks - 1) * self.alpha + 2 * (ranks - 1) / ranks * moved / self.bandwidth
        return t + (self.conversion * nbytes if fp16 else 0.0)


def fit_link(allreduce_rows):
    rows = [r for r in allreduce_rows if r["what"] == "synthetic"]
    if not rows:
        sys.exit("scaling_model: no allreduce measurements (bench/allreduce_bench RESULT lines)")
    n = rows[0]["ranks"]
    # At N ranks the ring gives t = 2(N-1) alpha + 2(N-1)/N * bytes / B.
    a, b = fit_line([(r["bytes"], r["ours_s"]) for r in rows])
    alpha, bandwidth = a / (2 * (n - 1)), 2 * (n - 1) / n / b
    a16, b16 = fit_line([(r["bytes"], r["fp16_s"]) for r in rows])
    conversion = max(b16 - b / 2, 0.0)
    return Link(alpha, bandwidth, conversion), n, rows


def exposed_communication(buckets, ranks, link, backward_s, overlap, fp16):
    times = [link.allreduce(b, ranks, fp16) for b in buckets]
    if not overlap or len(buckets) == 0:
        return sum(times)
    total = float(sum(buckets))
    done_bytes, comm_end = 0.0, 0.0
    for i, (nbytes, t) in enumerate(zip(buckets, times)):
        done_bytes += nbytes
        ready = backward_s if i == len(buckets) - 1 else backward_s * done_bytes / total
        comm_end = max(comm_end, ready) + t
    return max(comm_end - backward_s, 0.0)


def buckets_for(total_bytes, fusion_mb, first_mb):
    """Buckets of a model whose gradients are a continuous stream (no tensor boundaries)."""
    if fusion_mb <= 0:
        fusion_mb = 1.0  # one tensor per allreduce: ResNet-50's tensors average 0.6 MB
    sizes, left = [], total_bytes
    first = min(first_mb * 2**20, left) if first_mb > 0 else 0
    if first:
        sizes.append(first)
        left -= first
    while left > 0:
        sizes.append(min(fusion_mb * 2**20, left))
        left -= sizes[-1]
    return sizes


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True, help="train_bench RESULT lines (scripts/scaling.sh writes them)")
    p.add_argument("--allreduce", required=True, help="bench/allreduce_bench output at 2 ranks")
    p.add_argument("--cores", type=int, default=0, help="cores on the machine the sweep ran on (0: no sharing)")
    p.add_argument("--csv", help="write the sweep with predictions here")
    p.add_argument("--link-gbit", type=float, default=25.0, help="link bandwidth for the extrapolation")
    p.add_argument("--link-latency-us", type=float, default=5.0, help="per-message latency for the extrapolation")
    p.add_argument("--resnet-compute-ms", type=float, default=250.0,
                   help="forward + backward per step of ResNet-50 on one accelerator")
    p.add_argument("--label", default="", help="name of the setting measured (e.g. netns 100 Mbit/s)")
    args = p.parse_args()

    link, fit_ranks, ar_rows = fit_link(read_results(args.allreduce, "allreduce"))
    runs = read_results(args.results, "train")
    base = next((r for r in runs if r["ranks"] == 1), None)
    if base is None:
        sys.exit("scaling_model: the sweep has no 1-rank run to scale from")
    s1 = base["step_ms"]
    local_ms = s1["data"] + s1["compute"] + s1["optimizer"]
    step1_s = s1["total"] / 1e3
    backward_fraction = base.get("backward_fraction", 0.65)
    print(f"fitted at {fit_ranks} ranks{' (' + args.label + ')' if args.label else ''}: alpha {link.alpha * 1e6:.2f} us, "
          f"bandwidth {link.bandwidth / 1e9:.3f} GB/s, fp16 conversion {link.conversion * 1e12:.1f} ps per fp32 byte")
    worst = max(abs(link.allreduce(r["bytes"], fit_ranks) / r["ours_s"] - 1) for r in ar_rows)
    print(f"  the fit reproduces the allreduce measurements (4 KiB - 4 MiB) within {100 * worst:.0f}%")
    print(f"1 rank: {base['samples_per_sec']:.0f} samples/s, step {s1['total']:.2f} ms "
          f"(data {s1['data']:.2f}, compute {s1['compute']:.2f} of which backward {100 * backward_fraction:.0f}%, "
          f"optimizer {s1['optimizer']:.2f})")

    print("\nprediction against measurement:")
    print(f"{'ranks':>5} {'compr':>5} {'fusion':>6} {'buckets':>7} {'measured':>10} {'predicted':>10} {'error':>7} "
          f"{'eff meas':>8} {'eff pred':>8} {'comm meas':>9} {'comm pred':>9}")
    table, errors = [], []
    for r in sorted(runs, key=lambda r: (r["ranks"], r["compression"], r["fusion_threshold_mb"])):
        n = r["ranks"]
        sn = r["step_ms"]
        fp16 = r["compression"] == "fp16"
        backward_s = sn["compute"] / 1e3 * r.get("backward_fraction", backward_fraction)
        comm = exposed_communication(r.get("bucket_bytes", []), n, link, backward_s, r.get("overlap", True), fp16)
        other = max(step1_s - local_ms / 1e3, 0.0)
        predicted_step = (sn["data"] + sn["compute"] + sn["optimizer"]) / 1e3 + other + comm
        predicted = n * r["batch"] / predicted_step
        measured = r["samples_per_sec"]
        error = predicted / measured - 1
        if n > 1:
            errors.append(abs(error))
        eff_measured = measured / (n * base["samples_per_sec"])
        eff_predicted = step1_s / predicted_step
        print(f"{n:>5} {r['compression']:>5} {r['fusion_threshold_mb']:>6g} {len(r.get('bucket_bytes', [])):>7} "
              f"{measured:>10.0f} {predicted:>10.0f} {100 * error:>+6.1f}% {eff_measured:>8.3f} {eff_predicted:>8.3f} "
              f"{r['step_ms']['communication']:>8.2f}m {comm * 1e3:>8.2f}m")
        table.append([n, r["compression"], r["fusion_threshold_mb"], f"{measured:.1f}", f"{eff_measured:.4f}",
                      f"{r['step_ms']['total']:.3f}", f"{r['step_ms']['data']:.3f}", f"{r['step_ms']['compute']:.3f}",
                      f"{r['step_ms']['communication']:.3f}", f"{r['step_ms']['optimizer']:.3f}",
                      int(bool(args.cores) and n > args.cores), f"{predicted:.1f}", f"{eff_predicted:.4f}",
                      f"{100 * error:.2f}"])
    if errors:
        print(f"largest prediction error over the multi-rank runs: {100 * max(errors):.1f}% "
              f"(mean {100 * sum(errors) / len(errors):.1f}%)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ranks", "compression", "fusion_mb", "samples_per_sec", "efficiency", "step_ms", "data_ms",
                        "compute_ms", "communication_ms", "optimizer_ms", "oversubscribed", "predicted_samples_per_sec",
                        "predicted_efficiency", "prediction_error_pct"])
            w.writerows(table)

    # Extrapolation to a cluster: one rank per host, the given link.
    net = Link(args.link_latency_us * 1e-6, args.link_gbit * 1e9 / 8, link.conversion)
    cnn_buckets = base.get("bucket_bytes") or [4 * base["parameters"]]
    cnn_compute = s1["compute"] / 1e3
    resnet_bytes = 4 * RESNET50_PARAMETERS
    models = [
        (f"MNIST CNN ({base['parameters']:,} parameters, {cnn_compute * 1e3:.1f} ms compute per step measured here)",
         cnn_buckets, cnn_compute, step1_s - cnn_compute),
        (f"ResNet-50 (25.6 M parameters, {args.resnet_compute_ms:g} ms compute per step given)",
         buckets_for(resnet_bytes, 4, 1), args.resnet_compute_ms / 1e3, 0.0),
    ]
    print(f"\nextrapolation: ring allreduce over {args.link_gbit:g} Gbit/s links, {args.link_latency_us:g} us latency, "
          f"fusion 4 MiB (first bucket 1 MiB), backward {100 * backward_fraction:.0f}% of compute")
    for name, buckets, compute_s, rest_s in models:
        print(name)
        print(f"  {'ranks':>5} {'comm fp32':>10} {'eff no overlap':>14} {'eff overlap':>11} {'eff overlap+fp16':>16}")
        one = compute_s + rest_s
        for n in [8, 16, 32, 64, 128, 256, 512]:
            bwd = compute_s * backward_fraction
            effs = [one / (one + exposed_communication(buckets, n, net, bwd, overlap, fp16))
                    for overlap, fp16 in ((False, False), (True, False), (True, True))]
            comm = sum(net.allreduce(b, n) for b in buckets)
            print(f"  {n:>5} {comm * 1e3:>8.2f}ms {effs[0]:>14.3f} {effs[1]:>11.3f} {effs[2]:>16.3f}")


if __name__ == "__main__":
    main()
