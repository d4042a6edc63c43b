"""Measured boot: the TCG PC Client firmware event log and the policy that judges it. Pure.

    tcglog    the two record formats, bounded and strict
    efi       the UEFI structures events carry
    log       EventLog: parse, replay (StartupLocality, H-CRTM), verify_replay against a quote
    events    one event's meaning, trusted only where the TPM vouches for it
    facts     what a policy reads: typed events of quoted PCRs, in the order the profile prescribes
    model     the measured_boot config: classes, rules, the PCRs and banks each rule reads
    policy    judges facts by it (which class matched, or every violation), and learns a class

``attest.eventlog`` is the stable entry point (``parse``, ``EventLog``, ``verify_replay``).
"""
