"""The machine's limits the benchmarks measure fractions against (csrc/kernels/machine_limits.h, through
pyserve._engine.testing): the memory read bandwidth and the int8 multiply-add peaks of vpdpbusd and AMX.
Measured figures vary with the machine, so these hold their shape: positive where the instruction runs here,
zero where it does not, each thread counted, and bad arguments refused in words."""
import pytest

from pyserve._engine import testing


def test_the_read_bandwidth_is_bytes_per_second_of_a_real_read():
    """64 MiB read by one thread takes at least microseconds and at most seconds: 10 MB/s to 10 TB/s."""
    bw = testing.read_bandwidth(1, 64, 2)
    assert 1e7 < bw < 1e13


@pytest.mark.parametrize("threads, mib, rounds", [(0, 64, 1), (1, 63, 1), (1, 64, 0)])
def test_the_read_bandwidth_refuses_bad_arguments(threads, mib, rounds):
    with pytest.raises(ValueError, match="read_bandwidth: threads >= 1, bytes >= 64 MiB, rounds >= 1"):
        testing.read_bandwidth(threads, mib, rounds)


def test_the_vnni_peak_is_measured_where_the_build_has_vnni():
    peak = testing.int8_peak_macs(1)
    assert (peak > 1e9) == bool(testing.simd()["vnni"]) and (peak == 0) == (not testing.simd()["vnni"])


def test_the_amx_peak_is_measured_where_amx_runs_and_passes_vnni():
    """Where the engine runs AMX, one TDPBSSD does 16,384 multiply-adds against vpdpbusd's 32: its peak is
    far above; elsewhere it is 0."""
    amx = testing.int8_peak_macs(1, amx=True)
    if testing.simd()["amx"]:
        assert amx > 2 * testing.int8_peak_macs(1)
    else:
        assert amx == 0.0


def test_the_peak_refuses_no_threads():
    with pytest.raises(ValueError, match="int8_peak_macs: threads >= 1"):
        testing.int8_peak_macs(0)
