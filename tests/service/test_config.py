"""The serve config: the documented defaults, YAML loading, and every refusal names what is wrong."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap import config, names
from bootstrap.config import (
    ConfigError,
    Settings,
    host_port,
    load_settings,
    parse_duration,
    settings_from_obj,
)

HEX = "ab" * 32
EK = "0123456789abcdef" * 4


def _load(tmp_path: Path, text: str, name: str = "nodegate.yaml") -> Settings:
    path = tmp_path / name
    path.write_text(text)
    return load_settings(path)


def _refused(data: object) -> str:
    with pytest.raises(ConfigError) as info:
        settings_from_obj(data)
    return str(info.value)


# -- defaults -------------------------------------------------------------------------------------


def test_defaults_match_the_documentation() -> None:
    s = Settings()
    assert s.trust_domain == "example.org"
    assert s.listen == "0.0.0.0:8443"
    assert s.tls.cert_file is None
    assert s.tls.key_file is None
    assert s.state_dir == Path("/var/lib/nodegate")
    assert s.store == "sqlite"
    assert s.ek_roots == ()
    assert s.ek_allowlist == ()
    assert s.enrollment == "tofu"
    assert s.inventory == ()
    assert s.pcr_policy.bank == "sha256"
    assert s.pcr_policy.pcrs == (0, 1, 2, 3, 4, 5, 6, 7)
    assert s.pcr_policy.classes == ()
    assert s.pcr_policy.selection == "sha256:0,1,2,3,4,5,6,7"
    assert s.svid_ttl == timedelta(hours=1)
    assert s.session_ttl == timedelta(seconds=60)
    assert s.kubernetes.kubeconfig is None
    assert s.gate.taint_key == "nodegate.io/hold"
    assert s.gate.stability_window == timedelta(seconds=30)
    assert s.admission.policy_files is None
    assert s.admission.rbac_files is None
    assert s.spiffe_id_template == "spiffe://{trust_domain}/node/{node_name}"
    assert s.limits.max_body_bytes == 64 * 1024


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n", "null\n"])
def test_empty_file_is_defaults(tmp_path: Path, text: str) -> None:
    assert _load(tmp_path, text) == Settings()


def test_settings_are_frozen() -> None:
    s = settings_from_obj({"trust_domain": "corp.example"})
    with pytest.raises(pydantic.ValidationError):
        s.trust_domain = "evil.example"
    with pytest.raises(pydantic.ValidationError):
        s.gate.taint_key = "x"
    assert s.trust_domain == "corp.example"
    assert isinstance(s.ek_allowlist, tuple)


# -- loading YAML -------------------------------------------------------------------------------


def test_load_full_file_and_resolve_relative_paths(tmp_path: Path) -> None:
    conf = tmp_path / "etc"
    conf.mkdir()
    s = _load(
        conf,
        f"""
trust_domain: corp.example
listen: "127.0.0.1:9443"
tls: {{cert_file: tls/cert.pem, key_file: /abs/key.pem}}
state_dir: state
store: kubernetes
ek_roots: [roots/a.pem, /etc/ek-roots]
ek_allowlist: ["{HEX.upper()}"]
enrollment: inventory
inventory:
  - {{ek_sha256: "{EK}", node_name: gpu-1.rack-2, labels: {{rack: "2"}}}}
svid_ttl: 30m
session_ttl: 90s
kubernetes: {{kubeconfig: kube/config}}
gate: {{taint_key: example.com/hold, stability_window: 1m}}
admission: {{listen: "127.0.0.1:9444", policy_files: [pol/a.yaml], rbac_files: [/abs/rbac.yaml]}}
""",
    )
    assert s.trust_domain == "corp.example"
    assert host_port(s.listen) == ("127.0.0.1", 9443)
    assert host_port(s.admission.listen) == ("127.0.0.1", 9444)
    assert s.tls.cert_file == conf / "tls/cert.pem"
    assert s.tls.key_file == Path("/abs/key.pem")
    assert s.state_dir == conf / "state"
    assert s.store == "kubernetes"
    assert s.ek_roots == (conf / "roots/a.pem", Path("/etc/ek-roots"))
    assert s.ek_allowlist == (HEX,)
    assert s.enrollment == "inventory"
    assert s.inventory_index[EK].node_name == "gpu-1.rack-2"
    assert s.inventory_index[EK].labels == {"rack": "2"}
    assert s.svid_ttl == timedelta(minutes=30)
    assert s.session_ttl == timedelta(seconds=90)
    assert s.kubernetes.kubeconfig == conf / "kube/config"
    assert s.gate.taint_key == "example.com/hold"
    assert s.gate.stability_window == timedelta(minutes=1)
    assert s.admission.policy_files == (conf / "pol/a.yaml",)
    assert s.admission.rbac_files == (Path("/abs/rbac.yaml"),)


def test_settings_from_obj_without_base_keeps_relative_paths() -> None:
    assert settings_from_obj({"state_dir": "state"}).state_dir == Path("state")


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"trust_domian": "x"}, "trust_domian: unknown key (did you mean trust_domain?)"),
        ({"tls": {"cert": "a.pem"}}, "tls.cert: unknown key (did you mean cert_file?)"),
        ({"gate": {"taint": "x"}}, "gate.taint: unknown key (did you mean taint_key?)"),
        ({"pcr_policy": {"bank": "sha256", "pcr": [0]}}, "pcr_policy.pcr: unknown key (did you mean pcrs?)"),
        (
            {"inventory": [{"ek_sha256": EK, "node_name": "n1", "label": {}}]},
            "inventory[0].label: unknown key (did you mean labels?)",
        ),
        ({"gate": {"zzz": 1}}, "gate.zzz: unknown key"),
    ],
)
def test_unknown_keys_are_refused_by_name(data: dict[str, object], key: str) -> None:
    """The key path, in nodegate's words, with the nearest known key (issue 34)."""
    message = _refused(data)
    assert message == f"invalid config: {key}"


