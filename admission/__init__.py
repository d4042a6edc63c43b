"""Who may deploy which host package where (PackagePolicy, rules, webhook).

Rooms (docs/architecture.md), top down: ``webhook`` (AdmissionReview bodies in and out), the
``decision`` and its answer, ``policies`` (the rules on package CRs) beside ``rbac`` (the local
evaluator), ``hold`` (Nodes, the hold taint and tolerations, the mutation), ``reading`` (the
review, the CRs with their structural ``checks``, the PackagePolicy model), ``syntax`` (values as
Kubernetes and NodeWright parse them); ``violations`` under all."""
