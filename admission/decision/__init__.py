"""The decision on a review and its answer: the decider, the decision cache, the
AdmissionReview response, the warnings on admitted CRs and the rule ids a denial names."""
