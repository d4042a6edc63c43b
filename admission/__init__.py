"""Who may deploy which host package where (PackagePolicy, rules, webhook)."""
