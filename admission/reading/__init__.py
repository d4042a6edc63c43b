"""Reading what a review brings: the AdmissionReview, the NodeWright / Skyhook package CRs
(read once, NodeWright's own structural rules applied on the way: ``structural`` and
``checks/``), a spec as the operator's Go types hold it, what an UPDATE changes, and the
PackagePolicy model."""
