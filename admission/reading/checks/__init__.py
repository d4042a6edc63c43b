"""The structural checks of NodeWright / Skyhook package CRs (what NodeWright's own validating
webhook refuses without looking at the cluster), one module per part of the spec.

Each module reads its part straight from the CR's dict (``values.NotCanonical`` where a value is
not plainly typed, so that pydantic decides) and records the violations of its rules with their
rank (``ranks``). :mod:`admission.reading.structural` walks the CR once and calls them.
"""
