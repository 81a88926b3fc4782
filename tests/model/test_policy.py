"""SandboxPolicy.from_dict, its CONFIG_INVALID errors, and profile resolution (§2)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piship_remote.model.errors import PiShipError
from piship_remote.model.policy import (
    DEFAULT_ENVIRONMENT_ALLOW,
    DEFAULT_READ_DENY,
    SandboxPolicy,
    SandboxProfile,
    resolve_profile,
)

SEED_POLICY: dict[str, Any] = {
    "required": True,
    "filesystem": {"read": {"deny": ["~/.ssh"]}, "write": {"allow": ["workspace"]}},
    "network": {"mode": "deny"},
    "environment": {"allow": ["PATH", "HOME", "LANG", "DOCS_MODE", "ACME_API_TOKEN"]},
}


def config_error(mapping: Any) -> str:
    with pytest.raises(PiShipError) as caught:
        SandboxPolicy.from_dict(mapping)
    assert caught.value.code == "CONFIG_INVALID"
    return str(caught.value)


# ---------------------------------------------------------------- structuring


def test_seed_policy_structures() -> None:
    assert SandboxPolicy.from_dict(SEED_POLICY) == SandboxPolicy(
        required=True,
        read_deny=("~/.ssh",),
        write_allow=("workspace",),
        network="deny",
        environment_allow=("PATH", "HOME", "LANG", "DOCS_MODE", "ACME_API_TOKEN"),
    )


def test_sequences_are_tuples() -> None:
    policy = SandboxPolicy.from_dict(SEED_POLICY)
    assert isinstance(policy.read_deny, tuple)
    assert isinstance(policy.environment_allow, tuple)


def test_omitted_fields_take_manifest_defaults() -> None:
    policy = SandboxPolicy.from_dict({})
    assert policy.required is False
    assert policy.read_deny == DEFAULT_READ_DENY
    assert policy.write_allow == ("workspace", "tmp")
    assert policy.network == "deny"
    assert policy.environment_allow == DEFAULT_ENVIRONMENT_ALLOW


def test_network_defaults_to_deny_when_required() -> None:
    assert SandboxPolicy.from_dict({"required": True}).network == "deny"
    assert SandboxPolicy.from_dict({"required": True, "network": {}}).network == "deny"


def test_network_defaults_to_deny_when_not_required_too() -> None:
    assert SandboxPolicy.from_dict({"required": False}).network == "deny"
    assert SandboxPolicy.from_dict({"network": {}}).network == "deny"


def test_declared_list_replaces_the_default() -> None:
    policy = SandboxPolicy.from_dict({"filesystem": {"read": {"deny": []}}})
    assert policy.read_deny == ()
    assert policy.write_allow == ("workspace", "tmp")


def test_direct_construction_defaults() -> None:
    assert SandboxPolicy(required=True).network == "deny"
    assert SandboxPolicy().network == "deny"


def test_direct_construction_converts_lists() -> None:
    assert SandboxPolicy(write_allow=["workspace"]).write_allow == ("workspace",)


@pytest.mark.parametrize(
    "rule", ["workspace", "workspace/sub", "tmp", "tmp/x", "~", "~/.ssh", "/etc/secret"]
)
def test_valid_path_rules(rule: str) -> None:
    assert SandboxPolicy.from_dict({"filesystem": {"write": {"allow": [rule]}}}).write_allow == (
        rule,
    )


# ---------------------------------------------------------------- CONFIG_INVALID


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"required": "yes"},
            'sandbox policy field "required" must be true or false, not a string',
        ),
        ({"required": 1}, 'sandbox policy field "required" must be true or false, not a number'),
        (
            {"network": {"mode": "open"}},
            'sandbox policy field "network.mode" must be "deny" or "allow", not "open"',
        ),
        (
            {"network": {"mode": None}},
            'sandbox policy field "network.mode" must be "deny" or "allow", not null',
        ),
        (
            {"network": {"mode": True}},
            'sandbox policy field "network.mode" must be "deny" or "allow", not true',
        ),
        ({"network": "deny"}, 'sandbox policy field "network" must be a mapping, not a string'),
        ({"filesystem": []}, 'sandbox policy field "filesystem" must be a mapping, not a list'),
        (
            {"filesystem": {"write": None}},
            'sandbox policy field "filesystem.write" must be a mapping, not null',
        ),
        (
            {"filesystem": {"read": {"deny": "~/.ssh"}}},
            'sandbox policy field "filesystem.read.deny" must be a list of strings, not a string',
        ),
        (
            {"filesystem": {"read": {"deny": {"a": 1}}}},
            'sandbox policy field "filesystem.read.deny" must be a list of strings, not a mapping',
        ),
        (
            {"filesystem": {"write": {"allow": ["workspace", 3]}}},
            'sandbox policy field "filesystem.write.allow[1]" must be a string, not a number',
        ),
        (
            {"environment": {"allow": [None]}},
            'sandbox policy field "environment.allow[0]" must be a string, not null',
        ),
        (
            {"environment": {"allow": "LANG"}},
            'sandbox policy field "environment.allow" must be a list of strings, not a string',
        ),
        ({"netwrok": {"mode": "deny"}}, 'sandbox policy field "netwrok" is not recognized'),
        (
            {"network": {"mode": "deny", "hosts": []}},
            'sandbox policy field "network.hosts" is not recognized',
        ),
        (
            {"filesystem": {"read": {"permit": []}}},
            'sandbox policy field "filesystem.read.permit" is not recognized',
        ),
        ([], "sandbox policy must be a mapping, not a list"),
        (None, "sandbox policy must be a mapping, not null"),
        ("required", "sandbox policy must be a mapping, not a string"),
    ],
)
def test_bad_input_names_the_field(mapping: Any, message: str) -> None:
    assert config_error(mapping) == message


@pytest.mark.parametrize("rule", ["relative/path", "", "workspaces", "~user/x", "./x", "tmpdir"])
def test_path_rule_must_be_absolute_or_a_token(rule: str) -> None:
    message = config_error({"filesystem": {"read": {"deny": [rule]}}})
    assert message == f'Sandbox path "{rule}" must be absolute or start with workspace, tmp, or ~'


def test_path_rule_with_nul_is_refused() -> None:
    assert "NUL" in config_error({"filesystem": {"write": {"allow": ["/a\0b"]}}})


def test_direct_construction_refuses_a_bad_path_rule() -> None:
    with pytest.raises(PiShipError, match="must be absolute or start with"):
        SandboxPolicy(read_deny=["relative"])


def test_direct_construction_refuses_an_unknown_network_mode() -> None:
    with pytest.raises(PiShipError) as caught:
        SandboxPolicy(network="open")
    assert caught.value.code == "CONFIG_INVALID"
    assert str(caught.value) == (
        'sandbox policy field "network.mode" must be "deny" or "allow", not "open"'
    )


def test_direct_construction_refuses_a_bare_string_list() -> None:
    with pytest.raises(PiShipError):
        SandboxPolicy(environment_allow="LANG")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
LEAF = JSON | st.sampled_from(["deny", "allow", "workspace", "~/.ssh", "/abs", "tmp/x", "rel"])
STRINGS = st.lists(LEAF, max_size=3) | LEAF
SHAPED = st.fixed_dictionaries(
    {},
    optional={
        "required": st.booleans() | LEAF,
        "filesystem": st.fixed_dictionaries(
            {},
            optional={
                "read": st.fixed_dictionaries({}, optional={"deny": STRINGS}) | LEAF,
                "write": st.fixed_dictionaries({}, optional={"allow": STRINGS}) | LEAF,
            },
        )
        | LEAF,
        "network": st.fixed_dictionaries({}, optional={"mode": LEAF}) | LEAF,
        "environment": st.fixed_dictionaries({}, optional={"allow": STRINGS}) | LEAF,
        "extra": LEAF,
    },
)


@settings(max_examples=300, deadline=None)
@given(JSON | SHAPED)
def test_from_dict_gives_a_policy_or_config_invalid(value: Any) -> None:
    try:
        policy = SandboxPolicy.from_dict(value)
    except PiShipError as error:
        assert error.code == "CONFIG_INVALID"
    else:
        assert isinstance(policy, SandboxPolicy)
        assert policy.network in ("deny", "allow")


# ---------------------------------------------------------------- profiles


def test_seed_profile(workspace: Path, home: Path) -> None:
    policy = SandboxPolicy.from_dict(SEED_POLICY)
    profile = resolve_profile(policy, workspace=workspace, home_dir=home)
    assert profile == SandboxProfile(
        workspace=str(workspace),
        home_dir=str(home),
        network="deny",
        environment_allow=("PATH", "HOME", "LANG", "DOCS_MODE", "ACME_API_TOKEN"),
        read_deny=(str(home / ".ssh"),),
        write_allow=(str(workspace),),
        warnings=(),
    )


def test_profile_accepts_str_paths(workspace: Path, home: Path) -> None:
    profile = resolve_profile(SandboxPolicy(), workspace=str(workspace), home_dir=str(home))
    assert profile.workspace == str(workspace)


def test_missing_workspace_keeps_its_tail(root: Path, home: Path) -> None:
    profile = resolve_profile(SandboxPolicy(), workspace=root / "new" / "ws", home_dir=home)
    assert profile.workspace == str(root / "new" / "ws")


def test_symlinks_are_resolved_through_the_nearest_existing_ancestor(
    root: Path, workspace: Path, home: Path
) -> None:
    link = root / "link"
    link.symlink_to(workspace)
    policy = SandboxPolicy(read_deny=[str(link / "missing" / "deep")], write_allow=[])
    profile = resolve_profile(policy, workspace=link, home_dir=home)
    assert profile.workspace == str(workspace)
    assert profile.read_deny == (str(workspace / "missing" / "deep"),)


def test_dot_dot_is_normalized_before_links(root: Path, workspace: Path, home: Path) -> None:
    (root / "other").mkdir()
    (root / "other" / "inner").mkdir()
    (workspace / "jump").symlink_to(root / "other" / "inner")
    profile = resolve_profile(SandboxPolicy(), workspace=workspace / "jump" / "..", home_dir=home)
    assert profile.workspace == str(workspace)


def test_tokens_expand(workspace: Path, home: Path, root: Path) -> None:
    policy = SandboxPolicy(
        read_deny=["~", "~/.aws", "/etc/shadow"], write_allow=["workspace/sub", "tmp", "tmp/x"]
    )
    profile = resolve_profile(policy, workspace=workspace, home_dir=home, tmp_dir=root / "t")
    assert profile.read_deny == (str(home), str(home / ".aws"), "/etc/shadow")
    assert profile.write_allow == (str(workspace / "sub"), str(root / "t"), str(root / "t" / "x"))


def test_paths_are_deduplicated_in_first_seen_order(workspace: Path, home: Path) -> None:
    policy = SandboxPolicy(write_allow=["workspace/sub", "workspace", str(workspace / "sub")])
    profile = resolve_profile(policy, workspace=workspace, home_dir=home)
    assert profile.write_allow == (str(workspace / "sub"), str(workspace))


def test_environment_allow_is_deduplicated(workspace: Path, home: Path) -> None:
    policy = SandboxPolicy(environment_allow=["LANG", "TZ", "LANG"])
    assert resolve_profile(policy, workspace=workspace, home_dir=home).environment_allow == (
        "LANG",
        "TZ",
    )


def test_a_writable_path_inside_a_denied_one_warns(workspace: Path, home: Path) -> None:
    policy = SandboxPolicy(read_deny=["workspace/secret"], write_allow=["workspace/secret/out"])
    profile = resolve_profile(policy, workspace=workspace, home_dir=home)
    assert profile.warnings == (
        f"{workspace / 'secret' / 'out'} is inside the read-denied path {workspace / 'secret'};"
        " deny wins and it is hidden in the sandbox",
    )


def test_a_workspace_inside_a_denied_path_warns_once(workspace: Path, home: Path) -> None:
    policy = SandboxPolicy(read_deny=["workspace", "workspace"], write_allow=["workspace"])
    profile = resolve_profile(policy, workspace=workspace, home_dir=home)
    assert profile.warnings == (
        f"{workspace} is inside the read-denied path {workspace};"
        " deny wins and it is hidden in the sandbox",
    )


def test_a_sibling_with_a_common_prefix_does_not_warn(root: Path, home: Path) -> None:
    policy = SandboxPolicy(read_deny=[str(root / "ws")], write_allow=[str(root / "ws2")])
    assert resolve_profile(policy, workspace=root / "w", home_dir=home).warnings == ()


def test_home_defaults_to_the_os_home(
    workspace: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(root / "oshome"))
    profile = resolve_profile(SandboxPolicy(read_deny=["~/.ssh"]), workspace=workspace)
    assert profile.home_dir == str(root / "oshome")
    assert profile.read_deny == (str(root / "oshome" / ".ssh"),)


def test_tmp_defaults_to_the_system_temp_dir(workspace: Path, home: Path) -> None:
    import tempfile

    profile = resolve_profile(
        SandboxPolicy(write_allow=["tmp"]), workspace=workspace, home_dir=home
    )
    assert profile.write_allow == (os.path.realpath(tempfile.gettempdir()),)


def test_workspace_with_nul_is_config_invalid(home: Path) -> None:
    with pytest.raises(PiShipError) as caught:
        resolve_profile(SandboxPolicy(), workspace="/tmp/a\0b", home_dir=home)
    assert caught.value.code == "CONFIG_INVALID"


def test_profile_is_constructible_directly() -> None:
    profile = SandboxProfile(workspace=Path("/srv/p"), environment_allow=["LANG"])
    assert profile.workspace == "/srv/p"
    assert profile.environment_allow == ("LANG",)
    assert profile.network == "deny"
    assert profile.home_dir is None


def test_direct_construction_accepts_any_iterable() -> None:
    assert SandboxPolicy(environment_allow=iter(["LANG", "TZ"])).environment_allow == ("LANG", "TZ")


def test_direct_construction_refuses_a_non_iterable() -> None:
    with pytest.raises(PiShipError):
        SandboxPolicy(environment_allow=5)  # type: ignore[arg-type]


def test_read_allow_names_secret_files_to_send() -> None:
    policy = SandboxPolicy.from_dict({"filesystem": {"read": {"allow": ["workspace/.env"]}}})
    assert policy.read_allow == ("workspace/.env",)
    assert SandboxPolicy().read_allow == ()