def test_unknown_key_from_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="enrolment"):
        _load(tmp_path, "enrolment: inventory\n")


@pytest.mark.parametrize("text", ["[a, b]\n", "just text\n", "42\n", "- trust_domain: x\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        _load(tmp_path, text)


def test_yaml_aliases_are_refused(tmp_path: Path) -> None:
    text = 'trust_domain: &td "corp.example"\nserver_names: [*td]\n'
    with pytest.raises(ConfigError, match="aliases"):
        _load(tmp_path, text)


def test_billion_laughs_is_refused(tmp_path: Path) -> None:
    lines = ['a: &a ["x", "x"]'] + [
        f"{c}: &{c} [*{p}, *{p}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ]
    with pytest.raises(ConfigError, match="aliases"):
        _load(tmp_path, "\n".join(lines) + "\n")


def test_unsafe_yaml_tags_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        _load(tmp_path, "trust_domain: !!python/object/apply:os.system ['true']\n")


def test_invalid_yaml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        _load(tmp_path, "trust_domain: [unclosed\n")


def test_deeply_nested_yaml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        _load(tmp_path, "x: " + "[" * 20000 + "]" * 20000 + "\n")


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# " + b"x" * config.MAX_CONFIG_BYTES + b"\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_settings(path)


def test_file_at_the_size_cap_loads(tmp_path: Path) -> None:
    body = b"trust_domain: corp.example\n"
    path = tmp_path / "cap.yaml"
    path.write_bytes(body + b"#" * (config.MAX_CONFIG_BYTES - len(body)))
    assert load_settings(path).trust_domain == "corp.example"


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.yaml")


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"trust_domain: \xff\xfe\n")
    with pytest.raises(ConfigError):
        load_settings(path)


# -- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("60s", timedelta(seconds=60)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("500ms", timedelta(milliseconds=500)),
        ("2d", timedelta(days=2)),
        ("1h", timedelta(hours=1)),
        ("5m", timedelta(minutes=5)),
        ("1m30s", timedelta(seconds=90)),
        ("1d2h3m4s5ms", timedelta(days=1, hours=2, minutes=3, seconds=4, milliseconds=5)),
        (" 45s ", timedelta(seconds=45)),
        (timedelta(minutes=2), timedelta(minutes=2)),
    ],
)
def test_parse_duration(value: object, expected: timedelta) -> None:
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "  ",
        "abc",
        "60",
        "1.5h",
        "-5s",
        "5 s",
        "1m1h",
        "10x",
        "s",
        "ms",
        "0s",
        0,
        -1,
        90,
        1.5,
        0.0,
        True,
        False,
        None,
        [60],
        {"s": 1},
        float("nan"),
        float("inf"),
        10**400,
        "99999999999999d",
    ],
)
def test_bad_durations_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    "text", ["svid_ttl: 1.5h", "svid_ttl: -1", "svid_ttl: .inf", "svid_ttl: .nan", "svid_ttl: yes"]
)
def test_bad_durations_in_a_file_name_the_key(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="svid_ttl"):
        _load(tmp_path, text + "\n")


@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none(), st.booleans()))
@settings(max_examples=300, deadline=None)
def test_durations_never_crash(value: object) -> None:
    try:
        d = parse_duration(value)
    except ValueError:
        return
    assert d > timedelta(0)


