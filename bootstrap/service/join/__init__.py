"""The join flow (docs/protocol.md): sessions, evidence, EK trust (vendor roots, AIA, EK
certificate checks), the kubelet's Node and certificate, and the SPIRE link. No HTTP here."""
