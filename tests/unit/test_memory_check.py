"""The model-state arithmetic of `hpcddp check`: bytes per rank under ddp and fsdp, by hand."""

from hpcddp.check import memory

# 1e9 parameters in fp32: 50M in the largest block, 100M outside every block (embeddings, head)
BILLION = memory.ModelSize(
    params=1_000_000_000, param_bytes=4, largest_block_params=50_000_000, root_params=100_000_000
)
GB = 2**30


def test_ddp_holds_weights_gradients_and_two_moments_whole_16_bytes_a_parameter():
    assert memory.need(BILLION, 8, "fp32").ddp == 16_000_000_000
    assert memory.need(BILLION, 8, "bf16").ddp == 16_000_000_000  # fp32 master weights kept


def test_fsdp_holds_a_world_share_plus_the_root_and_largest_block_gathered():
    # 16e9 / 8 = 2e9 sharded; (50M + 100M) gathered: 2 bytes each in bf16, 4 in fp32
    assert memory.need(BILLION, 8, "bf16").fsdp == 2_000_000_000 + 300_000_000
    assert memory.need(BILLION, 8, "fp32").fsdp == 2_000_000_000 + 600_000_000
    # 16e9 / 3 rounds up: a rank holds the larger shard
    assert memory.need(BILLION, 3, "fp32").fsdp == 5_333_333_334 + 600_000_000


def test_a_bf16_model_counts_two_bytes_per_state_copy():
    half = memory.ModelSize(params=1000, param_bytes=2, largest_block_params=0, root_params=1000)
    assert memory.need(half, 2, "bf16") == memory.Need(ddp=8000, fsdp=4000 + 2000)


def test_verdicts_fits_fsdp_is_the_fix_or_nothing_fits():
    needs = memory.need(BILLION, 8, "bf16")  # ddp 16e9 (14.9 GB), fsdp 2.3e9 (2.14 GB)
    assert memory.verdict(needs, 16 * GB, "ddp") == ("fits", False)
    assert memory.verdict(needs, 8 * GB, "ddp") == (
        "does not fit: set dist.strategy=fsdp (needs 2.14 GB per rank)",
        True,
    )
    assert memory.verdict(needs, 8 * GB, "fsdp") == ("fits", False)
    assert memory.verdict(needs, 2 * GB, "ddp") == ("does not fit even sharded", True)
    assert memory.verdict(needs, 2 * GB, "fsdp") == ("does not fit even sharded", True)


def test_the_need_is_compared_inclusively():
    needs = memory.Need(ddp=100, fsdp=40)
    assert memory.verdict(needs, 100, "ddp") == ("fits", False)
    assert memory.verdict(needs, 99, "ddp")[1] is True
