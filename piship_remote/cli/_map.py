"""``piship-remote map``: one command per item over a pool of sandboxes.

    piship-remote map --size 8 --warm 8 --sync -- 'pytest -q tests/{item}' test_a.py test_b.py
    ls tests | piship-remote map --size 4 --items-file - --jsonl -- 'pytest -q tests/{item}'

Each item's line is the command with ``{item}`` replaced by the item quoted as one
shell word (other braces stay as written). Standard output gets one line per finished
task, and under a task that did not end ``ok`` the last lines of its stderr and stdout
(``--jsonl``: one JSON object, with its whole output); standard error gets the
progress, with ``--sync`` what each sandbox is sent, and at the end a table of the
outcomes. The exit status is 0 when every task is ``ok``, 1 otherwise, 2 when the
service refuses the key or the template (then no task runs). ``--sync`` pushes the
workspace into every sandbox once, when it is activated (nothing is pulled back from
many sandboxes).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

from piship_remote.cli._files import describe_transfer
from piship_remote.cli._setup import backend_for, policy_for
from piship_remote.model.errors import ConfigInvalid, PiShipError
from piship_remote.model.result import CommandResult
from piship_remote.model.transfer import SkippedPath, TransferSummary
from piship_remote.pool import OUTCOMES, SandboxPool, TaskResult
from piship_remote.pool._command import ITEM, NoItemWarning, check_command, no_item_warning
from piship_remote.pool.result import is_refusal

__all__ = ["EXIT_NOT_ALL_OK", "map_items", "summary_table"]

EXIT_NOT_ALL_OK = 1
TAIL_LINES = 10  # lines of each stream shown under a task that did not end ok


def map_items(args: argparse.Namespace) -> int:
    """Run the command for every item; 0 when every task was ``ok``."""
    template, items = _template_and_items(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoItemWarning)  # told below, in the CLI's words
        check_command(template)
        if ITEM not in template:
            print(f"piship-remote: warning: {no_item_warning(template)}", file=sys.stderr)
        counts = _run_pool(args, template, items)
    sys.stderr.write(summary_table(counts))
    return 0 if counts["ok"] == len(items) else EXIT_NOT_ALL_OK


def _run_pool(args: argparse.Namespace, template: str, items: list[str]) -> Counter[str]:
    """Run the tasks, printing each as it ends; the count of each outcome."""
    counts: Counter[str] = Counter()
    with ExitStack() as stack:
        pool = SandboxPool(
            policy_for(args),
            backend=backend_for(args, stack),
            workspace=args.workspace,
            size=args.size,
            warm=args.warm,
            sync="push" if args.sync else "none",
            reuse=not args.fresh,
            reset=args.reset,
            max_create_rate=args.max_create_rate,
            max_attempts=args.max_attempts,
            labels=dict(args.label or ()),
        )
        stack.enter_context(pool)
        if args.sync:
            _report_push(pool, verbose=args.verbose)
        for result in pool.imap(template, items, timeout=args.timeout):
            if result.error is not None and is_refusal(result.error):
                raise result.error  # a wrong key or template: no task can run
            counts[result.outcome] += 1
            lines = [_json_line(result)] if args.jsonl else _text_lines(result)
            print("\n".join(lines), flush=True)
    return counts


def _report_push(pool: SandboxPool, *, verbose: bool) -> None:
    """The push every sandbox gets, told once, from the first sandbox's: what was sent
    and what was left out (each path with ``verbose``)."""
    with pool.sandbox() as sandbox:
        report = sandbox.workspace()
    synced = None if report is None else report.sync
    if synced is None:
        return
    skipped = [SkippedPath(path.path, path.reason) for path in synced.skipped]
    summary = TransferSummary(synced.pushed_files, synced.pushed_bytes, skipped)
    for line in describe_transfer("each sandbox gets", summary, verbose=verbose):
        print(line, file=sys.stderr, flush=True)


def _template_and_items(args: argparse.Namespace) -> tuple[str, list[str]]:
    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise ConfigInvalid(
            "map needs a command after --",
            user_action="Example: piship-remote map --size 4 -- 'pytest tests/{item}' a.py b.py",
        )
    template, items = words[0], words[1:]
    if args.items_file is not None:
        items += _read_items(args.items_file)
    if not items:
        raise ConfigInvalid(
            "map has no items: name them after the command, or with --items-file",
        )
    return template, items


def _read_items(path: str) -> list[str]:
    """One item per non-blank line of ``path`` (``-``: standard input)."""
    if path == "-":
        return _lines(sys.stdin)
    try:
        with open(path, encoding="utf-8") as stream:
            return _lines(stream)
    except OSError as e:
        raise ConfigInvalid(f"cannot read the items file {path}: {e.strerror}") from None


def _lines(stream: Iterable[str]) -> list[str]:
    return [line.strip() for line in stream if line.strip()]


def _text_lines(result: TaskResult) -> list[str]:
    """The task's line; for one that did not end ``ok``, the last lines of its output."""
    detail = ""
    if isinstance(result.value, CommandResult) and result.outcome != "ok":
        detail = f" (exit {result.value.exit_code})"
    elif result.error is not None and result.outcome != "ok":
        detail = f": {' '.join(str(result.error).split())[:300]}"
    lines = [f"{result.outcome:<9} {result.item} {result.seconds:.1f}s{detail}"]
    output = _output_of(result)
    if result.outcome != "ok" and output is not None:
        lines.extend(_output_tail("stderr", output.stderr))
        lines.extend(_output_tail("stdout", output.stdout))
    return lines


def _output_of(result: TaskResult) -> CommandResult | None:
    """The task's output: its command's result, or what it wrote before it was stopped."""
    if isinstance(result.value, CommandResult):
        return result.value
    output = getattr(result.error, "output", None)
    return output if isinstance(output, CommandResult) else None


def _output_tail(stream: str, text: str) -> list[str]:
    """The last ``TAIL_LINES`` lines of ``text``, each under a ``stream |`` margin."""
    lines = text.rstrip("\n").splitlines()[-TAIL_LINES:]
    return [f"  {stream} | {line}" for line in lines]


def _json_line(result: TaskResult) -> str:
    line: dict[str, Any] = {
        "item": result.item,
        "outcome": result.outcome,
        "sandboxId": result.sandbox_id,
        "attempts": result.attempts,
        "seconds": round(result.seconds, 3),
    }
    if isinstance(result.value, CommandResult):
        line.update(
            exitCode=result.value.exit_code, stdout=result.value.stdout, stderr=result.value.stderr
        )
    if result.error is not None:
        error = result.error
        line["error"] = error.to_dict() if isinstance(error, PiShipError) else str(error)
    return json.dumps(line)


def summary_table(counts: Counter[str]) -> str:
    """The outcomes and how many tasks had each, in a fixed order, then the total."""
    rows = [(str(outcome), counts[outcome]) for outcome in OUTCOMES if counts[outcome]]
    rows.append(("total", sum(counts.values())))
    width = max(len(str(n)) for _, n in rows)
    return "".join(f"{name:<10}{n:>{width}}\n" for name, n in rows)
