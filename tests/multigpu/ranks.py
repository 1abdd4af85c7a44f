"""One process per GPU joined by NCCL: the skip rules, the launch and the process group that the programs in
tests/multigpu share."""
import os

SKIP = 77  # ctest's SKIP_RETURN_CODE for these programs


def world_or_skip(requested: int, minimum: int = 1):
    """The world size to run, or None after printing why not: PyTorch with CUDA and NCCL, and `requested`
    GPUs (0: two, or one where there is one), at least `minimum`."""
    try:
        import torch
        import torch.multiprocessing  # noqa: F401
    except ImportError as e:
        print(f"SKIP: PyTorch is not installed ({e})")
        return None
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        print("SKIP: no CUDA device or no NCCL in this PyTorch")
        return None
    gpus = torch.cuda.device_count()
    world = requested or min(2, gpus)
    if world > gpus or world < minimum:
        print(f"SKIP: needs {max(world, minimum)} GPUs, this machine has {gpus}")
        return None
    return world


def run_ranks(worker, world: int, args, port_salt: int = 0) -> int:
    """Runs worker(rank, world, args, port) in `world` spawned processes: 0 when every rank exited 0, else 1
    (each rank's own output says why). `port_salt` keeps programs started at once off each other's port."""
    import torch.multiprocessing as mp

    port = 29500 + (os.getpid() + port_salt) % 1000
    ctx = mp.start_processes(worker, args=(world, args, port), nprocs=world, join=False, start_method="spawn")
    try:
        while not ctx.join():
            pass
    except Exception as e:  # a rank exited non-zero
        print(f"FAILED: {e}", flush=True)
        return 1
    return 0


def join_group(rank: int, world: int, port: int) -> None:
    """Makes GPU `rank` this process's device and joins the default NCCL process group. Call it after
    setting up the allocator: it starts CUDA."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
