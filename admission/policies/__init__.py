"""PackagePolicies against a package CR: compiled policies, pools, budget caps, the policy
rules and their verdicts, nodegate's own guards, DeploymentPolicies; ``rules`` applies them."""
