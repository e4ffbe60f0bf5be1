"""`livefit versions`: read and move a model's serving record on a learner (labels, the label
the unversioned path serves, the pin, rollbacks) through its admin routes
(``/v1/admin/models/{name}/...``, docs/http.md "Labels, pins and rollbacks").

Thin: one HTTP call per command, the learner checks everything. Exit status 0 when the learner
made the move (or answered ``list``), 1 when it refused (its reason in one line) or could not
be reached, 2 for a command line without an admin token.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

TOKEN_ENV = "LIVEFIT_HTTP__ADMIN_TOKEN"  # the learner's own setting, read from the environment
DEFAULT_URL = "http://127.0.0.1:8000"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the actions of `livefit versions` (one subcommand each) to ``parser``."""
    common = argparse.ArgumentParser(add_help=False)  # every action takes them, after it
    common.add_argument(
        "--url", default=DEFAULT_URL, help="the learner's HTTP address (default %(default)s)"
    )
    common.add_argument(
        "--admin-token",
        default=None,
        help=f"the learner's http.admin_token (default: the environment's {TOKEN_ENV})",
    )
    common.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for the learner's answer"
    )
    actions = parser.add_subparsers(title="actions", dest="action", required=True)

    def action(name: str, text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=text, description=text, parents=[common])
        sub.add_argument("model", help="the model's name")
        return sub

    listing = action("list", "the serving record, the newest version and the versions kept")
    listing.add_argument("--json", action="store_true", help="the learner's answer as JSON")
    label = action("label", "point a label at a kept version (made, or moved)")
    label.add_argument("label")
    label.add_argument("version", type=int)
    unlabel = action("unlabel", "remove a label")
    unlabel.add_argument("label")
    default = action("default", "the label the unversioned path serves (`latest`: the newest)")
    default.add_argument("label")
    pin = action("pin", "hold the unversioned path at a version; training goes on")
    pin.add_argument("version", type=int, nargs="?", help="default: the version served now")
    action("unpin", "serve the default label again")
    rollback = action("rollback", "back to a kept version")
    rollback.add_argument("version", type=int)
    rollback.add_argument(
        "--mode",
        choices=("serve", "train"),
        default="serve",
        help="serve: pin it; train: the trainer goes on from it as a new version "
        "(default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Run one action of `livefit versions` (module docstring for the exit status)."""
    token = args.admin_token or os.environ.get(TOKEN_ENV)
    if not token:
        return _fail(f"an admin token is needed: --admin-token or {TOKEN_ENV}", 2)
    method, path, body = request_for(args)
    url = f"{args.url.rstrip('/')}/v1/admin/models/{args.model}{path}"
    try:
        answer = httpx.request(
            method, url, json=body, timeout=args.timeout,
            headers={"Authorization": f"Bearer {token}"},
        )  # fmt: skip
    except httpx.HTTPError as exc:
        return _fail(f"{args.url} did not answer: {exc or type(exc).__name__}", 1)
    if answer.status_code != 200:
        return _fail(f"HTTP {answer.status_code}: {_error_of(answer)}", 1)
    document = answer.json()
    if args.action == "list" and args.json:
        print(answer.text)
    else:
        print(describe(args.model, document, listing=args.action == "list"))
    return 0


def request_for(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """The method, the path under the model's admin prefix and the JSON body of an action."""
    action = args.action
    if action == "list":
        return "GET", "/versions", None
    if action == "label":
        return "PUT", f"/labels/{args.label}", {"version": args.version}
    if action == "unlabel":
        return "DELETE", f"/labels/{args.label}", None
    if action == "default":
        return "PUT", "/default", {"label": args.label}
    if action == "pin":
        return "PUT", "/pin", {} if args.version is None else {"version": args.version}
    if action == "unpin":
        return "DELETE", "/pin", None
    return "POST", "/rollback", {"version": args.version, "mode": args.mode}


def describe(model: str, document: dict[str, Any], listing: bool = False) -> str:
    """The admin routes' answer as lines a person reads: the record in one line, with the
    newest, kept and missing versions when ``listing``."""
    record = document.get("record", {})
    labels = ", ".join(f"{k}={v}" for k, v in record.get("labels", {}).items()) or "no labels"
    pinned = record.get("pinned")
    serves = f"pinned to {pinned}" if pinned is not None else f"serves {record.get('default')}"
    lines = [f"{model}: {labels}; the unversioned path {serves} (move {record.get('sequence')})"]
    if listing:
        lines.append(f"newest: {document.get('newest')}")
        lines.append(f"kept: {_numbers(document.get('kept', []))}")
        if document.get("missing"):
            lines.append(f"not arrived yet: {_numbers(document['missing'])}")
        for rollback in record.get("rollbacks", []):
            lines.append(
                f"rollback to {rollback['source']} ({rollback['mode']}) as {rollback['version']}"
            )
    return "\n".join(lines)


def _numbers(values: list[int], shown: int = 12) -> str:
    """Versions newest first, the middle of a long list counted rather than shown."""
    if len(values) > shown:
        head, tail = values[: shown - 2], values[-2:]
        middle = f"... {len(values) - shown} more ..."
        return ", ".join([*map(str, head), middle, *map(str, tail)])
    return ", ".join(str(v) for v in values) or "none"


def _error_of(answer: httpx.Response) -> str:
    try:
        return str(answer.json()["error"])
    except (ValueError, KeyError, TypeError):
        return answer.text.strip()[:200] or answer.reason_phrase


def _fail(message: str, code: int) -> int:
    print(f"livefit versions: {message}", file=sys.stderr)
    return code
