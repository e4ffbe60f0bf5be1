"""No function of the product over 150 lines (issue #46): a longer one holds several
responsibilities that a reader has to take apart; cut it into named parts, by responsibility."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("server", "models", "clients", "livefit")
LIMIT = 150


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """``path:line name (n lines)`` of every function or method over ``limit`` lines."""
    found = []
    for folder in PRODUCT:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > limit:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_product_is_over_150_lines() -> None:
    assert long_functions(ROOT) == []


def test_a_long_function_is_found(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "long.py").write_text(f"def long():\n{body}\n\ndef short():\n    pass\n")
    assert long_functions(tmp_path) == [f"server/long.py:1 long ({LIMIT + 1} lines)"]
