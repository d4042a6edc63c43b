"""``nodegate demo``: software TPMs, an emulated Kubernetes API and the whole story."""
