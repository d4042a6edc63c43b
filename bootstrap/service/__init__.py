"""The nodegate service: join and renewal API, admin API, admission webhook, serving."""
