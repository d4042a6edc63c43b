"""Node side: the TPM operations `nodegate join` needs, through tpm2-pytss.

    with Agent("device:/dev/tpmrm0") as tpm:
        ek = tpm.create_ek("rsa")           # EK from the TCG template; .public, .certificate
        ak = tpm.create_ak()                # restricted ECDSA-P256/SHA-256 key, endorsement hierarchy
        secret = tpm.activate_credential(ak, ek, credential_blob, encrypted_secret)
        quote, signature = tpm.quote(ak, "sha256:0,1,2,3,4,5,6,7", qualifying_data)
        pcrs = tpm.read_pcrs("sha256:0,1,2,3,4,5,6,7")

All inputs and outputs are marshalled TPM structures as ``bytes`` (the wire format of the join
protocol). Every transient object the agent creates is flushed when the context closes. Errors
are :class:`TpmError` subclasses with a message a boot script can print as is.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from attest import wire
from bootstrap.node.defaults import DEFAULT_TCTI

# libtss2 logs every TPM error response to stderr; our errors say what matters, once.
os.environ.setdefault("TSS2_LOG", "all+none")

# TSS2_LOG must be set before libtss2 loads.
from tpm2_pytss import (
    ESAPI,
    ESYS_TR,
    TPM2_ALG,
    TPM2_CAP,
    TPM2_HC,
    TPM2_PT,
    TPM2_RC,
    TPM2_SE,
    TPM2_SU,
    TPM2B_ENCRYPTED_SECRET,
    TPM2B_ID_OBJECT,
    TPM2B_PUBLIC,
    TPM2B_SENSITIVE_CREATE,
    TPMA_OBJECT,
    TPML_DIGEST_VALUES,
    TPML_PCR_SELECTION,
    TPMT_HA,
    TPMT_PUBLIC,
    TPMT_SIG_SCHEME,
    TPMT_SYM_DEF,
    TPMU_HA,
    TSS2_Exception,
)
from tpm2_pytss.utils import NoSuchIndex, NVReadEK, create_ek_template

EkKind = Literal["rsa", "ecc"]
AkKind = Literal["ecc", "rsa"]

# Where the TCG EK Credential Profile puts EK certificates, in the order we look for them.
_EK_SOURCES: dict[EkKind, tuple[tuple[str, int], ...]] = {
    "rsa": (("EK-RSA2048", 0x01C00002), ("EK-HIGH-RSA2048", 0x01C00012)),
    "ecc": (("EK-ECC256", 0x01C0000A), ("EK-HIGH-ECC256", 0x01C00014), ("EK-HIGH-ECC384", 0x01C00016)),
}
_AK_ATTRS = (
    TPMA_OBJECT.RESTRICTED
    | TPMA_OBJECT.SIGN_ENCRYPT
    | TPMA_OBJECT.FIXEDTPM
    | TPMA_OBJECT.FIXEDPARENT
    | TPMA_OBJECT.SENSITIVEDATAORIGIN
    | TPMA_OBJECT.USERWITHAUTH
)
_AK_SPECS: dict[AkKind, str] = {"ecc": "ecc256:ecdsa-sha256:null", "rsa": "rsa2048:rsassa-sha256:null"}
_PCRS_PER_READ = 8  # TPML_DIGEST holds at most 8 digests


class TpmError(Exception):
    """A TPM operation failed; the message says what to do."""


class TpmUnavailable(TpmError):
    """No TPM answered on the TCTI."""


class TpmLockedOut(TpmError):
    """The TPM is in dictionary-attack lockout."""


@dataclass(frozen=True)
class Key:
    """A transient key loaded in the TPM and its marshalled TPM2B_PUBLIC."""

    handle: Any  # ESYS_TR
    public: bytes
    user_with_auth: bool


@dataclass(frozen=True)
class Ek(Key):
    template: str  # the tpm2-pytss template name, e.g. "EK-RSA2048"
    certificate: bytes | None  # DER, trimmed of NV padding
    chain: tuple[bytes, ...] = ()  # EK chain certificates from NV (read_ek_chain)


def _tpm_rc(exc: TSS2_Exception) -> int:
    """The TPM response code without the TSS layer (TPM-layer codes have layer 0)."""
    return int(exc.rc) & 0xFFFF


def _explain(exc: TSS2_Exception, doing: str) -> TpmError:
    if _tpm_rc(exc) == TPM2_RC.LOCKOUT:
        return TpmLockedOut(
            f"{doing}: the TPM is in dictionary-attack lockout; wait for it to recover "
            "or have an administrator run TPM2_DictionaryAttackLockReset"
        )
    return TpmError(f"{doing}: TPM error 0x{exc.rc:x} ({exc})")


_TCG_NV_HEADER = b"\x10\x01\x00"  # some vendors prefix the certificate with tag + 2-byte length


def trim_der(data: bytes) -> bytes:
    """NV indices are often larger than the certificate: keep exactly the first DER element
    (after a TCG NV header, when there is one)."""
    if data.startswith(_TCG_NV_HEADER) and len(data) > 5:
        data = data[5 : 5 + int.from_bytes(data[3:5], "big")]
    if len(data) < 2 or data[0] != 0x30:
        raise TpmError("EK certificate in NV is not DER")
    first = data[1]
    if first < 0x80:
        end = 2 + first
    else:
        n = first & 0x7F
        if n == 0 or n > 3:
            raise TpmError("EK certificate in NV has an unsupported DER length")
        end = 2 + n + int.from_bytes(data[2 : 2 + n], "big")
    if end > len(data):
        raise TpmError("EK certificate in NV is truncated")
    return data[:end]


# TCG EK Credential Profile: the EK certificate chain (intermediates up to the vendor root) in
# NV indices 0x01C00100-0x01C001FF, each holding one or more DER certificates back to back.
EK_CHAIN_FIRST, EK_CHAIN_LAST = 0x01C00100, 0x01C001FF
MAX_EK_CHAIN = 4  # what the server takes (bootstrap/protocol.py)


def split_ders(data: bytes) -> list[bytes]:
    """The DER certificates at the start of an NV index's data, up to the padding (0xFF or 0x00)."""
    out: list[bytes] = []
    while data[:1] == b"\x30" and len(out) < MAX_EK_CHAIN:
        der = trim_der(data)
        out.append(der)
        data = data[len(der) :]
    return out


