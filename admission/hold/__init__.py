"""Nodes and the hold: the hold taint's rules for Node objects, which package CRs select a
Node, removing a package CR, and the hold tolerations the mutating webhook adds."""
