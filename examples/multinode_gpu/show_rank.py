"""Print what a distributed trainer would use, and meet the other nodes at the leader's address."""

import os
import socket
import time

rank = int(os.environ["BT_NODE_RANK"])
world = int(os.environ["BT_GROUP_SIZE"])
leader, port = os.environ["BT_LEADER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"node rank {rank}/{world} on {os.environ.get('SLURMD_NODENAME')}: leader {leader}:{port}, "
      f"{os.environ['BT_NUM_GPUS']} GPUs (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})",
      flush=True)
if rank == 0:
    with socket.create_server((leader, port)) as srv:
        srv.settimeout(120)
        for _ in range(world - 1):
            conn, _ = srv.accept()
            print(f"leader: {conn.recv(64).decode()} joined", flush=True)
            conn.close()
else:
    for _ in range(600):
        try:
            with socket.create_connection((leader, port), timeout=2) as c:
                c.sendall(f"rank {rank}".encode())
            break
        except OSError:
            time.sleep(0.2)
    else:
        raise SystemExit(f"rank {rank}: could not reach the leader at {leader}:{port}")