class Agent:
    """One open connection to a TPM. Use as a context manager."""

    def __init__(self, tcti: str = DEFAULT_TCTI) -> None:
        self.tcti = tcti
        self._ctx: ESAPI | None = None
        self._handles: list[Any] = []

    def __enter__(self) -> Agent:
        try:
            self._ctx = ESAPI(self.tcti)
        except TSS2_Exception as exc:
            raise TpmUnavailable(
                f"no TPM reachable through TCTI {self.tcti!r} ({exc}); is the device present "
                "(ls /dev/tpmrm0) and readable by this user (group tss)?"
            ) from None
        try:
            self._ctx.startup(TPM2_SU.CLEAR)
        except TSS2_Exception as exc:
            if _tpm_rc(exc) != TPM2_RC.INITIALIZE:  # already started: the usual case
                self.close()
                raise _explain(exc, "TPM startup") from None
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def ctx(self) -> ESAPI:
        if self._ctx is None:
            raise TpmError("the TPM connection is closed")
        return self._ctx

    def close(self) -> None:
        if self._ctx is None:
            return
        for handle in reversed(self._handles):
            try:
                self._ctx.flush_context(handle)
            except TSS2_Exception:  # already gone (TPM restarted); nothing left to free
                continue
        self._handles.clear()
        self._ctx.close()
        self._ctx = None

    # -- EK -----------------------------------------------------------------------------

    def manufacturer(self) -> int:
        """TPM_PT_MANUFACTURER: the vendor's four letters as an integer ("INTC", "AMD", ...)."""
        try:
            _, data = self.ctx.get_capability(TPM2_CAP.TPM_PROPERTIES, TPM2_PT.MANUFACTURER, 1)
        except TSS2_Exception as exc:
            raise _explain(exc, "reading the TPM manufacturer") from None
        props = data.data.tpmProperties
        if props.count < 1 or int(props[0].property) != int(TPM2_PT.MANUFACTURER):
            raise TpmError("the TPM did not report its manufacturer")
        return int(props[0].value)

    def read_ek_certificate(self, kind: EkKind = "rsa") -> tuple[str, bytes | None]:
        """Return (template name, DER certificate or None) for the first EK of ``kind`` that has
        a certificate in NV, else the low-range template without one."""
        reader = NVReadEK(self.ctx)
        for template, index in _EK_SOURCES[kind]:
            try:
                raw = reader(index)
            except (NoSuchIndex, TSS2_Exception):
                # Absent, or read-protected: try the next source. An EK without a readable
                # certificate can still be admitted through the server's allowlist.
                continue
            return template, trim_der(bytes(raw))
        return _EK_SOURCES[kind][0][0], None

    def read_ek_chain(self) -> tuple[bytes, ...]:
        """The EK chain certificates the TPM's maker stored in NV (TCG EK chain range), at most
        MAX_EK_CHAIN; empty when there are none. A certificate here adds no trust on the server:
        it only helps build a path to a root the server trusts."""
        try:
            _, data = self.ctx.get_capability(TPM2_CAP.HANDLES, EK_CHAIN_FIRST, 256)
        except TSS2_Exception:
            return ()
        handles = [int(h) for h in data.data.handles if EK_CHAIN_FIRST <= int(h) <= EK_CHAIN_LAST]
        reader = NVReadEK(self.ctx)
        out: list[bytes] = []
        for index in handles:
            try:
                out += split_ders(bytes(reader(index)))
            except (NoSuchIndex, TSS2_Exception, TpmError):
                continue  # unreadable or not DER: the server may still find the path by AIA
        return tuple(out[:MAX_EK_CHAIN])

    def create_ek(self, kind: EkKind = "rsa") -> Ek:
        """Create the EK from its TCG template (honouring vendor template/nonce NV indices)."""
        template_name, cert = self.read_ek_certificate(kind)
        try:
            _, template = create_ek_template(template_name, NVReadEK(self.ctx))
            handle, public, *_ = self.ctx.create_primary(
                TPM2B_SENSITIVE_CREATE(), template, ESYS_TR.ENDORSEMENT
            )
        except TSS2_Exception as exc:
            raise _explain(exc, "creating the EK") from None
        except ValueError as exc:  # the template's NV data changed between two reads
            raise TpmError(f"creating the EK: {exc}") from None
        self._handles.append(handle)
        uwa = bool(public.publicArea.objectAttributes & TPMA_OBJECT.USERWITHAUTH)
        return Ek(handle, public.marshal(), uwa, template_name, cert, self.read_ek_chain())

    # -- AK -----------------------------------------------------------------------------

    def create_ak(self, kind: AkKind = "ecc") -> Key:
        """A restricted signing key as a primary in the endorsement hierarchy, so quotes carry
        the TPM's real resetCount, restartCount and firmware version (not obfuscated)."""
        template = TPM2B_PUBLIC(
            TPMT_PUBLIC.parse(_AK_SPECS[kind], nameAlg=TPM2_ALG.SHA256, objectAttributes=_AK_ATTRS)
        )
        try:
            handle, public, *_ = self.ctx.create_primary(
                TPM2B_SENSITIVE_CREATE(), template, ESYS_TR.ENDORSEMENT
            )
        except TSS2_Exception as exc:
            raise _explain(exc, "creating the AK") from None
        self._handles.append(handle)
        return Key(handle, public.marshal(), True)

    def load_public(self, public: bytes) -> Key:
        """Load only the public part of a key (used by tests to show a foreign AK cannot act)."""
        pub, _ = TPM2B_PUBLIC.unmarshal(public)
        try:
            handle = self.ctx.load_external(pub, None, ESYS_TR.RH_NULL)
        except TSS2_Exception as exc:
            raise _explain(exc, "loading a public key") from None
        self._handles.append(handle)
        return Key(handle, public, False)

    # -- credential activation ----------------------------------------------------------

    def activate_credential(self, ak: Key, ek: Ek, credential_blob: bytes, encrypted_secret: bytes) -> bytes:
        """Recover the secret MakeCredential sealed to (EK, AK name)."""
        try:
            blob, used = TPM2B_ID_OBJECT.unmarshal(credential_blob)
            secret, used2 = TPM2B_ENCRYPTED_SECRET.unmarshal(encrypted_secret)
        except (TSS2_Exception, TypeError) as exc:
            raise TpmError(f"the server's credential challenge does not unmarshal ({exc})") from None
        if used != len(credential_blob) or used2 != len(encrypted_secret):
            raise TpmError("the server's credential challenge has trailing bytes")
        session = None
        try:
            if ek.user_with_auth:
                ek_auth = ESYS_TR.PASSWORD  # high-range templates: empty authValue
            else:
                # Low-range EKs only admit PolicySecret(TPM_RH_ENDORSEMENT).
                session = self.ctx.start_auth_session(
                    tpm_key=ESYS_TR.NONE,
                    bind=ESYS_TR.NONE,
                    session_type=TPM2_SE.POLICY,
                    symmetric=TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL),
                    auth_hash=TPM2_ALG.SHA256,
                )
                self.ctx.policy_secret(ESYS_TR.ENDORSEMENT, session, b"", b"", b"", 0)
                ek_auth = session
            out = self.ctx.activate_credential(
                ak.handle, ek.handle, blob, secret, session1=ESYS_TR.PASSWORD, session2=ek_auth
            )
        except TSS2_Exception as exc:
            raise _explain(exc, "activating the credential (is the AK in this TPM?)") from None
        finally:
            if session is not None:
                with contextlib.suppress(TSS2_Exception):  # never mask the error being raised
                    self.ctx.flush_context(session)
        return bytes(out)

    # -- quote and PCRs -----------------------------------------------------------------

    def quote(self, ak: Key, selection: str, qualifying_data: bytes) -> tuple[bytes, bytes]:
        """TPM2_Quote with the AK's own scheme; returns (TPMS_ATTEST, TPMT_SIGNATURE)."""
        wire.parse_selection_string(selection)
        try:
            attest, signature = self.ctx.quote(
                ak.handle,
                TPML_PCR_SELECTION.parse(selection),
                qualifying_data,
                TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL),
            )
        except TSS2_Exception as exc:
            raise _explain(exc, "quoting PCRs") from None
        return bytes(attest), signature.marshal()

    def quote_with_pcrs(
        self, ak: Key, selection: str, qualifying_data: bytes, attempts: int = 5
    ) -> tuple[bytes, bytes, dict[str, dict[int, bytes]]]:
        """Quote and read the quoted PCRs consistently: if any PCR was extended between the
        reads around the quote (the TPM's pcrUpdateCounter moved), try again."""
        for _ in range(attempts):
            before, _values = self._read_pcrs_counted(selection)
            quote, signature = self.quote(ak, selection, qualifying_data)
            after, values = self._read_pcrs_counted(selection)
            if before == after:
                return quote, signature, values
        raise TpmError(f"PCRs kept changing during {attempts} quote attempts; retry the join")

    def read_pcrs(self, selection: str) -> dict[str, dict[int, bytes]]:
        """Read the selected PCRs, 8 per TPM2_PCR_Read as the TPM allows."""
        return self._read_pcrs_counted(selection)[1]

    def _read_pcrs_counted(self, selection: str) -> tuple[tuple[int, ...], dict[str, dict[int, bytes]]]:
        """The PCR values and the pcrUpdateCounter seen by each TPM2_PCR_Read."""
        counters: list[int] = []
        out: dict[str, dict[int, bytes]] = {}
        for alg, indices in wire.parse_selection_string(selection):
            bank = wire.BANK_BY_ALG[alg]
            wanted = sorted(indices)
            values: dict[int, bytes] = {}
            for start in range(0, len(wanted), _PCRS_PER_READ):
                chunk = wanted[start : start + _PCRS_PER_READ]
                spec = f"{bank}:{','.join(map(str, chunk))}"
                try:
                    counter, _, digests = self.ctx.pcr_read(TPML_PCR_SELECTION.parse(spec))
                except TSS2_Exception as exc:
                    raise _explain(exc, "reading PCRs") from None
                counters.append(int(counter))
                got = [bytes(digests[i]) for i in range(digests.count)]
                if len(got) != len(chunk):
                    raise TpmError(f"TPM returned {len(got)} values for {spec}; is the {bank} bank active?")
                values.update(zip(chunk, got, strict=True))
            out[bank] = values
        return tuple(counters), out

    def extend_pcr(self, index: int, data_digest: bytes, bank: str = "sha256") -> None:
        """PCR_Extend (boot scripts and tests measure things with it)."""
        alg = getattr(TPM2_ALG, bank.upper())
        ha = TPMU_HA(**{bank: data_digest})
        digests = TPML_DIGEST_VALUES([TPMT_HA(hashAlg=alg, digest=ha)])
        try:
            self.ctx.pcr_extend(getattr(ESYS_TR, f"PCR{index}"), digests)
        except TSS2_Exception as exc:
            raise _explain(exc, f"extending PCR {index}") from None


def transient_handles(ctx: ESAPI) -> list[int]:
    """Raw handles of all transient objects in the TPM (tests use this to clean up)."""
    _, data = ctx.get_capability(TPM2_CAP.HANDLES, TPM2_HC.TRANSIENT_FIRST, 64)
    handles = data.data.handles
    return [int(handles[i]) for i in range(handles.count)]


def flush_raw(ctx: ESAPI, handle: int) -> None:
    """TPM2_FlushContext on a raw handle ESYS does not know (left by another process)."""
    tcti = ctx.get_tcti()
    tcti.transmit(struct.pack(">HIII", 0x8001, 14, 0x00000165, handle))
    tcti.receive()
