"""Node side of disk keys (docs/disk-keys.md): the release client (``release``), the Clevis pin's
JWE (``jwe``, ``pin``), the LUKS2 header through cryptsetup (``luks``) and the first-boot and
rotation re-keying (``rekey``)."""
