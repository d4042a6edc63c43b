"""Values as Kubernetes and NodeWright's Go code parse them: quantities, versions, label
selectors, configInterrupts globs, image references. Pure, no admission imports."""
