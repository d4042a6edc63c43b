"""Sealed session tokens: only our keys open them, nothing else gets in, and they expire."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap.problems import SessionExpired, SessionUnknown
from bootstrap.service.join import sessions
from bootstrap.service.join.sessions import Kind, Sealer, Session, load_keys

KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))
T0 = 1_800_000_000.0
EK = "ab" * 32
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _new(sealer: Sealer, kind: Kind = "join", **over: object) -> tuple[Session, str]:
    args: dict[str, object] = {
        "kind": kind,
        "node_name": "gpu-1",
        "ek_sha256": EK,
        "ak_public": b"\x00\x01ak-public",
        "csr_der": b"0\x82csr-der",
        "selection": "sha256:0,1,2,3,4,5,6,7",
        "ttl": 60.0,
        "secret": os.urandom(32) if kind == "join" else b"",
        "spiffe_id": "" if kind == "join" else "spiffe://example.org/node/gpu-1",
    }
    args.update(over)
    return sealer.new(**args)  # type: ignore[arg-type]


def _raw(token: str) -> bytes:
    body = token[len(sessions.PREFIX) :]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def _token(raw: bytes) -> str:
    return sessions.PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def sealed() -> tuple[Sealer, Session, str]:
    sealer = Sealer([KEY_A], clock=Clock())
    session, token = _new(sealer)
    return sealer, session, token


# -- round trip ---------------------------------------------------------------------------------


def test_join_round_trip() -> None:
    sealer = Sealer([KEY_A], clock=Clock())
    session, token = _new(sealer)
    assert token.startswith("ngs1.")
    assert sealer.open(token, "join") == session
    assert session.kind == "join"
    assert len(session.nonce) == 32
    assert len(session.secret) == 32
    assert len(session.id) == 32
    assert session.expires_at == T0 + 60


def test_renew_round_trip() -> None:
    sealer = Sealer([KEY_A], clock=Clock())
    session, token = _new(sealer, "renew")
    opened = sealer.open(token, "renew")
    assert opened == session
    assert opened.secret == b""
    assert opened.spiffe_id == "spiffe://example.org/node/gpu-1"


def test_another_replica_with_the_same_key_opens_it() -> None:
    session, token = _new(Sealer([KEY_A], clock=Clock()))
    assert Sealer([KEY_A], clock=Clock()).open(token, "join") == session


def test_sessions_are_fresh_each_time() -> None:
    sealer = Sealer([KEY_A], clock=Clock())
    (s1, t1), (s2, t2) = _new(sealer), _new(sealer)
    assert s1.id != s2.id
    assert s1.nonce != s2.nonce
    assert t1 != t2
    # Sealing the same session twice uses a fresh IV: equal content, different tokens.
    assert sealer.seal(s1) != sealer.seal(s1)


def test_token_does_not_reveal_the_secret() -> None:
    sealer = Sealer([KEY_A], clock=Clock())
    session, token = _new(sealer, secret=b"S" * 32)
    raw = _raw(token)
    for field in (session.secret, session.nonce, session.node_name.encode(), session.ek_sha256.encode()):
        assert field not in raw
        assert field not in token.encode()


@pytest.mark.parametrize(("sealed_as", "opened_as"), [("join", "renew"), ("renew", "join")])
def test_wrong_kind_is_unknown(sealed_as: Kind, opened_as: Kind) -> None:
    sealer = Sealer([KEY_A], clock=Clock())
    _, token = _new(sealer, sealed_as)
    with pytest.raises(SessionUnknown) as info:
        sealer.open(token, opened_as)
    assert info.value.code == "session_unknown"


def test_qualifying_data() -> None:
    sealer = Sealer([KEY_A], clock=Clock())
    csr = os.urandom(300)
    session, token = _new(sealer, csr_der=csr)
    expected = hashlib.sha256(session.nonce + hashlib.sha256(csr).digest()).digest()
    assert session.qualifying_data == expected
    assert sealer.open(token, "join").qualifying_data == expected
    # Bound to both: another CSR or another nonce gives other qualifying data.
    assert dataclasses.replace(session, csr_der=csr + b"x").qualifying_data != expected
    assert dataclasses.replace(session, nonce=os.urandom(32)).qualifying_data != expected


# -- expiry -------------------------------------------------------------------------------------


def test_expiry_with_an_injected_clock() -> None:
    clock = Clock()
    sealer = Sealer([KEY_A], clock=clock)
    session, token = _new(sealer, ttl=60.0)
    clock.now = T0 + 59.999
    assert sealer.open(token, "join") == session
    clock.now = T0 + 60
    with pytest.raises(SessionExpired) as info:
        sealer.open(token, "join")
    assert info.value.code == "session_expired"
    clock.now = T0 + 10_000
    with pytest.raises(SessionExpired):
        sealer.open(token, "join")


def test_forged_token_is_unknown_even_after_any_expiry() -> None:
    # A forged token is unknown even when the clock is past any expiry.
    clock = Clock(T0 + 10**9)
    with pytest.raises(SessionUnknown):
        Sealer([KEY_A], clock=clock).open("ngs1." + "A" * 100, "join")


# -- keys ---------------------------------------------------------------------------------------


def test_token_from_another_key_is_unknown() -> None:
    _, token = _new(Sealer([KEY_B], clock=Clock()))
    with pytest.raises(SessionUnknown):
        Sealer([KEY_A], clock=Clock()).open(token, "join")


def test_token_from_another_key_with_the_same_key_id_is_unknown() -> None:
    # Swap in our key id: the key lookup succeeds, the AEAD tag must still fail.
    sealer_a = Sealer([KEY_A], clock=Clock())
    _, foreign = _new(Sealer([KEY_B], clock=Clock()))
    _, ours = _new(sealer_a)
    forged = _token(_raw(ours)[:4] + _raw(foreign)[4:])
    with pytest.raises(SessionUnknown):
        sealer_a.open(forged, "join")


def test_key_rotation() -> None:
    clock = Clock()
    old = Sealer([KEY_A], clock=clock)
    old_session, old_token = _new(old)
    rotated = Sealer([KEY_B, KEY_A], clock=clock)
    new_session, new_token = _new(rotated)
    assert _raw(new_token)[:4] == hashlib.sha256(KEY_B).digest()[:4]  # the first key seals
    assert rotated.open(old_token, "join") == old_session  # the old key still opens
    assert rotated.open(new_token, "join") == new_session
    with pytest.raises(SessionUnknown):
        old.open(new_token, "join")
    retired = Sealer([KEY_B], clock=clock)
    with pytest.raises(SessionUnknown):
        retired.open(old_token, "join")


@pytest.mark.parametrize("keys", [[], [b""], [b"x" * 31], [b"x" * 33], [KEY_A, b"short"]])
def test_bad_key_lists_are_refused(keys: list[bytes]) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Sealer(keys)


# -- tampering and garbage ----------------------------------------------------------------------


@given(data=st.data())
@settings(max_examples=300, deadline=None)
def test_any_flipped_byte_is_unknown(sealed: tuple[Sealer, Session, str], data: st.DataObject) -> None:
    sealer, _, token = sealed
    raw = bytearray(_raw(token))
    pos = data.draw(st.integers(0, len(raw) - 1), label="position")
    mask = data.draw(st.integers(1, 255), label="xor")
    raw[pos] ^= mask
    with pytest.raises(SessionUnknown):
        sealer.open(_token(bytes(raw)), "join")


@given(data=st.data())
@settings(max_examples=300, deadline=None)
def test_any_changed_character_is_unknown(sealed: tuple[Sealer, Session, str], data: st.DataObject) -> None:
    # Includes the last character, whose unused low bits must not give a second spelling.
    sealer, _, token = sealed
    pos = data.draw(st.integers(0, len(token) - 1), label="position")
    char = data.draw(st.sampled_from(ALPHABET + ".").filter(lambda c: c != token[pos]), label="char")
    with pytest.raises(SessionUnknown):
        sealer.open(token[:pos] + char + token[pos + 1 :], "join")


def test_last_character_variants_are_refused() -> None:
    # Find sessions whose raw length leaves unused bits in the last base64 character.
    sealer = Sealer([KEY_A], clock=Clock())
    checked = 0
    for n in range(1, 7):
        _, token = _new(sealer, node_name="n" * n)
        if len(_raw(token)) % 3 == 0:
            continue
        checked += 1
        for c in ALPHABET:
            if c != token[-1]:
                with pytest.raises(SessionUnknown):
                    sealer.open(token[:-1] + c, "join")
    assert checked > 0


def test_truncated_and_extended_tokens_are_unknown(sealed: tuple[Sealer, Session, str]) -> None:
    sealer, _, token = sealed
    for bad in (token[:-1], token[:-4], token[:45], token + "A", token + "AAAA", token + "=", token + "\n"):
        with pytest.raises(SessionUnknown):
            sealer.open(bad, "join")


@pytest.mark.parametrize(
    "bad",
    [
        None,
        b"ngs1.AAAA",
        123,
        ["ngs1."],
        "",
        "ngs1.",
        "ngs2." + "A" * 60,
        "NGS1." + "A" * 60,
        "ngs1." + "A" * 39,
        "ngs1." + "A" * 40,
        "ngs1." + "A" * 41,  # 4k+1 characters cannot be base64
        "ngs1." + "+/" * 30,
        "ngs1." + "A" * 60 + "==",
        " ngs1." + "A" * 60,
        "ngs1." + "A" * (sessions.MAX_TOKEN_CHARS - 5),
        "ngs1." + "A" * (sessions.MAX_TOKEN_CHARS * 4),
    ],
)
def test_garbage_is_unknown(bad: object) -> None:
    with pytest.raises(SessionUnknown):
        Sealer([KEY_A], clock=Clock()).open(bad, "join")


@given(st.text(max_size=600))
@settings(max_examples=400, deadline=None)
def test_arbitrary_text_is_unknown(text: str) -> None:
    with pytest.raises(SessionUnknown):
        Sealer([KEY_A], clock=Clock()).open(text, "join")


@given(st.text(alphabet=ALPHABET, min_size=40, max_size=600))
@settings(max_examples=400, deadline=None)
def test_well_formed_looking_tokens_are_unknown(body: str) -> None:
    with pytest.raises(SessionUnknown):
        Sealer([KEY_A], clock=Clock()).open("ngs1." + body, "join")


@given(st.binary(min_size=0, max_size=400))
@settings(max_examples=300, deadline=None)
def test_random_bytes_under_our_key_id_are_unknown(tail: bytes) -> None:
    kid = hashlib.sha256(KEY_A).digest()[:4]
    with pytest.raises(SessionUnknown):
        Sealer([KEY_A], clock=Clock()).open(_token(kid + tail), "join")


# -- size ---------------------------------------------------------------------------------------


def test_tokens_are_bounded_in_size() -> None:
    sealer = Sealer([KEY_A], clock=Clock())
    # The largest join csr.py admits: an RSA-8192 CSR for a 253-character name is under 2.6 KB
    # of DER; an RSA-2048 TPM2B_PUBLIC AK is about 300 bytes.
    name = ("a" * 63 + ".") * 3 + "a" * 61
    session, token = _new(sealer, node_name=name, ak_public=os.urandom(600), csr_der=os.urandom(2600))
    assert len(token) <= sessions.MAX_TOKEN_CHARS
    assert sealer.open(token, "join") == session
    with pytest.raises(ValueError, match="too large"):
        _new(sealer, csr_der=os.urandom(sessions.MAX_TOKEN_CHARS))


# -- session key file ---------------------------------------------------------------------------


def test_load_keys_creates_the_key_once(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        first = load_keys(tmp_path)
    finally:
        os.umask(old)
    path = tmp_path / "session.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == 1
    assert len(first[0]) == 32
    assert load_keys(tmp_path) == first
    assert path.read_text() == first[0].hex() + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.key"]


def test_two_state_dirs_get_different_keys(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert load_keys(tmp_path / "a") != load_keys(tmp_path / "b")


def test_load_keys_reads_several_keys_in_order(tmp_path: Path) -> None:
    (tmp_path / "session.key").write_text(f"# rotated 2026-07-01\n{KEY_B.hex()}\n\n  {KEY_A.hex()}  \n")
    keys = load_keys(tmp_path)
    assert keys == [KEY_B, KEY_A]
    _, token = _new(Sealer([KEY_A], clock=Clock()))
    Sealer(keys, clock=Clock()).open(token, "join")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"# no keys\n",
        b"not hex at all\n",
        KEY_A.hex()[:-2].encode() + b"\n",
        KEY_A.hex().encode() + b"00\n",
        KEY_A.hex().upper().encode() + b"\n",
        KEY_A.hex().encode() + b"\n" + b"zz" * 32 + b"\n",
        b"\xff\xfe" * 32 + b"\n",
    ],
)
def test_corrupt_key_file_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "session.key").write_bytes(content)
    with pytest.raises(ValueError, match=r"session\.key: expected lines of 64 lowercase hex"):
        load_keys(tmp_path)
    assert (tmp_path / "session.key").read_bytes() == content  # never silently replaced


def test_oversized_key_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "session.key").write_bytes((KEY_A.hex() + "\n").encode() * 2000)
    with pytest.raises(ValueError, match="larger than"):
        load_keys(tmp_path)
