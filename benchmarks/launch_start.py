"""How long `launch` takes to start ranks: fresh processes (Popen) against warm ones (forked by
the zygote, fsdp_mini/launcher/warm.py), side by side in one run.

    python benchmarks/launch_start.py              # 2 repeats of every case
    python benchmarks/launch_start.py --repeats 3

Cases: a trivial function, and one that builds AdamW on a small model and takes one step (the
first optimizer imports torch._dynamo), at world size 2 and 4. Each case runs in a new caller
process, twice: the first launch is cold (for warm start it includes starting the zygote), the
second warm. Callers of both kinds alternate, so the machine's load hits both alike; medians.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [("trivial", 2), ("trivial", 4), ("adamw", 2), ("adamw", 4)]


def trivial(rank, world_size):
    return rank


def adamw(rank, world_size):
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    return rank


def caller(case, world_size):
    """In a new process: launch the case twice; print the two wall times as JSON."""
    sys.path.insert(0, os.path.dirname(HERE))
    from fsdp_mini import launch
    fn, times = {"trivial": trivial, "adamw": adamw}[case], []
    for _ in range(2):
        start = time.perf_counter()
        assert launch(fn, world_size) == list(range(world_size))
        times.append(time.perf_counter() - start)
    print(json.dumps(times))


def measure(case, world_size, warm):
    env = {**os.environ, "FSDP_MINI_WARM_START": "1" if warm else "0"}
    run = subprocess.run([sys.executable, __file__, "--caller", case, str(world_size)], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{case} x{world_size} (warm={warm}) failed:\n{run.stdout}{run.stderr}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--caller", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.caller:
        return caller(args.caller[0], int(args.caller[1]))
    print(f"{'case':<14}{'launch':>7}{'fresh s':>10}{'warm s':>9}{'fresh/warm':>12}")
    for case, world_size in CASES:
        runs = {False: [], True: []}
        for _ in range(args.repeats):
            for warm in (False, True):
                runs[warm].append(measure(case, world_size, warm))
        for i, which in enumerate(("cold", "warm")):
            fresh = statistics.median(r[i] for r in runs[False])
            warm = statistics.median(r[i] for r in runs[True])
            print(f"{case + ' x' + str(world_size):<14}{which:>7}{fresh:>10.2f}{warm:>9.2f}"
                  f"{fresh / warm:>11.1f}x", flush=True)


if __name__ == "__main__":
    main()
