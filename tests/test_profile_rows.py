"""benchmarks/profile_rows.py without a GPU: Nsight Compute's raw CSV read into rows by their marker
kernels, the metrics kept, the stored form, and the bound each row's table line names. The
profiles of record (benchmarks/results/peers_h200/profiles/) are read back whole."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import profile_rows  # noqa: E402

TIME, TENSOR, DRAM = ("gpu__time_duration.sum", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                      "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")
BARRIER = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
WAIT = "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
ISSUE = "smsp__issue_active.avg.per_cycle_active"
HEADER = ["ID", "Kernel Name", TIME, TENSOR, DRAM, BARRIER, WAIT, ISSUE, "launch__registers_per_thread",
          "derived__local_spilling_requests", "l1tex__unrelated.sum"]
UNITS = ["", "", "nsecond", "%", "%", "", "", "", "register/thread", "", ""]


def csv_text(kernels):
    """ncu's --csv --page raw output: its own messages, a header, units, one line per kernel."""
    quote = (lambda cells: ",".join(f'"{c}"' for c in cells))
    lines = ["==PROF== Connected to process 1", quote(HEADER), quote(UNITS)]
    lines += [quote([str(i), *k]) for i, k in enumerate(kernels)]
    return "\n".join(lines) + "\n"


MARK = ["at::cuda::spin_kernel(long)", "1,024", "", "", "", "", "", "", "", "7"]
FATTN = ["attn_fwd_sm90", "1,200,000", "61.5", "12.0", "3.25", "0.01", "0.38", "168", "90,000", "7"]
FATTN_PREP = ["attn_bwd_preprocess", "50,000", "0", "40", "0.2", "1.5", "0.2", "32", "0", "7"]
CUDNN = ["cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "1,000,000", "75", "10", "1.5", "0.9", "0.39",
         "168", "0", "7"]
DECODE = ["attn_decode_split", "130,000", "12", "88", "0.4", "2.1", "0.33", "99", "0", "7"]


def manifest():
    fwd = dict(set="forward", head_dim=128, seqlen=16384, causal=False)
    dec = dict(set="decode", batch=1, context=131072, paged=False)
    return [dict(fwd, impl="fattn", error=None, marked=True),
            dict(fwd, impl="fa4", error="PeerUnavailable: not installed", marked=False),
            dict(fwd, impl="sdpa_cudnn", error=None, marked=True),
            dict(dec, impl="fattn", error=None, marked=True)]


def test_kernels_go_to_the_row_whose_marker_precedes_them():
    kernels, units = profile_rows.read_raw_csv(csv_text([MARK, FATTN, FATTN_PREP, MARK, CUDNN, MARK, DECODE]))
    assert units[TIME] == "nsecond" and "l1tex__unrelated.sum" not in units
    entries = profile_rows.assign_kernels(manifest(), kernels)
    assert [k["name"] for k in entries[0]["kernels"]] == ["attn_fwd_sm90", "attn_bwd_preprocess"]
    assert "kernels" not in entries[1]  # the peer that did not run has its reason, no kernels
    assert [k["name"] for k in entries[2]["kernels"]] == [CUDNN[0]]
    fattn = entries[0]["kernels"][0]["metrics"]
    assert fattn[TIME] == 1.2e6 and fattn["derived__local_spilling_requests"] == 9e4  # ncu's thousands separators
    assert WAIT not in fattn and fattn[BARRIER] == 3.25  # stalls under 0.05 cycles are not kept
    assert "l1tex__unrelated.sum" not in fattn


def test_a_lost_marker_is_an_error_not_a_shifted_table():
    kernels, _ = profile_rows.read_raw_csv(csv_text([MARK, FATTN, CUDNN, MARK, DECODE]))
    with pytest.raises(SystemExit, match="2 profiled ranges .* 3 in the manifest"):
        profile_rows.assign_kernels(manifest(), kernels)


