"""A model sharded with FSDP2 (torch.distributed.fsdp.fully_shard) and a fused optimizer, on CPU ranks (gloo):

    torchrun --nproc-per-node 2 examples/fsdp2_train.py [--steps N] [--checkpoint DIR]

The only change from torch's recipe is the optimizer's name: every param is a DTensor, and the fused step
updates each rank's shard of all of them in one pass. Clipping by max_grad_norm sees the whole gradients (the
norm is reduced across the ranks). With --checkpoint, the model and optimizer are saved with torch's
distributed checkpoint (DCP), which loads at any world size."""

import argparse

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import fusedopt

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--checkpoint", default=None)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)  # every rank builds the same model; fully_shard keeps each rank's shard of it
blocks = [torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)) for _ in range(3)]
model = torch.nn.Sequential(*blocks, torch.nn.Linear(64, 10))
for block in blocks:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)  # bottom-up, the root last
opt = fusedopt.FusedAdamW(model.parameters(), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)

data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
for step in range(args.steps):
    x, y = torch.randn(32, 64, generator=data), torch.randint(0, 10, (32,), generator=data)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()  # FSDP2 reduce-scatters the gradients: each rank holds its shard's mean gradient
    opt.step()
    opt.zero_grad()
    if rank == 0 and (step + 1) % 5 == 0:
        print(f"step {step + 1}: loss {loss.item():.4f} (rank 0's batch), grad norm {opt.last_grad_norm:.4f}")

state = opt.state[next(model.parameters())]
if rank == 0:
    print(f"exp_avg is a {type(state['exp_avg']).__name__} with placements {state['exp_avg'].placements}")
if args.checkpoint:
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=args.checkpoint)
    if rank == 0:
        print(f"saved to {args.checkpoint}")
dist.barrier()  # no rank tears the group down while another still talks on it (gloo can abort at exit)
dist.destroy_process_group()
