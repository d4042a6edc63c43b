"""Who may call the admin endpoints: admin SVIDs and Kubernetes bearer tokens."""
