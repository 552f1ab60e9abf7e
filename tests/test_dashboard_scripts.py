"""The dashboard's script files: each in the package and under the module size, joined in
`SCRIPTS` order into the page's one inline script, the one the policy's hash allows."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest

from fisk_sm.supervisor.api import page


def test_the_page_script_is_the_listed_files_joined_in_order_and_hashed() -> None:
    texts = [(page.HERE / name).read_text(encoding="utf-8") for name in page.SCRIPTS]
    assert page.SCRIPTS[0] == "dashboard_dom.js" and page.SCRIPTS[-1] == "dashboard.js"
    assert texts[0].count("const fisk = {};") == 1  # the one namespace, made first
    for name, text in zip(page.SCRIPTS, texts, strict=True):
        assert len(text.splitlines()) < 400, name
        assert text.startswith('"use strict";'), name
    loaded = page.load_page()
    scripts = re.findall(r"<script>(.*?)</script>", loaded.html, flags=re.S)
    assert scripts == ["\n".join(texts)]
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}';" in loaded.csp


def test_a_script_file_with_a_closing_tag_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("dashboard.html", "dashboard.css", *page.SCRIPTS):
        (tmp_path / name).write_text((page.HERE / name).read_text(encoding="utf-8"))
    (tmp_path / "dashboard_view.js").write_text('"use strict";\n// </script><b>x</b>\n')
    monkeypatch.setattr(page, "HERE", tmp_path)
    monkeypatch.setattr(page, "DASHBOARD", tmp_path / "dashboard.html")
    with pytest.raises(ValueError, match=r"^dashboard_view\.js holds a closing tag$"):
        page.load_page()
