"""Bad GGUF input for `assay convert gguf` and `assay zoo real`, in tests/test_bad_input.py's way: exit 2,
one line on stderr, no traceback, nothing written. Each is found before any weight is read (seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_bad_input import assert_bad_input

from assay.zoo.real import smollm2_gguf_path


@pytest.fixture(scope="module")
def gguf_inputs(tmp_path_factory) -> dict[str, Path]:
    import gguf

    root = tmp_path_factory.mktemp("bad-gguf")
    made = {"root": root}
    made["text"] = root / "notes.gguf"
    made["text"].write_text("not a model\n")
    # A well-formed GGUF file of an architecture Transformers has no GGUF support for.
    writer = gguf.GGUFWriter(str(root / "foreign.gguf"), "nosucharch")
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_embedding_length(8)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    made["foreign"] = root / "foreign.gguf"
    # The real file cut short: a download that stopped half-way.
    real = smollm2_gguf_path()
    made["truncated"] = root / "truncated.gguf"
    with open(real, "rb") as source, open(made["truncated"], "wb") as target:
        target.write(source.read(real.stat().st_size // 2))
    made["real"] = real
    made["occupied"] = root / "occupied"
    made["occupied"].mkdir()
    (made["occupied"] / "thesis.tex").write_text("years of work\n")
    return made


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", [
    pytest.param(["convert", "gguf", "{text}", "{tmp}/out"], "is not a GGUF file", id="not-gguf"),
    pytest.param(["convert", "gguf", "{foreign}", "{tmp}/out"], "architecture nosucharch is not supported", id="unsupported-architecture"),
    pytest.param(["convert", "gguf", "{truncated}", "{tmp}/out"], "cannot read", id="truncated"),
    pytest.param(["convert", "gguf", "{tmp}/nowhere.gguf", "{tmp}/out"], "does not exist", id="no-such-file"),
    pytest.param(["convert", "gguf", "{root}", "{tmp}/out"], "is a folder, not a file", id="a-folder"),
    pytest.param(["convert", "gguf", "{real}", "{text}"], "is a file, not a folder", id="out-is-a-file"),
    pytest.param(["convert", "gguf", "{real}", "{occupied}"], "is a folder of other files", id="out-holds-other-files"),
    pytest.param(["zoo", "real", "{occupied}"], "is a folder of other files", id="zoo-real-out-holds-other-files"),
])
def test_bad_gguf_input_is_one_line_and_exit_2(gguf_inputs, tmp_path, args, fragment):
    assert_bad_input(gguf_inputs, tmp_path, args, fragment)
