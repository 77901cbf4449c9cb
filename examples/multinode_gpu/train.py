"""Distributed data-parallel training with torchrun, as on Baseten: one process per GPU, every node.

Started by the config's start command exactly as a Baseten torchrun job is:

    torchrun --nnodes=$BT_GROUP_SIZE --node-rank=$BT_NODE_RANK --nproc-per-node=$BT_NUM_GPUS \
             --master-addr=$BT_LEADER_ADDR --master-port=$MASTER_PORT train.py

It uses NCCL on GPUs and gloo where there are none (the dev cluster's GPUs are placeholders and its
torch image is a CPU build), so the same file trains on both. What it shows:

* the ranks of all nodes meet: an all_reduce of every rank's number must equal the sum every rank
  expects, and after training every rank holds the same parameters (DDP averaged the gradients);
* rank 0 saves a checkpoint with ``torch.save`` into ``$BT_CHECKPOINT_DIR/checkpoint-<step>/`` (temp
  file, fsync, rename: a preemption mid-save never leaves a torn file), which slurm-bt uploads;
* at start every rank resumes from the newest checkpoint slurm-bt placed in
  ``$BT_LOAD_CHECKPOINT_DIR`` (``rank-<n>/<checkpoint>/model.pt``: the config's
  ``LoadCheckpointConfig(enabled=True)`` loads the project's latest one), and trains ``--steps`` more;
* on SIGTERM (sent before a time limit or a preemption) the ranks agree to stop, rank 0 saves, and
  every rank exits 0: the requeued run resumes (docs/long-runs.md).
"""

import argparse
import glob
import hashlib
import os
import re
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

stop_requested = False


def on_stop(signum, frame):
    global stop_requested
    stop_requested = True  # only a flag: the ranks agree on it at the next step


def newest_checkpoint():
    """Path of the newest ``model.pt`` slurm-bt placed for this job, or None (a first run)."""
    load_dir = os.environ.get("BT_LOAD_CHECKPOINT_DIR")
    found = []
    for path in glob.glob(os.path.join(load_dir or "/nonexistent", "rank-*", "*", "model.pt")):
        m = re.search(r"checkpoint-(\d+)", path)
        if m:
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


def save(step, model, optimizer):
    ckpt_root = os.environ.get("BT_CHECKPOINT_DIR")
    if not ckpt_root:
        return
    ckpt_dir = os.path.join(ckpt_root, f"checkpoint-{step}")
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = os.path.join(ckpt_dir, ".model.pt.tmp")
    with open(tmp, "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt_dir, "model.pt"))
    print(f"rank 0 wrote checkpoint {ckpt_dir}/model.pt", flush=True)


def params_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30, help="steps to train in this run")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps (0: at the end)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_stop)
    torch.set_num_threads(1)  # several ranks share a node's cores
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    # 1. Every rank meets every other: the sum of all ranks' numbers, computed by all_reduce.
    t = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    print(f"rank {rank}/{world} all_reduce {t.item():g} expected {expected:g} "
          f"(node {os.environ.get('BT_NODE_RANK')}, local rank {local_rank})", flush=True)
    if t.item() != expected:
        raise SystemExit(f"rank {rank}: all_reduce gave {t.item()}, expected {expected}")

    # 2. A small regression model, y = 3x + 2 with noise, each rank on its own shard of the data.
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    resume = newest_checkpoint()
    if resume is not None:
        state = torch.load(resume, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        if rank == 0:
            print(f"resumed from {resume} at step {start} (run {int(os.environ.get('BT_RETRY_COUNT', '0')) + 1})",
                  flush=True)
    ddp = DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.rand(256, 1, generator=gen) * 2 - 1
    y = 3 * x + 2 + 0.01 * torch.randn(256, 1, generator=gen)
    x, y = x.to(device), y.to(device)

    step = start
    for step in range(start + 1, start + args.steps + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        stop = torch.tensor([1.0 if stop_requested else 0.0], device=device)
        dist.all_reduce(stop)  # every rank stops at the same step when any of them was asked to
        last = step == start + args.steps or stop.item() > 0
        if rank == 0 and (step % 10 == 0 or last):
            print(f"rank 0/{world} step {step} loss {loss.item():.6f}", flush=True)
        periodic = args.checkpoint_every and step % args.checkpoint_every == 0
        if rank == 0 and (periodic or last):
            save(step, model, optimizer)
        if stop.item() > 0 and not step == start + args.steps:
            if rank == 0:
                print(f"stopping at step {step} (asked to stop; the next run resumes)", flush=True)
            break
    print(f"rank {rank}/{world} done at step {step}: params {params_digest(model)}", flush=True)
    # Release DDP's reducer (it holds gloo work objects) before the process group goes, and leave it
    # together: a rank that tears its connections down while a peer still uses them aborts that peer.
    del ddp
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without running C++ static destructors: gloo's worker threads can still be joinable when the
    # interpreter exits, and std::thread's destructor then aborts a rank that finished its work
    # ("terminate called without an active exception", seen on a busy 2-core machine after a clean run),
    # which torchrun reports as a failed job. Everything is saved and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
