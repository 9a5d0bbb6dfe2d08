"""Threads on a machine that is doing other things: segment passes a second of solving and steps a second of the
Sudoku quickstart's training, under each thread policy, alone and beside other work, each in a process of its own.

    python scripts/benchmark_threads.py                        # every policy and condition (about 10 minutes)
    python scripts/benchmark_threads.py --policies default,passive --conditions alone,one --seconds 5

Policies (how a process sets its OpenMP threads before torch starts):
  default   torch's own: as many threads as cores, OpenMP's default wait (threads spin a while before they sleep)
  one       OMP_NUM_THREADS=1
  passive   as many threads as cores, OMP_WAIT_POLICY=PASSIVE (an idle thread sleeps at once, never spins)
  spin      as many threads as cores, GOMP_SPINCOUNT=3000 (an idle thread spins about 30 us, then sleeps)
  free      as many threads as cores are free at start (/proc/loadavg's runnable count), OpenMP's default wait
  project   what the project's commands do (utils/threads.py): free's threads and spin's wait, the policy adopted
            from this table

Conditions (what else runs on the machine while it is measured):
  alone     nothing
  one, two  one or two plain Python loops (a CPU-bound process each)
  solve     a second solve.py-like process, the same workload, under the same policy

The workloads: **solving**, the bundled Sudoku model answering 16 trajectories of a hard puzzle side by side, segment
after segment (anytime solving's rounds), counted in segment passes a second; **training**, the TRM quickstart's
model (cfg_pretrain_trm_cpu: TRM-MLP, 0.5M parameters, batch 64, eager) on 81-cell Sudoku batches, counted in
optimizer steps a second. Each runs ``--seconds`` after a warm-up; the table gives each rate and its share of the
same policy's rate alone. The CPU, its GEMM rate and the precision head the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser, positive_int  # noqa: E402

POLICIES = ("default", "one", "passive", "spin", "free", "project")
CONDITIONS = ("alone", "one", "two", "solve")
HARD = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"  # Norvig's "hardest" #1
SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def policy_env(policy: str) -> dict[str, str]:
    """The environment a measured process starts with under ``policy`` (the project's own is chosen inside it)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HRM_THREADS")}
    if policy == "one":
        env["OMP_NUM_THREADS"] = "1"
    elif policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy == "spin":
        from utils.threads import SPIN_COUNT

        env["GOMP_SPINCOUNT"] = SPIN_COUNT
    elif policy == "free":
        env["BENCH_FREE_CORES"] = "1"
    if policy != "project":
        env["HRM_THREADS"] = "keep"  # the project's policy stays out of the way of the one measured
    return env


WORKER = r'''
import json, os, sys, time
sys.path.insert(0, {root!r})
if os.environ.get("BENCH_FREE_CORES"):
    from utils.threads import free_cores
    os.environ["OMP_NUM_THREADS"] = str(max(1, round(free_cores())))
import utils  # noqa: F401  (the project's thread policy, where the policy is "project")
import torch
from utils.threads import choose_threads, thread_note
choose_threads()  # as every command does where it picks its device
kind, seconds = {kind!r}, {seconds}
if kind == "solve":
    from utils.solve.solving import open_model
    from utils.solve.search import Search, run_trajectories
    from utils.data.user_puzzles import parse_sudoku
    device = torch.device("cpu")
    trained = open_model(None, "sudoku", 81, 1, device, torch.bfloat16)
    tokens = parse_sudoku({hard!r}, "hard")
    search = Search(10**6, "symmetry", 0.3)
    count, start, warm = 0, None, 0
    for segment in run_trajectories(trained, "sudoku", tokens, search, 1, 16, 0, device):
        warm += 1
        if warm == 3:
            start = time.perf_counter()
        elif start is not None:
            count += 16
            if time.perf_counter() - start > seconds:
                break
    rate = count / (time.perf_counter() - start)
else:
    from models import build_model, validate_arch
    from utils.config import recipe_config
    cfg = recipe_config("cfg_pretrain_trm_cpu", [])
    head = build_model(validate_arch(cfg.arch), batch_size=64, seq_len=81, vocab_size=11, num_puzzle_identifiers=1,
                       dtype=torch.bfloat16, device="cpu")
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    batch = {{"inputs": torch.randint(1, 11, (64, 81), generator=generator, dtype=torch.int32),
              "labels": torch.randint(1, 11, (64, 81), generator=generator),
              "puzzle_identifiers": torch.zeros(64, dtype=torch.int32)}}
    carry = head.initial_carry(batch)
    for step in range(-3, 10**9):  # three warm-up steps, then the timed ones
        if step == 0:
            start = time.perf_counter()
        elif step > 0 and time.perf_counter() - start > seconds:
            break
        carry, loss, *_ = head(carry, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    rate = step / (time.perf_counter() - start)
print(json.dumps({{"rate": rate, "threads": torch.get_num_threads(), "note": thread_note()}}))
'''


def measure(kind: str, policy: str, condition: str, seconds: float) -> dict:
    """One workload ``kind`` (solve, train) under ``policy`` beside ``condition``: its rate, threads and note."""
    code = WORKER.format(root=str(ROOT), kind=kind, seconds=seconds, hard=HARD)
    others: list[subprocess.Popen] = []
    spin = SPIN.format(seconds=seconds + 60)
    if condition in ("one", "two"):
        others = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range({"one": 1, "two": 2}[condition])]
    elif condition == "solve":
        twin = WORKER.format(root=str(ROOT), kind="solve", seconds=seconds + 60, hard=HARD)
        others = [subprocess.Popen([sys.executable, "-c", twin], env=policy_env(policy), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)]
    try:
        if condition == "solve":
            time.sleep(8)  # the twin past its model's load and warm-up: solving when the measured one starts
        done = subprocess.run([sys.executable, "-c", code], env=policy_env(policy), capture_output=True, text=True,
                              timeout=600)
    finally:
        for other in others:
            other.kill()
            other.wait()
    if done.returncode:
        raise RuntimeError(f"{kind} under {policy} beside {condition} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def header() -> str:
    """The machine the table was measured on: CPU kind, cores, bf16 support, bf16 GEMM rate."""
    import torch

    from utils.device import cpu_bf16_features, cpu_name
    from utils.run.estimate import matmul_rate

    rate = matmul_rate(torch.device("cpu"), torch.bfloat16)
    features = ", ".join(cpu_bf16_features()) or "no bf16 instructions"
    return (f"CPU {cpu_name()}, {os.cpu_count()} cores ({features}); bf16 GEMM {rate / 1e9:.0f} GFLOP/s (1024^3, "
            f"{torch.get_num_threads()} threads); both workloads in bf16")


def main(argv: Optional[list[str]] = None) -> int:
    parser = ArgumentParser(prog="benchmark_threads.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default=",".join(POLICIES), help="of %(default)s")
    parser.add_argument("--conditions", default=",".join(CONDITIONS), help="of %(default)s")
    parser.add_argument("--workloads", default="solve,train", help="of solve,train (default: both)")
    parser.add_argument("--seconds", type=positive_int, default=8, help="seconds each measurement (default 8)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    policies, conditions = args.policies.split(","), args.conditions.split(",")
    workloads = args.workloads.split(",")
    if not (set(policies) <= set(POLICIES) and set(conditions) <= set(CONDITIONS) and
            set(workloads) <= {"solve", "train"}):
        parser.error(f"--policies of {', '.join(POLICIES)}; --conditions of {', '.join(CONDITIONS)}; --workloads of "
                     "solve, train")
    if args.json:
        from utils.outputs import check_writable_file

        check_writable_file(args.json, "--json")
    print(header(), flush=True)
    rows = []
    for kind in workloads:
        unit = "passes/s" if kind == "solve" else "steps/s"
        print(f"\n{kind} ({unit}; share of the policy's rate alone)\n\n| policy | threads | " +
              " | ".join(conditions) + " |\n|---|---:|" + "---:|" * len(conditions), flush=True)
        for policy in policies:
            found = {condition: measure(kind, policy, condition, args.seconds) for condition in conditions}
            alone = found.get("alone", {}).get("rate")
            cells = [f"{r['rate']:.3g}" + (f" ({r['rate'] / alone:.0%})" if alone and c != "alone" else "")
                     for c, r in found.items()]
            threads = "/".join(sorted({str(r["threads"]) for r in found.values()}))
            print(f"| {policy} | {threads} | " + " | ".join(cells) + " |", flush=True)
            rows += [{"workload": kind, "policy": policy, "condition": c, **r} for c, r in found.items()]
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": header(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
