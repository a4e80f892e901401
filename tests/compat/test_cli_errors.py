"""Bad input gets one clear line on stderr and exit 2: never a traceback, never silent success."""

import pytest


def _assert_one_line_exit_2(result, expected_fragment):
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and expected_fragment in lines[0]


@pytest.mark.slow
def test_path_that_is_not_a_checkpoint(assay_cli, tmp_path):
    (tmp_path / "empty").mkdir()
    _assert_one_line_exit_2(assay_cli("probe", str(tmp_path / "empty"), "--out", str(tmp_path / "r")), "is not a checkpoint")


@pytest.mark.slow
def test_file_instead_of_a_checkpoint(assay_cli, tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    _assert_one_line_exit_2(assay_cli("probe", str(tmp_path / "weights.bin"), "--out", str(tmp_path / "r")), "is not a checkpoint")


@pytest.mark.slow
def test_missing_local_path(assay_cli, tmp_path):
    _assert_one_line_exit_2(assay_cli("probe", "./no/such/model", "--out", str(tmp_path / "r")), "is not a checkpoint")


@pytest.mark.parametrize("device", ["cuda", "tpu0", "neuron"])
def test_unknown_or_absent_device(assay_cli, zoo_dir, tmp_path, device):
    _assert_one_line_exit_2(assay_cli("probe", str(zoo_dir / "qwen3"), "--device", device, "--out", str(tmp_path)), device)


@pytest.mark.slow
def test_unknown_backend(assay_cli, zoo_dir, tmp_path):
    _assert_one_line_exit_2(assay_cli("probe", str(zoo_dir / "qwen3"), "--backend", "turbo", "--out", str(tmp_path)), "unknown compile backend 'turbo'")


@pytest.mark.slow
def test_unknown_dtype(assay_cli, zoo_dir, tmp_path):
    _assert_one_line_exit_2(assay_cli("probe", str(zoo_dir / "qwen3"), "--dtype", "int3", "--out", str(tmp_path)), "unknown dtype")


@pytest.mark.slow
def test_out_that_is_a_file(assay_cli, zoo_dir, tmp_path):
    (tmp_path / "results").write_text("x")
    _assert_one_line_exit_2(assay_cli("probe", str(zoo_dir / "qwen3"), "--backend", "eager", "--out", str(tmp_path / "results")), "is not a folder")


def test_unknown_status_filter(assay_cli, tmp_path):
    from assay.compat.results.dataset import init_results

    init_results(tmp_path)
    _assert_one_line_exit_2(assay_cli("results", str(tmp_path), "--status", "GREAT"), "unknown status")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["sweep", "--bogus"], "No such option: --bogus"),
        (["probe"], "Missing argument 'model'"),
        (["sweep", "--workers", "x"], "Invalid value for '--workers'"),
        (["no-such-command"], "No such command"),
    ],
)
def test_usage_errors_are_one_line_too(assay_cli, args, fragment):
    # Click's own usage box is several lines; assay turns every usage error into one line and exit 2.
    _assert_one_line_exit_2(assay_cli(*args), fragment)
