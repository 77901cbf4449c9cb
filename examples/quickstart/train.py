"""A real (tiny) training loop: gradient descent on y = 3x + 2, one process per node.

Every node trains on its own shard of the data; rank 0 writes the checkpoints into $BT_CHECKPOINT_DIR,
like a Baseten training job would. It is also the long-run contract of docs/long-runs.md in a few lines:

* on SIGTERM (slurm-bt sends it before a time limit or a preemption) finish the current step, save
  a checkpoint and exit 0: the job is requeued and the next run resumes;
* at start, resume from the newest checkpoint in $BT_LOAD_CHECKPOINT_DIR (`rank-<n>/<checkpoint>/`,
  placed there on a restart), or start from scratch when there is none (the first run).

Resuming reproduces an uninterrupted run exactly: the state is (w, b, step) and the data is
regenerated from a fixed seed.
"""

import argparse
import glob
import json
import os
import random
import signal
import time

stop_requested = False


def on_stop(signum, frame):
    global stop_requested
    stop_requested = True  # only a flag: saving inside a signal handler can deadlock


def newest_checkpoint():
    """(step, state) of the newest checkpoint slurm-bt placed for this run, or None."""
    load_dir = os.environ.get("BT_LOAD_CHECKPOINT_DIR")
    if not load_dir:
        return None
    found = []
    for path in glob.glob(os.path.join(load_dir, "rank-*", "*", "model.json")):
        try:
            with open(path) as f:
                state = json.load(f)
            found.append((int(state["step"]), state))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not one of ours
    return max(found, key=lambda item: item[0]) if found else None


def save(step, w, b):
    ckpt_dir = os.path.join(os.environ["BT_CHECKPOINT_DIR"], f"checkpoint-{step}")
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = os.path.join(ckpt_dir, ".model.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"w": w, "b": b, "step": step, "leader": os.environ.get("BT_LEADER_ADDR")}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt_dir, "model.json"))
    print(f"rank 0 wrote checkpoint {ckpt_dir}/model.json", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pretend each step takes this long")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps (0: at the end)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_stop)
    rank = int(os.environ.get("BT_NODE_RANK", "0"))
    world = int(os.environ.get("BT_GROUP_SIZE", "1"))
    lr = float(os.environ.get("LEARNING_RATE", "0.05"))
    rng = random.Random(1234 + rank)
    data = [(x, 3.0 * x + 2.0 + rng.gauss(0, 0.01)) for x in (rng.uniform(-1, 1) for _ in range(256))]
    w, b, start = 0.0, 0.0, 0
    resumed = newest_checkpoint()
    if resumed is not None:
        start, state = resumed
        w, b = float(state["w"]), float(state["b"])
        print(f"rank {rank}/{world} resumed from step {start} (run {int(os.environ.get('BT_RETRY_COUNT', '0')) + 1})",
              flush=True)
    for step in range(start + 1, args.steps + 1):
        gw = sum(2 * (w * x + b - y) * x for x, y in data) / len(data)
        gb = sum(2 * (w * x + b - y) for x, y in data) / len(data)
        w, b = w - lr * gw, b - lr * gb
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if step % 50 == 0 or step == args.steps:
            loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
            print(f"rank {rank}/{world} step {step} loss {loss:.6f} w {w:.4f} b {b:.4f}", flush=True)
        periodic = args.checkpoint_every and step % args.checkpoint_every == 0
        if rank == 0 and (periodic or step == args.steps or stop_requested):
            save(step, w, b)
        if stop_requested and step < args.steps:
            print(f"rank {rank}/{world} stopping at step {step} (asked to stop; the next run resumes)", flush=True)
            return
    print(f"rank {rank}/{world} done: w {w!r} b {b!r}", flush=True)


if __name__ == "__main__":
    main()
