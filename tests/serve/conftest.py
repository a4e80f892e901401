"""Fixtures the serving tests share: the tiny Qwen3 with a chat template (the zoo's tokenizers have none)."""

from __future__ import annotations

import shutil

import pytest
from serve.test_openai_chat import CHATML


@pytest.fixture(scope="session")
def chat_model(zoo_dir, tmp_path_factory):
    """A copy of the tiny pretrained Qwen3 with a ChatML template added (chat_template.jinja, which Transformers
    reads from the folder)."""
    folder = tmp_path_factory.mktemp("chat") / "qwen3-chat"
    shutil.copytree(zoo_dir / "qwen3-pretrained", folder)
    (folder / "chat_template.jinja").write_text(CHATML)
    return folder
