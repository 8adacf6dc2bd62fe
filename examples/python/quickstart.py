# reccl for PyTorch: two ranks (processes) over a gloo group, an all-reduce and the fused
# all-reduce + residual add + RMSNorm, each checked against torch. With one GPU both ranks share it.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world):
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29511", rank=rank, world_size=world)
    import reccl.torch as rt

    comm = rt.Communicator()  # collective over the group: CUDA IPC windows, no NCCL communicator
    x = torch.full((4096,), float(rank + 1), device="cuda")
    y = comm.all_reduce(x)  # torch.ops.reccl.all_reduce: stream-ordered, capturable, compilable
    h = torch.full((8, 4096), 0.5 * (rank + 1), dtype=torch.bfloat16, device="cuda")
    residual, weight = torch.ones_like(h), torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    out, new_residual = comm.fused_add_rms_norm_all_reduce(h, residual, weight, 1e-6)
    comm.synchronize()  # raises reccl.Error if a GPU-side wait failed (a rank that never came)
    total = world * (world + 1) / 2
    good = bool((y == total).all()) and bool((new_residual == 0.5 * total + 1).all()) and bool((out == 1).all())
    print(f"rank {rank}: {'all results correct' if good else 'WRONG RESULT'}")
    comm.close()  # collective, like the creation
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(2,), nprocs=2)
