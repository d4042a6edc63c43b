"""Boot records: what a node's accepted attestation showed, kept as bounded facts, and judged
again by a new policy (a what-if) through the join's own evaluation. Pure.

    model     the record (pydantic; JSON in the store, camelCase)
    ekfacts   what a verified EK certificate says: issuer, TPM manufacturer, model, version
    build     the record from the quoted PCRs and the log's facts the verdict read
    verdict   the measured-boot verdict on facts: the join's and a what-if's one function
    recorded  a record's facts as the ``BootFacts`` the policy judges
    judge     a record judged by a PCR and measured-boot policy, as a join of that boot would be
    fleet     the fleet vocabulary: --where selectors, boot groups
"""
