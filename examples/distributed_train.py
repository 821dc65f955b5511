"""Data-parallel training with ZeRO-1 on torch.distributed (gloo), no DistributedDataParallel wrapper:

    torchrun --nproc-per-node 2 examples/distributed_train.py [--zero 0|1] [--steps N]

Each rank trains on its own share of every batch; the optimizer averages the gradients during backward,
and with --zero 1 each rank keeps the optimizer state of its half of the params only."""

import argparse

import torch
import torch.distributed as dist

import fusedopt
import fusedopt.distributed

parser = argparse.ArgumentParser()
parser.add_argument("--zero", type=int, default=1)
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # (the optimizer broadcasts rank 0's params anyway)
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
opt = fusedopt.distributed.DistributedOptimizer(
    fusedopt.FusedAdamW(model.parameters(), lr=1e-2, max_grad_norm=1.0), zero=args.zero)

data = torch.Generator().manual_seed(1)
batches = [(torch.randn(64, 32, generator=data), torch.randint(0, 10, (64,), generator=data)) for _ in range(4)]
for step in range(args.steps):
    x, y = batches[step % len(batches)]
    share = slice(rank * 64 // world, (rank + 1) * 64 // world)  # this rank's part of the batch
    loss = torch.nn.functional.cross_entropy(model(x[share]), y[share])
    loss.backward()  # gradient buckets are all-reduced while backward runs
    opt.step()
    opt.zero_grad()
    if rank == 0 and (step + 1) % 5 == 0:
        print(f"step {step + 1}: loss {loss.item():.4f} (rank 0's share), grad norm {opt.last_grad_norm:.4f}")

state = opt.consolidate_state_dict(to=0)  # every rank takes part; rank 0 gets torch's format
print(f"rank {rank}: {opt.state_bytes():,} bytes of optimizer state"
      + (f"; consolidated state of {len(state['state'])} params" if rank == 0 else ""))
dist.barrier()  # no rank tears the group down while another still talks on it (gloo can abort at exit)
dist.destroy_process_group()
