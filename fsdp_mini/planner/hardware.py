"""What the planner assumes about the machines: GPUs, the two network levels, the memory a GPU
loses before any tensor. Every figure is a datasheet's (named, with its date) or a stated
assumption the caller can override; nothing here was measured by the kit.

    GPUS["H100"].tflops("bf16-mixed")     # 989e12 FLOP/s: dense bf16 tensor cores, no sparsity
    default_reserve_gb(80)                # 5.0 GB kept free on an 80 GB GPU (see RESERVE)

A node's GPUs talk over NVLink; nodes talk over InfiniBand or Ethernet, typically one port per
GPU. A collective whose ranks all sit in one node runs at the NVLink figures, one that spans
nodes at the network's (its ring is only as fast as its slowest hop).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arguments import choice, number, text


@dataclass(frozen=True)
class GPU:
    """A GPU's datasheet figures. ``nvlink_gbs``: NVLink bandwidth per GPU *per direction* (the
    datasheets quote both directions together, twice this). ``pcie_gbs``: host link per
    direction, nominal x16 (Gen4 32 GB/s, Gen5 64 GB/s) less a quarter for protocol overhead."""

    name: str
    memory_gb: float
    bf16_tflops: float
    fp32_tflops: float
    nvlink_gbs: float
    pcie_gbs: float
    source: str

    def tflops(self, precision: str) -> float:
        """Peak FLOP/s for the planner's precision: bf16 tensor cores, or plain fp32 (torch does
        not use TF32 for matmuls by default)."""
        choice("GPU.tflops: precision", precision, PRECISIONS)
        return (self.bf16_tflops if precision == "bf16-mixed" else self.fp32_tflops) * 1e12


PRECISIONS = ("fp32", "bf16-mixed")  # the planner's, each with its peak above
GPUS = {
    "A100": GPU("A100 SXM 80 GB", 80, 312, 19.5, 300, 24,
                "NVIDIA A100 datasheet (2021): 312 TFLOPS bf16 dense, 19.5 fp32, NVLink 600 GB/s"),
    "H100": GPU("H100 SXM 80 GB", 80, 989, 67, 450, 48,
                "NVIDIA H100 datasheet (2023): 989 TFLOPS bf16 dense, 67 fp32, NVLink 900 GB/s"),
    "H200": GPU("H200 SXM 141 GB", 141, 989, 67, 450, 48,
                "NVIDIA H200 datasheet (2024): the H100's compute and NVLink, 141 GB of HBM3e"),
}
DEFAULT_GPU = "H100"

# Achieved model FLOPs utilisation (MFU) of good large-model runs is 35-55 % (the FSDP paper
# reports 173-186 TFLOPS per A100, 55-60 %, on GPT-175B); 40 % is a cautious default.
DEFAULT_EFFICIENCY = 0.40


@dataclass(frozen=True)
class Network:
    """One level of the network, per GPU: bandwidth one way (GB/s) and latency per message."""

    name: str
    bandwidth_gbs: float
    latency_us: float


# Across nodes, per GPU (one port each): InfiniBand NDR 400 Gb/s = 50 GB/s; HDR 25 GB/s;
# 100 GbE 12.5 GB/s. Latencies: a ring step across nodes costs several µs of NIC and switch
# time plus NCCL's own; 10 µs is the planner's default, inside a node 3 µs.
NETWORKS = {
    "ib-ndr": Network("InfiniBand NDR, 400 Gb/s per GPU", 50.0, 10.0),
    "ib-hdr": Network("InfiniBand HDR, 200 Gb/s per GPU", 25.0, 10.0),
    "ethernet-100g": Network("100 Gb Ethernet per GPU", 12.5, 20.0),
}
NODE_LATENCY_US = 3.0
GPUS_PER_NODE = 8

# The reserve: memory a GPU cannot give to tensors. The CUDA context takes a few hundred MB per
# process (more with large kernels loaded), NCCL's buffers a few hundred MB more (NCCL_BUFFSIZE,
# 4 MiB, per channel and peer), and PyTorch's caching allocator reserves above what it has
# allocated (fragmentation: typically a few % of the GPU, more with changing shapes). Not
# measured by the kit (no GPU lent yet): `benchmarks/gpu_check.sh` is where to measure it.
RESERVE_FIXED_GB = 1.0      # the CUDA context and NCCL's buffers
RESERVE_FRACTION = 0.05     # the allocator's fragmentation, as a share of the GPU's memory
RESERVE = (f"{RESERVE_FIXED_GB:g} GB (CUDA context, NCCL buffers) + {RESERVE_FRACTION:.0%} of "
           f"the GPU's memory (allocator fragmentation)")

# Offload: the CPU runs Adam on its shard. One fp32 Adam update reads the parameter, its
# gradient, m and v and writes the parameter, m and v (7 x 4 B), plus the 2-byte copy sent back
# in bf16; host memory bandwidth per GPU: a 2-socket server's ~400 GB/s shared by 8 GPUs.
ADAM_BYTES_PER_PARAM = 30
HOST_GBS_PER_GPU = 50.0


def default_reserve_gb(gpu_mem_gb: float) -> float:
    """The memory the planner keeps free on a GPU of ``gpu_mem_gb`` GB (see ``RESERVE``).

    >>> default_reserve_gb(80), default_reserve_gb(24)
    (5.0, 2.2)
    """
    gpu_mem_gb = number("default_reserve_gb: gpu_mem_gb", gpu_mem_gb, unit="GB", above=0)
    return round(RESERVE_FIXED_GB + RESERVE_FRACTION * gpu_mem_gb, 3)


def gpu_named(name: str, *, argument: str = "gpu_named: name") -> GPU:
    """The preset ``name`` (any case: "h100" is the H100). ``argument`` is how an error names
    the value: plan() says ``plan: gpu``."""
    text(argument, name)
    if name.upper() not in GPUS:
        raise ValueError(f"{argument} names an unknown GPU {name!r}; presets: {', '.join(GPUS)}. "
                         f"For another GPU take the closest preset and give its own figures "
                         f"(tflops, gpu_mem_gb, node_bandwidth_gbs)")
    return GPUS[name.upper()]
