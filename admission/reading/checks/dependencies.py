"""dependsOn: each names a package of this CR at exactly its version, with a version (rule
"depends-on"). NodeWright does not look for cycles; a cycle (its packages never start) is found
here for a warning, not refused."""

from __future__ import annotations

from admission.reading.checks.ranks import DEPENDS_ON, Found
from admission.reading.crs import PackageView
from admission.violations import Violation


def dependency_rules(
    packages: list[PackageView], by_key: dict[str, PackageView], found: Found
) -> tuple[str, ...]:
    """Records the dangling edges; returns a cycle, if there is one (for a warning)."""
    chained = False
    for pkg in packages:
        for dep, version in pkg.depends_on.items():
            target = by_key.get(dep)
            if target is None or not version or target.version != version:
                found.append(
                    (
                        DEPENDS_ON,
                        Violation(
                            "depends-on",
                            f"{pkg.path}.dependsOn.{dep}",
                            f"dependsOn version is empty for {dep}"
                            if not version
                            else f"no package {dep}|{version} in this CR",
                            "depend on a package of this CR at its current version",
                        ),
                    )
                )
            # A cycle needs a package depending on one that depends on another; without such a
            # chain (the usual case) there is nothing to search.
            chained = chained or (target is not None and bool(target.depends_on))
    return tuple(find_cycle({p.key: list(p.depends_on) for p in packages})) if chained else ()


def find_cycle(graph: dict[str, list[str]]) -> list[str]:
    """The first cycle of a depth-first search from the nodes in sorted order, edges in order.
    Iterative: a CR may hold more packages than Python's recursion limit."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for root in sorted(graph):
        if root in state:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(graph[root])]
        while pending:
            for nxt in pending[-1]:
                if nxt not in graph:
                    continue
                seen = state.get(nxt)
                if seen == 1:
                    return [*path[path.index(nxt) :], nxt]
                if seen is None:
                    state[nxt] = 1
                    path.append(nxt)
                    pending.append(iter(graph[nxt]))
                    break
            else:
                state[path.pop()] = 2
                pending.pop()
    return []
