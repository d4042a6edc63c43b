"""The admission webhooks: their own app, the decisions, the policy sources (files, cluster
watches) and ``nodegate policy test``."""
