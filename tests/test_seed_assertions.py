"""The ported seed cases assert exactly what the seed asserts, and change nothing they compare.

The seed suite is read where CI keeps it, ``../shared/seed/remote.test.ts`` beside the
clone (or above a worktree; ``PISHIP_SEED_SUITE`` names another place); without it these
tests are skipped. The checker itself (``tests.support.seed_assertions``) is tested on
edited copies of a port, so a green run means it would have caught an edited assertion.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.seed_assertions import (
    Expected,
    Regex,
    findings,
    js_literal,
    ported_functions,
    seed_cases,
)

ROOT = Path(__file__).parents[1]
TESTS = Path(__file__).parent
SEED_PATH = Path("shared") / "seed" / "remote.test.ts"
E2B_PORT = "backends/e2b/test_e2b_seed.py"


def seed_suite() -> Path | None:
    named = os.environ.get("PISHIP_SEED_SUITE")
    if named:
        return Path(named)
    for place in (ROOT.parent, ROOT.parents[1]):
        if (place / SEED_PATH).is_file():
            return place / SEED_PATH
    return None


@pytest.fixture(scope="module")
def cases() -> dict[str, list[Expected]]:
    suite = seed_suite()
    if suite is None:
        pytest.skip(f"the seed suite is not here (../{SEED_PATH}, or set PISHIP_SEED_SUITE)")
    return seed_cases(suite.read_text())


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    """The test modules that port seed cases (they carry ``# seed: "..."`` markers)."""
    texts = {
        str(path.relative_to(TESTS)): path.read_text()
        for path in sorted(TESTS.rglob("*.py"))
        if path.name not in ("seed_assertions.py", Path(__file__).name)  # they quote markers
    }
    return {path: text for path, text in texts.items() if '# seed: "' in text}


def test_the_seed_is_read_with_its_literal_expectations(cases: dict[str, list[Expected]]) -> None:
    assert len(cases) >= 50
    assert sum(len(expected) for expected in cases.values()) >= 100
    assert Expected(
        "toEqual",
        {
            "templateID": "piship-workspace",
            "timeout": 3600,
            "metadata": {"created-by": "piship"},
            "allow_internet_access": False,
        },
    ) in cases["creates, checks, runs, and deletes a sandbox"]


def test_every_seed_case_is_ported(
    cases: dict[str, list[Expected]], sources: dict[str, str]
) -> None:
    ported = ported_functions(sources)
    assert [name for name in cases if name not in ported] == []


def test_every_ported_seed_assertion_is_the_seeds(
    cases: dict[str, list[Expected]], sources: dict[str, str]
) -> None:
    assert findings(cases, sources) == []


# -- the checker catches an edit ------------------------------------------------------------

BODY_ASSERTION = '''    assert body == {
        "templateID": "piship-workspace",
        "timeout": 3600,
        "metadata": {"created-by": "piship"},
        "allow_internet_access": False,
    }
'''


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        pytest.param(
            BODY_ASSERTION,
            '    body["metadata"].pop("piship-create-id")\n' + BODY_ASSERTION,
            ".pop() changes what the seed's case compares",
            id="a key popped before comparing",
        ),
        pytest.param(
            BODY_ASSERTION,
            '    del body["metadata"]["piship-create-id"]\n' + BODY_ASSERTION,
            "`del` changes what the seed's case compares",
            id="a key deleted before comparing",
        ),
        pytest.param(
            '"metadata": {"created-by": "piship"},',
            '"metadata": {"created-by": "piship", "piship-create-id": "x"},',
            "is asserted as",
            id="a key added to the expected body",
        ),
        pytest.param(
            '"timeout": 3600,', '"timeout": 1800,', "the seed's 3600", id="a number changed"
        ),
        pytest.param(
            'Run(0, "cwd=/home/user/sub\\n")',
            'Run(0, "cwd=/home/user\\n")',
            "the seed's 'cwd=/home/user/sub\\n'",
            id="a string changed",
        ),
        pytest.param(
            '# seed: "creates, checks, runs, and deletes a sandbox"',
            '# seed: "creates, checks and runs a sandbox"',
            "no seed case is called",
            id="a port renamed away from its case",
        ),
    ],
)
def test_an_edited_port_is_caught(
    cases: dict[str, list[Expected]], sources: dict[str, str], old: str, new: str, said: str
) -> None:
    port = sources[E2B_PORT]
    assert old in port
    assert not any(said in problem for problem in findings(cases, {E2B_PORT: port}))
    problems = findings(cases, {E2B_PORT: port.replace(old, new, 1)})
    assert any(said in problem for problem in problems), problems


def test_javascript_literals_are_read_as_python_values() -> None:
    assert js_literal('{ a: "x\\n", "b-c": [1, -2.5, true, null], d: /^piship-\\d+$/ }') == {
        "a": "x\n",
        "b-c": [1, -2.5, True, None],
        "d": Regex("^piship-\\d+$"),
    }
    assert js_literal("`it's`") == "it's"


@pytest.mark.parametrize("text", ["first", "`${x}`", "at(T + 1000)", "{ ...rest }"])
def test_what_is_not_a_literal_is_left_out(text: str) -> None:
    assert not list(seed_cases(f'it("c", () => {{ expect(v).toBe({text}); }});')["c"])