def test_the_stored_form_reads_back_and_the_table_names_each_bound(tmp_path):
    kernels, units = profile_rows.read_raw_csv(csv_text([MARK, FATTN, FATTN_PREP, MARK, CUDNN, MARK, DECODE]))
    entries = profile_rows.assign_kernels(manifest(), kernels)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(profile_rows.packed(entries, units)))
    assert profile_rows.unpacked(json.loads(path.read_text())) == entries
    lines = profile_rows.table([path]).splitlines()
    forward = next(line for line in lines if line.startswith("| forward d128 16k non-causal"))
    cells = [c.strip() for c in forward.strip("|").split("|")]
    assert cells[1] == "1250"  # both of fattn's kernels
    assert cells[2] == "attn_fwd_sm90 1200"  # its longest
    assert cells[8] == "sdpa_cudnn 1000" and cells[9] == "0.80"
    assert cells[-1] == "tensor pipe" and cells[6] == "barrier 3.2"  # "selected" is the issue itself
    decode = next(line for line in lines if line.startswith("| decode b1 128k"))
    assert decode.rstrip(" |").endswith("memory")
    summary = profile_rows.summary(entries[0])
    assert profile_rows.bound_of(dict(summary, tensor_pct=30.0)) == "issue (barrier)"


def test_every_row_of_the_runs_of_record_is_profiled():
    """The profiles of record hold every training, decode, FP8 and variant row, with fattn and its peers."""
    folder = ROOT / "benchmarks" / "results" / "peers_h200" / "profiles"
    paths = [folder / f"{name}.json" for name in ("forward_decode", "backward_fp8", "forward_fa4", "backward_fa4",
                                                  "variants")]
    rows = profile_rows.grouped(paths)
    expected = profile_rows.rows_of(list(profile_rows.SETS))
    assert sorted(rows) == sorted(profile_rows.row_name(r) for r in expected)
    for name, (row, impls) in rows.items():
        wanted = profile_rows.impls_of(row, list(profile_rows.IMPLS))
        assert set(wanted) <= set(impls), f"{name}: {sorted(impls)}"
        for impl in wanted:
            assert impls[impl].get("kernels"), f"{name} {impl}: {impls[impl].get('error')}"


def test_dry_run_lists_the_rows_and_the_ncu_command():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_rows.py"), "--dry-run", "--sets",
                          "forward,fp8", "--impls", "fattn,sdpa_cudnn"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "forward d64 1k non-causal | fattn, sdpa_cudnn"
    assert "fp8 d256 16k causal | fattn_fp8, fattn" in lines
    assert len(lines) == 20 + 12 + 1 and lines[-1].startswith("ncu --profile-from-start off")


def test_instruction_mix_compares_each_pipe_by_share_times_time(tmp_path):
    row = dict(set="backward", head_dim=64, seqlen=4096, causal=False, error=None, marked=True)

    def kernel(us, total, **pipes):
        metrics = {TIME: us * 1e3, "sass__inst_executed_per_opcode": total}
        metrics.update({f"sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_elapsed": v for p, v in pipes.items()})
        return {"name": "k", "metrics": metrics}
    entries = [dict(row, impl="fattn", kernels=[kernel(300, 6e8, uniform=20.0, xu=10.0), kernel(100, 2e8, uniform=0.0)]),
               dict(row, impl="fa4", kernels=[kernel(200, 4e8, uniform=10.0, xu=20.0)]),
               dict(row, impl="sdpa_cudnn", kernels=[kernel(500, 1e8, uniform=1.0, xu=1.0)])]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(profile_rows.packed(entries, {})))
    line = profile_rows.mix_table([path]).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    pipes = dict(zip(profile_rows.PIPES, cells[4:]))
    # The faster peer (fa4, 200 us) is the one compared; 800M over 400M instructions; uniform
    # 20 % of 300 us against 10 % of 200 us; exp2 10 % of 300 us against 20 % of 200 us.
    assert cells[:4] == ["backward d64 4k non-causal", "fa4", "800", "2.00"]
    assert pipes["uniform"] == "3.00" and pipes["xu"] == "0.75" and pipes["fma"] == "-"
