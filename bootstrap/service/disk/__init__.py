"""Disk-key releases (docs/disk-keys.md): a node that proves its boot with a fresh quote gets the
key of one of its LUKS volumes, sealed to its TPM. ``flow`` is the start/finish pair,
``eligibility`` which boots get keys, ``secret`` the server secret at start."""