def test_session_ttl_upper_bound() -> None:
    assert settings_from_obj({"session_ttl": "10m"}).session_ttl == timedelta(minutes=10)
    assert "session_ttl" in _refused({"session_ttl": "10m1s"})
    assert "session_ttl" in _refused({"session_ttl": "1h"})
    assert "session_ttl" in _refused({"session_ttl": 0})


# -- EK allow/deny lists ------------------------------------------------------------------------


def test_allowlist_hex_is_normalised_to_lowercase() -> None:
    s = settings_from_obj({"ek_allowlist": [HEX.upper(), "CD" * 32], "ek_denylist": ["EF" * 32]})
    assert s.ek_allowlist == (HEX, "cd" * 32)
    assert s.ek_denylist == ("ef" * 32,)


@pytest.mark.parametrize(
    "bad",
    ["ab" * 31, "ab" * 33, "zz" * 32, "ab" * 31 + "a ", " " + "ab" * 32, "sha256:" + "ab" * 32, ""],
)
@pytest.mark.parametrize("key", ["ek_allowlist", "ek_denylist"])
def test_allowlist_entries_must_be_sha256_hex(key: str, bad: str) -> None:
    assert key in _refused({key: [HEX, bad]})


def test_allowlist_must_be_a_list_of_strings() -> None:
    assert "ek_allowlist" in _refused({"ek_allowlist": HEX})
    assert "ek_allowlist" in _refused({"ek_allowlist": [12345]})


# -- listen -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("0.0.0.0:8443", ("0.0.0.0", 8443)),  # noqa: S104
        ("127.0.0.1:1", ("127.0.0.1", 1)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:8443", ("::1", 8443)),
        ("[::]:443", ("::", 443)),
        ("[fe80::1%eth0]:8443", ("fe80::1%eth0", 8443)),
        (":8443", ("0.0.0.0", 8443)),  # noqa: S104
    ],
)
def test_listen_host_port(listen: str, expected: tuple[str, int]) -> None:
    assert host_port(listen) == expected
    assert settings_from_obj({"listen": listen}).listen == listen


@pytest.mark.parametrize(
    "listen", ["8443", "host", "host:", "host:port", "host:65536", "host:-1", "[::1]", ""]
)
def test_bad_listen_is_refused(listen: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        host_port(listen)
    assert "listen" in _refused({"listen": listen})


# -- inventory and enums ------------------------------------------------------------------------


def test_inventory_entry_is_validated_and_normalised() -> None:
    s = settings_from_obj(
        {"enrollment": "inventory", "inventory": [{"ek_sha256": EK.upper(), "node_name": "n1"}]}
    )
    (entry,) = s.inventory
    assert entry.ek_sha256 == EK
    assert entry.labels == {}
    assert s.inventory_index == {EK: entry}


@pytest.mark.parametrize(
    "name",
    ["", "UPPER", "-lead", "trail-", "under_score", "a..b", ".a", "a.", "sp ace", "a" * 254, "ü", "a/b"],
)
def test_inventory_node_names_are_kubernetes_names(name: str) -> None:
    assert "node_name" in _refused({"inventory": [{"ek_sha256": EK, "node_name": name}]})


@pytest.mark.parametrize(
    "name", ["a", "n1", "0", "gpu-01.rack-7.dc", "a" * 63, ("a" * 63 + ".") * 3 + "a" * 61]
)
def test_good_node_names(name: str) -> None:
    assert names.is_node_name(name)
    s = settings_from_obj({"inventory": [{"ek_sha256": EK, "node_name": name}]})
    assert s.inventory[0].node_name == name


@pytest.mark.parametrize("ek", ["", "ab" * 31, "g" * 64, EK + "00", 1234])
def test_inventory_ek_must_be_sha256_hex(ek: object) -> None:
    assert "ek_sha256" in _refused({"inventory": [{"ek_sha256": ek, "node_name": "n1"}]})


def test_inventory_entry_needs_both_fields() -> None:
    assert "node_name" in _refused({"inventory": [{"ek_sha256": EK}]})
    assert "ek_sha256" in _refused({"inventory": [{"node_name": "n1"}]})


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"store": "postgres"}, "store"),
        ({"enrollment": "open"}, "enrollment"),
        ({"limits": {"max_body_bytes": 65537}}, "limits.max_body_bytes"),
        ({"pcr_policy": {"pcrs": [0, 0]}}, "pcr_policy"),
        ({"admin": {"spiffe_ids": {"spiffe://x/admin": ["delete"]}}}, "admin.spiffe_ids"),
    ],
)
def test_bad_values_name_their_key(data: dict[str, object], key: str) -> None:
    assert key in _refused(data)
