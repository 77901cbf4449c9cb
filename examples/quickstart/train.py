"""A real (tiny) training loop: gradient descent on y = 3x + 2, one process per node.

Every node trains on its own shard of the data; rank 0 writes the checkpoint into $BT_CHECKPOINT_DIR,
like a Baseten training job would.
"""

import argparse
import json
import os
import random


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    rank = int(os.environ.get("BT_NODE_RANK", "0"))
    world = int(os.environ.get("BT_GROUP_SIZE", "1"))
    lr = float(os.environ.get("LEARNING_RATE", "0.05"))
    rng = random.Random(1234 + rank)
    data = [(x, 3.0 * x + 2.0 + rng.gauss(0, 0.01)) for x in (rng.uniform(-1, 1) for _ in range(256))]
    w, b = 0.0, 0.0
    for step in range(1, args.steps + 1):
        gw = sum(2 * (w * x + b - y) * x for x, y in data) / len(data)
        gb = sum(2 * (w * x + b - y) for x, y in data) / len(data)
        w, b = w - lr * gw, b - lr * gb
        if step % 50 == 0 or step == args.steps:
            loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
            print(f"rank {rank}/{world} step {step} loss {loss:.6f} w {w:.4f} b {b:.4f}", flush=True)
    if rank == 0:
        ckpt_dir = os.path.join(os.environ["BT_CHECKPOINT_DIR"], f"checkpoint-{args.steps}")
        os.makedirs(ckpt_dir, exist_ok=True)
        tmp = os.path.join(ckpt_dir, ".model.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"w": w, "b": b, "steps": args.steps, "leader": os.environ.get("BT_LEADER_ADDR")}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(ckpt_dir, "model.json"))
        print(f"rank 0 wrote checkpoint {ckpt_dir}/model.json", flush=True)


if __name__ == "__main__":
    main()
