"""``cstream ckpt inspect`` / ``cstream ckpt convert``, and the command's error handling."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch

import cstream
from cstream_tools.cli import main
from cstream.checkpoint.saving import to_eager

REPO = Path(__file__).resolve().parents[1]
CONSOLE_SCRIPT = Path(sys.executable).parent / "cstream"


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "c.h5"
    cstream.save({"model": {"weight": torch.ones(2, 3, dtype=torch.bfloat16),
                            "bias": torch.zeros(256)},
                  "groups": [{"lr": 0.1, "name": None}], "step": 5, "tag": "run-1", "empty": {}},
                 path)
    return path


def test_inspect_prints_a_table_of_entries_and_the_total_size(checkpoint, capsys):
    assert main(["ckpt", "inspect", str(checkpoint)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "key             dtype/type  shape   size/value",
        "model/weight    bfloat16    (2, 3)  12 B",
        "model/bias      float32     (256,)  1.0 KiB",
        "groups[0]/lr    float               0.1",
        "groups[0]/name  NoneType            None",
        "step            int                 5",
        "tag             str                 'run-1'",
        "empty           dict                {}",
        f"2 tensors, 1.0 KiB (1036 bytes) in {checkpoint}",
        f"layout: cerebras.pytorch layout 0.5, written by cstream {_cstream_version()}",
    ]


def _cstream_version() -> str:
    from importlib.metadata import version

    return version("cstream")


def test_inspect_lists_a_file_the_real_package_wrote_and_one_of_cstreams_earlier_layout(capsys):
    assert main(["ckpt", "inspect", str(REPO / "tests/reference/fixtures/ckpt_real_train.h5")]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines]
    assert rows[:3] == [["key", "dtype/type", "shape", "size/value"],
                        ["model/0.weight", "float32", "(3,", "4)", "48", "B"],
                        ["model/0.bias", "float32", "(3,)", "12", "B"]]
    assert ["optimizer/param_groups[0]/lr", "float", "0.1"] in rows
    assert ["step", "int", "3"] in rows
    assert lines[-1] == "layout: cerebras.pytorch layout 0.5, written by cerebras.pytorch 2.10.0"
    assert main(["ckpt", "inspect", str(REPO / "tests/data/cstream_v2_layout.h5")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["model/weight", "float32", "(2,", "3)", "24", "B"]
    assert lines[-1] == "layout: cstream's earlier layout (version 2), written by cstream 0.1"


@pytest.mark.parametrize("src", ["tests/reference/fixtures/ckpt_real_state.h5",
                                 "tests/data/cstream_v2_layout.h5"])
def test_convert_writes_either_layout_to_a_torch_save_file(src, tmp_path, capsys):
    out = tmp_path / "c.pt"
    assert main(["ckpt", "convert", str(REPO / src), str(out)]) == 0
    back = torch.load(out)
    want = to_eager(cstream.load(REPO / src))
    assert list(back) == list(want)
    first = next(iter(want.values()))
    assert all(torch.equal(back[next(iter(want))][k], v) for k, v in first.items()
               if isinstance(v, torch.Tensor))


def test_convert_writes_a_torch_save_file_with_the_same_values(checkpoint, tmp_path, capsys):
    out = tmp_path / "c.pt"
    assert main(["ckpt", "convert", str(checkpoint), str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out} (torch.save format; load it with torch.load)\n"
    back = torch.load(out)  # weights_only: plain dicts, lists and tensors
    assert type(back) is dict and type(back["groups"]) is list
    assert back["model"]["weight"].dtype == torch.bfloat16
    assert torch.equal(back["model"]["weight"], torch.ones(2, 3, dtype=torch.bfloat16))
    assert back["groups"] == [{"lr": 0.1, "name": None}] and back["step"] == 5
    assert back["tag"] == "run-1" and back["empty"] == {}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("argv, message", [
    (["ckpt", "inspect", "{tmp}/missing.h5"], "cstream ckpt: error: no checkpoint at {tmp}/missing.h5"),
    (["ckpt", "inspect", "{tmp}/text.h5"],
     "cstream ckpt: error: {tmp}/text.h5 is not a readable checkpoint: it is not an HDF5 file (it "
     "does not start with the HDF5 signature); cstream.load reads files written by cstream.save or "
     "cerebras.pytorch.save."),
    (["ckpt", "convert", "{tmp}/c.h5", "{tmp}/c.h5"],
     "cstream ckpt: error: the output {tmp}/c.h5 is the input checkpoint; name another file, e.g. "
     "{tmp}/c.compressed.h5"),
    (["ckpt", "convert", "{tmp}/c.h5", "{tmp}/no/such/dir/c.pt"],
     "cstream ckpt: error: the output directory {tmp}/no/such/dir does not exist; create it first"),
    (["ckpt"], "cstream ckpt: error: the following arguments are required: ACTION"),
    (["ckpt", "inspect"], "cstream ckpt inspect: error: the following arguments are required: file"),
    (["ckpt", "explode", "x"], "cstream ckpt: error: argument ACTION: invalid choice: 'explode' "
                               "(choose from 'inspect', 'convert')"),
])
def test_bad_arguments_and_files_print_one_error_line_and_exit_2(checkpoint, tmp_path, capsys,
                                                                   argv, message):
    (tmp_path / "text.h5").write_text("hello")
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert _status(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == message.format(tmp=tmp_path) + "\n"
    assert captured.out == ""


def _status(argv) -> int:
    """The exit status of ``cstream ARGV`` (argparse's own errors exit through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_help_lists_the_ckpt_actions(capsys):
    with pytest.raises(SystemExit) as info:
        main(["ckpt", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "    inspect   list a checkpoint's entries, or a folder's checkpoints\n" in out
    assert "    convert   convert to torch.save's format or between the compressed and\n" in out


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_the_console_script_converts_and_python_dash_m_reports_errors(checkpoint, tmp_path):
    done = subprocess.run([str(CONSOLE_SCRIPT), "ckpt", "convert", str(checkpoint),
                           str(tmp_path / "c.pt")], capture_output=True, text=True, env=_env(),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert torch.load(tmp_path / "c.pt")["step"] == 5
    (tmp_path / "bad.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    done = subprocess.run([sys.executable, "-m", "cstream_tools.cli", "ckpt", "inspect",
                           str(tmp_path / "bad.h5")], capture_output=True, text=True, env=_env(),
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"cstream ckpt: error: {tmp_path / 'bad.h5'} is not a readable "
                                  "checkpoint: HDF5 cannot read its structure (")
    assert done.stderr.count("\n") == 1


def test_inspect_of_a_folder_lists_its_checkpoints_oldest_first_and_which_can_be_loaded(tmp_path, capsys):
    for step in (50, 100, 150):
        cstream.save({"w": torch.ones(1000), "step": step}, tmp_path / f"ckpt_{step}.h5")
        os.utime(tmp_path / f"ckpt_{step}.h5", (step, 1_000_000 + step))
    data = bytearray((tmp_path / "ckpt_150.h5").read_bytes())
    data[3000] ^= 1  # the newest damaged
    (tmp_path / "ckpt_150.h5").write_bytes(bytes(data))
    os.utime(tmp_path / "ckpt_150.h5", (150, 1_000_150))
    real = tmp_path / "real.h5"
    real.write_bytes((REPO / "tests/reference/fixtures/ckpt_real_train.h5").read_bytes())
    os.utime(real, (0, 1_000_000))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert main(["ckpt", "inspect", str(tmp_path)]) == 0
    rows = [line.split("  ") for line in capsys.readouterr().out.splitlines()]
    rows = [[c.strip() for c in r if c.strip()] for r in rows]
    assert [r[0] for r in rows[:-1]] == ["real.h5", "ckpt_50.h5", "ckpt_100.h5", "ckpt_150.h5"]
    assert rows[0][3] == ("readable (it has no checksum; its tensors are not checked): cerebras.pytorch "
                          "layout 0.5, written by cerebras.pytorch 2.10.0")
    assert rows[1][3] == rows[2][3] == ("intact (its checksum matches): cerebras.pytorch layout 0.5, "
                                        f"written by cstream {_cstream_version()}")
    assert rows[3][3].startswith("DAMAGED: its contents do not match the checksum in its header (CRC-32 ")
    assert rows[3][3].endswith("): the file was damaged after it was written.")
    assert rows[-1] == [f"3 of 4 checkpoints in {tmp_path} can be loaded"]
    assert _status(["ckpt", "inspect", str(tmp_path / "ckpt_150.h5")]) == 2
    assert capsys.readouterr().err.endswith(f"Load an earlier checkpoint instead: `cstream ckpt "
                                            f"inspect {tmp_path}` lists the checkpoints there and "
                                            "which of them are intact.\n")


def test_inspect_of_a_folder_without_checkpoints_says_so(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / ".ckpt_1.h5.0a1b.tmp").write_bytes(b"")  # a save still writing: not listed
    assert _status(["ckpt", "inspect", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"cstream ckpt: error: {tmp_path} holds no checkpoints (files named *.h5, *.hdf5, *.mdl, "
        "or any other that starts as a checkpoint)\n")


def _folder_rows(capsys) -> list[list[str]]:
    rows = [line.split("  ") for line in capsys.readouterr().out.splitlines()]
    return [[c.strip() for c in r if c.strip()] for r in rows]


def test_inspect_lists_the_seeds_checkpoint_step_mdl_files_and_checkpoints_of_any_name(tmp_path,
                                                                                       capsys):
    """The seed's example saves ``checkpoint_{step}.mdl``; a file that starts as a checkpoint is one
    whatever its name."""
    for i, step in enumerate((10, 20, 30)):
        cstream.save({"model": {"w": torch.full((100,), float(step))}, "step": step},
                     tmp_path / f"checkpoint_{step}.mdl")
        os.utime(tmp_path / f"checkpoint_{step}.mdl", (0, 1_000_000 + i))
    (tmp_path / "weights.bin").write_bytes((REPO / "tests/reference/fixtures/ckpt_real_train.h5")
                                           .read_bytes())  # the real package's, under another name
    os.utime(tmp_path / "weights.bin", (0, 1_000_003))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert main(["ckpt", "inspect", str(tmp_path)]) == 0
    rows = _folder_rows(capsys)
    assert [r[0] for r in rows[:-1]] == ["checkpoint_10.mdl", "checkpoint_20.mdl",
                                         "checkpoint_30.mdl", "weights.bin"]
    assert [r[3] for r in rows[:3]] == [("intact (its checksum matches): cerebras.pytorch layout "
                                         f"0.5, written by cstream {_cstream_version()}")] * 3
    assert rows[3][3].startswith("readable (it has no checksum; its tensors are not checked): ")
    assert rows[-1] == [f"4 of 4 checkpoints in {tmp_path} can be loaded"]


def test_inspect_marks_each_damaged_mdl_file_with_its_reason(tmp_path, capsys):
    good = tmp_path / "checkpoint_0.mdl"
    cstream.save({"w": torch.arange(1000.0), "step": 0}, good)
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    damaged = {"checkpoint_1.mdl": data[: len(data) // 2],  # cut short
               "checkpoint_2.mdl": bytes(flipped),
               "checkpoint_3.mdl": b"",
               "checkpoint_4.mdl": b"PK\x03\x04 a zip archive, not HDF5",
               "checkpoint_5.mdl": data[:10]}  # cut inside cstream's tag
    for i, (name, content) in enumerate(damaged.items(), 1):
        (tmp_path / name).write_bytes(content)
        os.utime(tmp_path / name, (0, 1_000_000 + i))
    os.utime(good, (0, 1_000_000))
    assert main(["ckpt", "inspect", str(tmp_path)]) == 0
    rows = _folder_rows(capsys)
    assert [r[0] for r in rows[:-1]] == ["checkpoint_0.mdl", *damaged]
    assert rows[0][3].startswith("intact (its checksum matches)")
    assert rows[1][3] == (f"DAMAGED: it is truncated: it has {len(data) // 2} bytes, its header "
                          f"records the {len(data)} bytes written.")
    assert rows[2][3].startswith("DAMAGED: its contents do not match the checksum in its header")
    assert rows[3][3] == "DAMAGED: it is empty (0 bytes): its writer stopped before it wrote anything."
    assert rows[4][3] == ("DAMAGED: it is not an HDF5 file (it does not start with the HDF5 "
                          "signature); cstream.load reads files written by cstream.save or "
                          "cerebras.pytorch.save.")
    assert rows[5][3] == "DAMAGED: it is truncated: it has 10 bytes, fewer than its header."
    assert rows[-1] == [f"1 of 6 checkpoints in {tmp_path} can be loaded"]


@pytest.mark.parametrize("first", ["compressed", "uncompressed"])
def test_convert_moves_a_checkpoint_between_the_compressed_and_uncompressed_layouts(tmp_path, capsys,
                                                                                    first):
    state = {"model": {"w": torch.zeros(256, 256), "b": torch.arange(256.0).to(torch.bfloat16)},
             "step": 7}
    src = tmp_path / "src.mdl"
    cstream.save(state, src, compress=first == "compressed")
    other = "uncompressed" if first == "compressed" else "compressed"
    out = tmp_path / f"{other}.h5"
    args = ["ckpt", "convert", str(src), str(out)] + ([] if other == "compressed" else ["--to", other])
    assert main(args) == 0
    assert capsys.readouterr().out == (f"wrote {out} (cstream.save's {other} layout; load it with "
                                       "cstream.load or cerebras.pytorch.load)\n")
    back = cstream.load(out)
    assert back["step"] == 7 and torch.equal(back["model"]["w"], state["model"]["w"])
    assert torch.equal(back["model"]["b"], state["model"]["b"])
    with h5py.File(out, "r") as f:
        plist = f["model.w"].id.get_create_plist()
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        assert filters == ([32004] if other == "compressed" else [])  # LZ4
        assert (f["model.w"].chunks is not None) == (other == "compressed")
    sizes = {first: src.stat().st_size, other: out.stat().st_size}
    assert sizes["compressed"] < sizes["uncompressed"] / 4  # 256 KiB of zeros compress to ~1 KiB
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
