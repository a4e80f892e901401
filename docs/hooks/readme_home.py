"""MkDocs hook: the site's home page is README.md, its links to docs/ rewritten for the site."""

import re
from pathlib import Path

from mkdocs.structure.files import File

# README.md links pages as docs/x.md (right on GitHub); on the site the same pages sit beside the home page.
DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files, config):
    readme = Path(config.config_file_path).parent / "README.md"
    home = DOCS_LINK.sub("](", readme.read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=home))
    return files
