"""The webhook's verdicts counted for the metrics: ``nodegate_webhook_decisions_total{result,
rule}``, one count per denying rule (a denial with no rule counts once with ``rule=""``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from admission.decision.decider import Decider
from admission.decision.response import Decision
from admission.reading.review import Request


@dataclass
class CountingDecider(Decider):
    counter: Any = field(default=None, repr=False, compare=False)  # a prometheus Counter(result, rule)
    # The counter's children by labels: labels() takes a lock and checks its arguments each call.
    _children: dict[tuple[Any, str, str], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    async def decide(self, req: Request) -> Decision:
        decision = await super().decide(req)
        self.count(decision)
        return decision

    def count(self, decision: Decision) -> None:
        """Count one verdict (also for a review answered from the decision cache)."""
        if self.counter is not None:
            if decision.allowed:
                self._child("allowed", "").inc()
            else:
                for rule in sorted({v.rule for v in decision.violations}) or [""]:
                    self._child("denied", rule).inc()

    def _child(self, result: str, rule: str) -> Any:
        key = (self.counter, result, rule)  # the counter too: tests swap it
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.counter.labels(result, rule)
        return child
